//! Scheduled waves over HTTP: `GET` and `PUT /_sluice/admin/events/{event}/waves`,
//! the wave fields of the event and status answers, and the parsing of a
//! wave's `at` shared with `[[events.waves]]`.
//!
//! A schedule is the event's pending waves, replaced whole by a `PUT` in
//! one atomic store step ([`Inventory::schedule_waves`]); a wave is
//! released by the store, lazily, by whatever operation meets it due
//! first (see `sluice-reservation`'s docs), never by a timer here.
//!
//! - `PUT` body: `{"waves": [{"at", "qty", "category"?}]}` (an empty list
//!   clears the schedule), `at` as RFC 3339 text or Unix milliseconds. 200
//!   with the schedule as stored; 422 `wave_in_past` (a wave at or before
//!   the store's clock, with `at`), 404 `category_not_found` (with
//!   `category`), 404 `event_not_found`, 422 `invalid_setting` (a `qty`
//!   of 0, a malformed `at`, more than 1000 waves, a wave without a
//!   category on an event with categories, the total above 2^53), 503
//!   `inventory_not_ready`. Nothing is partially applied.
//! - The JSON of a wave: `at` (RFC 3339, UTC), `at_ms`, `qty`, and
//!   `category` when it has one.
//! - Event views add `next_wave_at` (Unix seconds, rounded up: the wave is
//!   open from then), `next_wave_at_ms`, `next_wave_qty` and
//!   `pending_waves` while a wave is pending, and the admin view the whole
//!   schedule (`waves`).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use sluice_reservation::{CategoryId, EventId, EventState, Inventory, ScheduleOutcome, Wave};

use crate::app::extract::JsonBody;
use crate::app::problem::Problem;
use crate::app::state::AppState;

use super::{category_not_found, event_not_found, known_event, not_ready, store_err};

/// A wave's `at`: RFC 3339 text, or Unix milliseconds as a number.
pub fn parse_at(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| "must be Unix milliseconds (a whole number) or RFC 3339 text".into()),
        Value::String(s) => crate::gate::schedule::parse_rfc3339_ms(s),
        _ => Err("must be Unix milliseconds (a whole number) or RFC 3339 text".into()),
    }
}

/// Unix ms as RFC 3339 (UTC).
fn rfc3339(ms: u64) -> String {
    crate::gate::schedule::format_rfc3339(ms)
}

/// One wave as the API shows it.
pub fn wave_json(w: &Wave) -> Value {
    let mut v = json!({
        "at": rfc3339(w.at_ms),
        "at_ms": w.at_ms,
        "qty": w.qty,
    });
    if let Some(c) = &w.category {
        v["category"] = json!(c.as_str());
    }
    v
}

/// The next-wave fields of an event view (nothing when none is pending).
pub fn add_next_wave(v: &mut Value, s: &EventState) {
    if let Some(at) = s.next_wave_at_ms() {
        v["next_wave_at"] = json!(at.div_ceil(1000));
        v["next_wave_at_ms"] = json!(at);
        v["next_wave_qty"] = json!(s.next_wave_qty());
        v["pending_waves"] = json!(s.pending_waves());
    }
}

/// The next wave adding to `category` (any, for `None`).
pub fn next_wave_for(s: &EventState, category: Option<&str>) -> Option<u64> {
    s.waves
        .iter()
        .find(|w| category.is_none_or(|c| w.category.as_ref().is_some_and(|wc| wc.as_str() == c)))
        .map(|w| w.at_ms)
}

/// A `sold_out` refusal of an event with a wave pending carries
/// `next_wave_at` (Unix seconds), `next_wave_at_ms` and `Retry-After`
/// (seconds until then, at least 1). The store is read again only when
/// the cached view says waves are pending, so events without waves cost
/// nothing more.
pub async fn sold_out_with_wave(
    state: &AppState,
    event: &EventId,
    category: Option<&str>,
    p: Problem,
) -> Problem {
    let pending = state
        .events()
        .cached(event.as_str())
        .is_some_and(|s| !s.waves.is_empty());
    if !pending {
        return p;
    }
    let Ok(Some(s)) = state.inventory().read(event).await else {
        return p;
    };
    let Some(at) = next_wave_for(&s, category) else {
        return p;
    };
    let now = crate::app::clock::now_ms();
    p.with("next_wave_at", at.div_ceil(1000))
        .with("next_wave_at_ms", at)
        .retry_after(at.saturating_sub(now).div_ceil(1000).max(1))
}

