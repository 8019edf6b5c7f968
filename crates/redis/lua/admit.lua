-- admit: KEYS = record keys (n), stream, the partition's former sequence counter (no longer
-- written: the stream's ids come from `append`; kept in the layout so that benchmarks run the
-- scripts of earlier builds on the same keys), nonce bucket (optional), counts (counts.lua; last,
-- so that an earlier build's script, which knows no counts, runs on the same keys)
-- ARGV = now_ms, retention_ms, n, key hex, order hash, event bytes, ttl slack ms,
--        then with the nonce bucket: nonce window ms, the nonce's hash
-- A nonce handled before: {2}. If any key is live: {0, index}. Else mark all Pending and
-- append the event: {1, seq}. The nonce is remembered in both of the latter cases.
-- Nonces live in one set per partition and signed timestamp (second): a replay carries the
-- same timestamp, so one SADD both checks and remembers, and a second's nonces expire as one
-- key (a key per nonce cost Redis a new key, its expiry, and 60 % more memory).
local n = tonumber(ARGV[3])
local nonce = false
if #KEYS == n + 4 then nonce = KEYS[n + 3] end
local counts = KEYS[#KEYS]
if nonce then
  if redis.call('SADD', nonce, ARGV[9]) == 0 then return {2} end
  redis.call('PEXPIRE', nonce, ARGV[8])
end
local function admit()
  local now = tonumber(ARGV[1])
  local retention = tonumber(ARGV[2])
  local pending = encode('p', now + retention, '', 0, false, false)
  local ttl = string.format('%d', retention + tonumber(ARGV[7]))
  -- Each key marked where it is free and read where it is not, in one call (SET NX GET); a
  -- record that exists counts only while live, and a live one undoes the marks made. Redis
  -- 6.2 refuses NX with GET, and a record an earlier version wrote as a hash is no string:
  -- those take SET NX and a read.
  for i = 1, n do
    local old = redis.pcall('SET', KEYS[i], pending, 'NX', 'GET', 'PX', ttl)
    local s, e, u, counted, _
    if type(old) == 'table' then
      if not redis.call('SET', KEYS[i], pending, 'NX', 'PX', ttl) then
        s, e, _, u, _, _, counted = load(KEYS[i])
      end
    elseif old then
      s, e, _, u, _, _, counted = parse(KEYS[i], old)
    end
    if s then
      if now < e or (s == 'r' and now < u) then
        if i > 1 then redis.call('DEL', unpack(KEYS, 1, i - 1)) end
        tallied(counts)
        return {0, i - 1}
      end
      redis.call('SET', KEYS[i], pending, 'PX', ttl)
      -- Over, but perhaps in this minute's count still: out of it.
      if counted then tally(s, e, u, -1, now) end
    end
  end
  -- Marks without the event would turn the platform's retry into a duplicate: undone when the
  -- append fails.
  local ok, seq = pcall(append, KEYS[n + 1], 'k', ARGV[4], 'o', ARGV[5], 'e', ARGV[6])
  if not ok then
    redis.call('DEL', unpack(KEYS, 1, n))
    tallied(counts)
    return error(seq, 0)
  end
  -- The new records are counted by the gateway (count_admitted.lua); only what this call
  -- overwrote is taken out here.
  tallied(counts)
  return {1, seq}
end
if not nonce then return admit() end
-- A nonce is remembered only with an answer: after a failure the request's repeat (WeCom and
-- WeChat retry by repeating it) must be admitted, not refused as a replay.
local ok, reply = pcall(admit)
if ok then return reply end
redis.call('SREM', nonce, ARGV[9])
return error(reply, 0)
