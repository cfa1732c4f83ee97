-- release.lua: the owner gives a hold back (common.lua prepended).
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:{ev}:hold:{suffix}
-- KEYS[9] sluice:{ev}:vholds:{len(visitor)}:{visitor} (see hold.lua)
-- ARGV[1..2] as in common.lua
-- ARGV[3] visitor (must own the hold)
-- ARGV[4] retention of a released or expired hold, ms
--
-- Returns one of:
--   {'NOT_FOUND'}         no such hold, or another visitor's
--   {'CONFIRMED'}         paid: cannot be released
--   {'ALREADY_RELEASED'}
--   {'EXPIRED'}           deadline passed; its units went back (now or before)
--   {'NOT_READY'}         stock counter missing: nothing changed
--   {'RELEASED'}          units back to stock, XADD type=released
-- A released or expired hold's member leaves the visitor's index.
local K_HOLD, K_VHOLDS = KEYS[8], KEYS[9]
local h = redis.call('HMGET', K_HOLD, 'visitor', 'qty', 'status', 'deadline_ms', 'member')
if not h[1] or h[1] ~= ARGV[3] then return {'NOT_FOUND'} end
local status = h[3]
if status == 'confirmed' then return {'CONFIRMED'} end
if status == 'released' then return {'ALREADY_RELEASED'} end
if status == 'expired' then return {'EXPIRED'} end
if not redis.call('GET', K_STOCK) then return {'NOT_READY'} end

local now = now_ms()
local qty, deadline, member = tonumber(h[2]), tonumber(h[4]), h[5]
if deadline <= now or redis.call('ZREM', K_DEADLINES, member) == 0 then
  -- Lapsed: return its units if a reaper has not already (once either way).
  expire_member(member, now)
  redis.call('ZREM', K_VHOLDS, member)
  redis.call('HSET', K_HOLD, 'status', 'expired', 'ended_ms', int(now))
  redis.call('PEXPIRE', K_HOLD, ARGV[4])
  return {'EXPIRED'}
end
local suffix, items = split_head(string.match(member, '^([^:]*)'))
local available = give_back(qty)
give_back_items(items, h[1])
visitor_sub(h[1], qty)
redis.call('ZREM', K_VHOLDS, member)
redis.call('HSET', K_HOLD, 'status', 'released', 'ended_ms', int(now))
redis.call('PEXPIRE', K_HOLD, ARGV[4])
emit('released', suffix, h[1], qty, available, now, with_items({'reason', 'visitor'}, items))
return {'RELEASED'}
