#!/usr/bin/env bash
# Soak: two gateways on one local redis-server under `sluice swarm` at about
# twice the admission rate, for a given number of minutes; is memory flat,
# is anything oversold, does anything fail beyond overload answers?
#
# Usage: tests/bench/soak.sh [minutes]        (default 10)
#   RATE=20         admissions per second of the room
#   CONCURRENCY    visitors in flight at most (bounds the crowd); default
#                  RATE × 60 × minutes + 20 s of arrivals: the line grows
#                  by RATE/s for the whole run, so the offered load stays
#                  twice the admission rate to the end
#   REQ_RATE=2000   requests/s cap of the whole crowd
#   FLAT_PCT=20     largest RSS growth (%) that still counts as flat ...
#   FLAT_MIB=4      ... or largest growth in MiB (either suffices)
#   TOKEN_CACHE=2000  limits.token_cache_entries of the gateways (bounded
#                   cache that would otherwise fill for the whole run)
#                   Flatness compares the mean RSS of the last third of the
#                   samples taken after warm-up (t >= 20 s) with the mean of
#                   the middle third: growth that has levelled off passes,
#                   growth that goes on to the end fails. A couple of MiB of
#                   allocator noise on a 10 MiB process (+20 %) passes by the
#                   absolute slack. With fewer than 3 warm samples the first
#                   and last warm samples are compared instead.
#
# Loopback only, bounded: starts redis-server on a free port, two
# `sluice serve` (release) on it sharing the PoW secret, the signing key, the
# admin token and the webhook secret, and one event whose holds lapse after
# 30 s (stock comes back and is sold again). `sluice swarm` sends visitors at
# 2 × RATE per second (open loop, at most CONCURRENCY at once) over both
# gateways round-robin for the given minutes (hard stop); each solves,
# joins, polls, holds, pays 30 % of its holds through the signed webhook and
# releases or abandons the rest. Every 10 s the resident memory (VmRSS from
# /proc/PID/status) of each gateway is sampled. Prints the RSS series, the
# swarm report and a verdict; exits 1 when the verdict fails. Everything it
# started is stopped on exit.
# Needs: cargo, redis-server, redis-cli, python3.
set -euo pipefail

MINUTES=${1:-10}
case "$MINUTES" in
  '' | *[!0-9]*) echo "usage: $0 [minutes]" >&2; exit 64 ;;
esac
if [ "$MINUTES" -lt 1 ] || [ "$MINUTES" -gt 240 ]; then
  echo "minutes: 1 to 240" >&2
  exit 64
fi
RATE=${RATE:-20}
REQ_RATE=${REQ_RATE:-2000}
FLAT_PCT=${FLAT_PCT:-20}
FLAT_MIB=${FLAT_MIB:-4}
ARRIVALS=$((RATE * 2))
CONCURRENCY=${CONCURRENCY:-$((RATE * 60 * MINUTES + ARRIVALS * 20))}
VISITORS=$((ARRIVALS * 60 * MINUTES))
# enough stock that the sale runs the whole soak (lapsed holds come back)
TOTAL=$((MINUTES * 2000 + 1000))
WEBHOOK=soak-webhook-secret-0123456789
POW=soak-pow-secret-0123456789abcdef
source "$(dirname "$0")/lib.sh"
bench_init soak
# bench_init's admin token is the benches'; the soak has its own.
ADMIN=soak-admin-token-0123456789

rss_kb() {
  awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0
}

build_release
start_redis

"$SLUICE" keygen --out "$WORK/keys" >/dev/null 2>&1
cat >"$WORK/sluice.toml" <<EOF
listen = "127.0.0.1:0"

# The verified-token cache is bounded (100,000 entries by default, about
# 40 MB when full): a 10-minute soak would spend its whole run filling it,
# which looks like a leak. A small bound fills in the first minute, so what
# grows after that is not the cache.
[limits]
token_cache_entries = ${TOKEN_CACHE:-2000}

[[rooms]]
id = "default"
rate_per_sec = $RATE
burst = $RATE
join_limit_per_prefix_per_min = 0
puzzles = 2
difficulty_floor_bits = 4
difficulty_ceiling_bits = 6
attack_min_solve = "0s"

