-- purge a dead letter: KEYS = dead stream, dead index; ARGV = dead entry id, seq
-- 1 when removed, 0 when it was gone.
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entries == 0 then return 0 end
local fields = entries[1][2]
for i = 1, #fields, 2 do
  if fields[i] == 's' and fields[i + 1] ~= ARGV[2] then return 0 end
end
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
