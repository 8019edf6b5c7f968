-- rate (GCRA): KEYS = bucket; ARGV = now_us, emission_us, tolerance_us
-- {1} granted | {0, wait_us}
local now = tonumber(ARGV[1])
local emission = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if tat < now then tat = now end
if tat - now > tolerance then return {0, tat - now - tolerance} end
local next = tat + emission
redis.call('SET', KEYS[1], string.format('%d', next), 'PX', math.ceil((next - now) / 1000) + 1000)
return {1}
