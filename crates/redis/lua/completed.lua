-- Marks held record `key` done for `retention` ms with `outcome` (or false for none), and with
-- `count` counts it (the caller uncounts what it was; complete_ack.lua leaves both to the
-- gateway). A held record has no outcome; the fingerprint `f` stays: a repeat for another
-- payload is still a conflict.
local function mark_completed(key, now, retention, slack, f, outcome, count)
  store(key, retention + slack, 'c', now + retention, '', 0, f, outcome)
  if count then tally('c', now + retention, 0, 1, now) end
end

-- Whether a key a lean hand-out holds (see fence.lua) is still nobody else's: no record, a
-- pending one, or one that no longer counts. A claim by anyone else, or a completion, is not.
local function lean_free(s, e, u, now)
  return not s or s == 'p' or not (now < e or (s == 'r' and now < u))
end
