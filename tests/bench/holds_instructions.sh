#!/usr/bin/env bash
# User-space instructions the gateway spends per hold, counted by valgrind's
# callgrind (tests/bench/proxy_instructions.sh does the same for proxied
# requests): unlike holds/s, the count does not move with the load of a
# shared machine, so it shows what a change to the hold path costs or saves.
#
# Usage: tests/bench/holds_instructions.sh [seconds=8] [visitors=500]
#   KEEP_PROFILE=FILE keeps the callgrind profile (callgrind_annotate FILE).
#
# Starts redis-server and `sluice serve` (release) under callgrind
# (tests/bench/lib.sh's room: no per-visitor hold limit), admits the
# visitors (tests/examples/mint_tokens.rs), loads `bench-ins` with a stock
# that never sells out, warms up with wrk (tests/bench/holds.lua), zeroes
# the counters, then holds for SECONDS over 16 connections; the
# instructions counted in that window are divided by the holds answered.
# Kernel work (loopback TCP, Redis) is not counted. Loopback only; stops by
# itself. Needs: valgrind, wrk, cargo, redis-server, curl, python3.
set -euo pipefail
DUR=${1:-8}
VISITORS=${2:-500}
EVENT=bench-ins
for tool in valgrind callgrind_control callgrind_annotate wrk; do
  command -v "$tool" >/dev/null || { echo "$tool missing: apt-get install valgrind wrk" >&2; exit 2; }
done
source "$(dirname "$0")/lib.sh"
bench_init holds-ins
build_release mint_tokens
MINT="$TARGET/release/examples/mint_tokens"
start_redis
holds_config "$WORK/sluice.toml"
GPORT=$(free_port)
BASE="http://127.0.0.1:$GPORT"
SLUICE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.%p" "$SLUICE" serve \
  --config "$WORK/sluice.toml" --listen "127.0.0.1:$GPORT" --redis "redis://127.0.0.1:$RPORT/" \
  --load-stock --admin-token "$ADMIN" >"$WORK/sluice.log" 2>&1 &
VP=$!
PIDS+=("$VP")
for _ in $(seq 600); do
  curl -fs "$BASE/_sluice/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fs "$BASE/_sluice/readyz" >/dev/null
curl -s -o /dev/null --max-time 600 "$BASE/_sluice/static/waiting.css"
admin -X PUT "$BASE/_sluice/admin/events/$EVENT" \
  -d '{"total": 1000000000000, "cart_limit": 1000000000, "hold_ttl_seconds": 3600, "version": 1}' >/dev/null
"$MINT" "$BASE" default "$VISITORS" "$WORK/tokens.txt"
TOKENS="$WORK/tokens.txt" EVENT="$EVENT" wrk -t1 -c16 -d3s -s "$BENCH/holds.lua" "$BASE" >/dev/null
callgrind_control -z "$VP" >/dev/null 2>&1
OUT=$(TOKENS="$WORK/tokens.txt" EVENT="$EVENT" wrk -t1 -c16 -d"${DUR}s" -s "$BENCH/holds.lua" "$BASE")
callgrind_control -d "$VP" >/dev/null 2>&1
sleep 1
N=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$OUT")
STATUSES=$(sed -n 's/.* statuses=\([^ ]*\).*/\1/p' <<<"$OUT")
PROFILE=$(ls "$WORK"/cg.*.1 | head -1)
IR=$(callgrind_annotate "$PROFILE" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
[ -n "${KEEP_PROFILE:-}" ] && cp "$PROFILE" "$KEEP_PROFILE"
[ "$STATUSES" = "201=$N" ] || { echo "FAIL: answers other than 201: $STATUSES" >&2; exit 1; }
printf 'sluice   %8d holds under callgrind  %8.0f instructions/hold\n' "$N" "$(awk -v ir="$IR" -v n="$N" 'BEGIN { print ir / n }')"
