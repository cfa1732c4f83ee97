-- set_stock.lua: load or change an event's stock (common.lua prepended).
--
-- KEYS[1..6] as in common.lua
-- KEYS[7] sluice:loaded:{ev}   the load marker: the highest version ever
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
--
-- Returns one of:
--   {'PRESENT'}                    (ARGV[8] = '1') settings exist: nothing
--                                  changed
--   {'LOST', last_version}         (ARGV[8] = '1') no settings, but the
--                                  store had the event: nothing changed
--   {'STALE', current_version}     version not above the stored one
--   {'BELOW', held, confirmed}     total < held + confirmed: refused
--   {'CREATED', available}         no settings stored and no marker
--   {'RECREATED', available, last_version}   no settings stored, the
--                                  marker says the event was lost: created
--                                  again (versions start over)
--   {'UPDATED', available}         available = total - held - confirmed
-- On CREATED and RECREATED the deadline index and visitor counts are
-- cleared: holds of a lost generation can never return units into the new
-- one.
-- Writes: meta, stock, the marker (raised to the version), XADD type=stock.
local K_LOADED = KEYS[7]
local m = redis.call('HMGET', K_META, 'version', 'held', 'confirmed')
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
if not created and not dec_gt(ARGV[6], m[1]) then return {'STALE', m[1]} end
local held, confirmed = 0, 0
if not created then
  held, confirmed = tonumber(m[2] or '0'), tonumber(m[3] or '0')
end
local total = tonumber(ARGV[3])
if total < held + confirmed then return {'BELOW', held, confirmed} end
local available = total - held - confirmed
if created then redis.call('DEL', K_DEADLINES, K_VISITORS) end
redis.call('HSET', K_META, 'total', ARGV[3], 'cart_limit', ARGV[4], 'hold_ttl_ms', ARGV[5],
  'version', ARGV[6], 'room', ARGV[7], 'held', int(held), 'confirmed', int(confirmed))
redis.call('SET', K_STOCK, int(available))
if not marker or dec_gt(ARGV[6], marker) then redis.call('SET', K_LOADED, ARGV[6]) end
emit('stock', '', '', ARGV[3], available, now_ms(), {'version', ARGV[6]})
if created and lost then return {'RECREATED', available, lost} end
if created then return {'CREATED', available} end
return {'UPDATED', available}
