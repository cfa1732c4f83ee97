-- lib.lua: shared by every admission script (prepended to each one when
-- the script is built; Redis runs the pair as one script). A line-for-line
-- port of admission/src/bucket.rs and admission/src/room.rs: change them
-- together, the conformance suite holds them to the same results.
--
-- KEYS (every script, same order, one hash tag {room} for Redis Cluster):
--   KEYS[1] sluice:{room}:state     hash, the room's state and settings
--   KEYS[2] sluice:{room}:claims    string, claim bitmap (bit seq = claimed)
--   KEYS[3] sluice:{room}:batches   list of "from:to:at_ms" advance batches
--   KEYS[4] sluice:{room}:sessions  sorted set, member = session id,
--                                   score = deadline (ms, store clock)
--   KEYS[5] sluice:{room}:ended     sorted set, member = session id ended
--                                   by a revoke, score = when (ms); kept
--                                   for the session ttl + 30 s
--   KEYS[6] sluice:{room}:reseats   hash, "epoch:seq" of an old-epoch
--                                   queue token -> its seq in this epoch
--   KEYS[7] sluice:{room}:lanes     sorted set, the lanes' segments
--                                   (lanes.rs): member
--                                   "lane:seq:place:len", score
--                                   lane * 2^40 + seq (lane from 0);
--                                   never written without lanes
--   KEYS[8] sluice:{room}:lanemarks list of "at_ms:f1,f2,..." (room.rs
--                                   forget_old_segments: when, each
--                                   lane's frontier then), oldest first;
--                                   only with lanes and lkeep > 0
--   KEYS[9] sluice:{room}:draws     sorted set, a random room's draws
--                                   (prequeue.rs "Rolling draws"): member
--                                   "from:n:k:at_ms", score from; those
--                                   made within lkeep (all without it)
--
-- State hash fields (all integers, written with '%d' so no value goes
-- through Lua's 14-digit number formatting):
--   tail frontier credit(micro-admissions) last_ms epoch
--   joins admitted claimed refunded late   (counters)
--   pending  (admitted, unclaimed, in an open batch)
--   settled  (seqs <= settled are outside every open batch)
--   rate_m (milli-admissions/s) burst_u (micro) paused closed
--   max_active (-1: no cap) claim_ms
--   opens_ms (when a scheduled room opens; 0: not scheduled)
--   pq_from pq_n (the pre-queue draw: seqs pq_from+1 .. pq_from+pq_n are
--     its tickets; pq_n = -1 while the pre-queue is open, i.e. scheduled
--     and not yet drawn; a state written before these fields reads 0, 0:
--     no draw); pq_k pq_at (the draw's index and when it was made: a
--     random room draws again when the last draw is exhausted; 0 0 before)
--   ended_total (sessions ended by revoke so far)
--   carry_epoch carry_tail (the epoch whose seqs the state was created
--     above, and the tail floor it was created with; 0 0: none)
--   settings_v (version of the settings, bumped by every write)
--   ttl_ms (the session ttl of the settings, for the ended set)
--   method (settings.rs QueueMethod::code: 0 fifo, 1 random, 2 queue_all,
--     3 reject; a state written before it reads 0: fifo)
--   settings (JSON of RoomSettings, written by configure)
--   Lanes (admission/src/lanes.rs; none of these is written while the
--   room never had lanes): ln (lanes configured; 0 or absent: none), lmode
--   (0 weighted, 1 strict), lmask (eligible set of the last weighted pick,
--   bit i-1 = lane i), lkeep (settings.rs lane_keep in ms; 0 or absent:
--   segments, and a random room's draws, kept for the room's life; also
--   written for a random room without lanes), and per lane i from 1: lw<i>
--   weight, lt<i> tail,
--   lf<i> frontier, lc<i> round robin counter, la<i> admitted. With lanes
--   tail counts every join and frontier every place admitted.
--
-- Every value stays below 2^53, so Lua's doubles are exact: rate_m <= 1e9
-- and one advance counts at most 3,600,000 ms.
--
-- The clock: redis.call('TIME') only, never the caller's.

local S, CLAIMS, BATCHES, SESS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ENDED, RESEATS, LANES, LANEMARKS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local DRAWS = KEYS[9]
local DRAW_EVERY_MS = 1000
local MAX_TICKETS = 4294967295
local LANE_MARKS = 16
local LANE_SPAN = 1099511627776 -- 2^40
local ENDED_SKEW_MS = 30000
local MICRO = 1000000
local MAX_ELAPSED = 3600000

local FIELDS = {'tail', 'frontier', 'credit', 'last_ms', 'epoch', 'joins',
  'admitted', 'claimed', 'refunded', 'late', 'pending', 'settled', 'rate_m',
  'burst_u', 'paused', 'closed', 'max_active', 'claim_ms', 'opens_ms',
  'pq_from', 'pq_n', 'ended_total', 'carry_epoch', 'carry_tail', 'settings_v',
  'ttl_ms', 'method', 'pq_k', 'pq_at'}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(x)
  return string.format('%d', x)
end

-- Lane i's fields (1-based), as stored (a lane never configured reads
-- weight 1, the rest 0).
local function load_lane(i)
  local x = redis.call('HMGET', S, 'lw' .. i, 'lt' .. i, 'lf' .. i, 'lc' .. i, 'la' .. i)
  return {w = tonumber(x[1]) or 1, t = tonumber(x[2]) or 0, f = tonumber(x[3]) or 0,
    c = tonumber(x[4]) or 0, a = tonumber(x[5]) or 0}
end

-- The state, or nil when the room has none.
local function load()
  local v = redis.call('HMGET', S, 'ln', 'lmode', 'lmask', 'lkeep', unpack(FIELDS))
  if not v[5] then
    return nil
  end
  local st = {}
  -- the fields as stored, so save() writes back only those that moved
  -- (an absent one is written whatever its value)
  local was = {}
  for i, f in ipairs(FIELDS) do
    local x = tonumber(v[i + 4]) or 0
    st[f] = x
    if v[i + 4] then
      was[f] = x
    end
  end
  st.was = was
  st.lkeep = tonumber(v[4]) or 0
  st.had_lanes = v[1] ~= false and v[1] ~= nil
  st.ln = tonumber(v[1]) or 0
  st.lmode = tonumber(v[2]) or 0
  st.lmask = tonumber(v[3]) or 0
  st.lanes = {}
  for i = 1, st.ln do
    st.lanes[i] = load_lane(i)
  end
  return st
end

-- Writes the fields that differ from st.was (as load() read them; every
-- field when st.was is nil: a state made anew, or configure's full write).
-- A join moves five or six of the 29: writing them all was a fifth of
-- join.lua's instructions in Redis (admission/bench/join_compare.sh).
local function save(st)
  local args = {}
  local was = st.was or {}
  for _, f in ipairs(FIELDS) do
    local x = st[f]
    if x ~= was[f] then
      args[#args + 1] = f
      args[#args + 1] = int(x)
      was[f] = x
    end
  end
  st.was = was
  if st.ln > 0 or st.had_lanes then
    for _, f in ipairs({'ln', 'lmode', 'lmask', 'lkeep'}) do
      args[#args + 1] = f
      args[#args + 1] = int(st[f])
    end
    for i = 1, st.ln do
      local l = st.lanes[i]
      for _, p in ipairs({{'lw', l.w}, {'lt', l.t}, {'lf', l.f}, {'lc', l.c}, {'la', l.a}}) do
        args[#args + 1] = p[1] .. i
        args[#args + 1] = int(p[2])
      end
    end
  elseif st.method == 1 then
    args[#args + 1] = 'lkeep'
    args[#args + 1] = int(st.lkeep)
  end
  if #args > 0 then
    redis.call('HSET', S, unpack(args))
  end
end

-- Waiting in all lanes.
local function lanes_waiting(st)
  local w = 0
  for i = 1, st.ln do
    local d = st.lanes[i].t - st.lanes[i].f
    if d > 0 then
      w = w + d
    end
  end
  return w
end

-- lanes.rs LaneBook::record: lane i's (1-based) seqs from seq are places
-- from place, merged with the lane's last run when both continue it.
local function lane_record(i, seq, place, len)
  if len <= 0 then
    return
  end
  local base = (i - 1) * LANE_SPAN
  local last = redis.call('ZREVRANGEBYSCORE', LANES, int(base + LANE_SPAN - 1), int(base),
    'LIMIT', 0, 1)
  if last[1] then
    local _, s, p, n = string.match(last[1], '^(%d+):(%d+):(%d+):(%d+)$')
    s, p, n = tonumber(s), tonumber(p), tonumber(n)
    if s + n == seq and p + n == place then
      redis.call('ZREM', LANES, last[1])
      redis.call('ZADD', LANES, int(base + s),
        int(i - 1) .. ':' .. int(s) .. ':' .. int(p) .. ':' .. int(n + len))
      return
    end
  end
  redis.call('ZADD', LANES, int(base + seq),
    int(i - 1) .. ':' .. int(seq) .. ':' .. int(place) .. ':' .. int(len))
end

-- lanes.rs LaneBook::place_of (lane i 1-based): the place, or 0.
local function lane_place(i, seq)
  local base = (i - 1) * LANE_SPAN
  local last = redis.call('ZREVRANGEBYSCORE', LANES, int(base + seq), int(base), 'LIMIT', 0, 1)
  if not last[1] then
    return 0
  end
  local _, s, p, n = string.match(last[1], '^(%d+):(%d+):(%d+):(%d+)$')
  s, p, n = tonumber(s), tonumber(p), tonumber(n)
  if seq < s + n then
    return p + (seq - s)
  end
  return 0
end

-- lanes.rs LaneBook::forget_through (lane i 1-based): the segments that
-- end at or before seq go; one running past it stays whole.
local function lane_forget(i, seq)
  local base = (i - 1) * LANE_SPAN
  local last = redis.call('ZREVRANGEBYSCORE', LANES, int(base + seq), int(base), 'LIMIT', 0, 1)
  if not last[1] then
    return
  end
  local _, s, _, n = string.match(last[1], '^(%d+):(%d+):(%d+):(%d+)$')
  s, n = tonumber(s), tonumber(n)
  if s + n - 1 > seq then
    redis.call('ZREMRANGEBYSCORE', LANES, int(base), '(' .. int(base + s))
  else
    redis.call('ZREMRANGEBYSCORE', LANES, int(base), int(base + s))
  end
end

-- room.rs RoomCore::forget_old_segments: a mark when one is due, and the
-- segments of the newest mark lkeep old forgotten.
local function forget_old_segments(st, now)
  if st.lkeep <= 0 then
    return
  end
  local every = math.max(math.floor(st.lkeep / LANE_MARKS), 1000)
  local last = redis.call('LINDEX', LANEMARKS, -1)
  if not last or now >= tonumber(string.match(last, '^(%d+)')) + every then
    local fs = {}
    for i = 1, st.ln do
      fs[i] = int(st.lanes[i].f)
    end
    redis.call('RPUSH', LANEMARKS, int(now) .. ':' .. table.concat(fs, ','))
  end
  local cut
  while true do
    local m = redis.call('LINDEX', LANEMARKS, 0)
    if not m or tonumber(string.match(m, '^(%d+)')) + st.lkeep > now then
      break
    end
    redis.call('LPOP', LANEMARKS)
    cut = m
  end
  if cut then
    local i = 0
    for f in string.gmatch(string.match(cut, ':(.*)$'), '%d+') do
      i = i + 1
      lane_forget(i, tonumber(f))
    end
  end
end

-- lanes.rs split: how many of n each lane gets (a table, 1-based).
local function lane_split(st, n)
  local k = st.ln
  local give, waiting = {}, {}
  for i = 1, k do
    give[i] = 0
    waiting[i] = math.max(0, st.lanes[i].t - st.lanes[i].f)
  end
  if st.lmode == 1 then
    for i = 1, k do
      local g = math.min(n, waiting[i])
      give[i] = g
      n = n - g
    end
    return give
  end
  while n > 0 do
    local on, eligible = {}, 0
    for i = 1, k do
      on[i] = waiting[i] > 0
      if on[i] then
        eligible = eligible + 2 ^ (i - 1)
      end
    end
    if eligible == 0 then
      break
    end
    if eligible ~= st.lmask then
      for i = 1, k do
        st.lanes[i].c = 0
      end
      st.lmask = eligible
    end
    local wsum = 0
    for i = 1, k do
      if on[i] then
        wsum = wsum + st.lanes[i].w
      end
    end
    local cycles = math.floor(n / wsum)
    for i = 1, k do
      if on[i] then
        cycles = math.min(cycles, math.floor(waiting[i] / st.lanes[i].w))
      end
    end
    if cycles > 0 then
      for i = 1, k do
        if on[i] then
          local g = cycles * st.lanes[i].w
          give[i] = give[i] + g
          waiting[i] = waiting[i] - g
        end
      end
      n = n - cycles * wsum
    else
      local best = nil
      for i = 1, k do
        if on[i] then
          st.lanes[i].c = st.lanes[i].c + st.lanes[i].w
          if best == nil or st.lanes[i].c > st.lanes[best].c then
            best = i
          end
        end
      end
      st.lanes[best].c = st.lanes[best].c - wsum
      give[best] = give[best] + 1
      waiting[best] = waiting[best] - 1
      n = n - 1
    end
  end
  return give
end

-- room.rs RoomCore::split_places: the n places just admitted go to the
-- lanes, in lane order.
local function split_places(st, n)
  local give = lane_split(st, n)
  local place = st.frontier - n + 1
  for i = 1, st.ln do
    local g = give[i]
    if g > 0 then
      local l = st.lanes[i]
      lane_record(i, l.f + 1, place, g)
      l.f = l.f + g
      l.a = l.a + g
      place = place + g
    end
  end
end

-- The pre-queue halts admission as a pause does (room.rs live_params).
local function halted(st)
  return st.paused == 1 or st.closed == 1 or st.pq_n < 0
end

-- room.rs RoomCore::record_draw: draw k of everyone waiting now; a random
-- room keeps it (and forgets those lkeep old).
local function record_draw(st, now, k)
  st.pq_from = st.frontier
  st.pq_n = math.min(st.tail - st.frontier, MAX_TICKETS)
  st.pq_k = k
  st.pq_at = now
  if st.method ~= 1 then
    return
  end
  redis.call('ZADD', DRAWS, int(st.pq_from),
    int(st.pq_from) .. ':' .. int(st.pq_n) .. ':' .. int(k) .. ':' .. int(now))
  if st.lkeep <= 0 then
    return
  end
  while true do
    local first = redis.call('ZRANGE', DRAWS, 0, 0)[1]
    if not first or tonumber(string.match(first, ':(%d+)$')) + st.lkeep > now then
      break
    end
    redis.call('ZREMRANGEBYRANK', DRAWS, 0, 0)
  end
end

-- room.rs RoomCore::draw_if_due: the first operation at or after the
-- opening records the draw, once, and credit is earned from the opening;
-- a random room draws again when its draw is exhausted, somebody waits, it
-- is not paused or closed and the last draw is DRAW_EVERY_MS old.
local function draw_if_due(st, now)
  if st.pq_n < 0 and (st.opens_ms == 0 or now >= st.opens_ms) then
    local k = 0
    if redis.call('EXISTS', DRAWS) == 1 then
      k = st.pq_k + 1
    end
    record_draw(st, now, k)
    if st.last_ms < st.opens_ms then
      st.last_ms = st.opens_ms
    end
  elseif st.method == 1 and not halted(st) and st.pq_n >= 0
      and st.frontier >= st.pq_from + st.pq_n
      and st.tail > st.frontier and now >= st.pq_at + DRAW_EVERY_MS then
    record_draw(st, now, st.pq_k + 1)
  end
end

-- room.rs RoomCore::draw_of: {from, n, k} of the draw holding seq, or nil.
local function draw_of(st, seq)
  if st.pq_n >= 0 and seq > st.pq_from and seq <= st.pq_from + st.pq_n then
    return {st.pq_from, st.pq_n, st.pq_k}
  end
  local last = redis.call('ZREVRANGEBYSCORE', DRAWS, '(' .. int(seq), '-inf', 'LIMIT', 0, 1)[1]
  if not last then
    return nil
  end
  local from, n, k = string.match(last, '^(%d+):(%d+):(%d+):')
  from, n, k = tonumber(from), tonumber(n), tonumber(k)
  if seq <= from + n then
    return {from, n, k}
  end
  return nil
end

local function prune_sessions(now)
  redis.call('ZREMRANGEBYSCORE', SESS, '-inf', int(now))
end

local function live_sessions(now)
  return redis.call('ZCOUNT', SESS, '(' .. int(now), '+inf')
end

-- Refund unclaimed seqs of batches whose claim window has passed.
local function settle(st, now)
  local refund = 0
  while true do
    local b = redis.call('LINDEX', BATCHES, 0)
    if not b then
      break
    end
    local from, to, at = string.match(b, '^(%d+):(%d+):(%d+)$')
    from, to, at = tonumber(from), tonumber(to), tonumber(at)
    if at + st.claim_ms > now then
      break
    end
    redis.call('LPOP', BATCHES)
    local claimed = redis.call('BITCOUNT', CLAIMS, from, to, 'BIT')
    local unclaimed = (to - from + 1) - claimed
    refund = refund + unclaimed
    st.pending = math.max(0, st.pending - unclaimed)
    if to > st.settled then
      st.settled = to
    end
  end
  st.refunded = st.refunded + refund
  return refund * MICRO
end

-- Room under the active cap; -1 = unlimited. Call after prune_sessions.
local function room_under_cap(st)
  if st.max_active < 0 then
    return -1
  end
  local r = st.max_active - redis.call('ZCARD', SESS) - st.pending
  if r < 0 then
    r = 0
  end
  return r
end

-- bucket.rs Bucket::advance
local function bucket_advance(st, now, room, refund)
  local elapsed = now - st.last_ms
  if elapsed < 0 then
    elapsed = 0
  end
  if elapsed > MAX_ELAPSED then
    elapsed = MAX_ELAPSED
  end
  if now > st.last_ms then
    st.last_ms = now
  end
  local earned = 0
  if not halted(st) then
    earned = st.rate_m * elapsed
  end
  st.credit = st.credit + earned + refund
  local n = 0
  if not halted(st) and st.credit >= MICRO then
    n = math.floor(st.credit / MICRO)
    local q = st.tail - st.frontier
    if q < n then
      n = q
    end
    if room >= 0 and room < n then
      n = room
    end
    st.frontier = st.frontier + n
    st.credit = st.credit - n * MICRO
  end
  if st.credit > st.burst_u then
    st.credit = st.burst_u
  end
  return n
end

-- room.rs RoomCore::advance
local function advance(st, now)
  prune_sessions(now)
  draw_if_due(st, now)
  local refund = settle(st, now)
  local room = room_under_cap(st)
  if st.ln > 0 then
    local w = lanes_waiting(st)
    if room < 0 or w < room then
      room = w
    end
  end
  if st.method == 1 then
    -- never past the current draw: the rest wait for the next one
    local left = 0
    if st.pq_n >= 0 then
      left = math.max(0, st.pq_from + st.pq_n - st.frontier)
    end
    if room < 0 or left < room then
      room = left
    end
  end
  local n = bucket_advance(st, now, room, refund)
  if n > 0 and st.ln > 0 then
    split_places(st, n)
  end
  if st.ln > 0 then
    forget_old_segments(st, now)
  end
  if n > 0 then
    redis.call('RPUSH', BATCHES,
      int(st.frontier - n + 1) .. ':' .. int(st.frontier) .. ':' .. int(now))
    st.pending = st.pending + n
    st.admitted = st.admitted + n
  end
  return n
end

-- room.rs RoomCore::reseed
local function reseed(st, min_tail, min_frontier)
  if st.ln > 0 then
    -- places are only numbers: both move up together (room.rs reseed)
    local d = math.max(min_tail, min_frontier) - st.frontier
    if d > 0 then
      st.tail = st.tail + d
      st.frontier = st.frontier + d
      st.settled = math.max(st.settled, st.frontier)
    end
    return
  end
  local before = st.frontier
  st.tail = math.max(st.tail, min_tail, min_frontier)
  st.frontier = math.max(st.frontier, min_frontier)
  if st.frontier > before then
    st.settled = math.max(st.settled, st.frontier)
  end
end

-- The snapshot reply: {1, tail, frontier, credit, rate_m, burst_u, paused,
-- closed, epoch, active_sessions, pending, max_active, admitted, claimed,
-- joins, refunded, late, now_ms, opens_ms, pq_from, pq_n, ended_total,
-- carry_epoch, carry_tail, settings_v, pq_k, ln, then per lane: weight,
-- tail, frontier, admitted}
local function snapshot(st, now, active)
  local r = {1, st.tail, st.frontier, st.credit, st.rate_m, st.burst_u,
    st.paused, st.closed, st.epoch, active, st.pending, st.max_active,
    st.admitted, st.claimed, st.joins, st.refunded, st.late, now,
    st.opens_ms, st.pq_from, st.pq_n, st.ended_total, st.carry_epoch,
    st.carry_tail, st.settings_v, st.pq_k, st.ln}
  for i = 1, st.ln do
    local l = st.lanes[i]
    r[#r + 1] = l.w
    r[#r + 1] = l.t
    r[#r + 1] = l.f
    r[#r + 1] = l.a
  end
  return r
end

-- room.rs RoomCore::claim for an admitted place (1 <= place <= frontier):
-- 1 when it was claimed before; else 0 (within its claim window) or 3
-- (late: its slot was refunded, so it takes a credit back). The state is
-- updated, not saved.
local function claim_place(st, place)
  if redis.call('SETBIT', CLAIMS, place, 1) == 1 then
    return 1
  end
  st.claimed = st.claimed + 1
  if place > st.settled then
    st.pending = math.max(0, st.pending - 1)
    return 0
  end
  st.late = st.late + 1
  st.credit = st.credit - MICRO
  return 3
end

-- settings.rs QueueMethod::passes_through: random and queue_all never
-- admit a join on the spot.
local function passes_through(st)
  return st.method ~= 1 and st.method ~= 2
end

-- room.rs RoomCore::passthrough's test: nobody waits, credit, not halted,
-- under the cap, a method that passes through. Call after advance.
local function admissible(st)
  local room = room_under_cap(st)
  local nobody = st.frontier == st.tail
  if st.ln > 0 then
    nobody = lanes_waiting(st) == 0
  end
  return passes_through(st) and not halted(st) and nobody and st.credit >= MICRO
    and (room < 0 or room >= 1)
end
