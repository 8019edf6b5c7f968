-- Prepended to every script that reads or writes records. A record is one string:
--   <state p|r|c><retention end ms>,<token>,<lease end ms>,<- | f and 16 fingerprint bytes>[o<outcome>]
-- (token and lease end are empty unless the state is r). A retention end written with a
-- leading 0 marks a record that is counted in its partition's counts (counts.lua): every
-- record this version writes is; earlier versions wrote none, and read the number alike. One GET and one SET ... PX per
-- transition: each call inside a script costs about a microsecond beyond its own work, and a
-- hash needed HMGET, HSET, HDEL and PEXPIRE. Records that earlier versions wrote as hashes
-- are read as well; the next transition writes them as strings (SET replaces a hash).

local parse
-- state, retention end, token text, lease end, fingerprint or false, outcome or false, whether
-- it is counted; nil when there is no record.
local function load(key)
  local raw = redis.pcall('GET', key)
  if not raw then return nil end
  if type(raw) == 'table' then
    if not (raw.err and string.find(raw.err, 'WRONGTYPE', 1, true)) then
      return error(raw)
    end
    local h = redis.call('HMGET', key, 's', 'e', 't', 'u', 'o', 'f')
    if not h[1] then return nil end
    return h[1], tonumber(h[2]) or 0, h[3] or '', tonumber(h[4] or '0') or 0, h[6] or false,
      h[5] or false, false
  end
  return parse(key, raw)
end

-- `load` of a record string `raw` read from `key` by the caller.
parse = function(key, raw)
  local s, e, t, u, at = string.match(raw, '^(%a)(%d+),(%d*),(%d*),()')
  if not s then return error('oncegate: record ' .. key .. ' is neither a record nor a hash of one') end
  local f = false
  if string.byte(raw, at) == 102 then
    f = string.sub(raw, at + 1, at + 16)
    at = at + 17
  else
    at = at + 1
  end
  local o = false
  if string.byte(raw, at) == 111 then o = string.sub(raw, at + 1) end
  return s, tonumber(e), t, tonumber(u) or 0, f, o, string.byte(raw, 2) == 48
end

-- The string of a record (lease end only for r; fingerprint and outcome false for none), made
-- in one concatenation: Lua interns every string it makes, the pieces of a longer chain too.
local function encode(s, e, t, u, f, o)
  local lease = ''
  if s == 'r' then lease = string.format('%d', u) end
  return s .. '0' .. string.format('%d', e) .. ',' .. t .. ',' .. lease .. (f and ',f' or ',-')
    .. (f or '') .. (o and 'o' or '') .. (o or '')
end

-- Writes a record that Redis drops `ttl` ms from now (its logical end plus slack). The TTL goes
-- as a string: Redis prints a Lua number argument with "%.17g", a float's slow path.
local function store(key, ttl, s, e, t, u, f, o)
  redis.call('SET', key, encode(s, e, t, u, f, o), 'PX', string.format('%d', ttl))
end
