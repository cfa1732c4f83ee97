-- rate.lua: one take from a rate limit every gateway shares (GCRA, the
-- arithmetic of admission/src/rate.rs, on the server's clock).
--
-- KEYS[1] sluice:rate:{key} (a string with a TTL: the bucket's theoretical
--         arrival time in ms; absent: none yet, or passed)
-- ARGV[1] rate, per second (> 0)   ARGV[2] burst (>= 1)
-- Returns {1, 0} when taken, {0, wait_ms} when refused (nothing changed;
-- allowed again after wait_ms, at least 1).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = 1000 / tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '') or now
if tat < now then
  tat = now
end
-- allowed when the bucket's time is at most burst - 1 intervals ahead
-- (a thousandth of a ms of slack for float sums, as rate.rs)
local ahead = tat - now
local tolerance = (burst - 1) * interval
if ahead > tolerance + 0.001 then
  return {0, math.max(1, math.ceil(ahead - tolerance))}
end
local next = tat + interval
-- kept until it has passed (then it is the same as none)
redis.call('SET', KEYS[1], string.format('%.3f', next), 'PX', math.ceil(next - now) + 1)
return {1, 0}
