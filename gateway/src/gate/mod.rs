//! The admission gate in front of the proxy, in the shape of tower-http's
//! async authorization: [`authorize`] answers `Ok(request)` with the
//! verified [`Admission`] in its extensions, or `Err(response)` (the
//! waiting room). [`guarded`] then calls the proxy, from this one place,
//! with the admission token forwarded upstream as `Sluice-Admission`, and
//! hands the origin's answer to `after_origin`.
//!
//! Order of checks for a request outside `/_sluice/` (already in its
//! canonical form: [`crate::edge::canonical`], applied by the server before any
//! decision):
//! 1. the room guarding its host and path (most specific wins); none → pass;
//! 2. bypass rules (paths such as `/robots.txt`, allow-listed ranges) → pass;
//! 3. a valid admission token (cookie `sluice_a_{room}` or bearer) whose
//!    session is not in the room's ended set → pass, the token renewed past
//!    half its life while its session lives in the store;
//! 4. a verified crawler of the room ([`crawlers`]: Web Bot Auth or
//!    forward-confirmed reverse DNS, never its User-Agent) → pass, within
//!    its own rate limit (past it 429 `rate_limited`), nothing taken;
//! 5. passthrough: nobody waits and credit remains → the store admits a new
//!    place on the spot, or hands out nothing (never a place in line: those
//!    are bought with proof of work); limited per network and by the
//!    snapshot's credit;
//! 6. otherwise the waiting room: the page for browsers, 503
//!    `waiting_room_active` for other clients.
//!
//! After the origin answered: `Sluice-Command: revoke` ends the session at
//! once (its slot goes back under `max_active`; every gateway refuses its
//! tokens within a tick), clears both cookies and spends the place.
//!
//! Most guarded requests are an admitted visitor's, whose token the
//! connection showed before: `settled` decides those at the edge, with
//! checks 1 and 3 and no store call (`None` whenever a store call, a
//! renewal or the waiting room could follow, and [`authorize`] decides),
//! and the edge sends them on with `to_origin`, past the router.
//!
//! Forward-auth (`forward`, `GET /_sluice/auth`) runs the request a proxy
//! in front describes through the same [`authorize`] and answers with the
//! admission header and cookie the in-path mode would forward and set
//! (`admission_cookies`, shared with `after_origin`); there is no origin
//! answer, so no revoke.

pub mod adaptive;
pub mod cookies;
pub mod crawlers;
pub mod fetched;
pub(crate) mod forward;
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

/// The room the edge found guarding a request ([`guarding_room`]), carried
/// to [`authorize`] so the request is routed once.
#[derive(Clone)]
pub struct GuardedBy(pub Arc<Room>);

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

/// The gate's verdict on a request it lets through to the origin, put in
/// the request's extensions by [`authorize`] and read back, after the
/// origin answered, by [`after_origin`].
#[derive(Clone)]
pub struct Admission {
    room: Option<Arc<Room>>,
    grant: Grant,
}

/// Why a request may reach the origin.
#[derive(Clone)]
enum Grant {
    /// No room guards it (or its room lets it by): nothing to forward,
    /// nothing observed.
    Unguarded,
    /// The room's store is unreachable and the room fails open.
    FailOpen,
    /// Admitted on the spot at an idle room: the new token goes to the
    /// origin and into the visitor's cookie.
    Passthrough(String),
    /// A verified crawler of the room (`crawlers`): named to the origin,
    /// nothing taken, no cookie.
    Crawler(Arc<str>),
    /// A valid admission token whose session lives: forwarded (renewed past
    /// half its life, then also set as the cookie). `claims`: the token's
    /// as shown (its session is the renewed one's).
    Token {
        forwarded: HeaderValue,
        renewed: bool,
        claims: Arc<AdmitClaims>,
    },
}

