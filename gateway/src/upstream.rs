//! The connections to the origin: HTTP/1.1 over a small pool of keep-alive
//! connections, built on hyper's connection-level client.
//!
//! Why not hyper-util's pooled client: for every request it checks a
//! connection out through its pool's futures and, once the response
//! head is in, spawns a task that waits for the connection to be ready
//! again and puts it back. Here a connection goes back on the stack as soon
//! as its response head is in, still busy with the body; a checkout takes
//! the most recently used connection that is ready (its previous exchange
//! over), skips busy ones and drops closed or long-idle ones. No task per
//! request, one lock held for a few atomic loads.
//!
//! - **Bounded:** at most `max_idle` connections are kept; past it a
//!   connection is closed once its exchange is over.
//! - **Idle timeout:** a connection unused for `idle_timeout` is dropped at
//!   the next checkout (the oldest are looked at first).
//! - **Safe retry:** a request that a pooled connection could not take (it
//!   closed, say the origin's keep-alive ran out, before the request was
//!   written) goes once to a fresh connection; a request already written
//!   is never sent twice.
//! - **Upgrades** (WebSocket) pass through: connections are served with
//!   upgrades, and an upgraded connection never returns to the pool.
//! - **One pool per I/O thread** ([`set_io_thread`]): a connection is made,
//!   driven and reused on the thread of the requests it carries, so no
//!   request wakes another thread's event loop on its way to the origin and
//!   back. Other threads share one more pool.

use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;

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
    /// The exchange failed once the connection was there.
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// A pool of HTTP/1.1 connections to one origin address.
pub struct Upstream {
    /// `host:port` to connect to.
    addr: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Most connections kept by each shard.
    max_idle: usize,
    /// One shard per I/O thread, then one for every other thread; in
    /// each, the most recently used last.
    idle: Box<[Mutex<Vec<Pooled>>]>,
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

struct Pooled {
    tx: http1::SendRequest<Body>,
    /// When it last came back.
    since: Instant,
}

impl Upstream {
    /// A pool for `addr` (`host:port`) with a shard for each of
    /// `io_threads` threads and one for the rest, each keeping at most
    /// `max_idle` connections.
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
            idle: (0..=io_threads).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// The shard of the calling thread.
    fn shard(&self) -> &Mutex<Vec<Pooled>> {
        let others = self.idle.len() - 1;
        let i = match IO_THREAD.get() {
            Some(i) if others > 0 => i % others,
            _ => others,
        };
        &self.idle[i]
    }

    /// Sends `req` (origin-form target, `Host` set) and waits for the
    /// response head; the body streams afterwards.
    pub async fn send(&self, req: Request<Body>) -> Result<Response<Incoming>, UpstreamError> {
        let req = match self.checkout() {
            Some(mut tx) => match tx.try_send_request(req).await {
                Ok(res) => {
                    self.checkin(tx, &res);
                    return Ok(res);
                }
                Err(mut e) => match e.take_message() {
                    // Never written: safe to send on a fresh connection.
                    Some(req) => req,
                    None => return Err(e.into_error().into()),
                },
            },
            None => req,
        };
        let mut tx = self.connect().await?;
        let res = tx.send_request(req).await?;
        self.checkin(tx, &res);
        Ok(res)
    }

    /// Connections kept now (ready or still busy with a response body).
    pub fn pooled(&self) -> usize {
        self.idle.iter().map(|shard| shard.lock().len()).sum()
    }

    /// The most recently used connection that is ready for a request.
    fn checkout(&self) -> Option<http1::SendRequest<Body>> {
        let now = Instant::now();
        let mut idle = self.shard().lock();
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

    /// Puts a connection back once its response head is in; it is ready
    /// again when that response's body is over.
    fn checkin(&self, tx: http1::SendRequest<Body>, res: &Response<Incoming>) {
        if tx.is_closed() || res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            return;
        }
        let mut idle = self.shard().lock();
        if idle.len() < self.max_idle {
            idle.push(Pooled {
                tx,
                since: Instant::now(),
            });
        }
        // else dropped: the connection closes when its exchange is over
    }

    async fn connect(&self) -> Result<http1::SendRequest<Body>, UpstreamError> {
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

    async fn ok(up: &Upstream) {
        let res = up.send(get()).await.expect("a response");
        assert_eq!(res.status(), 200);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }

    #[tokio::test]
    async fn one_connection_carries_sequential_requests() {
        let (addr, accepted) = origin(Duration::ZERO, false).await;
        let up = Upstream::new(addr, Duration::from_secs(1), Duration::from_secs(60), 8, 0);
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
        let up = Upstream::new(addr, Duration::from_secs(1), Duration::from_secs(60), 8, 0);
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
        let up = Upstream::new(
            addr,
            Duration::from_secs(1),
            Duration::from_millis(50),
            8,
            0,
        );
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
        let up = Upstream::new(addr, Duration::from_secs(1), Duration::from_secs(60), 8, 0);
        match up.send(get()).await {
            Err(UpstreamError::Connect { timed_out, .. }) => assert!(!timed_out),
            other => panic!("{other:?}"),
        }
    }
}
