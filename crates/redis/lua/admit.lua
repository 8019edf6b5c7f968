-- admit: KEYS = record keys (n), stream, sequence counter
-- ARGV = now_ms, retention_ms, n, key hex, order hash, event bytes, ttl slack ms
-- If any key is live: {0, index}. Else mark all Pending and append the event: {1, seq}.
local now = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local slack = tonumber(ARGV[7])
for i = 1, n do
  local r = redis.call('HMGET', KEYS[i], 's', 'e', 'u')
  if r[1] then
    local live = now < tonumber(r[2]) or (r[1] == 'r' and now < tonumber(r[3] or '0'))
    if live then return {0, i - 1} end
  end
end
local expires = now + retention
for i = 1, n do
  redis.call('DEL', KEYS[i])
  redis.call('HSET', KEYS[i], 's', 'p', 'e', string.format('%d', expires))
  redis.call('PEXPIRE', KEYS[i], retention + slack)
end
local seq = redis.call('INCR', KEYS[n + 2])
redis.call('XADD', KEYS[n + 1], '0-' .. seq, 'k', ARGV[4], 'o', ARGV[5], 'e', ARGV[6])
return {1, seq}
