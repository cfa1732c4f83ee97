-- set_stock.lua: load or change an event's stock (common.lua prepended).
--
-- KEYS[1..5] as in common.lua
-- ARGV[1..2] as in common.lua
-- ARGV[3] total            ARGV[4] cart_limit     ARGV[5] hold_ttl_ms
-- ARGV[6] version (canonical decimal u64)         ARGV[7] room
--
-- Returns one of:
--   {'STALE', current_version}     version not above the stored one
--   {'BELOW', held, confirmed}     total < held + confirmed: refused
--   {'CREATED', available}         no settings stored (new, or lost with
--                                  the store: versions start over)
--   {'UPDATED', available}         available = total - held - confirmed
-- On CREATED the deadline index and visitor counts are cleared: holds of
-- a lost generation can never return units into the new one.
-- Writes: meta, stock, XADD type=stock.
local m = redis.call('HMGET', K_META, 'version', 'held', 'confirmed')
local created = not m[1]
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
emit('stock', '', '', ARGV[3], available, now_ms(), {'version', ARGV[6]})
if created then return {'CREATED', available} end
return {'UPDATED', available}
