#!/usr/bin/env bash
# The knee of holds, open loop: the highest offered rate of
# POST /_sluice/events/{event}/holds whose p99 (measured from each
# request's intended send time) stays under 200 ms, beside hold.lua driven
# directly by redis-benchmark in the same run, on the same Redis.
#
# Usage: tests/bench/holds_knee.sh [rates] [seconds-per-step] [connections] [visitors] [threads]
#   defaults: "10000 15000 20000 25000 30000 35000 40000 45000" 5 256 2000 2
#
# The load generator is our own, tests/examples/open_loop.rs (its header
# says why not oha: oha sends one set of headers, a hold needs a
# visitor's token per request; and it is a long install). It keeps the
# offered rate whatever the answers do, over keep-alive connections, and
# times every request from when it was due (coordinated omission
# corrected), in an HDR histogram.
#
# Loopback only, bounded: starts redis-server on a free port and `sluice
# serve` (release) on it (tests/bench/lib.sh), admits N visitors through
# the JSON API (tests/examples/mint_tokens.rs), loads the event
# `bench-knee` with a stock that never sells out and a cart limit that
# never trips (every answer is a 201: the successful-hold path, the
# costliest), warms up for 2 s at 2,000/s, then steps the offered rate,
# each step for S seconds, and stops stepping after two steps in a row
# over the 200 ms line (20,000/s always runs). The knee is the highest
# rate up to which every step ran under the line (since 2026-12-07; a
# step under it after one over it is printed apart, not counted). Per
# step it prints offered and achieved rate, p50/p99/max, the gateway's,
# Redis's and the load generator's own CPU per hold (utime + stime from
# /proc/PID/stat: the three share the machine's cores). Then
# reservation/bench/hold_script.sh (redis-benchmark EVALSHA of hold.lua,
# 50 clients, no pipelining) runs on the same Redis with a stock that
# never sells out either: the ratio is knee / direct. The checks: every
# answer a 201, no error, the store's invariant holds, units held = 201s
# answered. It also prints the mean batch of holds sent to Redis together
# (SLUICE_HOLD_BATCH=0 in the environment turns the batching off, for a
# before and after with one build).
# On a shared machine, load from other processes moves the figures: the
# script prints the load average before and after.
# Needs: cargo, redis-server, redis-cli, redis-benchmark, curl, python3.
set -euo pipefail

RATES=${1:-"10000 15000 20000 25000 30000 35000 40000 45000"}
STEP_S=${2:-5}
CONNS=${3:-256}
VISITORS=${4:-2000}
THREADS=${5:-2}
EVENT=bench-knee
source "$(dirname "$0")/lib.sh"
bench_init holds-knee

build_release mint_tokens open_loop
MINT="$TARGET/release/examples/mint_tokens"
# OPEN_LOOP=path drives the load with another build of the generator
# (a before and after of the generator itself).
LOAD="${OPEN_LOOP:-$TARGET/release/examples/open_loop}"
start_redis
holds_config "$WORK/sluice.toml"
start_sluice "$WORK/sluice.toml"
admin -X PUT "$BASE/_sluice/admin/events/$EVENT" \
  -d '{"total": 1000000000000, "cart_limit": 1000000000, "hold_ttl_seconds": 3600, "version": 1}' >/dev/null

echo "== admitting $VISITORS visitors" >&2
"$MINT" "$BASE" default "$VISITORS" "$WORK/tokens.txt"
URL="$BASE/_sluice/events/$EVENT/holds"

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== warm-up: 2,000/s for 2 s" >&2
"$LOAD" "$URL" "$WORK/tokens.txt" 2000 2 "$CONNS" "$THREADS" >"$WORK/warm.txt"

printf '%-9s %-9s %-9s %-9s %-9s %-10s %-11s %-11s %-11s %s\n' offered achieved p50_ms p99_ms max_ms unsent gw_us/hold redis_us/hold load_us/hold statuses
TICK=$(getconf CLK_TCK)
over=0
: >"$WORK/steps.txt"
for rate in $RATES; do
  g0=$(cpu_ticks "$SLUICE_PID")
  r0=$(cpu_ticks "$REDIS_PID")
  line=$(timeout $((STEP_S + 60)) "$LOAD" "$URL" "$WORK/tokens.txt" "$rate" "$STEP_S" "$CONNS" "$THREADS")
  g1=$(cpu_ticks "$SLUICE_PID")
  r1=$(cpu_ticks "$REDIS_PID")
  echo "$line g=$((g1 - g0)) r=$((r1 - r0))" >>"$WORK/steps.txt"
  python3 - "$line" "$((g1 - g0))" "$((r1 - r0))" "$TICK" <<'PY'
