#!/usr/bin/env bash
# The ledger's throughput in rows/s against a plain COPY and a batched
# INSERT of the same rows by psql into the same throwaway PostgreSQL, in
# one run; then the ledger's lag during a sale at a target rate.
#
# Usage: tests/bench/ledger.sh [fill-holds] [sale-rate] [sale-seconds]
#   defaults: 100000 20000 20
#
# Loopback only, bounded, nothing of the machine's own: a redis-server and
# a PostgreSQL cluster (initdb + pg_ctl from /usr/lib/postgresql/*/bin, as
# the postgres user when root) of its own on free ports, in a temporary
# directory, with PostgreSQL's default durability (fsync and synchronous
# commit on). Steps:
#
# 1. throughput: tests/examples/ledger_load.rs takes N holds on event
#    `bench-tp` with no ledger running (each then paid, failed, released or
#    left: about 2 stream entries a hold); then `sluice ledger --batch 500`
#    starts (LEDGER_BATCH overrides the batch) and the time until its lag is zero gives rows/s (one
#    hold_transitions row per entry; it writes holds, payments and the
#    events row besides). The same rows are then exported and written by
#    psql into a copy of the table (same indexes and unique keys): with
#    `\copy` (COPY), and as INSERTs of 500 rows each, one transaction per
#    statement (pg_dump --inserts --rows-per-insert=500).
# 2. lag: with the ledger running, ledger_load holds at RATE per second for
#    S seconds on event `bench-sale` and samples the ledger's lag each
#    second (entries not yet recorded, age of the oldest).
#
# Prints the figures and the ratios. Everything it started is stopped on
# exit. Needs: cargo, redis-server, postgresql (server), psql, pg_dump,
# python3. BENCH_CARGO_ARGS is passed to cargo build (e.g.
# "--config profile.release.lto=false" for a quicker build).
set -euo pipefail

N=${1:-100000}
RATE=${2:-20000}
SECS=${3:-20}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$(mktemp -d -t sluice-ledger-bench.XXXXXX)"
PIDS=()
PGBIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[ -x "$PGBIN/pg_ctl" ] || { echo "no PostgreSQL server under /usr/lib/postgresql" >&2; exit 1; }
AS=()
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); fi

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  "${AS[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
calc() { python3 -c "print($1)"; }

# shellcheck disable=SC2086
(cd "$ROOT" && cargo build --release -q -p sluice-gateway --bin sluice -p sluice-tests --example ledger_load ${BENCH_CARGO_ARGS:-})
SLUICE="$TARGET/release/sluice"
LOAD="$TARGET/release/examples/ledger_load"

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null 2>&1 &
PIDS+=($!)
REDIS="redis://127.0.0.1:$RPORT/"

PGPORT=$(free_port)
mkdir -p "$WORK/pg"
[ ${#AS[@]} -gt 0 ] && chown -R postgres:postgres "$WORK"
"${AS[@]}" "$PGBIN/initdb" -A trust -U postgres -E UTF8 -D "$WORK/pg" >/dev/null
"${AS[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" \
  -o "-p $PGPORT -k $WORK -c listen_addresses=127.0.0.1" -w start >/dev/null
PG="postgres://postgres@127.0.0.1:$PGPORT/postgres"
PSQL=("$PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$PG")
sleep 0.3

echo "== 1. throughput: $N holds written to the stream with no ledger running"
"$LOAD" "$REDIS" bench-tp fill "$N"
start_ledger() {
  SLUICE_LOG=warn "$SLUICE" ledger --redis "$REDIS" --postgres "$PG" --batch "${LEDGER_BATCH:-500}" --flush-ms 50 &
  LEDGER=$!
  PIDS+=("$LEDGER")
}
T0=$(now)
start_ledger
"$LOAD" "$REDIS" bench-tp wait >/dev/null
T1=$(now)
ROWS=$("${PSQL[@]}" -c "SELECT count(*) FROM hold_transitions WHERE event = 'bench-tp'")
LEDGER_S=$(calc "$T1 - $T0")
LEDGER_RPS=$(calc "round($ROWS / $LEDGER_S)")
echo "ledger: $ROWS rows in ${LEDGER_S}s (start, migrations and catch-up) = $LEDGER_RPS rows/s"

"${PSQL[@]}" -c "\\copy (SELECT * FROM hold_transitions WHERE event = 'bench-tp') TO '$WORK/rows.csv' CSV"
"${PSQL[@]}" -c "CREATE TABLE bench_copy (LIKE hold_transitions INCLUDING ALL)"
T0=$(now)
"${PSQL[@]}" -c "\\copy bench_copy FROM '$WORK/rows.csv' CSV"
T1=$(now)
COPY_S=$(calc "$T1 - $T0")
COPY_RPS=$(calc "round($ROWS / $COPY_S)")
echo "psql COPY: $ROWS rows in ${COPY_S}s = $COPY_RPS rows/s"

"$PGBIN/pg_dump" -d "$PG" --data-only --inserts --rows-per-insert=500 -t bench_copy > "$WORK/inserts.sql"
"${PSQL[@]}" -c "TRUNCATE bench_copy"
T0=$(now)
"${PSQL[@]}" -f "$WORK/inserts.sql" >/dev/null
T1=$(now)
INS_S=$(calc "$T1 - $T0")
INS_RPS=$(calc "round($ROWS / $INS_S)")
echo "psql INSERT (500 rows a statement): $ROWS rows in ${INS_S}s = $INS_RPS rows/s"
echo "ratio ledger/COPY = $(calc "round($LEDGER_RPS / $COPY_RPS, 2)"), ledger/INSERT = $(calc "round($LEDGER_RPS / $INS_RPS, 2)")"

echo "== 2. lag during a sale at $RATE holds/s for ${SECS}s (ledger running)"
"$LOAD" "$REDIS" bench-sale sale "$RATE" "$SECS"
SALE_ROWS=$("${PSQL[@]}" -c "SELECT entries, drift_units FROM events WHERE event = 'bench-sale'")
echo "ledger recorded (entries|drift_units): $SALE_ROWS"
kill -TERM "$LEDGER"
wait "$LEDGER" && echo "sluice ledger: exit 0 on SIGTERM"
