-- Prepended to scripts that read the server's clock.

-- The server's time in ms.
local function server_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
