//! The connections to the origin: HTTP/1.1 over small pools of keep-alive
//! connections, one pool per I/O thread.
//!
//! Two kinds of connection, each with its own pool:
//! - **Native** ([`sluice_wire::origin`], [`sluice_wire::h1`]), for a
//!   request without a body (most of them: page views, assets, API reads)
//!   that is not an upgrade: the downstream connection's task writes the
//!   request and reads the answer itself, and the response body it hands on
//!   reads from the connection as hyper's server asks for it. The connection goes back to the pool when
//!   that body has been read to its end.
//! - **hyper's** connection-level client, for a request with a body and for
//!   upgrades (WebSocket): a connection goes back on the stack as soon as
//!   its response head is in, still busy with the body; a checkout takes
//!   the most recently used connection that is ready, skips busy ones and
//!   drops closed or long-idle ones. (Not hyper-util's pooled client, which
//!   spawns a task per request to put a connection back.)
//!
//! For both:
//! - **Bounded:** at most `max_idle` connections of each kind are kept per
//!   pool; past it a connection is closed once its exchange is over.
//! - **Idle timeout:** a connection unused for `idle_timeout` is dropped at
//!   the next checkout (the oldest are looked at first).
//! - **Safe retry:** a request that a pooled connection could not take (it
//!   closed, say the origin's keep-alive ran out, before the request was
//!   written) goes once to a fresh connection. A bodiless request whose
//!   pooled connection closed without a byte of answer is sent once more
//!   on a fresh connection when its method is idempotent (RFC 9110 §9.2.2:
//!   GET, HEAD, OPTIONS, TRACE, PUT, DELETE); any other request already
//!   written is never sent twice.
//! - **Upgrades** pass through hyper's connections, served with upgrades;
//!   an upgraded connection never returns to the pool.
//! - **One pool per I/O thread** ([`set_io_thread`]): a connection is made,
//!   driven and reused on the thread of the requests it carries, so no
//!   request wakes another thread's event loop on its way to the origin and
//!   back. Other threads share one more pool.
//!
//! An `https://` origin ([`Upstream::with_tls`]) takes neither the native
//! path nor plain sockets: every request goes through hyper's connections
//! over TLS ([`crate::proxy::tls`]). The origin's ALPN pick decides the
//! kind: HTTP/1.1 connections share the pool above (the same bounds, idle
//! timeout and safe retry); an HTTP/2 connection is kept one per shard and
//! carries every request of that shard at once, until it closes or idles
//! out. A WebSocket handshake takes an HTTP/1.1 connection (offering
//! `http/1.1` alone). A plain `http://` origin's path is unchanged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Method, Request, Response};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use sluice_wire::h1::{self, WireError};
use sluice_wire::origin::{self, Conn};
use tokio::net::TcpStream;

use crate::proxy::tls::{self, OriginTls, TlsFailure};

/// Why a request got no response from the origin.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, unreachable, timed out).
    #[error("connect to {addr}: {reason}")]
    Connect {
        /// Where to.
        addr: String,
        /// Why not.
        reason: String,
        /// The connect timeout ran out.
        timed_out: bool,
    },
    /// The TCP connection was made, the TLS handshake on it failed (an
    /// `https://` origin).
    #[error("TLS handshake with {addr}: {}", failure.detail)]
    Tls {
        /// Where to.
        addr: String,
        /// Why, and the key of its cause.
        failure: TlsFailure,
    },
    /// The exchange failed once the connection was there (hyper's client).
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The exchange failed once the connection was there (native).
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// A pool of HTTP/1.1 connections to one origin address.
pub struct Upstream {
    /// `host:port` to connect to.
    addr: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Most connections of each kind kept by each shard.
    max_idle: usize,
    /// One shard per I/O thread, then one for every other thread.
    shards: Box<[Mutex<Shard>]>,
    /// Set for an `https://` origin.
    tls: Option<OriginTls>,
}

/// The idle connections of one shard, the most recently used last.
#[derive(Default)]
struct Shard {
    hyper: Vec<Pooled>,
    native: Vec<Idle>,
    /// The HTTP/2 connection to an `https://` origin that picked `h2`.
    h2: Option<Shared>,
}

/// An HTTP/2 connection, shared by the requests of its shard.
struct Shared {
    tx: http2::SendRequest<Body>,
    /// When a request last took it.
    since: Instant,
}

