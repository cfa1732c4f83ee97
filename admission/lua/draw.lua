-- draw.lua: the draw that holds a seq (room.rs RoomCore::draw_of), writing
-- nothing.
--
-- KEYS: as lib.lua. ARGV[1] the seq
-- Returns {0} when the room has no state, else {1, from, n, k}, or {1, -1}
-- when no kept draw holds the seq (its place is its own).

local st = load()
if not st then
  return {0}
end
local seq = tonumber(ARGV[1])
if not seq or seq < 1 then
  return {1, -1}
end
local d = draw_of(st, seq)
if not d then
  return {1, -1}
end
return {1, d[1], d[2], d[3]}
