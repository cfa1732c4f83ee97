#!/usr/bin/env bash
# Holds' latency and throughput through a gateway on Redis, without and
# with a stock feed storm running, in one run, on one Redis of its own.
#
# Usage: tests/bench/feeds.sh [rows] [seconds] [visitors] [connections] [rows_per_sec] [pipeline_rows]
#   defaults: 2000000 10 2000 32 5000 32 (pipeline_rows 1: one store round trip per row,
#   the consumer as it was before pipelining)
#
# Loopback only, bounded: starts redis-server on a free port and `sluice
# serve` (release) on it with `[feeds] rows_per_sec` as given, admits N
# visitors through the JSON API (tests/examples/mint_tokens.rs) and warms
# up with wrk for 2 s. Phase 1 (baseline): wrk drives POST
# /_sluice/events/bench-hold/holds for S seconds (tests/bench/holds.lua,
# stock that never runs out, a cart limit that never trips). Phase 2
# (storm): a poster sends ROWS delta rows (+1 each, distinct keys) to
# POST /_sluice/admin/events/bench-feed/feed in batches of 10,000, as fast
# as the gateway accepts them, while the same wrk runs S seconds again;
# the poster is stopped when wrk ends. Phase 3 (drain): the same wrk while
# the gateway's consumer applies the rows still waiting (no posting). Prints
# each phase's hold attempts/s and p50/p99, the ratios to the baseline, the
# rows accepted and applied in each window, and checks: the holds' event and the feed's event keep
# available + held + confirmed = total, every applied delta is one unit
# (feed total = 1 + rows applied), no row rejected, no answer other than
# 201/409 to holds.
# Everything it started is stopped on exit.
# Needs: cargo, redis-server, redis-cli, wrk, curl, python3.
set -euo pipefail

ROWS=${1:-2000000}
SECONDS_RUN=${2:-10}
VISITORS=${3:-2000}
CONNS=${4:-32}
RATE=${5:-5000}
PIPELINE=${6:-32}
THREADS=2
source "$(dirname "$0")/lib.sh"
bench_init feeds-bench
build_release mint_tokens
MINT="$TARGET/release/examples/mint_tokens"
start_redis

echo "== sluice serve (feeds.rows_per_sec = $RATE, pipeline_rows = $PIPELINE)" >&2
GPORT=$(free_port)
BASE="http://127.0.0.1:$GPORT"
cat >"$WORK/sluice.toml" <<TOML
[limits]
holds_per_visitor_per_min = 0

[feeds]
rows_per_sec = $RATE
pipeline_rows = $PIPELINE
max_depth = 100000000

[[rooms]]
id = "default"
rate_per_sec = 100000
burst = 100000
puzzles = 1
difficulty_floor_bits = 1
difficulty_ceiling_bits = 2
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
TOML
SLUICE_LOG=warn "$SLUICE" serve --config "$WORK/sluice.toml" --listen "127.0.0.1:$GPORT" \
  --redis "redis://127.0.0.1:$RPORT/" --admin-token "$ADMIN" >"$WORK/sluice.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do
  curl -fs "$BASE/_sluice/readyz" >/dev/null 2>&1 && break
  sleep 0.05
done
curl -fs "$BASE/_sluice/readyz" >/dev/null

admin -X PUT "$BASE/_sluice/admin/events/bench-hold" \
  -d '{"total": 1000000000000, "cart_limit": 1000000, "hold_ttl_seconds": 600, "version": 1}' >/dev/null
admin -X PUT "$BASE/_sluice/admin/events/bench-feed" \
  -d '{"total": 1, "cart_limit": 1, "hold_ttl_seconds": 600, "version": 1}' >/dev/null

echo "== admitting $VISITORS visitors" >&2
"$MINT" "$BASE" default "$VISITORS" "$WORK/tokens.txt"

run_wrk() { # $1: label
  TOKENS="$WORK/tokens.txt" EVENT=bench-hold timeout $((SECONDS_RUN + 30)) wrk -t"$THREADS" \
    -c"$CONNS" -d"${SECONDS_RUN}s" --latency -s "$BENCH/holds.lua" "$BASE" >"$WORK/$1.txt"
  grep '^WRK ' "$WORK/$1.txt"
}

echo "== warm-up: wrk 2s" >&2
TOKENS="$WORK/tokens.txt" EVENT=bench-hold timeout 30 wrk -t"$THREADS" -c"$CONNS" -d2s \
  -s "$BENCH/holds.lua" "$BASE" >/dev/null

echo "== phase 1: holds alone, ${SECONDS_RUN}s" >&2
BASELINE=$(run_wrk baseline)

