-- stats, for one partition: KEYS = its counts (counts.lua), stream, dead stream; ARGV = now_ms.
-- {pending, processing, completed, queued, dead letters}: the records counted as live, read
-- from the counts without reading a record; a record whose life ends in the current minute is
-- counted until the minute is over (at most 60 s late).
-- Minutes over for a minute (clocks a little apart still count into the last one) are folded
-- away first: each minute's counts leave the totals and the hash. The hash remembers the
-- first minute not yet folded (`at`), so a call folds only the minutes since the last call;
-- a hash without it (new, or of a partition nobody asked about for days) is read whole once,
-- at most three fields per minute of the longest retention.
local key = KEYS[1]
local minute = math.floor(tonumber(ARGV[1]) / 60000)
local upto = minute - 1
local at = tonumber(redis.call('HGET', key, 'at') or '')
local function fold(s, m, count)
  local n = tonumber(count) or 0
  if n ~= 0 then redis.call('HINCRBY', key, s, -n) end
  redis.call('HDEL', key, s .. m)
end
if not at or upto - at > 10080 then
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local s, m = string.match(all[i], '^([prc])(%d+)$')
    if s and tonumber(m) < upto then fold(s, m, all[i + 1]) end
  end
else
  for m = at, upto - 1 do
    local name = string.format('%d', m)
    local counts = redis.call('HMGET', key, 'p' .. name, 'r' .. name, 'c' .. name)
    if counts[1] then fold('p', name, counts[1]) end
    if counts[2] then fold('r', name, counts[2]) end
    if counts[3] then fold('c', name, counts[3]) end
  end
end
local last = string.format('%d', upto)
if not at or at < upto then redis.call('HSET', key, 'at', last) end
-- The last minute over is kept for a clock behind this one; its records are no longer live.
local v = redis.call('HMGET', key, 'p', 'r', 'c', 'p' .. last, 'r' .. last, 'c' .. last)
local out = {}
for j = 1, 3 do
  local n = (tonumber(v[j]) or 0) - (tonumber(v[j + 3]) or 0)
  -- Below 0 only after clocks more than a minute apart changed a minute already folded.
  if n < 0 then n = 0 end
  out[j] = n
end
out[4] = redis.call('XLEN', KEYS[2])
out[5] = redis.call('XLEN', KEYS[3])
return out
