-- partition ownership: KEYS = owner record, token clock; ARGV = op (renew | take | release),
-- instance, epoch (the one the caller holds; '0' for none), ttl ms.
-- renew: {1} when the partition is still the caller's under `epoch` (its expiry moved to now +
--   ttl), else {0}.
-- take: {2, epoch, held ms} when it was nobody's (or the caller's without the caller knowing its
--   epoch: an answer that was lost): a new grant, under a new epoch; else {0, owner}. Held: when
--   an ownership ran out (its owner did not release it), for how long that owner may still
--   run events it handed out without a claim of their own (lean hand-outs: up to its expiry, and
--   within the ownership time after that they take claims): its pending entries wait that long.
-- release: {1} when it was the caller's under `epoch` (now nobody's), else {0}.
-- The record has no TTL (one per partition): its expiry is logical, in the server's time.
-- Epochs come from the partition's token clock (`hybrid_next`), the one claims take their
-- fencing tokens from, so that an epoch never repeats after a restart without persistence or a
-- failover that lost the last writes.
local now = server_ms()
local raw = redis.call('GET', KEYS[1])
local expires, epoch, owner = 0, '', ''
if raw then
  local e, p, o = string.match(raw, '^(%d+),(%d+),(.*)$')
  if e then expires, epoch, owner = tonumber(e), p, o end
end
local live = now < expires
local op = ARGV[1]
if op == 'renew' then
  if not (live and owner == ARGV[2] and epoch == ARGV[3]) then return {0} end
  redis.call('SET', KEYS[1], string.format('%d,%s,%s', now + tonumber(ARGV[4]), epoch, owner))
  return {1}
end
if op == 'release' then
  if not (owner == ARGV[2] and epoch == ARGV[3]) then return {0} end
  redis.call('DEL', KEYS[1])
  return {1}
end
if live and owner ~= ARGV[2] then return {0, owner} end
local granted = string.format('%d', hybrid_next(KEYS[2]))
redis.call('SET', KEYS[2], granted)
redis.call('SET', KEYS[1], string.format('%d,%s,%s', now + tonumber(ARGV[4]), granted, ARGV[2]))
-- Not after a release (the record is gone) nor when the grant was the caller's own, live, and
-- its answer lost (nothing was handed out under it).
local held = 0
if owner ~= '' and not (live and owner == ARGV[2]) then
  held = math.max(0, expires + tonumber(ARGV[4]) - now)
end
return {2, granted, held}
