//! A real origin server for end-to-end tests, on a free loopback port.
//!
//! Routes:
//! - `ANY /echo…` — JSON of what arrived: method, path, query, headers
//!   (all values of each), body length and SHA-256 (the body is streamed and
//!   hashed, never held whole);
//! - `GET /bytes/{n}` — `n` pseudo-random bytes, streamed in 64 KiB chunks,
//!   with their SHA-256 in the `x-body-sha256` header;
//! - `GET /chunked` — a chunked response of a few pieces;
//! - `GET /slow/{ms}` — waits, then answers `slept`;
//! - `GET /status/{code}` — answers with that status;
//! - `GET /hop` — a response carrying hop-by-hop headers that must not
//!   reach the client;
//! - `GET /command/{value}` — answers with `Sluice-Command: value`;
//! - `GET /ws` — a WebSocket echo.
//!
//! Every request is counted; the test reads the count.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, std::io::Error>;

/// A running test origin. Stops when dropped.
pub struct TestOrigin {
    /// Its address.
    pub addr: SocketAddr,
    requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl TestOrigin {
    /// Starts the origin.
    pub async fn start() -> TestOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        let addr = listener.local_addr().expect("origin addr");
        let requests = Arc::new(AtomicU64::new(0));
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let counter = counter.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        counter.fetch_add(1, Ordering::Relaxed);
                        handle(req)
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        TestOrigin {
            addr,
            requests,
            task,
        }
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for TestOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

async fn handle(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    let res = if path.starts_with("/echo") {
        echo(req).await
    } else if let Some(n) = path.strip_prefix("/bytes/") {
        bytes_response(n.parse().unwrap_or(0))
    } else if path == "/chunked" {
        let chunks =
            ["one,", "two,", "three"].map(|s| Ok::<_, std::io::Error>(Frame::data(Bytes::from(s))));
        let stream = futures_util::stream::iter(chunks);
        Response::new(BodyExt::boxed(StreamBody::new(stream)))
    } else if let Some(spec) = path.strip_prefix("/drip/") {
        // `/drip/N/MS`: N chunks of `drop N\n`, MS milliseconds apart.
        let mut it = spec.split('/').map(|p| p.parse::<u64>().unwrap_or(0));
        let (n, ms) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        let stream = futures_util::stream::unfold(0, move |i| async move {
            if i == n {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let chunk = Frame::data(Bytes::from(format!("drop {i}\n")));
            Some((Ok::<_, std::io::Error>(chunk), i + 1))
        });
        Response::new(BodyExt::boxed(StreamBody::new(stream)))
    } else if let Some(ms) = path.strip_prefix("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
        Response::new(full("slept"))
    } else if let Some(code) = path.strip_prefix("/status/") {
        let mut r = Response::new(full(format!("status {code}")));
        *r.status_mut() = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
        r
    } else if path == "/hop" {
        let mut r = Response::new(full("hop"));
        let h = r.headers_mut();
        h.insert("connection", "x-origin-private".parse().expect("hv"));
        h.insert("x-origin-private", "secret".parse().expect("hv"));
        h.insert("keep-alive", "timeout=5".parse().expect("hv"));
        h.insert("proxy-authenticate", "Basic".parse().expect("hv"));
        h.insert("x-end-to-end", "kept".parse().expect("hv"));
        r
    } else if let Some(v) = path.strip_prefix("/command/") {
        let mut r = Response::new(full("done"));
        r.headers_mut()
            .insert("sluice-command", v.parse().expect("hv"));
        r
    } else if path.starts_with("/cache") {
        // `/cache…`: answers with the Cache-Control and Vary values the
        // request names in `x-origin-cache-control` / `x-origin-vary` (each
        // may repeat), as an origin serving a cacheable asset would.
        let mut r = Response::new(full("asset"));
        for (from, to) in [
            ("x-origin-cache-control", http::header::CACHE_CONTROL),
            ("x-origin-vary", http::header::VARY),
        ] {
            for v in req.headers().get_all(from) {
                r.headers_mut().append(to.clone(), v.clone());
            }
        }
        r
    } else if path == "/ws" {
        websocket(req)
    } else {
        let mut r = Response::new(full("origin: not found"));
        *r.status_mut() = StatusCode::NOT_FOUND;
        r
    };
    Ok(res)
}

async fn echo(req: Request<Incoming>) -> Response<Body> {
    let (parts, mut body) = req.into_parts();
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    len += d.len() as u64;
                    hasher.update(d);
                }
            }
            Err(e) => {
                let mut r = Response::new(full(e.to_string()));
                *r.status_mut() = StatusCode::BAD_REQUEST;
                return r;
            }
        }
    }
    let mut headers = serde_json::Map::new();
    for name in parts.headers.keys() {
        let values: Vec<serde_json::Value> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned().into())
            .collect();
        headers.insert(name.as_str().to_owned(), values.into());
    }
    let v = serde_json::json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body_bytes": len,
        "body_sha256": crate::hex(&hasher.finalize()),
    });
    let mut r = Response::new(full(v.to_string()));
    r.headers_mut()
        .insert("content-type", "application/json".parse().expect("hv"));
    r
}

/// Deterministic pseudo-random bytes (xorshift), so tests can hash them
/// without keeping them.
pub fn pattern_chunk(seed: &mut u64, len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        v.extend_from_slice(&seed.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

/// SHA-256 (hex) of `n` pattern bytes as produced by [`pattern_stream`].
pub fn pattern_sha256(n: u64) -> String {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut h = Sha256::new();
    let mut left = n;
    while left > 0 {
        let len = left.min(64 * 1024);
        h.update(pattern_chunk(&mut seed, len as usize));
        left -= len;
    }
    crate::hex(&h.finalize())
}

/// A stream of `n` pattern bytes in 64 KiB frames.
pub fn pattern_stream(
    n: u64,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send + 'static {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut left = n;
    futures_util::stream::poll_fn(move |_| {
        if left == 0 {
            return std::task::Poll::Ready(None);
        }
        let len = left.min(64 * 1024);
        left -= len;
        std::task::Poll::Ready(Some(Ok(Frame::data(pattern_chunk(
            &mut seed,
            len as usize,
        )))))
    })
}

fn bytes_response(n: u64) -> Response<Body> {
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(pattern_stream(n))));
    r.headers_mut()
        .insert("x-body-sha256", pattern_sha256(n).parse().expect("hv"));
    r
}

fn websocket(mut req: Request<Incoming>) -> Response<Body> {
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        let mut r = Response::new(full("not a websocket handshake"));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return r;
    };
    let accept = derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_text() || msg.is_binary() {
                if ws.send(msg).await.is_err() {
                    break;
                }
            } else if msg.is_close() {
                break;
            }
        }
    });
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert("connection", "upgrade".parse().expect("hv"));
    h.insert("upgrade", "websocket".parse().expect("hv"));
    h.insert("sec-websocket-accept", accept.parse().expect("hv"));
    r
}
