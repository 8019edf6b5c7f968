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
for i = 1, n do
  local s, e, _, u = load(KEYS[i])
  if s and (now < e or (s == 'r' and now < u)) then
    remember()
    return {0, i - 1}
  end
end
-- The event first: a script that fails half-way keeps what it wrote, and marks without the
-- event would turn the platform's retry into a duplicate.
local seq = redis.call('INCR', KEYS[n + 2])
redis.call('XADD', KEYS[n + 1], string.format('0-%d', seq), 'k', ARGV[4], 'o', ARGV[5], 'e', ARGV[6])
local pending = encode('p', now + retention, '', 0, false, false)
local ttl = string.format('%d', retention + slack)
for i = 1, n do
  redis.call('SET', KEYS[i], pending, 'PX', ttl)
end
remember()
return {1, seq}
