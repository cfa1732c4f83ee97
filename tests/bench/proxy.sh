#!/usr/bin/env bash
# Proxy throughput and tail latency, in one run, on this machine:
#   origin  — an nginx `return 200` in a process of its own (the ceiling)
#   nginx   — another nginx, `proxy_pass` (keepalive upstream) to that origin
#   sluice  — `sluice serve` (release build) in front of the same origin,
#             on an unguarded path (straight to the proxy) and on a path a
#             room guards, with a valid admission cookie on every request
#             (the gate's work: canonical request, routing, token check
#             through the cache, the revoke set, renewal check)
# The origin runs in its own process for both proxies: an nginx proxying
# to a server block of its own worker would skip the cross-process wakeup
# every real proxy pays (and that sluice paid in earlier versions of this
# bench). The proxying nginx gets as many workers as sluice gets I/O
# threads (SLUICE_BENCH_WORKERS, default: every core).
# Load: wrk over loopback, closed loop, fixed connections and duration.
# Prints requests/s, p99 and CPU per request for each run, the sluice/nginx
# ratios of each round, and their medians.
#
# Usage: tests/bench/proxy.sh [seconds=10] [connections=64] [rounds=5]
# Needs: nginx, wrk (apt-get install nginx-light wrk). Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR="${1:-10}"
CONNS="${2:-64}"
ROUNDS="${3:-5}"
THREADS=1
WORKERS="${SLUICE_BENCH_WORKERS:-$(nproc)}"
command -v nginx >/dev/null || { echo "nginx missing: apt-get install nginx-light" >&2; exit 2; }
command -v wrk >/dev/null || { echo "wrk missing: apt-get install wrk" >&2; exit 2; }

cargo build --release -q -p sluice-gateway
work=$(mktemp -d)
cleanup() {
  for pid in "$work"/*.pid; do [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null; done
  [ -n "${SLUICE_PID:-}" ] && kill "$SLUICE_PID" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ORIGIN=$(port); NGINX=$(port); SLUICE=$(port)

mkdir -p "$work/origin" "$work/proxy"
cat > "$work/origin.conf" <<CONF
worker_processes 1;
pid $work/origin.pid;
error_log $work/origin/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 127.0.0.1:$ORIGIN; location / { return 200 "hello from the origin\n"; } }
}
CONF
cat > "$work/proxy.conf" <<CONF
worker_processes $WORKERS;
pid $work/proxy.pid;
error_log $work/proxy/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream origin { server 127.0.0.1:$ORIGIN; keepalive 256; }
  server {
    listen 127.0.0.1:$NGINX;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    }
  }
}
CONF
nginx -c "$work/origin.conf" -p "$work/origin"
nginx -c "$work/proxy.conf" -p "$work/proxy"

# sluice guards /guarded (the admitted visitor's path) and /queue; / is
# proxied straight through.
cat > "$work/sluice.toml" <<CONF
[[rooms]]
id = "default"
paths = ["/queue", "/guarded"]
rate_per_sec = 10
burst = 10
session_ttl = "1h"
CONF
# In a session of its own, as each nginx is once it has become a daemon: with
# the scheduler's autogroups (Linux's default for desktop and many server
# kernels, /proc/sys/kernel/sched_autogroup_enabled), a server started from
# this script would share one group's CPU share with wrk, which starves the
# load generator while that server is measured (sluice paid for it, about
# 5% of throughput, until this line).
SLUICE_LOG=warn SLUICE_IO_THREADS="$WORKERS" setsid "${CARGO_TARGET_DIR:-./target}/release/sluice" serve --listen "127.0.0.1:$SLUICE" \
  --origin "http://127.0.0.1:$ORIGIN" --config "$work/sluice.toml" >/dev/null 2>&1 &
SLUICE_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SLUICE/_sluice/healthz" >/dev/null && break; sleep 0.1; done
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SLUICE/_sluice/readyz" >/dev/null && break; sleep 0.1; done
# An admission: the idle room lets the first visitor through on the spot.
ADMISSION=$(curl -s -D - -o /dev/null "http://127.0.0.1:$SLUICE/guarded/" |
  sed -n 's/^[Ss]et-[Cc]ookie: \(sluice_a_default=[^;]*\).*/\1/p' | head -1)
[ -n "$ADMISSION" ] || { echo "no admission cookie from sluice" >&2; exit 1; }

# CPU time (user + system, in clock ticks) of processes: stable under a
# noisy machine where req/s is not, so the bench also reports CPU per request.
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))

