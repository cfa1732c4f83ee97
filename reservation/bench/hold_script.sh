#!/usr/bin/env bash
# Drives reservation/lua/hold.lua directly with redis-benchmark (EVALSHA),
# the baseline the gateway's HTTP holds are compared against.
#
# Usage: reservation/bench/hold_script.sh [host] [port] [requests] [clients] [pipeline] [stock]
#   defaults: 127.0.0.1 6379 200000 50 1 requests/2
# Needs redis-cli and redis-benchmark. Uses the event `bench` (its keys are
# deleted first) with a finite stock (default: half the requests), so the
# run sells it out: the first calls take the successful-hold path, the rest
# the sold-out path, as in a real sale. Every request is a hold of qty 1 by
# a random visitor (`visitor-` + 12 digits) with a random hold suffix
# (`AAAAAAAAAA` + 12 digits: 22 base64url characters, the shape of a real
# one). hold.lua reads the suffix from the hold key (KEYS[8]) and the
# visitor from the visitor key (KEYS[9]), so each is one `__rand_int__` and
# they cannot disagree (redis-benchmark draws every placeholder on its own).
#
# Prints redis-benchmark's CSV on stdout, then on stderr a line
# `CPU evalsha_usec_per_call=…` (Redis's own accounting, INFO
# commandstats, reset before the run: the script's cost inside Redis,
# less moved than requests/s by other load on a shared machine) and one
# line `STATE total=… available=… held=… confirmed=… oversold=…` from
# read.lua (oversold = held + confirmed - total, must be 0).
# HOLD_BATCH=n (default 1) sends n holds per call in hold.lua's mode
# 'many' (the gateway's holds sent together): requests/s are then calls/s,
# and a last line `CPU usec_per_hold=…` divides Redis's time per call by n.
# HOLD_VISITORS=n: returning visitors instead, for counting (not timed):
# the REQUESTS calls (mode 'many', HOLD_BATCH holds each) go through
# `redis-cli --pipe`, each hold by one of n visitors, with a cart limit
# that never trips, so each visitor's index grows to REQUESTS x
# HOLD_BATCH / n holds (the knee's load, tests/bench/holds_knee.sh: 2,000
# visitors holding hundreds of times each). Every visitor above is new:
# a cost that grows with a visitor's index does not show there.
# HOLD_LUA_DIR (default reservation/lua) drives another copy of the
# scripts: a before/after comparison in one run (a copy of the old
# scripts from `git show`).
set -euo pipefail
HOST=${1:-127.0.0.1}
PORT=${2:-6379}
N=${3:-200000}
C=${4:-50}
P=${5:-1}
STOCK=${6:-$((N / 2))}
LUA="${HOLD_LUA_DIR:-$(cd "$(dirname "$0")/../lua" && pwd)}"
BATCH=${HOLD_BATCH:-1}
CLI=(redis-cli -h "$HOST" -p "$PORT")
EV=bench
K=("sluice:{$EV}:stock" "sluice:{$EV}:meta" "sluice:{$EV}:deadlines" "sluice:{$EV}:visitors" "sluice:{$EV}:stream" "sluice:{$EV}:ledgered" "sluice:{$EV}:vcats")

"${CLI[@]}" DEL "${K[@]}" "sluice:loaded:{$EV}" >/dev/null
# Stock: $STOCK units, cart limit 4 (with HOLD_VISITORS: a million),
# hold TTL 10 min, version now, no categories.
CART=4
[ -n "${HOLD_VISITORS:-}" ] && CART=1000000
"${CLI[@]}" EVAL "$(cat "$LUA/common.lua" "$LUA/set_stock.lua")" 8 "${K[@]}" "sluice:loaded:{$EV}" \
  100000 "$EV" "$STOCK" "$CART" 600000 "$(date +%s)" default 0 0 0 >/dev/null
SHA=$("${CLI[@]}" SCRIPT LOAD "$(cat "$LUA/common.lua" "$LUA/hold.lua")")
echo "hold.lua sha1 $SHA" >&2

