-- Prepended (after clock.lua) to every script that only the partition's owner may run. The
-- owner record ("<expiry ms>,<epoch>,<instance>", written by own.lua) names who owns the
-- partition under which epoch; its expiry is the server's time, so that gateways' clocks do not
-- matter.

-- Whether `instance` owns the partition under `epoch` now.
local function owns(key, instance, epoch)
  local raw = redis.call('GET', key)
  if not raw then return false end
  local expires, e, owner = string.match(raw, '^(%d+),(%d+),(.*)$')
  if not expires or e ~= epoch or owner ~= instance then return false end
  return server_ms() < tonumber(expires)
end
