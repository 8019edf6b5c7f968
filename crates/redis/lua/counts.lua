-- Prepended to every script that writes records (after record.lua). A partition's records are
-- counted as they change, in one hash in the partition's slot (`{prefix:p}:n`, `stats.lua`
-- reads it): per state (p, r, c) a running total, and per state and minute the records whose
-- life ends in that minute (`p<minute>`, ...), so that the totals can lose the records whose
-- time has passed without anyone reading a record. A record's life ends at its retention end,
-- a held one's at the later of that and its lease end (`now < e or now < u`, as everywhere).
-- Only minutes not yet over are counted or uncounted: `stats.lua` folds a minute away once it
-- is over (a minute later, for clocks a little apart), and a record whose minute is over is in
-- no count anyone reads. Records written by versions before the counts carry no mark (their
-- retention end has no leading 0, see record.lua) and are never uncounted: nobody counted them.
-- Changes are summed in the script and written once per field: a batch of claims or
-- completions of one minute costs four HINCRBYs, not four per record.
local tallies = {}
-- Field names by state and minute, made once per script: a batch's records mostly share their
-- minute, and Lua interns every string it makes.
local names = {p = {}, r = {}, c = {}}
local now_minute = false

-- Counts (`delta` 1) or uncounts (-1) a record of state `s`, retention end `e` and lease end
-- `u`, at `now`.
local function tally(s, e, u, delta, now)
  if s == 'r' and u > e then e = u end
  if not now_minute then now_minute = math.floor(now / 60000) end
  local minute = math.floor(e / 60000)
  if minute < now_minute then return end
  local field = names[s][minute]
  if not field then
    field = s .. string.format('%d', minute)
    names[s][minute] = field
  end
  tallies[s] = (tallies[s] or 0) + delta
  tallies[field] = (tallies[field] or 0) + delta
end

-- Writes what `tally` summed to the counts hash `key`.
local function tallied(key)
  for field, delta in pairs(tallies) do
    if delta ~= 0 then redis.call('HINCRBY', key, field, delta) end
  end
end
