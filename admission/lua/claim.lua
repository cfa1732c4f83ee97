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
if redis.call('SETBIT', CLAIMS, seq, 1) == 1 then
  return {1, 1}
end
st.claimed = st.claimed + 1
local outcome = 0
if seq > st.settled then
  st.pending = math.max(0, st.pending - 1)
else
  st.late = st.late + 1
  st.credit = st.credit - MICRO
  outcome = 3
end
save(st)
return {1, outcome}
