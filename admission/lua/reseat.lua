-- reseat.lua: a place of this epoch for a queue token of an epoch the state
-- does not cover (room.rs RoomCore::reseat).
--
-- KEYS: as lib.lua.
-- ARGV[1] the token's epoch   ARGV[2] its seq   ARGV[3] ttl in ms (how
--         long the mapping is kept after the last ask)
-- Returns:
--   {0}  the room has no state
--   {2}  the room is closed
--   {1, seq, epoch, 0, frontier, prequeue(0|1), lane, 0}: the same seq for
--        every ask of one (epoch, seq), a new one at the back the first
--        time; never admitted on the spot. With lanes (lane >= 0): at the
--        back of the default lane, seq and frontier the lane's.

local now = now_ms()
local st = load()
if not st then
  return {0}
end
if st.closed == 1 then
  return {2}
end
advance(st, now)
local field = ARGV[1] .. ':' .. ARGV[2]
local seq = tonumber(redis.call('HGET', RESEATS, field))
if not seq then
  st.tail = st.tail + 1
  st.joins = st.joins + 1
  seq = st.tail
  if st.ln > 0 then
    local l = st.lanes[st.ln]
    l.t = l.t + 1
    seq = l.t
  end
  redis.call('HSET', RESEATS, field, int(seq))
end
redis.call('PEXPIRE', RESEATS, ARGV[3])
save(st)
local prequeue = 0
if st.pq_n < 0 then
  prequeue = 1
end
if st.ln > 0 then
  return {1, seq, st.epoch, 0, st.lanes[st.ln].f, prequeue, st.ln - 1, 0}
end
return {1, seq, st.epoch, 0, st.frontier, prequeue, -1, 0}
