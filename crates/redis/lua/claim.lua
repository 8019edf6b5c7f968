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
local r = redis.call('HMGET', KEYS[1], 's', 'e', 't', 'u', 'o', 'f')
local expires = now
local kept = false
local taken = '0'
if r[1] then
  local e = tonumber(r[2])
  local u = tonumber(r[4] or '0')
  if now < e or (r[1] == 'r' and now < u) then
    if r[6] and fingerprint ~= '' and r[6] ~= fingerprint then return {'conflict'} end
    if r[1] == 'r' and now < u then return {'inflight', u} end
    if r[1] == 'c' then
      if r[5] then return {'done', r[5]} end
      return {'done'}
    end
    expires = e
    kept = r[6] ~= false
    if r[1] == 'r' then taken = '1' end
  end
end
-- The token is a hybrid clock: the server's time in microseconds, or one more than the last
-- token when that is larger. A counter alone repeats after a failover that lost its last
-- increments, or a restart without persistence; the clock has moved past every token handed
-- out before (unless the new primary's clock is behind by more than the failover took).
-- Integers up to 2^53 are exact in Lua; microseconds reach that in the year 2255.
local time = redis.call('TIME')
local clock = tonumber(time[1]) * 1000000 + tonumber(time[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = math.max(clock, last + 1)
local text = string.format('%d', token)
redis.call('SET', KEYS[2], text)
local till = now + lease
-- A forgotten record's fingerprint goes with it; a kept one stays. Fields are deleted only
-- where the read found them: each call inside a script costs about a microsecond.
local fields = {'s', 'r', 'e', string.format('%d', expires), 't', text, 'u', string.format('%d', till)}
if not kept and fingerprint ~= '' then
  fields[#fields + 1] = 'f'
  fields[#fields + 1] = fingerprint
end
redis.call('HSET', KEYS[1], unpack(fields))
if r[5] then redis.call('HDEL', KEYS[1], 'o') end
if not kept and fingerprint == '' and r[6] then redis.call('HDEL', KEYS[1], 'f') end
redis.call('PEXPIRE', KEYS[1], math.max(expires, till) - now + slack)
return {'acquired', text, string.format('%d', till), taken}
