-- complete and ack, for one or more handed-out entries of one partition: KEYS = stream,
-- attempts hash, owner record, then one record per entry; ARGV = now_ms, ttl slack ms, group,
-- instance, epoch, then per entry: token, retention_ms, seq, outcome ('-' for none, 'o' and its
-- bytes for one), lean ('1' for a hand-out that wrote no claim, else '0').
-- Each record is completed only if its token is the live record's holder, or, lean, if nobody
-- else holds or completed it (fence.lua). The entries are acked and removed whatever those
-- fences say (they were handed to this caller), but only while the caller owns the partition
-- under `epoch`: otherwise they stay for the owner, which finds their keys done (or not) and
-- acks (or runs) them. One reply per entry, in order: 0 when the record was not completed;
-- else 1, or, when the record it replaced is in the counts (counts.lua), that record's minute
-- times 4 plus its state (1 p, 2 r, 3 c): the gateway takes it out of the counts and counts the
-- completed record (`counted.rs`), so that the script every event ends with writes no count.
local now = tonumber(ARGV[1])
local slack = tonumber(ARGV[2])
local entries = #KEYS - 3
local minute_now = math.floor(now / 60000)
if owns(KEYS[3], ARGV[4], ARGV[5]) then
  local ids, seqs = {}, {}
  for j = 1, entries do
    local seq = ARGV[5 * j + 3]
    ids[j] = '0-' .. seq
    seqs[j] = seq
  end
  redis.call('XACK', KEYS[1], ARGV[3], unpack(ids))
  redis.call('XDEL', KEYS[1], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(seqs))
end
local replies = {}
for j = 1, entries do
  local key = KEYS[j + 3]
  local at = 5 * j + 1
  local applied = 0
  local s, e, t, u, f, _, counted = load(key)
  if (s == 'r' and t == ARGV[at] and (now < e or now < u))
      or (ARGV[at + 4] == '1' and lean_free(s, e, u, now)) then
    local outcome = ARGV[at + 3]
    if string.byte(outcome, 1) == 111 then outcome = string.sub(outcome, 2) else outcome = false end
    applied = 1
    if counted then
      local ends = e
      if s == 'r' and u > e then ends = u end
      local minute = math.floor(ends / 60000)
      if minute >= minute_now then
        applied = minute * 4 + (s == 'p' and 1 or (s == 'r' and 2 or 3))
      end
    end
    mark_completed(key, now, tonumber(ARGV[at + 1]), slack, f, outcome, false)
  end
  replies[j] = applied
end
return replies
