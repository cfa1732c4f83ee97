//! The edge: where a downstream connection comes in and each request is
//! put in the one form every later decision, and the origin, will see.
//!
//! - [`server`] — the listener, I/O threads, connections, graceful drain,
//!   and `answer`, where every request (either HTTP/1 server, or h2) starts.
//! - [`watch`] — a connection's header and origin deadlines, one timer each.
//! - [`front`] — HTTP/1.1 from the client for plain GET and HEAD requests.
//! - [`canonical`] — one spelling of each path and host.
//! - [`client_ip`] — the downstream client's address.

pub mod canonical;
pub mod client_ip;
pub mod front;
pub mod server;
pub mod watch;
