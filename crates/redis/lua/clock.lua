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

-- Appends an entry with `...` (field, value pairs) to stream `stream` under the next id of the
-- partition's queue: `0-<server microseconds>`, or one past the stream's last id when that is
-- not below it (XADD refuses an id at or below the last one: a clock stepped back, or two
-- appends in one microsecond). Ids thus grow with the clock, past ids a failover lost with the
-- last appends (which a gateway may have read already), as fencing tokens do; the stream itself
-- keeps the last one. Returns the id's sequence number.
local function append(stream, ...)
  local time = redis.call('TIME')
  local seq = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local added = redis.pcall('XADD', stream, string.format('0-%d', seq), ...)
  if type(added) == 'table' and added.err then
    if not string.find(added.err, 'equal or smaller', 1, true) then return error(added) end
    local info = redis.call('XINFO', 'STREAM', stream)
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then
        local last = string.match(info[i + 1], '^0%-(%d+)$')
        if not last then return error('oncegate: stream ' .. stream .. ' has a foreign id ' .. info[i + 1]) end
        seq = tonumber(last) + 1
      end
    end
    redis.call('XADD', stream, string.format('0-%d', seq), ...)
  end
  return seq
end
