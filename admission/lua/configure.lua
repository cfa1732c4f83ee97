-- configure.lua: create a room, or change its settings; raise tail and
-- frontier to floors (configure, recover and reseed all land here).
--
-- KEYS: as lib.lua.
-- ARGV[1] mode: 'configure' (create or update) or 'reseed' (update only
--         the floors; {0} when the room has no state)
-- ARGV[2] rate_m      ARGV[3] burst_u    ARGV[4] paused (0|1)
-- ARGV[5] closed (0|1) ARGV[6] max_active (-1: none) ARGV[7] claim_ms
-- ARGV[8] settings JSON
-- ARGV[9] min_tail    ARGV[10] min_frontier
-- ARGV[11] opens_ms (0: not scheduled)
-- ARGV[12] hint_from ARGV[13] hint_n: a pre-queue draw a gateway saw
--         (hint_n -1: none), adopted only while the pre-queue is open
-- Returns {0} (reseed of a room without state) or the snapshot reply of
-- lib.lua.
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
local st = load()
if mode == 'reseed' then
  if not st then
    return {0}
  end
else
  if not st then
    redis.call('DEL', CLAIMS, BATCHES, SESS)
    st = {}
    for _, f in ipairs(FIELDS) do
      st[f] = 0
    end
    st.epoch = now
    st.last_ms = now
    st.credit = tonumber(ARGV[3])
    st.opens_ms = tonumber(ARGV[11])
    if st.opens_ms > 0 or tonumber(ARGV[13]) >= 0 then
      st.pq_n = -1
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
  if st.pq_n < 0 and tonumber(ARGV[13]) >= 0 then
    st.pq_from = tonumber(ARGV[12])
    st.pq_n = tonumber(ARGV[13])
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
  redis.call('HSET', S, 'settings', ARGV[8])
end
reseed(st, tonumber(ARGV[9]), tonumber(ARGV[10]))
save(st)
return snapshot(st, now, live_sessions(now))
