#!/usr/bin/env bash
# What a pending wave schedule costs a hold: drives reservation/lua/hold.lua
# with redis-benchmark (EVALSHA, as hold_script.sh does) on an event
# without waves, then on the same event with 96 waves pending (a day of
# one every 15 minutes, all ahead: every hold checks `wave_next`), then
# with a wave coming due during the run (released once, by whichever hold
# meets it first). Same server, same run; prints each run's requests per
# second and its ratio to the baseline, then checks nothing was oversold
# and the due wave was released exactly once.
#
# Usage: reservation/bench/waves.sh [host] [port] [requests] [clients]
#   defaults: 127.0.0.1 6379 100000 50. Loopback only; stops by itself.
set -euo pipefail
HOST=${1:-127.0.0.1}
PORT=${2:-6379}
N=${3:-100000}
C=${4:-50}
LUA="$(cd "$(dirname "$0")/../lua" && pwd)"
CLI=(redis-cli -h "$HOST" -p "$PORT")
EV=wavebench
K=("sluice:{$EV}:stock" "sluice:{$EV}:meta" "sluice:{$EV}:deadlines" "sluice:{$EV}:visitors" "sluice:{$EV}:stream" "sluice:{$EV}:ledgered" "sluice:{$EV}:vcats")
SHA=$("${CLI[@]}" SCRIPT LOAD "$(cat "$LUA/common.lua" "$LUA/hold.lua")")

# A fresh event of N units (never sold out: every call takes the hold path).
reset() {
  "${CLI[@]}" DEL "${K[@]}" "sluice:loaded:{$EV}" >/dev/null
  "${CLI[@]}" EVAL "$(cat "$LUA/common.lua" "$LUA/set_stock.lua")" 8 "${K[@]}" "sluice:loaded:{$EV}" \
    100000 "$EV" "$N" 4 600000 "$(date +%s)" default 0 0 0 >/dev/null
}

# schedule FIRST_AT_MS COUNT GAP_MS: COUNT waves of 10 units.
schedule() {
  local args=() at=$1
  for _ in $(seq "$2"); do args+=("$at" 10 ""); at=$((at + $3)); done
  "${CLI[@]}" EVAL "$(cat "$LUA/common.lua" "$LUA/schedule_waves.lua")" 7 "${K[@]}" \
    100000 "$EV" "$2" "${args[@]}" | head -1 >&2
}

rps() {
  redis-benchmark -h "$HOST" -p "$PORT" -n "$N" -c "$C" -r 100000000 --csv \
    EVALSHA "$SHA" 9 "${K[@]}" "sluice:{$EV}:hold:AAAAAAAAAA__rand_int__" \
    "sluice:{$EV}:vholds:20:visitor-__rand_int__" \
    10000000 "$EV" 1 64 86400000 604800000 q | tail -1 | cut -d, -f2 | tr -d '"'
}

now_ms() { echo $(( $("${CLI[@]}" TIME | head -1) * 1000 )); }

reset; base=$(rps)
reset; schedule $(( $(now_ms) + 900000 )) 96 900000; ahead=$(rps)
reset; schedule $(( $(now_ms) + 1000 )) 1 1; due=$(rps)
waves=$("${CLI[@]}" XRANGE "sluice:{$EV}:stream" - + | grep -c '^wave$' || true)
total=$("${CLI[@]}" HGET "sluice:{$EV}:meta" total)
held=$("${CLI[@]}" HGET "sluice:{$EV}:meta" held)
python3 - "$base" "$ahead" "$due" "$waves" "$total" "$held" "$N" <<'PY'
import sys
base, ahead, due = (float(x) for x in sys.argv[1:4])
waves, total, held, n = (int(x) for x in sys.argv[4:8])
print(f"no waves           {base:10.0f} holds/s  1.00")
print(f"96 waves ahead     {ahead:10.0f} holds/s  {ahead / base:.2f}")
print(f"a wave due mid-run {due:10.0f} holds/s  {due / base:.2f}")
print(f"due wave released {waves} time(s) (want 1); total {total} = {n} + 10: "
      f"{'ok' if total == n + 10 and waves == 1 else 'WRONG'}; oversold {max(0, held - total)}")
PY
