-- get_hold.lua: one hold as its owner sees it. Read-only; standalone (no
-- common.lua).
--
-- KEYS[1] sluice:{ev}:stock
-- KEYS[2] sluice:{ev}:hold:{suffix}
-- ARGV[1] visitor (must own the hold)
--
-- Returns one of:
--   {'NOT_FOUND'}
--   {'FOUND', qty, status, deadline_ms, available, items}
--     status is 'expired' for a held hold past its deadline (by TIME),
--     even before a reaper visited it; available is -1 when the stock
--     counter is missing; items is "{cat}={qty}/..." ('' without categories),
--     read from the hold's deadline member.
local h = redis.call('HMGET', KEYS[2], 'visitor', 'qty', 'status', 'deadline_ms', 'member')
if not h[1] or h[1] ~= ARGV[1] then return {'NOT_FOUND'} end
local status, deadline = h[3], tonumber(h[4])
if status == 'held' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if deadline <= now then status = 'expired' end
end
local stock = redis.call('GET', KEYS[1])
local items = string.match(h[5] or '', '^[^/:]*/([^:]*):') or ''
return {'FOUND', tonumber(h[2]), status, deadline, tonumber(stock or '-1'), items}
