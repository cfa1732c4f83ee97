-- common.lua: prepended to every script of the reservation store except
-- get_hold.lua (see reservation/src/redis.rs). Not a script on its own.
--
-- Shared KEYS (every script that includes this file):
--   KEYS[1] sluice:{ev}:stock      available units (string counter)
--   KEYS[2] sluice:{ev}:meta       hash: total, cart_limit, hold_ttl_ms,
--                                  version, room, held, confirmed
--   KEYS[3] sluice:{ev}:deadlines  zset: member "{suffix}:{qty}:{visitor}",
--                                  score = deadline (ms). A hold's units are
--                                  out exactly while its member is here:
--                                  whoever ZREMs it books them (once).
--   KEYS[4] sluice:{ev}:visitors   hash: visitor -> held + confirmed units
--   KEYS[5] sluice:{ev}:stream     the event's transition stream
--   KEYS[6] sluice:{ev}:ledgered   exists while a ledger consumes the
--                                  stream (set by `sluice ledger`): XADD
--                                  then never trims by length; the ledger
--                                  trims (XTRIM MINID) below what it
--                                  acknowledged
--   KEYS[7] sluice:{ev}:vcats      hash: "{category}:{visitor}" -> held +
--                                  confirmed units in that category
--                                  (events with categories only)
--
-- Categories: meta holds `cats` (the ids, comma-separated, in load order)
-- and per category `c:{id}:total`, `c:{id}:avail`, `c:{id}:held`,
-- `c:{id}:confirmed`, `c:{id}:limit` (0 = none); the event's own counters
-- (stock, held, confirmed, total) stay the sums, so every path of an event
-- without categories is unchanged. A hold with categories carries its
-- breakdown in its deadline member, "{suffix}/{cat}={qty}/...:{qty}:{visitor}":
-- whoever removes the member returns (or books) each category's units,
-- once, with no other key to read.
-- Waves: meta holds `waves`, the pending schedule "{at}:{qty}:{cat}"
-- (cat empty for an event without categories) joined by ',', earliest
-- first, and `wave_next`, the first one's time (absent when none is
-- pending). release_waves() applies every wave due by TIME: whoever takes
-- a wave off the list (in its one script) adds its units, once.
-- Shared ARGV:
--   ARGV[1] stream MAXLEN (approximate cap, `MAXLEN ~`, when no ledger)
--   ARGV[2] the event id (hold ids are "{event}.{suffix}")
-- The only clock is redis.call('TIME').

local K_STOCK, K_META, K_DEADLINES, K_VISITORS, K_STREAM = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_LEDGERED, K_VCATS = KEYS[6], KEYS[7]
local MAXLEN, EVENT = ARGV[1], ARGV[2]

