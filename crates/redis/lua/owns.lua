-- Prepended to every script that only the partition's owner may run. The owner record
-- ("<expiry ms>,<epoch>,<instance>", written by own.lua) names who owns the partition under
-- which epoch.

-- Whether `instance` still holds the partition under `epoch`: the record names both. Its
-- expiry is not read (nor the server's clock, a microsecond a call): a record that ran out but
-- still names this grant was taken by nobody, and a take writes a new epoch, so the grant it
-- names is the last one.
local function owns(key, instance, epoch)
  local raw = redis.call('GET', key)
  if not raw then return false end
  local e, owner = string.match(raw, '^%d+,(%d+),(.*)$')
  return e == epoch and owner == instance
end
