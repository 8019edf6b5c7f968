-- partition ownership: KEYS = owner key; ARGV = instance id, ttl ms
-- 1: still ours (renewed), 2: newly ours, 0: someone else's.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
