-- lane.lua: the place of a lane's seq, once admitted (lanes.rs
-- LaneBook::place_of), writing nothing.
--
-- KEYS: as lib.lua. ARGV[1] the lane (from 0)   ARGV[2] the lane seq
-- Returns {0} when the room has no state, else {1, place} (place 0: not
-- admitted yet, or no such lane).

local st = load()
if not st then
  return {0}
end
local lane, seq = tonumber(ARGV[1]), tonumber(ARGV[2])
if not lane or not seq or lane < 0 or lane >= st.ln or seq < 1
    or seq > st.lanes[lane + 1].f then
  return {1, 0}
end
return {1, lane_place(lane + 1, seq)}
