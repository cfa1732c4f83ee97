#!/usr/bin/env bash
# Holds per second, closed loop, and where the gateway's time goes while
# it holds: wrk (tests/bench/holds.lua) over 16 connections on a stock
# that never sells out, and, when `perf` is installed, `perf record` of
# the gateway for the middle of the run with the share of its samples in
# the kernel's context switch (`finish_task_switch`) and the top symbols.
# Written for the I/O threads' own Redis connections (README, "A hold stays
# on its I/O thread"): run it with SLUICE_BIN=an older build, then without,
# for a before and after in one sitting.
#
# Usage: tests/bench/holds_switches.sh [seconds=8] [visitors=500]
#
# Starts redis-server and `sluice serve` (release) on free loopback ports
# (tests/bench/lib.sh's room: no per-visitor hold limit), admits the
# visitors (tests/examples/mint_tokens.rs), warms up for 3 s. Loopback only;
# stops by itself. Needs: wrk, cargo, redis-server, curl, python3; perf
# (optional).
set -euo pipefail
DUR=${1:-8}
VISITORS=${2:-500}
EVENT=bench-switches
command -v wrk >/dev/null || { echo "wrk missing: apt-get install wrk" >&2; exit 2; }
source "$(dirname "$0")/lib.sh"
bench_init holds-switches
build_release mint_tokens
MINT="$TARGET/release/examples/mint_tokens"
start_redis
holds_config "$WORK/sluice.toml"
start_sluice "$WORK/sluice.toml"
VP=$SLUICE_PID
admin -X PUT "$BASE/_sluice/admin/events/$EVENT" \
  -d '{"total": 1000000000000, "cart_limit": 1000000000, "hold_ttl_seconds": 3600, "version": 1}' >/dev/null
"$MINT" "$BASE" default "$VISITORS" "$WORK/tokens.txt"
TOKENS="$WORK/tokens.txt" EVENT="$EVENT" wrk -t1 -c16 -d3s -s "$BENCH/holds.lua" "$BASE" >/dev/null
PERFP=
if command -v perf >/dev/null; then
  # the middle of the run: from 1 s in, for all but the last second
  (sleep 1; perf record -q -F 2000 -g -p "$VP" -o "$WORK/perf.data" -- sleep $((DUR > 3 ? DUR - 2 : 1)) \
    >/dev/null 2>&1) &
  PERFP=$!
fi
OUT=$(TOKENS="$WORK/tokens.txt" EVENT="$EVENT" wrk -t1 -c16 -d"${DUR}s" -s "$BENCH/holds.lua" "$BASE")
[ -n "$PERFP" ] && wait "$PERFP"
N=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$OUT")
STATUSES=$(sed -n 's/.* statuses=\([^ ]*\).*/\1/p' <<<"$OUT")
[ "$STATUSES" = "201=$N" ] || { echo "FAIL: answers other than 201: $STATUSES" >&2; exit 1; }
sed -n 's/.* rps=\([0-9.]*\) p50_ms=\([0-9.]*\) p99_ms=\([0-9.]*\).*/holds\/s \1  p50 \2 ms  p99 \3 ms/p' <<<"$OUT"
if [ -n "$PERFP" ] && [ -s "$WORK/perf.data" ]; then
  REPORT=$(perf report -i "$WORK/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null |
    grep -E '^ +[0-9.]+%' | sed 's/  */ /g')
  SWITCH=$(grep -m1 'finish_task_switch' <<<"$REPORT" | awk '{print $1}')
  echo "context switches (finish_task_switch): ${SWITCH:-0%} of the gateway's samples"
  echo "top symbols:"
  head -8 <<<"$REPORT" | cut -c1-120
fi
