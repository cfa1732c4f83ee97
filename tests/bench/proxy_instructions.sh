#!/usr/bin/env bash
# User-space instructions per proxied request, sluice against nginx
# `proxy_pass`, counted by valgrind's callgrind: unlike req/s or CPU time,
# the count does not move with the load of a shared machine, so it shows
# what a change to the proxied path costs or saves.
#   origin — an nginx `return 200` in a process of its own (not measured)
#   nginx  — nginx `proxy_pass` (keepalive upstream), one process, under callgrind
#   sluice — `sluice serve` (release build), under callgrind
# Each proxy gets a warm-up, then its counters are zeroed, then wrk sends
# requests for a fixed time over 16 connections; the instructions counted
# in that window are divided by the requests wrk completed. Kernel work
# (the loopback TCP, most of a proxied request's cost) is not counted.
#
# Usage: tests/bench/proxy_instructions.sh [seconds=8]
# Needs: valgrind, nginx, wrk (apt-get install valgrind nginx-light wrk).
# Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR="${1:-8}"
for tool in valgrind callgrind_control callgrind_annotate nginx wrk; do
  command -v "$tool" >/dev/null || { echo "$tool missing: apt-get install valgrind nginx-light wrk" >&2; exit 2; }
done

cargo build --release -q -p sluice-gateway
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
printf '[[rooms]]\nid = "default"\npaths = ["/queue"]\n' > "$work/sluice.toml"
nginx -c "$work/origin.conf" -p "$work/origin"

count() { # name port command...
  local name=$1 port=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$work/$name.%p" "$@" >"$work/$name.log" 2>&1 &
  local vp=$!
  pids+=("$vp")
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.2; done
  wrk -t1 -c16 -d3s "http://127.0.0.1:$port/" >/dev/null
  callgrind_control -z "$vp" >/dev/null 2>&1
  local out; out=$(wrk -t1 -c16 -d"${DUR}s" "http://127.0.0.1:$port/")
  callgrind_control -d "$vp" >/dev/null 2>&1
  sleep 1
  local n ir
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  ir=$(callgrind_annotate "$(ls "$work/$name".*.1 | head -1)" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  kill "$vp" 2>/dev/null; wait "$vp" 2>/dev/null || true
  awk -v ir="$ir" -v n="$n" 'BEGIN { printf "%.0f", ir / n }'
  printf '%-7s %8d requests under callgrind  %6.0f instructions/request\n' "$name" "$n" "$(awk -v ir="$ir" -v n="$n" 'BEGIN { print ir / n }')" >&2
}

n_ir=$(count nginx "$NGINX" nginx -c "$work/proxy.conf" -p "$work/proxy")
s_ir=$(SLUICE_LOG=warn SLUICE_IO_THREADS=2 count sluice "$SLUICE" "${CARGO_TARGET_DIR:-./target}/release/sluice" serve \
  --listen "127.0.0.1:$SLUICE" --origin "http://127.0.0.1:$ORIGIN" --config "$work/sluice.toml")
awk -v s="$s_ir" -v n="$n_ir" 'BEGIN { printf "user-space instructions per proxied request: sluice %d, nginx %d (ratio %.2f)\n", s, n, s / n }'
