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
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::app::{self, AppState};
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
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.timeouts.header_read)
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
        let mut ids = ids.clone();
        let svc = tower::service_fn(move |mut req: http::Request<Incoming>| {
            let info = ClientInfo::resolve(peer, req.headers(), &trusted);
            if unguarded(&st, &req, &info) {
                // Straight to the origin: no room guards the path.
                use tower_http::request_id::MakeRequestId;
                let st = st.clone();
                let id = match req.headers().get("x-request-id") {
                    Some(v) => v.clone(),
                    None => {
                        let v = ids
                            .make_request_id(&req)
                            .map(|r| r.header_value().clone())
                            .unwrap_or_else(|| http::HeaderValue::from_static("-"));
                        req.headers_mut().insert("x-request-id", v.clone());
                        v
                    }
                };
                futures_util::future::Either::Left(async move {
                    use futures_util::FutureExt as _;
                    let req = req.map(axum::body::Body::new);
                    let forward = st.proxy().forward(req, &info, http::HeaderMap::new());
                    // As the router's CatchPanicLayer: a bug is a 500, never a
                    // dropped connection.
                    let mut res = std::panic::AssertUnwindSafe(forward)
                        .catch_unwind()
                        .await
                        .unwrap_or_else(crate::app::panic_response);
                    res.headers_mut().insert("x-request-id", id);
                    Ok::<_, std::convert::Infallible>(res)
                })
            } else {
                req.extensions_mut().insert(info);
                futures_util::future::Either::Right(router.clone().oneshot(req))
            }
        });
        let header_timeout = config.timeouts.header_read;
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // Held while the connection lives.
            let _permit = permit;
            if !first_bytes_within(&stream, header_timeout).await {
                tracing::debug!(%peer, "closed: no request within the header timeout");
                return;
            }
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(svc))
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
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

/// Waits until the client has sent enough bytes for the HTTP version to be
/// known (hyper's version detection has no timeout of its own; its header
/// read timeout starts after it). A silent or trickling client is dropped.
async fn first_bytes_within(stream: &TcpStream, limit: Duration) -> bool {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 24];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) | Err(_) => return false,
        };
        if n == 0 {
            return false;
        }
        if n >= PREFACE.len() || buf[..n] != PREFACE[..n] {
            return true;
        }
        // A partial HTTP/2 preface: wait for more.
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
