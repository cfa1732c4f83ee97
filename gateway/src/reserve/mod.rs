//! The reservation endpoints of API.md: events, holds, the payment webhook
//! and the event admin endpoints. Every decision is one atomic store
//! operation of `sluice-reservation`; this module maps HTTP to it and its
//! outcomes back to the codes of API.md.
//!
//! The visitor is the admission token's `sub`, from the cookie
//! `sluice_a_{room}` or a bearer token, where the room is the one that sells
//! the event.
//!
//! Mapping decisions beyond the letter of API.md (all additions, no change):
//!
//! - A *succeeded* payment for a hold that was already released (by its
//!   visitor, or by an earlier failed payment) answers 409 `hold_released`:
//!   nothing was sold, the provider must refund, exactly like
//!   `hold_expired`. A *failed* payment on a released hold answers 200
//!   `released`, and any payment on a confirmed hold 200 `confirmed` (a
//!   failure after success leaves the sale standing).
//! - `DELETE` of a hold that lapsed answers 200 with `status: "expired"`
//!   (its stock went back, as for a release; `GET` says the same).
//! - Store faults: 503 `store_unavailable` when the store is down, slow or
//!   restarting; 500 `internal_error` for a fault retrying cannot cure (a
//!   script error, an answer of an unknown shape).
//! - `Idempotency-Key`: 1 to 128 visible ASCII characters, else 400
//!   `malformed_request` (nothing held).
//! - An event created through another gateway sharing the store is found
//!   in the store on first use, then remembered. One the store lost (its
//!   load marker survives) answers 503 `inventory_not_ready`, not 404.
//! - An explicit `PUT` of an event the store lost is the operator's load:
//!   201 with `lost: true` and `lost_version`, logged as a reload; the
//!   admin view of a lost event says `lost` too.
//! - `PUT` of an existing event without `room` keeps the event's room; a
//!   new event defaults to `default`.
//! - An empty webhook secret counts as none: every signature is refused.
//! - A `payment_event_id` already applied to another hold of the event
//!   answers 409 `payment_event_reused` and changes nothing (a provider's
//!   payment event is about one payment, so one hold).
//! - The signature's `t` is hashed exactly as sent; it must be 1 to 20
//!   ASCII digits (no sign, no spaces), else the signature is refused.
//! - Hold requests are limited per visitor (`limits.holds_per_visitor_per_min`,
//!   default 60 a minute): past it, 429 `rate_limited` with `Retry-After`,
//!   checked after the admission token and before the body or the store.
//!   Replays of an `Idempotency-Key` count and are refused too: a replay
//!   costs the store what a hold costs, and its answer is the same after
//!   the wait ([`crate::reserve::hold_limit`]).
//! - Categories (API.md wave 2): a hold body is `{"qty"}` or `{"items"}`,
//!   never both (400 `malformed_request`). `items` is a non-empty list of
//!   `{"category", "qty"}`; a category listed twice is 400
//!   `duplicate_category`, an item's qty outside 1..2^32 is 422
//!   `invalid_quantity`, an unknown category (or any, on an event without
//!   categories) 404 `category_not_found`, a bare `qty` on an event with
//!   categories 422 `items_required`. `sold_out` and
//!   `cart_limit_exceeded` of one category carry `category`. A `PUT` that
//!   puts a category below what is held and sold in it (0 when left out)
//!   is 409 `category_below_committed` with `category`, `held` and
//!   `confirmed`; with `categories` the event's `total` is their sum (a
//!   `total` given must equal it, else 422 `invalid_setting`).
//! - Stock feeds (issue 20, [`feeds`]): `POST
//!   /_sluice/admin/events/{event}/stock` applies one row (a delta with an
//!   idempotency key, or a versioned snapshot, of the event or one
//!   category) and answers 200 with the new counters (`replayed: true` for
//!   a key applied before); a stale snapshot is 409 `stale_version` (as a
//!   stale `PUT`), not a 200. The refusals, nothing applied: 409
//!   `stock_negative` (with `available`), `feed_key_reused`,
//!   `below_committed`, `category_below_committed`; 404
//!   `category_not_found`; 422 `category_required` (no category on an event
//!   with categories), `invalid_setting` (a value out of range, with
//!   `field`); 400 `malformed_request` (not a row). `POST …/feed` queues
//!   1 to `feeds.max_batch` rows checked for shape (one bad row refuses the
//!   batch, naming it with `row`) and answers 202; past `feeds.max_depth`
//!   503 `feed_full`. `GET …/feed` reports the lane.
//! - Scheduled waves ([`waves`]): `GET`/`PUT
//!   /_sluice/admin/events/{event}/waves`; codes `wave_in_past`,
//!   `category_not_found`, `invalid_setting`; event views carry
//!   `next_wave_at` while a wave is pending, and a `sold_out` refusal
//!   then carries `next_wave_at` and `Retry-After`.

pub mod events;
pub mod feeds;
pub mod hold_limit;
pub mod ledger;
pub mod waves;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use sha2::Sha256;
use sluice_admission::AdmitClaims;
use sluice_reservation::{
    CategoryId, CategorySpec, CategoryState, ConfirmOutcome, EventId, HoldId, HoldOutcome,
    HoldView, Inventory, Item, ReleaseOutcome, ReservationError, SetStockOutcome, StockSpec,
};
use subtle::ConstantTimeEq;

use crate::app::clock::now_s;
use crate::app::extract::JsonBody;
use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;
use crate::gate::session;

/// How far a webhook timestamp may be from now.
pub const WEBHOOK_TOLERANCE_S: u64 = 300;