impl Admission {
    /// The gateway's own header to the origin: `Sluice-Admission` (the
    /// admission token, when there is one) or `Sluice-Crawler`.
    fn origin_header(&self) -> crate::proxy::OwnHeader {
        match &self.grant {
            Grant::Passthrough(token) => HeaderValue::from_str(token)
                .ok()
                .map(|v| (crate::proxy::SLUICE_ADMISSION, v)),
            Grant::Token { forwarded, .. } => {
                Some((crate::proxy::SLUICE_ADMISSION, forwarded.clone()))
            }
            Grant::Crawler(name) => HeaderValue::from_str(name)
                .ok()
                .map(|v| (http::HeaderName::from_static(crawlers::CRAWLER_HEADER), v)),
            Grant::Unguarded | Grant::FailOpen => None,
        }
    }
}

/// The admission of a request to `room` when it is settled without the
/// store or the waiting room ([`session::settled_admission`]: a valid
/// token, its session not revoked, no renewal due): the edge then sends the
/// request on with [`to_origin`], past the router. `None`: [`authorize`]
/// decides, in full.
pub(crate) fn settled(
    state: &AppState,
    room: Arc<Room>,
    headers: &HeaderMap,
    client: &ClientInfo,
    memo: &session::AdmitMemo,
) -> Option<Admission> {
    let (forwarded, claims) = session::settled_admission(state, headers, &room, client, memo)?;
    Some(Admission {
        room: Some(room),
        grant: Grant::Token {
            forwarded,
            renewed: false,
            claims,
        },
    })
}

/// A request the gate let through, to the origin and back: the proxy
/// (`watch`: the connection's deadlines, when it has them), then
/// [`after_origin`] (`started`: when the request came to the gate). What
/// [`guarded`] does after [`authorize`], and the edge with a [`settled`]
/// admission.
pub(crate) async fn to_origin(
    state: &AppState,
    admission: Admission,
    req: Request,
    client: &ClientInfo,
    watch: Option<&sluice_wire::watch::ConnWatch>,
    started: std::time::Instant,
) -> Response {
    let mut res = state
        .proxy()
        .forward_watched(req, client, admission.origin_header(), watch)
        .await;
    after_origin(state, admission, client, started, &mut res).await;
    res
}

/// Everything outside `/_sluice/`: [`authorize`], then the origin (the one
/// place the gate calls the proxy), then [`after_origin`].
pub async fn guarded(State(state): State<AppState>, req: Request) -> Response {
    let mut req = match authorize(&state, req).await {
        Ok(req) => req,
        Err(res) => return res,
    };
    let (Some(admission), Some(client)) = (
        req.extensions_mut().remove::<Admission>(),
        req.extensions().get::<ClientInfo>().cloned(),
    ) else {
        return Problem::internal()
            .log_cause(&"request without client info")
            .into_response();
    };
    // The connection's deadlines, when the server put them with it.
    let watch = req
        .extensions()
        .get::<Arc<sluice_wire::watch::ConnWatch>>()
        .cloned();
    let started = std::time::Instant::now();
    let mut res = to_origin(&state, admission, req, &client, watch.as_deref(), started).await;
    // (for the compression layer, which the edge's way past the router
    // does not have)
    res.extensions_mut().insert(FromOrigin);
    res
}

/// Marks an answer relayed from the origin (or the proxy's error for it),
/// which the gateway's layers leave as it is (no compression of ours).
#[derive(Clone, Copy, Debug)]
pub struct FromOrigin;

