-- admit: KEYS = record keys (n), stream, sequence counter, nonce (optional)
-- ARGV = now_ms, retention_ms, n, key hex, order hash, event bytes, ttl slack ms,
--        nonce window ms (with the nonce key)
-- A nonce handled before: {2}. If any key is live: {0, index}. Else mark all Pending and
-- append the event: {1, seq}. The nonce is remembered in both of the latter cases.
local now = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local slack = tonumber(ARGV[7])
local nonce = KEYS[n + 3]
if nonce and redis.call('EXISTS', nonce) == 1 then return {2} end
local function remember()
  if nonce then redis.call('SET', nonce, '1', 'PX', ARGV[8]) end
end
-- Which keys hold a record (every record has 's'): only those need clearing before the write.
local held = {}
for i = 1, n do
  local r = redis.call('HMGET', KEYS[i], 's', 'e', 'u')
  if r[1] then
    held[i] = true
    local live = now < tonumber(r[2]) or (r[1] == 'r' and now < tonumber(r[3] or '0'))
    if live then
      remember()
      return {0, i - 1}
    end
  end
end
local expires = now + retention
for i = 1, n do
  if held[i] then redis.call('DEL', KEYS[i]) end
  redis.call('HSET', KEYS[i], 's', 'p', 'e', string.format('%d', expires))
  redis.call('PEXPIRE', KEYS[i], retention + slack)
end
local seq = redis.call('INCR', KEYS[n + 2])
redis.call('XADD', KEYS[n + 1], '0-' .. seq, 'k', ARGV[4], 'o', ARGV[5], 'e', ARGV[6])
remember()
return {1, seq}
