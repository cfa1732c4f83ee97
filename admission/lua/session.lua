-- session.lua: start, renew or end an admitted visitor's session.
--
-- KEYS: as lib.lua.
-- ARGV[1] op: 'start' | 'touch' | 'end'
-- ARGV[2] session id
-- ARGV[3] ttl in ms ('start' and 'touch')
-- Returns:
--   {0}           the room has no state
--   {1, n}        start: active sessions after it; touch: 1 renewed,
--                 0 expired or unknown; end: 1 ended, 0 was not active
--
-- Expired sessions (deadline <= now) are pruned first. 'end' (a revoke)
-- also records the session in the ended set (whether it was active or not),
-- counted in ended_total, and forgets entries older than the session ttl
-- (ttl_ms) + 30 s: no token of theirs is still valid.

local now = now_ms()
if redis.call('EXISTS', S) == 0 then
  return {0}
end
prune_sessions(now)
local op, id = ARGV[1], ARGV[2]
if op == 'start' then
  redis.call('ZADD', SESS, int(now + tonumber(ARGV[3])), id)
  return {1, redis.call('ZCARD', SESS)}
elseif op == 'touch' then
  if not redis.call('ZSCORE', SESS, id) then
    return {1, 0}
  end
  redis.call('ZADD', SESS, int(now + tonumber(ARGV[3])), id)
  return {1, 1}
elseif op == 'end' then
  local keep = (tonumber(redis.call('HGET', S, 'ttl_ms')) or 0) + ENDED_SKEW_MS
  redis.call('ZREMRANGEBYSCORE', ENDED, '-inf', '(' .. int(now - keep))
  if not redis.call('ZSCORE', ENDED, id) then
    redis.call('ZADD', ENDED, int(now), id)
    redis.call('HINCRBY', S, 'ended_total', 1)
  end
  return {1, redis.call('ZREM', SESS, id)}
end
return redis.error_reply('session.lua: unknown op')
