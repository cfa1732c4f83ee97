-- wrk script of tests/bench/joins.sh: POST /_sluice/rooms/$ROOM/join with
-- the pre-solved bodies of $BODIES (one JSON body per line), each sent
-- once: thread k of n sends lines k, k+n, k+2n, ... for wrk's duration;
-- a thread whose share runs out sends readiness probes (never a body
-- twice: that would be a replay, another path), and the shell script
-- fails the run (pre-solve more).
-- Counts answers by status and prints a summary line the shell script
-- parses.

local path = "/_sluice/rooms/" .. os.getenv("ROOM") .. "/join"
local headers = { ["Content-Type"] = "application/json" }
-- ACCEPT_ENCODING set: every join asks for it, as a browser's fetch() does
-- ("gzip, deflate, br, zstd").
if os.getenv("ACCEPT_ENCODING") then
  headers["Accept-Encoding"] = os.getenv("ACCEPT_ENCODING")
end

local threads = {}
local next_id = 0
local nthreads = tonumber(os.getenv("THREADS") or "1")

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  bodies = {}
  local n = 0
  for line in io.lines(os.getenv("BODIES")) do
    if #line > 0 then
      if n % nthreads == id then
        bodies[#bodies + 1] = line
      end
      n = n + 1
    end
  end
  i = 0
  counts = {}
  sent = 0
end

function request()
  i = i + 1
  if i > #bodies then
    -- out of bodies: readiness probes, not joins (only 201s are counted)
    return wrk.format("GET", "/_sluice/readyz")
  end
  sent = sent + 1
  return wrk.format("POST", path, headers, bodies[i])
end

function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end

function done(summary, latency, requests)
  local by = {}
  local sent_all = 0
  for _, thread in ipairs(threads) do
    local c = thread:get("counts")
    for status, n in pairs(c) do
      by[status] = (by[status] or 0) + n
    end
    sent_all = sent_all + thread:get("sent")
  end
  local parts = {}
  for status, n in pairs(by) do
    parts[#parts + 1] = status .. "=" .. n
  end
  local secs = summary.duration / 1e6
  io.write(string.format(
    "WRK sent=%d seconds=%.3f joins_per_s=%.1f p50_ms=%.3f p99_ms=%.3f created=%d errors=%d statuses=%s\n",
    sent_all, secs, (by[201] or 0) / secs,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    by[201] or 0,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    table.concat(parts, ",")))
end
