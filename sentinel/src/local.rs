//! Per-thread connections: a store's commands from a thread that opted in
//! ([`opt_in_thread`], the gateway's I/O threads) run on a connection of
//! that thread's own, so the reply is read and handed over on the thread
//! that awaits it. The shared connection's reader runs on the main runtime,
//! and each command from an I/O thread crossed threads twice on it (a
//! quarter of a hold's time went to context switches, README, "Where a
//! hold's time goes"). Our own code: the redis crate pools per process, not
//! per thread.
//!
//! # When the thread's connection is used
//!
//! Only once it has answered a `PING` since the last connection failure
//! the process saw on any connection to the same server ([`Outages`]): a
//! connection that sat idle
//! through a restart of Redis is broken until its next command fails, and
//! that command would be a visitor's. Until then (and while the thread's
//! connection is being opened, in a task of the thread's own, never in a
//! request) commands run on the shared connection, exactly as without
//! this module. Nothing is ever retried here: a command that fails fails
//! once, on whichever connection it ran.
//!
//! Only a standalone server (`redis://`) gets per-thread connections; a
//! Cluster or Sentinel connection is shared as before.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::conn::RedisConn;
use crate::tls::RedisTls;
use crate::url::RedisUrl;

/// The least time between two tries to open or check one thread's
/// connection while they fail (Redis down).
const RETRY_GAP: Duration = Duration::from_millis(100);

/// Each server's [`Outages`], by address (`host:port`, or the socket's
/// path).
static SERVERS: LazyLock<Mutex<HashMap<String, Outages>>> = LazyLock::new(Default::default);

/// Connection failures (an I/O error, a dropped connection, a refused
/// connect) seen by the process's connections to one server: a failure
/// of another server's (a ledger consumer retrying against a Redis that
/// is down, a second store) leaves this server's threads on their own
/// connections. Shared by every [`RedisConn`] to the server.
#[derive(Clone, Debug, Default)]
pub struct Outages(Arc<AtomicU64>);

impl Outages {
    /// The counter of the server at `addr` (one per address in the
    /// process).
    pub fn of(addr: &str) -> Self {
        SERVERS.lock().entry(addr.to_owned()).or_default().clone()
    }

    /// How many failures were seen: a thread's connection is trusted again
    /// only after a `PING` that started at or after the latest.
    pub fn seen(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Counts `e` when it is a connection failure.
    pub(crate) fn note(&self, e: &redis::RedisError) {
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            self.0.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Ids of [`ThreadConns`], so each has its own slot in every thread.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static OPTED_IN: Cell<bool> = const { Cell::new(false) };
    static SLOTS: RefCell<HashMap<u64, Arc<Mutex<Slot>>>> = RefCell::new(HashMap::new());
}

/// Marks the calling thread as one whose store commands run on
/// connections of its own. Call it on a thread that drives a tokio
/// runtime of its own (a current-thread runtime), before it serves.
pub fn opt_in_thread() {
    OPTED_IN.with(|o| o.set(true));
}

/// One thread's connection of one [`ThreadConns`].
#[derive(Default)]
struct Slot {
    conn: Option<RedisConn>,
    /// [`Outages::seen`] when its last good `PING` started.
    checked_at: Option<u64>,
    /// An open or a check is in flight.
    busy: bool,
    last_try: Option<Instant>,
}

/// A shared connection and, on threads that opted in, one connection per
/// thread to the same server (module docs). Cheap to clone.
#[derive(Clone)]
pub struct ThreadConns {
    id: u64,
    shared: RedisConn,
    /// What a thread's connection is opened with, and its server's
    /// failures; `None`: not a standalone server, so only the shared
    /// connection is used.
    open: Option<Arc<Open>>,
}

/// How a thread's connection is opened.
struct Open {
    url: RedisUrl,
    tls: RedisTls,
    timeout: Duration,
    outages: Outages,
}

impl std::fmt::Debug for ThreadConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadConns")
            .field("id", &self.id)
            .field("per_thread", &self.open.is_some())
            .finish()
    }
}

impl ThreadConns {
    /// `shared`, opened from `url` with `tls` and `timeout`; threads that
    /// opted in open their own the same way.
    pub fn new(shared: RedisConn, url: &RedisUrl, tls: &RedisTls, timeout: Duration) -> Self {
        let open = match (url, &shared) {
            (RedisUrl::Single(_), RedisConn::Single(_, outages)) => Some(Arc::new(Open {
                url: url.clone(),
                tls: tls.clone(),
                timeout,
                outages: outages.clone(),
            })),
            _ => None,
        };
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shared,
            open,
        }
    }

    /// Only the shared connection, on every thread.
    pub fn shared_only(shared: RedisConn) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shared,
            open: None,
        }
    }

    /// The shared connection.
    pub fn shared(&self) -> &RedisConn {
        &self.shared
    }

    /// The connection to run a command on now: this thread's own when it
    /// opted in and its connection is open and checked since the last
    /// failure, else the shared one (starting the open or the check in
    /// the background when due).
    pub fn get(&self) -> RedisConn {
        let Some(open) = &self.open else {
            return self.shared.clone();
        };
        if !OPTED_IN.with(Cell::get) {
            return self.shared.clone();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.shared.clone();
        };
        let slot = SLOTS.with(|s| s.borrow_mut().entry(self.id).or_default().clone());
        let mut s = slot.lock();
        let seen = open.outages.seen();
        if let Some(c) = &s.conn
            && s.checked_at == Some(seen)
        {
            return c.clone();
        }
        if s.busy || s.last_try.is_some_and(|t| t.elapsed() < RETRY_GAP) {
            return self.shared.clone();
        }
        s.busy = true;
        s.last_try = Some(Instant::now());
        let existing = s.conn.clone();
        drop(s);
        let open = open.clone();
        runtime.spawn(async move {
            let checked = check(existing, &open).await;
            let mut s = slot.lock();
            s.busy = false;
            if let Some((conn, at)) = checked {
                s.conn = Some(conn);
                s.checked_at = Some(at);
            }
        });
        self.shared.clone()
    }
}

/// Opens a connection (when `existing` is `None`) and `PING`s it, each
/// within the timeout; the connection and [`Outages::seen`] from before
/// the `PING`, or `None` when either failed.
async fn check(existing: Option<RedisConn>, open: &Open) -> Option<(RedisConn, u64)> {
    let Open {
        url, tls, timeout, ..
    } = open;
    let mut conn = match existing {
        Some(c) => c,
        None => match tokio::time::timeout(*timeout, url.connect_with(*timeout, tls)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "a thread's Redis connection did not open");
                return None;
            }
            Err(_) => return None,
        },
    };
    let at = open.outages.seen();
    let ping = redis::cmd("PING");
    match tokio::time::timeout(*timeout, ping.query_async::<String>(&mut conn)).await {
        Ok(Ok(_)) => Some((conn, at)),
        _ => None,
    }
}
