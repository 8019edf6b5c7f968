-- Writes or removes one shared value if its current version meets the expectation.
-- KEYS[1] the namespace's values (hash: name -> "version|expires_at_ms|value"),
-- KEYS[2] its generation (counter), KEYS[3] its names (sorted set, for listing in order).
-- ARGV: op ("put" | "remove"), name, expect ("any" | "absent" | "version"), expected version,
-- now ms, value, expires_at_ms (0: never), the most values the namespace holds.
-- Returns {1, generation} when done, {0, current version} when not, {2, 0} when full.
local raw = redis.call('HGET', KEYS[1], ARGV[2])
local current = 0
if raw then
  local a = string.find(raw, '|', 1, true)
  local b = a and string.find(raw, '|', a + 1, true)
  if not b then
    return redis.error_reply('oncegate: unreadable state value')
  end
  local version = tonumber(string.sub(raw, 1, a - 1))
  local expires = tonumber(string.sub(raw, a + 1, b - 1))
  if expires == 0 or expires > tonumber(ARGV[5]) then
    current = version
  end
end
local expect = ARGV[3]
local met = expect == 'any'
  or (expect == 'absent' and current == 0)
  or (expect == 'version' and current ~= 0 and current == tonumber(ARGV[4]))
if not met then
  return {0, current}
end
if ARGV[1] == 'put' and not raw and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[8]) then
  return {2, 0}
end
local generation = redis.call('INCR', KEYS[2])
if ARGV[1] == 'put' then
  redis.call('HSET', KEYS[1], ARGV[2], generation .. '|' .. ARGV[7] .. '|' .. ARGV[6])
  redis.call('ZADD', KEYS[3], 0, ARGV[2])
else
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
end
return {1, generation}
