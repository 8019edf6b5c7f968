-- claim: KEYS = record, token counter; ARGV = now_ms, lease_ms, ttl slack ms
-- {'inflight', until} | {'done'} | {'done', outcome} | {'acquired', token, until}
local now = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local slack = tonumber(ARGV[3])
local r = redis.call('HMGET', KEYS[1], 's', 'e', 't', 'u', 'o')
local expires = now
if r[1] then
  local e = tonumber(r[2])
  local u = tonumber(r[4] or '0')
  if now < e or (r[1] == 'r' and now < u) then
    if r[1] == 'r' and now < u then return {'inflight', u} end
    if r[1] == 'c' then
      if r[5] then return {'done', r[5]} end
      return {'done'}
    end
    expires = e
  end
end
local token = redis.call('INCR', KEYS[2])
local till = now + lease
redis.call('HSET', KEYS[1], 's', 'r', 'e', expires, 't', token, 'u', till)
redis.call('HDEL', KEYS[1], 'o')
redis.call('PEXPIRE', KEYS[1], math.max(expires, till) - now + slack)
return {'acquired', token, till}
