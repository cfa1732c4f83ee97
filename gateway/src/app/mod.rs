//! The gateway's HTTP application: shared state, the control-plane routes
//! under `/_sluice/`, and the proxy for everything else, wrapped in the
//! generic layers.
//!
//! Layer order, outermost first (see [`build`]):
//! 1. `CatchPanicLayer` — a bug in a handler becomes a 500 problem, never a
//!    dropped connection; the panic is logged.
//! 2. `SetRequestIdLayer` — every request gets an `x-request-id` (kept when
//!    the client sent one), forwarded to the origin and logged.
//! 3. `PropagateRequestIdLayer` — the id is echoed in the response.
//! 4. `TraceLayer` — one span per request with method, path and request id;
//!    a 5xx is logged at ERROR, except 503, an expected answer (debug).
//! 5. `CompressionLayer` — br or gzip for our own answers that gain from
//!    it. Layers 4 and 5 sit inside [`past_streams::PastStreams`]: a
//!    request for an event stream is served in its span but goes past
//!    both, its body sent on without a span or a compression body.
//! 6. The router: `/_sluice/…` handlers (bodies limited, no-store but the
//!    static files under their hashed names, the
//!    store-bound ones behind `store_bound`, admin calls behind
//!    `admin::admin_guard`), and as fallback the guarded proxy (whose forwards
//!    to the origin are bounded by `limits.max_origin_requests`).
//!
//! The accept loop ([`crate::edge::server`]) bounds open connections
//! (`limits.max_connections`). A request that no room guards (outside
//! `/_sluice/`, `/metrics` and every room's paths, or let by its room's
//! bypass rules) goes from the connection straight to the proxy, without
//! the router and its layers: it gets the same request id (one counter),
//! the same catch of a panic, and the proxy's own problem logs, but no
//! per-request tracing span. On this path the layers cost about a fifth
//! of the gateway's CPU per request (`tests/bench/proxy.sh`). A guarded
//! request whose admission is settled at the edge (a valid token, its
//! session not revoked, no renewal due: `gate::settled`) also goes on
//! from the connection, to the gate's way to the origin
//! (`gate::to_origin`), with the request id, the catch of a panic, its
//! span and `note_answer`'s word on a 5xx; its answer is the origin's,
//! which the compression layer leaves alone anyway. Every other guarded
//! request (no token, a bad one, a revoked session, a renewal due, an
//! upgrade) takes the router and [`gate::guarded`]. A hold or a join
//! (`server.direct_calls`) goes on from the connection to its handler
//! too, with what these layers do for it done in place ([`direct`]).
//!
//! The in-flight bounds (store-bound requests, admin calls, forwards to
//! the origin) are `tokio` semaphores tried without waiting, not tower's
//! `ConcurrencyLimit` + `LoadShed`: each applies to some routes only (and
//! the proxy's to the direct path too, which has no tower stack), and a
//! refusal must be our 503 problem with `Retry-After`, counted in
//! `sluice_shed_total`, where `LoadShed`'s error would be mapped back to it.

pub mod clock;
pub(crate) mod direct;
pub mod extract;
pub mod past_streams;
pub mod problem;
pub mod request_id;
pub mod state;
pub mod stores;
pub mod telemetry;

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::json;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::predicate::{DefaultPredicate, Predicate, SizeAbove};
use tower_http::compression::{CompressionLayer, CompressionLevel};
use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub use crate::app::clock::{now_ms, now_s};
pub use crate::app::extract::JsonBody;
use crate::app::problem::Problem;
pub use crate::app::request_id::{REQUEST_ID, RequestIds, panic_response};
pub use crate::app::state::AppState;
use crate::{admin, gate, visitor};

/// Builds the whole application service.
pub fn build(state: AppState) -> Router {
    build_with_ids(state, RequestIds::default())
}

