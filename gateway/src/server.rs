//! The HTTP front: accepts connections, speaks HTTP/1.1 and HTTP/2
//! (cleartext, prior knowledge) on the same port, passes upgrades through,
//! and drains in-flight requests on shutdown.
//!
//! Open connections are bounded by `limits.max_connections`: a connection
//! accepted past it is closed at once, unread (the client sees an empty reply
//! or a reset), and counted in `sluice_shed_total{what="connection"}`.
//! Closing rather than leaving it in the listen backlog keeps the answer
//! immediate and keeps the connections already open served.
//!
//! [`serve`] takes its listener and a shutdown future, so `main` and the
//! tests run exactly the same code.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::app::{self, AppState, REQUEST_ID};
use crate::client_ip::ClientInfo;

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
/// in-flight requests to finish.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = state.config().clone();
    // Request ids come from one counter, whichever way a request goes.
    let ids = crate::app::RequestIds::default();
    let router: Router = app::build_with_ids(state.clone(), ids.clone());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The header read timeout is the connection's own (`HeadDeadline`),
    // not hyper's, which sets a timer for every request.
    builder
        .http1()
        .header_read_timeout(None)
        .max_headers(config.limits.max_headers)
        .max_buf_size(config.limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(config.limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let graceful = GracefulShutdown::new();
    let trusted = std::sync::Arc::new(config.trusted_proxies.clone());
    let connections =
        std::sync::Arc::new(tokio::sync::Semaphore::new(config.limits.max_connections));
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            state.telemetry().shed("connection");
            tracing::debug!(%peer, "closed: limits.max_connections reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let trusted = trusted.clone();
        let router = router.clone();
        let st = state.clone();
        let ids = ids.clone();
        let header_timeout = config.timeouts.header_read;
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // Held while the connection lives.
            let _permit = permit;
            let Some(version) = first_bytes_within(&stream, header_timeout).await else {
                tracing::debug!(%peer, "closed: no request within the header timeout");
                return;
            };
            let head = (version == Version::Http1).then(|| Arc::new(HeadDeadline::new()));
            let svc = service(st, router, ids, trusted, peer, head.clone());
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(svc))
                .into_owned();
            let conn = async move {
                if let Err(e) = watcher.watch(conn).await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            };
            let Some(head) = head else {
                // HTTP/2 bounds its streams and pings of its own.
                return conn.await;
            };
            // The connection in a task of its own, so that this one, the
            // deadline's, wakes only for its timer or the connection's end.
            let mut conn = tokio::spawn(conn);
            tokio::select! {
                _ = &mut conn => {}
                () = head.enforce(header_timeout) => {
                    tracing::debug!(%peer, "closed: no request head within the header timeout");
                    conn.abort();
                }
            }
        });
    }

    drop(listener);
    state.begin_shutdown();
    tracing::info!("shutting down: draining in-flight requests");
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(config.timeouts.shutdown_grace) => {
            tracing::warn!("grace period over; closing remaining connections");
        }
    }
    Ok(())
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

/// The header read timeout of one HTTP/1 connection: the client has
/// `timeouts.header_read` to send a request head, counted from the
/// connection's opening or from the end of the previous response (so an
/// idle keep-alive connection is closed too), never while a request is
/// being answered. One timer for the connection, re-armed when it runs
/// out, instead of one per request as hyper's own timeout sets.
struct HeadDeadline {
    opened: std::time::Instant,
    /// Milliseconds after `opened` when the connection last became idle,
    /// or [`HeadDeadline::BUSY`] while a request is being answered.
    idle_since_ms: AtomicU64,
}

impl HeadDeadline {
    const BUSY: u64 = u64::MAX;

    fn new() -> HeadDeadline {
        HeadDeadline {
            opened: std::time::Instant::now(),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    /// A request head is in: no deadline until its response is over.
    fn busy(&self) {
        self.idle_since_ms.store(Self::BUSY, Ordering::Release);
    }

    /// The response is over (its body finished or dropped): the next head
    /// is due within the timeout.
    fn idle(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(Self::BUSY - 1);
        self.idle_since_ms.store(ms, Ordering::Release);
    }

    /// Completes when the connection has been idle for `limit` with no
    /// request head.
    async fn enforce(&self, limit: Duration) {
        loop {
            let since = self.idle_since_ms.load(Ordering::Acquire);
            if since == Self::BUSY {
                tokio::time::sleep(limit).await;
                continue;
            }
            let deadline = self.opened + Duration::from_millis(since) + limit;
            if std::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

/// A response body that tells the connection's [`HeadDeadline`] when it is
/// over (hyper drops it once written, or when the connection goes).
pub(crate) struct ResponseBody {
    inner: axum::body::Body,
    head: Option<Arc<HeadDeadline>>,
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

/// The service of one connection: a request no room guards goes straight
/// to the proxy; everything else through the router and its layers.
fn service(
    st: AppState,
    router: Router,
    ids: crate::app::RequestIds,
    trusted: Arc<Vec<ipnet::IpNet>>,
    peer: SocketAddr,
    head: Option<Arc<HeadDeadline>>,
) -> impl tower::Service<
    http::Request<Incoming>,
    Response = http::Response<ResponseBody>,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<http::Response<ResponseBody>, std::convert::Infallible>> + Send,
> + Clone {
    tower::service_fn(move |mut req: http::Request<Incoming>| {
        use futures_util::FutureExt as _;
        if let Some(head) = &head {
            head.busy();
        }
        let head = head.clone();
        let wrap = move |res: http::Response<axum::body::Body>| {
            res.map(|inner| ResponseBody { inner, head })
        };
        let info = ClientInfo::resolve(peer, req.headers(), &trusted);
        if unguarded(&st, &req, &info) {
            // Straight to the origin: no room guards the path.
            let st = st.clone();
            let id = match req.headers().get(&REQUEST_ID) {
                Some(v) => v.clone(),
                None => {
                    let v = ids.next_value();
                    req.headers_mut().insert(REQUEST_ID, v.clone());
                    v
                }
            };
            futures_util::future::Either::Left(async move {
                let req = req.map(axum::body::Body::new);
                let forward = st.proxy().forward(req, &info, http::HeaderMap::new());
                // As the router's CatchPanicLayer: a bug is a 500, never a
                // dropped connection.
                let mut res = std::panic::AssertUnwindSafe(forward)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(crate::app::panic_response);
                res.headers_mut().insert(REQUEST_ID, id);
                Ok::<_, std::convert::Infallible>(wrap(res))
            })
        } else {
            req.extensions_mut().insert(info);
            futures_util::future::Either::Right(
                router.clone().oneshot(req).map(move |res| res.map(wrap)),
            )
        }
    })
}

/// A request no room guards: not for the gateway's own endpoints, and
/// either outside every room's paths or let by its room's bypass rules.
fn unguarded<B>(state: &AppState, req: &http::Request<B>, client: &ClientInfo) -> bool {
    let path = req.uri().path();
    if path.starts_with("/_sluice/") || path == "/_sluice" || path == "/metrics" {
        return false;
    }
    crate::gate::guarding_room(state, req, client.ip).is_none()
}
