//! The operator's side: the admin dashboard (the admin API's handlers are
//! routed in [`crate::app`]).
//!
//! - [`dashboard`] — the admin dashboard page and its audit log view.

pub mod dashboard;
