-- the owner's retry: KEYS = attempts hash, owner record; ARGV = instance, epoch, seq,
-- not before (ms). Counts one more attempt and when it may run: 1, or 0 when the caller does
-- not own the partition under `epoch`.
if not owns(KEYS[2], ARGV[1], ARGV[2]) then return 0 end
local previous = redis.call('HGET', KEYS[1], ARGV[3])
local attempt = 0
if previous then attempt = tonumber(string.match(previous, '^(%d+)')) or 0 end
redis.call('HSET', KEYS[1], ARGV[3], string.format('%d:%s', attempt + 1, ARGV[4]))
return 1
