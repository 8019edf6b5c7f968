-- count admitted: KEYS = a partition's counts (counts.lua); ARGV = now_ms, then pairs of a
-- minute and the records a gateway admitted whose life ends in it. Admits do not count their
-- own records (the one script every request runs would pay two HINCRBYs for it): the gateway
-- gathers them and writes them here about once a second. A minute already over for more than a
-- minute is skipped: stats.lua may have folded it, and its records are over.
local minute_now = math.floor(tonumber(ARGV[1]) / 60000)
local total = 0
for i = 2, #ARGV, 2 do
  local minute = tonumber(ARGV[i])
  if minute >= minute_now - 1 then
    local records = tonumber(ARGV[i + 1])
    redis.call('HINCRBY', KEYS[1], 'p' .. ARGV[i], records)
    total = total + records
  end
end
if total ~= 0 then redis.call('HINCRBY', KEYS[1], 'p', total) end
return total
