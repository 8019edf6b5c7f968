-- gateway membership: KEYS = members (a sorted set scored by expiry, the server's ms);
-- ARGV = instance, ttl ms, leaving (1 to leave, else 0).
-- Every live member's name (those whose heartbeat has not run out), this one included unless
-- it leaves. A member lives as long as its partitions do without a heartbeat: a gateway that
-- is killed stops counting when its partitions become free.
local now = server_ms()
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
