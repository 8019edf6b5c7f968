-- admit: KEYS = record keys (n), stream, sequence counter, nonce bucket (optional)
-- ARGV = now_ms, retention_ms, n, key hex, order hash, event bytes, ttl slack ms,
--        then with the nonce bucket: nonce window ms, the nonce's hash
-- A nonce handled before: {2}. If any key is live: {0, index}. Else mark all Pending and
-- append the event: {1, seq}. The nonce is remembered in both of the latter cases.
-- Nonces live in one set per partition and signed timestamp (second): a replay carries the
-- same timestamp, so one SADD both checks and remembers, and a second's nonces expire as one
-- key (a key per nonce cost Redis a new key, its expiry, and 60 % more memory).
local nonce = KEYS[tonumber(ARGV[3]) + 3]
if nonce then
  if redis.call('SADD', nonce, ARGV[9]) == 0 then return {2} end
  redis.call('PEXPIRE', nonce, ARGV[8])
end
local function admit()
  local now = tonumber(ARGV[1])
  local retention = tonumber(ARGV[2])
  local n = tonumber(ARGV[3])
  local slack = tonumber(ARGV[7])
  for i = 1, n do
    local s, e, _, u = load(KEYS[i])
    if s and (now < e or (s == 'r' and now < u)) then return {0, i - 1} end
  end
  -- The event first: a script that fails half-way keeps what it wrote, and marks without the
  -- event would turn the platform's retry into a duplicate.
  -- The entry id from the partition's hybrid clock, not a counter: after a failover that lost
  -- the last appends, a counter would give a new event the id of a lost one that a gateway
  -- already read, and the gateway would take the new one for the old.
  local seq = hybrid_next(KEYS[n + 2])
  redis.call('SET', KEYS[n + 2], string.format('%d', seq))
  redis.call('XADD', KEYS[n + 1], string.format('0-%d', seq), 'k', ARGV[4], 'o', ARGV[5], 'e', ARGV[6])
  local pending = encode('p', now + retention, '', 0, false, false)
  local ttl = string.format('%d', retention + slack)
  for i = 1, n do
    redis.call('SET', KEYS[i], pending, 'PX', ttl)
  end
  return {1, seq}
end
if not nonce then return admit() end
-- A nonce is remembered only with an answer: after a failure the request's repeat (WeCom and
-- WeChat retry by repeating it) must be admitted, not refused as a replay.
local ok, reply = pcall(admit)
if ok then return reply end
redis.call('SREM', nonce, ARGV[9])
return error(reply, 0)
