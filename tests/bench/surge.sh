#!/usr/bin/env bash
# The opening surge of a sale: the gateway's CPU per visitor admitted to the
# queue, against a bare hyper server answering the same requests.
#
# Usage: tests/bench/surge.sh [visitors=50000] [seconds=10]
#
# `sluice simulate` predicts the sale (VISITORS arriving at once, proof of
# work solved in a median 2 s, p95 6 s, a room admitting 200/s with a burst
# of 10): its per-second series (`--csv`) says how many visitors join and
# how many status polls arrive in each of the first SECONDS seconds.
# tests/examples/surge.rs replays that series against `sluice serve`
# (release, on a Redis of its own, in front of `bench_tools hello` as the
# origin): per joining visitor a cookie-less load of the guarded page
# /shop (the HTML, then the static files it links), a challenge, the real
# proof of work (the room asks 1 puzzle of 1 to 2 bits: cheap) and a join;
# the polls spread over each second with the tokens of visitors in line.
# Then the same requests, kind for kind, go to a bare hyper server
# (`bench_tools hello`, tests/examples/bench_tools.rs), which answers
# anything with a small JSON body.
#
# CPU is utime + stime from /proc/PID/stat over each replay: the gateway's
# (and, beside it, its Redis's) per visitor that joined, against the bare
# server's per visitor. The replay is open loop up to 512 visitors in
# flight: when the machine cannot keep up it takes longer, with the same
# requests. Bounded (the replay stops by itself, surge.rs says how);
# loopback only; everything started is stopped on exit. The load generator
# (and its proofs of work) shares the machine's cores with the servers:
# the script prints the load average.
# Needs: cargo, redis-server, redis-cli, curl, python3.
set -euo pipefail

VISITORS=${1:-50000}
SECS=${2:-10}
source "$(dirname "$0")/lib.sh"
bench_init surge

build_release surge bench_tools
TOOLS="$TARGET/release/examples/bench_tools"
SURGE="$TARGET/release/examples/surge"

echo "== sluice simulate: $VISITORS visitors" >&2
"$SLUICE" simulate --visitors "$VISITORS" --arrivals spike --rate 200 --burst 10 \
  --solve-median 2s --solve-p95 6s --max-time 60s --csv "$WORK/sim.csv" >"$WORK/sim.txt"
sed 's/^/  /' "$WORK/sim.txt"

OPORT=$(free_port)
setsid "$TOOLS" hello "$OPORT" &
ORIGIN_PID=$!
PIDS+=("$ORIGIN_PID")
start_redis
cat >"$WORK/sluice.toml" <<TOML
[[rooms]]
id = "default"
paths = ["/shop"]
rate_per_sec = 200
burst = 10
puzzles = 1
difficulty_floor_bits = 1
difficulty_ceiling_bits = 2
# Every visitor comes from 127.0.0.1: no per-prefix join limit, no
# attack floor on the solve time.
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
TOML
start_sluice "$WORK/sluice.toml" --origin "http://127.0.0.1:$OPORT"
# The static files are compressed on a thread of their own at start: wait
# for that outside the measured window.
curl -s -o /dev/null --max-time 120 "$BASE/_sluice/static/waiting.css"

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== replay against the gateway" >&2
g0=$(cpu_ticks "$SLUICE_PID")
r0=$(cpu_ticks "$REDIS_PID")
GW=$("$SURGE" "$BASE" default /shop "$WORK/sim.csv" "$SECS")
g1=$(cpu_ticks "$SLUICE_PID")
r1=$(cpu_ticks "$REDIS_PID")
ASSETS=$(sed -n 's/.* assets=\([^ ]*\).*/\1/p' <<<"$GW")

echo "== replay against the bare hyper server" >&2
o0=$(cpu_ticks "$ORIGIN_PID")
BARE=$(SURGE_ASSETS="$ASSETS" "$SURGE" "http://127.0.0.1:$OPORT" default /shop "$WORK/sim.csv" "$SECS" --bare)
o1=$(cpu_ticks "$ORIGIN_PID")
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$GW" "$BARE" "$((g1 - g0))" "$((r1 - r0))" "$((o1 - o0))" "$(getconf CLK_TCK)" <<'PY'
import sys
gw_line, bare_line, g, r, o, tick = sys.argv[1:]
parse = lambda l: dict(kv.split("=", 1) for kv in l.split()[1:])
gw, bare = parse(gw_line), parse(bare_line)
g, r, o, tick = int(g), int(r), int(o), int(tick)
kinds = ["page", "asset", "challenge", "join", "poll"]
joined = int(gw["joined"])
bare_joined = int(bare["joined"])
reqs = lambda d: sum(int(d[k]) for k in kinds)
us = lambda ticks, n: ticks / tick * 1e6 / max(1, n)
print("requests        " + "  ".join(f"{k} {gw[k]}" for k in kinds) + f"  (bare: {reqs(bare)} in all)")
print(f"gateway replay  : {gw['visitors']} visitors planned, {joined} joined "
      f"({gw['queued']} queued, {gw['admitted_at_once']} admitted at once), {gw['failed']} failed, "
      f"{gw['poll_failed']} polls failed, {gw['poll_skipped']} skipped (nobody in line), "
      f"{float(gw['seconds']):.1f} s")
print(f"gateway latency : p50/p99 ms {gw['ms_p50_p99']}")
print(f"bare replay     : {bare_joined} visitors, {float(bare['seconds']):.1f} s")
gw_us, bare_us = us(g, joined), us(o, bare_joined)
print(f"gateway CPU     : {us(g, joined):8.1f} us per visitor joined  ({g / tick:.2f} s in all; "
      f"{us(g, reqs(gw)):.1f} us per request)")
print(f"its Redis CPU   : {us(r, joined):8.1f} us per visitor joined  ({r / tick:.2f} s)")
print(f"bare hyper CPU  : {bare_us:8.1f} us per visitor  ({o / tick:.2f} s; {us(o, reqs(bare)):.1f} us per request)")
print(f"ratio gateway/bare per visitor: {gw_us / max(bare_us, 1e-9):.1f}x")
ok = joined > 0 and int(gw["failed"]) == 0 and gw["drained"] == "true" and bare["drained"] == "true"
if not ok:
    print("FAIL: visitors failed or the replay did not finish")
sys.exit(0 if ok else 1)
PY
