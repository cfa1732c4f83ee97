//! The admission gate in front of the proxy, in the shape of tower-http's
//! async authorization: a request with a valid admission token for the room
//! that guards it passes on (with the token forwarded upstream as
//! `Sluice-Admission`); any other gets the waiting room at once.
//!
//! Order of checks for a request outside `/_sluice/` (already in its
//! canonical form: [`crate::edge::canonical`], applied by the server before any
//! decision):
//! 1. the room guarding its host and path (most specific wins); none → pass;
//! 2. bypass rules (paths such as `/robots.txt`, allow-listed ranges) → pass;
//! 3. a valid admission token (cookie `sluice_a_{room}` or bearer) whose
//!    session is not in the room's ended set → pass, the token renewed past
//!    half its life while its session lives in the store;
//! 4. passthrough: nobody waits and credit remains → the store admits a new
//!    place on the spot, or hands out nothing (never a place in line: those
//!    are bought with proof of work); limited per network and by the
//!    snapshot's credit;
//! 5. otherwise the waiting room: the page for browsers, 503
//!    `waiting_room_active` for other clients.
//!
//! After the origin answered: `Sluice-Command: revoke` ends the session at
//! once (its slot goes back under `max_active`; every gateway refuses its
//! tokens within a tick), clears both cookies and spends the place.

pub mod adaptive;
pub mod cookies;
pub mod rooms;
pub mod schedule;
pub mod session;
pub mod window;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use sluice_admission::{AdmitClaims, QueueStore, new_visitor_id};

use crate::app::clock::now_s;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;

use crate::app::problem::Problem;
use crate::gate::rooms::Room;
use crate::proxy::OriginCommand;
use crate::visitor;
use crate::visitor::page;

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
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .map(host_name);
    // The canonical path ([`crate::edge::canonical`]: the edge rewrote the target
    // before any decision), read as an origin that decodes `%2F` would.
    let path = req
        .extensions()
        .get::<RoutePath>()
        .map_or_else(|| req.uri().path(), |r| r.0.as_str());
    state
        .rooms()
        .route(host, path)
        .filter(|room| !rooms::bypasses(room, path, ip))
}

/// The route path of a request whose target holds an encoded slash
/// (`%2F`, passed through by a room that opted in): rules are matched on
/// it, where `%2F` is a `/`. Any other request routes on its own path.
#[derive(Clone, Debug)]
pub struct RoutePath(pub String);

/// The name of a canonical `Host` value (`name[:port]`, IPv6 in brackets).
pub fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or(host, |end| &host[..end + 2]),
        None => host.split(':').next().unwrap_or(host),
    }
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

    let admission = session::admission_from(&state, req.headers(), &room, &client);
    // A revoked session is refused by every gateway within a tick of the
    // revoke (the room's ended set), whatever its token still says.
    let revoked = match &admission {
        Some((_, c)) => session::revoked(&state, &room, c).await,
        None => false,
    };
    if let Some((token, claims)) = admission.filter(|_| !revoked) {
        return admitted(&state, &room, req, &client, &token, &claims).await;
    }

    let snap = room.snapshot();
    if !room.store_ok() {
        if rooms::fail_open(&room) && !revoked {
            let started = std::time::Instant::now();
            let res = state.proxy().forward(req, &client, HeaderMap::new()).await;
            room.observe_upstream(started.elapsed(), res.status());
            return res;
        }
        return waiting(&state, &room, req.headers(), revoked, &ret);
    }
    // Passthrough: a request with no place at an idle room is admitted on
    // the spot, or gets the waiting room. It never gets a place in line
    // (that is bought with proof of work at the join endpoint): the store
    // admits it atomically or hands out nothing. Limited per network like
    // the join endpoint, and to the credit the last snapshot showed.
    let cap_free = snap
        .max_active
        .is_none_or(|m| snap.active_sessions + snap.pending_claims < m);
    let has_queue_cookie = cookies::token(req.headers(), &cookies::queue_name(room.id())).is_some();
    let idle = !has_queue_cookie
        && !revoked
        && snap.queue_length() == 0
        && snap.credit >= 1.0
        && !snap.paused
        && !snap.closed
        && !snap.prequeue_open
        && !state.sold_out(room.id())
        && cap_free;
    if idle
        && room
            .check_rate_limit(sluice_pow::network_prefix(client.ip))
            .is_ok()
        && room.take_passthrough()
    {
        match rooms::passthrough(&room, state.queue()).await {
            Ok(Some(o)) => {
                let sub = new_visitor_id();
                state
                    .start_session(&room, &sluice_admission::session_of(o.epoch, o.seq))
                    .await;
                match state.issue_admission(&room, &sub, Some(o.seq), o.epoch, &client) {
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
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(room = room.id(), error = %e, "passthrough failed");
            }
        }
    }
    waiting(&state, &room, req.headers(), revoked, &ret)
}

