-- feed.lua: one row of a stock feed, a delta or a snapshot, of the event
-- or one category (common.lua prepended). See reservation/src/feed.rs.
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:loaded:{ev}   the load marker (an event snapshot raises it)
-- KEYS[9] (delta only) sluice:{ev}:feed:{len(key)}:{key}   the delta key's
--         record: "{category}|{delta}|{total}|{available}|{category_total}|
--         {category_available}|{version}" (the first answer), PX ARGV[7]
-- ARGV[1..2] as in common.lua
-- ARGV[3] 'd' (delta) or 's' (snapshot)
-- ARGV[4] the category ('' for the event)
-- ARGV[5] delta: signed integer (not 0, |delta| <= 2^53); snapshot: total
-- ARGV[6] snapshot: the source version (canonical decimal u64)
-- ARGV[7] delta: the key's TTL, ms
-- ARGV[8] delta: the key (for the stream entry)
-- ARGV[9] the largest total (2^53)
--
-- Returns one of:
--   {'NOT_READY'}                      stock counter or settings missing
--   {'REPLAYED', record}               the key was applied with the same
--                                      category and delta: nothing changed
--   {'KEY_REUSED'}                     the key was applied with another
--                                      category or delta: nothing changed
--   {'CATEGORY_REQUIRED'}              no category, the event has some
--   {'CATEGORY_NOT_FOUND', category}
--   {'STOCK_NEGATIVE', available}      a negative delta above what is
--                                      available (after expiring lapsed
--                                      holds oldest first, as hold.lua);
--                                      also a snapshot of a sharded
--                                      event's shard 0 dropping more than
--                                      it has (meta `shard_total`: the
--                                      event's total, moved by deltas and
--                                      set by snapshots, sharded.rs)
--   {'STALE', current_version}
--   {'BELOW', held, confirmed}         event snapshot below held + sold
--   {'CAT_BELOW', category, held, confirmed}
--   {'INVALID', reason}                a total would pass 2^53
--   {'APPLIED', record}                the record format of KEYS[9] (a
--                                      snapshot's delta field is 0)
-- Writes (APPLIED only): meta, stock, the key record, the marker (event
-- snapshot), XADD type=stock with reason=delta|snapshot.
local MODE, CAT = ARGV[3], ARGV[4]
local MAX = tonumber(ARGV[9])
-- Waves due first, as every stock change (common.lua's release_waves).
release_waves(now_ms())
local m = redis.call('HMGET', K_META, 'version', 'held', 'confirmed', 'cats', 'total')
local stock = redis.call('GET', K_STOCK)
if not m[1] or not stock then return {'NOT_READY'} end

if MODE == 'd' then
  local rec = redis.call('GET', KEYS[9])
  if rec then
    local c, d = string.match(rec, '^([^|]*)|([^|]*)|')
    if c == CAT and d == ARGV[5] then return {'REPLAYED', rec} end
    return {'KEY_REUSED'}
  end
end

local cats = m[4] or ''
if CAT == '' then
  if cats ~= '' then return {'CATEGORY_REQUIRED'} end
else
  local found = false
  for id in string.gmatch(cats, '[^,]+') do
    if id == CAT then found = true end
  end
  if not found then return {'CATEGORY_NOT_FOUND', CAT} end
end
local P = 'c:' .. CAT .. ':'

-- The target's available units.
local function avail_now()
  if CAT == '' then return tonumber(redis.call('GET', K_STOCK)) end
  return tonumber(redis.call('HGET', K_META, P .. 'avail') or '0')
end

-- Moves total and available of one target by d; available never above
-- total - held - confirmed (give_back's cap: exact in a consistent event).
local function shift(total, avail, held, confirmed, d)
  total = total + d
  if d < 0 then
    avail = avail + d
  else
    local room = total - held - confirmed
    if room < 0 then room = 0 end
    avail = avail + d
    if avail > room then avail = room end
  end
  return total, avail
end

-- The record of the counters now (the answer's format).
local function record(d)
  local mm = redis.call('HMGET', K_META, 'total', 'version')
  local out = {CAT, d, mm[1], redis.call('GET', K_STOCK)}
  if CAT ~= '' then
    local c = redis.call('HMGET', K_META, P .. 'total', P .. 'avail', P .. 'version')
    out[5], out[6], out[7] = c[1], c[2], c[3] or ''
  else
    out[5], out[6], out[7] = '', '', mm[2]
  end
  return table.concat(out, '|')
end

-- The stock entry: the new total, the categories as set_stock describes
-- them, and what the row was.
local function emit_stock(extra)
  local mm = redis.call('HMGET', K_META, 'total', 'version')
  local fields = {'version', mm[2]}
  if cats ~= '' then
    local described = {}
    for id in string.gmatch(cats, '[^,]+') do
      local c = redis.call('HMGET', K_META, 'c:' .. id .. ':total', 'c:' .. id .. ':limit')
      described[#described + 1] = id .. ':' .. (c[1] or '0') .. ':' .. (c[2] or '0')
    end
    fields[#fields + 1] = 'categories'; fields[#fields + 1] = table.concat(described, ',')
  end
  if CAT ~= '' then
    fields[#fields + 1] = 'category'; fields[#fields + 1] = CAT
  end
  for _, v in ipairs(extra) do fields[#fields + 1] = v end
  emit('stock', '', '', tonumber(mm[1]), tonumber(redis.call('GET', K_STOCK)), now_ms(), fields)
end

local held, confirmed = tonumber(m[2] or '0'), tonumber(m[3] or '0')

if MODE == 'd' then
  local d = tonumber(ARGV[5])
  if d < 0 then
    local need = -d
    local now = now_ms()
    local a = avail_now()
    while a < need do
      local due = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', now, 'LIMIT', 0, 1)
      if #due == 0 then break end
      expire_member(due[1], now)
      a = avail_now()
    end
    if a < need then return {'STOCK_NEGATIVE', int(a)} end
    m = redis.call('HMGET', K_META, 'version', 'held', 'confirmed', 'cats', 'total')
    held, confirmed = tonumber(m[2] or '0'), tonumber(m[3] or '0')
  end
  local total = tonumber(m[5] or '0')
  local ct, ca, ch, cc
  if CAT ~= '' then
    local c = redis.call('HMGET', K_META, P .. 'total', P .. 'avail', P .. 'held', P .. 'confirmed')
    ct, ca = tonumber(c[1] or '0'), tonumber(c[2] or '0')
    ch, cc = tonumber(c[3] or '0'), tonumber(c[4] or '0')
    if ct + d > MAX then return {'INVALID', 'total above 2^53'} end
  end
  if total + d > MAX then return {'INVALID', 'total above 2^53'} end
  if CAT ~= '' then
    ct, ca = shift(ct, ca, ch, cc, d)
    redis.call('HSET', K_META, P .. 'total', int(ct), P .. 'avail', int(ca))
  end
  local t, a = shift(total, tonumber(redis.call('GET', K_STOCK)), held, confirmed, d)
  redis.call('HSET', K_META, 'total', int(t))
  redis.call('SET', K_STOCK, int(a))
  -- Shard 0 of a sharded event keeps the event's total too.
  if CAT == '' and redis.call('HEXISTS', K_META, 'shard_total') == 1 then
    redis.call('HINCRBY', K_META, 'shard_total', d)
  end
  local rec = record(ARGV[5])
  redis.call('SET', KEYS[9], rec, 'PX', ARGV[7])
  emit_stock({'reason', 'delta', 'key', ARGV[8], 'delta', ARGV[5]})
  return {'APPLIED', rec}
end

-- Snapshot.
local total, version = tonumber(ARGV[5]), ARGV[6]
local shard_total = redis.call('HGET', K_META, 'shard_total')
if CAT == '' and shard_total then
  -- Shard 0 of a sharded event (sharded.rs): the event's total becomes
  -- `total`, shard 0's own moves by the difference; a decrease needs the
  -- units available here (the caller pulls them from other shards first).
  if not dec_gt(version, m[1]) then return {'STALE', m[1]} end
  local d = total - tonumber(shard_total)
  local a = tonumber(redis.call('GET', K_STOCK))
  if d < 0 then
    local now = now_ms()
    while a < -d do
      local due = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', now, 'LIMIT', 0, 1)
      if #due == 0 then break end
      expire_member(due[1], now)
      a = tonumber(redis.call('GET', K_STOCK))
    end
    if a < -d then return {'STOCK_NEGATIVE', int(a)} end
    m = redis.call('HMGET', K_META, 'version', 'held', 'confirmed', 'cats', 'total')
    held, confirmed = tonumber(m[2] or '0'), tonumber(m[3] or '0')
  end
  local t, na = shift(tonumber(m[5] or '0'), a, held, confirmed, d)
  redis.call('HSET', K_META, 'total', int(t), 'version', version, 'shard_total', ARGV[5])
  redis.call('SET', K_STOCK, int(na))
  local marker = redis.call('GET', KEYS[8])
  if not marker or dec_gt(version, marker) then redis.call('SET', KEYS[8], version) end
elseif CAT == '' then
  if not dec_gt(version, m[1]) then return {'STALE', m[1]} end
  if total < held + confirmed then return {'BELOW', int(held), int(confirmed)} end
  redis.call('HSET', K_META, 'total', ARGV[5], 'version', version)
  redis.call('SET', K_STOCK, int(total - held - confirmed))
  local marker = redis.call('GET', KEYS[8])
  if not marker or dec_gt(version, marker) then redis.call('SET', KEYS[8], version) end
else
  local c = redis.call('HMGET', K_META, P .. 'total', P .. 'avail', P .. 'held', P .. 'confirmed', P .. 'version')
  if c[5] and not dec_gt(version, c[5]) then return {'STALE', c[5]} end
  local ct, ca, ch, cc = tonumber(c[1] or '0'), tonumber(c[2] or '0'), tonumber(c[3] or '0'), tonumber(c[4] or '0')
  if total < ch + cc then return {'CAT_BELOW', CAT, int(ch), int(cc)} end
  local event_total = tonumber(m[5] or '0') - ct + total
  if event_total > MAX then return {'INVALID', 'total above 2^53'} end
  local na = total - ch - cc
  redis.call('HSET', K_META, P .. 'total', ARGV[5], P .. 'avail', int(na), P .. 'version', version,
    'total', int(event_total))
  local a = tonumber(redis.call('GET', K_STOCK))
  if ca > a then ca = a end
  redis.call('SET', K_STOCK, int(a - ca + na))
end
emit_stock({'reason', 'snapshot', 'source_version', version})
return {'APPLIED', record('0')}
