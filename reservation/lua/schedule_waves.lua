-- schedule_waves.lua: replace an event's pending waves (common.lua
-- prepended).
--
-- KEYS[1..7] as in common.lua
-- ARGV[1..2] as in common.lua
-- ARGV[3] n, then n triples at_ms, qty, category ('' for none), sorted by
--         (at, qty, category) by the Rust side, which also checked n, each
--         qty >= 1 and their sum (`waves_problem`)
--
-- Returns one of:
--   {'NOT_READY'}                   no settings or no stock counter
--   {'IN_PAST', at, now}            the first wave opening at or before TIME
--   {'CATEGORY_REQUIRED'}           a wave without a category on an event
--                                   with categories
--   {'CATEGORY_NOT_FOUND', cat}     a wave of a category the event lacks
--                                   (any category on an event without)
--   {'TOO_BIG'}                     total + the waves' units above 2^53
--   {'SCHEDULED', waves}            the schedule as stored (common.lua's
--                                   format)
-- The checks run per wave in order (time, then category), then the sum;
-- nothing is written before all passed, except that waves of the old
-- schedule already due are released first (as any script meeting them
-- does). Writes: meta `waves` and `wave_next`, XADD type=stock
-- reason=waves (qty = the total, `waves` = the schedule, the categories
-- described).
local m = redis.call('HMGET', K_META, 'total', 'version', 'cats')
if not m[1] or not redis.call('GET', K_STOCK) then return {'NOT_READY'} end
local now = now_ms()
release_waves(now)
m = redis.call('HMGET', K_META, 'total', 'version', 'cats')
local cats = m[3] or ''
local known = ',' .. cats .. ','
local n = tonumber(ARGV[3])
local list = {}
local sum = tonumber(m[1])
for i = 1, n do
  local at, qty, cat = ARGV[1 + 3 * i], ARGV[2 + 3 * i], ARGV[3 + 3 * i]
  if tonumber(at) <= now then return {'IN_PAST', at, int(now)} end
  if cat == '' then
    if cats ~= '' then return {'CATEGORY_REQUIRED'} end
  elseif not string.find(known, ',' .. cat .. ',', 1, true) then
    return {'CATEGORY_NOT_FOUND', cat}
  end
  sum = sum + tonumber(qty)
  list[#list + 1] = at .. ':' .. qty .. ':' .. cat
end
if sum > 9007199254740992 then return {'TOO_BIG'} end
local text = table.concat(list, ',')
if n == 0 then
  redis.call('HDEL', K_META, 'waves', 'wave_next')
else
  redis.call('HSET', K_META, 'waves', text, 'wave_next', ARGV[4])
end
local extra = {'version', m[2] or '0', 'reason', 'waves', 'waves', text}
local described = describe_categories()
if described ~= '' then
  extra[#extra + 1] = 'categories'; extra[#extra + 1] = described
end
emit('stock', '', '', tonumber(m[1]), tonumber(redis.call('GET', K_STOCK)), now, extra)
return {'SCHEDULED', text}