/// Parses a `PUT` body's `waves`.
fn parse_body(body: &Value) -> Result<Vec<Wave>, Problem> {
    let obj = body
        .as_object()
        .ok_or_else(|| Problem::invalid_setting("body", "must be a JSON object"))?;
    if let Some(k) = obj.keys().find(|k| k.as_str() != "waves") {
        return Err(Problem::invalid_setting(k, "unknown field"));
    }
    let list = obj.get("waves").and_then(Value::as_array).ok_or_else(|| {
        Problem::invalid_setting("waves", "must be a list of {at, qty, category?}")
    })?;
    if list.len() > sluice_reservation::types::MAX_WAVES {
        return Err(Problem::invalid_setting("waves", "at most 1000 waves"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, w) in list.iter().enumerate() {
        let field = |f: &str| format!("waves[{i}].{f}");
        let o = w
            .as_object()
            .ok_or_else(|| Problem::invalid_setting(&format!("waves[{i}]"), "must be an object"))?;
        if let Some(k) = o
            .keys()
            .find(|k| !matches!(k.as_str(), "at" | "qty" | "category"))
        {
            return Err(Problem::invalid_setting(&field(k), "unknown field"));
        }
        let at_ms = parse_at(o.get("at").unwrap_or(&Value::Null))
            .map_err(|e| Problem::invalid_setting(&field("at"), e))?;
        let qty = o
            .get("qty")
            .and_then(Value::as_u64)
            .filter(|q| *q >= 1)
            .ok_or_else(|| Problem::invalid_setting(&field("qty"), "must be a whole number ≥ 1"))?;
        let category = match o.get("category") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => {
                Some(CategoryId::parse(c).ok_or_else(|| category_not_found(c))?)
            }
            Some(_) => {
                return Err(Problem::invalid_setting(
                    &field("category"),
                    "must be a string",
                ));
            }
        };
        out.push(Wave {
            at_ms,
            qty,
            category,
        });
    }
    Ok(out)
}

/// `GET /_sluice/admin/events/{event}/waves`: the pending schedule.
pub async fn admin_get_waves(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let event = super::public_event(&id).ok_or_else(event_not_found)?;
    let s = state.inventory().read(&event).await.map_err(store_err)?;
    let Some(s) = s else {
        return Err(if state.events().room_of(&id).is_some() {
            not_ready()
        } else {
            event_not_found()
        });
    };
    let mut v = json!({
        "event": id,
        "waves": s.waves.iter().map(wave_json).collect::<Vec<_>>(),
    });
    add_next_wave(&mut v, &s);
    Ok(axum::Json(v).into_response())
}

/// `PUT /_sluice/admin/events/{event}/waves`: replaces the schedule.
pub async fn admin_put_waves(
    State(state): State<AppState>,
    Path(id): Path<String>,
    client: Option<axum::Extension<crate::edge::client_ip::ClientInfo>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let (event, _) = known_event(&state, &id).await?;
    let waves = parse_body(&body)?;
    let outcome = state
        .inventory()
        .schedule_waves(&event, &waves)
        .await
        .map_err(store_err)?;
    let waves = match outcome {
        ScheduleOutcome::Scheduled { waves } => waves,
        ScheduleOutcome::NotReady => return Err(not_ready()),
        ScheduleOutcome::WaveInPast { at_ms, now_ms } => {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "wave_in_past",
                "A wave must open after now (the store's clock)",
            )
            .with("at", rfc3339(at_ms))
            .with("at_ms", at_ms)
            .with("now_ms", now_ms));
        }
        ScheduleOutcome::CategoryNotFound { category } => {
            return Err(category_not_found(&category));
        }
        ScheduleOutcome::Invalid { reason } => {
            return Err(Problem::invalid_setting("waves", reason));
        }
    };
    let who = crate::admin::dashboard::audit_who(&headers, client.as_deref());
    tracing::warn!(target: "audit", who, event = %id, waves = waves.len(), "wave schedule replaced");
    // Refresh the cached view now, so the room's sold-out state follows
    // without waiting for the next tick.
    if let Ok(Some(s)) = state.inventory().read(&event).await {
        let room = s.room.clone();
        state.events().upsert(&id, &room, Some(s));
    }
    Ok(axum::Json(json!({
        "event": id,
        "waves": waves.iter().map(wave_json).collect::<Vec<_>>(),
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn at_is_rfc3339_or_unix_ms() {
        assert_eq!(
            parse_at(&json!(1_700_000_000_000u64)),
            Ok(1_700_000_000_000)
        );
        assert_eq!(
            parse_at(&json!("2023-11-14T22:13:20Z")),
            Ok(1_700_000_000_000)
        );
        for bad in [
            json!(-1),
            json!(1.5),
            json!("tomorrow"),
            json!(null),
            json!([]),
        ] {
            assert!(parse_at(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bodies_refused_before_the_store() {
        for (body, code) in [
            (json!([]), "invalid_setting"),
            (json!({"waves": 3}), "invalid_setting"),
            (json!({"waves": [], "x": 1}), "invalid_setting"),
            (json!({"waves": [{"at": 1, "qty": 0}]}), "invalid_setting"),
            (
                json!({"waves": [{"at": "soon", "qty": 1}]}),
                "invalid_setting",
            ),
            (
                json!({"waves": [{"at": 1, "qty": 1, "extra": 1}]}),
                "invalid_setting",
            ),
            (
                json!({"waves": [{"at": 1, "qty": 1, "category": "a:b"}]}),
                "category_not_found",
            ),
            (
                json!({"waves": [{"at": 1, "qty": 1, "category": 7}]}),
                "invalid_setting",
            ),
        ] {
            assert_eq!(parse_body(&body).unwrap_err().code(), code, "{body}");
        }
        let w = parse_body(&json!({"waves": [{"at": 5, "qty": 2, "category": "vip"}]})).unwrap();
        assert_eq!(w[0].qty, 2);
        assert_eq!(w[0].category.as_ref().unwrap().as_str(), "vip");
    }
}
