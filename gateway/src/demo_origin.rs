//! The built-in demo shop: the origin that `sluice serve` runs behind the
//! gateway when no `--origin` is given, on a free loopback port, so a
//! newcomer sees the whole flow with one command.
//!
//! It is a separate HTTP server that knows the gateway only through its
//! public API (API.md), exactly as a real origin would.
//! - `GET /` — the shop's front page;
//! - `ANY /echo/...` — answers with a JSON description of what it received
//!   (method, path, query, headers, body length and SHA-256), which makes
//!   the proxy's behaviour visible from a browser or `curl`.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{any, get};
use futures_util::StreamExt;
use http::header;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

/// Starts the demo shop on a free loopback port; returns its address.
pub async fn spawn() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router()).await {
            tracing::error!(error = %e, "demo origin stopped");
        }
    });
    Ok(addr)
}

/// The demo shop's routes.
pub fn router() -> Router {
    Router::new()
        .route("/", get(front_page))
        .route("/echo", any(echo))
        .route("/echo/{*rest}", any(echo))
}

async fn front_page() -> Html<&'static str> {
    Html(FRONT_PAGE)
}

const FRONT_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>sluice demo shop</title></head>
<body><main><h1>sluice demo shop</h1>
<p>You are past the waiting room: this page is served by the demo origin behind the sluice gateway.</p>
<p>See what the origin receives: <a href="/echo/hello?from=browser">/echo/hello?from=browser</a>.</p>
</main></body></html>
"#;

async fn echo(req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut hasher = Sha256::new();
    let mut len: u64 = 0;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => {
                len += bytes.len() as u64;
                hasher.update(&bytes);
            }
            Err(e) => return (http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        }
    }
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let body = serde_json::json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "headers": headers,
        "body_bytes": len,
        "body_sha256": hex(&hasher.finalize()),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(body.to_string()),
    )
        .into_response()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