/// The gate in tower-http's async-authorization shape: `Ok` is the request
/// with its [`Admission`] in its extensions, `Err` the answer instead of
/// the origin's (the waiting room, or an error).
pub async fn authorize(state: &AppState, mut req: Request) -> Result<Request, Response> {
    let Some(client) = req.extensions().get::<ClientInfo>().cloned() else {
        return Err(Problem::internal()
            .log_cause(&"request without client info")
            .into_response());
    };
    // The edge routed the request already (the one "is it guarded?"); a
    // request that came another way (the router alone, in tests) is routed
    // here, by the same function.
    let room = match req.extensions_mut().remove::<GuardedBy>() {
        Some(GuardedBy(room)) => Some(room),
        None => guarding_room(state, &req, client.ip).cloned(),
    };
    let Some(room) = room else {
        req.extensions_mut().insert(Admission {
            room: None,
            grant: Grant::Unguarded,
        });
        return Ok(req);
    };
    let grant = match admission_grant(state, &room, &mut req, &client).await {
        Ok(grant) => grant,
        Err(revoked) => match state
            .crawlers()
            .pass(
                state.telemetry(),
                state.queue(),
                room.id(),
                crawlers::Target::of(&req),
                &client,
            )
            .await
        {
            Some(passed) => Grant::Crawler(passed?),
            None => idle_grant(state, &room, req.uri(), req.headers(), &client, revoked).await?,
        },
    };
    req.extensions_mut().insert(Admission {
        room: Some(room),
        grant,
    });
    Ok(req)
}

/// Check 3: a valid admission token whose session is not revoked, renewed
/// past half its life while its session lives. `Err(revoked)` when there
/// is none (`revoked`: the tokens were those of a revoked session).
async fn admission_grant(
    state: &AppState,
    room: &Arc<Room>,
    req: &mut Request,
    client: &ClientInfo,
) -> Result<Grant, bool> {
    let Some((token, claims)) = session::admission_from(state, req.headers(), room, client) else {
        return Err(false);
    };
    // A revoked session is refused by every gateway within a tick of the
    // revoke (the room's ended set), whatever its token still says.
    if session::revoked(state, room, &claims).await {
        return Err(true);
    }
    let renewed = renew(state, room, &claims).await;
    req.extensions_mut().insert(tunnel_bound(
        room,
        &claims,
        renewed.as_ref().map(|(_, c)| c),
    ));
    let (forwarded, renewed) = match renewed {
        Some((token, _)) => (token, true),
        None => (token, false),
    };
    Ok(Grant::Token {
        forwarded: HeaderValue::from_str(&forwarded).map_err(|_| false)?,
        renewed,
        claims: Arc::new(claims),
    })
}

/// Sliding session: past half its life, the token is renewed, but only for
/// a session the store still has (a revoke through a gateway that has not
/// told this one yet, or a session that ended, is not renewed: its token
/// runs out). A store that lost the session (a new epoch: Redis restarted
/// empty) is told about it again.
async fn renew(
    state: &AppState,
    room: &Arc<Room>,
    claims: &AdmitClaims,
) -> Option<(String, AdmitClaims)> {
    let ttl = room.settings().session_ttl;
    let now = now_s();
    if !session::renewal_due(room, claims, now) {
        return None;
    }
    let live = match &claims.sid {
        Some(sid) => session::session_lives(state, room, claims, sid, ttl).await,
        None => true,
    };
    let renewed = live.then(|| claims.renewed(now, ttl)).flatten()?;
    let token = state.keyring().sign_admit(&renewed).ok()?;
    Some((token, renewed))
}

/// Checks 5 and 6 for a request with no live admission (and no verified
/// crawler): fail open when the
/// store is down and the room says so, passthrough at an idle room, or
/// `Err` with the waiting room.
async fn idle_grant(
    state: &AppState,
    room: &Arc<Room>,
    uri: &http::Uri,
    headers: &HeaderMap,
    client: &ClientInfo,
    revoked: bool,
) -> Result<Grant, Response> {
    let waiting_room = || {
        let ret = uri
            .path_and_query()
            .map(|pq| visitor::safe_return_to(Some(pq.as_str())))
            .unwrap_or_else(|| "/".to_owned());
        waiting(state, room, headers, revoked, &ret)
    };
    if !room.store_ok() {
        return if rooms::fail_open(room) && !revoked {
            Ok(Grant::FailOpen)
        } else {
            Err(waiting_room())
        };
    }
    if !revoked && is_idle(state, room, headers, client) {
        match passthrough(state, room, client).await {
            Ok(Some(token)) => return Ok(Grant::Passthrough(token)),
            Ok(None) => {}
            Err(p) => return Err(p.into_response()),
        }
    }
    Err(waiting_room())
}

