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
