-- Up to ARGV[3] live values whose names sort after ARGV[1] ("" from the start), in name order.
-- Expired values met on the way are removed, so that each costs one listing once.
-- KEYS as state_change.lua. ARGV: after, now ms, limit.
-- Returns a flat array: name, "version|expires_at_ms|value", name, ….
local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local from = '-'
if ARGV[1] ~= '' then
  from = '(' .. ARGV[1]
end
local out = {}
local found = 0
while found < limit do
  local names = redis.call('ZRANGEBYLEX', KEYS[3], from, '+', 'LIMIT', 0, 100)
  if #names == 0 then
    break
  end
  for _, name in ipairs(names) do
    local raw = redis.call('HGET', KEYS[1], name)
    local live = false
    if raw then
      local a = string.find(raw, '|', 1, true)
      local b = a and string.find(raw, '|', a + 1, true)
      if b then
        local expires = tonumber(string.sub(raw, a + 1, b - 1))
        live = expires == 0 or expires > now
      end
    end
    if live then
      if found < limit then
        out[#out + 1] = name
        out[#out + 1] = raw
        found = found + 1
      end
    else
      redis.call('HDEL', KEYS[1], name)
      redis.call('ZREM', KEYS[3], name)
    end
    from = '(' .. name
    if found >= limit then
      break
    end
  end
end
return out