-- Integers as decimal text. Never tostring(): it prints 14 significant
-- digits, so 2^50 would become "1.1258999068426e+15". An integral value
-- in range goes through '%d' (C's integer formatting); anything else
-- through '%.0f', which is exact too but takes glibc's floating-point
-- path, several times the cost. Formatting numbers was a measurable share
-- of a hold's cost (callgrind of redis-server), so the hot scripts also
-- pass redis.call text, never a Lua number (Redis formats those with
-- '%.17g'). Text passes as it is: a caller formats a number it writes
-- several times once and hands the text on.
local function int(n)
  if type(n) == 'string' then return n end
  if n == math.floor(n) and n > -9007199254740992 and n < 9007199254740992 then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether a ledger consumes the stream (checked once per script call).
local ledgered = nil

-- The event's `cats` field ('' when none) when the script has read it
-- already (hold.lua reads it in its first HMGET): emit() then does not
-- read it again. nil: emit() reads it. Only a script that does not change
-- `cats` may set it.
local known_cats = nil

-- Appends one transition to the stream. `extra` is a flat list of more
-- field/value pairs (payment_event_id, reason, version). Capped by length
-- only while no ledger reads the stream: an entry the ledger has not
-- stored is never trimmed here.
local function emit(kind, suffix, visitor, qty, available, now, extra)
  local hold_id = ''
  if suffix ~= '' then hold_id = EVENT .. '.' .. suffix end
  if ledgered == nil then ledgered = redis.call('EXISTS', K_LEDGERED) == 1 end
  -- `extra` (no holes: every caller builds a fresh one of strings) takes
  -- the category fields, then goes into the call unpacked after the
  -- fixed fields: no table is made of the whole entry.
  local e = extra or {}
  -- Each category's available units after the change, so a consumer can
  -- reconcile per category at this entry as it does for the event.
  local cats = known_cats
  if cats == nil then cats = redis.call('HGET', K_META, 'cats') end
  if cats and cats ~= '' then
    local fields, parts = {}, {}
    for c in string.gmatch(cats, '[^,]+') do fields[#fields + 1] = 'c:' .. c .. ':avail' end
    local got = redis.call('HMGET', K_META, unpack(fields))
    local i = 0
    for c in string.gmatch(cats, '[^,]+') do
      i = i + 1
      parts[i] = c .. '=' .. (got[i] or '0')
    end
    e[#e + 1] = 'category_available'; e[#e + 1] = table.concat(parts, ',')
  end
  if ledgered then
    redis.call('XADD', K_STREAM, '*', 'type', kind, 'event', EVENT, 'hold_id', hold_id,
      'visitor', visitor, 'qty', int(qty), 'available', int(available), 'ts_ms', int(now), unpack(e))
  else
    redis.call('XADD', K_STREAM, 'MAXLEN', '~', MAXLEN, '*', 'type', kind, 'event', EVENT,
      'hold_id', hold_id, 'visitor', visitor, 'qty', int(qty), 'available', int(available),
      'ts_ms', int(now), unpack(e))
  end
end

-- A hold of `qty` units ends without a sale: its units leave `held` and go
-- back on sale. Returns the stock counter afterwards. The counter never
-- rises above total - held - confirmed (0 when that is negative): in a
-- consistent event that is exactly where it lands, and after a rebuild from
-- an overcommitted record (restore.lua) the returning units pay the excess
-- off instead of being sold a second time.
local function give_back(qty)
  redis.call('HINCRBY', K_META, 'held', -qty)
  local available = redis.call('INCRBY', K_STOCK, qty)
  local m = redis.call('HMGET', K_META, 'total', 'held', 'confirmed')
  local room = tonumber(m[1] or '0') - tonumber(m[2] or '0') - tonumber(m[3] or '0')
  if room < 0 then room = 0 end
  if available > room then
    available = room
    redis.call('SET', K_STOCK, int(room))
  end
  return available
end

-- A member's head "{suffix}" or "{suffix}/{items}" -> suffix, items ('' when
-- none). Items are "{cat}={qty}" joined by '/'.
local function split_head(head)
  local suffix, items = string.match(head, '^([^/]*)/?(.*)$')
  return suffix, items
end

-- Appends the `items` field to a stream entry's extra fields, when any.
local function with_items(extra, items)
  if items ~= '' then
    extra[#extra + 1] = 'items'; extra[#extra + 1] = items
  end
  return extra
end

-- A hold's units of each category go back on sale (capped as give_back
-- caps the event) and leave the visitor's category counts.
local function give_back_items(items, visitor)
  for c, q in string.gmatch(items, '([^=/]+)=(%d+)') do
    q = tonumber(q)
    local p = 'c:' .. c .. ':'
    redis.call('HINCRBY', K_META, p .. 'held', -q)
    local avail = redis.call('HINCRBY', K_META, p .. 'avail', q)
    local m = redis.call('HMGET', K_META, p .. 'total', p .. 'held', p .. 'confirmed')
    local room = tonumber(m[1] or '0') - tonumber(m[2] or '0') - tonumber(m[3] or '0')
    if room < 0 then room = 0 end
    if avail > room then redis.call('HSET', K_META, p .. 'avail', int(room)) end
    local f = c .. ':' .. visitor
    if redis.call('HINCRBY', K_VCATS, f, -q) <= 0 then redis.call('HDEL', K_VCATS, f) end
  end
end

-- A hold's units of each category are sold.
local function confirm_items(items)
  for c, q in string.gmatch(items, '([^=/]+)=(%d+)') do
    q = tonumber(q)
    redis.call('HINCRBY', K_META, 'c:' .. c .. ':held', -q)
    redis.call('HINCRBY', K_META, 'c:' .. c .. ':confirmed', q)
  end
end

local function visitor_sub(visitor, qty)
  if redis.call('HINCRBY', K_VISITORS, visitor, -qty) <= 0 then
    redis.call('HDEL', K_VISITORS, visitor)
  end
end

-- Returns the units of the hold behind `member` if they are still out.
-- True when this call returned them (and logged `expired`).
local function expire_member(member, now)
  if redis.call('ZREM', K_DEADLINES, member) == 0 then return false end
  local head, qty, visitor = string.match(member, '^([^:]*):(%d+):(.*)$')
  local suffix, items = split_head(head)
  qty = tonumber(qty)
  local available = give_back(qty)
  give_back_items(items, visitor)
  visitor_sub(visitor, qty)
  emit('expired', suffix, visitor, qty, available, now, with_items({'reason', 'deadline'}, items))
  return true
end

-- Set by reap_expired() when it found fewer lapsed holds than it was
-- allowed to expire: at that `now`, no hold in the deadline index had
-- lapsed any more (it expired them all). reap_until_available() may then
-- skip its search, as long as nothing was added to the index since with a
-- deadline at or before that `now` (hold.lua adds only later deadlines,
-- after it).
local lapsed_drained_at = nil

-- Expires up to `max` holds whose deadline passed, oldest first. The hold
-- hashes are not touched (not in KEYS): a held hold past its deadline reads
-- as expired anyway. Returns how many it expired.
local function reap_expired(now, max)
  if max <= 0 then return 0 end
  local due = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', int(now), 'LIMIT', '0', int(max))
  local n = 0
  for _, member in ipairs(due) do
    if expire_member(member, now) then n = n + 1 end
  end
  if #due < max then lapsed_drained_at = now end
  return n
end

-- Expires lapsed holds oldest first, one at a time, until `available`
-- reaches `need` or none lapsed is left. Each expired hold returns at
-- least one unit, so this expires at most `need` holds (`need` is at most
-- the cart limit). Returns the stock counter afterwards. `known` (optional)
-- is the stock counter as the caller just read it, when nothing can have
-- changed it since: not read again.
local function reap_until_available(now, need, known)
  local available = known or tonumber(redis.call('GET', K_STOCK))
  -- Every lapsed hold was expired at this `now` already: none to search.
  if lapsed_drained_at == now then return available end
  while available < need do
    local due = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', now, 'LIMIT', 0, 1)
    if #due == 0 then break end
    expire_member(due[1], now)
    available = tonumber(redis.call('GET', K_STOCK))
  end
  return available
end

-- Compares two canonical decimal strings (no sign, no leading zeros)
-- without going through Lua's doubles: versions are u64.
local function dec_gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end


-- The categories as a stock entry describes them: "{id}:{total}:{limit}"
-- joined by ','; '' without categories.
local function describe_categories()
  local described = {}
  for c in string.gmatch(redis.call('HGET', K_META, 'cats') or '', '[^,]+') do
    local p = 'c:' .. c .. ':'
    local f = redis.call('HMGET', K_META, p .. 'total', p .. 'limit')
    described[#described + 1] = c .. ':' .. (f[1] or '0') .. ':' .. (f[2] or '0')
  end
  return table.concat(described, ',')
end

-- Releases every wave due by `now`, earliest first, each once: its units
-- join total and available (capped as give_back caps them) and its
-- category's, with a `stock` entry reason=wave (the new total, the
-- categories described, the schedule left in `waves`). A wave that no
-- longer fits the event (its category gone, a category-less wave on an
-- event with categories or the reverse, the total past 2^53) is dropped
-- without units or entry. Nothing happens while the stock counter is
-- missing (not ready: the waves wait). Returns how many were released.
-- `nxt` (optional) is meta's wave_next as the caller just read it.
local function release_waves(now, nxt)
  -- `nxt`: meta's wave_next as the caller just read it (false when
  -- absent); nil: read it here.
  if nxt == nil then nxt = redis.call('HGET', K_META, 'wave_next') end
  if not nxt or tonumber(nxt) > now then return 0 end
  if not redis.call('GET', K_STOCK) then return 0 end
  local list = {}
  for w in string.gmatch(redis.call('HGET', K_META, 'waves') or '', '[^,]+') do
    list[#list + 1] = w
  end
  local cats = ',' .. (redis.call('HGET', K_META, 'cats') or '') .. ','
  local released = 0
  local i = 1
  while i <= #list do
    local at, qty, cat = string.match(list[i], '^(%d+):(%d+):(.*)$')
    if tonumber(at) > now then break end
    i = i + 1
    qty = tonumber(qty)
    local fits
    if cat == '' then fits = (cats == ',,') else fits = string.find(cats, ',' .. cat .. ',', 1, true) ~= nil end
    local m = redis.call('HMGET', K_META, 'total', 'held', 'confirmed', 'version')
    local total = tonumber(m[1] or '0') + qty
    if fits and total <= 9007199254740992 then
      redis.call('HSET', K_META, 'total', int(total))
      local room = total - tonumber(m[2] or '0') - tonumber(m[3] or '0')
      if room < 0 then room = 0 end
      local available = tonumber(redis.call('GET', K_STOCK)) + qty
      if available > room then available = room end
      redis.call('SET', K_STOCK, int(available))
      if cat ~= '' then
        local p = 'c:' .. cat .. ':'
        local c = redis.call('HMGET', K_META, p .. 'total', p .. 'avail', p .. 'held', p .. 'confirmed')
        local ctotal = tonumber(c[1] or '0') + qty
        local croom = ctotal - tonumber(c[3] or '0') - tonumber(c[4] or '0')
        if croom < 0 then croom = 0 end
        local cavail = tonumber(c[2] or '0') + qty
        if cavail > croom then cavail = croom end
        redis.call('HSET', K_META, p .. 'total', int(ctotal), p .. 'avail', int(cavail))
      end
      local rest = {}
      for j = i, #list do rest[#rest + 1] = list[j] end
      local extra = {'version', m[4] or '0', 'reason', 'wave', 'waves', table.concat(rest, ',')}
      local described = describe_categories()
      if described ~= '' then
        extra[#extra + 1] = 'categories'; extra[#extra + 1] = described
      end
      emit('stock', '', '', total, available, now, extra)
      released = released + 1
    end
  end
  local rest = {}
  for j = i, #list do rest[#rest + 1] = list[j] end
  if #rest == 0 then
    redis.call('HDEL', K_META, 'waves', 'wave_next')
  else
    local first = string.match(rest[1], '^(%d+):')
    redis.call('HSET', K_META, 'waves', table.concat(rest, ','), 'wave_next', first)
  end
  return released
end
