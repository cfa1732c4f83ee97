//! The `sluice` binary: see `sluice --help`.

// jemalloc instead of glibc's malloc: a proxied request makes a few dozen
// small allocations, often freed on another worker thread, and glibc's
// malloc with its arena locks took about an eighth of the gateway's CPU in
// `perf` profiles of tests/bench/proxy.sh (throughput against nginx 0.53 →
// 0.64). mimalloc was as fast but grew the peak memory of a streamed
// upload by 8–15 MiB (tests/proxy.rs).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    sluice_gateway::tools::cli::main()
}
