-- renew / complete / release: KEYS = record
-- ARGV = op, token, now_ms, ms (extend or retention), ttl slack ms, outcome (complete, optional)
-- 1 when the token is the live record's holder and the change was made, else 0.
local op = ARGV[1]
local now = tonumber(ARGV[3])
local ms = tonumber(ARGV[4])
local slack = tonumber(ARGV[5])
local s, e, t, u, f = load(KEYS[1])
if s ~= 'r' or t ~= ARGV[2] then return 0 end
if not (now < e or now < u) then return 0 end
if op == 'renew' then
  local till = now + ms
  store(KEYS[1], math.max(e, till) - now + slack, 'r', e, t, till, f, false)
elseif op == 'complete' then
  mark_completed(KEYS[1], now, ms, slack, f, ARGV[6] or false)
else
  store(KEYS[1], math.max(e - now, 1) + slack, 'p', e, '', 0, f, false)
end
return 1
