# Start-up pieces shared by the gateway benches (holds.sh, holds_knee.sh,
# surge.sh, joins.sh, feeds.sh, soak.sh): sourced, never run. Loopback
# only; everything started is recorded in PIDS and stopped, and WORK
# removed, on exit.
#
# After `bench_init NAME`: ROOT, BENCH, WORK, TARGET; then
#   start_redis [PREFIX…]    -> RPORT (its pid in REDIS_PID), run under
#                               PREFIX if given (valgrind …)
#   start_sluice CONFIG      -> GPORT, BASE (its pid in SLUICE_PID), with the
#                               admin token ADMIN, on that Redis, --load-stock
#   admin CURL-ARGS…         -> curl with the admin token and JSON
#   cpu_ticks PID            -> utime + stime of PID, in clock ticks
#   build_release EXAMPLE…   -> release `sluice` and the examples (checks these)

bench_init() {
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  BENCH="$ROOT/tests/bench"
  WORK="$(mktemp -d -t "sluice-$1.XXXXXX")"
  ADMIN=bench-admin-token-0123456789
  PIDS=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

build_release() {
  # One build for every bench: the release `sluice` and all the examples,
  # with the workspace's features unified as `--workspace --all-features`
  # unifies them. Building `-p sluice-gateway` alone would pick another
  # feature set for the shared crates and build them all a second time
  # (a slow build on a small machine). The arguments name the examples a
  # script needs (documentation only: every example is built).
  # SLUICE_BIN=path: measure that build of `sluice` (e.g. an older
  # commit's, for a before/after in one sitting) and build nothing; the
  # examples are the target directory's.
  if [ -z "${SLUICE_BIN:-}" ]; then
    echo "== building (release)" >&2
    (cd "$ROOT" && cargo build --release -q --workspace --all-features --bin sluice --examples)
  fi
  TARGET="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  SLUICE="${SLUICE_BIN:-$TARGET/release/sluice}"
  local e
  for e in "$@"; do
    [ -x "$TARGET/release/examples/$e" ] || { echo "no example $e" >&2; return 1; }
  done
}

start_redis() { # [command prefix…, e.g. valgrind --tool=callgrind …]
  echo "== redis-server" >&2
  RPORT=$(free_port)
  "$@" redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --protected-mode no >"$WORK/redis-$RPORT.log" 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  # under valgrind a start takes seconds
  for _ in $(seq 300); do
    redis-cli -p "$RPORT" PING 2>/dev/null | grep -q PONG && break
    sleep 0.05
  done
  redis-cli -p "$RPORT" PING | grep -q PONG
}

start_sluice() { # CONFIG [more serve flags…]
  echo "== sluice serve" >&2
  local config=$1
  shift
  GPORT=$(free_port)
  BASE="http://127.0.0.1:$GPORT"
  # In a session of its own (tests/bench/proxy.sh says why: with the
  # scheduler's autogroups, a server started from this script would share
  # one group's CPU share with the load generator).
  SLUICE_LOG=warn setsid "$SLUICE" serve --config "$config" --listen "127.0.0.1:$GPORT" \
    --redis "redis://127.0.0.1:$RPORT/" --load-stock --admin-token "$ADMIN" "$@" >"$WORK/sluice.log" 2>&1 &
  SLUICE_PID=$!
  PIDS+=("$SLUICE_PID")
  for _ in $(seq 200); do
    curl -fs "$BASE/_sluice/readyz" >/dev/null 2>&1 && break
    sleep 0.05
  done
  curl -fs "$BASE/_sluice/readyz" >/dev/null
}

admin() { curl -s -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' "$@"; }

cpu_ticks() {
  # fields 14 and 15 of /proc/PID/stat (after the parenthesised name)
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

# The room of the hold benches: admits at once, asks for almost no work,
# and no per-visitor hold limit (the load rotates through a few thousand
# visitors at thousands of holds a second). Extra TOML may follow in $2.
# DIRECT_CALLS=false in the environment sends the holds through the router
# (`server.direct_calls`), for a before and after with one build.
holds_config() {
  cat >"$1" <<TOML
[server]
direct_calls = ${DIRECT_CALLS:-true}

# The load rotates through the tokens at thousands of holds a second: far
# past the per-visitor limit (60 a minute by default) these benches do not
# measure.
[limits]
holds_per_visitor_per_min = 0

[[rooms]]
id = "default"
rate_per_sec = 100000
burst = 100000
puzzles = 1
difficulty_floor_bits = 1
difficulty_ceiling_bits = 2
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
${2:-}
TOML
}
