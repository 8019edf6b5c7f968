-- count: KEYS = a partition's counts (counts.lua); ARGV = now_ms, then triples of a state (p, r
-- or c), a minute and a change of the records of that state whose life ends in that minute.
-- The two scripts every event runs, the admit and the batch's complete-and-ack, leave their
-- counts to the gateway (`counted.rs`), which gathers them and writes them here about once a
-- second. A minute over for more than a minute is skipped: stats.lua may have folded it, and
-- its records are over.
local minute_now = math.floor(tonumber(ARGV[1]) / 60000)
local totals = {}
for i = 2, #ARGV, 3 do
  local s, minute, change = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if tonumber(minute) >= minute_now - 1 and change ~= 0 then
    redis.call('HINCRBY', KEYS[1], s .. minute, change)
    totals[s] = (totals[s] or 0) + change
  end
end
for s, change in pairs(totals) do
  if change ~= 0 then redis.call('HINCRBY', KEYS[1], s, change) end
end
return 1