/// The reservation routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/_sluice/events/{event}", get(get_event))
        .route("/_sluice/events/{event}/holds", post(create_hold))
        .route("/_sluice/holds/{hold}", get(get_hold).delete(delete_hold))
        .route("/_sluice/webhooks/payment", post(payment_webhook))
        .route("/_sluice/admin/events", get(admin_list_events))
        .route(
            "/_sluice/admin/events/{event}",
            get(admin_get_event).put(admin_put_event),
        )
        .route(
            "/_sluice/admin/events/{event}/waves",
            get(waves::admin_get_waves).put(waves::admin_put_waves),
        )
        .route(
            "/_sluice/admin/events/{event}/rebuild",
            post(admin_rebuild_event),
        )
        .route(
            "/_sluice/admin/events/{event}/stock",
            post(feeds::admin_post_stock),
        )
        .route(
            "/_sluice/admin/events/{event}/feed",
            get(feeds::admin_get_feed).post(feeds::admin_post_feed),
        )
}

/// `POST /_sluice/admin/events/{event}/rebuild`: a lost event rebuilt from
/// the ledger ([`ledger::rebuild`]). 200 with what was put back; 404
/// `event_not_found` when the ledger has no record of it, 409
/// `event_present` when the store still has it, 409 `ledger_not_configured`
/// without `--postgres`, 503 `ledger_unavailable` when PostgreSQL cannot be
/// read.
async fn admin_rebuild_event(
    State(state): State<AppState>,
    Path(id): Path<String>,
    client: Option<axum::Extension<crate::edge::client_ip::ClientInfo>>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let event = public_event(&id).ok_or_else(event_not_found)?;
    let who = crate::admin::dashboard::audit_who(&headers, client.as_deref());
    let v = ledger::rebuild(&state, &event).await?;
    tracing::warn!(target: "audit", who, event = %id, result = %v, "event rebuilt from the ledger");
    Ok(axum::Json(v).into_response())
}

/// An event id a visitor or an operator may name: a shard of a sharded
/// event (`hot~3`) is the store's business, never an event of the API.
pub(crate) fn public_event(id: &str) -> Option<EventId> {
    EventId::parse(id).filter(|e| !e.is_shard())
}

fn event_not_found() -> Problem {
    Problem::new(StatusCode::NOT_FOUND, "event_not_found", "No such event")
}

fn hold_not_found() -> Problem {
    Problem::new(StatusCode::NOT_FOUND, "hold_not_found", "No such hold")
}

fn not_ready() -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "inventory_not_ready",
        "The stock of this event is not loaded yet; try again shortly",
    )
    .retry_after(5)
}

/// 503 `store_unavailable` for a store that is down, slow or restarting
/// (retry helps); 500 `internal_error` for a fault retrying cannot cure.
/// Counts a write too few replicas acknowledged (`replication` config),
/// then hands the error on to [`store_err`].
fn lag_counted(state: &AppState, op: &'static str, e: ReservationError) -> ReservationError {
    if matches!(e, ReservationError::NotReplicated { .. }) {
        state.telemetry().replication_lagged(op);
    }
    e
}

fn store_err(e: ReservationError) -> Problem {
    if e.is_unavailable() {
        Problem::store_unavailable().log_cause(&e)
    } else {
        Problem::internal().log_cause(&e)
    }
}

/// The event id of a path with the room selling it: an event this gateway
/// knows (configured, created through it, or seen before), else one created
/// through another gateway sharing the store. An event the store had and
/// lost (its load marker survives) is 503 `inventory_not_ready`, as on the
/// gateways that knew it, never 404.
async fn known_event(state: &AppState, id: &str) -> Result<(EventId, String), Problem> {
    let event = public_event(id).ok_or_else(event_not_found)?;
    if let Some(room) = state.events().room_of(id) {
        return Ok((event, room));
    }
    match state.inventory().read(&event).await.map_err(store_err)? {
        Some(s) => {
            let room = s.room.clone();
            state.events().upsert(id, &room, Some(s));
            Ok((event, room))
        }
        None => match state
            .inventory()
            .loaded_version(&event)
            .await
            .map_err(store_err)?
        {
            Some(_) => Err(not_ready()),
            None => Err(event_not_found()),
        },
    }
}

/// The admitted visitor of `room`, or 401 `not_admitted`: a live
/// admission. A revoked session reads no event and takes no new hold,
/// whatever its token still says.
async fn visitor_of(
    state: &AppState,
    headers: &HeaderMap,
    room_id: &str,
    client: &ClientInfo,
) -> Result<AdmitClaims, Problem> {
    let room = state.rooms().get(room_id).ok_or_else(not_admitted)?;
    session::live_admission(state, headers, room, client)
        .await
        .map(|(_, c)| c)
        .ok_or_else(not_admitted)
}

/// The owner of holds in `room`, or 401 `not_admitted`: any valid
/// admission of the room, a revoked one included, so a visitor whose
/// checkout ended its session can still read or release what it holds
/// (releasing only ever returns stock).
fn owner_of(
    state: &AppState,
    headers: &HeaderMap,
    room_id: &str,
    client: &ClientInfo,
) -> Result<AdmitClaims, Problem> {
    let room = state.rooms().get(room_id).ok_or_else(not_admitted)?;
    session::admission_from(state, headers, room, client)
        .map(|(_, c)| c)
        .ok_or_else(not_admitted)
}

fn not_admitted() -> Problem {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "not_admitted",
        "An admission token of the room selling this event is required",
    )
}

/// A hold as its owner sees it (API.md's hold), written straight from the
/// view: a hold is the answer of every sale's hottest request, and a
/// `json!` map is built key by key before it is written. The fields are in
/// the order that map wrote them (alphabetical), so the bytes are the same.
#[derive(serde::Serialize)]
struct HoldBody<'a> {
    available: u64,
    /// The event asked for (a hold on shard `hot~3` is one of `hot`).
    event: &'a str,
    expires_at: u64,
    hold_id: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    items: &'a [Item],
    qty: u32,
    status: &'a str,
}

