#!/usr/bin/env bash
# Status polls against a bare hyper server, in one run, on this machine.
#   hyper  — a bare hyper server answering a constant JSON body (the ceiling)
#   sluice — GET /_sluice/rooms/default/status with a valid queue token
#            (cached signature check + the room's snapshot; no store call)
#   joins  — visitors fetching a challenge, solving it (1 puzzle, 2 bits)
#            and joining, closed loop, on a gateway over its own
#            redis-server; with redis-benchmark's INCR on the same server
#            as the store's ceiling (a join is one Lua script)
# Prints requests/s and p99 for each and the sluice/hyper ratio.
#
# Usage: tests/bench/status.sh [seconds=10] [connections=64]
# SLUICE_BIN=path measures that build of `sluice` (lib.sh).
# Needs: wrk. Loopback only; stops by itself.
set -euo pipefail
DUR="${1:-10}"
CONNS="${2:-64}"
command -v wrk >/dev/null || { echo "wrk missing: apt-get install wrk" >&2; exit 2; }
source "$(dirname "$0")/lib.sh"
bench_init status
build_release bench_tools
TOOLS="$TARGET/release/examples/bench_tools"
work=$WORK
port() { free_port; }
HELLO=$(port); SPORT=$(port)

"$TOOLS" hello "$HELLO" & PIDS+=($!)
# A paused room keeps everyone waiting, so every poll is a "waiting" answer.
cat > "$work/sluice.toml" <<CONF
admin_token = "bench-admin-token-0123456789"
# One token polls from every connection: far past the per-token limit
# (120 a minute), which would make every poll a 429 this bench does not
# measure.
[limits]
status_polls_per_token_per_min = 0

[[rooms]]
id = "default"
rate_per_sec = 0
burst = 1
puzzles = 1
difficulty_floor_bits = 1
difficulty_ceiling_bits = 2
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
CONF
SLUICE_LOG=warn setsid "$SLUICE" serve --listen "127.0.0.1:$SPORT" --config "$work/sluice.toml" >/dev/null & PIDS+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SPORT/_sluice/readyz" >/dev/null && break; sleep 0.1; done
# spend the one credit, then take a place in line
"$TOOLS" join "http://127.0.0.1:$SPORT" default >/dev/null 2>&1 || true
TOKEN=$("$TOOLS" join "http://127.0.0.1:$SPORT" default)

run() { # name url [header…]
  local name=$1 url=$2 hdr=()
  shift 2
  for h in "$@"; do hdr+=(-H "$h"); done
  set -- "$name" "$url"
  wrk -t1 -c"$CONNS" -d2s "${hdr[@]}" "$2" >/dev/null 2>&1
  local out; out=$(wrk -t1 -c"$CONNS" -d"${DUR}s" --latency "${hdr[@]}" "$2")
  if grep -q 'Non-2xx' <<<"$out"; then
    echo "$name: $(grep 'Non-2xx' <<<"$out" | xargs): the bench measured refusals" >&2
    exit 1
  fi
  local rps p99
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  printf '%-8s %12s req/s   p99 %s\n' "$1" "$rps" "$p99" >&2
  echo "$rps"
}
echo "wrk: ${CONNS} connections, ${DUR}s, 1 thread; $(nproc) cores shared by load and servers" >&2
h=$(run hyper "http://127.0.0.1:$HELLO/")
s=$(run status "http://127.0.0.1:$SPORT/_sluice/rooms/default/status" "Authorization: Bearer $TOKEN")
curl -sf -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$SPORT/_sluice/rooms/default/status" | grep -q '"state":"waiting"' \
  || { echo "status answer is not 'waiting': the bench measured the wrong thing" >&2; exit 1; }
# The same poll as a browser's fetch() sends it: asking for br or gzip.
# The answer is under the per-request compression's threshold, so it is
# sent as it is (br's encoder zeroes a table of about half a megabyte per
# answer: page faults, and TLB shootdowns across the I/O threads).
b=$(run browser "http://127.0.0.1:$SPORT/_sluice/rooms/default/status" "Authorization: Bearer $TOKEN" \
  "Accept-Encoding: gzip, deflate, br, zstd")
awk -v s="$s" -v h="$h" 'BEGIN { printf "status polls / bare hyper: %.2f (target ≥ 0.5)\n", s/h }'
awk -v b="$b" -v h="$h" 'BEGIN { printf "status polls as a browser asks / bare hyper: %.2f\n", b/h }'

# Joins per second on Redis.
if command -v redis-server >/dev/null; then
  REDIS=$(port); SLUICE_R=$(port)
  redis-server --port "$REDIS" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
  for _ in $(seq 50); do redis-cli -p "$REDIS" ping >/dev/null 2>&1 && break; sleep 0.1; done
  SLUICE_LOG=warn setsid "$SLUICE" serve --listen "127.0.0.1:$SLUICE_R" --config "$work/sluice.toml" \
    --redis "redis://127.0.0.1:$REDIS" >/dev/null & PIDS+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SLUICE_R/_sluice/readyz" >/dev/null && break; sleep 0.1; done
  read -r jps jp99 jok jfail < <("$TOOLS" joins "http://127.0.0.1:$SLUICE_R" default "$DUR" "$CONNS")
  printf 'joins    %12s joins/s p99 %s ms (each: challenge, solve, join; %s joined, %s refused: any refusal is a bug)\n' "$jps" "$jp99" "$jok" "$jfail" >&2
  if command -v redis-benchmark >/dev/null; then
    incr=$(redis-benchmark -p "$REDIS" -t incr -n 200000 -c "$CONNS" -q 2>/dev/null | tr '\r' '\n' | awk '/INCR/ {print $2}' | tail -1)
    echo "redis-benchmark INCR on the same redis-server: $incr ops/s" >&2
  fi
else
  echo "redis-server missing: joins on Redis not measured (apt-get install redis-server)" >&2
fi
