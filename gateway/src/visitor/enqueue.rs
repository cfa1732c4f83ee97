//! Enqueue tokens at the join (API.md wave 2): the origin's signed word
//! for which of its accounts a visitor is, so the place is the account's.
//!
//! - No token: 403 `enqueue_token_required` in a room with
//!   `[rooms.enqueue] required = true`; elsewhere a plain join.
//! - A token that does not verify (signature, algorithm, key, expiry, too
//!   long-lived, another room, shape): 401 `enqueue_token_invalid` with a
//!   `reason`, before any work is looked at, nothing bound.
//! - A valid token: the account's place if it has one (any device, any
//!   gateway), else a new place bound to it (module docs of
//!   `sluice_admission::enqueue`). A room that trusts no key ignores
//!   tokens.
//! - A room with `jwks_url` verifies EdDSA tokens with the origin's JWKS
//!   as last fetched ([`crate::gate::fetched`]); a token naming a key it
//!   lacks (the origin rotated) waits for one early fetch, at most once per
//!   `jwks_retry` and `ENQUEUE_JWKS_TIMEOUT` long, so made-up key ids
//!   cannot make the gateway fetch more often. The `lane` claim picks the
//!   visitor's priority lane (README, "Priority lanes").

use std::time::Duration;

use http::StatusCode;
use sluice_admission::enqueue::{EnqueueError, account_key};

use crate::app::clock::now_s;
use crate::app::problem::Problem;
use crate::gate::rooms::Room;

/// How long a join holds its account's reservation at most.
pub const RESERVATION: Duration = Duration::from_secs(10);
/// How long an account's place stays bound (a queue token lives less).
pub const BINDING: Duration = Duration::from_secs(24 * 3600);

/// `enqueue_token_invalid` with its reason.
pub fn invalid(reason: &'static str) -> Problem {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "enqueue_token_invalid",
        "The enqueue token is not valid for this room",
    )
    .with("reason", reason)
}

/// `enqueue_token_required`.
pub fn required() -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        "enqueue_token_required",
        "This room admits visitors signed in at the site: an enqueue token is required",
    )
}

/// `enqueue_keys_unavailable`: the origin's JWKS could not be fetched yet.
fn keys_unavailable(room: &Room) -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "enqueue_keys_unavailable",
        "The keys that verify this room's enqueue tokens cannot be had right now",
    )
    .retry_after(room.config.enqueue.jwks_retry.as_secs().clamp(1, 60))
}

/// The account key of the join's token, checked; `None` without a token
/// (where none is required) or in a room that trusts no key.
pub async fn check(room: &Room, token: Option<&str>) -> Result<Option<String>, Problem> {
    Ok(check_lane(room, token).await?.map(|(account, _)| account))
}

/// [`check`] with the token's `lane` claim.
pub async fn check_lane(
    room: &Room,
    token: Option<&str>,
) -> Result<Option<(String, Option<String>)>, Problem> {
    let Some(verifier) = &room.enqueue else {
        return Ok(None);
    };
    let Some(token) = token else {
        return if room.config.enqueue.required {
            Err(required())
        } else {
            Ok(None)
        };
    };
    let fetched = match &room.enqueue_jwks {
        Some(jwks) => jwks.keys().await,
        None => None,
    };
    let mut verdict = verifier.verify_with(token, room.id(), now_s(), fetched.as_deref());
    if verdict == Err(EnqueueError::UnknownKey)
        && let Some(jwks) = &room.enqueue_jwks
    {
        match jwks.refetch(true).await {
            Some(fresh) => {
                verdict = verifier.verify_with(token, room.id(), now_s(), Some(&fresh));
            }
            // never fetched: the key may well be good, the gateway cannot
            // tell yet; the fan tries again, nothing was taken
            None if jwks.current().is_none() => return Err(keys_unavailable(room)),
            None => {}
        }
    }
    let claims = verdict.map_err(|e| invalid(e.reason()))?;
    Ok(Some((account_key(room.id(), &claims.sub), claims.lane)))
}