fn hold_json(h: &HoldView) -> HoldBody<'_> {
    HoldBody {
        available: h.available,
        event: h.event.base_str(),
        expires_at: h.expires_at,
        hold_id: h.hold_id.as_str(),
        items: &h.items,
        qty: h.qty,
        status: h.status.as_str(),
    }
}

/// The categories of an event as visitors (`admin` = false) or the
/// operator see them.
fn categories_json(cats: &[CategoryState], admin: bool) -> Value {
    cats.iter()
        .map(|c| {
            let mut v = json!({
                "id": c.id.as_str(),
                "total": c.total,
                "available": c.available,
                "cart_limit": c.cart_limit,
            });
            if admin {
                v["held"] = json!(c.held);
                v["confirmed"] = json!(c.confirmed);
            }
            v
        })
        .collect()
}

fn category_not_found(category: &str) -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "category_not_found",
        "The event has no such category",
    )
    .with("category", category.to_owned())
}

/// What a hold body asks for: a bare quantity or items.
enum Ask {
    Qty(u32),
    Items(Vec<Item>),
}

/// Parses `{"qty"}` or `{"items": [{"category", "qty"}]}` (module docs).
fn parse_ask(body: &Value, invalid_qty: &dyn Fn() -> Problem) -> Result<Ask, Problem> {
    let qty_of = |v: Option<&Value>| {
        v.and_then(Value::as_u64)
            .filter(|q| *q >= 1)
            .and_then(|q| u32::try_from(q).ok())
            .ok_or_else(invalid_qty)
    };
    let Some(items) = body.get("items") else {
        return Ok(Ask::Qty(qty_of(body.get("qty"))?));
    };
    if body.get("qty").is_some() {
        return Err(Problem::malformed("send qty or items, not both"));
    }
    let list = items
        .as_array()
        .filter(|l| !l.is_empty() && l.len() <= sluice_reservation::types::MAX_CATEGORIES)
        .ok_or_else(|| Problem::malformed("items must be a list of 1 to 64 {category, qty}"))?;
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let name = item
            .get("category")
            .and_then(Value::as_str)
            .ok_or_else(|| Problem::malformed("each item needs a category (a string)"))?;
        let category = CategoryId::parse(name).ok_or_else(|| category_not_found(name))?;
        out.push(Item {
            category,
            qty: qty_of(item.get("qty"))?,
        });
    }
    Ok(Ask::Items(out))
}

async fn get_event(
    State(state): State<AppState>,
    Path(id): Path<String>,
    axum::Extension(client): axum::Extension<ClientInfo>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let (event, room) = known_event(&state, &id).await?;
    let admission = visitor_of(&state, &headers, &room, &client).await?;
    if crate::visitor::stream::wants_stream(&headers) {
        let r = state.rooms().get(&room).cloned().ok_or_else(not_admitted)?;
        let view_id = id.clone();
        return crate::visitor::stream::availability_stream(
            state.clone(),
            r,
            admission,
            client,
            move |state: &AppState| {
                let s = state.events().cached(&view_id)?;
                event_json(&view_id, &s)
            },
        )
        .await;
    }
    let s = state
        .inventory()
        .read(&event)
        .await
        .map_err(store_err)?
        .ok_or_else(not_ready)?;
    let v = event_json(&id, &s).ok_or_else(not_ready)?;
    Ok(axum::Json(v).into_response())
}

/// The visitor's view of an event (`GET /_sluice/events/{event}`); `None`
/// while it is not ready.
fn event_json(id: &str, s: &sluice_reservation::EventState) -> Option<Value> {
    let available = s.available?;
    let mut v = json!({
        "event": id,
        "available": available,
        "total": s.total,
        "cart_limit": s.cart_limit,
        "hold_ttl_seconds": s.hold_ttl_secs,
    });
    if !s.categories.is_empty() {
        v["categories"] = categories_json(&s.categories, false);
    }
    waves::add_next_wave(&mut v, s);
    Some(v)
}

