#!/usr/bin/env bash
# Two builds of sluice against each other, in one run, on the paths a change
# touches: the unguarded path (straight to the proxy) and a guarded one with
# a valid admission cookie on every request. For "what did this change
# cost": build the baseline from an older commit into a target dir of its
# own, e.g.
#   git worktree add /tmp/base <rev> && (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo build --release -p sluice-gateway)
#   tests/bench/proxy_ab.sh /tmp/base-target/release/sluice target/release/sluice
# Origin: an nginx `return 200` in a process of its own. Load: wrk over
# loopback, closed loop; rounds alternate which build runs first; prints
# each run, the new/base ratios of each round and their medians.
#
# Usage: tests/bench/proxy_ab.sh BASE NEW [seconds=8] [connections=64] [rounds=5]
# Needs: nginx, wrk. Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE="$1"; NEW="$2"
DUR="${3:-8}"; CONNS="${4:-64}"; ROUNDS="${5:-5}"
WORKERS="${SLUICE_BENCH_WORKERS:-$(nproc)}"
command -v nginx >/dev/null || { echo "nginx missing" >&2; exit 2; }
command -v wrk >/dev/null || { echo "wrk missing" >&2; exit 2; }
work=$(mktemp -d)
pids=()
cleanup() {
  [ -f "$work/origin.pid" ] && kill "$(cat "$work/origin.pid")" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ORIGIN=$(port)
mkdir -p "$work/origin"
cat > "$work/origin.conf" <<CONF
worker_processes 1;
pid $work/origin.pid;
error_log $work/origin/error.log warn;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:$ORIGIN; location / { return 200 "hello from the origin\n"; } } }
CONF
nginx -c "$work/origin.conf" -p "$work/origin"
cat > "$work/sluice.toml" <<CONF
[[rooms]]
id = "default"
paths = ["/queue", "/guarded"]
rate_per_sec = 10
burst = 10
session_ttl = "1h"
CONF
start() { # binary -> "port pid cookie"
  local p; p=$(port)
  SLUICE_LOG=warn SLUICE_IO_THREADS="$WORKERS" setsid "$1" serve --listen "127.0.0.1:$p" \
    --origin "http://127.0.0.1:$ORIGIN" --config "$work/sluice.toml" >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$p/_sluice/readyz" >/dev/null && break; sleep 0.1; done
  local c; c=$(curl -s -D - -o /dev/null "http://127.0.0.1:$p/guarded/" |
    sed -n 's/^[Ss]et-[Cc]ookie: \(sluice_a_default=[^;]*\).*/\1/p' | head -1)
  [ -n "$c" ] || { echo "no admission cookie from $1" >&2; exit 1; }
  echo "$p $pid $c"
}
read -r B_PORT B_PID B_COOKIE < <(start "$BASE"); pids+=("$B_PID")
read -r N_PORT N_PID N_COOKIE < <(start "$NEW"); pids+=("$N_PID")
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))
run() { # name url pid [header]
  local name=$1 url=$2 pid=$3; local h=(); [ -n "${4:-}" ] && h=(-H "$4")
  wrk -t1 -c"$CONNS" -d2s "${h[@]}" "$url" >/dev/null 2>&1
  local c0; c0=$(cpu_ticks "$pid")
  local out; out=$(wrk -t1 -c"$CONNS" -d"${DUR}s" --latency "${h[@]}" "$url")
  local c1; c1=$(cpu_ticks "$pid")
  local rps total us
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  us=$(awk -v t="$(( (c1 - c0) * TICK_US ))" -v n="$total" 'BEGIN { printf "%.1f", t / n }')
  printf '%-12s %12s req/s   %s µs CPU/request\n' "$name" "$rps" "$us" >&2
  echo "$rps $us"
}
echo "wrk: $CONNS connections, ${DUR}s; $(nproc) cores; I/O threads $WORKERS; $ROUNDS rounds" >&2
: > "$work/r"
for round in $(seq "$ROUNDS"); do
  order=(base new); (( round % 2 )) || order=(new base)
  for who in "${order[@]}"; do
    if [ "$who" = base ]; then
      read -r bu_r bu_c < <(run base "http://127.0.0.1:$B_PORT/" "$B_PID")
      read -r bg_r bg_c < <(run base-g "http://127.0.0.1:$B_PORT/guarded/x" "$B_PID" "Cookie: $B_COOKIE")
    else
      read -r nu_r nu_c < <(run new "http://127.0.0.1:$N_PORT/" "$N_PID")
      read -r ng_r ng_c < <(run new-g "http://127.0.0.1:$N_PORT/guarded/x" "$N_PID" "Cookie: $N_COOKIE")
    fi
  done
  awk -v a="$nu_r" -v b="$bu_r" -v c="$nu_c" -v d="$bu_c" -v e="$ng_r" -v f="$bg_r" -v g="$ng_c" -v h="$bg_c" -v r="$round" 'BEGIN {
    printf "round %d: unguarded new/base throughput %.2f, CPU/request %.2f; guarded throughput %.2f, CPU/request %.2f\n", r, a/b, c/d, e/f, g/h > "/dev/stderr"
    printf "%f %f %f %f\n", a/b, c/d, e/f, g/h }' >> "$work/r"
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf 'median of %d rounds, new/base: unguarded throughput %.2f, CPU/request %.2f; guarded throughput %.2f, CPU/request %.2f\n' "$ROUNDS" \
  "$(awk '{print $1}' "$work/r" | median)" "$(awk '{print $2}' "$work/r" | median)" \
  "$(awk '{print $3}' "$work/r" | median)" "$(awk '{print $4}' "$work/r" | median)"
