#!/usr/bin/env bash
# hold.lua before/after in one run: the scripts of a git revision (BASE,
# default HEAD) against the working tree's, both driven directly by
# reservation/bench/hold_script.sh.
#
# Usage: reservation/bench/hold_compare.sh [base-rev=HEAD] [requests=60000] [rounds=3]
#   (COUNT_ONLY=1: the instruction counts alone; HOLD_BATCH=n: n holds a call)
#
# Two measures, each for the successful-hold path (a stock that never
# sells out) and the sold-out path (stock 0); the count also for holds by
# 50 returning visitors (hold_script.sh's HOLD_VISITORS), whose indexes
# grow (the knee's load):
#   * instructions per call inside redis-server, under valgrind's
#     callgrind: (instructions after 2,500 calls - after 500) / 2,000, so
#     start-up and loading cancel out. Counted, not timed: the same on a
#     busy machine as on a quiet one, and the figure to compare;
#   * requests/s (redis-benchmark, 50 clients) and Redis's own
#     usec_per_call (INFO commandstats), alternating before and after for
#     ROUNDS rounds on one redis-server: timed, so moved by other load on
#     a shared machine (the script prints the load average).
# Loopback only; starts its own redis-server processes on free ports and
# stops them; the copies of the scripts live in a temporary directory.
# Needs: git, redis-server, redis-cli, redis-benchmark, valgrind, python3.
set -euo pipefail

BASE=${1:-HEAD}
N=${2:-60000}
ROUNDS=${3:-3}
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../tests/bench/lib.sh"
bench_init hold-compare
for tool in git redis-server redis-cli redis-benchmark valgrind python3; do
  command -v "$tool" >/dev/null || { echo "$tool missing" >&2; exit 2; }
done

mkdir -p "$WORK/before" "$WORK/after"
for f in "$ROOT"/reservation/lua/*.lua; do
  name=$(basename "$f")
  git -C "$ROOT" show "$BASE:reservation/lua/$name" >"$WORK/before/$name" 2>/dev/null || cp "$f" "$WORK/before/$name"
  cp "$f" "$WORK/after/$name"
done

# redis-server [valgrind prefix…] on a free port -> PORT, PID
start() {
  start_redis "$@" 2>/dev/null
  PORT=$RPORT
  PID=$REDIS_PID
}

# instructions VARIANT CALLS STOCK [VISITORS] -> total instructions of a
# redis-server that ran CALLS calls (by VISITORS returning visitors)
instructions() {
  start valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out"
  HOLD_VISITORS=${4:-} HOLD_LUA_DIR="$WORK/$1" "$HERE/hold_script.sh" 127.0.0.1 "$PORT" "$2" 10 1 "$3" >/dev/null 2>"$WORK/hs.err"
  redis-cli -p "$PORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$PID" 2>/dev/null || true
  sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$WORK/cg.out" | head -1
  rm -f "$WORK/cg.out"
}

# ratio LABEL BEFORE AFTER: one line of the counts
ratio() {
  python3 -c "import sys; b,a=int(sys.argv[2]),int(sys.argv[3]); print(f'  {sys.argv[1]}: before {b:,}  after {a:,}  after/before {a/b:.3f}')" "$@"
}

echo "hold.lua: $BASE (before) against the working tree (after)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== instructions per call inside redis-server (callgrind)"
declare -A IR
for stock in 1000000000 0; do
  for v in before after; do
    a=$(instructions "$v" 500 "$stock")
    b=$(instructions "$v" 2500 "$stock")
    IR[$v.$stock]=$(((b - a) / 2000))
  done
  path=$([ "$stock" = 0 ] && echo "sold out" || echo "held    ")
  ratio "$path" "${IR[before.$stock]}" "${IR[after.$stock]}"
done
# Returning visitors: 50 of them, so each visitor's index grows to 50
# holds by the 2,500th call of one hold (HOLD_BATCH: times the batch).
for v in before after; do
  a=$(instructions "$v" 500 1000000000 50)
  b=$(instructions "$v" 2500 1000000000 50)
  IR[$v.returning]=$(((b - a) / 2000))
done
ratio "held by 50 returning visitors" "${IR[before.returning]}" "${IR[after.returning]}"

# COUNT_ONLY=1: the counts alone, no timed rounds.
[ -n "${COUNT_ONLY:-}" ] && exit 0

echo "== redis-benchmark, $N calls, 50 clients, alternating ($ROUNDS rounds)"
start
for round in $(seq "$ROUNDS"); do
  for v in before after; do
    for stock in 1000000000 $((N / 2)); do
      redis-cli -p "$PORT" FLUSHALL >/dev/null
      out=$(HOLD_LUA_DIR="$WORK/$v" "$HERE/hold_script.sh" 127.0.0.1 "$PORT" "$N" 50 1 "$stock" 2>&1)
      rps=$(grep '^"EVALSHA' <<<"$out" | cut -d, -f2 | tr -d '"')
      usec=$(sed -n 's/^CPU evalsha_usec_per_call=//p' <<<"$out")
      over=$(sed -n 's/.*oversold=\(-*[0-9]*\).*/\1/p' <<<"$out")
      what=$([ "$stock" = 1000000000 ] && echo "never sells out" || echo "sells out half-way")
      printf '  round %s %-6s %-18s %9s calls/s  %6s usec/call in Redis\n' "$round" "$v" "$what" "$rps" "$usec"
      if [ "$stock" != 1000000000 ] && [ "$over" != 0 ]; then
        echo "FAIL: oversold $over" >&2
        exit 1
      fi
    done
  done
done
redis-cli -p "$PORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
