//! # sluice-gateway
//!
//! The gateway of sluice: an HTTP front (hyper 1 + tower, HTTP/1.1 and h2c)
//! that stands between downstream visitors and the upstream origin, and
//! wires the domain crates (`sluice-pow`, `sluice-admission`,
//! `sluice-reservation`) to the network. Its HTTP/1.1 wire code on both
//! sides (the native front, the per-connection deadlines, the codec toward
//! the origin) is a crate of its own, `sluice-wire`, with its own
//! differential tests against hyper and fuzz targets.
//!
//! ## Life of a request
//!
//! The folders follow it, in this order:
//!
//! ```text
//!  downstream
//!     │
//!  edge/      accept (I/O threads) ─ deadlines ─ HTTP/1.1 (native front
//!     │       for plain GET/HEAD, else hyper) or h2 ─ client address ─
//!     │       the canonical request (path and host normalised once)
//!     ├── no room guards it ────────────────────────────────┐ (direct path)
//!  app/       router and layers (request id, trace, panic), │
//!     │       /_sluice/… bodies bounded, store permits      │
//!     ├── /_sluice/…  visitor/ (challenge, join, status,    │
//!     │               page) · reserve/ (events, holds,      │
//!     │               webhook) · admin/ (admin API,         │
//!     │               dashboard, metrics)                   │
//!     └── guarded     gate/ (rooms and rules, the admission │
//!                     gate, passthrough, sessions, revokes) │
//!                           │                               │
//!                        proxy/ (forward, upstream pool, HTTP/1.1 to the
//!                        origin, the WebSocket tunnel) ──▶ upstream origin
//! ```
//!
//! 1. **Edge.** [`edge::server::serve`] accepts a TCP connection and hands it
//!    to the I/O thread with the fewest connections open; a client that
//!    sends no request head within the header timeout is dropped
//!    ([`sluice_wire::watch`]). A plain HTTP/1.1 GET or HEAD is read by
//!    [`sluice_wire::front`], anything else by hyper's server. Each
//!    request is put in its canonical form ([`edge::canonical`]) and its
//!    client decided ([`edge::client_ip::ClientInfo`]) before anything else.
//! 2. **Direct path.** A request no room guards goes from the edge straight
//!    to the proxy, without the router and its layers.
//! 3. **App.** Everything else goes through the router ([`app::build`]):
//!    the gateway's own endpoints under `/_sluice/`, and as fallback the
//!    gate.
//! 4. **Gate.** [`gate::guarded`]: [`gate::authorize`] (tower-http's
//!    authorize shape) gives back the request with its [`gate::Admission`]
//!    (a valid admission, a passthrough at an idle room, fail-open) or the
//!    waiting room; then one call to the proxy, then `after_origin` (a
//!    revoke from the origin, the new or renewed cookie). The room was found
//!    once, by the edge ([`gate::GuardedBy`]). Forward-auth
//!    (`GET /_sluice/auth`, `gate::forward`) is the same gate for a proxy in
//!    front: the request it describes is put in the canonical form and
//!    through the same [`gate::authorize`], and the answer is 200 with the
//!    admission to copy, or the waiting room.
//! 5. **Proxy.** [`proxy::Proxy`] streams the request upstream over a
//!    pooled connection and streams the answer back: a request without a
//!    body natively ([`sluice_wire::h1`], [`sluice_wire::origin`]), any
//!    other through hyper's client.
//!
//! ## Modules
//! - [`edge`] — the listener, connections, the canonical request, the
//!   client's address (deadlines and HTTP/1.1 from the client:
//!   `sluice-wire`).
//! - [`app`] — the shared state, the route table and the layer order, the
//!   one error map ([`app::problem`]), metrics recording, the stores.
//! - [`gate`] — rooms and their rules, the ticker, the admission gate,
//!   adaptive admission, scheduled openings, the cookies.
//! - [`proxy`] — the reverse proxy and its upstream pool (the HTTP/1.1
//!   codec toward the origin: `sluice-wire`), the `Sluice-*` namespace.
//! - [`visitor`] — challenge, join, status, public room state, JWKS, the
//!   waiting page.
//! - [`reserve`] — events, holds, the payment webhook, event admin, the
//!   reaper.
//! - [`admin`] — the admin dashboard.
//! - [`config`] — TOML configuration, flags and environment, validation.
//! - [`tools`] — the `sluice` command line and the built-in demo shop; the
//!   operator tools (`simulate`, `swarm`, `admin`) behind the `tools`
//!   feature.
//!
//! ## Features
//!
//! - `tools` (default) — `sluice simulate`, `sluice swarm` and
//!   `sluice admin`, and what only they link: plotters, png, a bundled font
//!   and indicatif. Without it (`--no-default-features`) this crate is the
//!   server alone, as the fuzz crate builds it.

pub mod admin;
pub mod app;
pub mod config;
pub mod edge;
pub mod gate;
pub mod proxy;
pub mod reserve;
pub mod tools;
pub mod visitor;
