#!/usr/bin/env bash
# What a Lua closure costs Redis on every call of a script: every `local
# function` of a script (common.lua's fifteen, hold.lua's own) is made
# anew each time the script runs, with an upvalue for each enclosing local
# it uses. Four made-up scripts, each with 30 locals and `return 1`:
#   none      no function
#   bare      20 functions that use no local
#   one-each  20 functions that use one local each
#   eight     20 functions that use eight locals each
#   wide      1 function that uses all 30
# and for each the instructions per EVALSHA inside redis-server, counted
# by callgrind as hold_compare.sh counts them ((after 2,500 calls - after
# 500) / 2,000). Counted, not timed. Written to explain why a lone hold
# costs more since hold.lua's body became a function (README, "Holds sent
# together").
#
# Usage: reservation/bench/lua_closures.sh
# Loopback only; starts its own redis-server under valgrind on a free port
# for each count and stops it. Needs: redis-server, redis-cli,
# redis-benchmark, valgrind (callgrind_annotate), python3.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../tests/bench/lib.sh"
bench_init lua-closures
for tool in redis-server redis-cli redis-benchmark valgrind callgrind_annotate python3; do
  command -v "$tool" >/dev/null || { echo "$tool missing" >&2; exit 2; }
done

python3 - "$WORK" <<'PY'
import sys
w = sys.argv[1]
locs = "\n".join(f"local v{i} = KEYS[1]" for i in range(30))
cat = lambda *vs: " .. ".join(f"v{v % 30}" for v in vs)
variants = {
    "none": "",
    "bare": "\n".join(f"local function f{j}() return 1 end" for j in range(20)),
    "one-each": "\n".join(f"local function f{j}() return v{j} end" for j in range(20)),
    "eight": "\n".join(f"local function f{j}() return {cat(*range(j, j + 8))} end" for j in range(20)),
    "wide": "local function g() return " + cat(*range(30)) + " end",
}
for name, body in variants.items():
    open(f"{w}/{name}.lua", "w").write(f"{locs}\n{body}\nreturn 1\n")
PY

# Instructions inside a fresh redis-server after N calls of SCRIPT.
count() {
  local script=$1 n=$2 out="$WORK/cg.out"
  rm -f "$out"
  start_redis valgrind --tool=callgrind --callgrind-out-file="$out"
  local sha
  sha=$(redis-cli -p "$RPORT" SCRIPT LOAD "$(cat "$script")")
  redis-benchmark -p "$RPORT" -n "$n" -c 4 -q EVALSHA "$sha" 1 k >/dev/null
  redis-cli -p "$RPORT" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$REDIS_PID" 2>/dev/null || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

printf '%-10s %s\n' script instructions_per_call
for name in none bare one-each eight wide; do
  a=$(count "$WORK/$name.lua" 500)
  b=$(count "$WORK/$name.lua" 2500)
  printf '%-10s %d\n' "$name" $(((b - a) / 2000))
done
