-- confirm.lua: apply a payment outcome to a hold (common.lua prepended).
--
-- KEYS[1..7] as in common.lua
-- KEYS[8] sluice:{ev}:hold:{suffix}
-- KEYS[9] sluice:{ev}:pay:{len(payment_event_id)}:{payment_event_id}
--         "{suffix}:{answer}": the hold this payment event was applied to
--         and the answer it got
-- ARGV[1..2] as in common.lua
-- ARGV[3] payment_event_id
-- ARGV[4] '1' payment succeeded, '0' failed
-- ARGV[5] retention of a released or expired hold, ms
-- ARGV[6] how long the answer to this payment event is kept, ms
-- ARGV[7] retention of a confirmed hold, ms
--
-- Returns {answer} with answer one of 'confirmed', 'released', 'expired',
-- 'not_found', 'not_ready', 'payment_reused'. The same payment event id
-- for the same hold returns the recorded answer and changes nothing; for
-- another hold of the event it answers 'payment_reused' and changes nothing
-- (a provider's payment event is about one payment, so one hold). A hold past its deadline
-- (by TIME) is never confirmed: its units go back once, answer 'expired'.
-- A failed payment releases a held hold. 'not_found' and 'not_ready' are
-- not recorded.
-- Writes: the hold's status, counters, XADD type=confirmed|released|expired.
local K_HOLD, K_PAY = KEYS[8], KEYS[9]
local this = string.match(K_HOLD, ':hold:(.*)$')
local prior = redis.call('GET', K_PAY)
if prior then
  local for_hold, prior_answer = string.match(prior, '^(.*):([^:]*)$')
  if for_hold ~= this then return {'payment_reused'} end
  return {prior_answer}
end
local h = redis.call('HMGET', K_HOLD, 'visitor', 'qty', 'status', 'deadline_ms', 'member')
if not h[1] then return {'not_found'} end

local answer = h[3]
if answer == 'held' then
  if not redis.call('GET', K_STOCK) then return {'not_ready'} end
  local now = now_ms()
  local qty, deadline, member = tonumber(h[2]), tonumber(h[4]), h[5]
  local suffix, items = split_head(string.match(member, '^([^:]*)'))
  if deadline <= now or redis.call('ZREM', K_DEADLINES, member) == 0 then
    expire_member(member, now)
    answer = 'expired'
  elseif ARGV[4] == '1' then
    redis.call('HINCRBY', K_META, 'held', -qty)
    redis.call('HINCRBY', K_META, 'confirmed', qty)
    confirm_items(items)
    answer = 'confirmed'
    emit('confirmed', suffix, h[1], qty, tonumber(redis.call('GET', K_STOCK)), now,
      with_items({'payment_event_id', ARGV[3]}, items))
  else
    local available = give_back(qty)
    give_back_items(items, h[1])
    visitor_sub(h[1], qty)
    answer = 'released'
    emit('released', suffix, h[1], qty, available, now,
      with_items({'reason', 'payment_failed', 'payment_event_id', ARGV[3]}, items))
  end
  redis.call('HSET', K_HOLD, 'status', answer, 'ended_ms', int(now))
  if answer == 'confirmed' then
    redis.call('PEXPIRE', K_HOLD, ARGV[7])
  else
    redis.call('PEXPIRE', K_HOLD, ARGV[5])
  end
end
redis.call('SET', K_PAY, this .. ':' .. answer, 'PX', ARGV[6])
return {answer}
