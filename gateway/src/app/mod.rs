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
//! 5. The router: `/_sluice/…` handlers (bodies limited, no-store, the
//!    store-bound ones behind [`store_bound`], admin calls behind
//!    [`admin_guard`]), and as fallback the guarded proxy (whose forwards
//!    to the origin are bounded by `limits.max_origin_requests`).
//!
//! The accept loop ([`crate::edge::server`]) bounds open connections
//! (`limits.max_connections`). A request that no room guards (outside
//! `/_sluice/`, `/metrics` and every room's paths, or let by its room's
//! bypass rules) goes from the connection straight to the proxy, without
//! the router and its layers: it gets the same request id (one counter),
//! the same catch of a panic, and the proxy's own problem logs, but no
//! per-request tracing span. On this path the layers cost about a fifth
//! of the gateway's CPU per request (`tests/bench/proxy.sh`).

pub mod problem;
pub mod stores;
pub mod telemetry;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use http::{HeaderName, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

use crate::app::problem::Problem;
use crate::app::telemetry::Telemetry;
use crate::config::Config;
use crate::edge::client_ip::ClientInfo;
use crate::gate::rooms::{Room, Rooms};
use crate::proxy::Proxy;
use crate::{gate, visitor};
use sluice_admission::{
    AdmitClaims, Keyring, QueueBackend, QueueClaims, QueueStore, TokenError, VerifyCache,
};
use sluice_pow::{Keyset, ReplayGuard};
use sluice_reservation::InventoryBackend;

/// Everything a handler may need, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    proxy: Proxy,
    rooms: Arc<Rooms>,
    queue: QueueBackend,
    keyring: Keyring,
    verify_cache: VerifyCache,
    pow: Keyset,
    replay_guard: ReplayGuard,
    inventory: InventoryBackend,
    events: crate::reserve::events::Events,
    /// The per-visitor limit on hold requests
    /// (`limits.holds_per_visitor_per_min`).
    hold_limiter: Arc<crate::reserve::hold_limit::HoldLimiter>,
    telemetry: Telemetry,
    shutting_down: AtomicBool,
    admin_failures: AdminFailures,
    /// Permits of the requests that may touch the stores
    /// (`limits.max_store_requests`, see [`store_bound`]).
    store_slots: Arc<tokio::sync::Semaphore>,
    /// Permits of the admin API's calls (`limits.max_admin_requests`).
    admin_slots: Arc<tokio::sync::Semaphore>,
    background: Vec<tokio::task::AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for h in &self.background {
            h.abort();
        }
    }
}

/// Milliseconds since the Unix epoch (the gateway's clock; the admission
/// store uses its own).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Seconds since the Unix epoch.
pub fn now_s() -> u64 {
    now_ms() / 1000
}

