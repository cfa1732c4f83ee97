-- claim.lua: mark an admitted seq as claimed.
--
-- KEYS: as lib.lua.
-- ARGV[1]: seq
-- Returns:
--   {0}           the room has no state
--   {1, outcome}  0 Claimed, 1 AlreadyClaimed, 2 NotAdmitted,
--                 3 Late (after its claim window: honoured, takes one
--                   credit back since its slot was refunded)

local st = load()
if not st then
  return {0}
end
local seq = tonumber(ARGV[1])
if not seq or seq < 1 or seq > st.frontier then
  return {1, 2}
end
local outcome = claim_place(st, seq)
if outcome ~= 1 then
  save(st)
end
return {1, outcome}
