-- read records: KEYS = record keys; one string per key in the form record.lua describes
-- (hashes of earlier versions converted), false where there is none.
local out = {}
for i = 1, #KEYS do
  local s, e, t, u, f, o = load(KEYS[i])
  if s then out[i] = encode(s, e, t, u, f, o) else out[i] = false end
end
return out