pub(crate) async fn create_hold(
    State(state): State<AppState>,
    Path(id): Path<String>,
    axum::Extension(client): axum::Extension<ClientInfo>,
    headers: HeaderMap,
    body: Result<JsonBody<Value>, Problem>,
) -> Result<Response, Problem> {
    let (event, room) = known_event(&state, &id).await?;
    let visitor = visitor_of(&state, &headers, &room, &client).await?;
    // Before the body is looked at or the store asked (`hold_limit`).
    state.hold_limiter().check(&visitor.sub).map_err(|wait| {
        state.telemetry().rate_limited(&room, "holds");
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "Too many hold requests from this visitor; slow down",
        )
        .retry_after(wait)
    })?;
    let JsonBody(body) = body?;
    let invalid_qty = |limit: Option<u32>| {
        let p = Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_quantity",
            "qty must be a whole number from 1 to the cart limit",
        );
        match limit {
            Some(l) => p.with("limit", l),
            None => p,
        }
    };
    let limit = state.events().cached(&id).map(|s| s.cart_limit);
    let ask = parse_ask(&body, &|| invalid_qty(limit))?;
    let idem = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let s = v
                .to_str()
                .ok()
                .filter(|s| {
                    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic())
                })
                .ok_or_else(|| {
                    Problem::malformed("Idempotency-Key must be 1 to 128 visible ASCII characters")
                })?;
            Some(s.to_owned())
        }
    };
    let outcome = match &ask {
        Ask::Qty(qty) => {
            state
                .inventory()
                .hold(&event, &visitor.sub, *qty, idem.as_deref())
                .await
        }
        Ask::Items(items) => {
            state
                .inventory()
                .hold_items(&event, &visitor.sub, items, idem.as_deref())
                .await
        }
    };
    let outcome = outcome
        .map_err(|e| lag_counted(&state, "hold", e))
        .map_err(store_err)?;
    state.telemetry().hold(outcome_label(&outcome));
    match outcome {
        HoldOutcome::Held(h) | HoldOutcome::Replayed(h) => {
            Ok((StatusCode::CREATED, axum::Json(hold_json(&h))).into_response())
        }
        HoldOutcome::SoldOut { available } => Err(waves::sold_out_with_wave(
            &state,
            &event,
            None,
            Problem::new(StatusCode::CONFLICT, "sold_out", "Not enough tickets left")
                .with("available", available),
        )
        .await),
        HoldOutcome::CartLimitExceeded { limit, held } => Err(Problem::new(
            StatusCode::CONFLICT,
            "cart_limit_exceeded",
            "That would take you over the cart limit",
        )
        .with("limit", limit)
        .with("held", held)),
        HoldOutcome::InvalidQuantity { limit } => Err(invalid_qty(Some(limit))),
        // A layout changing under the hold (the store refused it, nothing
        // taken): retrying shortly finds the new one.
        HoldOutcome::NotReady | HoldOutcome::Resharded { .. } => Err(not_ready()),
        HoldOutcome::CategoryNotFound { category } => Err(category_not_found(&category)),
        HoldOutcome::DuplicateCategory { category } => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "duplicate_category",
            "A category is listed twice in one hold",
        )
        .with("category", category)),
        HoldOutcome::ItemsRequired => Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "items_required",
            "This event has categories: say which with items",
        )),
        HoldOutcome::CategorySoldOut {
            category,
            available,
        } => Err(waves::sold_out_with_wave(
            &state,
            &event,
            Some(&category),
            Problem::new(
                StatusCode::CONFLICT,
                "sold_out",
                "Not enough tickets left in this category",
            )
            .with("available", available)
            .with("category", category.clone()),
        )
        .await),
        HoldOutcome::CategoryCartLimitExceeded {
            category,
            limit,
            held,
        } => Err(Problem::new(
            StatusCode::CONFLICT,
            "cart_limit_exceeded",
            "That would take you over this category's cart limit",
        )
        .with("limit", limit)
        .with("held", held)
        .with("category", category)),
    }
}

/// The `outcome` label of `sluice_holds_total`.
fn outcome_label(o: &HoldOutcome) -> &'static str {
    match o {
        HoldOutcome::Held(_) => "held",
        HoldOutcome::Replayed(_) => "replayed",
        HoldOutcome::SoldOut { .. } => "sold_out",
        HoldOutcome::CartLimitExceeded { .. } => "cart_limit_exceeded",
        HoldOutcome::InvalidQuantity { .. } => "invalid_quantity",
        HoldOutcome::NotReady | HoldOutcome::Resharded { .. } => "not_ready",
        HoldOutcome::CategoryNotFound { .. } => "category_not_found",
        HoldOutcome::DuplicateCategory { .. } => "duplicate_category",
        HoldOutcome::ItemsRequired => "items_required",
        HoldOutcome::CategorySoldOut { .. } => "sold_out",
        HoldOutcome::CategoryCartLimitExceeded { .. } => "cart_limit_exceeded",
    }
}

/// The hold of a path and the caller (ownership is the store's check).
async fn hold_of(
    state: &AppState,
    id: &str,
    headers: &HeaderMap,
    client: &ClientInfo,
) -> Result<(HoldId, AdmitClaims), Problem> {
    let hold = HoldId::parse(id).ok_or_else(hold_not_found)?;
    // A hold on shard `hot~3` is a hold of event `hot`.
    let event = hold.event().base();
    let (_, room) = known_event(state, event.as_str()).await.map_err(|p| {
        if p.code() == "event_not_found" {
            hold_not_found()
        } else {
            p
        }
    })?;
    let visitor = owner_of(state, headers, &room, client)?;
    Ok((hold, visitor))
}

async fn get_hold(
    State(state): State<AppState>,
    Path(id): Path<String>,
    axum::Extension(client): axum::Extension<ClientInfo>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let (hold, visitor) = hold_of(&state, &id, &headers, &client).await?;
    let h = state
        .inventory()
        .get_hold(&hold, &visitor.sub)
        .await
        .map_err(store_err)?
        .ok_or_else(hold_not_found)?;
    Ok(axum::Json(hold_json(&h)).into_response())
}

async fn delete_hold(
    State(state): State<AppState>,
    Path(id): Path<String>,
    axum::Extension(client): axum::Extension<ClientInfo>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let (hold, visitor) = hold_of(&state, &id, &headers, &client).await?;
    match state
        .inventory()
        .release(&hold, &visitor.sub)
        .await
        .map_err(store_err)?
    {
        ReleaseOutcome::Released | ReleaseOutcome::AlreadyReleased => {
            Ok(axum::Json(json!({"hold_id": id, "status": "released"})).into_response())
        }
        ReleaseOutcome::Expired => {
            Ok(axum::Json(json!({"hold_id": id, "status": "expired"})).into_response())
        }
        ReleaseOutcome::Confirmed => Err(Problem::new(
            StatusCode::CONFLICT,
            "hold_confirmed",
            "This hold is paid and cannot be released",
        )),
        ReleaseOutcome::NotFound => Err(hold_not_found()),
        ReleaseOutcome::NotReady => Err(not_ready()),
    }
}

/// Most `v1=` values a `Sluice-Signature` may carry (a provider rolling
/// its secret sends one per secret: two or three in practice). More is
/// refused before any hashing.
pub const MAX_SIGNATURES: usize = 8;
/// Longest `Sluice-Signature` accepted, in bytes: room for `t`, eight
/// 64-digit `v1` values and spaces. Longer is refused before it is split.
pub const MAX_SIGNATURE_HEADER: usize = 1024;

