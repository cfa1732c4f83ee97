-- shard.lua: one shard's layout and its transfers (common.lua prepended).
-- See reservation/src/sharded.rs for the design.
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:{ev}:xout   hash: transfer id -> "{to}|{qty}|{at_ms}",
--         the transfers that left this shard and were not marked done
-- KEYS[9] sluice:{ev}:xin    zset: transfer ids that landed here, score =
--         when (ms); entries older than the keep time are dropped
-- ARGV[1..2] as in common.lua
-- ARGV[3] the mode:
--   'layout': ARGV[4] shards (1: the field removed; 0: frozen),
--     ARGV[5] the event total kept by shard 0 ('' keep, '-' clear, else
--     the total), ARGV[6] cart_limit, ARGV[7] hold_ttl_ms, ARGV[8] room,
--     ARGV[9] version ('': no check, unchanged; else applied only when not
--     below the stored one, which it replaces), ARGV[10] '1': refuse when
--     anything is held or sold (lapsed holds expired first)
--     -> {'NOT_READY'} | {'STALE', version} | {'BUSY', held, confirmed} | {'SET'}
--   'out': ARGV[4] id, ARGV[5] the destination shard, ARGV[6] most units
--     -> {'NOT_READY'} | {'FROZEN'} | {'MOVED', qty, available}
--     (lapsed holds expired first, oldest first, until the units are there
--     or none is left; total and stock drop by qty, xout[id] recorded)
--   'in': ARGV[4] id, ARGV[5] qty, ARGV[6] how long landed ids are kept, ms
--     -> {'NOT_READY'} | {'REPLAYED'} | {'FROZEN'} | {'APPLIED', available}
--     (total and stock rise by qty, never above total - held - confirmed)
--   'out' and 'in' count each transfer that moves units in the meta's
--   `moves` (read.lua answers it: a survey of every shard compares it)
--   'done': ARGV[4] id -> {'DONE'} (HDEL xout id)
--   'list': -> {now_ms, id, record, id, record, ...} (xout)
-- Writes a `stock` stream entry (reason layout, transfer_out or
-- transfer_in, key = the transfer id, delta) for every change.
local K_XOUT, K_XIN = KEYS[8], KEYS[9]
local MODE = ARGV[3]

if MODE == 'done' then
  redis.call('HDEL', K_XOUT, ARGV[4])
  return {'DONE'}
end
if MODE == 'list' then
  local out = {int(now_ms())}
  for _, v in ipairs(redis.call('HGETALL', K_XOUT)) do out[#out + 1] = v end
  return out
end

local m = redis.call('HMGET', K_META, 'version', 'held', 'confirmed', 'shards', 'total')
if not m[1] or not redis.call('GET', K_STOCK) then return {'NOT_READY'} end
local now = now_ms()

local function entry(reason, extra)
  local mm = redis.call('HMGET', K_META, 'total', 'version', 'shards')
  local fields = {'version', mm[2] or '0', 'reason', reason, 'shards', mm[3] or '1'}
  for _, v in ipairs(extra) do fields[#fields + 1] = v end
  emit('stock', '', '', tonumber(mm[1]), tonumber(redis.call('GET', K_STOCK)), now, fields)
end

if MODE == 'layout' then
  if ARGV[9] ~= '' and dec_gt(m[1], ARGV[9]) then return {'STALE', m[1]} end
  if ARGV[10] == '1' then
    reap_expired(now, 1000000)
    local c = redis.call('HMGET', K_META, 'held', 'confirmed')
    local held, confirmed = tonumber(c[1] or '0'), tonumber(c[2] or '0')
    if held + confirmed > 0 then return {'BUSY', int(held), int(confirmed)} end
  end
  if ARGV[4] == '1' then
    redis.call('HDEL', K_META, 'shards')
  else
    redis.call('HSET', K_META, 'shards', ARGV[4])
  end
  if ARGV[5] == '-' then
    redis.call('HDEL', K_META, 'shard_total')
  elseif ARGV[5] ~= '' then
    redis.call('HSET', K_META, 'shard_total', ARGV[5])
  end
  redis.call('HSET', K_META, 'cart_limit', ARGV[6], 'hold_ttl_ms', ARGV[7], 'room', ARGV[8])
  if ARGV[9] ~= '' then redis.call('HSET', K_META, 'version', ARGV[9]) end
  entry('layout', {})
  return {'SET'}
end

if MODE == 'out' then
  if m[4] == '0' then return {'FROZEN'} end
  local want = tonumber(ARGV[6])
  local available = reap_until_available(now, want)
  local qty = want
  if available < qty then qty = available end
  if qty > 0 then
    available = redis.call('DECRBY', K_STOCK, qty)
    redis.call('HINCRBY', K_META, 'total', -qty)
    redis.call('HSET', K_XOUT, ARGV[4], ARGV[5] .. '|' .. int(qty) .. '|' .. int(now))
    redis.call('HINCRBY', K_META, 'moves', 1)
    entry('transfer_out', {'key', ARGV[4], 'delta', '-' .. int(qty)})
  end
  return {'MOVED', int(qty), int(available)}
end

if MODE == 'in' then
  redis.call('ZREMRANGEBYSCORE', K_XIN, '-inf', int(now - tonumber(ARGV[6])))
  if redis.call('ZSCORE', K_XIN, ARGV[4]) then return {'REPLAYED'} end
  if m[4] == '0' then return {'FROZEN'} end
  local qty = tonumber(ARGV[5])
  local total = tonumber(m[5] or '0') + qty
  redis.call('HSET', K_META, 'total', int(total))
  local room = total - tonumber(m[2] or '0') - tonumber(m[3] or '0')
  if room < 0 then room = 0 end
  local available = tonumber(redis.call('GET', K_STOCK)) + qty
  if available > room then available = room end
  redis.call('SET', K_STOCK, int(available))
  redis.call('ZADD', K_XIN, int(now), ARGV[4])
  redis.call('HINCRBY', K_META, 'moves', 1)
  entry('transfer_in', {'key', ARGV[4], 'delta', int(qty)})
  return {'APPLIED', int(available)}
end

return redis.error_reply('shard.lua: unknown mode ' .. tostring(MODE))
