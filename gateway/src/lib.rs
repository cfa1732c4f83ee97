//! # sluice-gateway
//!
//! The gateway of sluice: an HTTP front (hyper 1 + tower, HTTP/1.1 and h2c)
//! that stands between downstream visitors and the upstream origin, and
//! wires the domain crates (`sluice-pow`, `sluice-admission`,
//! `sluice-reservation`) to the network.
//!
//! ## Life of a request
//!
//! ```text
//!  downstream ──▶ accept ──▶ header timeout ──▶ ClientInfo (trusted proxies)
//!      │                                          │
//!      │                        /_sluice/… ◀──────┴──────▶ anything else
//!      │                  control plane (JSON,                │
//!      │                  problem+json errors,          admission gate
//!      │                  no-store, body limit)               │
//!      │                                           proxy ──▶ upstream origin
//!      ◀──────────────────── response (hop-by-hop removed) ◀──┘
//! ```
//!
//! 1. **Accept.** [`server::serve`] accepts a TCP connection and hands it
//!    to the I/O thread (an event loop of its own, one per core) with the
//!    fewest connections open; the connection stays there, with the
//!    upstream connections it uses. A client that sends no request head
//!    within the header timeout is dropped (slowloris).
//! 2. **Client.** [`client_ip::ClientInfo`] decides who the client is: the
//!    TCP peer, or, behind a trusted load balancer, the address it reports.
//! 3. **Route.** Paths under `/_sluice/` are the gateway's own endpoints
//!    ([`app`]); every other path belongs to the origin.
//! 4. **Forward.** [`proxy::Proxy`] streams the request upstream over a
//!    pooled connection, with forwarding headers set and hop-by-hop and
//!    client-sent `Sluice-*` headers removed, and streams the answer back.
//!
//! ## Modules
//! - [`config`] — TOML configuration, flags and environment, validation.
//! - [`server`] — listener, I/O threads, connections, header timeout,
//!   graceful shutdown.
//! - [`app`] — routes, layers, shared state.
//! - [`proxy`] — the reverse proxy.
//! - [`upstream`] — the pooled connections to the origin.
//! - [`front`] — HTTP/1.1 from the client for plain GET and HEAD requests.
//! - [`h1`] — HTTP/1.1 toward the origin for requests without a body.
//! - [`watch`] — a connection's header and origin deadlines, one timer each.
//! - [`canonical`] — one spelling of each path and host (the canonical
//!   request every decision and the origin see).
//! - [`client_ip`] — the downstream client's address.
//! - [`problem`] — problem+json errors (the one place faults become HTTP).
//! - [`rooms`] — the waiting rooms, their snapshots and the ticker.
//! - [`schedule`] — scheduled openings: times, seeds, the pre-queue draw's
//!   place map and `sluice prequeue-verify`.
//! - [`gate`] — the admission gate in front of the proxy.
//! - [`adaptive`] — adaptive admission: the rate steered by the origin's latency.
//! - [`visitor`] — challenge, join, status, public room state, JWKS.
//! - [`reserve`] — events, holds, the payment webhook, event admin.
//! - [`hold_limit`] — the per-visitor limit on hold requests.
//! - [`events`] — known events, cached stock, the reaper task.
//! - [`page`] — the waiting-room page and embedded static files.
//! - [`cookies`] — the queue and admission cookies.
//! - [`stores`] — picking the memory or Redis backends.
//! - [`telemetry`] — Prometheus metrics (`/metrics`).
//! - [`demo_origin`] — the built-in demo shop.
//! - [`cli`] — the `sluice` command line.
//! - [`admin_cli`] — `sluice admin`, a client of the admin API.
//! - [`simulate`] — `sluice simulate`, the queue in virtual time.
//! - [`swarm`] — `sluice swarm`, a bounded crowd of real visitors.

pub mod adaptive;
pub mod admin_cli;
pub mod app;
pub mod canonical;
pub mod cli;
pub mod client_ip;
pub mod config;
pub mod cookies;
pub mod dashboard;
pub mod demo_origin;
pub mod events;
pub mod front;
pub mod gate;
pub mod h1;
pub mod hold_limit;
pub mod page;
pub mod problem;
pub mod proxy;
pub mod reserve;
pub mod rooms;
pub mod schedule;
pub mod server;
pub mod simulate;
pub mod stores;
pub mod swarm;
pub mod telemetry;
pub mod upstream;
pub mod visitor;
pub mod watch;
