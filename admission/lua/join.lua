-- join.lua: hand out the next seq; passthrough when nobody waits.
--
-- KEYS: as lib.lua; with 'once', KEYS[10] the solution's key
--       (sluice:{room}:pow:<hex id>, under the room's hash tag).
-- ARGV[1]: 'join' (default), 'passthrough' (admit on the spot or do
--          nothing: no seq is handed out unless it is admitted) or 'once'
--          (a join paid for by a proof-of-work solution: the replay guard
--          and the join in one step, store.rs QueueStore::join_once)
-- With 'once': ARGV[2] how long the solution is remembered (ms), ARGV[3]
--   the visitor id the place is noted with, ARGV[4] 'new' (a solution
--   already recorded is a replay: answered with its note, nothing
--   changed) or 'own' (the caller recorded it itself: the note is
--   written over). A join that hands out a seq records the solution,
--   PX ARGV[2], as 'seq:epoch:sub' (its place) or '1' when admitted at
--   once (no place to give back); one that hands out none records nothing.
-- ARGV[5] (every mode; absent: -1): the lane, from 0; -1 the room's
--   default lane (the last). A lane the room does not have (any lane at a
--   room without lanes) answers {6}, nothing handed out.
-- ARGV[1] 'many' (store.rs QueueStore::join_once_many): n joins paid for by
--   solutions, each exactly as 'once' would make it, one after the other,
--   at one TIME; KEYS[9 + i] the i-th solution's key, ARGV[4i - 2 ..
--   4i + 1] its ARGV[2..5] of 'once'. Returns the n replies, in order
--   ({0} alone when the room has no state: nothing looked at). The
--   state is read and written once for all of them: a batch costs Redis
--   about a third of what its joins cost one call each
--   (admission/bench/join_compare.sh).
-- Returns:
--   {6}                               no such lane
--   {5, note}                         'once', 'new': the solution was
--                                     recorded before; note is its value
--                                     ('1': the bare mark, no place)
--   {0}                               the room has no state
--   {2}                               the room is closed
--   {3}                               passthrough: not admissible now;
--                                     nothing handed out
--   {4}                               a join at a 'reject' room (method 3)
--                                     not admissible now: the room is
--                                     full; nothing handed out
--   {1, seq, epoch, admitted(0|1), frontier, prequeue(0|1), lane, place}
--     prequeue: the pre-queue is open (the seq is a ticket of the draw);
--     lane: -1 without lanes, else the lane (from 0), seq and frontier
--     being the lane's; place: the place when admitted, else 0
--
-- First brings the room up to TIME (advance: refunds, sessions, admits
-- those already waiting), then seq = ++tail; admitted at once when
-- frontier == seq - 1, credit >= 1, not halted and room under the cap. A
-- place admitted at once is claimed by the join itself (its bit is set)
-- and its session ({epoch}.{seq}, for the settings' ttl_ms) started. Before
-- a scheduled room opens, halted() holds: seqs are handed out, nobody is
-- admitted. The method (room.rs RoomCore::join): random and queue_all
-- never admit a join at once; reject joins as a passthrough does, {4}
-- when it cannot.

-- Records the solution of key for ttl ms with the place it bought
-- ('seq:epoch:sub'), or '1' when admitted at once (no place to give back).
local function note_place(key, ttl, admitted, seq, epoch, sub)
  local note = '1'
  if admitted == 0 then
    note = int(seq) .. ':' .. int(epoch) .. ':' .. sub
  end
  redis.call('SET', key, note, 'PX', ttl)
end

-- One join, as 'once' (once true) or 'join'/'passthrough' make it, on st
-- (loaded, written back by the caller) at now; key the solution's key,
-- ttl, sub and own ARGV[2..4] of 'once'. The replay guard is the
-- caller's (replayed below).
local function join_one(st, now, mode, once, key, ttl, sub, lane_arg)
  local lane = tonumber(lane_arg) or -1
  if lane >= st.ln then
    return {6}
  end
  if st.closed == 1 then
    return {2}
  end
  advance(st, now)
  if (mode == 'passthrough' or st.method == 3) and not admissible(st) then
    if mode == 'passthrough' then
      return {3}
    end
    return {4}
  end
  local room = room_under_cap(st)
  if not passes_through(st) then
    room = 0
  end
  if st.ln > 0 then
    -- room.rs RoomCore::join_in_lane
    if lane < 0 then
      lane = st.ln - 1
    end
    local l = st.lanes[lane + 1]
    st.joins = st.joins + 1
    local place = 0
    if not halted(st) and lanes_waiting(st) == 0 and st.credit >= MICRO
        and (room < 0 or room >= 1) then
      st.tail = st.frontier + 1
      st.frontier = st.tail
      place = st.frontier
      st.credit = st.credit - MICRO
      st.admitted = st.admitted + 1
      st.claimed = st.claimed + 1
      redis.call('SETBIT', CLAIMS, place, 1)
      redis.call('ZADD', SESS, int(now + st.ttl_ms), int(st.epoch) .. '.' .. int(place))
      l.t = l.t + 1
      l.f = l.t
      l.a = l.a + 1
      lane_record(lane + 1, l.t, place, 1)
    else
      st.tail = st.tail + 1
      l.t = l.t + 1
    end
    local admitted = 0
    if place > 0 then
      admitted = 1
    end
    if once then
      note_place(key, ttl, admitted, l.t, st.epoch, sub)
    end
    return {1, l.t, st.epoch, admitted, l.f, 0, lane, place}
  end
  st.tail = st.tail + 1
  local seq = st.tail
  st.joins = st.joins + 1
  local admitted = 0
  if not halted(st) and st.frontier == seq - 1 and st.credit >= MICRO
      and (room < 0 or room >= 1) then
    st.frontier = seq
    st.credit = st.credit - MICRO
    st.admitted = st.admitted + 1
    st.claimed = st.claimed + 1
    redis.call('SETBIT', CLAIMS, seq, 1)
    -- its session starts in the same step (room.rs start_own_session), so a
    -- racing admission already counts it against max_active
    redis.call('ZADD', SESS, int(now + st.ttl_ms), int(st.epoch) .. '.' .. int(seq))
    admitted = 1
  end
  if once then
    note_place(key, ttl, admitted, seq, st.epoch, sub)
  end
  local prequeue = 0
  if st.pq_n < 0 then
    prequeue = 1
  end
  local place = 0
  if admitted == 1 then
    place = seq
  end
  return {1, seq, st.epoch, admitted, st.frontier, prequeue, -1, place}
end

-- The replay guard of a solution ('new': one recorded before answers with
-- its note), or nil.
local function replayed(key, own)
  if own == 'new' then
    local seen = redis.call('GET', key)
    if seen then
      return {5, seen}
    end
  end
  return nil
end

if ARGV[1] == 'many' then
  local now = now_ms()
  local st = load()
  if not st then
    return {0}
  end
  local out = {}
  for i = 1, #KEYS - 9 do
    local a = 4 * i - 2
    local key = KEYS[9 + i]
    out[i] = replayed(key, ARGV[a + 2])
      or join_one(st, now, 'once', true, key, ARGV[a], ARGV[a + 1], ARGV[a + 3])
  end
  save(st)
  return out
end

local once = ARGV[1] == 'once'
if once then
  local seen = replayed(KEYS[10], ARGV[4])
  if seen then
    return seen
  end
end
local now = now_ms()
local st = load()
if not st then
  return {0}
end
local reply = join_one(st, now, ARGV[1], once, KEYS[10], ARGV[2], ARGV[3], ARGV[5])
if reply[1] ~= 6 and reply[1] ~= 2 then
  save(st)
end
return reply
