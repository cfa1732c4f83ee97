#!/usr/bin/env bash
# Holds per second over HTTP against the same Lua script driven directly by
# redis-benchmark, in one run, on one Redis of its own.
#
# Usage: tests/bench/holds.sh [visitors] [seconds] [connections] [wrk-threads]
#   defaults: 2000 10 64 2
#
# Loopback only, bounded: starts redis-server on a free port and
# `sluice serve` (release) on it, admits N visitors through the JSON API
# (tests/examples/mint_tokens.rs) and warms up with wrk for 2 s on the event
# `bench-warm` (stock that never runs out). It then loads `bench-http` with
# a finite stock, half of what the warm-up rate would sell in S seconds (at
# least 1,000 units), and a cart limit that never trips, and drives POST
# /_sluice/events/bench-http/holds with wrk for S seconds rotating through
# the admission tokens (tests/bench/holds.lua): the stock sells out in the
# run, every later attempt is a 409 sold_out (also one hold.lua call).
# Then reservation/bench/hold_script.sh (redis-benchmark EVALSHA of
# hold.lua) runs on the same Redis on an event of its own, with a stock of
# half its requests (sold out too). Prints hold attempts/s over HTTP
# (201 + 409), p50/p99, the direct figure and the ratio, and for both
# phases the units sold against the stock: oversold = sold - stock must be
# 0, the stock must be sold out, every 201 is one unit, the invariant must
# hold. Everything it started is stopped on exit.
# Needs: cargo, redis-server, redis-cli, redis-benchmark, wrk, curl, python3.
set -euo pipefail

VISITORS=${1:-2000}
SECONDS_RUN=${2:-10}
CONNS=${3:-64}
THREADS=${4:-2}
EVENT=bench-http
source "$(dirname "$0")/lib.sh"
bench_init holds-bench

build_release mint_tokens
MINT="$TARGET/release/examples/mint_tokens"
start_redis
holds_config "$WORK/sluice.toml" "
[[events]]
id = \"$EVENT\"
room = \"default\"
total = 0"
start_sluice "$WORK/sluice.toml"

admin -X PUT "$BASE/_sluice/admin/events/bench-warm" \
  -d '{"total": 1000000000000, "cart_limit": 1000000, "hold_ttl_seconds": 600, "version": 1}' >/dev/null

echo "== admitting $VISITORS visitors" >&2
"$MINT" "$BASE" default "$VISITORS" "$WORK/tokens.txt"

echo "== warm-up: wrk 2s on bench-warm" >&2
# Warm the token cache and the connection pool, and measure the rate that
# sizes the stock of the measured run.
TOKENS="$WORK/tokens.txt" EVENT=bench-warm timeout 30 wrk -t"$THREADS" -c"$CONNS" -d2s \
  -s "$BENCH/holds.lua" "$BASE" >"$WORK/warm.txt"
WARM_RPS=$(sed -n 's/.* rps=\([^ ]*\).*/\1/p' "$WORK/warm.txt")
STOCK=$(python3 -c "import sys; print(max(1000, int(float(sys.argv[1]) * int(sys.argv[2]) / 2)))" \
  "$WARM_RPS" "$SECONDS_RUN")
admin -X PUT "$BASE/_sluice/admin/events/$EVENT" \
  -d "{\"total\": $STOCK, \"cart_limit\": $STOCK, \"hold_ttl_seconds\": 600, \"version\": 1}" >/dev/null
echo "== wrk: ${SECONDS_RUN}s, $CONNS connections, $THREADS threads, stock $STOCK (warm-up ${WARM_RPS}/s)" >&2
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
DIRECT_STATE=$(grep '^STATE ' "$WORK/direct.err")

echo "== checks" >&2
STATE=$(admin "$BASE/_sluice/admin/events/$EVENT")
python3 - "$STATE" "$HTTP_RPS" "$P50" "$P99" "$DIRECT_RPS" "$STATUSES" "$DIRECT_STATE" <<'PY'
import json, sys
state, http_rps, p50, p99, direct, statuses, direct_state = sys.argv[1:]
e = json.loads(state)
http_rps, direct = float(http_rps), float(direct)
total, avail, held, conf = e["total"], e["available"], e["held"], e["confirmed"]
by = dict(s.split("=") for s in statuses.split(",") if s)
created = int(by.get("201", 0))
sold = held + conf
oversold = sold - total
d = dict(kv.split("=") for kv in direct_state.split()[1:])
d_oversold = int(d["oversold"])
print(f"hold attempts over HTTP : {http_rps:,.0f}/s  (p50 {float(p50):.2f} ms, p99 {float(p99):.2f} ms; statuses {statuses})")
print(f"hold.lua directly       : {direct:,.0f}/s  (redis-benchmark, 50 clients, no pipelining)")
print(f"ratio HTTP/direct       : {http_rps / direct:.2f}  (target >= 0.5)")
print(f"HTTP  : stock {total}, sold {sold} ({created} x 201), available {avail}, "
      f"oversold {oversold}, invariant_holds {e['invariant_holds']}")
print(f"direct: stock {d['total']}, sold {int(d['held']) + int(d['confirmed'])}, "
      f"available {d['available']}, oversold {d_oversold}")
ok = True
def fail(why):
    global ok
    print(f"FAIL: {why}")
    ok = False
if e["invariant_holds"] is not True or avail + held + conf != total:
    fail("invariant broken")
if oversold != 0 or d_oversold != 0:
    fail("oversold")
if avail != 0 or int(d["available"]) != 0:
    fail("the stock did not sell out in the run: nothing was proven")
if created != sold:
    fail(f"{created} answers 201 for {sold} units sold")
bad = [s for s in by if s not in ("201", "409")]
if bad:
    fail(f"answers other than 201/409: {bad}")
sys.exit(0 if ok else 1)
PY
