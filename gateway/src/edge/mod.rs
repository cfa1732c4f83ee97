//! The edge: where a downstream connection comes in and each request is
//! put in the one form every later decision, and the origin, will see.
//!
//! - [`server`] — the listener, I/O threads, connections, graceful drain,
//!   and `answer`, where every request (either HTTP/1 server, or h2) starts.
//! - [`canonical`] — one spelling of each path and host.
//! - [`client_ip`] — the downstream client's address.
//! - [`tls`] — TLS termination (`[server.tls]`): certificates by SNI,
//!   ALPN, reload.
//!
//! The HTTP/1.1 wire code the server runs is the `sluice-wire` crate's:
//! [`sluice_wire::front`] reads and answers plain GET and HEAD requests
//! before hyper, and [`sluice_wire::watch`] keeps a connection's header and
//! origin deadlines, one timer each.

pub mod canonical;
pub mod client_ip;
pub mod server;
pub mod stall;
pub mod tls;
