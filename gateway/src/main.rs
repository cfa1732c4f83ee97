//! The `sluice` binary: see `sluice --help`.

// mimalloc instead of the system allocator: a proxied request makes a few
// dozen small allocations (headers, bodies' frames, futures), and glibc's
// malloc/free took about an eighth of the gateway's CPU in `perf` profiles
// of tests/bench/proxy.sh.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sluice_gateway::cli::main()
}
