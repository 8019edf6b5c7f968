-- complete and ack, for one or more handed-out entries of one partition: KEYS = stream,
-- attempts hash, then one record per entry; ARGV = now_ms, ttl slack ms, group, then per entry:
-- token, retention_ms, seq, outcome ('-' for none, 'o' and its bytes for one).
-- The entries are acked and removed whatever the fences say (they were handed to this
-- caller); each record is completed only if its token is the live record's holder. One reply
-- per entry, in order: 1, else 0.
local now = tonumber(ARGV[1])
local slack = tonumber(ARGV[2])
local ids, seqs = {}, {}
for i = 3, #KEYS do
  local seq = ARGV[4 * i - 6]
  ids[i - 2] = '0-' .. seq
  seqs[i - 2] = seq
end
redis.call('XACK', KEYS[1], ARGV[3], unpack(ids))
redis.call('XDEL', KEYS[1], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(seqs))
local replies = {}
for i = 3, #KEYS do
  local at = 4 * i - 8
  local applied = 0
  local s, e, t, u, f = load(KEYS[i])
  if s == 'r' and t == ARGV[at] and (now < e or now < u) then
    local outcome = ARGV[at + 3]
    if string.byte(outcome, 1) == 111 then outcome = string.sub(outcome, 2) else outcome = false end
    mark_completed(KEYS[i], now, tonumber(ARGV[at + 1]), slack, f, outcome)
    applied = 1
  end
  replies[i - 2] = applied
end
return replies
