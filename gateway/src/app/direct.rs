//! The sale's hottest calls past the router (`server.direct_calls`, on by
//! default): a hold (`POST /_sluice/events/{event}/holds`) and a join
//! (`POST /_sluice/rooms/{room}/join`). The router's generic layers around
//! such a call (route lookup, the middlewares' boxed futures, the trace,
//! compression and request-id layers, the futures they move) were about a
//! quarter of the gateway's instructions per hold (README "Holds and joins
//! past the router"). The edge ([`crate::edge::server`]) hands such a
//! request here, and the same handler answers it, with what those layers
//! do for it done in place, in their order:
//! - the body read whole within `timeouts.body_read` and
//!   `limits.control_body_bytes` (408, 413), then a permit of
//!   `limits.max_store_requests` (503 `store_unavailable`, shed counted),
//!   as `store_bound` does;
//! - `Cache-Control: no-store` on every answer;
//! - the compression layer, where it could act: an answer that may pass
//!   [`crate::app::COMPRESS_ABOVE`], or a request with an
//!   `Accept-Encoding` (which may refuse every encoding, 406), goes through
//!   the very layer the router has; a small answer to a request without
//!   one would leave it untouched, and does not meet it;
//! - the request id, the request's span, the catch of a panic and the
//!   trace layer's word on a 5xx: the edge's, as for a settled admission;
//!   then the `Content-Length` the router's route sets last.
//!
//! A path the router would read otherwise (a percent escape in the
//! segment its `Path` decodes) is the router's. `tests/tests/direct_calls.rs`
//! holds both ways to the same answers.

use std::future::Future;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, header};
use tower::{Layer as _, ServiceExt as _};

use crate::app::problem::Problem;
use crate::app::{AppState, COMPRESS_ABOVE, JsonBody, mark_no_store, read_bytes, store_permit};
use crate::edge::client_ip::ClientInfo;

/// A call answered past the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// `POST /_sluice/events/{event}/holds`.
    Hold,
    /// `POST /_sluice/rooms/{room}/join`.
    Join,
}

/// The call a `POST` to `path` is, with its one path segment (the event or
/// the room), when the router's `Path` would read that segment as it
/// stands: non-empty, without a percent escape. Anything else is the
/// router's.
pub(crate) fn call_of(path: &str) -> Option<(Call, &str)> {
    let (call, segment) = if let Some(rest) = path.strip_prefix("/_sluice/events/") {
        (Call::Hold, rest.strip_suffix("/holds")?)
    } else {
        let rest = path.strip_prefix("/_sluice/rooms/")?;
        (Call::Join, rest.strip_suffix("/join")?)
    };
    (!segment.is_empty() && !segment.contains(['/', '%'])).then_some((call, segment))
}

/// Answers `call` (its path read by [`call_of`], `segment` its event or
/// room) as the router's layers and its handler would.
pub(crate) async fn answer(
    state: AppState,
    call: Call,
    segment: String,
    client: ClientInfo,
    req: Request,
) -> Response {
    match call {
        Call::Hold => json_call(&state, segment, client, req, crate::reserve::create_hold).await,
        Call::Join => json_call(&state, segment, client, req, crate::visitor::join).await,
    }
}

/// One store-bound call whose handler takes the state, its path segment,
/// the client, the headers and a JSON body, as the router would call it.
async fn json_call<T, F, Fut>(
    state: &AppState,
    segment: String,
    client: ClientInfo,
    req: Request,
    handler: F,
) -> Response
where
    T: serde::de::DeserializeOwned,
    F: FnOnce(
        State<AppState>,
        Path<String>,
        axum::Extension<ClientInfo>,
        HeaderMap,
        Result<JsonBody<T>, Problem>,
    ) -> Fut,
    Fut: Future<Output = Result<Response, Problem>>,
{
    // As `store_bound`: the body whole, then the permit.
    let (parts, bytes) = match read_bytes(state, req).await {
        Ok(read) => read,
        Err(p) => return finish(p.into_response(), None).await,
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
    let body = JsonBody::<T>::read(&parts.headers, &bytes);
    let answer = handler(
        State(state.clone()),
        Path(segment),
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
    use super::*;

    #[test]
    fn only_a_plain_path_of_a_hold_or_a_join_is_read_here() {
        assert_eq!(
            call_of("/_sluice/events/gig/holds"),
            Some((Call::Hold, "gig"))
        );
        assert_eq!(
            call_of("/_sluice/events/hot~3/holds"),
            Some((Call::Hold, "hot~3"))
        );
        assert_eq!(
            call_of("/_sluice/rooms/default/join"),
            Some((Call::Join, "default"))
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
            "/_sluice/rooms//join",
            "/_sluice/rooms/default/join/",
            "/_sluice/rooms/a/b/join",
            "/_sluice/rooms/d%65fault/join",
            "/_sluice/rooms/default/status",
            "/_sluice/rooms/default/challenge",
            "/_sluice/rooms/join",
            "/_sluice/events/gig/join",
            "/_sluice/rooms/gig/holds",
        ] {
            assert_eq!(call_of(path), None, "{path}");
        }
    }
}