/// [`build`], with the request ids it gives shared with the server's
/// direct path to the origin ([`crate::edge::server`]).
pub(crate) fn build_with_ids(state: AppState, ids: RequestIds) -> Router {
    let control = Router::new()
        .route("/_sluice/healthz", get(healthz))
        .route("/_sluice/readyz", get(readyz))
        .route("/_sluice/serving", get(serving))
        .route("/_sluice/jwks.json", get(visitor::jwks))
        .route("/_sluice/openapi.json", get(openapi))
        .route("/_sluice/auth", get(gate::forward::forward_auth))
        // Envoy's form of it: any method, the original target behind the
        // prefix (the site's root is `/_sluice/auth/`).
        .route("/_sluice/auth/", any(gate::forward::forward_auth))
        .route(
            "/_sluice/auth/{*original}",
            any(gate::forward::forward_auth),
        )
        .route("/_sluice/rooms/{room}", get(visitor::public_room))
        .route("/_sluice/rooms/{room}/challenge", post(visitor::challenge))
        .route("/_sluice/rooms/{room}/join", post(visitor::join))
        .route("/_sluice/rooms/{room}/status", get(visitor::status))
        .route(
            "/_sluice/static/{file}",
            get(crate::visitor::page::static_file),
        )
        .route("/_sluice/admin/rooms", get(admin::admin_list_rooms))
        .route(
            "/_sluice/admin/rooms/{room}",
            get(admin::admin_get_room).patch(admin::admin_patch_room),
        )
        .route(
            "/_sluice/admin/rooms/{room}/invites",
            get(admin::invites::list).post(admin::invites::issue),
        )
        .route(
            "/_sluice/admin/rooms/{room}/invites/{id}",
            get(admin::invites::get_one).delete(admin::invites::revoke),
        )
        .merge(crate::reserve::routes())
        .merge(crate::admin::dashboard::routes())
        .route("/metrics", get(admin::metrics))
        .route("/_sluice/{*rest}", any(unknown_endpoint))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin::admin_guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            store_bound,
        ))
        .layer(axum::middleware::map_response(no_store));

    Router::new()
        .merge(control)
        .fallback(gate::guarded)
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                .layer(CatchPanicLayer::custom(panic_response))
                .layer(SetRequestIdLayer::new(REQUEST_ID, ids))
                .layer(PropagateRequestIdLayer::new(REQUEST_ID))
                .layer(past_streams::PastStreams {
                    layer: ServiceBuilder::new()
                        .layer(
                            TraceLayer::new_for_http()
                                .make_span_with(request_span as fn(&Request) -> tracing::Span)
                                .on_failure(on_failure),
                        )
                        // The compression layer's body is kilobytes whether
                        // it compresses or not (`past_streams`): boxed as it
                        // leaves that layer, the answer moves through the
                        // layers above as a pointer, not copied at each one.
                        .map_response(past_streams::boxed)
                        .layer(compression())
                        .into_inner(),
                    span: request_span,
                }),
        )
}

/// The compression layer of our own answers (br or gzip at
/// [`COMPRESSION_QUALITY`], [`compressible`] ones only); a hold past the
/// router is put through it where it could act ([`direct`]).
pub(crate) fn compression() -> CompressionLayer<impl Predicate> {
    CompressionLayer::new()
        .quality(CompressionLevel::Precise(COMPRESSION_QUALITY))
        .compress_when(compressible())
}

/// The span of a request through the router: method, path, request id.
fn request_span(req: &Request) -> tracing::Span {
    let id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
}

/// br and gzip quality for answers made per request: 4 keeps most of the
/// ratio of the slow levels (br's default is 11) at a small part of their
/// CPU, as CDNs do for dynamic content.
const COMPRESSION_QUALITY: i32 = 4;

/// Answers of ours up to this many bytes are sent as they are: with its
/// head such an answer fits one packet, so compressing it saves no round
/// trip, and br's encoder zeroes a table of about half a megabyte for each
/// answer (page faults, TLB shootdowns across the I/O threads): a join's
/// answer (a queue token, some 600 bytes) cost more to compress than to
/// make. README, "The opening surge".
pub(crate) const COMPRESS_ABOVE: u64 = 1024;

/// Which answers [`CompressionLayer`] compresses: text of ours of more than
/// [`COMPRESS_ABOVE`] bytes (tower-http's default predicate: not already
/// encoded, not an image, a gRPC or an event stream), and never an answer
/// relayed from the origin ([`gate::FromOrigin`]): compressing the
/// origin's content is the origin's (or its CDN's) choice, and doing it on
/// the gate's path would spend the CPU a sale needs.
/// Nor a static file's, whose form was picked from the ones stored
/// compressed at start ([`visitor::assets::Precompressed`]).
fn compressible() -> impl Predicate {
    DefaultPredicate::new()
        .and(SizeAbove::new(COMPRESS_ABOVE))
        .and(
            |_: StatusCode, _: http::Version, _: &http::HeaderMap, ext: &http::Extensions| {
                ext.get::<gate::FromOrigin>().is_none()
                    && ext.get::<visitor::assets::Precompressed>().is_none()
            },
        )
}

