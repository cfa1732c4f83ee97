-- restore.lua: rebuild a lost event from a durable record (the ledger's),
-- in one step (common.lua prepended). The Rust side validated the record
-- and computed the counters (`Inventory::restore`).
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:loaded:{ev}   the load marker (see set_stock.lua)
-- then for each open hold i = 1..n, two keys:
--   KEYS[7 + 2i] sluice:{ev}:hold:{suffix}   its hash (the suffix is read
--                from the key, as in hold.lua)
--   KEYS[8 + 2i] sluice:{ev}:vholds:{len(visitor)}:{visitor}
-- ARGV[1..2] as in common.lua
-- ARGV[3] total           ARGV[4] cart_limit      ARGV[5] hold_ttl_ms
-- ARGV[6] version         ARGV[7] room
-- ARGV[8] available       ARGV[9] held            ARGV[10] confirmed
-- ARGV[11] retention of a released or expired hold, ms
-- ARGV[12] n, then n quadruples: visitor, qty, deadline_ms, items ('' or
--   "{cat}={qty}/...")
-- then c, then c pairs: visitor, held + confirmed units (the cart counts)
-- then the retention of a confirmed hold (ms), then m, then m pairs:
--   visitor, qty of each hold that ended paid, whose hash key follows the
--   open holds' keys (KEYS[8 + 2n + j]): restored with status 'confirmed'
--   so its owner still reads it and a retried webhook answers 'confirmed'
--   (each followed by its items)
-- then k categories: k sextuples id, total, limit, avail, held, confirmed;
-- then v pairs "{cat}:{visitor}", units (the category carts)
--
-- Returns one of:
--   {'PRESENT'}                               the stock counter or the
--                                             settings exist: nothing changed
--   {'RESTORED', available, held, confirmed}
-- Writes: meta, stock, the deadline index, visitor counts, each hold's
-- hash and its visitor's index, the marker, XADD type=restored. A restored
-- hold past its deadline is left in the deadline index: the reaper (or the
-- next script that meets it) expires it as any lapsed hold, once.
-- Idempotency keys and payment answers are not restored: a client retrying
-- a hold with the same key after a rebuild gets a new hold.
local K_LOADED = KEYS[8]
if redis.call('EXISTS', K_STOCK) == 1 or redis.call('EXISTS', K_META) == 1 then
  return {'PRESENT'}
end
local now = now_ms()
local ttl, keep = tonumber(ARGV[5]), tonumber(ARGV[11])
-- Leftovers of the lost generation (the counters went, these did not) must
-- not count in the new one.
redis.call('DEL', K_DEADLINES, K_VISITORS, K_VCATS)
redis.call('HSET', K_META, 'total', ARGV[3], 'cart_limit', ARGV[4], 'hold_ttl_ms', ARGV[5],
  'version', ARGV[6], 'room', ARGV[7], 'held', ARGV[9], 'confirmed', ARGV[10])
redis.call('SET', K_STOCK, ARGV[8])

local n = tonumber(ARGV[12])
local a = 13
local cleared = {}
for i = 1, n do
  local k_hold, k_vholds = KEYS[7 + 2 * i], KEYS[8 + 2 * i]
  local visitor, qty, deadline, items = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3]
  a = a + 4
  local suffix = string.match(k_hold, ':hold:([^:]*)$')
  if not suffix then return redis.error_reply('restore.lua: malformed hold key') end
  local head = suffix
  if items ~= '' then head = suffix .. '/' .. items end
  local member = head .. ':' .. qty .. ':' .. visitor
  redis.call('DEL', k_hold)
  redis.call('HSET', k_hold, 'visitor', visitor, 'qty', qty, 'status', 'held',
    'deadline_ms', int(deadline), 'created_ms', int(now), 'member', member, 'restored', '1')
  redis.call('PEXPIREAT', k_hold, int(math.max(deadline, now) + keep))
  redis.call('ZADD', K_DEADLINES, int(deadline), member)
  if not cleared[k_vholds] then
    redis.call('DEL', k_vholds)
    cleared[k_vholds] = true
  end
  redis.call('ZADD', k_vholds, int(deadline), member)
  local until_ms = math.max(deadline, now + ttl) + 1000
  local vttl = redis.call('PTTL', k_vholds)
  if vttl < 0 or now + vttl < until_ms then redis.call('PEXPIREAT', k_vholds, int(until_ms)) end
end
local c = tonumber(ARGV[a])
a = a + 1
for _ = 1, c do
  redis.call('HSET', K_VISITORS, ARGV[a], ARGV[a + 1])
  a = a + 2
end
local keep_sold = ARGV[a]
local m = tonumber(ARGV[a + 1])
a = a + 2
for j = 1, m do
  local k_hold = KEYS[8 + 2 * n + j]
  local visitor, qty, items = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  a = a + 3
  local suffix = string.match(k_hold, ':hold:([^:]*)$')
  if not suffix then return redis.error_reply('restore.lua: malformed hold key') end
  local head = suffix
  if items ~= '' then head = suffix .. '/' .. items end
  redis.call('DEL', k_hold)
  redis.call('HSET', k_hold, 'visitor', visitor, 'qty', qty, 'status', 'confirmed',
    'deadline_ms', int(now), 'created_ms', int(now), 'ended_ms', int(now),
    'member', head .. ':' .. qty .. ':' .. visitor, 'restored', '1')
  redis.call('PEXPIRE', k_hold, keep_sold)
end
local k = tonumber(ARGV[a])
a = a + 1
local ids, described = {}, {}
for _ = 1, k do
  local id = ARGV[a]
  local p = 'c:' .. id .. ':'
  redis.call('HSET', K_META, p .. 'total', ARGV[a + 1], p .. 'limit', ARGV[a + 2],
    p .. 'avail', ARGV[a + 3], p .. 'held', ARGV[a + 4], p .. 'confirmed', ARGV[a + 5])
  ids[#ids + 1] = id
  described[#described + 1] = id .. ':' .. ARGV[a + 1] .. ':' .. ARGV[a + 2]
  a = a + 6
end
if k > 0 then redis.call('HSET', K_META, 'cats', table.concat(ids, ',')) end
local v = tonumber(ARGV[a])
a = a + 1
for _ = 1, v do
  redis.call('HSET', K_VCATS, ARGV[a], ARGV[a + 1])
  a = a + 2
end
local marker = redis.call('GET', K_LOADED)
if not marker or dec_gt(ARGV[6], marker) then redis.call('SET', K_LOADED, ARGV[6]) end
local extra = {'version', ARGV[6]}
if k > 0 then
  extra[#extra + 1] = 'categories'; extra[#extra + 1] = table.concat(described, ',')
end
emit('restored', '', '', ARGV[3], tonumber(ARGV[8]), now, extra)
return {'RESTORED', ARGV[8], ARGV[9], ARGV[10]}
