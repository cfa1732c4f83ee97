#!/usr/bin/env bash
# User-space instructions per proxied request, sluice against nginx
# `proxy_pass`, counted by valgrind's callgrind: unlike req/s or CPU time,
# the count does not move with the load of a shared machine, so it shows
# what a change to the proxied path costs or saves.
#   origin — an nginx `return 200` in a process of its own (not measured)
#   nginx  — nginx `proxy_pass` (keepalive upstream), one process, under callgrind
#   sluice — `sluice serve` (release build), under callgrind, on a path no
#            room guards
#   sluice-g — the same gateway on a path a room guards, with a valid
#            admission cookie on every request (the gate's work: routing,
#            cookie, token check, the revoke set, the renewal check)
#   nginx-g — nginx proxying that path, with that cookie, as any other
# Each proxy gets a warm-up, then its counters are zeroed, then wrk sends
# requests for a fixed time over 16 connections; the instructions counted
# in that window are divided by the requests wrk completed. Kernel work
# (the loopback TCP, most of a proxied request's cost) is not counted.
#
# Usage: tests/bench/proxy_instructions.sh [seconds=8]
#   SLUICE_BIN=path counts that build of `sluice` and builds nothing.
# Needs: valgrind, nginx, wrk (apt-get install valgrind nginx-light wrk).
# Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR="${1:-8}"
for tool in valgrind callgrind_control callgrind_annotate nginx wrk; do
  command -v "$tool" >/dev/null || { echo "$tool missing: apt-get install valgrind nginx-light wrk" >&2; exit 2; }
done

# The workspace's feature set, as tests/bench/lib.sh builds it (building
# `-p sluice-gateway` alone would build the shared crates a second time).
# SLUICE_BIN=path: count that build of `sluice` (an older commit's, for a
# before and after in one sitting) and build nothing.
if [ -z "${SLUICE_BIN:-}" ]; then
  cargo build --release -q --workspace --all-features --bin sluice
fi
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$work/origin.pid" ] && kill "$(cat "$work/origin.pid")" 2>/dev/null
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
# One process, no master: what callgrind runs is the worker itself.
cat > "$work/proxy.conf" <<CONF
daemon off; master_process off; worker_processes 1;
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
# sluice guards /guarded (the admitted visitor's path) and /queue; / is
# proxied straight through. The session lasts long enough that no renewal
# falls in the window (renewals are the rare case: once per half session).
cat > "$work/sluice.toml" <<CONF2
[[rooms]]
id = "default"
paths = ["/queue", "/guarded"]
rate_per_sec = 10
burst = 10
session_ttl = "1h"
CONF2
nginx -c "$work/origin.conf" -p "$work/origin"

count() { # name port path command... (WRK_HEADER: one extra request header)
  local name=$1 port=$2 path=$3; shift 3
  valgrind --tool=callgrind --callgrind-out-file="$work/$name.%p" "$@" >"$work/$name.log" 2>&1 &
  local vp=$!
  pids+=("$vp")
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.2; done
  # sluice stores its static files br/gzip-compressed on a thread of its
  # own at start (seconds under callgrind): asking for one waits for that,
  # which must not fall in the counted window.
  [ "$name" = nginx ] || curl -s -o /dev/null --max-time 600 "http://127.0.0.1:$port/_sluice/static/waiting.css"
  local h=()
  if [ -n "${ADMIT:-}" ]; then
    # An admission: the idle room lets the first visitor through on the spot.
    local cookie
    for _ in $(seq 300); do curl -sf -o /dev/null "http://127.0.0.1:$port/_sluice/readyz" && break; sleep 0.2; done
    cookie=$(curl -s -D - -o /dev/null "http://127.0.0.1:$port/guarded/" |
      sed -n 's/^[Ss]et-[Cc]ookie: \(sluice_a_default=[^;]*\).*/\1/p' | head -1)
    [ -n "$cookie" ] || { echo "no admission cookie from sluice" >&2; exit 1; }
    echo "$cookie" > "$work/cookie"
  fi
  [ -f "$work/cookie" ] && [ -n "${GUARDED:-}" ] && h=(-H "Cookie: $(cat "$work/cookie")")
  wrk -t1 -c16 -d3s "${h[@]}" "http://127.0.0.1:$port$path" >/dev/null
  callgrind_control -z "$vp" >/dev/null 2>&1
  local out; out=$(wrk -t1 -c16 -d"${DUR}s" "${h[@]}" "http://127.0.0.1:$port$path")
  callgrind_control -d "$vp" >/dev/null 2>&1
  sleep 1
  local n ir non2xx
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  [ -z "$non2xx" ] || { echo "$name: $non2xx answers were not 2xx" >&2; exit 1; }
  ir=$(callgrind_annotate "$(ls "$work/$name".*.1 | head -1)" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  [ -n "${KEEP_PROFILE:-}" ] && cp "$(ls "$work/$name".*.1 | head -1)" "$KEEP_PROFILE.$name"
  kill "$vp" 2>/dev/null; wait "$vp" 2>/dev/null || true
  awk -v ir="$ir" -v n="$n" 'BEGIN { printf "%.0f", ir / n }'
  printf '%-8s %8d requests under callgrind  %6.0f instructions/request\n' "$name" "$n" "$(awk -v ir="$ir" -v n="$n" 'BEGIN { print ir / n }')" >&2
}

SLUICE_BIN="${SLUICE_BIN:-${CARGO_TARGET_DIR:-./target}/release/sluice}"
n_ir=$(count nginx "$NGINX" / nginx -c "$work/proxy.conf" -p "$work/proxy")
s_ir=$(SLUICE_LOG=warn SLUICE_IO_THREADS=2 count sluice "$SLUICE" / "$SLUICE_BIN" serve \
  --listen "127.0.0.1:$SLUICE" --origin "http://127.0.0.1:$ORIGIN" --config "$work/sluice.toml")
# The guarded path: a gateway of its own (fresh counters), its admission
# taken before the warm-up; then nginx proxying the same path with the same
# cookie (a request some 400 bytes longer for both).
G=$(port)
g_ir=$(ADMIT=1 GUARDED=1 SLUICE_LOG=warn SLUICE_IO_THREADS=2 count sluice-g "$G" /guarded/x "$SLUICE_BIN" serve \
  --listen "127.0.0.1:$G" --origin "http://127.0.0.1:$ORIGIN" --config "$work/sluice.toml")
m_ir=$(GUARDED=1 count nginx-g "$NGINX" /guarded/x nginx -c "$work/proxy.conf" -p "$work/proxy")
awk -v s="$s_ir" -v n="$n_ir" -v g="$g_ir" -v m="$m_ir" 'BEGIN {
  printf "user-space instructions per proxied request: sluice %d, nginx %d (ratio %.2f)\n", s, n, s / n
  printf "guarded path (admission cookie on every request): sluice %d, nginx %d (ratio %.2f); guarded/unguarded sluice %.2f\n", g, m, g / m, g / s }'
