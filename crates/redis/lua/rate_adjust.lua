-- rate_adjust: KEYS = bucket; ARGV = now_us, 'give_back' emission_us | 'hold' until_us
-- a call given back (never below now: no debt), or a hold no take is granted before
local now = tonumber(ARGV[1])
local amount = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local next
if ARGV[2] == 'give_back' then
  next = tat - amount
else
  next = math.max(tat, amount)
end
if next <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], string.format('%d', next), 'PX', math.ceil((next - now) / 1000) + 1000)
end
return 1
