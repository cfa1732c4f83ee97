#!/usr/bin/env bash
# Bounded fuzz run of every target: SECONDS each (default 60), stable
# toolchain (`-s none`: no sanitizer, which needs nightly). New inputs that
# grow coverage are written back to corpus/TARGET (commit the useful ones);
# a crash fails the run and leaves its input in artifacts/TARGET.
#
#   fuzz/run.sh 60        # CI
#   fuzz/run.sh 600 token_verify
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(token_verify challenge_verify control_bodies config_parse front_heads origin_heads)
fi
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install cargo-fuzz" >&2; exit 2; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "== $t: ${secs}s"
  cargo fuzz run -s none --release "$t" "corpus/$t" -- \
    -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
