-- the owner's ack: KEYS = stream, attempts hash, owner record; ARGV = instance, epoch, group,
-- seq. 1 when acked and removed, 0 when the caller does not own the partition under `epoch`
-- (the entry stays for the owner, which finds its key done and acks it).
if not owns(KEYS[3], ARGV[1], ARGV[2]) then return 0 end
local id = '0-' .. ARGV[4]
redis.call('XACK', KEYS[1], ARGV[3], id)
redis.call('XDEL', KEYS[1], id)
redis.call('HDEL', KEYS[2], ARGV[4])
return 1