/// A fresh connection to an `https://` origin, of the kind its ALPN pick
/// made.
enum Fresh {
    H1(http1::SendRequest<Body>),
    H2(http2::SendRequest<Body>),
}

struct Pooled {
    tx: http1::SendRequest<Body>,
    /// When it last came back.
    since: Instant,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// A request without a body about to go to the origin natively
/// ([`Upstream::native`]).
pub struct NativeSend {
    upstream: Arc<Upstream>,
    conn: Option<Conn>,
    head: Vec<u8>,
}

impl NativeSend {
    /// The buffer the request head is to be written in (empty).
    pub fn head(&mut self) -> &mut Vec<u8> {
        &mut self.head
    }

    /// Sends the head and waits for the response head; the body streams
    /// afterwards. `method` is the request's.
    pub async fn send(self, method: Method) -> Result<Response<Body>, UpstreamError> {
        let NativeSend {
            upstream,
            conn,
            mut head,
        } = self;
        if let Some(mut conn) = conn {
            conn.write = head;
            match upstream.exchange(conn, &method).await {
                Ok(res) => return Ok(res),
                // The kept connection had closed: once more on a fresh one.
                Err(failed) => {
                    if !(failed.unanswered && idempotent(&method)) {
                        return Err(failed.error.into());
                    }
                    tracing::debug!(error = %failed.error, "pooled origin connection closed; sending again");
                    head = failed.head;
                }
            }
        }
        let stream = upstream.connect_stream().await?;
        let conn = Conn::new(stream, head);
        upstream
            .exchange(conn, &method)
            .await
            .map_err(|f| f.error.into())
    }
}

thread_local! {
    /// The number of this thread among the server's I/O threads.
    static IO_THREAD: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Marks the current thread as the server's I/O thread `i`: the requests it
/// serves take their upstream connections from a pool shard of its own.
pub fn set_io_thread(i: usize) {
    IO_THREAD.set(Some(i));
}

/// The number of the current thread among the server's I/O threads, if
/// it is one.
pub fn io_thread() -> Option<usize> {
    IO_THREAD.get()
}

/// RFC 9110 §9.2.2.
fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

impl Upstream {
    /// A pool for `addr` (`host:port`) with a shard for each of
    /// `io_threads` threads and one for the rest, each keeping at most
    /// `max_idle` connections of each kind.
    pub fn new(
        addr: String,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
        io_threads: usize,
    ) -> Upstream {
        Upstream {
            addr,
            connect_timeout,
            idle_timeout,
            max_idle,
            shards: (0..=io_threads).map(|_| Mutex::default()).collect(),
            tls: None,
        }
    }

    /// The same pool to an `https://` origin: every connection speaks TLS.
    pub fn with_tls(mut self, tls: OriginTls) -> Upstream {
        self.tls = Some(tls);
        self
    }

    /// Whether the origin is reached over TLS (no native path then).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The shard of the calling thread.
    fn shard(&self) -> &Mutex<Shard> {
        let others = self.shards.len() - 1;
        let i = match IO_THREAD.get() {
            Some(i) if others > 0 => i % others,
            _ => others,
        };
        &self.shards[i]
    }

    /// Sends `req` (origin-form target, `Host` set) and waits for the
    /// response head; the body streams afterwards.
    pub async fn send(
        self: &Arc<Self>,
        req: Request<Body>,
    ) -> Result<Response<Body>, UpstreamError> {
        if let Some(tls) = &self.tls {
            return self.send_tls(tls, req).await;
        }
        let native = http_body::Body::is_end_stream(req.body())
            && *req.method() != Method::CONNECT
            && !req.headers().contains_key(http::header::UPGRADE);
        if native {
            self.send_native(req).await
        } else {
            self.send_hyper(req).await
        }
    }

    /// Connections kept now, of both kinds (ready or still busy with a
    /// response body).
    pub fn pooled(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.hyper.len() + s.native.len() + usize::from(s.h2.is_some())
            })
            .sum()
    }

    async fn send_native(
        self: &Arc<Self>,
        req: Request<Body>,
    ) -> Result<Response<Body>, UpstreamError> {
        let mut send = self.native();
        h1::encode_request_head(&req, send.head());
        let method = req.method().clone();
        // The request (its body is not `Sync`) is gone before the first wait.
        drop(req);
        send.send(method).await
    }