import sys
line, g, r, tick = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
f = dict(kv.split("=", 1) for kv in line.split()[1:])
n = max(1, int(f["completed"]))
us = lambda t: t / tick * 1e6 / n
print(f"{f['offered']:<9} {float(f['achieved']):<9.0f} {float(f['p50_ms']):<9.2f} "
      f"{float(f['p99_ms']):<9.2f} {float(f['max_ms']):<9.1f} {f['unsent']:<10} "
      f"{us(g):<11.1f} {us(r):<11.1f} {float(f.get('cpu_us', 'nan')):<11.1f} {f['statuses']}")
PY
  p99=$(sed -n 's/.* p99_ms=\([^ ]*\).*/\1/p' <<<"$line")
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 200 else 1)" "$p99"; then
    over=$((over + 1))
  else
    over=0
  fi
  if [ "$over" -ge 2 ] && [ "$rate" -ge 20000 ]; then break; fi
  sleep 1
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
# Holds sent together (README, "Holds sent together"): the mean batch
# over the whole run, warm-up included (SLUICE_HOLD_BATCH=0 in the
# environment sends each hold alone: no steps counted).
admin "$BASE/metrics" | python3 -c '
import sys
m = dict(l.rsplit(" ", 1) for l in sys.stdin.read().splitlines() if l.startswith("sluice_hold_store_step"))
steps = float(m.get("sluice_hold_store_steps_total", 0))
holds = float(m.get("sluice_hold_store_step_holds_total", 0))
print(f"hold store steps {steps:,.0f} for {holds:,.0f} holds: mean batch {holds / steps:.2f}" if steps
      else "holds sent one call each (no hold batching)")
'

echo "== redis-benchmark: hold.lua directly" >&2
DIRECT_CSV=$(timeout 300 "$ROOT/reservation/bench/hold_script.sh" 127.0.0.1 "$RPORT" 200000 50 1 1000000000000 2>"$WORK/direct.err")
DIRECT_RPS=$(python3 -c 'import csv,sys; rows=list(csv.reader(sys.stdin.read().splitlines())); print(rows[-1][1])' <<<"$DIRECT_CSV")

echo "== checks" >&2
STATE=$(admin "$BASE/_sluice/admin/events/$EVENT")
python3 - "$STATE" "$DIRECT_RPS" "$WORK/steps.txt" "$WORK/warm.txt" <<'PY'
import json, sys
state, direct, steps_file, warm_file = sys.argv[1:]
e = json.loads(state)
direct = float(direct)
steps = []
for line in open(steps_file):
    steps.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
warm = dict(kv.split("=", 1) for kv in open(warm_file).read().split()[1:])
# The knee: the highest rate up to which every step, in the order run,
# kept its p99 under the line. A step under the line after one over it
# (the noise of a shared machine) does not raise the knee; it is printed
# apart as the highest passing step.
knee = 0
for s in steps:
    if float(s["p99_ms"]) >= 200:
        break
    knee = max(knee, float(s["offered"]))
best = max((float(s["offered"]) for s in steps if float(s["p99_ms"]) < 200), default=0)
at20 = [s for s in steps if float(s["offered"]) == 20000]
print(f"knee (every step up to it with p99 < 200 ms): {knee:,.0f}/s  (target >= 30,000)")
if best != knee:
    print(f"highest step with p99 < 200 ms, past one over: {best:,.0f}/s")
if at20:
    print(f"p99 at 20,000/s                              : {float(at20[0]['p99_ms']):.2f} ms  (target < 10)")
print(f"hold.lua directly (redis-benchmark, 50 clients): {direct:,.0f}/s")
print(f"ratio knee/direct                            : {knee / direct:.2f}")
ok = True
def fail(why):
    global ok
    print(f"FAIL: {why}")
    ok = False
created = 0
for s in steps + [warm]:
    by = dict(kv.split("=") for kv in s["statuses"].split(",") if kv)
    created += int(by.get("201", 0))
    bad = [k for k in by if k != "201"]
    if bad:
        fail(f"answers other than 201 at {s['offered']}/s: {s['statuses']}")
    if int(s["errors"]) != 0:
        fail(f"{s['errors']} connection errors at {s['offered']}/s")
held = e["held"] + e["confirmed"]
print(f"units held {held}, 201s answered {created}, invariant_holds {e['invariant_holds']}")
if e["invariant_holds"] is not True:
    fail("invariant broken")
if held != created:
    fail(f"{created} answers 201 for {held} units held")
sys.exit(0 if ok else 1)
PY
