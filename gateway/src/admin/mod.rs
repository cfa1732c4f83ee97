//! The operator's side: the admin API's handlers and its lockout, the
//! metrics endpoint, and the dashboard.
//!
//! - [`lockout`] — failed admin authentications per client network.
//! - [`dashboard`] — the admin dashboard page and its audit log view.

pub mod dashboard;
pub mod invites;
pub mod lockout;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

pub use crate::admin::lockout::ADMIN_FAILURES_PER_MIN;
use crate::app::clock::now_s;
use crate::app::extract::JsonBody;
use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;

/// `GET /metrics`: Prometheus text, behind the admin token (API.md lists
/// it among the admin endpoints).
pub(crate) async fn metrics(
    State(state): State<AppState>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    Ok(metrics_text(&state))
}

/// The Prometheus exposition with its content type.
pub fn metrics_text(state: &AppState) -> Response {
    state.telemetry().token_cache(state.verify_cache_len());
    let mut res = state.telemetry().render().into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    res
}

/// Brute-force guard of the admin API (`/_sluice/admin/…` and `/metrics`):
/// counts the 401s each client network earns and answers 429
/// `rate_limited` (with `Retry-After`) once it has had
/// [`ADMIN_FAILURES_PER_MIN`] in the current minute, at this gateway or,
/// with a bucket in the queue store, at all of them
/// ([`shared_budget_spent`]).
pub(crate) async fn admin_guard(
    State(state): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path();
    let admin = path.starts_with("/_sluice/admin") || path == "/metrics";
    let Some(net) = req
        .extensions()
        .get::<ClientInfo>()
        .filter(|_| admin)
        .map(|c| sluice_pow::network_prefix(c.ip))
    else {
        return next.run(req).await;
    };
    let failures = &state.admin_failures();
    if let Some(wait) = failures.blocked(net, now_s()) {
        return Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "Too many failed admin authentications from your network",
        )
        .retry_after(wait.max(1))
        .into_response();
    }
    let res = next.run(req).await;
    if res.status() == StatusCode::UNAUTHORIZED {
        failures.record(net, now_s());
        if shared_budget_spent(&state, net).await {
            failures.block(net, now_s());
        }
    }
    res
}

/// Takes one failure of `net` from the queue store's bucket of
/// [`ADMIN_FAILURES_PER_MIN`] a minute, one for every gateway on the
/// store; `true` when the bucket is empty, so the network is blocked here
/// for a minute as its own count would block it. Guesses spread over N
/// gateways then get the budget of one plus at most one per gateway a
/// minute (the failure that found the bucket empty), where each gateway's
/// count alone gave N budgets. While the store does not answer, each
/// gateway's own count decides.
async fn shared_budget_spent(state: &AppState, net: sluice_pow::NetPrefix) -> bool {
    state
        .take_network_budget("admin", "", net, ADMIN_FAILURES_PER_MIN)
        .await
        .is_some()
}

pub(crate) async fn admin_list_rooms(
    State(state): State<AppState>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let rooms: Vec<Value> = state
        .rooms()
        .all()
        .iter()
        .map(|r| {
            let mut v = crate::gate::rooms::admin_view(r);
            v["crawlers"] = state.crawlers().view(r.id());
            v
        })
        .collect();
    Ok(axum::Json(json!({ "rooms": rooms })).into_response())
}

pub(crate) async fn admin_get_room(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    let mut v = crate::gate::rooms::admin_view_fresh(room, state.queue()).await;
    v["crawlers"] = state.crawlers().view(room.id());
    Ok(axum::Json(v).into_response())
}

pub(crate) async fn admin_patch_room(
    State(state): State<AppState>,
    Path(room): Path<String>,
    client: Option<axum::Extension<ClientInfo>>,
    headers: http::HeaderMap,
    JsonBody(patch): JsonBody<Value>,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    let before = crate::gate::rooms::admin_view(room);
    let after = crate::gate::rooms::admin_patch(room, state.queue(), &patch).await?;
    // Who (a fingerprint of the token, the client address), what, before, after.
    let who = crate::admin::dashboard::audit_who(&headers, client.as_ref().map(|c| &c.0));
    tracing::info!(target: "audit", who = %who, room = %room.id(), change = %patch, before = %before, after = %after, "room settings changed");
    Ok(axum::Json(after).into_response())
}