    /// A native exchange to prepare: write its request head into
    /// [`NativeSend::head`], then [`NativeSend::send`] it. Takes a kept
    /// connection now, if there is one, and its head buffer.
    pub fn native(self: &Arc<Self>) -> NativeSend {
        let mut conn = self.checkout_native();
        let mut head = conn
            .as_mut()
            .map(|c| std::mem::take(&mut c.write))
            .unwrap_or_default();
        head.clear();
        NativeSend {
            upstream: self.clone(),
            conn,
            head,
        }
    }

    /// Writes the request head in `conn.write` and reads the response head
    /// ([`origin::exchange`]); the body goes back to this pool when read to
    /// a clean end.
    async fn exchange(
        self: &Arc<Self>,
        conn: Conn,
        method: &Method,
    ) -> Result<Response<Body>, origin::Failed> {
        origin::exchange(conn, method, self)
            .await
            .map(|res| res.map(Body::new))
    }

    /// The most recently used native connection that is still open.
    fn checkout_native(&self) -> Option<Conn> {
        let now = Instant::now();
        loop {
            let idle = {
                let mut shard = self.shard().lock();
                let native = &mut shard.native;
                // The oldest first: connections idle too long are closed.
                let expired = native
                    .iter()
                    .take_while(|i| now.duration_since(i.since) >= self.idle_timeout)
                    .count();
                native.drain(..expired);
                native.pop()?
            };
            if idle.conn.still_open() {
                return Some(idle.conn);
            }
        }
    }

    /// Keeps a native connection whose exchange is over.
    fn checkin_native(&self, conn: Conn) {
        let mut shard = self.shard().lock();
        if shard.native.len() < self.max_idle {
            shard.native.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    async fn send_hyper(&self, req: Request<Body>) -> Result<Response<Body>, UpstreamError> {
        let req = match self.checkout_hyper() {
            Some(mut tx) => match tx.try_send_request(req).await {
                Ok(res) => {
                    self.checkin_hyper(tx, &res);
                    return Ok(res.map(Body::new));
                }
                Err(mut e) => match e.take_message() {
                    // Never written: safe to send on a fresh connection.
                    Some(req) => req,
                    None => return Err(e.into_error().into()),
                },
            },
            None => req,
        };
        let mut tx = self.connect_hyper().await?;
        let res = tx.send_request(req).await?;
        self.checkin_hyper(tx, &res);
        Ok(res.map(Body::new))
    }

    /// The most recently used hyper connection that is ready for a request.
    fn checkout_hyper(&self) -> Option<http1::SendRequest<Body>> {
        let now = Instant::now();
        let mut shard = self.shard().lock();
        let idle = &mut shard.hyper;
        // The oldest first: connections idle too long are closed.
        while idle
            .first()
            .is_some_and(|p| now.duration_since(p.since) >= self.idle_timeout)
        {
            idle.remove(0);
        }
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            if idle[i].tx.is_closed() {
                idle.remove(i);
            } else if idle[i].tx.is_ready() {
                return Some(idle.remove(i).tx);
            }
            // else: still streaming its previous response; left in place
        }
        None
    }

    /// Puts a hyper connection back once its response head is in; it is
    /// ready again when that response's body is over.
    fn checkin_hyper(&self, tx: http1::SendRequest<Body>, res: &Response<hyper::body::Incoming>) {
        if tx.is_closed() || res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            return;
        }
        let mut shard = self.shard().lock();
        if shard.hyper.len() < self.max_idle {
            shard.hyper.push(Pooled {
                tx,
                since: Instant::now(),
            });
        }
        // else dropped: the connection closes when its exchange is over
    }