/// Whether a request with no place may be admitted on the spot: nobody
/// waits, credit remains (as the last snapshot showed), the room is open
/// and not sold out, `max_active` has room, and the network's budget
/// allows. It never gets a place in line: those are bought with proof of
/// work at the join endpoint. A room with a door (`invite_only`, or
/// enqueue tokens `required`) lets nobody in on the spot, idle or not: its
/// code or token is checked at the challenge and the join
/// (`tests/tests/page_invites.rs`).
fn is_idle(state: &AppState, room: &Arc<Room>, headers: &HeaderMap, client: &ClientInfo) -> bool {
    let door = room.config.invite_only || (room.enqueue.is_some() && room.config.enqueue.required);
    if door {
        return false;
    }
    let snap = room.snapshot();
    let cap_free = snap
        .max_active
        .is_none_or(|m| snap.active_sessions + snap.pending_claims < m);
    let has_queue_cookie =
        cookies::read(headers, &cookies::queue_name(room.id()), client).is_some();
    !has_queue_cookie
        && snap.queue_length() == 0
        && snap.credit >= 1.0
        && !snap.paused
        && !snap.closed
        && !snap.prequeue_open
        && !state.sold_out(room.id())
        && cap_free
        && room
            .check_rate_limit(sluice_pow::network_prefix(client.ip))
            .is_ok()
        && room.take_passthrough()
}

/// Passthrough, written once: the store admits a new place atomically (its
/// session started in the same step) or hands out nothing; the new
/// admission token when it did.
async fn passthrough(
    state: &AppState,
    room: &Arc<Room>,
    client: &ClientInfo,
) -> Result<Option<String>, Problem> {
    match rooms::passthrough(room, state.queue()).await {
        Ok(Some(o)) => {
            let sub = new_visitor_id();
            state
                .start_session(room, &sluice_admission::session_of(o.epoch, o.place))
                .await;
            // the place (its seq without lanes; with lanes the seq is the
            // lane's own) names the session the store started
            let (token, _) = state.issue_admission(room, &sub, Some(o.place), o.epoch, client)?;
            Ok(Some(token))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            tracing::warn!(room = room.id(), error = %e, "passthrough failed");
            Ok(None)
        }
    }
}

/// After the origin answered an admitted request: its latency observed for
/// the room's adaptive rate; `Sluice-Command: revoke` ends the session at
/// once and clears both cookies (the place is spent); a renewed or new
/// admission token is set as the cookie.
async fn after_origin(
    state: &AppState,
    admission: Admission,
    client: &ClientInfo,
    started: std::time::Instant,
    res: &mut Response,
) {
    let Some(room) = &admission.room else {
        return;
    };
    room.observe_upstream(started.elapsed(), res.status());
    match &admission.grant {
        Grant::Unguarded | Grant::FailOpen | Grant::Passthrough(_) | Grant::Crawler(_) => {
            admission_cookies(&admission, client, res.headers_mut());
        }
        Grant::Token { claims, .. } => {
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
            } else {
                admission_cookies(&admission, client, res.headers_mut());
            }
        }
    }
}

/// The cookie an admitted request's answer sets, in-path and in
/// forward-auth alike: a passthrough's new admission, a renewed one.
fn admission_cookies(admission: &Admission, client: &ClientInfo, headers: &mut HeaderMap) {
    let Some(room) = &admission.room else {
        return;
    };
    match &admission.grant {
        Grant::Passthrough(token) => cookies::set_admission(headers, room, token, client),
        Grant::Token {
            forwarded,
            renewed: true,
            ..
        } => {
            if let Ok(token) = forwarded.to_str() {
                cookies::set_admission(headers, room, token, client);
            }
        }
        Grant::Unguarded | Grant::FailOpen | Grant::Crawler(_) | Grant::Token { .. } => {}
    }
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