impl AppState {
    /// Builds the state from a validated configuration whose `origin` is
    /// set: connects the stores (Redis when configured, else memory), loads
    /// or makes the keys, and starts the background tasks (the admission
    /// ticker and the reservation reaper).
    pub async fn new(config: Config) -> anyhow::Result<AppState> {
        let origin = config
            .origin
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no origin configured"))?;
        let telemetry = Telemetry::new();
        let proxy = Proxy::new(
            &origin,
            &config.proxy,
            &config.timeouts,
            config.limits.max_origin_requests,
            crate::edge::server::io_threads(config.server.io_threads),
            telemetry.clone(),
        )?;
        let rooms = Arc::new(Rooms::from_config(&config)?);
        let stores = crate::app::stores::connect(&config).await?;
        let keyring = match &config.keys_dir {
            Some(dir) => Keyring::load_dir(dir)
                .map_err(|e| anyhow::anyhow!("keys in {}: {e}", dir.display()))?,
            None => {
                tracing::warn!(
                    "no --keys-dir: tokens are signed with an ephemeral key (lost at restart, not shared between gateways)"
                );
                Keyring::ephemeral()
            }
        };
        let pow = match &config.pow_secret {
            Some(s) => {
                let older: Vec<&[u8]> = config
                    .pow_previous_secrets
                    .iter()
                    .map(|p| p.as_bytes())
                    .collect();
                Keyset::from_secrets(s.as_bytes(), &older)
                    .map_err(|e| anyhow::anyhow!("pow secret: {e}"))?
            }
            None => Keyset::random(),
        };
        let events = crate::reserve::events::Events::from_config(&config);
        // This gateway's id for the steering leases of adaptive admission.
        let gateway_id = format!("gw-{:016x}", rand::random::<u64>());
        let mut background = vec![
            tokio::spawn(crate::gate::rooms::run_ticker(
                rooms.clone(),
                stores.queue.clone(),
                telemetry.clone(),
                events.clone(),
            ))
            .abort_handle(),
            tokio::spawn(crate::reserve::events::run_reaper(
                events.clone(),
                stores.inventory.clone(),
                config.events.clone(),
                config.loads_stock(),
            ))
            .abort_handle(),
        ];
        for room in rooms.all() {
            background.push(
                tokio::spawn(crate::gate::adaptive::run_steering(
                    room.clone(),
                    stores.queue.clone(),
                    telemetry.clone(),
                    gateway_id.clone(),
                ))
                .abort_handle(),
            );
        }
        let hold_limiter = Arc::new(crate::reserve::hold_limit::HoldLimiter::new(
            config.limits.holds_per_visitor_per_min,
        ));
        background.push(
            tokio::spawn(crate::reserve::hold_limit::run_pruner(hold_limiter.clone()))
                .abort_handle(),
        );
        let store_slots = Arc::new(tokio::sync::Semaphore::new(
            config.limits.max_store_requests,
        ));
        let admin_slots = Arc::new(tokio::sync::Semaphore::new(
            config.limits.max_admin_requests,
        ));
        let verify_cache = VerifyCache::new(config.limits.token_cache_entries);
        Ok(AppState {
            inner: Arc::new(Inner {
                config,
                proxy,
                rooms,
                queue: stores.queue,
                keyring,
                verify_cache,
                pow,
                replay_guard: stores.replay_guard,
                inventory: stores.inventory,
                events,
                hold_limiter,
                telemetry,
                shutting_down: AtomicBool::new(false),
                admin_failures: AdminFailures::default(),
                store_slots,
                admin_slots,
                background,
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

    /// A room by id, or 404 `room_not_found`.
    pub fn room(&self, id: &str) -> Result<&Arc<Room>, Problem> {
        self.inner.rooms.get(id).ok_or_else(Problem::room_not_found)
    }

    /// The proxy to the origin.
    pub fn proxy(&self) -> &Proxy {
        &self.inner.proxy
    }

    /// The admission store.
    pub fn queue(&self) -> &QueueBackend {
        &self.inner.queue
    }

    /// The token keys.
    pub fn keyring(&self) -> &Keyring {
        &self.inner.keyring
    }

    /// The proof-of-work keys.
    pub fn pow(&self) -> &Keyset {
        &self.inner.pow
    }

    /// The proof-of-work replay guard.
    pub fn replay_guard(&self) -> &ReplayGuard {
        &self.inner.replay_guard
    }

    /// The reservation store.
    pub fn inventory(&self) -> &InventoryBackend {
        &self.inner.inventory
    }

    /// This gateway's metrics.
    pub fn telemetry(&self) -> &Telemetry {
        &self.inner.telemetry
    }

    /// The events and their cached state.
    pub fn events(&self) -> &crate::reserve::events::Events {
        &self.inner.events
    }

    /// The per-visitor limit on hold requests.
    pub fn hold_limiter(&self) -> &crate::reserve::hold_limit::HoldLimiter {
        &self.inner.hold_limiter
    }

    /// Verifies a queue token of `room` (through the verified-token cache).
    pub fn verify_queue(&self, token: &str, room: &str) -> Result<QueueClaims, TokenError> {
        self.inner
            .verify_cache
            .verify_queue(&self.inner.keyring, token, room, now_s())
    }

    /// Verifies an admission token of `room` (through the cache).
    pub fn verify_admit(&self, token: &str, room: &str) -> Result<AdmitClaims, TokenError> {
        self.inner
            .verify_cache
            .verify_admit(&self.inner.keyring, token, room, now_s())
    }

    /// Whether every event sold through `room` has nothing available (the
    /// room then stops admitting; stock held in carts may still come back).
    /// Either this gateway's view of the stock says so, or another gateway
    /// already set the room's `sold_out` flag in the store.
    pub fn sold_out(&self, room: &str) -> bool {
        self.inner.events.room_sold_out(room)
            || self
                .inner
                .rooms
                .get(room)
                .is_some_and(|r| r.settings().sold_out)
    }

    /// Signs an admission token for visitor `sub`. Its session is the
    /// place's own (`epoch.seq`, [`crate::visitor::session_of`]): however
    /// often a place is claimed, its tokens name one session. A token with
    /// no place (failing open) has a session of its own.
    pub fn issue_admission(
        &self,
        room: &Room,
        sub: &str,
        seq: Option<u64>,
        epoch: u64,
        client: &ClientInfo,
    ) -> Result<(String, AdmitClaims), Problem> {
        let settings = room.settings();
        let now = now_s();
        let mut claims = AdmitClaims::new(room.id(), sub, epoch, now, settings.session_ttl);
        claims.seq = seq;
        claims.sid = Some(match seq {
            Some(seq) => crate::visitor::session_of(epoch, seq),
            None => claims.jti.clone(),
        });
        if let Some(cap) = room.config.session_hard_cap {
            claims.hcap = Some(now + cap.as_secs());
        }
        if room.config.bind_ip_prefix {
            claims.ipp = Some(sluice_pow::network_prefix(client.ip).to_string());
        }
        let token = self
            .inner
            .keyring
            .sign_admit(&claims)
            .map_err(|e| Problem::internal().log_cause(&e))?;
        Ok((token, claims))
    }

    /// Starts session `sid` of a place admitted on the spot (counted
    /// against `max_active`). A session the store did not record only
    /// loosens the cap until the store is back: the token verifies locally.
    pub async fn start_session(&self, room: &Room, sid: &str) {
        let ttl = room.settings().session_ttl;
        if let Err(e) = self.inner.queue.session_start(room.id(), sid, ttl).await {
            tracing::warn!(room = room.id(), error = %e, "session not recorded");
        }
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
    build_with_ids(state, RequestIds::default())
}

/// [`build`], with the request ids it gives shared with the server's
/// direct path to the origin ([`crate::edge::server`]).
pub(crate) fn build_with_ids(state: AppState, ids: RequestIds) -> Router {
    let control = Router::new()
        .route("/_sluice/healthz", get(healthz))
        .route("/_sluice/readyz", get(readyz))
        .route("/_sluice/jwks.json", get(visitor::jwks))
        .route("/_sluice/openapi.json", get(openapi))
        .route("/_sluice/rooms/{room}", get(visitor::public_room))
        .route("/_sluice/rooms/{room}/challenge", post(visitor::challenge))
        .route("/_sluice/rooms/{room}/join", post(visitor::join))
        .route("/_sluice/rooms/{room}/status", get(visitor::status))
        .route(
            "/_sluice/static/{file}",
            get(crate::visitor::page::static_file),
        )
        .route("/_sluice/admin/rooms", get(admin_list_rooms))
        .route(
            "/_sluice/admin/rooms/{room}",
            get(admin_get_room).patch(admin_patch_room),
        )
        .merge(crate::reserve::routes())
        .merge(crate::admin::dashboard::routes())
        .route("/metrics", get(metrics))
        .route("/_sluice/{*rest}", any(unknown_endpoint))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin_guard,
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
                .layer(
                    TraceLayer::new_for_http().make_span_with(|req: &Request| {
                        let id = req
                            .headers()
                            .get(&REQUEST_ID)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("");
                        tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
                    }),
                )
                .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
        )
}

/// Request ids: a random per-process prefix and a counter — unique, cheap,
/// and they sort by arrival within one gateway.
#[derive(Clone)]
pub(crate) struct RequestIds {
    /// 8 hex digits.
    prefix: [u8; 8],
    next: Arc<AtomicU64>,
}

/// The header a request id travels in.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

impl Default for RequestIds {
    fn default() -> Self {
        let p: u32 = rand::random();
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(format!("{p:08x}").as_bytes());
        RequestIds {
            prefix,
            next: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl RequestIds {
    /// The next id: the prefix, '-', the counter in lowercase hex (at most
    /// 25 bytes), written without `core::fmt` (it is made for every request).
    pub(crate) fn next_value(&self) -> HeaderValue {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 25];
        buf[..8].copy_from_slice(&self.prefix);
        buf[8] = b'-';
        let digits = (64 - n.leading_zeros() as usize).div_ceil(4).max(1);
        for i in 0..digits {
            buf[9 + digits - 1 - i] = HEX[((n >> (4 * i)) & 0xf) as usize];
        }
        HeaderValue::from_bytes(&buf[..9 + digits])
            .unwrap_or_else(|_| HeaderValue::from_static("-"))
    }
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _req: &http::Request<B>) -> Option<RequestId> {
        Some(RequestId::new(self.next_value()))
    }
}

pub(crate) fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
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
    let down: Vec<&str> = state
        .rooms()
        .all()
        .iter()
        .filter(|r| !r.store_ok())
        .map(|r| r.id())
        .collect();
    if !down.is_empty() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "store_unavailable", "rooms": down})),
        )
            .into_response();
    }
    axum::Json(json!({"status": "ready"})).into_response()
}

