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
local s, e, t, u, f = load(KEYS[1])
if s ~= 'r' or t ~= ARGV[1] then return 0 end
if not (now < e or now < u) then return 0 end
mark_completed(KEYS[1], now, retention, slack, f, ARGV[8] or false)
return 1
