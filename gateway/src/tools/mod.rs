//! The `sluice` command line and the tools beside the server.
//!
//! - [`cli`] — the command line (`serve`, `check-config`, `keygen`, …).
//! - [`admin_cli`] — `sluice admin`, a client of the admin API.
//! - [`simulate`] — `sluice simulate`, the queue in virtual time.
//! - [`swarm`] — `sluice swarm`, a bounded crowd of real visitors.
//! - [`demo_origin`] — the built-in demo shop `sluice serve` starts without
//!   an origin.

pub mod admin_cli;
pub mod cli;
pub mod demo_origin;
pub mod simulate;
pub mod swarm;

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
