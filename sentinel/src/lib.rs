//! sluice's store connection: the one Redis connection type and the one
//! URL parser that the admission queue, the reservation inventory, the
//! proof-of-work replay guard and `sluice check-config` share.
//!
//! The package is `sluice-redis`, in the folder `sentinel/` where it began
//! as the Sentinel connection alone: what the stores import is "a Redis
//! connection" (`sluice_redis::RedisConn`), of which following Sentinel
//! is one kind, so the package is named for what it gives, and the folder
//! keeps the name the workspace layout already gives it.
//!
//! # Vocabulary
//!
//! - **store URL**: `redis://…` (one server), `redis+cluster://host:port[,…]`
//!   (Redis Cluster seed nodes) or `redis+sentinel://host:port[,…]/service`
//!   (the primary Sentinel names), each also over TLS as `rediss://…`,
//!   `rediss+cluster://…`, `rediss+sentinel://…`; [`RedisUrl`] parses it,
//!   [`UrlError`] says in a few words why one is refused.
//! - **TLS material**: [`RedisTls`], the CA file (else the system roots)
//!   and the optional client certificate of `rediss…` connections, read
//!   and checked once ([`TlsFileError`] names the file).
//! - **connection**: [`RedisConn`], one of the three kinds, opened by
//!   [`RedisUrl::connect`]; cheap to clone, reconnecting by itself, and a
//!   [`redis::aio::ConnectionLike`], so scripts and pipelines run on it.
//! - **primary**: the node Sentinel names as master; [`SentinelConnection`]
//!   follows it across failovers.
//!
//! # Layout
//!
//! - [`url`]: the parser, and the rules of each scheme.
//! - [`conn`]: the connection type and how each kind is opened.
//! - [`sentinel`]: the connection to the primary Sentinel names.
//! - [`local`]: per-thread connections for the gateway's I/O threads.
//! - [`batch`]: group commit, the calls that arrive while a store step is
//!   on its way sent together in the next one (joins, holds).
//! - [`tls`]: the TLS files, rustls's provider (ring), and how a TLS
//!   failure is told apart in an error.
//!
//! # Invariants
//!
//! - A URL is parsed whole before anything connects, and one parser serves
//!   `serve` and `check-config`: what one refuses, the other refuses with
//!   the same words.
//! - What the parser does not understand (a cluster database, a password
//!   in a node list, an entry without a port) it refuses, rather than
//!   guessing.
//! - Every kind of connection bounds each connect and each reply by the
//!   timeout it was opened with. A failed command is never retried here:
//!   the stores decide (idempotency keys, event ids).

pub mod batch;
pub mod conn;
pub mod local;
pub mod sentinel;
pub mod tls;
pub mod url;

pub use conn::RedisConn;
pub use local::{Outages, ThreadConns, opt_in_thread};
pub use sentinel::SentinelConnection;
pub use tls::{RedisTls, TlsFile, TlsFileError};
pub use url::{
    CLUSTER_SCHEME, RedisUrl, Role, SENTINEL_SCHEME, SentinelUrl, TLS_CLUSTER_SCHEME,
    TLS_SENTINEL_SCHEME, UrlError,
};