/// A request with a valid admission token for its room (not revoked): to
/// the origin, the token renewed past half its life while its session
/// lives, the session ended at once when the origin says `Sluice-Command:
/// revoke`.
async fn admitted(
    state: &AppState,
    room: &Arc<Room>,
    mut req: Request,
    client: &ClientInfo,
    token: &str,
    claims: &AdmitClaims,
) -> Response {
    // Sliding session: past half its life, the token is renewed, but only
    // for a session the store still has (a revoke through a gateway that
    // has not told this one yet, or a session that ended, is not renewed:
    // its token runs out). A store that lost the session (a new epoch: Redis
    // restarted empty) is told about it again.
    let ttl = room.settings().session_ttl;
    let now = now_s();
    let renewed = if now.saturating_sub(claims.iat) * 2 >= ttl.as_secs() {
        let live = match &claims.sid {
            Some(sid) => session::session_lives(state, room, claims, sid, ttl).await,
            None => true,
        };
        live.then(|| claims.renewed(now, ttl))
            .flatten()
            .and_then(|c| {
                let t = state.keyring().sign_admit(&c).ok()?;
                Some((t, c))
            })
    } else {
        None
    };
    let forwarded = renewed.as_ref().map(|(t, _)| t.as_str()).unwrap_or(token);
    req.extensions_mut()
        .insert(tunnel_bound(room, claims, renewed.as_ref().map(|(_, c)| c)));
    let started = std::time::Instant::now();
    let mut res = state
        .proxy()
        .forward(req, client, admission_header(forwarded))
        .await;
    room.observe_upstream(started.elapsed(), res.status());
    let revoke = res
        .extensions()
        .get::<OriginCommand>()
        .is_some_and(|c| c.0 == "revoke");
    if revoke {
        if let Some(sid) = &claims.sid {
            room.note_ended(sid);
            if let Err(e) = state.queue().session_end(room.id(), sid).await {
                tracing::warn!(room = room.id(), error = %e, "revoke: could not end the session in the store");
            }
        }
        // The place is spent: neither token admits again.
        cookies::clear(res.headers_mut(), &cookies::admit_name(room.id()));
        cookies::clear(res.headers_mut(), &cookies::queue_name(room.id()));
    } else if let Some((t, _)) = renewed {
        cookies::set_admission(res.headers_mut(), room, &t, client);
    }
    res
}

/// How long a WebSocket opened with this admission may stay open: until
/// its admission ends (the token's expiry, or a revoke of its session).
fn tunnel_bound(
    room: &Arc<Room>,
    claims: &AdmitClaims,
    renewed: Option<&AdmitClaims>,
) -> crate::proxy::TunnelBound {
    let exp = renewed.map_or(claims.exp, |c| c.exp);
    let room = room.clone();
    let sid = claims.sid.clone();
    crate::proxy::TunnelBound {
        expires_at_s: exp,
        ended: Arc::new(move || sid.as_deref().is_some_and(|s| room.is_ended(s))),
    }
}

/// The waiting room: the page for browsers, 503 `waiting_room_active` for
/// other clients. `revoked`: the request carried the tokens of a revoked
/// session, whose cookies are cleared.
fn waiting(
    state: &AppState,
    room: &Arc<Room>,
    headers: &HeaderMap,
    revoked: bool,
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
    if revoked {
        cookies::clear(res.headers_mut(), &cookies::admit_name(room.id()));
        cookies::clear(res.headers_mut(), &cookies::queue_name(room.id()));
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