run() { # name url pids-of-the-measured-server... (WRK_HEADER: one extra request header)
  local name=$1 url=$2; shift 2
  local h=(); [ -n "${WRK_HEADER:-}" ] && h=(-H "$WRK_HEADER")
  wrk -t"$THREADS" -c"$CONNS" -d2s "${h[@]}" "$url" >/dev/null 2>&1 # warm-up
  local c0; c0=$(cpu_ticks "$@")
  local out; out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DUR}s" --latency "${h[@]}" "$url")
  local c1; c1=$(cpu_ticks "$@")
  local rps p99 total us
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  us=$(awk -v t="$(( (c1 - c0) * TICK_US ))" -v n="$total" 'BEGIN { printf "%.1f", t / n }')
  printf '%-8s %12s req/s   p99 %-9s %s µs CPU/request\n' "$name" "$rps" "$p99" "$us" >&2
  echo "$rps $p99 $us"
}
to_ms() { awk -v v="$1" 'BEGIN{ if (v ~ /us$/) {sub(/us/,"",v); print v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v); print v} else {sub(/s/,"",v); print v*1000} }'; }

echo "wrk: ${CONNS} connections, ${DUR}s, $THREADS thread; $(nproc) cores shared by load and servers; nginx workers = sluice I/O threads = $WORKERS; $ROUNDS rounds" >&2
ORIGIN_WORKER=$(pgrep -P "$(cat "$work/origin.pid")" | head -1)
PROXY_WORKERS=$(pgrep -P "$(cat "$work/proxy.pid")" | tr '\n' ' ')
read -r o_rps o_p99 o_us < <(run origin "http://127.0.0.1:$ORIGIN/" "$ORIGIN_WORKER")
# Rounds of both proxies, the first one to run alternating, so a noisy
# spell on this shared machine lands on one round of one proxy rather than
# on every measurement of the one that always runs last. Each round gives
# ratios; the median round is the figure.
ratios="$work/ratios"
: > "$ratios"
for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then
    # shellcheck disable=SC2086 # one pid per worker
    read -r n_rps n_p99 n_us < <(run nginx "http://127.0.0.1:$NGINX/" $PROXY_WORKERS)
    read -r s_rps s_p99 s_us < <(run sluice "http://127.0.0.1:$SLUICE/" "$SLUICE_PID")
  else
    read -r s_rps s_p99 s_us < <(run sluice "http://127.0.0.1:$SLUICE/" "$SLUICE_PID")
    # shellcheck disable=SC2086
    read -r n_rps n_p99 n_us < <(run nginx "http://127.0.0.1:$NGINX/" $PROXY_WORKERS)
  fi
  # the guarded path: nginx proxies it as any other; sluice checks the
  # admission cookie every request carries
  read -r g_rps g_p99 g_us < <(WRK_HEADER="Cookie: $ADMISSION" run sluice-g "http://127.0.0.1:$SLUICE/guarded/x" "$SLUICE_PID")
  read -r m_rps m_p99 m_us < <(WRK_HEADER="Cookie: $ADMISSION" run nginx-g "http://127.0.0.1:$NGINX/guarded/x" $PROXY_WORKERS)
  awk -v s="$s_rps" -v n="$n_rps" -v sp="$(to_ms "$s_p99")" -v np="$(to_ms "$n_p99")" \
      -v su="$s_us" -v nu="$n_us" -v r="$round" \
      -v g="$g_rps" -v m="$m_rps" -v gp="$(to_ms "$g_p99")" -v mp="$(to_ms "$m_p99")" -v gu="$g_us" -v mu="$m_us" 'BEGIN {
    printf "round %d: throughput %.2f, p99 %.2f vs %.2f ms (%.2f), CPU/request %.1f vs %.1f µs (%.2f)\n", r, s/n, sp, np, sp/np, su, nu, su/nu > "/dev/stderr"
    printf "round %d, guarded: throughput %.2f, p99 %.2f vs %.2f ms (%.2f), CPU/request %.1f vs %.1f µs (%.2f); guarded/unguarded sluice CPU %.2f\n", r, g/m, gp, mp, gp/mp, gu, mu, gu/mu, gu/su > "/dev/stderr"
    printf "%f %f %f %f %f %f %f %f %f %f %f\n", s/n, sp/np, su/nu, s, n, sp, np, g/m, gp/mp, gu/mu, gu/su }' >> "$ratios"
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
t=$(awk '{print $1}' "$ratios" | median)
p=$(awk '{print $2}' "$ratios" | median)
c=$(awk '{print $3}' "$ratios" | median)
gt=$(awk '{print $8}' "$ratios" | median)
gp=$(awk '{print $9}' "$ratios" | median)
gc=$(awk '{print $10}' "$ratios" | median)
gs=$(awk '{print $11}' "$ratios" | median)
awk -v t="$t" -v p="$p" -v c="$c" -v n="$ROUNDS" -v gt="$gt" -v gp="$gp" -v gc="$gc" -v gs="$gs" 'BEGIN {
  printf "median of %d rounds: sluice/nginx throughput %.2f, p99 ratio %.2f (under 1: sluice better), CPU per request ratio %.2f\n", n, t, p, c
  printf "guarded path (admission cookie on every request): sluice/nginx throughput %.2f, p99 ratio %.2f, CPU per request ratio %.2f; guarded/unguarded sluice CPU per request %.2f\n", gt, gp, gc, gs }'
