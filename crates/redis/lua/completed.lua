-- Prepended to the scripts that complete a record: marks held record `key` done for
-- `retention` ms with `outcome` (or none). A held record has no outcome (the claim cleared it),
-- so one write sets state and outcome; the fingerprint stays: a repeat for another payload is
-- still a conflict.
local function mark_completed(key, now, retention, slack, outcome)
  redis.call('HDEL', key, 't', 'u')
  if outcome then
    redis.call('HSET', key, 's', 'c', 'e', string.format('%d', now + retention), 'o', outcome)
  else
    redis.call('HSET', key, 's', 'c', 'e', string.format('%d', now + retention))
  end
  redis.call('PEXPIRE', key, retention + slack)
end
