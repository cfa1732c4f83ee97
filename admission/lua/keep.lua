-- keep.lua: a random room keeps the draws a gateway hands it after a loss
-- (room.rs RoomCore::keep_draws): each one whose first seq no kept draw
-- has, as made now.
--
-- KEYS: as lib.lua. ARGV: draws as "from:n:k", n > 0.
-- Returns {0} when the room has no state, else {1, how many were added}.

local st = load()
if not st then
  return {0}
end
if st.method ~= 1 then
  return {1, 0}
end
local now = now_ms()
local added = 0
for _, a in ipairs(ARGV) do
  local from, n, k = string.match(a, '^(%d+):(%d+):(%d+)$')
  from, n, k = tonumber(from), tonumber(n), tonumber(k)
  if from and n > 0 and redis.call('ZCOUNT', DRAWS, int(from), int(from)) == 0 then
    redis.call('ZADD', DRAWS, int(from), int(from) .. ':' .. int(n) .. ':' .. int(k) .. ':' .. int(now))
    added = added + 1
  end
end
return {1, added}