    async fn connect_stream(&self) -> Result<TcpStream, UpstreamError> {
        let fail = |reason: String, timed_out: bool| UpstreamError::Connect {
            addr: self.addr.clone(),
            reason,
            timed_out,
        };
        let stream = match tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect(self.addr.as_str()),
        )
        .await
        {
            Err(_) => return Err(fail("timed out".into(), true)),
            Ok(Err(e)) => return Err(fail(e.to_string(), false)),
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    async fn connect_hyper(&self) -> Result<http1::SendRequest<Body>, UpstreamError> {
        let stream = self.connect_stream().await?;
        // One write buffer (as the server's): fewer instructions per request.
        let (tx, conn) = http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(tx)
    }
}

/// An `https://` origin's requests (see the module doc).
impl Upstream {
    async fn send_tls(
        &self,
        tls: &OriginTls,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, UpstreamError> {
        let upgrade = req.headers().contains_key(http::header::UPGRADE);
        if !upgrade {
            if let Some(mut tx) = self.checkout_h2() {
                for_h2(&mut req);
                match tx.try_send_request(req).await {
                    Ok(res) => return Ok(res.map(Body::new)),
                    Err(mut e) => match e.take_message() {
                        // Never sent: the connection is gone; a fresh one.
                        Some(r) => {
                            self.forget_h2(&tx);
                            req = r;
                        }
                        None => return Err(e.into_error().into()),
                    },
                }
            }
            if let Some(mut tx) = self.checkout_hyper() {
                for_h1(&mut req);
                match tx.try_send_request(req).await {
                    Ok(res) => {
                        self.checkin_hyper(tx, &res);
                        return Ok(res.map(Body::new));
                    }
                    Err(mut e) => match e.take_message() {
                        Some(r) => req = r,
                        None => return Err(e.into_error().into()),
                    },
                }
            }
        }
        match self.connect_tls(tls, upgrade).await? {
            Fresh::H1(mut tx) => {
                for_h1(&mut req);
                let res = tx.send_request(req).await?;
                self.checkin_hyper(tx, &res);
                Ok(res.map(Body::new))
            }
            Fresh::H2(mut tx) => {
                self.keep_h2(tx.clone());
                for_h2(&mut req);
                Ok(tx.send_request(req).await?.map(Body::new))
            }
        }
    }

    /// This shard's HTTP/2 connection, while it is open and has not idled
    /// out.
    fn checkout_h2(&self) -> Option<http2::SendRequest<Body>> {
        let now = Instant::now();
        let mut shard = self.shard().lock();
        let shared = shard.h2.as_mut()?;
        if shared.tx.is_closed() || now.duration_since(shared.since) >= self.idle_timeout {
            // Dropping the last sender closes the connection once its
            // streams are over.
            shard.h2 = None;
            return None;
        }
        shared.since = now;
        Some(shared.tx.clone())
    }

    /// Keeps a fresh HTTP/2 connection for this shard's next requests.
    fn keep_h2(&self, tx: http2::SendRequest<Body>) {
        if self.max_idle == 0 {
            return;
        }
        self.shard().lock().h2 = Some(Shared {
            tx,
            since: Instant::now(),
        });
    }

    /// Drops this shard's HTTP/2 connection if it is `tx`'s (closed).
    fn forget_h2(&self, tx: &http2::SendRequest<Body>) {
        let mut shard = self.shard().lock();
        if shard.h2.as_ref().is_some_and(|s| s.tx.is_closed()) || tx.is_closed() {
            shard.h2 = None;
        }
    }

    /// A TCP connection, then the TLS handshake on it, then HTTP/2 or
    /// HTTP/1.1 as the origin picked (HTTP/1.1 alone for an upgrade).
    async fn connect_tls(&self, tls: &OriginTls, h1_only: bool) -> Result<Fresh, UpstreamError> {
        let tcp = self.connect_stream().await?;
        let stream = tls
            .handshake(tcp, h1_only, self.connect_timeout)
            .await
            .map_err(|failure| UpstreamError::Tls {
                addr: self.addr.clone(),
                failure,
            })?;
        if tls::is_h2(&stream) {
            let (tx, conn) = http2::Builder::new(TokioExecutor::new())
                .handshake(TokioIo::new(stream))
                .await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream h2 connection ended with an error");
                }
            });
            return Ok(Fresh::H2(tx));
        }
        let (tx, conn) = http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(Fresh::H1(tx))
    }
}

