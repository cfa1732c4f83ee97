-- ended.lua: the sessions ended (revoked) since a time.
--
-- KEYS: as lib.lua.
-- ARGV[1] since (ms, store clock)   ARGV[2] limit
-- Returns {id1, at1, id2, at2, ...} (at: when it ended, ms), oldest first.

return redis.call('ZRANGEBYSCORE', ENDED, ARGV[1], '+inf', 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[2]))
