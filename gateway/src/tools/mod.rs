//! The `sluice` command line and the tools beside the server.
//!
//! - [`cli`] — the command line (`serve`, `check-config`, `keygen`, …).
//! - [`demo_origin`] — the built-in demo shop `sluice serve` starts without
//!   an origin.
//! - [`health`] — `sluice health URL`, a probe client for container health
//!   checks (the image has no curl).
//! - [`ledger_cmd`] — `sluice ledger`, the process writing the reservation
//!   streams into PostgreSQL (the `sluice-ledger` crate).
//!
//! Behind the `tools` feature (on by default):
//!
//! - `admin_cli` — `sluice admin`, a client of the admin API.
//! - `simulate` — `sluice simulate`, the queue in virtual time.
//! - `swarm/` — `sluice swarm`, a bounded crowd of real visitors: the flags,
//!   the crowd, one visitor's journey, the HTTP client, the ledger of holds
//!   (nobody oversold, nobody above the cart limit) and the report.
//!
//! The tools are a feature of this crate rather than a crate of their own
//! because the gateway crate owns the `sluice` binary and its one command
//! line: a second crate would either own the binary (and the server's
//! `serve` with it) or give the operator a second binary. The feature keeps
//! what only the tools link (plotters, png, a bundled font, indicatif) out
//! of the server's dependency tree: `--no-default-features` builds the
//! server alone, as the fuzz crate does, and a `sluice` binary without the
//! three tool subcommands.

#[cfg(feature = "tools")]
pub mod admin_cli;
pub mod cli;
pub mod demo_origin;
pub mod health;
pub mod ledger_cmd;
#[cfg(feature = "tools")]
pub mod simulate;
#[cfg(feature = "tools")]
pub mod swarm;

#[cfg(feature = "tools")]
pub(crate) use failure::{Failure, failure, usage};

/// How `simulate` and `swarm` fail: a message and an exit status.
#[cfg(feature = "tools")]
mod failure {
    use std::process::ExitCode;

    /// Exit status of bad flags or input (as a bad config).
    pub(crate) const EXIT_USAGE: u8 = 64;

    /// A subcommand's failure, with the exit status it maps to.
    #[derive(Debug)]
    pub(crate) struct Failure {
        pub code: u8,
        pub message: String,
    }

    impl Failure {
        /// Prints `sluice: COMMAND: message` and answers the exit status.
        pub(crate) fn exit(self, command: &str) -> ExitCode {
            eprintln!("sluice: {command}: {}", self.message);
            ExitCode::from(self.code)
        }
    }

    /// Bad flags or input (exit 64).
    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    /// The run itself failed (exit 1).
    pub(crate) fn failure(message: impl Into<String>) -> Failure {
        Failure {
            code: 1,
            message: message.into(),
        }
    }
}
