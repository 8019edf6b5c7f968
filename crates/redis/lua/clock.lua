-- Prepended to scripts that read the server's clock.

-- The server's time in ms.
local function server_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- The next token of a hybrid clock kept at `key` (its last value): the server's time in
-- microseconds, or one more than the last when that is larger. A counter alone repeats after a
-- failover that lost its last increments, or a restart without persistence; the clock has moved
-- past every token handed out before (unless the new primary's clock is behind by more than the
-- failover took). Integers up to 2^53 are exact in Lua; microseconds reach that in the year
-- 2255. Claims' fencing tokens and partitions' epochs both come from here; the caller stores
-- the last one it hands out.
local function hybrid_next(key)
  local time = redis.call('TIME')
  local clock = tonumber(time[1]) * 1000000 + tonumber(time[2])
  return math.max(clock, tonumber(redis.call('GET', key) or '0') + 1)
end