/// Checks `Sluice-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]` over
/// `t + "." + body`.
///
/// The HMAC is computed once, whatever the number of `v1=` values, and
/// each value is compared with it in constant time (`subtle`): the work
/// per webhook is one pass over the body, and a header of many guesses
/// costs no more than one. Past [`MAX_SIGNATURE_HEADER`] bytes or
/// [`MAX_SIGNATURES`] values the header is refused unread.
pub fn verify_signature(
    secret: &[u8],
    header: &str,
    body: &[u8],
    now: u64,
) -> Result<(), &'static str> {
    if header.len() > MAX_SIGNATURE_HEADER {
        return Err("signature header too long");
    }
    let mut t_raw: Option<&str> = None;
    let mut sigs: Vec<&str> = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t_raw = Some(v),
            Some(("v1", v)) => {
                if sigs.len() == MAX_SIGNATURES {
                    return Err("too many v1 signatures");
                }
                sigs.push(v);
            }
            _ => {}
        }
    }
    // `t` is signed exactly as sent: it is parsed only for the tolerance
    // check, and only plain digits are accepted (no sign, no spaces), so
    // `+1700…` can never pass for `1700…`.
    let t_raw = t_raw.ok_or("no timestamp")?;
    if t_raw.is_empty() || t_raw.len() > 20 || !t_raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err("timestamp must be 1 to 20 ASCII digits");
    }
    let t: u64 = t_raw.parse().map_err(|_| "timestamp out of range")?;
    if t.abs_diff(now) > WEBHOOK_TOLERANCE_S {
        return Err("timestamp outside the tolerance");
    }
    if sigs.is_empty() {
        return Err("no v1 signature");
    }
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return Err("bad secret");
    };
    mac.update(t_raw.as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected = mac.finalize().into_bytes();
    // Every value is compared (no early exit on a match), so the time
    // taken says nothing about which one matched.
    let mut matched = subtle::Choice::from(0);
    for sig in sigs {
        if let Some(given) = from_hex(sig) {
            matched |= expected.as_slice().ct_eq(&given);
        }
    }
    if bool::from(matched) {
        Ok(())
    } else {
        Err("signature mismatch")
    }
}

/// The `Sluice-Signature` header for `body` at time `t` (for providers,
/// the demo shop and tests).
pub fn sign_webhook(secret: &[u8], t: u64, body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

async fn payment_webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Problem> {
    let bad_sig = |why: &str| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "signature_invalid",
            "The webhook signature is missing, wrong or too old",
        )
        .log_cause(&why)
    };
    if body.len() > state.config().limits.control_body_bytes {
        return Err(Problem::body_too_large());
    }
    let secret = state
        .config()
        .webhook_secret
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad_sig("no webhook secret configured"))?;
    let sig = headers
        .get("sluice-signature")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| bad_sig("no Sluice-Signature header"))?;
    verify_signature(secret.as_bytes(), sig, &body, now_s()).map_err(bad_sig)?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| Problem::malformed(format!("invalid JSON body: {e}")))?;
    let payment_event_id = v
        .get("payment_event_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.len() <= 128)
        .ok_or_else(|| {
            Problem::malformed("payment_event_id must be a string of 1 to 128 characters")
        })?;
    let hold_id = v
        .get("hold_id")
        .and_then(Value::as_str)
        .ok_or_else(|| Problem::malformed("hold_id is required"))?;
    let succeeded = match v.get("outcome").and_then(Value::as_str) {
        Some("succeeded") => true,
        Some("failed") => false,
        _ => {
            return Err(Problem::malformed(
                "outcome must be \"succeeded\" or \"failed\"",
            ));
        }
    };
    let hold = HoldId::parse(hold_id).ok_or_else(hold_not_found)?;
    let outcome = state
        .inventory()
        .confirm(&hold, payment_event_id, succeeded)
        .await
        .map_err(|e| lag_counted(&state, "confirm", e))
        .map_err(store_err)?;
    match outcome {
        // A succeeded payment for a hold given back earlier: nothing was
        // sold, the money must go back (API.md allows added codes).
        ConfirmOutcome::Released if succeeded => Err(Problem::new(
            StatusCode::CONFLICT,
            "hold_released",
            "The hold was released before payment; nothing was sold: refund the payment",
        )
        .with("hold_id", hold_id)),
        ConfirmOutcome::Confirmed | ConfirmOutcome::Released => Ok(axum::Json(json!({
            "hold_id": hold_id,
            "status": outcome.as_str(),
        }))
        .into_response()),
        ConfirmOutcome::Expired => Err(Problem::new(
            StatusCode::CONFLICT,
            "hold_expired",
            "The hold lapsed before payment; its stock went back: refund the payment",
        )
        .with("hold_id", hold_id)),
        ConfirmOutcome::PaymentReused => Err(Problem::new(
            StatusCode::CONFLICT,
            "payment_event_reused",
            "This payment_event_id was already applied to another hold; nothing changed",
        )
        .with("hold_id", hold_id)),
        ConfirmOutcome::NotFound => Err(hold_not_found()),
        ConfirmOutcome::NotReady => Err(not_ready()),
    }
}

// === admin ===

async fn admin_list_events(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let mut out = Vec::new();
    for id in state.events().ids() {
        out.push(event_admin_json(&state, &id).await?);
    }
    Ok(axum::Json(json!({ "events": out })).into_response())
}

