#!/usr/bin/env bash
# Joins per second through a gateway on Redis, against the same join
# script driven directly by redis-benchmark, in one run, on one Redis of
# its own; and ed25519-dalek's raw signature against the gateway's token
# signing, in process.
#
# Usage: tests/bench/joins.sh [joins=200000] [connections=64] [wrk-threads=2] [seconds=5]
#   SLUICE_BIN=path/to/sluice TOOLS_BIN=path/to/bench_tools: run those
#   builds, building nothing
#   ACCEPT_ENCODING="gzip, deflate, br, zstd": every join asks for it, as a
#   browser's fetch() does
#
# Loopback only, bounded: starts redis-server on a free port and `sluice
# serve` (release; SLUICE_BIN to run another build of it) on it, with a room
# that admits nobody (every join waits: a 201 with a queue token, the
# opening surge's case) asking for the cheapest real proof of work (1
# puzzle, 1 to 2 bits), no per-network limit and no minimum solve time.
# Before the timed phase `bench_tools presolve` fetches N challenges and
# solves them (solving and fetching would otherwise be most of the load);
# then wrk (tests/bench/joins.lua) sends each solved body at most once,
# over C connections, for S seconds (the run fails if the bodies run out
# first: pre-solve more). Then redis-benchmark runs
# join.lua (the gateway's own script, loaded byte for byte as the gateway
# builds it) in its one-step mode on a room of its own: the replay guard's
# check, the join, the solution recorded with its place, a fresh solution
# id per call (`__rand_int__`), as many clients as wrk's connections.
# Prints joins/s over HTTP with p50/p99, the direct figure, their ratio,
# and ed25519-dalek's `SigningKey::sign` per second against the gateway's
# whole queue token signing per second (`bench_tools sign`); and the CPU
# each join cost over wrk's run: the gateway's (beside one signature's
# share of it), Redis's and the rest (wrk, the kernel), with how busy the
# machine was: where a join's time goes when all three share the cores.
# Checks: every
# join answered 201, the room's tail moved by exactly the joins answered.
# Everything it started is stopped on exit.
# Needs: cargo, redis-server, redis-cli, redis-benchmark, wrk, curl, python3.
set -euo pipefail

JOINS=${1:-200000}
CONNS=${2:-64}
THREADS=${3:-2}
DUR=${4:-5}
source "$(dirname "$0")/lib.sh"
bench_init joins-bench

for tool in redis-server redis-cli redis-benchmark wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "$tool missing" >&2; exit 2; }
done

# SLUICE_BIN: measure another build of the gateway (lib.sh); the load
# tool is the one in the target directory (or TOOLS_BIN).
build_release bench_tools
TOOLS="${TOOLS_BIN:-$TARGET/release/examples/bench_tools}"

start_redis

# `bench` takes the HTTP joins, `direct` the script's: same settings. Rate
# 0 with a burst of 1: the first join passes (spent below), every later
# one waits. The challenges live long enough for the pre-solving.
room() {
  cat <<TOML
[[rooms]]
id = "$1"
rate_per_sec = 0
burst = 1
puzzles = 1
difficulty_floor_bits = 1
difficulty_ceiling_bits = 2
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
challenge_ttl = "10m"
TOML
}
# DIRECT_CALLS=false in the environment sends the joins through the router
# (`server.direct_calls`), for a before and after with one build.
{
  printf '[server]\ndirect_calls = %s\n\n' "${DIRECT_CALLS:-true}"
  room bench
  room direct
} >"$WORK/sluice.toml"
start_sluice "$WORK/sluice.toml"
tail_of() { admin "$BASE/_sluice/admin/rooms/$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tail"])'; }

# spend the one credit: every measured join waits
"$TOOLS" join "$BASE" bench >/dev/null 2>&1 || true

echo "== pre-solving $JOINS challenges" >&2
read -r SOLVE_S BITS < <("$TOOLS" presolve "$BASE" bench "$JOINS" 64 "$WORK/bodies.txt")
echo "   $JOINS challenges fetched and solved in ${SOLVE_S}s (at most $BITS bits)" >&2
TAIL_BEFORE=$(tail_of bench)

echo "== wrk: ${DUR}s, $JOINS bodies, $CONNS connections, $THREADS threads" >&2
# CPU over the timed phase: the gateway's, Redis's, the whole machine's
# (busy and idle ticks of /proc/stat's first line)
machine() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat; }
read -r M_BUSY0 M_IDLE0 < <(machine)
G_CPU0=$(cpu_ticks "$SLUICE_PID")
R_CPU0=$(cpu_ticks "$REDIS_PID")
BODIES="$WORK/bodies.txt" ROOM=bench THREADS="$THREADS" timeout 300 wrk -t"$THREADS" \
  -c"$CONNS" -d"${DUR}s" --latency -s "$BENCH/joins.lua" "$BASE" | tee "$WORK/wrk.txt" >&2
G_CPU1=$(cpu_ticks "$SLUICE_PID")
R_CPU1=$(cpu_ticks "$REDIS_PID")
read -r M_BUSY1 M_IDLE1 < <(machine)
CPU="$((G_CPU1 - G_CPU0)) $((R_CPU1 - R_CPU0)) $((M_BUSY1 - M_BUSY0)) $((M_IDLE1 - M_IDLE0)) $(getconf CLK_TCK)"
WRK=$(grep '^WRK ' "$WORK/wrk.txt")
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$WRK"; }
TAIL_AFTER=$(tail_of bench)

