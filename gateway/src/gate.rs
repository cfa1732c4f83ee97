//! The admission gate in front of the proxy, in the shape of tower-http's
//! async authorization: a request with a valid admission token for the room
//! that guards it passes on (with the token forwarded upstream as
//! `Sluice-Admission`); any other gets the waiting room at once.
//!
//! Order of checks for a request outside `/_sluice/`:
//! 1. the room guarding its host and path (most specific wins); none → pass;
//! 2. bypass rules (paths such as `/robots.txt`, allow-listed ranges) → pass;
//! 3. a valid admission token (cookie `sluice_a_{room}` or bearer) → pass,
//!    renewing the token when half its life is gone (sliding session);
//! 4. passthrough: nobody waits and credit remains → a seq is taken and
//!    admitted on the spot, no page shown;
//! 5. otherwise the waiting room: the page for browsers, 503
//!    `waiting_room_active` for other clients.
//!
//! After the origin answered: `Sluice-Command: revoke` ends the session at
//! once (its slot goes back under `max_active`) and clears the cookie.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use sluice_admission::{QueueClaims, QueueStore, new_visitor_id};

use crate::app::{AppState, now_s};
use crate::client_ip::ClientInfo;
use crate::cookies;
use crate::page;
use crate::problem::Problem;
use crate::proxy::OriginCommand;
use crate::rooms::{self, Room};
use crate::visitor;

/// The room that guards a request: none when no room's paths cover it or
/// its room lets it by (bypass paths and ranges). Borrows, copies nothing.
pub fn guarding_room<'a, B>(
    state: &'a AppState,
    req: &http::Request<B>,
    ip: std::net::IpAddr,
) -> Option<&'a std::sync::Arc<Room>> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    let path = req.uri().path();
    state
        .rooms()
        .route(host, path)
        .filter(|room| !rooms::bypasses(room, path, ip))
}