/// `GET /metrics`: Prometheus text, behind the admin token (API.md lists
/// it among the admin endpoints).
async fn metrics(
    State(state): State<AppState>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    Ok(metrics_text(&state))
}

/// The Prometheus exposition with its content type.
pub fn metrics_text(state: &AppState) -> Response {
    state
        .telemetry()
        .token_cache(state.inner.verify_cache.len());
    let mut res = state.telemetry().render().into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    res
}

/// The gateway's own reference of its HTTP contract.
const OPENAPI: &str = include_str!("../../api/openapi.json");

async fn openapi() -> Response {
    let mut res = OPENAPI.into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
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
pub fn touches_store(path: &str) -> bool {
    if let Some(rest) = path.strip_prefix("/_sluice/rooms/") {
        return rest.ends_with("/challenge")
            || rest.ends_with("/join")
            || rest.ends_with("/status");
    }
    ["/_sluice/events/", "/_sluice/holds/", "/_sluice/webhooks/"]
        .iter()
        .any(|p| path.starts_with(p))
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
    let (slots, what) = if admin {
        (&state.inner.admin_slots, "admin")
    } else {
        (&state.inner.store_slots, "store")
    };
    let Ok(_permit) = slots.clone().try_acquire_owned() else {
        state.telemetry().shed(what);
        return Problem::store_overloaded().into_response();
    };
    next.run(req).await
}

/// The request with its body read into memory, within the body deadline
/// and the control plane's size limit.
async fn read_body(state: &AppState, req: Request) -> Result<Request, Problem> {
    if http_body::Body::is_end_stream(req.body()) {
        return Ok(req);
    }
    let limit = state.config().limits.control_body_bytes;
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
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

// === admin ===

/// Failed admin authentications a client network (its /24 or /56, as for
/// joins) may make per minute; past it, admin calls from that network
/// answer 429 until the minute is over.
pub const ADMIN_FAILURES_PER_MIN: u32 = 20;

/// Most client networks whose failed admin authentications are tracked at
/// once.
const ADMIN_FAILURES_TRACKED: usize = 100_000;

/// Failed admin authentications per client network, in fixed one-minute
/// windows. The admin token is compared in constant time; this bounds how
/// many guesses a network gets. While a network is over the limit its
/// calls are refused *without* comparing the token, so a guess made then
/// teaches nothing (a locked-out operator waits out the minute, or calls
/// from another network).
///
/// Memory is bounded: at [`ADMIN_FAILURES_TRACKED`] networks, the windows
/// that ended are dropped; if the map is still full, a network not yet
/// tracked is not tracked (its failures are not counted until room frees
/// up, at the latest a minute later). A tracked network is never reset
/// early, so a blocked one stays blocked however many other networks fail.
struct AdminFailures {
    cap: usize,
    windows: std::sync::Mutex<std::collections::HashMap<sluice_pow::NetPrefix, (u64, u32)>>,
}

impl Default for AdminFailures {
    fn default() -> Self {
        AdminFailures::with_cap(ADMIN_FAILURES_TRACKED)
    }
}

impl AdminFailures {
    fn with_cap(cap: usize) -> AdminFailures {
        AdminFailures {
            cap,
            windows: std::sync::Mutex::default(),
        }
    }

    /// Seconds to wait when `net` is over the limit at `now_s`.
    fn blocked(&self, net: sluice_pow::NetPrefix, now_s: u64) -> Option<u64> {
        let map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let (start, n) = *map.get(&net)?;
        let end = start + 60;
        (n >= ADMIN_FAILURES_PER_MIN && now_s < end).then(|| end - now_s)
    }

    fn record(&self, net: sluice_pow::NetPrefix, now_s: u64) {
        let mut map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(&net) && map.len() >= self.cap {
            // Only windows that are over go: they count nothing any more.
            map.retain(|_, (start, _)| now_s < *start + 60);
            if map.len() >= self.cap {
                tracing::warn!(
                    tracked = map.len(),
                    "admin failures: too many networks tracked; this one is not counted"
                );
                return;
            }
        }
        let w = map.entry(net).or_insert((now_s, 0));
        if now_s >= w.0 + 60 {
            *w = (now_s, 0);
        }
        w.1 = w.1.saturating_add(1);
    }
}

/// Brute-force guard of the admin API (`/_sluice/admin/…` and `/metrics`):
/// counts the 401s each client network earns and answers 429
/// `rate_limited` (with `Retry-After`) once it has had
/// [`ADMIN_FAILURES_PER_MIN`] in the current minute.
async fn admin_guard(
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
    let failures = &state.inner.admin_failures;
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
    }
    res
}

async fn admin_list_rooms(
    State(state): State<AppState>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let rooms: Vec<Value> = state
        .rooms()
        .all()
        .iter()
        .map(|r| crate::gate::rooms::admin_view(r))
        .collect();
    Ok(axum::Json(json!({ "rooms": rooms })).into_response())
}

async fn admin_get_room(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    Ok(axum::Json(crate::gate::rooms::admin_view_fresh(room, state.queue()).await).into_response())
}

async fn admin_patch_room(
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_ids_are_the_prefix_and_the_counter_in_hex() {
        let ids = RequestIds::default();
        let prefix = std::str::from_utf8(&ids.prefix).unwrap().to_owned();
        assert!(prefix.bytes().all(|b| b.is_ascii_hexdigit()), "{prefix}");
        for n in [1u64, 9, 10, 15, 16, 255, 256, 0xdead_beef, u64::MAX] {
            ids.next.store(n, Ordering::Relaxed);
            assert_eq!(ids.next_value(), format!("{prefix}-{n:x}").as_str());
        }
        ids.next.store(0, Ordering::Relaxed);
        assert_eq!(ids.next_value(), format!("{prefix}-0").as_str());
    }

    fn net(i: u32) -> sluice_pow::NetPrefix {
        sluice_pow::network_prefix(std::net::IpAddr::from(std::net::Ipv4Addr::from(
            0x0a00_0000 + (i << 8),
        )))
    }

    #[test]
    fn a_full_admin_failure_map_never_resets_a_blocked_network() {
        let f = AdminFailures::with_cap(4);
        let attacker = net(0);
        for _ in 0..ADMIN_FAILURES_PER_MIN {
            f.record(attacker, 1000);
        }
        assert_eq!(f.blocked(attacker, 1000), Some(60));
        // A spray of other networks fills the map and goes on past it.
        for i in 1..50 {
            f.record(net(i), 1010);
        }
        assert_eq!(f.windows.lock().unwrap().len(), 4);
        assert_eq!(
            f.blocked(attacker, 1010),
            Some(50),
            "the attacker was reset"
        );
        // The attacker's own further failures keep counting in its window.
        f.record(attacker, 1020);
        assert_eq!(f.blocked(attacker, 1020), Some(40));
        // Networks tracked before the map filled keep their counts.
        let early = net(1);
        for _ in 1..ADMIN_FAILURES_PER_MIN {
            f.record(early, 1030);
        }
        assert!(f.blocked(early, 1030).is_some());
        // Once windows have ended they make room, and a new network counts.
        let late = net(99);
        f.record(late, 1075);
        assert!(f.windows.lock().unwrap().contains_key(&late));
        assert_eq!(f.blocked(attacker, 1075), None, "its minute is over");
        // The early network's window (started at 1010) is over too.
        assert_eq!(f.blocked(early, 1075), None);
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
            "/_sluice/admin",
            "/_sluice/admin/rooms/default",
            "/_sluice/admin/events/demo",
        ] {
            assert!(touches_store(p), "{p}");
        }
        for p in [
            "/_sluice/healthz",
            "/_sluice/readyz",
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