echo "== redis-benchmark: join.lua directly" >&2
# The script as the gateway builds it: lib.lua, a newline, join.lua.
SHA=$(python3 -c 'import sys; sys.stdout.write(open(sys.argv[1]).read() + "\n" + open(sys.argv[2]).read())' \
  "$ROOT/admission/lua/lib.lua" "$ROOT/admission/lua/join.lua" | redis-cli -p "$RPORT" -x SCRIPT LOAD)
K=()
# the nine keys of RedisQueueStore::keys, in order
for k in state claims batches sessions ended reseats lanes lanemarks draws; do K+=("sluice:{direct}:$k"); done
# spend the direct room's one credit too
redis-cli -p "$RPORT" EVALSHA "$SHA" 9 "${K[@]}" join >/dev/null
D_BEFORE=$(redis-cli -p "$RPORT" HGET "sluice:{direct}:state" tail)
N_DIRECT=$((JOINS > 200000 ? JOINS : 200000))
# a solution key as long as a real one (32 hex digits), a visitor id as
# long as new_visitor_id's, a ttl of 10 minutes
DIRECT_CSV=$(timeout 300 redis-benchmark -p "$RPORT" -n "$N_DIRECT" -c "$CONNS" -r 100000000000 --csv \
  EVALSHA "$SHA" 10 "${K[@]}" "sluice:{direct}:pow:00000000000000000000__rand_int__" \
  once 600000 v-0123456789abcdef0123456789ab new 2>/dev/null)
DIRECT_RPS=$(python3 -c 'import csv,sys; rows=list(csv.reader(sys.stdin.read().splitlines())); print(rows[-1][1])' <<<"$DIRECT_CSV")
D_AFTER=$(redis-cli -p "$RPORT" HGET "sluice:{direct}:state" tail)
GATEWAY_SHA=$(redis-cli -p "$RPORT" SCRIPT EXISTS "$SHA")

echo "== signing, in process (1 thread, 3 s each)" >&2
read -r RAW_SIGN TOKEN_SIGN < <("$TOOLS" sign 3)

echo "== checks" >&2
python3 - "$WRK" "$TAIL_BEFORE" "$TAIL_AFTER" "$DIRECT_RPS" "$D_BEFORE" "$D_AFTER" "$N_DIRECT" \
  "$RAW_SIGN" "$TOKEN_SIGN" "$SOLVE_S" "$JOINS" "$CONNS" "$CPU" <<'PY'
import sys
wrk, t0, t1, direct, d0, d1, n_direct, raw, tok, solve_s, joins, conns, cpu = sys.argv[1:]
f = dict(kv.split("=", 1) for kv in wrk.split()[1:])
jps, p50, p99 = float(f["joins_per_s"]), float(f["p50_ms"]), float(f["p99_ms"])
created, statuses = int(f["created"]), f["statuses"]
direct, raw, tok = float(direct), float(raw), float(tok)
taken = int(t1) - int(t0)
d_taken = int(d1) - int(d0)
print(f"joins over HTTP     : {jps:,.0f}/s  (p50 {p50:.2f} ms, p99 {p99:.2f} ms; "
      f"{created} x 201 in {float(f['seconds']):.2f} s; statuses {statuses}; "
      f"{joins} challenges pre-solved in {float(solve_s):.1f} s)")
print(f"join.lua directly   : {direct:,.0f}/s  (redis-benchmark EVALSHA, one-step mode, "
      f"{d_taken} places for {n_direct} calls)")
print(f"ratio HTTP/direct   : {jps / direct:.2f}")
print(f"ed25519 raw sign    : {raw:,.0f}/s  (ed25519-dalek SigningKey::sign, 1 thread)")
print(f"queue token signing : {tok:,.0f}/s  (Keyring::sign_queue with its claims, 1 thread)"
      f"  ratio {tok / raw:.2f}")
# CPU per join over wrk's run (ticks of the gateway, Redis, the machine's
# busy and idle; the rest of busy is the load generator and the kernel's
# work for nobody in particular)
g, r, busy, idle, hz = (int(x) for x in cpu.split())
us = lambda ticks: ticks / hz * 1e6 / max(created, 1)
print(f"CPU per join        : gateway {us(g):.0f} µs (signing its token: {1e6 / raw:.0f} µs), "
      f"Redis {us(r):.0f} µs, the rest {us(busy - g - r):.0f} µs (wrk and the kernel); "
      f"machine {busy / (busy + idle):.0%} busy")
ok = True
def fail(why):
    global ok
    print(f"FAIL: {why}")
    ok = False
# a wrk thread sends readiness probes (200) once its share of the bodies
# is spent: the run measured less than joins
if int(f["sent"]) >= int(joins) or "200=" in statuses:
    fail(f"the {joins} pre-solved bodies ran out within the run: pre-solve more")
bad = [s for s in statuses.split(",") if s and not s.startswith(("201=", "200="))]
if bad:
    fail(f"answers other than 201: {bad}")
# joins in flight when wrk stops are taken but not counted: at most one
# per connection
if not 0 <= taken - created <= int(conns):
    fail(f"the tail moved by {taken} for {created} places")
if int(f["errors"]) != 0:
    fail(f"{f['errors']} socket errors")
sys.exit(0 if ok else 1)
PY
