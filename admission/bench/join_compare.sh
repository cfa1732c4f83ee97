#!/usr/bin/env bash
# join.lua before/after in one run: the admission scripts (lib.lua and
# join.lua, built as the gateway builds them: lib.lua, a newline, the
# script) of a git revision (BASE, default HEAD) against the working
# tree's, driven directly in the gateway's one-step mode ('once': the
# replay guard, the join and the solution noted with its place).
#
# Usage: admission/bench/join_compare.sh [base-rev=HEAD] [calls=60000] [rounds=3]
#
# The room is the opening surge's: rate 0 (every join waits, a new seq
# each), no cap, FIFO; its state hash is written as configure.lua leaves
# it, every field present. Two measures:
#   * instructions per call inside redis-server, under valgrind's
#     callgrind: (instructions after 2,500 calls - after 500) / 2,000, so
#     start-up and loading cancel out. Counted, not timed: the same on a
#     busy machine as on a quiet one, and the figure to compare;
#   * calls/s (redis-benchmark, 50 clients) and Redis's own usec_per_call
#     (INFO commandstats), alternating before and after for ROUNDS rounds
#     on one redis-server: timed, so moved by other load on a shared
#     machine (the script prints the load average).
# Checks, for both: each call handed out one new seq (the tail moved by
# exactly the calls made) and the state hash ends with every field it
# started with. Loopback only; starts its own redis-server processes on
# free ports and stops them.
# Needs: git, redis-server, redis-cli, redis-benchmark, valgrind, python3.
set -euo pipefail

BASE=${1:-HEAD}
N=${2:-60000}
ROUNDS=${3:-3}
source "$(dirname "$0")/../../tests/bench/lib.sh"
bench_init join-compare
for tool in git redis-server redis-cli redis-benchmark valgrind python3; do
  command -v "$tool" >/dev/null || { echo "$tool missing" >&2; exit 2; }
done

build() { # REV|worktree OUT: lib.lua, a newline, join.lua
  local lib join
  if [ "$1" = worktree ]; then
    lib=$(cat "$ROOT/admission/lua/lib.lua")
    join=$(cat "$ROOT/admission/lua/join.lua")
  else
    lib=$(git -C "$ROOT" show "$1:admission/lua/lib.lua")
    join=$(git -C "$ROOT" show "$1:admission/lua/join.lua")
  fi
  printf '%s\n\n%s\n' "$lib" "$join" >"$2"
}
build "$BASE" "$WORK/before.lua"
build worktree "$WORK/after.lua"

KEYS=()
for k in state claims batches sessions ended reseats lanes lanemarks draws; do
  KEYS+=("sluice:{r}:$k")
done

# The room's state as configure.lua writes it (every field, '%d').
reset_room() {
  redis-cli -p "$RPORT" FLUSHALL >/dev/null
  local now
  now=$(redis-cli -p "$RPORT" TIME | head -1)000
  redis-cli -p "$RPORT" HSET "sluice:{r}:state" tail 0 frontier 0 credit 0 last_ms "$now" \
    epoch 1 joins 0 admitted 0 claimed 0 refunded 0 late 0 pending 0 settled 0 \
    rate_m 0 burst_u 1000000 paused 0 closed 0 max_active -1 claim_ms 60000 opens_ms 0 \
    pq_from 0 pq_n 0 ended_total 0 carry_epoch 0 carry_tail 0 settings_v 1 ttl_ms 300000 \
    method 0 pq_k 0 pq_at 0 >/dev/null
}

# run VARIANT CALLS CLIENTS -> redis-benchmark's CSV; checks the tail
run() {
  local sha out tail fields
  sha=$(redis-cli -p "$RPORT" -x SCRIPT LOAD <"$WORK/$1.lua")
  reset_room
  fields=$(redis-cli -p "$RPORT" HLEN "sluice:{r}:state")
  out=$(redis-benchmark -p "$RPORT" -n "$2" -c "$3" -r 100000000000 --csv \
    EVALSHA "$sha" 10 "${KEYS[@]}" "sluice:{r}:pow:00000000000000000000__rand_int__" \
    once 600000 v-0123456789abcdef0123456789ab new 2>/dev/null)
  tail=$(redis-cli -p "$RPORT" HGET "sluice:{r}:state" tail)
  # -r: a repeated random id is a replay ({5}), no seq: allow a handful
  if [ "$tail" -lt $(($2 - 50)) ] || [ "$tail" -gt "$2" ]; then
    echo "FAIL: $1: $2 calls, tail $tail" >&2
    exit 1
  fi
  if [ "$(redis-cli -p "$RPORT" HLEN "sluice:{r}:state")" != "$fields" ]; then
    echo "FAIL: $1: the state hash lost or gained fields" >&2
    exit 1
  fi
  echo "$out"
}

# instructions VARIANT CALLS -> total instructions of a redis-server that
# ran CALLS joins
instructions() {
  start_redis valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" 2>/dev/null
  run "$1" "$2" 10 >/dev/null
  redis-cli -p "$RPORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$REDIS_PID" 2>/dev/null || true
  sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$WORK/cg.out" | head -1
  rm -f "$WORK/cg.out"
}

echo "join.lua ('once', a room where every join waits): $BASE (before) against the working tree (after)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== instructions per call inside redis-server (callgrind)"
declare -A IR
for v in before after; do
  a=$(instructions "$v" 500)
  b=$(instructions "$v" 2500)
  IR[$v]=$(((b - a) / 2000))
done
python3 -c "import sys; b,a=int(sys.argv[1]),int(sys.argv[2]); print(f'  before {b:,}  after {a:,}  after/before {a/b:.3f}')" \
  "${IR[before]}" "${IR[after]}"

echo "== redis-benchmark, $N calls, 50 clients, alternating ($ROUNDS rounds)"
start_redis 2>/dev/null
for round in $(seq "$ROUNDS"); do
  for v in before after; do
    redis-cli -p "$RPORT" CONFIG RESETSTAT >/dev/null
    out=$(run "$v" "$N" 50)
    rps=$(tail -1 <<<"$out" | cut -d, -f2 | tr -d '"')
    usec=$(redis-cli -p "$RPORT" INFO commandstats | tr -d '\r' |
      sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
    printf '  round %s %-6s %9s calls/s  %6s usec/call in Redis\n' "$round" "$v" "$rps" "$usec"
  done
done
redis-cli -p "$RPORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
