//! The HTTP front: accepts connections, speaks HTTP/1.1 and HTTP/2
//! (cleartext, prior knowledge) on the same port, or HTTPS with either
//! chosen by ALPN when `[server.tls]` is set ([`crate::edge::tls`]), passes
//! upgrades through, and drains in-flight requests on shutdown.
//!
//! With TLS, a plain listener may stand beside the HTTPS one
//! (`server.tls.http_listen`), serving plain HTTP or answering 308 to the
//! https URL (`redirect_to_https`). Every connection, TLS or not, goes the
//! same way once its stream is ready ([`serve_stream`]).
//!
//! Open connections are bounded by `limits.max_connections`: a connection
//! accepted past it is closed at once, unread (the client sees an empty reply
//! or a reset), and counted in `sluice_shed_total{what="connection"}`.
//! Closing rather than leaving it in the listen backlog keeps the answer
//! immediate and keeps the connections already open served.
//!
//! Connections are served on I/O threads (`server.io_threads`, one per core
//! by default), each a single-threaded event loop, as nginx's workers are:
//! the accept loop hands each new connection to the thread with the fewest
//! open, and from then on the connection, the service answering it and the
//! pooled upstream connections it takes ([`crate::proxy::upstream`]) live on that
//! thread. A proxied request never wakes another thread; against one
//! work-stealing runtime this measured about 8% more proxied requests a
//! second (README, "Measured"). Background work (admission ticks, the
//! reaper, the Redis connections) stays on the runtime `serve` runs on.
//!
//! [`serve`] takes its listener and a shutdown future, so `main` and the
//! tests run exactly the same code.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::app;
use crate::app::request_id::{REQUEST_ID, RequestIds, panic_response};
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;
use sluice_wire::watch::ConnWatch;

/// A running gateway started with [`spawn`]: its address and a handle to
/// stop it.
pub struct RunningGateway {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The state it serves with.
    pub state: AppState,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningGateway {
    /// Asks the gateway to drain and waits until it has stopped.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await?
    }
}

/// Serves `state` on `listener` in a background task (used by tests and by
/// embedders).
pub fn spawn(state: AppState, listener: TcpListener) -> anyhow::Result<RunningGateway> {
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let s = state.clone();
    let task = tokio::spawn(async move {
        serve(s, listener, async {
            let _ = rx.await;
        })
        .await
    });
    Ok(RunningGateway {
        addr,
        state,
        shutdown: Some(tx),
        task,
    })
}

/// Accepts connections until `shutdown` completes, then stops accepting,
/// fails readiness, and waits (up to the configured grace period) for
/// in-flight requests to finish. The plain listener beside TLS
/// (`server.tls.http_listen`), when configured, is bound here.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let plain = bind_plain(state.config()).await?;
    serve_with_plain(state, listener, plain, shutdown).await
}

/// Binds `server.tls.http_listen`, when TLS and it are configured.
pub async fn bind_plain(config: &crate::config::Config) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = config.server.tls.as_ref().and_then(|t| t.http_listen) else {
        return Ok(None);
    };
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (server.tls.http_listen): {e}"))?;
    Ok(Some(l))
}

