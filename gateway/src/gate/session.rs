//! Admissions and their sessions: which admission token a request carries,
//! whether its session still lives, and the revoke set.
//!
//! An admission token names its session (`sid`, `{epoch}.{seq}`). A revoke
//! (`Sluice-Command: revoke` from the origin) ends the session in the store
//! and puts it in the room's ended set, which every gateway reads within a
//! tick ([`Room::is_ended`]): a revoked token is refused with a lookup in
//! memory, never a store call per request. The set is bounded
//! (`limits.ended_sessions_per_room`); past the bound a gateway does not
//! forget a revoke and let its token by: until every revoke it could not
//! keep is old enough that no token of it is still valid, it asks the store
//! whether each admitted request's session still lives
//! ([`Room::ended_overflowing`], the gauge `sluice_ended_overflow`).

use std::sync::Arc;

use http::HeaderMap;
use sluice_admission::{AdmitClaims, QueueStore};
use sluice_pow::{NetPrefix, network_prefix};

use crate::app::clock::now_s;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;
use crate::gate::cookies;
use crate::gate::rooms::Room;

/// The admission a request carries for `room` (cookie `sluice_a_{room}`
/// or bearer): its token and claims when valid (signature, room, type,
/// expiry, and the network it is bound to). A revoked session's token still
/// passes here: see [`live_admission`].
pub fn admission_from(
    state: &AppState,
    headers: &HeaderMap,
    room: &Room,
    client: &ClientInfo,
) -> Option<(String, AdmitClaims)> {
    let token = admission_token(headers, room, client)?;
    let claims = state.verify_admit(token, room.id()).ok()?;
    bound_here(&claims, None, client.ip).then(|| (token.to_owned(), claims))
}

/// The admission token a request shows for `room`: its cookie, else a
/// bearer token.
fn admission_token<'h>(
    headers: &'h HeaderMap,
    room: &Room,
    client: &ClientInfo,
) -> Option<&'h str> {
    cookies::read_admit(headers, room.id(), client).or_else(|| cookies::bearer_str(headers))
}

/// Whether the network an admission is bound to (`ipp`, when it has one)
/// is the client's. `known`: the network the same claims were found bound
/// to before (compared without writing the prefix out).
fn bound_here(claims: &AdmitClaims, known: Option<NetPrefix>, ip: std::net::IpAddr) -> bool {
    let Some(bound) = &claims.ipp else {
        return true;
    };
    let net = network_prefix(ip);
    known == Some(net) || *bound == net.to_string()
}

/// The admission token a connection showed last, with its verified claims:
/// the next request on the connection nearly always shows the same one
/// (a browser sends its cookies with each request), and a token equal to
/// it byte for byte needs neither the SHA-256 nor the lock of the shared
/// [`sluice_admission::VerifyCache`], only the checks that depend on the
/// time and the room ([`AdmitClaims::check`]), run on every request. Only a
/// token that passed verification is kept, one per connection (a token that
/// fails leaves it as it was): a forged token never equals it. The keyring
/// is fixed for the gateway's life, so what verified once stays verified.
///
/// It also keeps the `Cookie` field the token was read from: a request of
/// the same room and scheme whose only `Cookie` field is that one, byte for
/// byte, shows the same token (reading is a function of those three), so
/// the field is compared instead of read again.
#[derive(Default)]
pub struct AdmitMemo(parking_lot::Mutex<Option<Memo>>);

struct Memo {
    /// The token, as the header value forwarded to the origin.
    token: http::HeaderValue,
    claims: Arc<AdmitClaims>,
    /// The network its `ipp` was found to name.
    net: Option<NetPrefix>,
    /// Where the token was read: the one `Cookie` field, its room's cookie
    /// in it, and over https or not. `None`: not from a lone `Cookie`
    /// field.
    read_from: Option<(bytes::Bytes, Arc<str>, bool)>,
}

impl Memo {
    /// Whether `headers` show the token this memo was read from, for
    /// `room` over the same scheme, without reading them again.
    fn same_field(&self, headers: &HeaderMap, room: &Room, https: bool) -> bool {
        let Some((field, room_id, was_https)) = &self.read_from else {
            return false;
        };
        *was_https == https
            && **room_id == *room.id()
            && lone_cookie_field(headers).is_some_and(|only| only.as_bytes() == field.as_ref())
    }
}

/// The longest `Cookie` field a connection's [`AdmitMemo`] keeps a copy of
/// (a field stuffed to the head's limit is read each time instead of held
/// for the connection's life): room for the token and a site's own cookies.
const MEMO_FIELD_MAX: usize = 2 * sluice_admission::tokens::MAX_TOKEN_LEN;

