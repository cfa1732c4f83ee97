-- lease.lua: take or renew a room's steering lease (adaptive admission:
-- one gateway at a time steers a room's rate).
--
-- KEYS[1] sluice:{room}:lease (a string with a TTL: the holder's id)
-- ARGV[1] holder (a gateway id)   ARGV[2] ttl in ms
-- Returns 1 when ARGV[1] holds the lease now (taken, or renewed because it
-- already held it), 0 while another holder's lease runs.
--
-- Expiry is Redis's own (PX), so the server's clock is the only clock.

local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