async fn event_admin_json(state: &AppState, id: &str) -> Result<Value, Problem> {
    let event = public_event(id).ok_or_else(event_not_found)?;
    let s = state.inventory().read(&event).await.map_err(store_err)?;
    let mut v = match s {
        Some(s) => json!({
            "event": id,
            "room": s.room,
            "total": s.total,
            "available": s.available,
            "held": s.held,
            "confirmed": s.confirmed,
            "version": s.version,
            "cart_limit": s.cart_limit,
            "hold_ttl_seconds": s.hold_ttl_secs,
            "ready": s.ready(),
            "invariant_holds": s.invariant_holds,
            "categories": categories_json(&s.categories, true),
            "waves": s.waves.iter().map(waves::wave_json).collect::<Vec<_>>(),
            "next_wave_at": s.next_wave_at_ms().map(|at| at.div_ceil(1000)),
            "next_wave_at_ms": s.next_wave_at_ms(),
            "next_wave_qty": s.next_wave_qty(),
            "pending_waves": s.pending_waves(),
            "shards": s.shards,
            "in_transit": s.in_transit,
            "shard_states": s.shard_states.iter().map(|x| json!({
                "id": x.id.as_str(),
                "total": x.total,
                "available": x.available,
                "held": x.held,
                "confirmed": x.confirmed,
                "in_transit": x.sending,
            })).collect::<Vec<_>>(),
        }),
        None => json!({
            "event": id,
            "room": state.events().room_of(id),
            "ready": false,
            "invariant_holds": false,
        }),
    };
    // Not ready: say whether the store had the event and lost it (its load
    // marker survives), so the operator knows a load is a reload.
    if v.get("ready") != Some(&Value::Bool(true))
        && let Some(lost) = state
            .inventory()
            .loaded_version(&event)
            .await
            .map_err(store_err)?
    {
        v["lost"] = json!(true);
        v["lost_version"] = json!(lost);
    }
    // The ledger's lag on the event's stream, as last read (with Redis).
    if let Some((lag, behind)) = state.ledger().lag_of(id) {
        v["ledger"] = json!({
            "lag_entries": lag.entries,
            "lag_seconds": lag.seconds,
            "read": lag.grouped,
            "behind": behind,
        });
    }
    if let Some(d) = state.ledger().drift_of(id)
        && let Some(l) = v.get_mut("ledger").and_then(Value::as_object_mut)
    {
        l.insert("drift_units".into(), json!(d.units));
        l.insert("category_drift".into(), json!(d.categories));
    }
    Ok(v)
}

async fn admin_get_event(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let event = public_event(&id).ok_or_else(event_not_found)?;
    if state.events().room_of(&id).is_none()
        && state
            .inventory()
            .read(&event)
            .await
            .map_err(store_err)?
            .is_none()
    {
        return Err(event_not_found());
    }
    Ok(axum::Json(event_admin_json(&state, &id).await?).into_response())
}

async fn admin_put_event(
    State(state): State<AppState>,
    Path(id): Path<String>,
    client: Option<axum::Extension<crate::edge::client_ip::ClientInfo>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let event = public_event(&id)
        .ok_or_else(|| Problem::invalid_setting("event", "must match [A-Za-z0-9_-]{1,64}"))?;
    let obj = body
        .as_object()
        .ok_or_else(|| Problem::invalid_setting("body", "must be a JSON object"))?;
    for k in obj.keys() {
        if !matches!(
            k.as_str(),
            "total"
                | "cart_limit"
                | "hold_ttl_seconds"
                | "version"
                | "room"
                | "categories"
                | "shards"
        ) {
            return Err(Problem::invalid_setting(k, "unknown field"));
        }
    }
    let int = |k: &str| -> Result<u64, Problem> {
        obj.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| Problem::invalid_setting(k, "must be a whole number ≥ 0"))
    };
    let categories = match obj.get("categories") {
        None => Vec::new(),
        Some(v) => parse_categories(v)?,
    };
    let total = if categories.is_empty() {
        int("total")?
    } else {
        let sum = categories
            .iter()
            .fold(0u64, |a, c| a.saturating_add(c.total));
        if obj.get("total").is_some() && int("total")? != sum {
            return Err(Problem::invalid_setting(
                "total",
                "must equal the sum of the categories' totals (or be left out)",
            ));
        }
        sum
    };
    let cart_limit = u32::try_from(int("cart_limit")?)
        .ok()
        .filter(|c| *c >= 1)
        .ok_or_else(|| Problem::invalid_setting("cart_limit", "must be at least 1"))?;
    let ttl = int("hold_ttl_seconds")?;
    if ttl == 0 || ttl > 86_400 {
        return Err(Problem::invalid_setting(
            "hold_ttl_seconds",
            "must be from 1 to 86400",
        ));
    }
    let version = int("version")?;
    // Split into shards (1: plain); left out, the event keeps its layout.
    let shards = match obj.get("shards") {
        None => None,
        Some(_) => Some(
            u32::try_from(int("shards")?)
                .ok()
                .filter(|n| (1..=sluice_reservation::types::MAX_SHARDS).contains(n))
                .ok_or_else(|| Problem::invalid_setting("shards", "must be from 1 to 64"))?,
        ),
    };
    if shards.is_some_and(|n| n > 1) && !categories.is_empty() {
        return Err(Problem::invalid_setting(
            "shards",
            "an event with categories cannot be sharded",
        ));
    }
    let room = match obj.get("room") {
        // An existing event keeps its room; a new one is sold by `default`.
        None => match state.events().room_of(&id) {
            Some(r) => r,
            None => state
                .inventory()
                .read(&event)
                .await
                .map_err(store_err)?
                .map(|s| s.room)
                .unwrap_or_else(|| "default".to_owned()),
        },
        Some(v) => v
            .as_str()
            .filter(|r| state.rooms().get(r).is_some())
            .map(str::to_owned)
            .ok_or_else(|| Problem::invalid_setting("room", "no such room"))?,
    };
    let before = event_admin_json(&state, &id).await?;
    let spec = StockSpec {
        total,
        cart_limit,
        hold_ttl: std::time::Duration::from_secs(ttl),
        version,
        room: room.clone(),
    };
    let outcome = match shards {
        Some(n) => state.inventory().set_sharded_stock(&event, &spec, n).await,
        None => {
            state
                .inventory()
                .set_stock_with_categories(&event, &spec, &categories)
                .await
        }
    }
    .map_err(store_err)?;
    let mut lost_version = None;
    let status = match outcome {
        SetStockOutcome::Created { .. } => StatusCode::CREATED,
        // The operator's load of an event the store had lost: it goes on
        // sale again with this total (nothing of the lost generation
        // counts), which the answer and the log say.
        SetStockOutcome::Recreated {
            lost_version: v, ..
        } => {
            lost_version = Some(v);
            StatusCode::CREATED
        }
        SetStockOutcome::Updated { .. } => StatusCode::OK,
        SetStockOutcome::Stale { current_version } => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "stale_version",
                "A stock sync with this version or a newer one was already applied",
            )
            .with("current_version", current_version));
        }
        SetStockOutcome::BelowCommitted { held, confirmed } => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "below_committed",
                "The new total is below what visitors already hold or bought",
            )
            .with("held", held)
            .with("confirmed", confirmed));
        }
        SetStockOutcome::CategoryBelowCommitted {
            category,
            held,
            confirmed,
        } => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "category_below_committed",
                "A category's new total is below what visitors already hold or bought in it",
            )
            .with("category", category)
            .with("held", held)
            .with("confirmed", confirmed));
        }
        SetStockOutcome::ShardsBusy { held, confirmed } => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "shards_busy",
                "The shard count can change only while nothing is held or sold",
            )
            .with("held", held)
            .with("confirmed", confirmed));
        }
        SetStockOutcome::Invalid { reason } => {
            return Err(Problem::invalid_setting("body", reason));
        }
    };
    let state_now = state.inventory().read(&event).await.map_err(store_err)?;
    state.events().upsert(&id, &room, state_now);
    let mut after = event_admin_json(&state, &id).await?;
    // Who (a fingerprint of the token, the client address), what, before, after.
    let who = crate::admin::dashboard::audit_who(&headers, client.as_ref().map(|c| &c.0));
    if let Some(v) = lost_version {
        after["lost"] = json!(true);
        after["lost_version"] = json!(v);
        tracing::warn!(target: "audit", who = %who, event = %id, change = %body, lost_version = v, after = %after,
            "event stock loaded by the operator after the store had lost the event: \
             nothing sold or held before the loss is counted; the new total must account for it");
    } else {
        tracing::info!(target: "audit", who = %who, event = %id, change = %body, before = %before, after = %after, "event stock set");
    }
    Ok((status, axum::Json(after)).into_response())
}