/// The one `Cookie` field of a request, when it has exactly one.
fn lone_cookie_field(headers: &HeaderMap) -> Option<&http::HeaderValue> {
    let mut cookies = headers.get_all(http::header::COOKIE).iter();
    match (cookies.next(), cookies.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

/// A request's admission to `room` when it is settled without the store:
/// a valid token ([`admission_from`]'s checks, through the connection's
/// `memo`) whose session is not in the room's ended set while that set
/// holds every revoke (no store call to make), and that is not due for
/// renewal. `None` for anything else, which the gate then decides in full
/// ([`crate::gate::authorize`]). The token is returned as the value
/// forwarded to the origin.
pub fn settled_admission(
    state: &AppState,
    headers: &HeaderMap,
    room: &Room,
    client: &ClientInfo,
    memo: &AdmitMemo,
) -> Option<(http::HeaderValue, Arc<AdmitClaims>)> {
    let https = client.proto == "https";
    let (value, claims, net) = {
        let mut last = memo.0.lock();
        match &mut *last {
            Some(m) if m.same_field(headers, room, https) => {
                m.claims.check(room.id(), now_s()).ok()?;
                (m.token.clone(), m.claims.clone(), m.net)
            }
            last => {
                let token = admission_token(headers, room, client)?;
                // Where the token was read, when it is the room's cookie in
                // the one `Cookie` field (not a bearer token), and that
                // field is no longer than [`MEMO_FIELD_MAX`].
                let read_from = lone_cookie_field(headers)
                    .filter(|f| f.len() <= MEMO_FIELD_MAX)
                    .filter(|_| cookies::read_admit(headers, room.id(), client) == Some(token))
                    .map(|f| {
                        (
                            bytes::Bytes::copy_from_slice(f.as_bytes()),
                            Arc::from(room.id()),
                            https,
                        )
                    });
                match last {
                    Some(m) if m.token.as_bytes() == token.as_bytes() => {
                        m.claims.check(room.id(), now_s()).ok()?;
                        m.read_from = read_from;
                        (m.token.clone(), m.claims.clone(), m.net)
                    }
                    _ => {
                        let claims = Arc::new(state.verify_admit(token, room.id()).ok()?);
                        let value = http::HeaderValue::from_str(token).ok()?;
                        let net = claims.ipp.as_ref().map(|_| network_prefix(client.ip));
                        let net = net.filter(|_| bound_here(&claims, None, client.ip));
                        *last = Some(Memo {
                            token: value.clone(),
                            claims: claims.clone(),
                            net,
                            read_from,
                        });
                        (value, claims, net)
                    }
                }
            }
        }
    };
    if !bound_here(&claims, net, client.ip) {
        return None;
    }
    if let Some(sid) = claims.sid.as_deref()
        && (room.is_ended(sid) || room.ended_overflowing())
    {
        return None;
    }
    if renewal_due(room, &claims, now_s()) {
        return None;
    }
    Some((value, claims))
}

/// Whether an admission is past half its session's life, when the gate
/// renews it.
pub fn renewal_due(room: &Room, claims: &AdmitClaims, now: u64) -> bool {
    now.saturating_sub(claims.iat) * 2 >= room.settings().session_ttl.as_secs()
}

/// An admission the visitor may still use: a valid token of the room whose
/// session was not revoked ([`revoked`]). The reservation endpoints take
/// only this; the gate also tells a revoked one apart (it clears its
/// cookies and never passes it through).
pub async fn live_admission(
    state: &AppState,
    headers: &HeaderMap,
    room: &Room,
    client: &ClientInfo,
) -> Option<(String, AdmitClaims)> {
    let (token, claims) = admission_from(state, headers, room, client)?;
    if revoked(state, room, &claims).await {
        return None;
    }
    Some((token, claims))
}

/// Whether the session these claims name was revoked: in the room's ended
/// set, or, while the set overflows, no longer in the store. A store that
/// does not answer then revokes nothing (admitted visitors keep passing
/// while the store is down, as the failure policy says); nor does a token of
/// an older epoch than the store's (the store lost its sessions, not a
/// revoke: the renewal starts it again).
pub async fn revoked(state: &AppState, room: &Room, claims: &AdmitClaims) -> bool {
    let Some(sid) = claims.sid.as_deref() else {
        return false;
    };
    if room.is_ended(sid) {
        return true;
    }
    if !room.ended_overflowing() {
        return false;
    }
    let ttl = room.settings().session_ttl;
    match state.queue().session_touch(room.id(), sid, ttl).await {
        Ok(true) => false,
        Ok(false) => claims.epoch >= room.snapshot().epoch,
        Err(e) => {
            tracing::debug!(room = room.id(), error = %e, "revoke check: store unavailable");
            false
        }
    }
}

/// Whether the session `sid` of an admission token may be renewed: the
/// store renews it (it lives), or the store lost it (the token is of an
/// older epoch than the room's: it is started again, unless this gateway
/// knows it was revoked). A store that does not answer renews nothing now:
/// the token stays valid until it expires, and the next request tries again.
pub async fn session_lives(
    state: &AppState,
    room: &Room,
    claims: &AdmitClaims,
    sid: &str,
    ttl: std::time::Duration,
) -> bool {
    match state.queue().session_touch(room.id(), sid, ttl).await {
        Ok(true) => true,
        Ok(false) => {
            let epoch = room.snapshot().epoch;
            if claims.epoch < epoch && !room.is_ended(sid) {
                state.start_session(room, sid).await;
                true
            } else {
                false
            }
        }
        Err(e) => {
            tracing::debug!(room = room.id(), error = %e, "session not renewed: store unavailable");
            false
        }
    }
}
