-- set_stock.lua: load or change an event's stock (common.lua prepended).
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:loaded:{ev}   the load marker: the highest version ever
--         set for the event. Not one of the event's own keys (they all
--         start `sluice:{ev}:`) and never given a TTL, so it outlives them
--         when they are evicted or deleted; same hash tag, same slot.
-- ARGV[1..2] as in common.lua
-- ARGV[3] total            ARGV[4] cart_limit     ARGV[5] hold_ttl_ms
-- ARGV[6] version (canonical decimal u64)         ARGV[7] room
-- ARGV[8] '1': only load into a store that never had the event (configured
--         stock, `load_if_new`); '0': an operator's explicit load
-- ARGV[9] '1': the caller knows the store had the event (it is in
--         `sluice:events`, from before markers existed): treat a missing
--         marker as lost
-- ARGV[10] n categories (0: none), then n triples id, total, cart_limit
--         (0 = none); ARGV[3] is then their sum (the Rust side computes it)
--
-- Returns one of:
--   {'PRESENT'}                    (ARGV[8] = '1') settings exist: nothing
--                                  changed
--   {'LOST', last_version}         (ARGV[8] = '1') no settings, but the
--                                  store had the event: nothing changed
--   {'STALE', current_version}     version not above the stored one
--   {'BELOW', held, confirmed}     total < held + confirmed, or the event
--                                  changes shape (categories to none or
--                                  back) with units held or sold: refused
--   {'CAT_BELOW', id, held, confirmed}   a category's new total (0 when
--                                  left out) < its held + confirmed: refused
--   {'CREATED', available}         no settings stored and no marker
--   {'RECREATED', available, last_version}   no settings stored, the
--                                  marker says the event was lost: created
--                                  again (versions start over)
--   {'UPDATED', available}         available = total - held - confirmed
-- On CREATED and RECREATED the deadline index and visitor counts are
-- cleared: holds of a lost generation can never return units into the new
-- one.
-- Writes: meta, stock, the marker (raised to the version), XADD type=stock.
local K_LOADED = KEYS[8]
local m = redis.call('HMGET', K_META, 'version', 'held', 'confirmed', 'cats')
local created = not m[1]
local marker = redis.call('GET', K_LOADED)
local lost = nil
if created then
  lost = marker
  if not lost and ARGV[9] == '1' then lost = '0' end
end
if ARGV[8] == '1' then
  if not created then return {'PRESENT'} end
  if lost then return {'LOST', lost} end
end
-- Waves due before this change are released first: an absolute total
-- is set on top of them, never undone by a late release.
if not created then release_waves(now_ms()) end
if not created and not dec_gt(ARGV[6], m[1]) then return {'STALE', m[1]} end
local held, confirmed = 0, 0
if not created then
  held, confirmed = tonumber(m[2] or '0'), tonumber(m[3] or '0')
end
local old = ''
if not created then old = m[4] or '' end
local ncat = tonumber(ARGV[10] or '0')
-- Each category's held and sold units (0 for a new one).
local function committed(id)
  if created then return 0, 0 end
  local c = redis.call('HMGET', K_META, 'c:' .. id .. ':held', 'c:' .. id .. ':confirmed')
  return tonumber(c[1] or '0'), tonumber(c[2] or '0')
end
if (old == '') ~= (ncat == 0) and held + confirmed > 0 then
  return {'BELOW', held, confirmed}
end
local kept = {}
for i = 1, ncat do
  local id, ctotal = ARGV[8 + 3 * i], tonumber(ARGV[9 + 3 * i])
  kept[id] = true
  local h, c = committed(id)
  if ctotal < h + c then return {'CAT_BELOW', id, h, c} end
end
for id in string.gmatch(old, '[^,]+') do
  if not kept[id] then
    local h, c = committed(id)
    if h + c > 0 then return {'CAT_BELOW', id, h, c} end
  end
end
local total = tonumber(ARGV[3])
if total < held + confirmed then return {'BELOW', held, confirmed} end
local available = total - held - confirmed
if created then redis.call('DEL', K_DEADLINES, K_VISITORS, K_VCATS) end
for id in string.gmatch(old, '[^,]+') do
  if not kept[id] then
    local p = 'c:' .. id .. ':'
    redis.call('HDEL', K_META, p .. 'total', p .. 'avail', p .. 'held', p .. 'confirmed', p .. 'limit',
      p .. 'version')
  end
end
local ids, described = {}, {}
for i = 1, ncat do
  local id, ctotal, climit = ARGV[8 + 3 * i], ARGV[9 + 3 * i], ARGV[10 + 3 * i]
  local h, c = committed(id)
  local p = 'c:' .. id .. ':'
  redis.call('HSET', K_META, p .. 'total', ctotal, p .. 'avail', int(tonumber(ctotal) - h - c),
    p .. 'held', int(h), p .. 'confirmed', int(c), p .. 'limit', climit)
  ids[#ids + 1] = id
  described[#described + 1] = id .. ':' .. ctotal .. ':' .. climit
end
if ncat > 0 then
  redis.call('HSET', K_META, 'cats', table.concat(ids, ','))
else
  redis.call('HDEL', K_META, 'cats')
end
redis.call('HSET', K_META, 'total', ARGV[3], 'cart_limit', ARGV[4], 'hold_ttl_ms', ARGV[5],
  'version', ARGV[6], 'room', ARGV[7], 'held', int(held), 'confirmed', int(confirmed))
redis.call('SET', K_STOCK, int(available))
if not marker or dec_gt(ARGV[6], marker) then redis.call('SET', K_LOADED, ARGV[6]) end
local extra = {'version', ARGV[6]}
if ncat > 0 then
  extra[#extra + 1] = 'categories'; extra[#extra + 1] = table.concat(described, ',')
end
emit('stock', '', '', ARGV[3], available, now_ms(), extra)
if created and lost then return {'RECREATED', available, lost} end
if created then return {'CREATED', available} end
return {'UPDATED', available}
