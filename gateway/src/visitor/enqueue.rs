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
//!   tokens. The `lane` claim is read and not yet used (lanes are not
//!   built).

use std::time::Duration;

use http::StatusCode;
use sluice_admission::enqueue::account_key;

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

/// The account key of the join's token, checked; `None` without a token
/// (where none is required) or in a room that trusts no key.
pub fn check(room: &Room, token: Option<&str>) -> Result<Option<String>, Problem> {
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
    let claims = verifier
        .verify(token, room.id(), now_s())
        .map_err(|e| invalid(e.reason()))?;
    Ok(Some(account_key(room.id(), &claims.sub)))
}
