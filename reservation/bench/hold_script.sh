#!/usr/bin/env bash
# Drives reservation/lua/hold.lua directly with redis-benchmark (EVALSHA),
# the baseline the gateway's HTTP holds are compared against.
#
# Usage: reservation/bench/hold_script.sh [host] [port] [requests] [clients] [pipeline]
#   defaults: 127.0.0.1 6379 200000 50 1
# Needs redis-cli and redis-benchmark. Uses the event `bench` (its keys are
# deleted first). Every request is a distinct visitor (__rand_int__), qty 1,
# on stock that never runs out and a cart limit that never trips: the same
# script path as a successful hold through RedisInventory.
set -euo pipefail
HOST=${1:-127.0.0.1}
PORT=${2:-6379}
N=${3:-200000}
C=${4:-50}
P=${5:-1}
LUA="$(cd "$(dirname "$0")/../lua" && pwd)"
CLI=(redis-cli -h "$HOST" -p "$PORT")
EV=bench
K=("sluice:{$EV}:stock" "sluice:{$EV}:meta" "sluice:{$EV}:deadlines" "sluice:{$EV}:visitors" "sluice:{$EV}:stream")

"${CLI[@]}" DEL "${K[@]}" >/dev/null
# Stock: 10^12 units, cart limit 10^6, hold TTL 10 min, version now.
"${CLI[@]}" EVAL "$(cat "$LUA/common.lua" "$LUA/set_stock.lua")" 5 "${K[@]}" \
  100000 "$EV" 1000000000000 1000000 600000 "$(date +%s)" default >/dev/null
SHA=$("${CLI[@]}" SCRIPT LOAD "$(cat "$LUA/common.lua" "$LUA/hold.lua")")
echo "hold.lua sha1 $SHA" >&2

# KEYS: the five event keys + the hold hash; ARGV: maxlen, event, visitor,
# qty, suffix, lazy-reap max, idempotency TTL ms, retention ms.
redis-benchmark -h "$HOST" -p "$PORT" -n "$N" -c "$C" -P "$P" -r 100000000 --csv \
  EVALSHA "$SHA" 6 "${K[@]}" "sluice:{$EV}:hold:__rand_int__" \
  100000 "$EV" "visitor-__rand_int__" 1 "h__rand_int__" 64 86400000 604800000

"${CLI[@]}" EVAL "$(cat "$LUA/common.lua" "$LUA/read.lua")" 5 "${K[@]}" 100000 "$EV" 0 >&2
