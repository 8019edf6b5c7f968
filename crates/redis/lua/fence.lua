-- renew / complete / release: KEYS = record
-- ARGV = op, token, now_ms, ms (extend or retention), ttl slack ms, outcome (complete, optional)
-- 1 when the token is the live record's holder and the change was made, else 0.
local op = ARGV[1]
local now = tonumber(ARGV[3])
local ms = tonumber(ARGV[4])
local slack = tonumber(ARGV[5])
local r = redis.call('HMGET', KEYS[1], 's', 'e', 't', 'u')
if not r[1] or r[1] ~= 'r' or r[3] ~= ARGV[2] then return 0 end
local e = tonumber(r[2])
local u = tonumber(r[4])
if not (now < e or now < u) then return 0 end
if op == 'renew' then
  local till = now + ms
  redis.call('HSET', KEYS[1], 'u', string.format('%d', till))
  redis.call('PEXPIRE', KEYS[1], math.max(e, till) - now + slack)
elseif op == 'complete' then
  mark_completed(KEYS[1], now, ms, slack, ARGV[6])
else
  redis.call('HSET', KEYS[1], 's', 'p')
  redis.call('HDEL', KEYS[1], 't', 'u')
  redis.call('PEXPIRE', KEYS[1], math.max(e - now, 1) + slack)
end
return 1