/// Parses a `PUT`'s `categories`: a list of `{"id", "total",
/// "cart_limit"?}` (at most 64, no id twice); `[]` means none.
fn parse_categories(v: &Value) -> Result<Vec<CategorySpec>, Problem> {
    let bad = |reason: &str| Problem::invalid_setting("categories", reason.to_owned());
    let list = v
        .as_array()
        .ok_or_else(|| bad("must be a list of {id, total, cart_limit?}"))?;
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let obj = c
            .as_object()
            .ok_or_else(|| bad("each category must be an object"))?;
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "id" | "total" | "cart_limit"))
        {
            return Err(bad(&format!("unknown field {k}")));
        }
        let id = obj
            .get("id")
            .and_then(Value::as_str)
            .and_then(CategoryId::parse)
            .ok_or_else(|| bad("id must match [A-Za-z0-9_-]{1,32}"))?;
        let total = obj
            .get("total")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("total must be a whole number ≥ 0"))?;
        let cart_limit = match obj.get("cart_limit") {
            None | Some(Value::Null) => None,
            Some(l) => Some(
                l.as_u64()
                    .and_then(|l| u32::try_from(l).ok())
                    .filter(|l| *l >= 1)
                    .ok_or_else(|| bad("cart_limit must be at least 1"))?,
            ),
        };
        out.push(CategorySpec {
            id,
            total,
            cart_limit,
        });
    }
    if let Some(reason) = sluice_reservation::types::categories_problem(&out) {
        return Err(bad(reason));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A hold is written as the `json!` map it replaced wrote it, byte for
    /// byte: the same keys in the same order, `items` only when there are
    /// some, and a shard's hold named by its event.
    #[test]
    fn a_hold_is_written_as_before() {
        let event = EventId::parse("hot").unwrap();
        let shard = event.shard(3);
        for (on, items) in [
            (&event, vec![]),
            (
                &shard,
                vec![
                    Item {
                        category: CategoryId::parse("floor").unwrap(),
                        qty: 2,
                    },
                    Item {
                        category: CategoryId::parse("tier-1").unwrap(),
                        qty: 1,
                    },
                ],
            ),
        ] {
            let h = HoldView {
                hold_id: HoldId::generate(on),
                event: on.clone(),
                qty: 3,
                status: sluice_reservation::HoldStatus::Held,
                expires_at: 1_765_000_123,
                expires_at_ms: 1_765_000_123_456,
                available: 9_007_199_254_740_991,
                visitor: "v".into(),
                items: items.clone(),
            };
            let mut before = json!({
                "hold_id": h.hold_id.as_str(),
                "event": "hot",
                "qty": 3,
                "status": "held",
                "expires_at": 1_765_000_123_u64,
                "available": 9_007_199_254_740_991_u64,
            });
            if !items.is_empty() {
                before["items"] = items
                    .iter()
                    .map(|i| json!({"category": i.category.as_str(), "qty": i.qty}))
                    .collect();
            }
            assert_eq!(
                serde_json::to_string(&hold_json(&h)).unwrap(),
                serde_json::to_string(&before).unwrap()
            );
        }
    }

    #[test]
    fn webhook_signatures() {
        let body = br#"{"payment_event_id":"p1"}"#;
        let h = sign_webhook(b"s3cret", 1_000, body);
        assert!(verify_signature(b"s3cret", &h, body, 1_000).is_ok());
        assert!(verify_signature(b"s3cret", &h, body, 1_000 + 299).is_ok());
        assert!(verify_signature(b"s3cret", &h, body, 1_000 + 301).is_err());
        assert!(verify_signature(b"other", &h, body, 1_000).is_err());
        assert!(verify_signature(b"s3cret", &h, b"{}", 1_000).is_err());
        assert!(verify_signature(b"s3cret", "t=1000", body, 1_000).is_err());
        assert!(verify_signature(b"s3cret", "garbage", body, 1_000).is_err());
        assert!(verify_signature(b"s3cret", "t=1000,v1=zz", body, 1_000).is_err());
    }

    fn hex_of(sig: &str) -> &str {
        sig.split_once(",v1=").unwrap().1
    }

    #[test]
    fn any_of_several_v1_values_may_match() {
        let body = br#"{"payment_event_id":"p1"}"#;
        let good = sign_webhook(b"s3cret", 1_000, body);
        let v1 = hex_of(&good);
        let wrong = "00".repeat(32);
        // The matching value first, last, or among non-hex and short ones.
        for h in [
            format!("t=1000,v1={v1},v1={wrong}"),
            format!("t=1000,v1={wrong},v1={v1}"),
            format!("t=1000, v1=zz, v1=0, v1={wrong}, v1={v1}"),
        ] {
            assert_eq!(verify_signature(b"s3cret", &h, body, 1_000), Ok(()), "{h}");
        }
        let none = format!("t=1000,v1={wrong},v1={}", "11".repeat(32));
        assert_eq!(
            verify_signature(b"s3cret", &none, body, 1_000),
            Err("signature mismatch")
        );
        // A prefix or an extension of the right tag is not the tag.
        for h in [
            format!("t=1000,v1={}", &v1[..62]),
            format!("t=1000,v1={v1}00"),
        ] {
            assert!(verify_signature(b"s3cret", &h, body, 1_000).is_err(), "{h}");
        }
    }

    #[test]
    fn the_number_of_v1_values_and_the_header_length_are_capped() {
        let body = br#"{"payment_event_id":"p1"}"#;
        let good = sign_webhook(b"s3cret", 1_000, body);
        let v1 = hex_of(&good);
        let wrong = format!("v1={}", "00".repeat(32));
        // Eight values, the right one last: accepted, within the length.
        let eight = format!("t=1000,{},v1={v1}", [wrong.as_str(); 7].join(","));
        assert!(eight.len() <= MAX_SIGNATURE_HEADER);
        assert_eq!(verify_signature(b"s3cret", &eight, body, 1_000), Ok(()));
        // Nine, even with the right one first: refused.
        let nine = format!("t=1000,v1={v1},{}", [wrong.as_str(); 8].join(","));
        assert!(nine.len() <= MAX_SIGNATURE_HEADER);
        assert_eq!(
            verify_signature(b"s3cret", &nine, body, 1_000),
            Err("too many v1 signatures")
        );
        // Short values do not get round the count.
        let many_short = format!("t=1000,v1={v1},{}", ["v1=0"; 20].join(","));
        assert!(many_short.len() <= MAX_SIGNATURE_HEADER);
        assert_eq!(
            verify_signature(b"s3cret", &many_short, body, 1_000),
            Err("too many v1 signatures")
        );
        // Over the length, whatever it holds (padding the parser skips).
        let long = format!("{good},{}", "x".repeat(MAX_SIGNATURE_HEADER));
        assert_eq!(
            verify_signature(b"s3cret", &long, body, 1_000),
            Err("signature header too long")
        );
    }

    /// The HMAC over `t.body` with `t` exactly as given (for forms
    /// `sign_webhook` would never print).
    fn sign_raw(secret: &[u8], t: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(t.as_bytes());
        mac.update(b".");
        mac.update(body);
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("t={t},v1={hex}")
    }

    #[test]
    fn webhook_timestamp_is_hashed_as_sent() {
        let body = br#"{"payment_event_id":"p1"}"#;
        let good = sign_webhook(b"s3cret", 1_000, body);
        let v1 = good.split_once(",v1=").unwrap().1;
        // The signature of "1000" presented under other spellings of 1000:
        // before, `t` was parsed and re-printed, so these passed.
        for t in ["+1000", "01000", "0001000"] {
            let forged = format!("t={t},v1={v1}");
            assert!(
                verify_signature(b"s3cret", &forged, body, 1_000).is_err(),
                "{forged} accepted"
            );
        }
        // Signed over the exact text: leading zeros are digits, accepted
        // (the HMAC covers what was sent); a sign is refused outright.
        let zero = sign_raw(b"s3cret", "01000", body);
        assert_eq!(verify_signature(b"s3cret", &zero, body, 1_000), Ok(()));
        for t in ["+1000", "-1000", " 1000", "1e3", "", "1_000", "１０００"] {
            let h = sign_raw(b"s3cret", t, body);
            assert_eq!(
                verify_signature(b"s3cret", &h, body, 1_000),
                Err("timestamp must be 1 to 20 ASCII digits"),
                "{t:?}"
            );
        }
        // Digits beyond u64: refused, not wrapped.
        let huge = sign_raw(b"s3cret", "99999999999999999999", body);
        assert!(verify_signature(b"s3cret", &huge, body, 1_000).is_err());
    }
}
