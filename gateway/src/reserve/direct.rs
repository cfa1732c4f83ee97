//! Holds past the router (`server.direct_holds`, on by default). A hold is
//! the hottest call of a sale, and the router's generic layers around it
//! (route lookup, the middlewares' boxed futures, the trace, compression
//! and request-id layers, the futures they move) were about a quarter of
//! the gateway's instructions per hold (README "Holds past the router").
//! The edge ([`crate::edge::server`]) hands a `POST` to
//! `/_sluice/events/{event}/holds` here, and the same handler answers it,
//! with what those layers do for a hold done in place:
//! - the body read whole within `timeouts.body_read` and
//!   `limits.control_body_bytes` (408, 413), then a permit of
//!   `limits.max_store_requests` (503 `store_unavailable`, shed counted),
//!   as `store_bound` does, in that order;
//! - `Cache-Control: no-store` on every answer;
//! - the request id, the request's span, the catch of a panic and the
//!   trace layer's word on a 5xx: the edge's, as for a settled admission;
//!   then the `Content-Length` the router's route sets last.
//!
//! - the compression layer, where it could act: an answer that may pass
//!   [`crate::app::COMPRESS_ABOVE`], or a request with an
//!   `Accept-Encoding` (which may refuse every encoding, 406), goes through
//!   the very layer the router has; a small answer to a request without
//!   one would leave it untouched, and does not meet it.
//!
//! A path the router would read otherwise (a percent escape in the event's
//! segment, decoded by the router's `Path`) is the router's.
//! `tests/tests/direct_holds.rs` holds both ways to the same answers.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, header};
use serde_json::Value;
use tower::{Layer as _, ServiceExt as _};

use crate::app::{AppState, COMPRESS_ABOVE, JsonBody, mark_no_store, read_bytes, store_permit};
use crate::edge::client_ip::ClientInfo;

/// The event of a hold's path, `/_sluice/events/{event}/holds`, when the
/// router's `Path` would read it as it stands: one non-empty segment
/// without a percent escape. Anything else is the router's.
pub(crate) fn hold_path_event(path: &str) -> Option<&str> {
    let event = path
        .strip_prefix("/_sluice/events/")?
        .strip_suffix("/holds")?;
    (!event.is_empty() && !event.contains(['/', '%'])).then_some(event)
}

/// Answers a hold of `event` (its path read by [`hold_path_event`]) as the
/// router's layers and [`super::create_hold`] would.
pub(crate) async fn hold(
    state: &AppState,
    event: String,
    client: ClientInfo,
    req: Request,
) -> Response {
    // As `store_bound`: the body whole, then the permit.
    let (parts, bytes) = if http_body::Body::is_end_stream(req.body()) {
        let (parts, _) = req.into_parts();
        (parts, bytes::Bytes::new())
    } else {
        match read_bytes(state, req).await {
            Ok(read) => read,
            Err(p) => return finish(p.into_response(), None).await,
        }
    };
    let mut accept = None;
    if parts.headers.contains_key(header::ACCEPT_ENCODING) {
        let mut h = HeaderMap::new();
        for v in parts.headers.get_all(header::ACCEPT_ENCODING) {
            h.append(header::ACCEPT_ENCODING, v.clone());
        }
        accept = Some(h);
    }
    let _permit = match store_permit(state, false) {
        Ok(p) => p,
        Err(p) => return finish(p.into_response(), accept).await,
    };
    let body = JsonBody::<Value>::read(&parts.headers, &bytes);
    let answer = super::create_hold(
        State(state.clone()),
        Path(event),
        axum::Extension(client),
        parts.headers,
        body,
    )
    .await;
    finish(answer.into_response(), accept).await
}

/// What the router's `no_store` and compression layers do to an answer
/// (`accept`: the request's `Accept-Encoding` fields, when it had any).
async fn finish(res: Response, accept: Option<HeaderMap>) -> Response {
    let res = mark_no_store(res);
    let small = http_body::Body::size_hint(res.body())
        .exact()
        .is_some_and(|n| n <= COMPRESS_ABOVE);
    if small && accept.is_none() {
        return res;
    }
    let mut res = Some(res);
    let layer = crate::app::compression().layer(tower::service_fn(move |_: Request| {
        std::future::ready(Ok::<_, std::convert::Infallible>(
            res.take().unwrap_or_default(),
        ))
    }));
    let mut req = Request::new(Body::empty());
    *req.headers_mut() = accept.unwrap_or_default();
    match layer.oneshot(req).await {
        Ok(res) => res.map(Body::new),
        Err(never) => match never {},
    }
}

/// What the router does last to every answer (axum's route future): a
/// `Content-Length` from a body of known size, after the request id.
pub(crate) fn content_length(res: &mut Response) {
    if res.headers().contains_key(header::CONTENT_LENGTH) {
        return;
    }
    if let Some(n) = http_body::Body::size_hint(res.body()).exact() {
        res.headers_mut()
            .insert(header::CONTENT_LENGTH, http::HeaderValue::from(n));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_a_plain_hold_path_is_read_here() {
        assert_eq!(hold_path_event("/_sluice/events/gig/holds"), Some("gig"));
        assert_eq!(
            hold_path_event("/_sluice/events/hot~3/holds"),
            Some("hot~3")
        );
        for path in [
            "/_sluice/events//holds",
            "/_sluice/events/gig/holds/",
            "/_sluice/events/gig/holds/x",
            "/_sluice/events/a/b/holds",
            "/_sluice/events/g%69g/holds",
            "/_sluice/events/gig",
            "/_sluice/events/holds",
            "/_sluice/holds/gig",
            "/_sluice/events/gig/holdsx",
            "/shop/_sluice/events/gig/holds",
        ] {
            assert_eq!(hold_path_event(path), None, "{path}");
        }
    }
}
