-- replay a dead letter: KEYS = dead stream, dead index, stream
-- ARGV = dead entry id, seq, order hash
-- The new seq when moved back into the queue, -1 when the dead letter is gone (replayed or
-- purged by someone else: it is queued once).
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entries == 0 then return -1 end
local fields = entries[1][2]
local k, e, s
for i = 1, #fields, 2 do
  if fields[i] == 'k' then k = fields[i + 1] end
  if fields[i] == 'e' then e = fields[i + 1] end
  if fields[i] == 's' then s = fields[i + 1] end
end
if s ~= ARGV[2] or not k or not e then return -1 end
local seq = append(KEYS[3], 'k', k, 'o', ARGV[3], 'e', e)
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[2])
return seq
