-- read.lua: an event's counters and settings (common.lua prepended).
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:{ev}:xout (shard.lua): the transfers that left
-- ARGV[1..2] as in common.lua
-- ARGV[3] how many expired holds to reap first (LAZY_REAP_MAX)
--
-- Returns one of:
--   {'UNKNOWN'}   no settings stored
--   {'MORE'}      it reaped ARGV[3] lapsed holds and more are left: call
--                 again (the caller loops, so each call stays bounded and
--                 the counters it finally reports count every lapsed hold
--                 as expired; waves due are released once no lapsed
--                 hold is left)
--   {'STATE', total, cart_limit, hold_ttl_ms, version, room, held,
--    confirmed, available, waves (the pending schedule, common.lua's
--    format; every due wave released first), shards (the layout, '1'
--    when absent), shard_total ('' when absent), the units of pending
--    transfers out, the transfers that moved units off or onto it
--    (`moves`), then per category: id, total, avail, held,
--    confirmed, limit}   available is nil (false) when the stock
--                        counter is missing: not ready
-- All numbers as decimal strings.
local m = redis.call('HMGET', K_META, 'total', 'cart_limit', 'hold_ttl_ms', 'version', 'room', 'held', 'confirmed')
if not m[1] then return {'UNKNOWN'} end
if redis.call('GET', K_STOCK) then
  local now = now_ms()
  reap_expired(now, tonumber(ARGV[3]))
  if redis.call('ZCOUNT', K_DEADLINES, '-inf', now) > 0 then return {'MORE'} end
  release_waves(now)
end
m = redis.call('HMGET', K_META, 'total', 'cart_limit', 'hold_ttl_ms', 'version', 'room', 'held', 'confirmed')
local stock = redis.call('GET', K_STOCK)
local sh = redis.call('HMGET', K_META, 'shards', 'shard_total', 'moves')
local sending = 0
for _, rec in ipairs(redis.call('HVALS', KEYS[8])) do
  sending = sending + tonumber(string.match(rec, '|(%d+)|') or '0')
end
local out = {'STATE', m[1], m[2] or '0', m[3] or '0', m[4] or '0', m[5] or '', m[6] or '0', m[7] or '0', stock or false,
  redis.call('HGET', K_META, 'waves') or '', sh[1] or '1', sh[2] or '', int(sending), sh[3] or '0'}
for c in string.gmatch(redis.call('HGET', K_META, 'cats') or '', '[^,]+') do
  local p = 'c:' .. c .. ':'
  local f = redis.call('HMGET', K_META, p .. 'total', p .. 'avail', p .. 'held', p .. 'confirmed', p .. 'limit')
  out[#out + 1] = c
  for i = 1, 5 do out[#out + 1] = f[i] or '0' end
end
return out
