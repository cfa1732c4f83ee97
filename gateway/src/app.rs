//! The gateway's HTTP application: shared state, the control-plane routes
//! under `/_sluice/`, and the proxy for everything else, wrapped in the
//! generic layers.
//!
//! Layer order, outermost first (see [`build`]):
//! 1. `CatchPanicLayer` — a bug in a handler becomes a 500 problem, never a
//!    dropped connection; the panic is logged.
//! 2. `SetRequestIdLayer` — every request gets an `x-request-id` (kept when
//!    the client sent one), forwarded to the origin and logged.
//! 3. `TraceLayer` — one span per request with method, path and request id.
//! 4. `PropagateRequestIdLayer` — the id is echoed in the response.
//! 5. The router: `/_sluice/…` handlers (bodies limited, no-store), and as
//!    fallback the guarded proxy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http::{HeaderName, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

use crate::client_ip::ClientInfo;
use crate::config::Config;
use crate::problem::Problem;
use crate::proxy::Proxy;
use crate::rooms::Rooms;

/// Everything a handler may need, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    proxy: Proxy,
    rooms: Rooms,
    shutting_down: AtomicBool,
}

impl AppState {
    /// Builds the state from a validated configuration whose `origin` is set.
    pub fn new(config: Config) -> anyhow::Result<AppState> {
        let origin = config
            .origin
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no origin configured"))?;
        let proxy = Proxy::new(&origin, &config.proxy, &config.timeouts)?;
        let rooms = Rooms::from_config(&config);
        Ok(AppState {
            inner: Arc::new(Inner {
                config,
                proxy,
                rooms,
                shutting_down: AtomicBool::new(false),
            }),
        })
    }

    /// The configuration the gateway runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The rooms.
    pub fn rooms(&self) -> &Rooms {
        &self.inner.rooms
    }

    /// Marks the gateway as draining: readiness fails from now on.
    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
    }

    fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// Checks the admin bearer token in constant time. No token configured:
    /// nobody is admin.
    pub fn check_admin(&self, headers: &http::HeaderMap) -> Result<(), Problem> {
        let Some(expected) = self.inner.config.admin_token.as_deref() else {
            return Err(Problem::unauthorized());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Compare digests so the comparison time does not depend on the
        // length of the common prefix or of the given token.
        use sha2::{Digest, Sha256};
        let a = Sha256::digest(given.as_bytes());
        let b = Sha256::digest(expected.as_bytes());
        if bool::from(a.as_slice().ct_eq(b.as_slice())) {
            Ok(())
        } else {
            Err(Problem::unauthorized())
        }
    }
}

/// Builds the whole application service.
pub fn build(state: AppState) -> Router {
    let control = Router::new()
        .route("/_sluice/healthz", get(healthz))
        .route("/_sluice/readyz", get(readyz))
        .route(
            "/_sluice/admin/rooms/{room}",
            get(admin_get_room).patch(admin_patch_room),
        )
        .route("/_sluice/{*rest}", any(unknown_endpoint))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_response(no_store));

    Router::new()
        .merge(control)
        .fallback(guarded_proxy)
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                .layer(CatchPanicLayer::custom(panic_response))
                .layer(SetRequestIdLayer::new(
                    HeaderName::from_static("x-request-id"),
                    RequestIds::default(),
                ))
                .layer(
                    TraceLayer::new_for_http().make_span_with(|req: &Request| {
                        let id = req
                            .headers()
                            .get("x-request-id")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("");
                        tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
                    }),
                )
                .layer(PropagateRequestIdLayer::new(HeaderName::from_static(
                    "x-request-id",
                ))),
        )
}

/// Request ids: a random per-process prefix and a counter — unique, cheap,
/// and they sort by arrival within one gateway.
#[derive(Clone)]
struct RequestIds {
    prefix: Arc<str>,
    next: Arc<AtomicU64>,
}

impl Default for RequestIds {
    fn default() -> Self {
        let p: u32 = rand::random();
        RequestIds {
            prefix: format!("{p:08x}").into(),
            next: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _req: &http::Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::from_str(&format!("{}-{n:x}", self.prefix))
            .ok()
            .map(RequestId::new)
    }
}

fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let msg = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("panic");
    tracing::error!(panic = msg, "handler panicked");
    Problem::internal().into_response()
}

async fn no_store(mut res: Response) -> Response {
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.is_shutting_down() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "draining"})),
        )
            .into_response();
    }
    axum::Json(json!({"status": "ready"})).into_response()
}

async fn unknown_endpoint() -> Problem {
    Problem::not_found()
}

async fn method_not_allowed() -> Problem {
    Problem::method_not_allowed()
}

/// Everything outside `/_sluice/`: the admission gate, then the origin.
async fn guarded_proxy(State(state): State<AppState>, req: Request) -> Response {
    let Some(client) = req.extensions().get::<ClientInfo>().cloned() else {
        return Problem::internal()
            .log_cause(&"request without client info")
            .into_response();
    };
    state
        .inner
        .proxy
        .forward(req, &client, http::HeaderMap::new())
        .await
}

// === admin ===

async fn admin_get_room(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let view = state.rooms().admin_view(&room)?;
    Ok(axum::Json(view).into_response())
}

async fn admin_patch_room(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: http::HeaderMap,
    JsonBody(patch): JsonBody<Value>,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let view = state.rooms().patch(&room, &patch)?;
    tracing::info!(target: "audit", room = %room, change = %patch, "room settings changed");
    Ok(axum::Json(view).into_response())
}

/// A JSON request body, read within the configured limit; every failure is
/// a problem+json answer (400 `malformed_request`, 413 `body_too_large`).
pub struct JsonBody<T>(pub T);

impl<T> FromRequest<AppState> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config().limits.control_body_bytes;
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
            if !(ct.starts_with("application/json") || ct.contains("+json")) {
                return Err(Problem::unsupported_media_type());
            }
        }
        let body: Body = req.into_body();
        let bytes = axum::body::to_bytes(body, limit)
            .await
            .map_err(|_| Problem::body_too_large().with("limit_bytes", limit))?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| Problem::malformed(format!("invalid JSON body: {e}")))
    }
}