/// [`serve`], with the plain listener beside TLS already bound.
pub async fn serve_with_plain(
    state: AppState,
    listener: TcpListener,
    plain: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = state.config().clone();
    let tls = match &config.server.tls {
        Some(t) => Some(Arc::new(crate::edge::tls::Terminator::new(t)?)),
        None => None,
    };
    // Reloads the certificates until `serve` returns.
    let _fresh = tls.clone().map(|t| {
        AbortOnDrop(tokio::spawn(crate::edge::tls::keep_fresh(
            t,
            state.telemetry().clone(),
        )))
    });
    let redirect = config
        .server
        .tls
        .as_ref()
        .is_some_and(|t| t.redirect_to_https);
    let entries = (
        if tls.is_some() {
            Entry::Tls
        } else {
            Entry::Plain
        },
        if redirect {
            Entry::Redirect
        } else {
            Entry::Plain
        },
    );
    // Request ids come from one counter, whichever way a request goes.
    let ids = RequestIds::default();
    let router: Router = app::build_with_ids(state.clone(), ids.clone());
    // The HTTP version is known from the first bytes (`first_bytes_within`),
    // so each connection goes straight to its protocol's builder: no
    // detection wrapper around every read.
    let mut http1 = hyper::server::conn::http1::Builder::new();
    // The header read timeout is the connection's own (`ConnWatch`), not
    // hyper's, which sets a timer for every request. Heads are written into
    // one buffer rather than gathered from pieces: fewer instructions per
    // small response; a large body costs one more copy in memory, bounded by
    // the buffer.
    http1
        .writev(false)
        .header_read_timeout(None)
        .max_headers(config.limits.max_headers)
        // The head's own bound: the buffer's alone is not one (a read may
        // bring a whole oversized head into a buffer grown by a later one).
        .max_header_size(config.limits.max_header_bytes)
        .max_buf_size(config.limits.max_header_bytes.max(8192));
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(config.limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let max_connections = config.limits.max_connections;
    let shared = Arc::new(Shared {
        state: state.clone(),
        router,
        ids,
        http1,
        http2,
        drain: Drain::default(),
        trusted: Arc::new(config.trusted_proxies.clone()),
        header_timeout: config.timeouts.header_read,
        upstream_response: config.timeouts.upstream_response,
        write_stall: config.timeouts.write_stall,
        native_http1: config.server.native_http1,
        tls,
        https_port: listener.local_addr()?.port(),
        front_limits: sluice_wire::front::Limits {
            head_bytes: config.limits.max_header_bytes,
            headers: config.limits.max_headers,
        },
    });
    let connections = Arc::new(tokio::sync::Semaphore::new(max_connections));
    // Dropped: the I/O threads' event loops end, and every connection
    // still open with them.
    let (close, closed) = tokio::sync::watch::channel(());
    let threads = (0..config.server.threads())
        .map(|i| IoThread::start(i, shared.clone(), closed.clone()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    drop(closed);
    tokio::pin!(shutdown);

    loop {
        let (accepted, entry) = tokio::select! {
            a = listener.accept() => (a, entries.0),
            a = accept_plain(plain.as_ref()) => (a, entries.1),
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            state.telemetry().shed("connection");
            tracing::debug!(%peer, "closed: limits.max_connections reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // To the I/O thread with the fewest connections open.
        let Some(thread) = threads
            .iter()
            .min_by_key(|t| t.open.load(Ordering::Relaxed))
        else {
            break;
        };
        match stream.into_std() {
            Ok(stream) => thread.hand(stream, peer, entry, permit),
            Err(e) => tracing::debug!(%peer, error = %e, "closed: cannot hand the connection over"),
        }
    }

    drop(listener);
    drop(plain);
    // The I/O threads take no more connections once their queues are gone.
    drop(threads);
    state.begin_shutdown();
    tracing::info!("shutting down: draining in-flight requests");
    shared.drain.start();
    tokio::select! {
        _ = connections.acquire_many(u32::try_from(max_connections).unwrap_or(u32::MAX)) => {
            tracing::info!("all connections closed");
        }
        () = tokio::time::sleep(config.timeouts.shutdown_grace) => {
            tracing::warn!("grace period over; closing remaining connections");
        }
    }
    drop(close);
    Ok(())
}

/// The plain listener's next connection; never, without one.
async fn accept_plain(plain: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match plain {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a connection came in, which decides how it is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// Plain HTTP (`listen` without TLS, or `http_listen` serving).
    Plain,
    /// The HTTPS listener: a TLS handshake first.
    Tls,
    /// `http_listen` with `redirect_to_https`: 308 to https.
    Redirect,
}

/// What every connection of one gateway shares.
struct Shared {
    state: AppState,
    router: Router,
    ids: RequestIds,
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    drain: Drain,
    trusted: Arc<Vec<ipnet::IpNet>>,
    header_timeout: Duration,
    upstream_response: Duration,
    /// `timeouts.write_stall` ([`crate::edge::stall`]).
    write_stall: Duration,
    /// Plain HTTP/1.1 requests read and answered by [`sluice_wire::front`].
    native_http1: bool,
    /// The TLS side of the HTTPS listener, when `[server.tls]` is set.
    tls: Option<Arc<crate::edge::tls::Terminator>>,
    /// The HTTPS listener's port (where redirects point).
    https_port: u16,
    front_limits: sluice_wire::front::Limits,
}

/// A connection handed to an I/O thread, with its
/// `limits.max_connections` permit.
type Handed = (
    std::net::TcpStream,
    SocketAddr,
    Entry,
    tokio::sync::OwnedSemaphorePermit,
);

/// One connection counted open on an I/O thread (and in its
/// `sluice_open_connections` gauge), until dropped.
struct OpenCount(Arc<std::sync::atomic::AtomicUsize>, metrics::Gauge);

impl Drop for OpenCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        self.1.decrement(1.0);
    }
}

/// One I/O thread: an event loop of its own (a single-threaded tokio
/// runtime), as each nginx worker has, on which the connections handed to
/// it are served from their first byte to their last, with the upstream
/// connections they use ([`crate::proxy::upstream::set_io_thread`]). No request
/// crosses to another thread on its way to the origin and back, nor to
/// Redis: the stores' commands from it run on Redis connections of its own
/// (`sluice_redis::local`). Admission ticks and reaping run on the main
/// runtime, on the shared connections.
struct IoThread {
    queue: tokio::sync::mpsc::UnboundedSender<Handed>,
    /// Connections open on it.
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl IoThread {
    /// Starts I/O thread `i`; it serves until `closed`'s sender goes.
    fn start(
        i: usize,
        shared: Arc<Shared>,
        mut closed: tokio::sync::watch::Receiver<()>,
    ) -> anyhow::Result<IoThread> {
        let (queue, mut handed) = tokio::sync::mpsc::unbounded_channel::<Handed>();
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let count = open.clone();
        let gauge = shared.state.telemetry().open_connections(i);
        gauge.set(0.0);
        std::thread::Builder::new()
            .name(format!("sluice-io-{i}"))
            .spawn(move || {
                crate::proxy::upstream::set_io_thread(i);
                // the stores' commands from this thread on connections of
                // its own (sluice_redis::local); SLUICE_SHARED_REDIS=1 keeps
                // them on the one shared connection, for comparison
                if std::env::var_os("SLUICE_SHARED_REDIS").is_none_or(|v| v != "1") {
                    sluice_redis::opt_in_thread();
                }
                runtime.block_on(async move {
                    while let Some((stream, peer, entry, permit)) = handed.recv().await {
                        let stream = match TcpStream::from_std(stream) {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::warn!(%peer, error = %e, "cannot serve a connection");
                                continue;
                            }
                        };
                        // Counted open until the task ends, however it ends.
                        gauge.increment(1.0);
                        let open = OpenCount(count.clone(), gauge.clone());
                        tokio::spawn(connection(
                            shared.clone(),
                            stream,
                            peer,
                            entry,
                            (permit, open),
                        ));
                    }
                    // No more connections: serve those open until told to close.
                    let _ = closed.changed().await;
                });
                // The runtime goes with the thread: connections still open close.
                drop(runtime);
            })?;
        Ok(IoThread { queue, open })
    }

    fn hand(
        &self,
        stream: std::net::TcpStream,
        peer: SocketAddr,
        entry: Entry,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        self.open.fetch_add(1, Ordering::Relaxed);
        if self.queue.send((stream, peer, entry, permit)).is_err() {
            self.open.fetch_sub(1, Ordering::Relaxed);
            tracing::warn!(%peer, "closed: the I/O thread is gone");
        }
    }
}

/// Serves one connection, holding its `limits.max_connections` permit and
/// its count on the I/O thread: the TLS handshake first on the HTTPS
/// listener (within the header timeout, ALPN naming the protocol), the
/// first bytes telling the protocol on a plain one.
async fn connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    entry: Entry,
    held: (tokio::sync::OwnedSemaphorePermit, OpenCount),
) {
    // Shared with a WebSocket tunnel made of this connection, which then
    // stays counted (and holds its permit) until the tunnel closes.
    let hold = crate::proxy::ConnHold(Arc::new(held));
    let header_timeout = shared.header_timeout;
    if let (Entry::Tls, Some(tls)) = (entry, shared.tls.clone()) {
        let telemetry = shared.state.telemetry();
        // Boxed: the handshake's state would otherwise stay in the task
        // for the connection's life (see [`serve_http1`]).
        let accepted = Box::pin(tls.accept(stream, header_timeout, telemetry, peer));
        let Some((stream, alpn)) = accepted.await else {
            return;
        };
        let version = match alpn {
            crate::edge::tls::Alpn::Http2 => Version::Http2,
            crate::edge::tls::Alpn::Http1 => Version::Http1,
        };
        return serve_stream(shared, stream, peer, version, entry, hold).await;
    }
    let Some(version) = first_bytes_within(&stream, header_timeout).await else {
        tracing::debug!(%peer, "closed: no request within the header timeout");
        return;
    };
    serve_stream(shared, stream, peer, version, entry, hold).await;
}

/// Serves one connection's stream, TLS or plain, in `version`.
///
/// Not an `async fn`: its arguments would be kept in the connection's
/// task for the connection's life, a TLS stream among them (more than a
/// KiB); the stream moves on at once, into hyper's boxed connection or the
/// task of [`serve_http1`], and what is awaited here is small.
fn serve_stream<S>(
    shared: Arc<Shared>,
    stream: S,
    peer: SocketAddr,
    version: Version,
    entry: Entry,
    hold: crate::proxy::ConnHold,
) -> impl Future<Output = ()> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // a client that stops reading loses its connection (and slot) after
    // `timeouts.write_stall`, whatever was being written to it
    let stream = crate::edge::stall::WriteStall::new(stream, shared.write_stall);
    let (header_timeout, upstream_response) = (shared.header_timeout, shared.upstream_response);
    let watch = (version == Version::Http1).then(|| Arc::new(ConnWatch::default()));
    let ctx = Arc::new(ConnCtx {
        tls: entry == Entry::Tls,
        redirect_to: (entry == Entry::Redirect).then_some(shared.https_port),
        st: shared.state.clone(),
        router: shared.router.clone(),
        ids: shared.ids.clone(),
        trusted: shared.trusted.clone(),
        peer,
        peer_text: crate::proxy::peer_text(peer),
        watch: watch.clone(),
        hold,
        admit_memo: crate::gate::session::AdmitMemo::default(),
        direct_calls: shared.state.config().server.direct_calls,
    });
    let Some(watch) = watch else {
        // HTTP/2 bounds its streams and pings of its own. Boxed, as
        // hyper's HTTP/1 connection is: see [`serve_http1`].
        let svc = TowerToHyperService::new(service(ctx));
        let drained = Box::pin(async move {
            let conn = shared.http2.serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = shared.drain.watch(conn, |c| c.graceful_shutdown()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
        return futures_util::future::Either::Left(drained);
    };
    // The connection in a task of its own, so that this one, the
    // deadline's, wakes only for its timer or the connection's end. A
    // connection that ends with an event stream releases the watch
    // ([`answer`]): this task ends then, and the stream's connection is
    // one task, with no timer, for the stream's life (issue 21).
    let mut conn = tokio::spawn(serve_http1(shared, stream, ctx, watch.clone()));
    futures_util::future::Either::Right(async move {
        tokio::select! {
            _ = &mut conn => {}
            why = watch.enforce(header_timeout, upstream_response) => match why {
                sluice_wire::watch::Enforced::HeadTimeout => {
                    tracing::debug!(%peer, "closed: no request head within the header timeout");
                    conn.abort();
                }
                // the connection goes on alone (its handle dropped, not
                // aborted) and closes after the stream
                sluice_wire::watch::Enforced::Released => {}
            },
        }
    })
}

/// Serves an HTTP/1 connection: plain requests read and answered by
/// [`sluice_wire::front`] until one is not, hyper's server from there on.
///
/// A connection's task is as large as the largest state of its future,
/// for as long as it is open, whatever state it is in: an idle status
/// stream (issue 21: at most 4 KiB each) must not carry hyper's
/// connection or a proxied request's state. So hyper's connection is
/// boxed (one allocation per connection handed over) and the proxy's
/// future too ([`answer`]); what stays inline is the front's own loop.
/// The peer's address, needed after the front only, is read from `ctx`
/// then rather than kept beside the front's loop: its 32 bytes took the
/// task of a connection with its write-stall guard from jemalloc's
/// 1,536-byte class to the 1,792-byte one (README, "Streams").
async fn serve_http1<S>(
    shared: Arc<Shared>,
    mut stream: S,
    ctx: Arc<ConnCtx>,
    serving: Arc<ConnWatch>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Plain requests are read and answered here (`sluice_wire::front`) until
    // one is not: hyper takes the connection from there.
    let read = if shared.native_http1 {
        let stopping = || shared.drain.started();
        let answered = sluice_wire::front::serve(
            &mut stream,
            shared.front_limits,
            &serving,
            stopping,
            |req| answer(&ctx, req),
        );
        // Woken when the drain starts, to close an idle connection.
        match shared.drain.watch(answered, |_| {}).await {
            sluice_wire::front::Outcome::Closed => return,
            sluice_wire::front::Outcome::Handoff(read) => read,
        }
    } else {
        bytes::BytesMut::new()
    };
    let io = TokioIo::new(sluice_wire::front::Prefixed::new(read, stream));
    let peer = ctx.peer;
    let svc = TowerToHyperService::new(service(ctx));
    let drained = Box::pin(shared.drain.watch(
        shared.http1.serve_connection(io, svc).with_upgrades(),
        |c| c.graceful_shutdown(),
    ));
    if let Err(e) = drained.await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Graceful shutdown of the open connections: once started, each finishes
/// the request it is answering (HTTP/1) or its open streams (HTTP/2) and
/// closes. A connection registers its task's waker once, when it is first
/// polled, so serving a request costs it nothing but one flag read (hyper's
/// own watcher polls a channel at every wake-up).
#[derive(Default)]
struct Drain {
    started: std::sync::atomic::AtomicBool,
    /// The tasks of the connections open, by connection number.
    wakers: parking_lot::Mutex<std::collections::HashMap<u64, std::task::Waker>>,
    next: AtomicU64,
}

impl Drain {
    /// The drain has started.
    fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// Tells every connection to finish and close.
    fn start(&self) {
        self.started.store(true, Ordering::SeqCst);
        for (_, waker) in self.wakers.lock().drain() {
            waker.wake();
        }
    }

    /// `conn`, finished gracefully with `shutdown` once the drain starts.
    fn watch<C: Future>(&self, conn: C, shutdown: fn(Pin<&mut C>)) -> Draining<'_, C> {
        Draining {
            conn,
            drain: self,
            shutdown,
            id: None,
            asked: false,
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection that finishes gracefully once its [`Drain`] starts.
    struct Draining<'a, C> {
        #[pin]
        conn: C,
        drain: &'a Drain,
        // How it finishes gracefully.
        shutdown: fn(Pin<&mut C>),
        // Its number in the drain's wakers, once registered.
        id: Option<u64>,
        // graceful_shutdown was called.
        asked: bool,
    }

    impl<C> PinnedDrop for Draining<'_, C> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(id) = this.id {
                this.drain.wakers.lock().remove(&id);
            }
        }
    }
}

impl<C: Future> Future for Draining<'_, C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<C::Output> {
        let mut this = self.project();
        if !*this.asked {
            if this.id.is_none() {
                let id = this.drain.next.fetch_add(1, Ordering::Relaxed);
                this.drain.wakers.lock().insert(id, cx.waker().clone());
                *this.id = Some(id);
            }
            // Read after registering: a drain started in between is seen.
            if this.drain.started.load(Ordering::SeqCst) {
                *this.asked = true;
                (this.shutdown)(this.conn.as_mut());
            }
        }
        this.conn.poll(cx)
    }
}

/// The protocol a connection speaks, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    Http1,
    /// HTTP/2 with prior knowledge (the client's preface).
    Http2,
}