/// An origin-form request for an HTTP/1.1 connection: its target
/// `/path?query`, the authority (if an HTTP/2 attempt put it there) back in
/// `Host`.
fn for_h1(req: &mut Request<Body>) {
    *req.version_mut() = http::Version::HTTP_11;
    if let Some(authority) = req.uri().authority().cloned() {
        if !req.headers().contains_key(http::header::HOST)
            && let Ok(v) = http::HeaderValue::from_str(authority.as_str())
        {
            req.headers_mut().insert(http::header::HOST, v);
        }
        let mut parts = req.uri().clone().into_parts();
        parts.scheme = None;
        parts.authority = None;
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
}

/// The same request for an HTTP/2 connection: `https://{Host}/path?query`
/// (HTTP/2 carries the host as `:authority`, which must not differ from a
/// `Host` header: RFC 9113 §8.3.1, so `Host` is taken out).
fn for_h2(req: &mut Request<Body>) {
    *req.version_mut() = http::Version::HTTP_2;
    if req.uri().authority().is_some() {
        return;
    }
    let Some(host) = req.headers().get(http::header::HOST) else {
        return;
    };
    let Ok(authority) = http::uri::Authority::try_from(host.as_bytes()) else {
        // A Host that is no authority goes on as a header.
        return;
    };
    let mut parts = req.uri().clone().into_parts();
    parts.scheme = Some(http::uri::Scheme::HTTPS);
    parts.authority = Some(authority);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = http::Uri::from_parts(parts) {
        *req.uri_mut() = uri;
        req.headers_mut().remove(http::header::HOST);
    }
}

impl origin::Pool<TcpStream> for Upstream {
    fn checkin(&self, conn: Conn) {
        self.checkin_native(conn);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use hyper::service::service_fn;
    use tokio::net::TcpListener;

    use super::*;

    /// An origin answering `ok` after `delay`, counting the connections it
    /// accepted; with `one_per_connection` it silently drops each
    /// connection after one answer (no `Connection: close`), as an origin
    /// whose keep-alive ran out does.
    async fn origin(delay: Duration, one_per_connection: bool) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if one_per_connection {
                        // One exchange by hand, then the socket is dropped.
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut stream = stream;
                        let mut head = Vec::new();
                        let mut buf = [0u8; 1024];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                        return;
                    }
                    let svc = service_fn(move |_req| async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(b"ok"),
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    fn get() -> Request<Body> {
        Request::builder()
            .uri("/")
            .header("host", "origin")
            .body(Body::empty())
            .unwrap()
    }

    async fn ok(up: &Arc<Upstream>) {
        let res = up.send(get()).await.expect("a response");
        assert_eq!(res.status(), 200);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }

    #[tokio::test]
    async fn one_connection_carries_sequential_requests() {
        let (addr, accepted) = origin(Duration::ZERO, false).await;
        let up = Arc::new(Upstream::new(
            addr,
            Duration::from_secs(1),
            Duration::from_secs(60),
            8,
            0,
        ));
        for _ in 0..20 {
            ok(&up).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(up.pooled(), 1);
    }

    #[tokio::test]
    async fn concurrent_requests_open_connections_and_the_pool_keeps_max_idle() {
        let (addr, accepted) = origin(Duration::from_millis(100), false).await;
        let up = Arc::new(Upstream::new(
            addr,
            Duration::from_secs(1),
            Duration::from_secs(60),
            3,
            0,
        ));
        let all = (0..10).map(|_| {
            let up = up.clone();
            tokio::spawn(async move { ok(&up).await })
        });
        for t in futures_util::future::join_all(all).await {
            t.unwrap();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 10);
        assert_eq!(up.pooled(), 3, "at most max_idle kept");
        // Those three carry the next requests.
        for _ in 0..6 {
            ok(&up).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 10);
    }

    #[tokio::test]
    async fn an_origin_dropping_kept_alive_connections_loses_no_request() {
        let (addr, accepted) = origin(Duration::ZERO, true).await;
        let up = Arc::new(Upstream::new(
            addr,
            Duration::from_secs(1),
            Duration::from_secs(60),
            8,
            0,
        ));
        for i in 0..20 {
            ok(&up).await;
            if i % 2 == 0 {
                // Sometimes the drop is seen before the next checkout,
                // sometimes only when the request is refused: both must work.
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 20);
    }

    #[tokio::test]
    async fn idle_connections_time_out() {
        let (addr, accepted) = origin(Duration::ZERO, false).await;
        let up = Arc::new(Upstream::new(
            addr,
            Duration::from_secs(1),
            Duration::from_millis(50),
            8,
            0,
        ));
        ok(&up).await;
        ok(&up).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(120)).await;
        ok(&up).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "a fresh connection");
    }

    #[tokio::test]
    async fn nobody_listening_is_a_connect_error() {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let up = Arc::new(Upstream::new(
            addr,
            Duration::from_secs(1),
            Duration::from_secs(60),
            8,
            0,
        ));
        match up.send(get()).await {
            Err(UpstreamError::Connect { timed_out, .. }) => assert!(!timed_out),
            other => panic!("{other:?}"),
        }
    }

    /// A scripted origin: for each request head it reads, it writes the
    /// next answer of `answers` in the given pieces (a few milliseconds
    /// apart, so the reader sees partial heads and bodies), then closes the
    /// connection when `close` says so. Counts connections and requests.
    struct Scripted {
        addr: String,
        accepted: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
    }

    async fn scripted(answers: Vec<(Vec<&'static [u8]>, bool)>) -> Scripted {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let answers = Arc::new(answers);
        let (acc, req) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                acc.fetch_add(1, Ordering::SeqCst);
                let (answers, req) = (answers.clone(), req.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        buf.drain(..end);
                        let i = req.fetch_add(1, Ordering::SeqCst);
                        let (pieces, close) = &answers[i % answers.len()];
                        for p in pieces {
                            if stream.write_all(p).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(3)).await;
                        }
                        if *close {
                            return;
                        }
                    }
                });
            }
        });
        Scripted {
            addr,
            accepted,
            requests,
        }
    }

    // How the native reader reads each answer, against hyper's client, is
    // `sluice-wire`'s test (`wire/tests/origin.rs`); here, the pool.

    #[tokio::test]
    async fn native_connections_are_reused_only_after_a_clean_end() {
        let get = || {
            Request::get("/")
                .header("host", "o")
                .body(Body::empty())
                .unwrap()
        };
        let run = |answer: &'static [u8]| async move {
            let origin = scripted(vec![(vec![answer], false)]).await;
            let up = Arc::new(Upstream::new(
                origin.addr.clone(),
                Duration::from_secs(1),
                Duration::from_secs(60),
                8,
                0,
            ));
            for _ in 0..3 {
                let res = up.send(get()).await.unwrap();
                let _ = res.into_body().collect().await;
            }
            origin.accepted.load(Ordering::SeqCst)
        };
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await,
            1
        );
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n").await,
            1
        );
        assert_eq!(run(b"HTTP/1.1 204 No Content\r\n\r\n").await, 1);
        // Asked to close, or sent more than the response: never again.
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok").await,
            3
        );
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA").await,
            3
        );
        assert_eq!(
            run(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok").await,
            3
        );
        assert_eq!(run(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n2\r\nok\r\n0\r\n\r\n").await, 3);

        // A body dropped before its end takes its connection with it.
        let origin = scripted(vec![(
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
                b"world",
            ],
            false,
        )])
        .await;
        let up = Arc::new(Upstream::new(
            origin.addr.clone(),
            Duration::from_secs(1),
            Duration::from_secs(60),
            8,
            0,
        ));
        drop(up.send(get()).await.unwrap());
        let res = up.send(get()).await.unwrap();
        assert_eq!(
            &res.into_body().collect().await.unwrap().to_bytes()[..],
            b"helloworld"
        );
        assert_eq!(origin.accepted.load(Ordering::SeqCst), 2);
    }

    /// An origin that takes the second request of each connection and
    /// closes without an answer (it may have acted on it): a bodiless POST
    /// is then never sent again, a GET is, once, on a fresh connection.
    #[tokio::test]
    async fn only_idempotent_requests_are_sent_twice() {
        let answer: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let req = |m: Method| {
            Request::builder()
                .method(m)
                .uri("/")
                .header("host", "o")
                .body(Body::empty())
                .unwrap()
        };
        for (method, retried) in [
            (Method::POST, false),
            (Method::PATCH, false),
            (Method::GET, true),
            (Method::PUT, true),
        ] {
            let origin = scripted(vec![(vec![answer], false), (vec![], true)]).await;
            let up = Arc::new(Upstream::new(
                origin.addr.clone(),
                Duration::from_secs(1),
                Duration::from_secs(60),
                8,
                0,
            ));
            let first = up.send(req(method.clone())).await.unwrap();
            assert!(first.into_body().collect().await.is_ok());
            let second = up.send(req(method.clone())).await;
            let seen_by_origin = origin.requests.load(Ordering::SeqCst);
            if retried {
                let res = second.expect("sent again on a fresh connection");
                assert_eq!(
                    &res.into_body().collect().await.unwrap().to_bytes()[..],
                    b"ok"
                );
                assert_eq!(
                    (seen_by_origin, origin.accepted.load(Ordering::SeqCst)),
                    (3, 2),
                    "{method}"
                );
            } else {
                assert!(
                    second.is_err(),
                    "{method}: answered without being sent twice?"
                );
                assert_eq!(seen_by_origin, 2, "{method} reached the origin twice");
            }
        }
    }
}
