-- watermark: KEYS = mark; ARGV = now_ms, value, retention_ms, ttl slack ms
-- {1} accepted (no previous) | {1, previous} | {0, current}
local now = tonumber(ARGV[1])
local value = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local r = redis.call('HMGET', KEYS[1], 'v', 'f')
local current = nil
if r[1] and now < tonumber(r[2]) then current = tonumber(r[1]) end
if current and value < current then return {0, current} end
local mark = value
if current and current > value then mark = current end
redis.call('HSET', KEYS[1], 'v', string.format('%d', mark), 'f', string.format('%d', now + retention))
redis.call('PEXPIRE', KEYS[1], retention + tonumber(ARGV[4]))
if current then return {1, current} end
return {1}