/// Waits until the client has sent enough bytes for the HTTP version to be
/// known (hyper's version detection has no timeout of its own), and tells
/// which it is. A silent or trickling client is dropped (`None`).
async fn first_bytes_within(stream: &TcpStream, limit: Duration) -> Option<Version> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 24];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) | Err(_) => return None,
        };
        if n == 0 {
            return None;
        }
        if buf[..n] != PREFACE[..n] {
            return Some(Version::Http1);
        }
        if n >= PREFACE.len() {
            return Some(Version::Http2);
        }
        // A partial HTTP/2 preface: wait for more.
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A response body that tells the connection's [`ConnWatch`] when it is
/// over (hyper drops it once written, or when the connection goes).
pub(crate) struct ResponseBody {
    inner: axum::body::Body,
    head: Option<Arc<ConnWatch>>,
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if let Some(head) = &self.head {
            head.idle();
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What the requests of one connection are answered with.
struct ConnCtx {
    /// The connection came over TLS: its requests are `https`.
    tls: bool,
    /// The plain listener redirecting to https, on this port.
    redirect_to: Option<u16>,
    st: AppState,
    router: Router,
    ids: RequestIds,
    trusted: Arc<Vec<ipnet::IpNet>>,
    peer: SocketAddr,
    /// The peer's address as a header value, made once.
    peer_text: Option<http::HeaderValue>,
    /// The connection's deadlines (HTTP/1).
    watch: Option<Arc<ConnWatch>>,
    /// The connection's permit and count, for a tunnel made of it.
    hold: crate::proxy::ConnHold,
    /// The admission token the connection showed last, verified.
    admit_memo: crate::gate::session::AdmitMemo,
    /// `server.direct_calls`: holds and joins are answered past the router.
    direct_calls: bool,
}

/// The answer to one request, whichever server read it: a request no room
/// guards goes straight to the proxy; everything else through the router
/// and its layers.
fn answer(
    ctx: &Arc<ConnCtx>,
    mut req: http::Request<axum::body::Body>,
) -> impl Future<Output = http::Response<axum::body::Body>> + Send + use<> {
    use futures_util::FutureExt as _;
    use futures_util::future::Either;
    let mut info = ClientInfo::resolve(ctx.peer, req.headers(), &ctx.trusted);
    info.peer_text.clone_from(&ctx.peer_text);
    if ctx.tls {
        info.proto = "https";
    }
    // One canonical request, decided once: every decision from here on
    // (routes, rooms, bypasses, the gate) and the origin see this form.
    if let Err(p) = canonicalise(&ctx.st, &mut req, &info) {
        let id = ctx.ids.next_value();
        let mut res = axum::response::IntoResponse::into_response(p);
        res.headers_mut().insert(REQUEST_ID, id);
        return Either::Left(Either::Right(std::future::ready(res)));
    }
    if let Some(port) = ctx.redirect_to
        && !crate::edge::tls::stays_plain(req.uri().path())
    {
        let mut res = crate::edge::tls::to_https(&req, port);
        res.headers_mut().insert(REQUEST_ID, ctx.ids.next_value());
        return Either::Left(Either::Right(std::future::ready(res)));
    }
    if req.headers().contains_key(http::header::UPGRADE) {
        req.extensions_mut().insert(ctx.hold.clone());
    }
    // A hold or a join (`server.direct_calls`): answered past the router,
    // with what its layers give it done in place (`app::direct`): the
    // request id, the span, the catch of a panic, the trace layer's word
    // on a 5xx and the `Content-Length` here, the body bounds, store
    // budget, `no-store` and compression there.
    if ctx.direct_calls
        && req.method() == http::Method::POST
        && !req.headers().contains_key(http::header::UPGRADE)
        && let Some((call, segment)) = crate::app::direct::call_of(req.uri().path())
    {
        let segment = segment.to_owned();
        let id = request_id(ctx, &mut req);
        let span = edge_span(&req, &id);
        let started = std::time::Instant::now();
        let call = crate::app::direct::answer(ctx.st.clone(), call, segment, info, req);
        // Boxed, as the other paths past the router.
        return Either::Left(Either::Left(Either::Right(boxed(with_content_length(
            outer_layers(call, id, span, started),
        )))));
    }
    // "Is this path guarded?" is decided here, once: `None` goes straight
    // to the origin; a guarded request carries its room to the gate.
    let Some(guard) = guard_of(&ctx.st, &req, &info) else {
        // Straight to the origin: no room guards the path.
        let id = request_id(ctx, &mut req);
        let ctx = ctx.clone();
        // Boxed: a proxied request's state is several KiB, and inline it
        // would be part of every connection's task for the connection's
        // whole life (an idle status stream's too; see [`serve_http1`]).
        // One allocation per proxied request.
        return Either::Left(Either::Left(Either::Left(weighed(async move {
            let forward = ctx
                .st
                .proxy()
                .forward_watched(req, &info, None, ctx.watch.as_deref());
            // As the router's CatchPanicLayer: a bug is a 500, never a
            // dropped connection.
            let mut res = std::panic::AssertUnwindSafe(forward)
                .catch_unwind()
                .await
                .unwrap_or_else(panic_response);
            res.headers_mut().insert(REQUEST_ID, id);
            res
        }))));
    };
    // An admitted visitor's request whose admission is settled without the
    // store (a valid token, its session not revoked, no renewal due: most
    // guarded requests) goes on from here too, past the router: the gate's
    // own way to the origin and back ([`crate::gate::to_origin`], its
    // revoke command and cookies), with what the router's layers give it
    // (the request id, the catch of a panic, the request's span and the
    // trace layer's word on a 5xx). The origin's answer is never compressed
    // by the gateway, so the compression layer has nothing to do here.
    // Anything else about a guarded request is the router's and the gate's
    // to decide, in full.
    if let Some(crate::gate::GuardedBy(room)) = &guard
        && !req.headers().contains_key(http::header::UPGRADE)
        && let Some(admission) =
            crate::gate::settled(&ctx.st, room.clone(), req.headers(), &info, &ctx.admit_memo)
    {
        let id = request_id(ctx, &mut req);
        let span = edge_span(&req, &id);
        let ctx = ctx.clone();
        let started = std::time::Instant::now();
        // Boxed, as the unguarded path's.
        return Either::Left(Either::Left(Either::Right(boxed(async move {
            let to_origin = crate::gate::to_origin(
                &ctx.st,
                admission,
                req,
                &info,
                ctx.watch.as_deref(),
                started,
            );
            outer_layers(to_origin, id, span, started).await
        }))));
    }
    if let Some(guard) = guard {
        req.extensions_mut().insert(guard);
    }
    req.extensions_mut().insert(info);
    if let Some(watch) = &ctx.watch {
        req.extensions_mut().insert(watch.clone());
    }
    let watch = ctx.watch.clone();
    Either::Right(ctx.router.clone().oneshot(req).map(move |res| {
        let mut res = match res {
            Ok(res) => res,
            Err(never) => match never {},
        };
        if let Some(watch) = watch {
            release_for_a_stream(&watch, &mut res);
        }
        res
    }))
}

/// The span of a request the edge answers past the router: the trace
/// layer's (`app::request_span`), method, path and request id.
fn edge_span(req: &http::Request<axum::body::Body>, id: &http::HeaderValue) -> tracing::Span {
    tracing::info_span!(
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        request_id = %id.to_str().unwrap_or(""),
    )
}

/// What the router's outer layers do around a request the edge answers
/// past it: within the request's span, the catch of a panic (a 500) and
/// the trace layer's word on a 5xx; then the request id on the answer,
/// unless it has one already (an origin's stays), as
/// `PropagateRequestIdLayer` does.
///
/// Made of combinators, not an `async fn`: an `async fn` keeps its future
/// argument in its state and again each time it is moved into an inner
/// future (the catch, the span), and a boxed hold's state had grown to
/// 44 KB, all copied into the box on every hold (README, "A hold's state
/// copied once").
fn outer_layers<F>(
    answer: F,
    id: http::HeaderValue,
    span: tracing::Span,
    started: std::time::Instant,
) -> impl Future<Output = http::Response<axum::body::Body>> + use<F>
where
    F: Future<Output = http::Response<axum::body::Body>>,
{
    use futures_util::FutureExt as _;
    use tracing::Instrument as _;
    std::panic::AssertUnwindSafe(answer)
        .catch_unwind()
        .map(move |res| {
            let res = res.unwrap_or_else(panic_response);
            crate::app::note_answer(res.status(), started.elapsed());
            res
        })
        .instrument(span)
        .map(move |mut res| {
            if !res.headers().contains_key(&REQUEST_ID) {
                res.headers_mut().insert(REQUEST_ID, id);
            }
            res
        })
}

/// A hold's or a join's answer past the router, once its outer layers
/// are done: the `Content-Length` axum's route sets last. What it wraps is
/// copied whole into its box on every hold: no bigger than the call itself
/// (unit test).
fn with_content_length<F>(
    layered: F,
) -> impl Future<Output = http::Response<axum::body::Body>> + use<F>
where
    F: Future<Output = http::Response<axum::body::Body>>,
{
    use futures_util::FutureExt as _;
    layered.map(|mut res| {
        crate::app::direct::content_length(&mut res);
        res
    })
}

/// A guarded request's, a hold's or a join's way past the router, one allocation: its
/// state would otherwise be part of every connection's task.
fn boxed(
    answer: impl Future<Output = http::Response<axum::body::Body>> + Send + 'static,
) -> std::pin::Pin<Box<dyn Future<Output = http::Response<axum::body::Body>> + Send>> {
    weighed(answer)
}

/// The most state a request's future boxed by the edge may have: the
/// largest today, a hold's, is about 6 KB; a call's future kept twice or
/// three times over (README, "A hold's state copied once": 44 KB) is
/// caught when the gateway is built, not in a profile weeks later.
const MAX_BOXED_STATE: usize = 16 * 1024;

/// `Box::pin`, with the future's size checked at compile time against
/// [`MAX_BOXED_STATE`] (a build error, for every path that boxes).
fn weighed<F: Future>(answer: F) -> std::pin::Pin<Box<F>> {
    const {
        assert!(
            std::mem::size_of::<F>() <= MAX_BOXED_STATE,
            "a request's boxed future outgrew MAX_BOXED_STATE (an async fn keeping a future argument?)"
        );
    }
    Box::pin(answer)
}

/// An HTTP/1 connection answering with one of our event streams (a status
/// or availability stream: long-lived, nothing proxied) closes after it
/// (`connection: close`; the stream ends on admission, sold out, closure,
/// expiry or a drain, and the client reconnects or polls anyway) and
/// releases its watch: with no request head to come and no origin to
/// wait for, the connection needs no deadline task and no timer for the
/// stream's life, which halves its tasks and its wake-ups (issue 21: an
/// idle stream's cost).
fn release_for_a_stream(watch: &ConnWatch, res: &mut http::Response<axum::body::Body>) {
    if res
        .extensions()
        .get::<crate::visitor::stream::OwnEventStream>()
        .is_some()
    {
        res.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        watch.release();
    }
}

/// The request id of a request the edge sends on past the router: the
/// client's, else the next one, put in the request (the origin gets it).
fn request_id(ctx: &ConnCtx, req: &mut http::Request<axum::body::Body>) -> http::HeaderValue {
    match req.headers().get(&REQUEST_ID) {
        Some(v) => v.clone(),
        None => {
            let v = ctx.ids.next_value();
            req.headers_mut().insert(REQUEST_ID, v.clone());
            v
        }
    }
}

/// The service hyper calls for each request of one connection: [`answer`],
/// with the connection's watch told when the response is over.
fn service(
    ctx: Arc<ConnCtx>,
) -> impl tower::Service<
    http::Request<Incoming>,
    Response = http::Response<ResponseBody>,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<http::Response<ResponseBody>, std::convert::Infallible>> + Send,
> + Clone {
    tower::service_fn(move |req: http::Request<Incoming>| {
        use futures_util::FutureExt as _;
        if let Some(watch) = &ctx.watch {
            watch.busy();
        }
        let head = ctx.watch.clone();
        answer(&ctx, req.map(axum::body::Body::new))
            .map(move |res| Ok(res.map(|inner| ResponseBody { inner, head })))
    })
}

/// Puts a request in its canonical form ([`crate::edge::canonical`]) in place, or
/// answers 400 `malformed_request`:
/// - the host: one `Host` at most, agreeing with an absolute-form target or
///   HTTP/2's `:authority` (RFC 9112 §3.2, RFC 9113 §8.3.1), lowercase, no
///   trailing dot, its port parsed; written back as the `Host` header;
/// - the target: in origin form, its path normalised (dot segments,
///   merged slashes, unreserved escapes decoded), the query as sent. A
///   path with an encoded slash is refused unless every room that guards
///   either reading of it (`%2F` as a separator or as data) opted in; the
///   route reading is then kept for the gate ([`crate::gate::RoutePath`]).
///
/// `*` (`OPTIONS *`) and CONNECT's authority form are left as they are.
/// Already-canonical requests (nearly all) are checked without a copy.
pub(crate) fn canonicalise(
    st: &AppState,
    req: &mut http::Request<axum::body::Body>,
    client: &ClientInfo,
) -> Result<(), crate::app::problem::Problem> {
    use crate::app::problem::Problem;
    use crate::edge::canonical::{normalize_host, normalize_path};
    use http::header::HOST;
    let bad = |what: &str, e: crate::edge::canonical::Malformed| {
        Problem::malformed(format!("{what}: {}", e.reason()))
    };
    // === the host ===
    let mut given = req.headers().get_all(HOST).iter();
    let host = given.next();
    if given.next().is_some() {
        return Err(Problem::malformed("more than one Host header"));
    }
    let host = match host {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| Problem::malformed("the Host header is not ASCII"))?,
        ),
        None => None,
    };
    let authority = req.uri().authority().map(|a| a.as_str());
    let canonical_host = match (host, authority) {
        (Some(h), None) if plain_host(h) => None,
        (Some(h), None) => Some(normalize_host(h).map_err(|e| bad("Host", e))?),
        (h, Some(a)) => {
            let a = normalize_host(a).map_err(|e| bad("target authority", e))?;
            if let Some(h) = h {
                let h = normalize_host(h).map_err(|e| bad("Host", e))?;
                let port = if req.uri().scheme_str() == Some("https") {
                    443
                } else {
                    80
                };
                if !h.same_host_with_default_port(&a, port) {
                    return Err(Problem::malformed(
                        "the Host header disagrees with the request target",
                    ));
                }
            }
            Some(a)
        }
        (None, None) => None,
    };
    if let Some(h) = canonical_host {
        let v =
            http::HeaderValue::from_str(&h.to_string()).map_err(|_| Problem::malformed("Host"))?;
        req.headers_mut().insert(HOST, v);
    }
    // === the target ===
    if *req.method() == http::Method::CONNECT || req.uri().path() == "*" {
        return Ok(());
    }
    let uri = req.uri();
    let path = normalize_path(uri.path()).map_err(|e| bad("request target", e))?;
    // The gateway's own endpoints are no room's: the router answers them
    // (an encoded slash there names no file and no endpoint).
    let own = |p: &str| p == "/_sluice" || p.starts_with("/_sluice/") || p == "/metrics";
    if path.encoded_slash && !own(&path.forward) {
        let host = req
            .headers()
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map(crate::gate::host_name);
        let rooms = st.rooms();
        for reading in [path.route.as_ref(), path.forward.as_ref()] {
            if let Some(room) = rooms.route(host, reading)
                && !room.config.allow_encoded_slashes
                && !crate::gate::rooms::bypasses(room, reading, client.ip)
            {
                return Err(Problem::malformed(
                    "request target: an encoded slash (%2F) in a guarded path",
                ));
            }
        }
    }
    let rewrite = matches!(path.forward, std::borrow::Cow::Owned(_)) || uri.authority().is_some();
    let route = path
        .encoded_slash
        .then(|| crate::gate::RoutePath(path.route.into_owned()));
    if rewrite {
        let target = match uri.query() {
            Some(q) => format!("{}?{q}", path.forward),
            None => path.forward.into_owned(),
        };
        *req.uri_mut() =
            http::Uri::try_from(target).map_err(|_| Problem::malformed("request target"))?;
    }
    if let Some(r) = route {
        req.extensions_mut().insert(r);
    }
    Ok(())
}

