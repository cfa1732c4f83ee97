//! `sluice` on the system allocator, for heap profilers that follow
//! `malloc` (heaptrack, valgrind): the `sluice` binary links jemalloc,
//! whose calls they do not see. How the memory of an idle status stream
//! was taken apart (README "Measured", "Streams"):
//!
//! ```text
//! cargo build -p sluice-tests --example sysalloc_sluice
//! printf '#!/bin/sh\nexec heaptrack -o /tmp/ht/sluice %s "$@"\n' \
//!   "$PWD/target/debug/examples/sysalloc_sluice" > /tmp/ht.sh; chmod +x /tmp/ht.sh
//! SLUICE_BIN=/tmp/ht.sh tests/bench/streams.sh 2000 3   # (needs the release load tools)
//! # once it prints "with 2000 idle streams": kill -9 the sysalloc_sluice process, then
//! heaptrack_print -f /tmp/ht/sluice.zst -F stacks.txt --flamegraph-cost-type leaked
//! ```
//!
//! What was still allocated when it was killed is what the open streams
//! (and the queue before them) held, by call site.
fn main() -> std::process::ExitCode {
    sluice_gateway::tools::cli::main()
}
