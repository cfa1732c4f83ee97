#!/usr/bin/env bash
# Holds per second on one hot event split into 8 shards against the same
# event on one key, on a 3-primary Redis Cluster of its own, in one run;
# then the last units of a sharded sale: 50,000 units, carts of 1-4, under
# 10,000 concurrent buyers (issue 20; seed 003's benchmark).
#
# Usage: tests/bench/shards.sh [seconds] [tasks] [rounds] [crowd] [units] [limit]
#   defaults: 10 256 2 10000 50000 120 (passed to the example as they are)
#
# Loopback only, bounded: the example (tests/examples/shard_bench.rs, read
# its docs for what each figure means) starts its own redis-server
# processes on free ports, runs every phase for a bounded time and stops
# them on exit. Builds it in release first (cargo rebuilds only what
# changed; CARGO_TARGET_DIR is honoured), prints its report, then the
# ratios. Exits as the example does: 1 when an invariant failed.
# Needs: cargo, redis-server, redis-cli, python3.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SECONDS_RUN=${1:-10}
ROUNDS=${3:-2}
LIMIT=${6:-120}

echo "== building (release)" >&2
(cd "$ROOT" && cargo build --release -q -p sluice-tests --example shard_bench)
TARGET="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
BENCH="$TARGET/release/examples/shard_bench"

OUT="$(mktemp -t sluice-shards-bench.XXXXXX)"
trap 'rm -f "$OUT"' EXIT
echo "== shard_bench $* (load average: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
# Bound: the throughput rounds and warm-up, six sales of at most LIMIT s,
# and the cluster's start and checks.
status=0
timeout $((2 * SECONDS_RUN * ROUNDS + 2 + 6 * LIMIT + 120)) "$BENCH" "$@" | tee "$OUT" || status=$?

echo "== ratios"
python3 - "$OUT" <<'PY'
import sys
line = next((l for l in open(sys.argv[1]) if l.startswith("RESULT ")), None)
if line is None:
    print("no RESULT line: the bench did not finish")
    sys.exit(0)
r = dict(kv.split("=", 1) for kv in line.split()[1:])
print(f"holds/s, 8 shards / plain      : {float(r['throughput_ratio']):.2f}  "
      f"({float(r['throughput_sharded']):,.0f} / {float(r['throughput_plain']):,.0f}, medians)")
print(f"sell-out time, 8 shards / plain: {float(r['sellout_ratio']):.2f}  "
      f"({r['sellout_sharded_s']} s / {r['sellout_plain_s']} s, timed sale)")
print(f"false sold-outs, 8 shards      : {r['false_soldout_sharded']} timed, "
      f"{r['false_soldout_sharded_observed']} observed, {r['false_soldout_sharded_few']} with fewer buyers "
      f"(provable lower bounds; units left unsold {r['unsold_sharded']} / {r['unsold_sharded_few']})")
PY
exit "$status"