/// The trace layer's word on a 5xx answer. A 503 is an expected answer
/// (`waiting_room_active` to a client that is not a browser; a shed
/// request, counted in `sluice_shed_total`; a store fault, warned where it
/// is met), said at debug level: on sale day every visitor that is not a
/// browser gets one, and ERROR lines by the thousand would bury the real
/// faults. Any other 5xx, or a failure to answer, is an error. (429 is not
/// a failure to the trace layer at all.)
fn on_failure(
    class: tower_http::classify::ServerErrorsFailureClass,
    latency: std::time::Duration,
    _span: &tracing::Span,
) {
    use tower_http::classify::ServerErrorsFailureClass;
    let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
    match class {
        ServerErrorsFailureClass::StatusCode(
            status @ (StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::BAD_GATEWAY
            | StatusCode::GATEWAY_TIMEOUT),
        ) => {
            tracing::debug!(status = status.as_u16(), latency_ms = ms, "answered");
        }
        other => tracing::error!(classification = %other, latency_ms = ms, "response failed"),
    }
}

/// The trace layer's word ([`on_failure`]) on an answer the edge sent on
/// past the router (an admitted visitor's request, [`crate::edge::server`]):
/// a 5xx is a failure to it.
pub(crate) fn note_answer(status: StatusCode, latency: std::time::Duration) {
    if status.is_server_error() {
        on_failure(
            tower_http::classify::ServerErrorsFailureClass::StatusCode(status),
            latency,
            &tracing::Span::none(),
        );
    }
}

/// Every control-plane answer is `no-store` (API.md), but a static file
/// under its hashed name ([`visitor::assets::Immutable`]), which keeps its
/// year-long caching unless it sets a cookie: an answer that sets one is
/// never storable by a shared cache.
async fn no_store(res: Response) -> Response {
    mark_no_store(res)
}

