//! The admin API of invite codes (README, "Invite codes"):
//!
//! - `POST /_sluice/admin/rooms/{room}/invites` issues `count` codes
//!   (1..=1000, default 1) of `uses` uses each (default 1), optionally
//!   expiring after `expires_in_seconds` and labelled `label`: 201 with
//!   each code **once** (only its hash is stored) and its id.
//! - `GET …/invites` lists them (id, label, uses, used, revoked, created,
//!   expiry; never a code); `GET …/invites/{id}` adds the redemptions,
//!   latest first.
//! - `DELETE …/invites/{id}` revokes one (final; 200 with its view).
//!
//! Codes may be issued for any room (ready before the room turns
//! `invite_only`); a room that is not invite-only ignores them.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};
use sluice_admission::invites::{InviteSpec, MAX_USES, code_hash, new_code, valid_invite_id};

use crate::app::clock::now_ms;
use crate::app::extract::JsonBody;
use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;

/// Most codes one request issues.
pub const MAX_ISSUE: u64 = 1000;

fn invite_not_found() -> Problem {
    Problem::new(StatusCode::NOT_FOUND, "invite_not_found", "No such invite")
}

fn store_err(e: sluice_admission::AdmissionError) -> Problem {
    Problem::store_unavailable().log_cause(&e)
}

/// The issue request's settings, checked: count and spec.
fn issue_settings(body: &Value) -> Result<(u64, InviteSpec), Problem> {
    let obj = body
        .as_object()
        .ok_or_else(|| Problem::malformed("the body must be a JSON object"))?;
    for k in obj.keys() {
        if !["count", "uses", "expires_in_seconds", "label"].contains(&k.as_str()) {
            return Err(Problem::invalid_setting(k, "unknown field"));
        }
    }
    let int = |k: &str, default: u64, max: u64| -> Result<u64, Problem> {
        match obj.get(k) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| Problem::invalid_setting(k, format!("an integer in 1..={max}"))),
        }
    };
    let count = int("count", 1, MAX_ISSUE)?;
    let uses = int("uses", 1, u64::from(MAX_USES))?;
    let expires_at_ms = match obj.get("expires_in_seconds") {
        None | Some(Value::Null) => None,
        Some(_) => Some(now_ms() + int("expires_in_seconds", 0, 366 * 86_400)? * 1000),
    };
    let label = match obj.get("label") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) if s.chars().count() <= 200 && !s.chars().any(char::is_control) => {
            s.clone()
        }
        Some(_) => {
            return Err(Problem::invalid_setting(
                "label",
                "a string of at most 200 characters, no control characters",
            ));
        }
    };
    Ok((
        count,
        InviteSpec {
            uses: u32::try_from(uses).unwrap_or(MAX_USES),
            expires_at_ms,
            label,
        },
    ))
}

/// `POST /_sluice/admin/rooms/{room}/invites`.
pub(crate) async fn issue(
    State(state): State<AppState>,
    Path(room): Path<String>,
    client: Option<axum::Extension<ClientInfo>>,
    headers: http::HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    let (count, spec) = issue_settings(&body)?;
    let now = now_ms();
    let mut out = Vec::new();
    for _ in 0..count {
        let code = new_code();
        let hash = code_hash(&code);
        // a hash already present cannot happen with 128 random bits; draw
        // again rather than hand out a code that does not work
        let Some(view) = state
            .invites()
            .issue(room.id(), &hash, &spec, now)
            .await
            .map_err(store_err)?
        else {
            continue;
        };
        let mut v = serde_json::to_value(&view).unwrap_or(Value::Null);
        v["code"] = json!(code);
        out.push(v);
    }
    let who = crate::admin::dashboard::audit_who(&headers, client.as_ref().map(|c| &c.0));
    tracing::info!(target: "audit", who = %who, room = %room.id(), count = out.len(),
        uses = spec.uses, label = %spec.label, "invites issued");
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({
            "room": room.id(),
            "invite_only": room.config.invite_only,
            "invites": out,
        })),
    )
        .into_response())
}

/// `GET /_sluice/admin/rooms/{room}/invites`.
pub(crate) async fn list(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    let invites = state.invites().list(room.id()).await.map_err(store_err)?;
    let redeemed: u64 = invites.iter().map(|i| u64::from(i.used)).sum();
    Ok(axum::Json(json!({
        "room": room.id(),
        "invite_only": room.config.invite_only,
        "issued": invites.len(),
        "redeemed": redeemed,
        "revoked": invites.iter().filter(|i| i.revoked).count(),
        "invites": invites,
    }))
    .into_response())
}

/// `GET /_sluice/admin/rooms/{room}/invites/{id}`.
pub(crate) async fn get_one(
    State(state): State<AppState>,
    Path((room, id)): Path<(String, String)>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    if !valid_invite_id(&id) {
        return Err(invite_not_found());
    }
    let view = state
        .invites()
        .get(room.id(), &id)
        .await
        .map_err(store_err)?
        .ok_or_else(invite_not_found)?;
    Ok(axum::Json(view).into_response())
}

/// `DELETE /_sluice/admin/rooms/{room}/invites/{id}`.
pub(crate) async fn revoke(
    State(state): State<AppState>,
    Path((room, id)): Path<(String, String)>,
    client: Option<axum::Extension<ClientInfo>>,
    headers: http::HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let room = state.room(&room)?;
    if !valid_invite_id(&id)
        || !state
            .invites()
            .revoke(room.id(), &id)
            .await
            .map_err(store_err)?
    {
        return Err(invite_not_found());
    }
    let who = crate::admin::dashboard::audit_who(&headers, client.as_ref().map(|c| &c.0));
    tracing::info!(target: "audit", who = %who, room = %room.id(), invite = %id, "invite revoked");
    let view = state
        .invites()
        .get(room.id(), &id)
        .await
        .map_err(store_err)?
        .ok_or_else(invite_not_found)?;
    Ok(axum::Json(view).into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use sluice_admission::invites::invite_id;

    #[test]
    fn issue_settings_are_checked() {
        let (n, s) = issue_settings(&json!({})).unwrap();
        assert_eq!(
            (n, s.uses, s.expires_at_ms, s.label.as_str()),
            (1, 1, None, "")
        );
        let (n, s) = issue_settings(
            &json!({"count": 5, "uses": 3, "expires_in_seconds": 60, "label": "press"}),
        )
        .unwrap();
        assert_eq!((n, s.uses, s.label.as_str()), (5, 3, "press"));
        assert!(s.expires_at_ms.unwrap() > now_ms());
        for bad in [
            json!({"count": 0}),
            json!({"count": 1001}),
            json!({"uses": 0}),
            json!({"uses": -1}),
            json!({"uses": "2"}),
            json!({"expires_in_seconds": 0}),
            json!({"label": "x".repeat(201)}),
            json!({"label": "a\nb"}),
            json!({"colour": "red"}),
            json!([1]),
        ] {
            assert!(issue_settings(&bad).is_err(), "{bad}");
        }
        assert_eq!(invite_id(&"ab".repeat(32)), "abababababab");
    }
}
