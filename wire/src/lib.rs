//! # sluice-wire
//!
//! sluice's HTTP/1.1 wire code, on both sides of the gateway, kept apart
//! from the proxy that uses it (as pingora keeps `pingora-core`'s HTTP/1
//! apart from its proxy): the bytes a downstream client sends and gets for
//! the plainest requests, and the bytes exchanged with the upstream origin
//! for requests without a body. It knows nothing of the gateway's rooms,
//! configuration or router: bounds come in as plain values ([`front::Limits`],
//! durations), answers from a closure, and connections go back to whatever
//! [`origin::Pool`] the caller keeps.
//!
//! Everything here exists for speed (fewer instructions per proxied request
//! than hyper's dispatcher, channels and tasks) and nothing here may change
//! what goes over the wire compared with hyper: where a case is not plain,
//! this code declines and hyper takes it.
//!
//! ## Vocabulary
//!
//! - **downstream** — the visitor's side; **upstream**, **origin** — the
//!   server the gateway forwards to.
//! - **head** — a request or status line and its header fields, up to the
//!   empty line; **framing** — how a body's end is known (RFC 9112 §6:
//!   `Content-Length`, chunked, or the connection's close).
//! - **plain request** — `GET` or `HEAD`, HTTP/1.1, origin-form target, no
//!   framing field, no upgrade, no `Expect`, `Connection` at most
//!   `keep-alive` or `close`: the only kind [`front`] reads.
//! - **handoff** — the front declining a request: the connection, with the
//!   bytes read so far, goes to hyper's server for the rest of its life.
//! - **native** — an exchange done by this crate rather than by hyper.
//! - **hop-by-hop** — a header field that describes one connection, never
//!   the message (RFC 9110 §7.6.1).
//!
//! ## Modules
//!
//! - [`front`] — downstream: plain requests read with `httparse`, their
//!   answers written as hyper's server writes them; anything else handed
//!   off ([`front::Outcome::Handoff`], [`front::Prefixed`]).
//! - [`watch`] — a downstream connection's two deadlines (request head,
//!   origin's response head), one timer per connection.
//! - [`h1`] — upstream: the request head written, the response head parsed,
//!   the body's framing decided and chunked bodies decoded.
//! - [`origin`] — upstream: one exchange on a native connection and the
//!   response body read from it as it is polled, the connection handed back
//!   to a [`origin::Pool`] after a clean end.
//! - [`headers`] — the hop-by-hop set and how to strip it.
//!
//! ## Invariants
//!
//! - The front never decides where a request body ends: a request with any
//!   framing field is handed off, its bytes untouched, so request smuggling
//!   meets hyper's parser only. A head is taken whole or left as it came.
//! - The front's answers are hyper's answers: status line, header order,
//!   `content-length` or chunked chosen by the same rules, `date`,
//!   `connection: close`.
//! - The origin side accepts what hyper's client accepts and reads it the
//!   same way (status, headers, body, trailers), but for a few documented
//!   places where it is stricter ([`h1`]); it never panics on any bytes and
//!   never reads past a response's end into a pooled connection's next one.
//! - No `unsafe` (`unsafe_code = "forbid"` for the workspace).
//!
//! ## Tests that hold it to hyper
//!
//! - `tests/origin.rs` (this crate): the origin side against hyper's client
//!   on the same bytes over a real loopback socket, a fixed list of answers
//!   and answers generated with proptest.
//! - the unit tests of [`front`] and [`h1`] (heads, framing, chunked round
//!   trips, pipelining, handoff).
//! - `tests/tests/front.rs` (workspace `sluice-tests`): the front against
//!   hyper's server end to end, through a real gateway.
//! - fuzzing: `fuzz/fuzz_targets/front_heads.rs` and `origin_heads.rs`, and
//!   their bounded twins in `tests/tests/fuzz_props.rs`.

pub mod front;
pub mod h1;
pub mod headers;
pub mod origin;
pub mod watch;