/// Everything outside `/_sluice/`: the gate, then the origin.
pub async fn guarded(State(state): State<AppState>, req: Request) -> Response {
    let Some(client) = req.extensions().get::<ClientInfo>().cloned() else {
        return Problem::internal()
            .log_cause(&"request without client info")
            .into_response();
    };
    let Some(room) = guarding_room(&state, &req, client.ip).cloned() else {
        return state.proxy().forward(req, &client, HeaderMap::new()).await;
    };
    let ret = req
        .uri()
        .path_and_query()
        .map(|pq| visitor::safe_return_to(Some(pq.as_str())))
        .unwrap_or_else(|| "/".to_owned());

    if let Some((token, claims)) = visitor::admission_from(&state, req.headers(), &room, &client) {
        // Sliding session: past half its life, the token is renewed.
        let ttl = room.settings().session_ttl;
        let now = now_s();
        let renewed = if now.saturating_sub(claims.iat) * 2 >= ttl.as_secs() {
            claims.renewed(now, ttl).and_then(|c| {
                let t = state.keyring().sign_admit(&c).ok()?;
                Some((t, c))
            })
        } else {
            None
        };
        if let (Some(_), Some(sid)) = (&renewed, &claims.sid) {
            let store = state.queue().clone();
            let (room_id, sid) = (room.id().to_owned(), sid.clone());
            tokio::spawn(async move {
                let _ = store.session_touch(&room_id, &sid, ttl).await;
            });
        }
        let forwarded = renewed.as_ref().map(|(t, _)| t.as_str()).unwrap_or(&token);
        let started = std::time::Instant::now();
        let mut res = state
            .proxy()
            .forward(req, &client, admission_header(forwarded))
            .await;
        room.observe_upstream(started.elapsed(), res.status());
        let revoke = res
            .extensions()
            .get::<OriginCommand>()
            .is_some_and(|c| c.0 == "revoke");
        if revoke {
            if let Some(sid) = &claims.sid
                && let Err(e) = state.queue().session_end(room.id(), sid).await
            {
                tracing::warn!(room = room.id(), error = %e, "revoke: could not end the session");
            }
            cookies::clear(res.headers_mut(), &cookies::admit_name(room.id()));
        } else if let Some((t, _)) = renewed {
            cookies::set_admission(res.headers_mut(), &room, &t, &client);
        }
        return res;
    }

    let snap = room.snapshot();
    if !room.store_ok() {
        if rooms::fail_open(&room) {
            let started = std::time::Instant::now();
            let res = state.proxy().forward(req, &client, HeaderMap::new()).await;
            room.observe_upstream(started.elapsed(), res.status());
            return res;
        }
        return waiting(&state, &room, req.headers(), None, &client, &ret);
    }
    let cap_free = snap
        .max_active
        .is_none_or(|m| snap.active_sessions + snap.pending_claims < m);
    let has_queue_cookie = cookies::token(req.headers(), &cookies::queue_name(room.id())).is_some();
    if !has_queue_cookie
        && snap.queue_length() == 0
        && snap.credit >= 1.0
        && !snap.paused
        && !snap.closed
        && !snap.prequeue_open
        && cap_free
    {
        match rooms::join(&room, state.queue()).await {
            Ok(o) if o.admitted => {
                let _ = state.queue().claim(room.id(), o.seq).await;
                let sub = new_visitor_id();
                match state
                    .issue_admission(&room, &sub, Some(o.seq), o.epoch, &client)
                    .await
                {
                    Ok((token, _)) => {
                        let started = std::time::Instant::now();
                        let mut res = state
                            .proxy()
                            .forward(req, &client, admission_header(&token))
                            .await;
                        room.observe_upstream(started.elapsed(), res.status());
                        cookies::set_admission(res.headers_mut(), &room, &token, &client);
                        return res;
                    }
                    Err(p) => return p.into_response(),
                }
            }
            Ok(o) => {
                // Someone got there first: this visitor now has a place.
                let mut claims = QueueClaims::new(
                    room.id(),
                    &new_visitor_id(),
                    o.seq,
                    o.epoch,
                    now_s(),
                    room.config.queue_token_ttl,
                );
                claims.ret = Some(ret.clone());
                let token = state.keyring().sign_queue(&claims).ok();
                return waiting(
                    &state,
                    &room,
                    req.headers(),
                    token.as_deref(),
                    &client,
                    &ret,
                );
            }
            Err(e) => {
                tracing::warn!(room = room.id(), error = %e, "passthrough join failed");
            }
        }
    }
    waiting(&state, &room, req.headers(), None, &client, &ret)
}

/// The waiting room: the page for browsers, 503 `waiting_room_active` for
/// other clients. `queue_token`, when given, is set as the queue cookie.
fn waiting(
    state: &AppState,
    room: &Arc<Room>,
    headers: &HeaderMap,
    queue_token: Option<&str>,
    client: &ClientInfo,
    return_to: &str,
) -> Response {
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    state
        .telemetry()
        .waiting_served(room.id(), if wants_html { "page" } else { "json" });
    let mut res = if wants_html {
        let status = StatusCode::from_u16(room.config.waiting_status).unwrap_or(StatusCode::OK);
        let mut r = page::waiting_page(state, room, headers, return_to);
        *r.status_mut() = status;
        r
    } else {
        let snap = room.snapshot();
        let retry = if room.store_ok() { 5 } else { 2 };
        let mut p = Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting_room_active",
            "A waiting room is active: solve a challenge and join the queue",
        )
        .retry_after(retry);
        if let Some(obj) = visitor::waiting_json(room, &snap).as_object() {
            for (k, v) in obj {
                p = p.with(k, v.clone());
            }
        }
        p.into_response()
    };
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(t) = queue_token {
        cookies::set_queue(res.headers_mut(), room, t, client);
    }
    res
}

/// The gateway's own header to the origin: the visitor's admission token.
fn admission_header(token: &str) -> HeaderMap {
    let mut extra = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(token) {
        extra.insert("sluice-admission", v);
    }
    extra
}
