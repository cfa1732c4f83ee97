#!/usr/bin/env bash
# What a waiting visitor costs one gateway, streamed against polled
# (issue 21), in one run on this machine:
#   memory  — the gateway's RSS before any stream and at 10,000, 50,000 and
#             100,000 open idle status streams (those below N) and at N:
#             bytes per idle stream (the bound: 4,096)
#   fan-out — the room paused, then resumed, through the admin API: the
#             time until every stream has heard it (the bound: 1 s)
#   CPU     — the gateway's utime+stime over WINDOW seconds while the N
#             visitors wait streamed, against the same N polling at the
#             poll_after_ms their answers ask for: the ratio
# A release `sluice serve` on loopback with a room that admits nobody
# (rate 0) and asks for almost no work; the load is
# tests/examples/stream_bench.rs (raw sockets from 127.0.0.2, .3, ...).
#
# Usage: tests/bench/streams.sh [visitors=10000] [window_seconds=30] [streams_per_connection=1]
#        SLUICE_BIN=/tmp/old/sluice tests/bench/streams.sh   # another build
#        tests/bench/streams.sh 100000      # the issue's scale
#        tests/bench/streams.sh 100000 30 200   # over HTTP/2, 200 a connection
# Over HTTP/1.1 (the default) each stream is a file descriptor in the
# gateway and another in the load process: N needs a file limit above N for
# both. The script raises the soft limit to the hard one (and tries higher);
# with a lower hard limit it measures as many streams as fit and says so.
# With streams_per_connection above 1 the streams are requests on HTTP/2
# connections (prior knowledge; the gateway allows 256 at once on one), a
# descriptor per connection: N streams on a host whose file limit is below N,
# measuring a stream's cost without a connection of its own.
# Loopback only; bounded in count and time (the load stops itself; a
# 15-minute ceiling on the whole).
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${1:-10000}"
WINDOW="${2:-30}"
PER_CONN="${3:-1}"
[ "$PER_CONN" -ge 1 ] && [ "$PER_CONN" -le 256 ] ||
  { echo "streams_per_connection: 1 to 256 (the gateway's HTTP/2 limit of streams at once)" >&2; exit 2; }
ROOM=default
ADMIN=bench-admin-token-0123456789

# File descriptors: the gateway's and the load's, one per connection each.
want=$(( (N + PER_CONN - 1) / PER_CONN + 1024 ))
ulimit -n "$want" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
limit=$(ulimit -n)
if [ "$limit" != unlimited ] && [ "$limit" -lt "$want" ]; then
  fit=$(( (limit - 1024) * PER_CONN ))
  echo "!! file limit: hard limit $(ulimit -Hn) (not raisable here: no CAP_SYS_RESOURCE);" \
       "$N streams need $want descriptors per process: measuring $fit streams instead" >&2
  N=$fit
fi
[ "$N" -ge 1000 ] || { echo "too few descriptors for a measurement (file limit $limit)" >&2; exit 2; }

# SLUICE_BIN=path: another gateway build (e.g. one from before a change),
# with the load tools already built.
if [ -z "${SLUICE_BIN:-}" ]; then
  cargo build --release -q -p sluice-gateway
  cargo build --release -q -p sluice-tests --example stream_bench --example bench_tools
fi
SLUICE_BIN="${SLUICE_BIN:-./target/release/sluice}"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
SLUICE=$(port)

# Nobody admitted (rate 0): everyone waits; 1 puzzle of 1-2 bits: joins
# cost next to nothing; no per-network limit on joins or streams (the
# whole crowd comes from 127.0.0.0/24); room for every connection and
# every token in the verified-token cache.
cat > "$work/sluice.toml" <<CONF
admin_token = "$ADMIN"
[limits]
max_connections = $((N + 512))
streams_per_prefix = 0
token_cache_entries = $((N + 1024))
[[rooms]]
id = "$ROOM"
rate_per_sec = 0
burst = 1
puzzles = 1
difficulty_floor_bits = 1
difficulty_ceiling_bits = 2
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
CONF
# The default log level (info): each open stream's request span is live.
"$SLUICE_BIN" serve --listen "127.0.0.1:$SLUICE" --config "$work/sluice.toml" \
  >"$work/gateway.log" 2>&1 & pids+=($!)
GATEWAY=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SLUICE/_sluice/readyz" >/dev/null && break; sleep 0.1; done
# The room's one credit goes to a first visitor: everyone after waits.
./target/release/examples/bench_tools join "http://127.0.0.1:$SLUICE" "$ROOM" >/dev/null 2>&1 || true

echo "streams bench: $N visitors, $PER_CONN per connection, windows of ${WINDOW}s, file limit $limit, $(nproc) cores shared by load and gateway" >&2
CLK_TCK=$(getconf CLK_TCK) timeout 900 ./target/release/examples/stream_bench \
  "http://127.0.0.1:$SLUICE" "$ROOM" "$ADMIN" "$GATEWAY" "$N" "$WINDOW" "$PER_CONN" | tee "$work/out.txt"
if grep -qE 'ERROR|panicked' "$work/gateway.log"; then
  echo "gateway log:" >&2; tail -20 "$work/gateway.log" >&2
fi
awk '/^summary/ { print "\nbound: an idle stream at most 4096 B; a fan-out to every stream within 1000 ms" }' "$work/out.txt"