echo "== phase 2: holds with $ROWS feed rows posted" >&2
cat >"$WORK/poster.py" <<'PY'
import json, sys, time, urllib.request
base, admin, rows, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sent, batch, refused = 0, 10000, 0
t0 = time.time()
while sent < rows:
    n = min(batch, rows - sent)
    body = json.dumps({"rows": [{"delta": 1, "key": f"erp-{sent + i}"} for i in range(n)]}).encode()
    req = urllib.request.Request(f"{base}/_sluice/admin/events/bench-feed/feed", data=body, method="POST",
        headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            if r.status == 202:
                sent += n
    except urllib.error.HTTPError as e:
        refused += 1
        time.sleep(0.05)
    with open(out, "w") as f:
        f.write(f"{sent} {refused} {time.time() - t0:.3f}\n")
PY
echo "0 0 0" >"$WORK/posted.txt"
timeout $((SECONDS_RUN + 600)) python3 "$WORK/poster.py" "$BASE" "$ADMIN" "$ROWS" "$WORK/posted.txt" &
POSTER=$!
PIDS+=($POSTER)
BEFORE=$(admin "$BASE/_sluice/admin/events/bench-feed/feed")
STORM=$(run_wrk storm)
AFTER=$(admin "$BASE/_sluice/admin/events/bench-feed/feed")
kill "$POSTER" 2>/dev/null || true
POSTED=$(cat "$WORK/posted.txt")
echo "== phase 3: holds while the lane drains (no posting), ${SECONDS_RUN}s" >&2
DRAIN=$(run_wrk drain)
AFTER_DRAIN=$(admin "$BASE/_sluice/admin/events/bench-feed/feed")
# Let the consumer finish the row in flight before counting.
sleep 1
# The consumer keeps draining the lane: the feed's total is read between
# two readings of the lane's count (rows of the batch in flight are applied
# before they are counted, at most a batch: rows_per_sec / 10, <= 500).
LANE=$(admin "$BASE/_sluice/admin/events/bench-feed/feed")
HOLD_STATE=$(admin "$BASE/_sluice/admin/events/bench-hold")
FEED_STATE=$(admin "$BASE/_sluice/admin/events/bench-feed")
LANE2=$(admin "$BASE/_sluice/admin/events/bench-feed/feed")

echo "== results" >&2
python3 - "$BASELINE" "$STORM" "$BEFORE" "$AFTER" "$POSTED" "$LANE" "$HOLD_STATE" "$FEED_STATE" \
  "$SECONDS_RUN" "$RATE" "$LANE2" "$DRAIN" "$AFTER_DRAIN" <<'PY'
import json, sys
base, storm, before, after, posted, lane, hold_state, feed_state, secs, rate, lane2, drain, after_drain = sys.argv[1:]
lane2, after_drain = json.loads(lane2), json.loads(after_drain)
def wrk(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:])
b, s, d = wrk(base), wrk(storm), wrk(drain)
before, after, lane = json.loads(before), json.loads(after), json.loads(lane)
hs, fs = json.loads(hold_state), json.loads(feed_state)
sent, refused, post_secs = posted.split()
applied_window = after["applied"] - before["applied"]
print(f"holds alone      : {float(b['rps']):,.0f}/s  p50 {float(b['p50_ms']):.2f} ms  p99 {float(b['p99_ms']):.2f} ms  ({b['statuses']})")
print(f"holds with storm : {float(s['rps']):,.0f}/s  p50 {float(s['p50_ms']):.2f} ms  p99 {float(s['p99_ms']):.2f} ms  ({s['statuses']})")
print(f"holds, lane drain: {float(d['rps']):,.0f}/s  p50 {float(d['p50_ms']):.2f} ms  p99 {float(d['p99_ms']):.2f} ms  ({d['statuses']})")
print(f"ratio storm/alone: throughput {float(s['rps']) / float(b['rps']):.2f}, p99 {float(s['p99_ms']) / float(b['p99_ms']):.2f}")
print(f"ratio drain/alone: throughput {float(d['rps']) / float(b['rps']):.2f}, p99 {float(d['p99_ms']) / float(b['p99_ms']):.2f}")
drained = after_drain["applied"] - after["applied"]
print(f"feed rows        : {int(sent):,} accepted (202) in {float(post_secs):.1f} s, {refused} batches refused; "
      f"{applied_window:,} applied during the {secs} s window ({applied_window / float(secs):,.0f}/s, bound {int(rate):,}/s); "
      f"{lane['depth']:,} still waiting; {drained:,} applied during the drain window ({drained / float(secs):,.0f}/s)")
ok = True
def fail(why):
    global ok
    print(f"FAIL: {why}")
    ok = False
for name, e in (("bench-hold", hs), ("bench-feed", fs)):
    if e["invariant_holds"] is not True or e["available"] + e["held"] + e["confirmed"] != e["total"]:
        fail(f"{name}: invariant broken")
batch = min(500, max(1, int(rate) // 10))
if not lane["applied"] <= fs["total"] - 1 <= lane2["applied"] + batch:
    fail(f"feed total {fs['total']} is not 1 + the rows applied ({lane['applied']}..{lane2['applied']})")
if lane["rejected"] != 0:
    fail(f"{lane['rejected']} rows rejected")
for w in (b, s, d):
    bad = [kv for kv in w["statuses"].split(",") if kv and kv.split("=")[0] not in ("201", "409")]
    if bad:
        fail(f"hold answers other than 201/409: {bad}")
sys.exit(0 if ok else 1)
PY