# KEYS: the seven event keys (common.lua's), the hold hash, the visitor's hold index
# (`vholds:{len}:{visitor}`, len 20 = "visitor-" + 12 digits); ARGV:
# maxlen, event, qty, lazy-reap max, idempotency TTL ms, retention ms, 'q'
# (a bare qty: the event has no categories), no items, and the layout the
# caller routed by ('1': a plain event). Without that last one hold.lua
# answers RESHARDED before doing anything: the figure measured nothing.
"${CLI[@]}" CONFIG RESETSTAT >/dev/null
if [ -n "${HOLD_VISITORS:-}" ]; then
  python3 - "$SHA" "$N" "$BATCH" "$HOLD_VISITORS" "$EV" <<'PY' | "${CLI[@]}" --pipe >/dev/null
import random, sys
sha, calls, batch, visitors, ev = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = random.Random(1)
common = [f"sluice:{{{ev}}}:{k}" for k in ("stock", "meta", "deadlines", "visitors", "stream", "ledgered", "vcats")]
out = sys.stdout.buffer
n = 0
for _ in range(calls):
    keys, args = list(common), ["100000", ev, "many", "64", "86400000", "604800000", str(batch), "", "1"]
    for _ in range(batch):
        n += 1
        v = f"visitor-{rng.randrange(visitors):012d}"
        keys += [f"sluice:{{{ev}}}:hold:AAAAAAAAAA{n:012d}", f"sluice:{{{ev}}}:vholds:{len(v)}:{v}"]
        args += ["1", "q", "", "2"]
    cmd = ["EVALSHA", sha, str(len(keys))] + keys + args
    out.write(b"*%d\r\n" % len(cmd))
    for a in cmd:
        a = a.encode()
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
PY
elif [ "$BATCH" -le 1 ]; then
  redis-benchmark -h "$HOST" -p "$PORT" -n "$N" -c "$C" -P "$P" -r 100000000 --csv \
    EVALSHA "$SHA" 9 "${K[@]}" "sluice:{$EV}:hold:AAAAAAAAAA__rand_int__" \
    "sluice:{$EV}:vholds:20:visitor-__rand_int__" \
    100000 "$EV" 1 64 86400000 604800000 q "" 1
else
  # Mode 'many': BATCH holds per call, each with its two keys and its four
  # arguments (qty, 'q', no items, 2 keys); N calls, so N x BATCH holds.
  HK=()
  HA=()
  for _ in $(seq 1 "$BATCH"); do
    HK+=("sluice:{$EV}:hold:AAAAAAAAAA__rand_int__" "sluice:{$EV}:vholds:20:visitor-__rand_int__")
    HA+=(1 q "" 2)
  done
  redis-benchmark -h "$HOST" -p "$PORT" -n "$N" -c "$C" -P "$P" -r 100000000 --csv \
    EVALSHA "$SHA" $((7 + 2 * BATCH)) "${K[@]}" "${HK[@]}" \
    100000 "$EV" many 64 86400000 604800000 "$BATCH" "" 1 "${HA[@]}"
fi

"${CLI[@]}" INFO commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/CPU evalsha_usec_per_call=\1/p' >&2
"${CLI[@]}" INFO commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p' |
  awk -v b="$BATCH" '{printf "CPU usec_per_hold=%.1f (holds per call %d)\n", $1 / b, b}' >&2

# read.lua's KEYS[8] is the event's transfers out (shard.lua): none here.
STATE=$("${CLI[@]}" EVAL "$(cat "$LUA/common.lua" "$LUA/read.lua")" 8 "${K[@]}" "sluice:{$EV}:xout" 100000 "$EV" 1000000)
python3 - "$STATE" >&2 <<'PY'
import sys
# redis-cli prints one array element per line: STATE total cart ttl version room held confirmed available
f = sys.argv[1].split("\n")
total, held, confirmed, available = int(f[1]), int(f[6]), int(f[7]), int(f[8])
print(f"STATE total={total} available={available} held={held} confirmed={confirmed} "
      f"oversold={held + confirmed - total}")
PY
