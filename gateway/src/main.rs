//! The `sluice` binary: see `sluice --help`.

fn main() -> std::process::ExitCode {
    sluice_gateway::cli::main()
}
