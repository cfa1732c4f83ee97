-- wrk script of tests/bench/holds.sh: POST /_sluice/events/$EVENT/holds
-- with {"qty":1}, rotating through the admission tokens in $TOKENS (one per
-- line), each thread starting at its own offset. Counts answers by status
-- and prints a summary line the shell script parses.

local tokens = {}
for line in io.lines(os.getenv("TOKENS")) do
  if #line > 0 then tokens[#tokens + 1] = line end
end
local path = "/_sluice/events/" .. os.getenv("EVENT") .. "/holds"
local body = '{"qty":1}'

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  i = id * 7919
  counts = {}
end

function request()
  i = i + 1
  local t = tokens[(i % #tokens) + 1]
  return wrk.format("POST", path, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. t,
  }, body)
end

function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end

function done(summary, latency, requests)
  local by = {}
  for _, thread in ipairs(threads) do
    local c = thread:get("counts")
    for status, n in pairs(c) do
      by[status] = (by[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(by) do
    parts[#parts + 1] = status .. "=" .. n
  end
  local secs = summary.duration / 1e6
  io.write(string.format(
    "WRK requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f created=%d errors=%d statuses=%s\n",
    summary.requests, secs, summary.requests / secs,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    by[201] or 0,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    table.concat(parts, ",")))
end