/// A `Host` value already canonical (lowercase name, no trailing dot, a
/// plain port), the usual case, told without a copy.
fn plain_host(h: &str) -> bool {
    let (name, port) = match h.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (h, None),
    };
    let name_ok = !name.is_empty()
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && !p.starts_with('0')
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok()
    });
    name_ok && port_ok
}

/// Where a request goes: `None` when no room guards it (not for the
/// gateway's own endpoints, and outside every room's paths or let by its
/// room's bypass rules: straight to the origin); otherwise through the
/// router, with the room that guards it when one does.
fn guard_of<B>(
    state: &AppState,
    req: &http::Request<B>,
    client: &ClientInfo,
) -> Option<Option<crate::gate::GuardedBy>> {
    let path = req.uri().path();
    if path.starts_with("/_sluice/") || path == "/_sluice" || path == "/metrics" {
        return Some(None);
    }
    crate::gate::guarding_room(state, req, client.ip)
        .map(|room| Some(crate::gate::GuardedBy(room.clone())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A future whose state is `N` bytes held across an await.
    async fn weighing<const N: usize>() -> http::Response<axum::body::Body> {
        let state = [7u8; N];
        tokio::task::yield_now().await;
        http::Response::new(axum::body::Body::from(state.to_vec()))
    }

    fn layers_of<F>(call: F) -> impl Future<Output = http::Response<axum::body::Body>> + use<F>
    where
        F: Future<Output = http::Response<axum::body::Body>>,
    {
        outer_layers(
            call,
            http::HeaderValue::from_static("id"),
            tracing::Span::none(),
            std::time::Instant::now(),
        )
    }

    /// Whatever wraps a call past the router holds the call's state once:
    /// as an `async fn`, `outer_layers` held it three times (a hold's boxed
    /// state grew to 44 KB, all copied into its box on every hold).
    #[test]
    fn the_outer_layers_hold_a_call_once() {
        let call = weighing::<16_384>();
        let alone = std::mem::size_of_val(&call);
        assert!(alone >= 16_384);
        let layered = std::mem::size_of_val(&layers_of(weighing::<16_384>()));
        assert!(
            layered <= alone + 256,
            "{layered} bytes around a call of {alone}"
        );
    }

    /// The same for a real hold, as the edge builds it: the boxed state is
    /// the handler's and a few words more.
    #[tokio::test]
    async fn a_hold_past_the_router_holds_its_handler_once() {
        let config = crate::config::Config {
            origin: Some("http://127.0.0.1:9".into()),
            ..crate::config::Config::default()
        }
        .with_defaults();
        let st = AppState::new(config).await.unwrap();
        let info = ClientInfo::resolve(
            SocketAddr::from(([127, 0, 0, 1], 9)),
            &http::HeaderMap::new(),
            &[],
        );
        let req = || {
            http::Request::post("/_sluice/events/demo/holds")
                .body(axum::body::Body::from("{\"qty\":1}"))
                .unwrap()
        };
        let call = || {
            crate::app::direct::answer(
                st.clone(),
                crate::app::direct::Call::Hold,
                "demo".into(),
                info.clone(),
                req(),
            )
        };
        let alone = std::mem::size_of_val(&call());
        let whole = std::mem::size_of_val(&with_content_length(layers_of(call())));
        assert!(
            whole <= alone + 256,
            "{whole} bytes around a hold of {alone}"
        );
    }
}