[[events]]
id = "soak"
room = "default"
total = $TOTAL
cart_limit = 4
hold_ttl = "30s"
EOF

GW_PIDS=()
GW_URLS=()
for n in 1 2; do
  "$SLUICE" serve --config "$WORK/sluice.toml" --redis "redis://127.0.0.1:$RPORT/" --load-stock \
    --admin-token "$ADMIN" --webhook-secret "$WEBHOOK" --pow-secret "$POW" \
    --keys-dir "$WORK/keys" >"$WORK/gw$n.out" 2>"$WORK/gw$n.err" &
  pid=$!
  PIDS+=("$pid")
  GW_PIDS+=("$pid")
  url=""
  for _ in $(seq 200); do
    url=$(sed -n 's#^sluice listening on \(http://[^/ ]*\)/.*#\1#p' "$WORK/gw$n.out" | head -1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$WORK/gw$n.err" >&2; exit 1; }
    sleep 0.05
  done
  [ -n "$url" ] || { echo "gateway $n did not start" >&2; exit 1; }
  GW_URLS+=("$url")
  echo "   gateway $n: $url (pid $pid)" >&2
done

echo "== soak: $MINUTES min, $ARRIVALS visitors/s arriving (room admits $RATE/s), at most $CONCURRENCY in flight" >&2
RSS="$WORK/rss.tsv"
printf 't_s\tgw1_kb\tgw2_kb\n' >"$RSS"
(
  t=0
  while :; do
    printf '%s\t%s\t%s\n' "$t" "$(rss_kb "${GW_PIDS[0]}")" "$(rss_kb "${GW_PIDS[1]}")" >>"$RSS"
    echo "   t=${t}s rss gw1 $(rss_kb "${GW_PIDS[0]}") kB, gw2 $(rss_kb "${GW_PIDS[1]}") kB" >&2
    sleep 10
    t=$((t + 10))
  done
) &
SAMPLER=$!
PIDS+=("$SAMPLER")

set +e
"$SLUICE" swarm --url "${GW_URLS[0]}" --url "${GW_URLS[1]}" --event soak \
  --visitors "$VISITORS" --concurrency "$CONCURRENCY" --arrival-rate "$ARRIVALS" \
  --rate "$REQ_RATE" --duration "${MINUTES}m" --max-poll-ms 20000 --pay-ratio 0.3 \
  --webhook-secret "$WEBHOOK" --admin-token "$ADMIN" --json \
  >"$WORK/report.json" 2>"$WORK/swarm.err"
SWARM_RC=$?
set -e
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
END_T=$(($(tail -1 "$RSS" | cut -f1) + 10))
printf '%s\t%s\t%s\n' "$END_T" "$(rss_kb "${GW_PIDS[0]}")" "$(rss_kb "${GW_PIDS[1]}")" >>"$RSS"
for n in 1 2; do
  kill -0 "${GW_PIDS[$((n - 1))]}" 2>/dev/null || echo "!! gateway $n died" >&2
done
if [ ! -s "$WORK/report.json" ]; then
  echo "swarm produced no report (exit $SWARM_RC):" >&2
  cat "$WORK/swarm.err" >&2
  exit 1
fi

python3 - "$RSS" "$WORK/report.json" "$SWARM_RC" "$FLAT_PCT" "$FLAT_MIB" <<'PY'
import json, sys

rss_path, report_path, swarm_rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
flat_pct, flat_mib = float(sys.argv[4]), float(sys.argv[5])
rows = [l.split("\t") for l in open(rss_path).read().split("\n")[1:] if l.strip()]
rows = [(int(t), int(a), int(b)) for t, a, b in rows]
r = json.load(open(report_path))

print("RSS (MiB) every 10 s")
print("  t_s   gw1     gw2")
for t, a, b in rows:
    print(f"  {t:>4}  {a/1024:6.1f}  {b/1024:6.1f}")

# warm-up: the first 20 s (pools, caches and allocator arenas filling) do
# not count. Flat: the mean of the last third of the warm samples is at most
# flat_pct % or flat_mib MiB above the mean of the middle third (one noisy
# sample cannot fail the run; steady growth to the end does).
warm = [row for row in rows if row[0] >= 20] or rows
if len(warm) >= 3:
    third = len(warm) // 3
    middle = warm[third:len(warm) - third]
    tail = warm[len(warm) - third:]
    span = f"mean t={middle[0][0]}-{middle[-1][0]}s to t={tail[0][0]}-{tail[-1][0]}s"
else:
    middle, tail = warm[:1], warm[-1:]
    span = f"t={middle[0][0]}s to t={tail[0][0]}s"
growth, growth_mib, flat = [], [], []
for i in (1, 2):
    before = sum(row[i] for row in middle) / len(middle)
    after = sum(row[i] for row in tail) / len(tail)
    g = (after - before) / before * 100 if before else float("inf")
    mib = (after - before) / 1024
    growth.append(g)
    growth_mib.append(mib)
    flat.append(g <= flat_pct or mib <= flat_mib)
first, last = warm[0], rows[-1]

print()
print("swarm report")
keys = ["stopped_by", "elapsed_seconds", "visitors", "started", "finished", "unfinished",
        "joined", "admitted", "sold_out_visitors", "failed_visitors", "holds", "units_held",
        "units_confirmed", "units_released", "units_lapsed_before_payment",
        "units_left_to_expire", "peak_units_outstanding", "oversold", "oversold_by_answers",
        "oversold_by_stock", "above_cart_limit", "idempotency_mismatches", "requests",
        "requests_per_sec"]
for k in keys:
    print(f"  {k:<28}{r.get(k)}")
print(f"  {'stock':<28}{json.dumps(r.get('stock'))}")
print(f"  {'errors':<28}{json.dumps(r.get('errors'))}")
print(f"  {'http_errors':<28}{json.dumps(r.get('http_errors'))}")
print(f"  {'transport_errors':<28}{r.get('transport_errors')}")
print("  latency (ms)                count      p50      p99")
for ep, l in r.get("latency_ms", {}).items():
    print(f"    {ep:<26}{l['count']:>7} {l['p50_ms']:>8.1f} {l['p99_ms']:>8.1f}")

# overload answers (429/503) are allowed; sold_out and cart_limit_exceeded
# are the sale's own refusals, not failures
allowed_codes = {"rate_limited", "store_unavailable", "overloaded",
                 "inventory_not_ready", "sold_out", "cart_limit_exceeded"}
bad_codes = {k: v for k, v in r.get("errors", {}).items() if k not in allowed_codes}
bad_http = {k: v for k, v in r.get("http_errors", {}).items() if k not in ("429", "503")}
stock = r.get("stock") or {}
checks = [
    (f"memory flat within {flat_pct:g}% or {flat_mib:g} MiB (gw1 {growth[0]:+.1f}% / "
     f"{growth_mib[0]:+.1f} MiB, gw2 {growth[1]:+.1f}% / {growth_mib[1]:+.1f} MiB, {span}; "
     f"first warm to last sample: gw1 {first[1]/1024:.1f} -> {last[1]/1024:.1f} MiB, "
     f"gw2 {first[2]/1024:.1f} -> {last[2]/1024:.1f} MiB)", all(flat)),
    (f"oversold 0 (got {r.get('oversold')})", r.get("oversold") == 0),
    (f"above cart limit 0 (got {r.get('above_cart_limit')})", r.get("above_cart_limit") == 0),
    (f"store invariant holds ({stock.get('invariant_holds')})", stock.get("invariant_holds") is True),
    (f"no errors beyond 429/503 (codes {bad_codes or 'none'}, other statuses {bad_http or 'none'}, "
     f"transport {r.get('transport_errors')})",
     not bad_codes and not bad_http and r.get("transport_errors") == 0),
    (f"visitors admitted ({r.get('admitted')})", (r.get("admitted") or 0) > 0),
    (f"swarm exit status 0 (got {swarm_rc})", swarm_rc == 0),
]
print()
print("verdict")
ok = True
for text, good in checks:
    ok &= good
    print(f"  [{'ok' if good else 'FAIL'}] {text}")
print("  => " + ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
