-- advance.lua: bring the room up to TIME (any gateway, every tick).
--
-- KEYS: as lib.lua. ARGV: none.
-- Returns {0} when the room has no state, else the snapshot reply of
-- lib.lua: {1, tail, frontier, credit, rate_m, burst_u, paused, closed,
-- epoch, active_sessions, pending, max_active, admitted, claimed, joins,
-- refunded, late, now_ms, opens_ms, pq_from, pq_n, …}.
--
-- Many gateways may call it at once: each call counts only the time since
-- the previous one (last_ms), so together they act as one caller.

local now = now_ms()
local st = load()
if not st then
  return {0}
end
advance(st, now)
save(st)
return snapshot(st, now, redis.call('ZCARD', SESS))