/// [`no_store`]'s work, for an answer made past the router
/// ([`direct`]).
pub(crate) fn mark_no_store(mut res: Response) -> Response {
    let immutable = res
        .extensions()
        .get::<visitor::assets::Immutable>()
        .is_some()
        && !res.headers().contains_key(header::SET_COOKIE);
    if !immutable {
        res.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// Readiness as API.md fixes it: 200 while every room's store answers,
/// else 503 (`store_unavailable`, naming the rooms); 503 `draining` after
/// SIGTERM. For monitoring and for a deploy that wants a gateway out of
/// rotation whenever its store is away. A load balancer or an
/// orchestrator's probe should ask [`serving`] instead.
async fn readyz(State(state): State<AppState>) -> Response {
    readiness(&state, |r| !r.store_ok())
}

/// "This gateway can serve", for a load balancer deciding where to send
/// traffic (`/_sluice/serving`, the probe the deploy files use). 503 while
/// draining (SIGTERM), and until every room's store has answered once
/// (before that a room has no snapshot of its own). A store that stops
/// answering later does not fail it when the room's failure policy lets
/// admitted visitors keep passing: every gateway shares the store, so
/// pulling them all from the load balancer on a store blip would turn away
/// the visitors the policy keeps serving. Such rooms are named in the body
/// (`store_unavailable`) and in `sluice_store_up`.
async fn serving(State(state): State<AppState>) -> Response {
    readiness(&state, |r| {
        !r.store_seen() || (!r.store_ok() && !admitted_pass_without_store(r.config.failure_policy))
    })
}

/// 503 `draining` after SIGTERM; 503 `store_unavailable` naming the rooms
/// `blocks` picks; otherwise 200 `ready`, naming the rooms whose store is
/// away and the ledger's lag.
fn readiness(state: &AppState, blocks: impl Fn(&crate::gate::rooms::Room) -> bool) -> Response {
    if state.is_shutting_down() {
        return not_ready(json!({"status": "draining"}));
    }
    let rooms = state.rooms().all();
    let blocking = room_ids(rooms, blocks);
    if !blocking.is_empty() {
        return not_ready(json!({"status": "store_unavailable", "rooms": blocking}));
    }
    let mut body = json!({"status": "ready"});
    let degraded = room_ids(rooms, |r| !r.store_ok());
    if !degraded.is_empty() {
        body["store_unavailable"] = json!(degraded);
    }
    // The ledger's lag is said, never a reason to stop serving: the sale
    // goes on with PostgreSQL away (Redis is the hot path).
    if let Some(ledger) = state.ledger().readiness() {
        body["ledger"] = json!(ledger);
    }
    axum::Json(body).into_response()
}

fn not_ready(body: serde_json::Value) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
}

fn room_ids(
    rooms: &[Arc<crate::gate::rooms::Room>],
    pick: impl Fn(&crate::gate::rooms::Room) -> bool,
) -> Vec<&str> {
    rooms.iter().filter(|r| pick(r)).map(|r| r.id()).collect()
}

/// Whether a room's admitted visitors keep passing while its store does
/// not answer, under this failure policy. Both policies do (`closed` only
/// holds *new* visitors); a policy added later must say here whether a
/// store outage should take its gateways out of the load balancer.
fn admitted_pass_without_store(policy: crate::config::FailurePolicy) -> bool {
    use crate::config::FailurePolicy;
    match policy {
        FailurePolicy::Closed | FailurePolicy::Open => true,
    }
}

/// The gateway's own reference of its HTTP contract.
const OPENAPI: &str = include_str!("../../api/openapi.json");

/// [`OPENAPI`] with its br and gzip forms, made once (at start, by
/// [`visitor::assets::warm`]): compressed per request, its 200 KB cost
/// about 7 ms of br each, so anyone could keep the gateway's cores busy
/// with a few hundred requests a second (`compression.rs`,
/// `constant_documents_are_compressed_once`).
pub(crate) static OPENAPI_DOCUMENT: LazyLock<visitor::assets::Asset> =
    LazyLock::new(|| visitor::assets::Asset::document("application/json", OPENAPI.as_bytes()));

async fn openapi(headers: HeaderMap) -> Response {
    OPENAPI_DOCUMENT.answer(&headers, visitor::assets::Caching::NoStore)
}

async fn unknown_endpoint() -> Problem {
    Problem::not_found()
}

async fn method_not_allowed() -> Problem {
    Problem::method_not_allowed()
}

// === bounded in-flight ===

/// Whether a control-plane request may touch the admission or reservation
/// store: the challenge (per-network limiter, difficulty), join and status
/// of a room, events, holds, the payment webhook and the admin API. The
/// rest (health, readiness, JWKS, the OpenAPI document, static files, the
/// public room state, metrics) answers from memory and is never shed.
/// Forward-auth (`/_sluice/auth`) is store-bound: like a guarded request it
/// may admit a passthrough or renew a session, both store calls.
pub fn touches_store(path: &str) -> bool {
    if let Some(rest) = path.strip_prefix("/_sluice/rooms/") {
        return rest.ends_with("/challenge")
            || rest.ends_with("/join")
            || rest.ends_with("/status");
    }
    ["/_sluice/events/", "/_sluice/holds/", "/_sluice/webhooks/"]
        .iter()
        .any(|p| path.starts_with(p))
        || path == "/_sluice/auth"
        || path.starts_with("/_sluice/auth/")
        || path == "/_sluice/admin"
        || path.starts_with("/_sluice/admin/")
}

/// Bounds the store-bound requests in flight at `limits.max_store_requests`:
/// one past it is answered at once with 503 `store_unavailable`
/// (`"reason": "overloaded"`, `Retry-After`), so a slow store makes quick
/// refusals instead of an ever-growing pile of waiting requests.
///
/// The body is read first, whole, within `timeouts.body_read` and
/// `limits.control_body_bytes` (408 `request_timeout`, 413
/// `body_too_large`): a body that trickles or never comes holds no permit.
/// Admin calls have a budget of their own (`limits.max_admin_requests`), so
/// visitors filling the store's budget never lock an operator out.
async fn store_bound(
    State(state): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path();
    if !touches_store(path) {
        return next.run(req).await;
    }
    let admin = path == "/_sluice/admin" || path.starts_with("/_sluice/admin/");
    let req = match read_body(&state, req).await {
        Ok(r) => r,
        Err(p) => return p.into_response(),
    };
    let _permit = match store_permit(&state, admin) {
        Ok(p) => p,
        Err(p) => return p.into_response(),
    };
    next.run(req).await
}

/// A permit of the store-bound budget (`admin`: the admin API's own), or
/// 503 `store_unavailable` (`"reason": "overloaded"`), counted in
/// `sluice_shed_total`.
pub(crate) fn store_permit(
    state: &AppState,
    admin: bool,
) -> Result<tokio::sync::OwnedSemaphorePermit, Problem> {
    let (slots, what) = if admin {
        (state.admin_slots(), "admin")
    } else {
        (state.store_slots(), "store")
    };
    Arc::clone(slots).try_acquire_owned().map_err(|_| {
        state.telemetry().shed(what);
        Problem::store_overloaded()
    })
}

/// The request with its body read into memory, within the body deadline
/// and the control plane's size limit.
pub(crate) async fn read_body(state: &AppState, req: Request) -> Result<Request, Problem> {
    if http_body::Body::is_end_stream(req.body()) {
        return Ok(req);
    }
    let (parts, bytes) = read_bytes(state, req).await?;
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// [`read_body`]'s reading: the request's head and its body, whole
/// (empty when the request has none).
pub(crate) async fn read_bytes(
    state: &AppState,
    req: Request,
) -> Result<(http::request::Parts, bytes::Bytes), Problem> {
    if http_body::Body::is_end_stream(req.body()) {
        let (parts, _) = req.into_parts();
        return Ok((parts, bytes::Bytes::new()));
    }
    // A feed batch (`POST /_sluice/admin/events/{event}/feed`) has a limit
    // of its own (`feeds.max_body_bytes`): thousands of rows.
    let path = req.uri().path();
    let limit = if path.starts_with("/_sluice/admin/events/") && path.ends_with("/feed") {
        state.config().feeds.max_body_bytes
    } else {
        state.config().limits.control_body_bytes
    };
    let deadline = state.config().timeouts.body_read;
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return Err(Problem::request_timeout()
                .with("timeout_ms", deadline.as_millis() as u64)
                .log_cause(&"the request body did not arrive in time"));
        }
        Ok(Err(_)) => return Err(Problem::body_too_large().with("limit_bytes", limit)),
        Ok(Ok(b)) => b,
    };
    Ok((parts, bytes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn only_a_hashed_file_without_a_cookie_escapes_no_store() {
        let asset = || {
            let mut res = Response::new(Body::empty());
            res.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static(visitor::assets::IMMUTABLE),
            );
            res
        };
        let mut kept = asset();
        kept.extensions_mut().insert(visitor::assets::Immutable);
        let kept = no_store(kept).await;
        assert_eq!(kept.headers()["cache-control"], visitor::assets::IMMUTABLE);

        let plain = no_store(asset()).await;
        assert_eq!(plain.headers()["cache-control"], "no-store");

        let mut cookie = asset();
        cookie.extensions_mut().insert(visitor::assets::Immutable);
        cookie.headers_mut().insert(
            header::SET_COOKIE,
            HeaderValue::from_static("sluice_q_default=x"),
        );
        let cookie = no_store(cookie).await;
        assert_eq!(cookie.headers()["cache-control"], "no-store");
    }

    #[test]
    fn store_bound_paths() {
        for p in [
            "/_sluice/rooms/default/challenge",
            "/_sluice/rooms/default/join",
            "/_sluice/rooms/default/status",
            "/_sluice/events/demo",
            "/_sluice/events/demo/holds",
            "/_sluice/holds/abc",
            "/_sluice/webhooks/payment",
            "/_sluice/auth",
            "/_sluice/auth/shop/cart",
            "/_sluice/admin",
            "/_sluice/admin/rooms/default",
            "/_sluice/admin/events/demo",
        ] {
            assert!(touches_store(p), "{p}");
        }
        for p in [
            "/_sluice/healthz",
            "/_sluice/readyz",
            "/_sluice/serving",
            "/_sluice/jwks.json",
            "/_sluice/openapi.json",
            "/_sluice/rooms/default",
            "/_sluice/static/app.js",
            "/_sluice/administrator",
            "/metrics",
            "/shop",
        ] {
            assert!(!touches_store(p), "{p}");
        }
    }
}
