-- admit.lua: claim an admitted place and start (or resume) its session, in
-- one step (room.rs RoomCore::admit): one place, one session.
--
-- KEYS: as lib.lua.
-- ARGV[1] place   ARGV[2] session id   ARGV[3] ttl in ms
-- Returns:
--   {0}           the room has no state
--   {1, outcome}  0 Started, 1 Resumed (claimed before, session live:
--                 renewed), 2 NotAdmitted, 3 Started late (after its claim
--                 window: takes one credit back; while the room is at its
--                 cap it answers NotAdmitted instead, and the place waits),
--                 4 Spent (claimed before and its session is over, or it
--                 was revoked)

local now = now_ms()
local st = load()
if not st then
  return {0}
end
prune_sessions(now)
local place, id, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if not place or place < 1 or place > st.frontier then
  return {1, 2}
end
-- a late claim's slot went back as credit: honoured only under the cap
if place <= st.settled and redis.call('GETBIT', CLAIMS, place) == 0 then
  local room = room_under_cap(st)
  if room >= 0 and room < 1 then
    return {1, 2}
  end
end
local outcome = claim_place(st, place)
if outcome == 1 then
  if redis.call('ZSCORE', SESS, id) and not redis.call('ZSCORE', ENDED, id) then
    redis.call('ZADD', SESS, int(now + ttl), id)
    return {1, 1}
  end
  return {1, 4}
end
save(st)
if redis.call('ZSCORE', ENDED, id) then
  return {1, 4}
end
redis.call('ZADD', SESS, int(now + ttl), id)
return {1, outcome}
