//! Invite codes at the door of an invite-only room (`invite_only`): the
//! code a challenge or a join carries is checked before any work is spent
//! (the challenge is not even issued without a valid code, and a join's
//! proof of work is not verified), then redeemed once the work is verified,
//! and given back when the join it paid for failed.
//!
//! Refusals are 403 `invite_invalid` (API.md) with a `reason`: `required`,
//! `malformed`, `unknown`, `exhausted`, `revoked` or `expired`. Telling a
//! used code from an unknown one helps the fan and not a guesser: codes
//! carry 128 random bits, and every attempt, valid or not, takes one of
//! the network's `invite_attempts_per_prefix_per_min` (429 `rate_limited`
//! past it): one budget for every gateway on the queue store
//! ([`take_attempt`]).

use http::StatusCode;
use sluice_admission::invites::{InviteCheck, code_hash, normalize};
use sluice_pow::NetPrefix;

use crate::app::clock::now_ms;
use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::gate::rooms::Room;

/// `invite_invalid` with its reason.
pub fn invite_invalid(reason: &'static str) -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        "invite_invalid",
        "This room is by invitation: a valid invite code is required",
    )
    .with("reason", reason)
}

/// For an invite-only room, checks the code `typed` without redeeming it:
/// the code's hash, to redeem later. `None` for a room open to all (the
/// code, if any, is ignored).
pub async fn check(
    state: &AppState,
    room: &Room,
    prefix: sluice_pow::NetPrefix,
    typed: Option<&str>,
) -> Result<Option<String>, Problem> {
    if !room.config.invite_only {
        return Ok(None);
    }
    let refuse = |reason: &'static str| {
        state.telemetry().invite(room.id(), reason);
        invite_invalid(reason)
    };
    let Some(typed) = typed else {
        return Err(refuse("required"));
    };
    take_attempt(state, room, prefix).await.map_err(|wait| {
        state.telemetry().rate_limited(room.id(), "invite");
        Problem::rate_limited(wait)
    })?;
    let Some(code) = normalize(typed) else {
        return Err(refuse("malformed"));
    };
    let hash = code_hash(&code);
    let answer = state
        .invites()
        .check(room.id(), &hash, now_ms())
        .await
        .map_err(|e| Problem::store_unavailable().log_cause(&e))?;
    match answer.refusal() {
        Some(reason) => Err(refuse(reason)),
        None => Ok(Some(hash)),
    }
}

/// Takes one invite attempt of the network `prefix`, or the seconds to
/// wait. This gateway's own bucket first (a flood from one network never
/// reaches the store), then the queue store's bucket of the same size
/// ([`sluice_admission::rate`]), one for every gateway on the store: N
/// gateways give a network the attempts of one. While the store does not
/// answer, this gateway's bucket alone decides (the network is then held
/// to the limit at each gateway, as before the shared budget).
async fn take_attempt(state: &AppState, room: &Room, prefix: NetPrefix) -> Result<(), u64> {
    room.check_invite_attempt(prefix)?;
    let per_min = room.config.invite_attempts_per_prefix_per_min;
    if per_min == 0 {
        return Ok(());
    }
    match state
        .take_network_budget("invite", room.id(), prefix, per_min)
        .await
    {
        Some(wait_ms) => Err(wait_ms.div_ceil(1_000).max(1)),
        None => Ok(()),
    }
}

/// Redeems one use of the checked code `hash`, noting `note` (the
/// network); a code used up or revoked since the check is refused.
pub async fn redeem(state: &AppState, room: &Room, hash: &str, note: &str) -> Result<(), Problem> {
    let answer = state
        .invites()
        .redeem(room.id(), hash, now_ms(), note)
        .await
        .map_err(|e| Problem::store_unavailable().log_cause(&e))?;
    match answer {
        InviteCheck::Valid { .. } => {
            state.telemetry().invite(room.id(), "redeemed");
            Ok(())
        }
        other => {
            let reason = other.refusal().unwrap_or("unknown");
            state.telemetry().invite(room.id(), reason);
            Err(invite_invalid(reason))
        }
    }
}

/// Gives back the use a failed join redeemed (logged when it cannot).
pub async fn give_back(state: &AppState, room: &Room, hash: &str) {
    if let Err(e) = state.invites().unredeem(room.id(), hash, now_ms()).await {
        tracing::warn!(room = room.id(), error = %e, "invite use not given back after a failed join");
    } else {
        state.telemetry().invite(room.id(), "returned");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn prefix(ip: &str) -> NetPrefix {
        sluice_pow::network_prefix(ip.parse().unwrap())
    }

    fn attempt_key(room: &str, p: NetPrefix) -> String {
        crate::edge::client_ip::network_bucket("invite", room, p)
    }

    #[test]
    fn attempt_keys_are_valid_store_keys_apart_per_room_and_network() {
        let long_room = "r".repeat(200);
        let keys = [
            attempt_key("vip", prefix("203.0.113.7")),
            attempt_key("vip", prefix("198.51.100.7")),
            attempt_key("vip2", prefix("203.0.113.7")),
            attempt_key(&long_room, prefix("2001:db8::1")),
            crate::edge::client_ip::network_bucket("admin", "", prefix("203.0.113.7")),
        ];
        for k in &keys {
            sluice_admission::rate::check(k, 0.5, 30).unwrap();
            // a digest: no address in the store
            let (kind, digest) = k.split_once('.').unwrap();
            assert!(["invite", "admin"].contains(&kind), "{k}");
            assert_eq!(digest.len(), 32, "{k}");
            assert!(!k.contains(['/', ':']), "{k}");
        }
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        // one network, one key: the same /24 (IPv4) or /56 (IPv6)
        assert_eq!(keys[0], attempt_key("vip", prefix("203.0.113.200")));
    }
}
