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

use http::HeaderMap;
use sluice_admission::{AdmitClaims, QueueStore};
use sluice_pow::network_prefix;

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
    let token = cookies::read(headers, &cookies::admit_name(room.id()), client)
        .or_else(|| cookies::bearer(headers))?;
    let claims = state.verify_admit(&token, room.id()).ok()?;
    if let Some(bound) = &claims.ipp
        && *bound != network_prefix(client.ip).to_string()
    {
        return None;
    }
    Some((token, claims))
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
