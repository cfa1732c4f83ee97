-- configure.lua: create a room, or change its settings; raise tail and
-- frontier to floors (configure, recover and reseed all land here).
--
-- KEYS: as lib.lua.
-- ARGV[1] mode: 'configure' (create or update), 'reseed' (update only the
--         floors; {0} when the room has no state) or 'recover' (create
--         with the floors when the room has no state, else as 'reseed')
-- ARGV[2] rate_m      ARGV[3] burst_u    ARGV[4] paused (0|1)
-- ARGV[5] closed (0|1) ARGV[6] max_active (-1: none) ARGV[7] claim_ms
-- ARGV[8] settings JSON
-- ARGV[9] min_tail    ARGV[10] min_frontier
-- ARGV[11] opens_ms (0: not scheduled)
-- ARGV[12] hint_from ARGV[13] hint_n: a pre-queue draw a gateway saw
--         (hint_n -1: none), adopted only while the pre-queue is open
-- ARGV[14] expected settings version (-1: unconditional): 'configure' of
--         an existing state is refused with {3, version} when the stored
--         version differs, and of a missing one answers {0}
-- ARGV[15] the epoch the floors were seen in ('recover' of a missing
--         state records it as covered: carry_epoch, carry_tail)
-- ARGV[16] session ttl in ms (kept for the ended set's retention)
-- ARGV[17] the queueing method (lib.lua's method field)
-- ARGV[18] the lanes: '' none, else 'mode,w1,w2,...' (lib.lua's lmode and
--         the weights in config order); lanes added keep what a lane of
--         that index held before (room.rs: the lane book never shrinks)
-- ARGV[19] lane_keep in ms (0: segments kept for the room's life)
-- ARGV[20] hint_k: the hinted draw's index (with ARGV[12] and ARGV[13])
-- Returns {0} (no state, where one is needed), {3, version} (a settings
-- conflict) or the snapshot reply of lib.lua. Every settings write bumps
-- settings_v; the JSON's own version is not read.
--
-- A new state gets epoch = TIME in ms (higher than any earlier one of the
-- room, so tokens of a lost store are recognisable), a full bucket, and
-- empty claims, batches and sessions. An existing one is first advanced at
-- its old settings (credit earned so far is settled at the old rate), then
-- takes the new ones with credit capped at the new burst.
--
-- The schedule (room.rs RoomCore::new and configure): a new state opens
-- its pre-queue when scheduled (pq_n = -1). A changed opening in the future
-- opens a new pre-queue, unless tickets of the last draw still wait; one in
-- the past, or none, lets the next operation draw.

local now = now_ms()
local mode = ARGV[1]
local expected = tonumber(ARGV[14])
local st = load()
if mode == 'recover' and st then
  -- room.rs RoomCore::extend_carry: a state that has handed out no seq of
  -- its own yet widens what it covers with another gateway's floors
  local epoch = tonumber(ARGV[15])
  local floor = math.max(tonumber(ARGV[9]), tonumber(ARGV[10]))
  if st.joins == 0 and epoch > 0 and epoch < st.epoch and floor > 0
      and (st.carry_epoch == 0 or st.carry_epoch == epoch) then
    st.carry_epoch = epoch
    st.carry_tail = math.max(st.carry_tail, floor)
  end
  mode = 'reseed'
end
if mode == 'reseed' then
  if not st then
    return {0}
  end
else
  if st and expected >= 0 and st.settings_v ~= expected then
    return {3, st.settings_v}
  end
  if not st and expected >= 0 then
    return {0}
  end
  if not st then
    redis.call('DEL', CLAIMS, BATCHES, SESS, ENDED, RESEATS, LANES, LANEMARKS, DRAWS)
    st = {}
    for _, f in ipairs(FIELDS) do
      st[f] = 0
    end
    st.ln, st.lmode, st.lmask, st.lanes, st.had_lanes = 0, 0, 0, {}, false
    st.lkeep = 0
    st.epoch = now
    st.last_ms = now
    st.credit = tonumber(ARGV[3])
    st.opens_ms = tonumber(ARGV[11])
    if st.opens_ms > 0 or tonumber(ARGV[13]) >= 0 then
      st.pq_n = -1
    end
    st.carry_tail = math.max(tonumber(ARGV[9]), tonumber(ARGV[10]))
    if st.carry_tail > 0 then
      st.carry_epoch = tonumber(ARGV[15])
    end
  else
    advance(st, now)
    local opens = tonumber(ARGV[11])
    if opens ~= st.opens_ms then
      if opens > now and (st.pq_n < 0 or st.frontier >= st.pq_from + st.pq_n) then
        st.pq_n = -1
      end
      st.opens_ms = opens
    end
  end
  local hinted = false
  if st.pq_n < 0 and tonumber(ARGV[13]) >= 0 then
    st.pq_from = tonumber(ARGV[12])
    st.pq_n = tonumber(ARGV[13])
    st.pq_k = tonumber(ARGV[20]) or 0
    hinted = true
  end
  st.rate_m = tonumber(ARGV[2])
  st.burst_u = tonumber(ARGV[3])
  st.paused = tonumber(ARGV[4])
  st.closed = tonumber(ARGV[5])
  st.max_active = tonumber(ARGV[6])
  st.claim_ms = tonumber(ARGV[7])
  if st.credit > st.burst_u then
    st.credit = st.burst_u
  end
  st.settings_v = st.settings_v + 1
  st.ttl_ms = tonumber(ARGV[16])
  st.method = tonumber(ARGV[17]) or 0
  if hinted and st.method == 1 then
    -- room.rs RoomCore::carrying: kept as a draw the room made
    redis.call('ZADD', DRAWS, int(st.pq_from),
      int(st.pq_from) .. ':' .. int(st.pq_n) .. ':' .. int(st.pq_k) .. ':' .. int(now))
  end
  local ws = {}
  for x in string.gmatch(ARGV[18] or '', '%d+') do
    ws[#ws + 1] = tonumber(x)
  end
  local lmode = 0
  if #ws > 0 then
    lmode = table.remove(ws, 1)
  end
  for i = st.ln + 1, #ws do
    st.lanes[i] = load_lane(i)
  end
  for i = 1, #ws do
    st.lanes[i].w = ws[i]
  end
  st.ln = #ws
  st.lmode = lmode
  st.lkeep = tonumber(ARGV[19]) or 0
  redis.call('HSET', S, 'settings', ARGV[8])
end
reseed(st, tonumber(ARGV[9]), tonumber(ARGV[10]))
-- every field written, moved or not: configure leaves a whole state
st.was = nil
save(st)
return snapshot(st, now, live_sessions(now))
