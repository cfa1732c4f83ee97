-- hold.lua: take `qty` units for a visitor (common.lua prepended).
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:{ev}:hold:{suffix}   the new hold's hash, under a fresh
--         suffix (22 base64url chars) the Rust side generates. The suffix
--         is read from this key, so the hash and the hold id can never
--         disagree.
-- KEYS[9] sluice:{ev}:vholds:{len(visitor)}:{visitor}   zset: this visitor's
--         deadline-index members, score = deadline (see "Lapsed holds").
--         The visitor is read from this key (its length must match).
-- KEYS[10] (optional) sluice:{ev}:idem:{len(visitor)}:{visitor}:{key}
-- KEYS[11] (optional, with KEYS[10]) sluice:{ev}:hold:{suffix} of the hold
--         the idempotency key named in an earlier REDIRECT
-- ARGV[1..2] as in common.lua
-- ARGV[3] qty (integer; with items, their sum)
-- ARGV[4] how many expired holds to reap first, whoever's (LAZY_REAP_MAX)
-- ARGV[5] idempotency key TTL, ms
-- ARGV[6] retention of a released or expired hold, ms: the new hash
--         expires this long after the deadline (release.lua and
--         confirm.lua set it again when the hold ends)
-- ARGV[7] 'q': a bare qty (an event without categories); 'i': items
-- ARGV[8] (with 'i') the items, "{cat}={qty}" joined by '/', no category
--         twice (the Rust side refuses duplicates before calling)
-- ARGV[9] the shards the caller routed by ('1': a plain event); the meta's
--         `shards` (absent: 1) must say the same (sharded.rs)
--
-- Returns one of:
--   {'NOT_READY'}                      stock counter or settings missing
--   {'RESHARDED', shards}              the stored layout is not ARGV[9]:
--                                      nothing read or written
--   {'REDIRECT', suffix}               the idempotency key names a hold
--                                      other than KEYS[11]: call again with
--                                      that hold as KEYS[11] (and a fresh
--                                      KEYS[8])
--   (a key naming a hold whose hash is gone, past its retention, takes a
--   new hold under KEYS[8]'s fresh suffix: a hold id is never reused, so
--   a late webhook for the forgotten hold cannot confirm the new one)
--   {'REPLAYED', qty, status, deadline_ms, available, items}   the hold
--                                      of KEYS[11]
--   {'ITEMS_REQUIRED'}                 a bare qty on an event with categories
--   {'CATEGORY_NOT_FOUND', cat}        first item naming an unknown category
--                                      (any item, on an event without)
--   {'INVALID_QTY', limit}             qty (or an item's) 0, or above the
--                                      cart limit
--   {'CART_LIMIT', limit, have}        have + qty > limit (all categories)
--   {'CATEGORY_CART_LIMIT', cat, limit, have}   first item over its
--                                      category's own limit
--   {'SOLD_OUT', available}
--   {'CATEGORY_SOLD_OUT', cat, available}   first item short of units
--   'HELD qty deadline_ms available items'   one bulk string, the fields
--                                      apart by a space, items last
--                                      (text, maybe empty)
-- The checks run in this order; all or nothing: nothing is written before
-- every item passed.
-- Writes on HELD: DECRBY stock, meta.held += qty, visitors[visitor] += qty,
-- per item c:{cat}:avail -= q, c:{cat}:held += q, vcats[cat:visitor] += q,
-- the hold hash (expiring retention after the deadline), ZADD deadlines,
-- ZADD the visitor's index (expiring a second after its latest deadline),
-- the idempotency key (PX ttl), XADD type=held.
--
-- Due waves (common.lua's release_waves) are released first, after the
-- LAZY_REAP_MAX lapsed holds: a sold-out answer never stands while a
-- wave is due.
--
-- Lapsed holds: a hold past its deadline counts as expired before any
-- reaper saw it, so no answer may depend on whether one did. Besides the
-- LAZY_REAP_MAX oldest lapsed holds of anyone, this script expires:
--   * every lapsed hold of this visitor (from KEYS[8]) before the cart
--     check; the visitor's index holds only members of holds taken within
--     one TTL (lapsed entries are dropped here, released ones by
--     release.lua), i.e. at most cart_limit out or confirmed holds plus
--     holds a failed payment ended: a short list;
--   * before answering SOLD_OUT, further lapsed holds oldest first until
--     qty units are available: each returns at least one unit, so at most
--     qty (<= cart_limit) more. With items, until every item's category
--     has its units: a lapsed hold may free another category's, so this
--     may expire every lapsed hold (the reaper keeps them few).
-- So each call does O(LAZY_REAP_MAX + cart_limit + failed payments of the
-- visitor within one TTL) work, and a refusal never stands where lapsed
-- holds would have freed the units or the cart room.

-- Cost: every redis.call is a round trip through the script engine, and
-- this is the hottest script of a sale, so nothing is read twice: meta's
-- fields come in one HMGET (wave_next for release_waves, cats for emit),
-- the stock counter read first is the one compared with qty unless a
-- lapsed hold or a wave changed it since, the visitor's index is trimmed
-- only when it had lapsed members, and the search for more lapsed holds
-- before SOLD_OUT is skipped when the reaping above found them all.

-- Mode 'many' (group commit: several holds in one call, the gateway's
-- holds gathered while others are on their way, redis.rs "Holds sent
-- together"): ARGV[3] 'many', ARGV[4..6] as above, ARGV[7] n, ARGV[8]
-- unused, ARGV[9] the layout; then per hold four: qty, 'q' or 'i', the
-- items, how many keys it has (2 to 4: its KEYS[8..11] above), its keys
-- following the previous hold's from KEYS[8] on. Returns one answer per
-- hold, in order, each exactly what the hold's own call would have
-- answered had the holds been called one after the other at one TIME:
-- what a hold before it wrote is what it sees. What the calls share is
-- what would read the same for each: the stock counter while no hold
-- moved it, meta's settings (holds never change them), the reaping of
-- lapsed holds of anyone (once every lapsed one is reaped at this TIME,
-- the next call's reaping finds none) and the due waves (released by the
-- first; the next would find none due). A hold whose keys are malformed
-- answers {'ERROR', message} (an error reply would be the whole call's).
local many = ARGV[3] == 'many'
local n = many and tonumber(ARGV[7]) or 1
-- The same answer for every hold of the call.
local function each(answer)
  if not many then return answer end
  local out = {}
  for i = 1, n do out[i] = answer end
  return out
end

local stock = redis.call('GET', K_STOCK)
if not stock then return each({'NOT_READY'}) end
local meta = redis.call('HMGET', K_META, 'cart_limit', 'hold_ttl_ms', 'cats', 'shards', 'wave_next')
if not meta[1] or not meta[2] then return each({'NOT_READY'}) end
if (meta[4] or '1') ~= ARGV[9] then return each({'RESHARDED', meta[4] or '1'}) end
known_cats = meta[3] or ''
local limit, ttl = tonumber(meta[1]), tonumber(meta[2])
local cats = meta[3] or ''
local now = now_ms()
local s_now = int(now)
local lazy = tonumber(ARGV[4])
-- Read once per call (a number from text costs libc's strtod each time).
local retention = tonumber(ARGV[6])
-- How long a new hold's hash and its visitor's index live, from now: a
-- relative expiry (PEXPIRE) formatted once per call, by its first hold
-- made, where an absolute one was formatted once per hold. Redis counts
-- it from its own clock at the call, microseconds from `now` (TIME, read
-- above).
local s_hold_keep, s_index_keep
-- A batch's holds repeat the same few numbers, so in mode 'many' each is
-- converted once per call and looked up after: the text of a qty, of a
-- visitor key's length and of a hold's count of keys to a number
-- (`tonumber` goes through libc's strtod), a qty to its text (`int`
-- through string.format). One table both ways: text keys to numbers,
-- number keys to text. Not for a hold alone, which converts each once
-- anyway: the table and its growing cost it more than the lookups saved
-- (counted), and so would a function for the lookups (every function of
-- the script is made again on every call), which is why they are written
-- out.
local memo = many and {} or nil
-- Every new hold of the call has the same deadline (`now` + the TTL):
-- formatted by the first.
local s_deadline
-- The stock counter as last read or written, nil when a lapsed hold or a
-- wave may have moved it since.
local known = tonumber(stock)
local waves_checked = false

-- One hold: its keys, qty (text), 'q' or 'i', items.
local function hold_one(K_HOLD, K_VHOLDS, K_IDEM, K_NAMED, qty_text, kind, items_arg)
  local suffix = string.match(K_HOLD, ':hold:([^:]*)$')
  local vlen, visitor = string.match(K_VHOLDS, ':vholds:(%d+):(.*)$')
  local len, qty, s_qty
  if memo then
    len, qty = memo[vlen], memo[qty_text]
    if len == nil and vlen then
      len = tonumber(vlen)
      memo[vlen] = len
    end
    if qty == nil then
      qty = tonumber(qty_text)
      if qty ~= nil then memo[qty_text] = qty end
    end
    s_qty = memo[qty]
    if s_qty == nil and qty ~= nil then
      s_qty = int(qty)
      -- (NaN, from text such as 'nan', is no table key.)
      if qty == qty then memo[qty] = s_qty end
    end
  else
    len, qty = tonumber(vlen), tonumber(qty_text)
    s_qty = qty and int(qty)
  end
  if not suffix or not visitor or #visitor ~= len then
    return redis.error_reply('hold.lua: malformed hold or visitor key')
  end
  -- Lapsed holds of anyone; none left to find once every one lapsed by
  -- this TIME was reaped.
  if lapsed_drained_at ~= now and reap_expired(now, lazy) > 0 then known = nil end
  -- Waves due by now are on sale before anything is decided.
  if not waves_checked then
    waves_checked = true
    if release_waves(now, meta[5]) > 0 then known = nil end
  end

  -- This visitor's lapsed holds no longer count against the cart.
  local lapsed = redis.call('ZRANGEBYSCORE', K_VHOLDS, '-inf', s_now)
  if #lapsed > 0 then
    for _, member in ipairs(lapsed) do
      if expire_member(member, now) then known = nil end
    end
    redis.call('ZREMRANGEBYSCORE', K_VHOLDS, '-inf', s_now)
  end

  if K_IDEM then
    local prior = redis.call('GET', K_IDEM)
    if prior then
      local named = K_NAMED and string.match(K_NAMED, ':hold:([^:]*)$')
      if prior ~= named then return {'REDIRECT', prior} end
      local h = redis.call('HMGET', K_NAMED, 'visitor', 'qty', 'status', 'deadline_ms', 'member')
      if h[1] == visitor then
        local status, deadline = h[3], tonumber(h[4])
        if status == 'held' and deadline <= now then status = 'expired' end
        local _, named_items = split_head(string.match(h[5] or '', '^([^:]*)') or '')
        return {'REPLAYED', tonumber(h[2]), status, deadline, tonumber(redis.call('GET', K_STOCK)),
          named_items}
      end
      -- The hold is gone (past its retention): the key takes a new hold,
      -- under KEYS[8]'s fresh suffix (SET below), never the old id.
    end
  end

  local items = ''
  if kind == 'i' then
    items = items_arg or ''
    local known_list = ',' .. cats .. ','
    for c in string.gmatch(items, '([^=/]+)=%d+') do
      if not string.find(known_list, ',' .. c .. ',', 1, true) then return {'CATEGORY_NOT_FOUND', c} end
    end
  elseif cats ~= '' then
    return {'ITEMS_REQUIRED'}
  end

  if qty < 1 or qty > limit then return {'INVALID_QTY', limit} end
  -- (Each loop over the items only when there are items: a bare hold
  -- skips making three iterators.)
  if items ~= '' then
    for _, q in string.gmatch(items, '([^=/]+)=(%d+)') do
      if tonumber(q) < 1 then return {'INVALID_QTY', limit} end
    end
  end
  -- The cart. A bare hold on a stock counter known to have its units is
  -- made unless the cart is full (the stock is not read again below: no
  -- lapsed hold is searched while `known` covers qty), so it counts its
  -- units into the cart first and takes them back on a refusal: one call
  -- where reading the cart and then adding to it was two.
  local counted = false
  -- The units in the visitor's cart before this hold.
  local had
  if items == '' and known and known >= qty then
    local now_have = redis.call('HINCRBY', K_VISITORS, visitor, s_qty)
    had = now_have - qty
    if now_have > limit then
      visitor_sub(visitor, qty)
      return {'CART_LIMIT', limit, had}
    end
    counted = true
  else
    local have = redis.call('HGET', K_VISITORS, visitor)
    had = have and tonumber(have) or 0
    if had + qty > limit then return {'CART_LIMIT', limit, had} end
  end
  if items ~= '' then
    for c, q in string.gmatch(items, '([^=/]+)=(%d+)') do
      local climit = tonumber(redis.call('HGET', K_META, 'c:' .. c .. ':limit') or '0')
      if climit > 0 then
        local chave = tonumber(redis.call('HGET', K_VCATS, c .. ':' .. visitor) or '0')
        if chave + tonumber(q) > climit then return {'CATEGORY_CART_LIMIT', c, climit, chave} end
      end
    end
  end

  local available
  if items == '' then
    available = reap_until_available(now, qty, known)
    known = available
    if available < qty then return {'SOLD_OUT', available} end
  else
    -- The first item whose category lacks its units: cat, available.
    -- (Made here: a bare hold does not make the closure.)
    local function short_item()
      for c, q in string.gmatch(items, '([^=/]+)=(%d+)') do
        local a = tonumber(redis.call('HGET', K_META, 'c:' .. c .. ':avail') or '0')
        if a < tonumber(q) then return c, a end
      end
      return nil
    end
    local c, a = short_item()
    while c do
      local due = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', now, 'LIMIT', 0, 1)
      if #due == 0 then return {'CATEGORY_SOLD_OUT', c, a} end
      expire_member(due[1], now)
      known = nil
      c, a = short_item()
    end
  end

  available = redis.call('DECRBY', K_STOCK, s_qty)
  known = available
  redis.call('HINCRBY', K_META, 'held', s_qty)
  if not counted then redis.call('HINCRBY', K_VISITORS, visitor, s_qty) end
  local head = suffix
  if items ~= '' then
    for c, q in string.gmatch(items, '([^=/]+)=(%d+)') do
      redis.call('HINCRBY', K_META, 'c:' .. c .. ':avail', -tonumber(q))
      redis.call('HINCRBY', K_META, 'c:' .. c .. ':held', tonumber(q))
      redis.call('HINCRBY', K_VCATS, c .. ':' .. visitor, tonumber(q))
    end
    head = suffix .. '/' .. items
  end
  -- Each number written more than once is formatted once (the deadline,
  -- the same for every hold of the call, once per call).
  if not s_deadline then s_deadline = int(now + ttl) end
  local member = head .. ':' .. s_qty .. ':' .. visitor
  redis.call('HSET', K_HOLD, 'visitor', visitor, 'qty', s_qty, 'status', 'held',
    'deadline_ms', s_deadline, 'created_ms', s_now, 'member', member)
  if not s_hold_keep then s_hold_keep, s_index_keep = int(ttl + retention), int(ttl + 1000) end
  redis.call('PEXPIRE', K_HOLD, s_hold_keep)
  redis.call('ZADD', K_DEADLINES, s_deadline, member)
  redis.call('ZADD', K_VHOLDS, s_deadline, member)
  -- The index lives a second past its latest deadline: an index without
  -- an expiry (new) gets one (NX), an index with one is only ever extended
  -- (GT), so a shorter TTL set since never cuts an older hold's index
  -- short. Whichever is tried first, the other follows only when the
  -- first set nothing, and the end is the same: the first that is likely
  -- to set it is tried first, so most holds make one call where reading
  -- the TTL first made two. A visitor with nothing in the cart (a first
  -- hold, most of a sale's) has no index or one without a live hold:
  -- NX. A visitor with units in the cart has an index that one of them
  -- gave an expiry: GT. (The index itself is never read whole: a visitor
  -- may have many holds out, under a large cart limit.)
  local first, second = 'NX', 'GT'
  if had > 0 then first, second = 'GT', 'NX' end
  if redis.call('PEXPIRE', K_VHOLDS, s_index_keep, first) == 0 then
    redis.call('PEXPIRE', K_VHOLDS, s_index_keep, second)
  end
  if K_IDEM then redis.call('SET', K_IDEM, suffix, 'PX', ARGV[5]) end
  local s_available = int(available)
  emit('held', suffix, visitor, s_qty, s_available, s_now, with_items({'expires_at_ms', s_deadline}, items))
  -- One bulk string, not a table of six: the gateway's client parses a
  -- reply one value at a time, and a success is most of what it reads
  -- (redis.rs's `hold_reply` turns it back into the fields).
  return 'HELD ' .. s_qty .. ' ' .. s_deadline .. ' ' .. s_available .. ' ' .. items
end

if not many then
  return hold_one(KEYS[8], KEYS[9], KEYS[10], KEYS[11], ARGV[3], ARGV[7], ARGV[8])
end
local out = {}
local k = 8
for i = 1, n do
  local a = 10 + 4 * (i - 1)
  local nk_text = ARGV[a + 3]
  local nk = memo[nk_text]
  if nk == nil then
    nk = tonumber(nk_text)
    if nk ~= nil then memo[nk_text] = nk end
  end
  local r = hold_one(KEYS[k], KEYS[k + 1], nk >= 3 and KEYS[k + 2] or nil, nk >= 4 and KEYS[k + 3] or nil,
    ARGV[a], ARGV[a + 1], ARGV[a + 2])
  -- A malformed key fails its own hold only (an error reply in an array
  -- would be taken for the whole call's): the caller's keys are its own.
  if type(r) == 'table' and r.err then r = {'ERROR', r.err} end
  out[i] = r
  k = k + nk
end
return out
