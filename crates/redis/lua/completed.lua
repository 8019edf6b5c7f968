-- Marks held record `key` done for `retention` ms with `outcome` (or false for none). A held
-- record has no outcome; the fingerprint `f` stays: a repeat for another payload is still a
-- conflict.
local function mark_completed(key, now, retention, slack, f, outcome)
  store(key, retention + slack, 'c', now + retention, '', 0, f, outcome)
end
