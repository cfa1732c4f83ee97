#!/usr/bin/env bash
# Holds per second over HTTP against the same Lua script driven directly by
# redis-benchmark, in one run, on one Redis of its own.
#
# Usage: tests/bench/holds.sh [visitors] [seconds] [connections] [wrk-threads]
#   defaults: 2000 10 64 2
#
# Loopback only, bounded: starts redis-server on a free port and
# `sluice serve` (release) on it, loads the event `bench-http` with stock
# that never sells out (10^12 units, cart limit 10^6, hold TTL 10 min),
# admits N visitors through the JSON API (tests/examples/mint_tokens.rs),
# drives POST /_sluice/events/bench-http/holds with wrk for S seconds
# rotating through their admission tokens (tests/bench/holds.lua), then runs
# reservation/bench/hold_script.sh (redis-benchmark EVALSHA of hold.lua) on
# the same Redis. Prints holds/s over HTTP, p50/p99, the direct figure and
# the ratio, and checks through the admin API that the invariant holds and
# nothing is oversold. Everything it started is stopped on exit.
# Needs: cargo, redis-server, redis-cli, redis-benchmark, wrk, curl, python3.
set -euo pipefail

VISITORS=${1:-2000}
SECONDS_RUN=${2:-10}
CONNS=${3:-64}
THREADS=${4:-2}
EVENT=bench-http
ADMIN=bench-admin-token-0123456789
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BENCH="$ROOT/tests/bench"
WORK="$(mktemp -d -t sluice-holds-bench.XXXXXX)"
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

echo "== building (release)" >&2
(cd "$ROOT" && cargo build --release -q -p sluice-gateway --bin sluice \
  && cargo build --release -q -p sluice-tests --example mint_tokens)
TARGET="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
SLUICE="$TARGET/release/sluice"
MINT="$TARGET/release/examples/mint_tokens"

echo "== redis-server" >&2
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" --protected-mode no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  redis-cli -p "$RPORT" PING 2>/dev/null | grep -q PONG && break
  sleep 0.05
done
redis-cli -p "$RPORT" PING | grep -q PONG

echo "== sluice serve" >&2
GPORT=$(free_port)
BASE="http://127.0.0.1:$GPORT"
cat >"$WORK/sluice.toml" <<TOML
[[rooms]]
id = "default"
rate_per_sec = 100000
burst = 100000
puzzles = 1
difficulty_floor_bits = 1
difficulty_ceiling_bits = 2
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"

[[events]]
id = "$EVENT"
room = "default"
total = 0
TOML
SLUICE_LOG=warn "$SLUICE" serve --config "$WORK/sluice.toml" --listen "127.0.0.1:$GPORT" \
  --redis "redis://127.0.0.1:$RPORT/" --admin-token "$ADMIN" >"$WORK/sluice.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do
  curl -fs "$BASE/_sluice/readyz" >/dev/null 2>&1 && break
  sleep 0.05
done
curl -fs "$BASE/_sluice/readyz" >/dev/null

admin() { curl -s -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' "$@"; }
admin -X PUT "$BASE/_sluice/admin/events/$EVENT" \
  -d '{"total": 1000000000000, "cart_limit": 1000000, "hold_ttl_seconds": 600, "version": 1}' >/dev/null

echo "== admitting $VISITORS visitors" >&2
"$MINT" "$BASE" default "$VISITORS" "$WORK/tokens.txt"

echo "== wrk: ${SECONDS_RUN}s, $CONNS connections, $THREADS threads" >&2
# Warm the token cache and the connection pool with one short pass.
TOKENS="$WORK/tokens.txt" EVENT="$EVENT" timeout 30 wrk -t"$THREADS" -c"$CONNS" -d2s \
  -s "$BENCH/holds.lua" "$BASE" >/dev/null
TOKENS="$WORK/tokens.txt" EVENT="$EVENT" timeout $((SECONDS_RUN + 30)) wrk -t"$THREADS" \
  -c"$CONNS" -d"${SECONDS_RUN}s" --latency -s "$BENCH/holds.lua" "$BASE" | tee "$WORK/wrk.txt" >&2
WRK=$(grep '^WRK ' "$WORK/wrk.txt")
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$WRK"; }
HTTP_RPS=$(field rps)
P50=$(field p50_ms)
P99=$(field p99_ms)
STATUSES=$(field statuses)

echo "== redis-benchmark: hold.lua directly" >&2
DIRECT_CSV=$(timeout 300 "$ROOT/reservation/bench/hold_script.sh" 127.0.0.1 "$RPORT" 200000 50 1 2>"$WORK/direct.err")
DIRECT_RPS=$(python3 -c 'import csv,sys; rows=list(csv.reader(sys.stdin.read().splitlines())); print(rows[-1][1])' <<<"$DIRECT_CSV")

echo "== checks" >&2
STATE=$(admin "$BASE/_sluice/admin/events/$EVENT")
python3 - "$STATE" "$HTTP_RPS" "$P50" "$P99" "$DIRECT_RPS" "$STATUSES" "$WRK" <<'PY'
import json, sys
state, http_rps, p50, p99, direct, statuses, wrk = sys.argv[1:]
e = json.loads(state)
http_rps, direct = float(http_rps), float(direct)
total, avail, held, conf = e["total"], e["available"], e["held"], e["confirmed"]
oversold = max(0, held + conf - total) + (1 if avail < 0 else 0)
print(f"holds over HTTP   : {http_rps:,.0f}/s  (p50 {float(p50):.2f} ms, p99 {float(p99):.2f} ms; statuses {statuses})")
print(f"hold.lua directly : {direct:,.0f}/s  (redis-benchmark, 50 clients, no pipelining)")
print(f"ratio HTTP/direct : {http_rps / direct:.2f}  (target >= 0.5)")
print(f"event {e['event']}: total {total}, available {avail}, held {held}, confirmed {conf}, "
      f"invariant_holds {e['invariant_holds']}, oversold {oversold}")
ok = e["invariant_holds"] is True and oversold == 0 and avail + held + conf == total
bad = [s for s in statuses.split(",") if s and not s.startswith("201=")]
if bad:
    print(f"non-201 answers: {bad}")
    ok = False
sys.exit(0 if ok else 1)
PY
