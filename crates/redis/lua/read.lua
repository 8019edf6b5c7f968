-- the owner's group reads: KEYS = stream, owner record; ARGV = instance, epoch, group, count,
-- mode (claim: take over every pending entry of the group from `from` on; else read this
-- consumer's entries after `from`, or never-delivered ones with '>'), from.
-- {0} when the caller does not own the partition under `epoch` (nothing read: an earlier
-- owner that wakes up cannot pull entries into its pending list behind the new owner's back);
-- {-1} when the group is gone; else {1, the command's reply}.
if not owns(KEYS[2], ARGV[1], ARGV[2]) then return {0} end
local reply
if ARGV[5] == 'claim' then
  reply = redis.pcall('XAUTOCLAIM', KEYS[1], ARGV[3], ARGV[1], 0, ARGV[6], 'COUNT', ARGV[4])
else
  reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[3], ARGV[1], 'COUNT', ARGV[4], 'STREAMS',
    KEYS[1], ARGV[6])
end
if type(reply) == 'table' and reply.err then
  if string.find(reply.err, 'NOGROUP', 1, true) then return {-1} end
  return redis.error_reply(reply.err)
end
return {1, reply}
