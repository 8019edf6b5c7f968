-- claim: KEYS = record, the partition's token clock
-- ARGV = now_ms, lease_ms, ttl slack ms, fingerprint (16 bytes, or empty for none)
-- {'inflight', until} | {'done'} | {'done', outcome} | {'conflict'}
-- | {'acquired', token, until, taken}: taken is '1' when a holder's lease ran out (a takeover)
-- A live record claimed for another payload is a conflict; one without a fingerprint takes the
-- claimer's (core's transition::claim is the rule this mirrors).
local now = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local slack = tonumber(ARGV[3])
local fingerprint = ARGV[4]
local s, e, _, u, f, o = load(KEYS[1])
local expires = now
local kept = false
local taken = '0'
if s and (now < e or (s == 'r' and now < u)) then
  if f and fingerprint ~= '' and f ~= fingerprint then return {'conflict'} end
  if s == 'r' and now < u then return {'inflight', u} end
  if s == 'c' then
    if o then return {'done', o} end
    return {'done'}
  end
  expires = e
  kept = f
  if s == 'r' then taken = '1' end
end
-- The token is a hybrid clock: the server's time in microseconds, or one more than the last
-- token when that is larger. A counter alone repeats after a failover that lost its last
-- increments, or a restart without persistence; the clock has moved past every token handed
-- out before (unless the new primary's clock is behind by more than the failover took).
-- Integers up to 2^53 are exact in Lua; microseconds reach that in the year 2255.
local time = redis.call('TIME')
local clock = tonumber(time[1]) * 1000000 + tonumber(time[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = string.format('%d', math.max(clock, last + 1))
redis.call('SET', KEYS[2], token)
local till = now + lease
-- A forgotten record's fingerprint goes with it; a kept one stays.
if not kept and fingerprint ~= '' then kept = fingerprint end
store(KEYS[1], math.max(expires, till) - now + slack, 'r', expires, token, till, kept, false)
return {'acquired', token, string.format('%d', till), taken}
