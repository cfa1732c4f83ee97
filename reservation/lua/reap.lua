-- reap.lua: expire holds whose deadline passed (common.lua prepended).
--
-- KEYS[1..7] as in common.lua (no hold hashes: a held hold past its
-- deadline reads as expired without being rewritten)
-- ARGV[1..2] as in common.lua
-- ARGV[3] at most this many holds
--
-- Releases the waves due first (common.lua's release_waves).
-- Returns the number of holds this call expired (each one's units returned
-- and XADD type=expired, exactly once whatever the number of concurrent
-- reapers). 0 when the stock counter is missing (nothing to return to).
if not redis.call('GET', K_STOCK) then return 0 end
local now = now_ms()
release_waves(now)
return reap_expired(now, tonumber(ARGV[3]))
