//! A small HTTP client for tests, over hyper-util's pooled client: requests
//! with any method, headers and a buffered or streamed body; answers with
//! status, headers and the whole body. `http://` always; `https://` with a
//! client made by [`TestClient::with_tls`] (e.g. [`crate::tls::TestCa::https_client`]).

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A request body.
pub type ReqBody = BoxBody<Bytes, std::io::Error>;

/// A buffered answer.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (panics when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A pooled HTTP/1.1 client.
#[derive(Clone)]
pub struct TestClient {
    inner: Client<HttpsConnector<HttpConnector>, ReqBody>,
}

/// A connector for `http://`, and `https://` with `tls` (trusting nothing
/// when none is given).
fn connector(tls: Option<rustls::ClientConfig>, http2: bool) -> HttpsConnector<HttpConnector> {
    let tls = tls.unwrap_or_else(|| {
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
    });
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if http2 {
        b.enable_http2().build()
    } else {
        b.enable_http1().enable_http2().build()
    }
}

impl Default for TestClient {
    fn default() -> Self {
        Self::new()
    }
}

/// An empty body.
pub fn empty() -> ReqBody {
    Full::new(Bytes::new()).map_err(|n| match n {}).boxed()
}

/// A buffered body.
pub fn body(b: impl Into<Bytes>) -> ReqBody {
    Full::new(b.into()).map_err(|n| match n {}).boxed()
}

impl TestClient {
    /// A new client.
    pub fn new() -> TestClient {
        TestClient {
            inner: Client::builder(TokioExecutor::new()).build(connector(None, false)),
        }
    }

    /// A client of `https://` URLs with this TLS configuration (h2 or
    /// HTTP/1.1 by ALPN), and of `http://` ones.
    pub fn with_tls(tls: rustls::ClientConfig) -> TestClient {
        TestClient {
            inner: Client::builder(TokioExecutor::new()).build(connector(Some(tls), false)),
        }
    }

    /// An HTTP/2 (prior knowledge) client.
    pub fn http2() -> TestClient {
        TestClient {
            inner: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(connector(None, true)),
        }
    }

    /// Sends a request and reads the whole answer.
    pub async fn send(&self, req: Request<ReqBody>) -> Answer {
        let res = self.inner.request(req).await.expect("request sent");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("body read").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// [`TestClient::send`], `None` when the connection fails or drops
    /// before the whole answer (a server killed under the request).
    pub async fn try_send(&self, req: Request<ReqBody>) -> Option<Answer> {
        let res = self.inner.request(req).await.ok()?;
        let (parts, body) = res.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Sends a request and returns the streaming response.
    pub async fn send_streaming(
        &self,
        req: Request<ReqBody>,
    ) -> http::Response<hyper::body::Incoming> {
        self.inner.request(req).await.expect("request sent")
    }

    /// GET with extra headers.
    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Answer {
        self.call(Method::GET, url, headers, empty()).await
    }

    /// Any method with headers and body.
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: ReqBody,
    ) -> Answer {
        let mut b = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.send(b.body(body).expect("request")).await
    }

    /// POST a JSON value.
    pub async fn post_json(&self, url: &str, headers: &[(&str, &str)], v: &Value) -> Answer {
        let mut h: Vec<(&str, &str)> = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        self.call(Method::POST, url, &h, body(v.to_string())).await
    }
}

/// Writes `bytes` on a fresh connection to `addr` exactly as given (no
/// client library in between to tidy a hostile request up) and reads
/// whatever comes back until the server closes or `wait` passes.
pub async fn raw(addr: std::net::SocketAddr, bytes: &[u8], wait: std::time::Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut r, mut w) = s.into_split();
    let bytes = bytes.to_vec();
    let writer = tokio::spawn(async move {
        let _ = tokio::time::timeout(wait, w.write_all(&bytes)).await;
        // keep the write half open until the reader is done
        tokio::time::sleep(wait).await;
        drop(w);
    });
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    writer.abort();
    String::from_utf8_lossy(&out).into_owned()
}

/// The status codes of the HTTP/1.1 answers in a raw reply, in order.
pub fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect()
}
