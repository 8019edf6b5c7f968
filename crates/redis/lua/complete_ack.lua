-- complete and ack in one step: KEYS = record, stream, attempts hash
-- ARGV = token, now_ms, retention_ms, ttl slack ms, entry id, seq, group, outcome (optional)
-- The entry is acked and removed whatever the fence says (it was handed to this caller); the
-- record is completed only if the token is the live record's holder: 1, else 0.
local now = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local slack = tonumber(ARGV[4])
redis.call('XACK', KEYS[2], ARGV[7], ARGV[5])
redis.call('XDEL', KEYS[2], ARGV[5])
redis.call('HDEL', KEYS[3], ARGV[6])
local r = redis.call('HMGET', KEYS[1], 's', 'e', 't', 'u')
if not r[1] or r[1] ~= 'r' or r[3] ~= ARGV[1] then return 0 end
if not (now < tonumber(r[2]) or now < tonumber(r[4])) then return 0 end
mark_completed(KEYS[1], now, retention, slack, ARGV[8])
return 1
