-- renew / complete / release: KEYS = record, the partition's counts (counts.lua), and for a
-- lean lease (a hand-out that wrote no claim) the partition's owner record; ARGV = op, token,
-- now_ms, ms (extend or retention), ttl slack ms, outcome ('-' for none, 'o' and its bytes for
-- one), then for a lean lease: instance, epoch.
-- 1 when the token is the live record's holder (or, lean, nobody holds or completed the key)
-- and the change was made, else 0.
local op = ARGV[1]
local now = tonumber(ARGV[3])
local ms = tonumber(ARGV[4])
local slack = tonumber(ARGV[5])
local outcome = ARGV[6]
if string.byte(outcome, 1) == 111 then outcome = string.sub(outcome, 2) else outcome = false end
local s, e, t, u, f, _, counted = load(KEYS[1])
-- The record as it was leaves the counts; what the change writes joins them.
local function uncount()
  if counted then tally(s, e, u, -1, now) end
end
if s == 'r' and t == ARGV[2] and (now < e or now < u) then
  uncount()
  if op == 'renew' then
    local till = now + ms
    store(KEYS[1], math.max(e, till) - now + slack, 'r', e, t, till, f, false)
    tally('r', e, till, 1, now)
  elseif op == 'complete' then
    mark_completed(KEYS[1], now, ms, slack, f, outcome, true)
  else
    store(KEYS[1], math.max(e - now, 1) + slack, 'p', e, '', 0, f, false)
    tally('p', e, 0, 1, now)
  end
  tallied(KEYS[2])
  return 1
end
if not (KEYS[3] and lean_free(s, e, u, now)) then return 0 end
-- A lean hand-out: its holder is the partition's owner, under the epoch named.
if op == 'renew' then
  -- Becomes a claim of its own, so that it outlives the partition's ownership: only by the
  -- owner (after the partition moved, the new owner may have run the event already).
  if not owns(KEYS[3], ARGV[7], ARGV[8]) then return 0 end
  local till = now + ms
  local retained = now
  if s == 'p' then retained = e end
  uncount()
  store(KEYS[1], math.max(retained, till) - now + slack, 'r', retained, ARGV[2], till, f, false)
  tally('r', retained, till, 1, now)
elseif op == 'complete' then
  -- Also from an owner that lost the partition: nobody else ran the event meanwhile, and the
  -- next owner then finds it done instead of running it again.
  uncount()
  mark_completed(KEYS[1], now, ms, slack, f, outcome, true)
end
tallied(KEYS[2])
return 1
