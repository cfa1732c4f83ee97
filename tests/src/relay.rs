//! An HTTP relay between a browser and a gateway that treats event streams
//! as a proxy in the wild might: passes them, refuses them, or buffers them
//! (holds the whole answer until it ends, as a proxy with response
//! buffering on does, so the browser hears nothing of a stream that stays
//! open). Everything else is passed as it is. It counts what it relayed,
//! so a test can tell which way the page heard its status.
//!
//! A test's own relay rather than a real proxy: which of the three a proxy
//! does is a setting of that proxy, and the page must cope with each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// What the relay does with a request that asks for an event stream
/// (`Accept: text/event-stream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// Passed byte by byte, as soon as the gateway writes them.
    Pass,
    /// Answered 502 at once, never reaching the gateway.
    Refuse,
    /// Passed to the gateway, its answer held until it ends.
    Buffer,
}

/// What the relay has seen.
#[derive(Debug, Default)]
pub struct Counts {
    /// Requests asking for an event stream.
    pub streams: AtomicU64,
    /// Status requests that were polls (no event stream asked).
    pub polls: AtomicU64,
    /// Every request.
    pub requests: AtomicU64,
}

/// A running relay; it stops with the test's runtime.
pub struct Relay {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// What it has seen so far.
    pub counts: Arc<Counts>,
}

impl Relay {
    /// Streams requests it saw.
    pub fn streams(&self) -> u64 {
        self.counts.streams.load(Ordering::SeqCst)
    }

    /// Status polls it saw.
    pub fn polls(&self) -> u64 {
        self.counts.polls.load(Ordering::SeqCst)
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

/// Starts a relay on a free loopback port in front of `upstream`.
pub async fn start(upstream: SocketAddr, streams: Streams) -> Relay {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the relay");
    let url = format!("http://{}", listener.local_addr().expect("relay address"));
    let counts = Arc::new(Counts::default());
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (client, seen) = (client.clone(), seen.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    relay_one(req, upstream, streams, client.clone(), seen.clone())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Relay { url, counts }
}

async fn relay_one(
    mut req: Request<Incoming>,
    upstream: SocketAddr,
    streams: Streams,
    client: Client<HttpConnector, Incoming>,
    seen: Arc<Counts>,
) -> Result<Response<Body>, hyper::Error> {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let wants_stream = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let path = req
        .uri()
        .path_and_query()
        .map_or("/".to_owned(), |p| p.as_str().to_owned());
    if wants_stream {
        seen.streams.fetch_add(1, Ordering::SeqCst);
    } else if path.starts_with("/_sluice/rooms/") && path.contains("/status") {
        seen.polls.fetch_add(1, Ordering::SeqCst);
    }
    if wants_stream && streams == Streams::Refuse {
        return Ok(plain(
            StatusCode::BAD_GATEWAY,
            "streams are not relayed here",
        ));
    }
    *req.uri_mut() = format!("http://{upstream}{path}")
        .parse()
        .expect("an upstream URI");
    // The browser's own Host header stays: the gateway's absolute URLs
    // name the relay.
    let res = match client.request(req).await {
        Ok(res) => res,
        Err(e) => return Ok(plain(StatusCode::BAD_GATEWAY, &e.to_string())),
    };
    if wants_stream && streams == Streams::Buffer {
        // The whole answer first, as a buffering proxy does: a stream that
        // stays open is never heard.
        let (parts, body) = res.into_parts();
        let bytes = body.collect().await?.to_bytes();
        let mut res = Response::from_parts(parts, Full::new(bytes).map_err(|e| match e {}).boxed());
        res.headers_mut().remove(header::TRANSFER_ENCODING);
        return Ok(res);
    }
    Ok(res.map(BodyExt::boxed))
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from(text.to_owned()))
            .map_err(|e| match e {})
            .boxed(),
    );
    *res.status_mut() = status;
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}
