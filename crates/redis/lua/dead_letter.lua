-- dead letter: KEYS = stream, attempts hash, dead stream, dead index (seq -> dead entry id),
-- owner record; ARGV = entry id, seq, reason, now_ms, partition, group, instance, epoch
-- 1 when moved, 0 when the entry is gone, -1 when the caller does not own the partition under
-- `epoch` (the entry stays with the owner).
if not owns(KEYS[5], ARGV[7], ARGV[8]) then return -1 end
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entries == 0 then
  redis.call('XACK', KEYS[1], ARGV[6], ARGV[1])
  return 0
end
local fields = entries[1][2]
local attempts = redis.call('HGET', KEYS[2], ARGV[2])
local attempt = 0
if attempts then attempt = tonumber(string.match(attempts, '^(%d+)')) end
local k, e
for i = 1, #fields, 2 do
  if fields[i] == 'k' then k = fields[i + 1] end
  if fields[i] == 'e' then e = fields[i + 1] end
end
local dead = redis.call('XADD', KEYS[3], '*', 'p', ARGV[5], 's', ARGV[2], 'k', k, 'e', e, 'a', attempt + 1, 'r', ARGV[3], 't', ARGV[4])
redis.call('HSET', KEYS[4], ARGV[2], dead)
redis.call('XACK', KEYS[1], ARGV[6], ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
