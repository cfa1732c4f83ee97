#!/usr/bin/env bash
# TLS termination, sluice against nginx, in one run on this machine:
#   origin  — an nginx serving a small static file over plain HTTP, in a
#             process of its own
#   nginx   — another nginx terminating TLS (`ssl`, h2 and http/1.1 by
#             ALPN) and proxying (keepalive upstream) to that origin
#   sluice  — `sluice serve --tls-cert/--tls-key` (release build) in front
#             of the same origin, on a path no room guards (straight to the
#             proxy)
# Both present the same certificate (ECDSA P-256, made here by openssl)
# and get as many workers/I/O threads (SLUICE_BENCH_WORKERS, default:
# every core).
# Two loads, wrk over HTTPS (HTTP/1.1), closed loop:
#   keep-alive     — fixed connections, many requests each
#   new handshake  — `Connection: close`: a full TLS handshake per request
# Prints requests/s and p99 of each run and the sluice/nginx ratios (the
# median over the rounds, each round alternating which server goes first).
#
# Usage: tests/bench/tls.sh [seconds=10] [connections=64] [rounds=3]
# SLUICE_BIN: a sluice binary to use instead of building one.
# Needs: nginx, wrk, openssl (apt-get install nginx-light wrk openssl).
# Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR="${1:-10}"
CONNS="${2:-64}"
ROUNDS="${3:-3}"
THREADS=1
WORKERS="${SLUICE_BENCH_WORKERS:-$(nproc)}"
for tool in nginx wrk openssl; do
  command -v "$tool" >/dev/null || { echo "$tool missing: apt-get install nginx-light wrk openssl" >&2; exit 2; }
done

if [ -z "${SLUICE_BIN:-}" ]; then
  cargo build --release -q -p sluice-gateway --bin sluice
  SLUICE_BIN="${CARGO_TARGET_DIR:-./target}/release/sluice"
fi
work=$(mktemp -d)
cleanup() {
  for pid in "$work"/*.pid; do [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null; done
  [ -n "${SLUICE_PID:-}" ] && kill "$SLUICE_PID" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ORIGIN=$(port); NGINX=$(port); SLUICE=$(port)

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

mkdir -p "$work/origin/www" "$work/proxy"
printf 'hello from the origin\n' > "$work/origin/www/index.html"
# nginx's workers run as an unprivileged user: the file must be readable.
chmod 755 "$work" "$work/origin" "$work/origin/www"
chmod 644 "$work/origin/www/index.html"
cat > "$work/origin.conf" <<CONF
worker_processes 1;
pid $work/origin.pid;
error_log $work/origin/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 127.0.0.1:$ORIGIN; root $work/origin/www; }
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
    # (the listen parameter, not \`http2 on\`: Debian's nginx predates 1.25.1)
    listen 127.0.0.1:$NGINX ssl http2;
    ssl_certificate $work/cert.pem;
    ssl_certificate_key $work/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    keepalive_requests 100000;
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

# A room guards /queue only: / goes straight to the proxy.
cat > "$work/sluice.toml" <<CONF
[[rooms]]
id = "default"
paths = ["/queue"]
CONF
# In a session of its own, as each nginx daemon is (see proxy.sh: the
# scheduler's autogroups would otherwise share one CPU share with wrk).
SLUICE_LOG=warn SLUICE_IO_THREADS="$WORKERS" setsid "$SLUICE_BIN" serve --listen "127.0.0.1:$SLUICE" \
  --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" \
  --origin "http://127.0.0.1:$ORIGIN" --config "$work/sluice.toml" >/dev/null 2>&1 &
SLUICE_PID=$!
for _ in $(seq 100); do curl -skf "https://127.0.0.1:$SLUICE/_sluice/readyz" >/dev/null && break; sleep 0.1; done
curl -skf "https://127.0.0.1:$SLUICE/" | grep -q "hello from the origin" || { echo "sluice does not reach the origin" >&2; exit 1; }
curl -skf "https://127.0.0.1:$NGINX/" | grep -q "hello from the origin" || { echo "nginx does not reach the origin" >&2; exit 1; }

run() { # name url [extra wrk args...]
  local name=$1 url=$2; shift 2
  wrk -t"$THREADS" -c"$CONNS" -d2s "$@" "$url" >/dev/null 2>&1 # warm-up
  local out; out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DUR}s" --latency "$@" "$url")
  local rps p99 errors
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  errors=$(awk '/Socket errors|Non-2xx/ {printf "%s ", $0}' <<<"$out")
  printf '%-18s %12s req/s   p99 %-9s %s\n' "$name" "$rps" "$p99" "$errors" >&2
  echo "$rps $p99"
}
to_ms() { awk -v v="$1" 'BEGIN{ if (v ~ /us$/) {sub(/us/,"",v); print v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v); print v} else {sub(/s/,"",v); print v*1000} }'; }

echo "wrk over HTTPS: ${CONNS} connections, ${DUR}s, $THREADS thread; $(nproc) cores shared by load and servers; nginx workers = sluice I/O threads = $WORKERS; $ROUNDS rounds" >&2
ratios="$work/ratios"
: > "$ratios"
pair() { # label extra-wrk-args... ; prints "sluice_rps sluice_p99 nginx_rps nginx_p99"
  local label=$1; shift
  local s n
  if (( round % 2 )); then
    n=$(run "nginx $label" "https://127.0.0.1:$NGINX/" "$@")
    s=$(run "sluice $label" "https://127.0.0.1:$SLUICE/" "$@")
  else
    s=$(run "sluice $label" "https://127.0.0.1:$SLUICE/" "$@")
    n=$(run "nginx $label" "https://127.0.0.1:$NGINX/" "$@")
  fi
  echo "$s $n"
}
for round in $(seq "$ROUNDS"); do
  read -r ks kp kn knp < <(pair keep-alive)
  read -r hs hp hn hnp < <(pair new-handshake -H "Connection: close")
  awk -v r="$round" -v ks="$ks" -v kn="$kn" -v kp="$(to_ms "$kp")" -v knp="$(to_ms "$knp")" \
      -v hs="$hs" -v hn="$hn" -v hp="$(to_ms "$hp")" -v hnp="$(to_ms "$hnp")" 'BEGIN {
    printf "round %d: keep-alive throughput %.2f, p99 %.2f vs %.2f ms (%.2f); new handshake throughput %.2f, p99 %.2f vs %.2f ms (%.2f)\n", r, ks/kn, kp, knp, kp/knp, hs/hn, hp, hnp, hp/hnp > "/dev/stderr"
    printf "%f %f %f %f\n", ks/kn, kp/knp, hs/hn, hp/hnp }' >> "$ratios"
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
kt=$(awk '{print $1}' "$ratios" | median)
kp=$(awk '{print $2}' "$ratios" | median)
ht=$(awk '{print $3}' "$ratios" | median)
hp=$(awk '{print $4}' "$ratios" | median)
awk -v kt="$kt" -v kp="$kp" -v ht="$ht" -v hp="$hp" -v n="$ROUNDS" 'BEGIN {
  printf "median of %d rounds, sluice/nginx: keep-alive throughput %.2f, p99 ratio %.2f; new handshake throughput %.2f, p99 ratio %.2f (p99 under 1: sluice better)\n", n, kt, kp, ht, hp }'
