-- claim, for one or more keys of one partition: KEYS = the partition's token clock, its counts
-- (counts.lua), then one record per claim; ARGV = now_ms, ttl slack ms, then per claim:
-- lease_ms, fingerprint (16 bytes, or empty for none).
-- One reply per claim, in order: {'inflight', until} | {'done'} | {'done', outcome}
-- | {'conflict'} | the granted token, negated when a holder's lease ran out (a takeover).
-- A grant, the common reply, is one integer: the caller knows its lease end (now + lease),
-- and Redis turns a table into a reply element by element. Claims run in order, so a key
-- claimed twice in one call is in flight for the second. A live record claimed for another
-- payload is a conflict; one without a fingerprint takes the claimer's (core's
-- transition::claim is the rule this mirrors).
local now = tonumber(ARGV[1])
local slack = tonumber(ARGV[2])
-- The next token (`hybrid_next` in clock.lua), read on the first grant; later grants of the
-- same call take the ones after it.
local token = nil
local function next_token()
  if not token then
    token = hybrid_next(KEYS[1])
  else
    token = token + 1
  end
  return token
end
local function claim(key, lease, fingerprint)
  local s, e, _, u, f, o, counted = load(key)
  local expires = now
  local kept = false
  local taken = false
  if s and (now < e or (s == 'r' and now < u)) then
    if f and fingerprint ~= '' and f ~= fingerprint then return {'conflict'} end
    if s == 'r' and now < u then return {'inflight', u} end
    if s == 'c' then
      if o then return {'done', o} end
      return {'done'}
    end
    expires = e
    kept = f
    if s == 'r' then taken = true end
  end
  local granted = next_token()
  local till = now + lease
  if counted then tally(s, e, u, -1, now) end
  tally('r', expires, till, 1, now)
  -- A forgotten record's fingerprint goes with it; a kept one stays.
  if not kept and fingerprint ~= '' then kept = fingerprint end
  store(key, math.max(expires, till) - now + slack, 'r', expires, string.format('%d', granted),
    till, kept, false)
  if taken then return -granted end
  return granted
end
local replies = {}
for j = 1, #KEYS - 2 do
  replies[j] = claim(KEYS[j + 2], tonumber(ARGV[2 * j + 1]), ARGV[2 * j + 2])
end
if token then redis.call('SET', KEYS[1], string.format('%d', token)) end
tallied(KEYS[2])
return replies
