//! Errors of challenge verification and of the replay guard.
//!
//! Every [`PowError`] has a *public* reason, [`PowError::code`], the API
//! code the gateway puts in its problem+json answer, and a *private* one,
//! its `Display`, for the log line. The public code never tells a client
//! which check failed beyond what API.md promises.

use thiserror::Error;

/// Why a challenge or its solutions were refused, or why the replay guard
/// could not be asked.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PowError {
    /// The challenge or the solutions could not be parsed: wrong shape,
    /// bad base64, a payload of the wrong length, a challenge over
    /// [`crate::MAX_CHALLENGE_LEN`] bytes or more than
    /// [`crate::MAX_PUZZLES`] solutions. Code `malformed_request`.
    #[error("malformed challenge: {0}")]
    Malformed(&'static str),

    /// A solution is not a canonical decimal `u64` (no sign, no leading
    /// zero, at most 20 digits, no overflow). Code `malformed_request`: a
    /// correct client never sends one.
    #[error("solution {index} is not a canonical u64 decimal string")]
    NonCanonicalSolution {
        /// Puzzle index of the offending solution.
        index: usize,
    },

    /// The payload's version byte is not one this build issues. Code
    /// `pow_invalid`.
    #[error("unknown challenge version {0}")]
    UnknownVersion(u8),

    /// The key id names no key in the keyset (retired, or never ours).
    /// Code `pow_invalid`.
    #[error("unknown key id {0}")]
    UnknownKey(u8),

    /// The HMAC tag does not match the payload: forged or altered. Code
    /// `pow_invalid`.
    #[error("bad challenge tag")]
    BadTag,

    /// The challenge claims to be issued further in the future than the
    /// clock-skew allowance. Code `pow_invalid`.
    #[error("challenge issued {ahead_ms} ms in the future")]
    FutureDated {
        /// How far ahead of our clock the issue time is.
        ahead_ms: u64,
    },

    /// The challenge's time to live has passed. Code `pow_expired`.
    #[error("challenge expired {late_ms} ms ago")]
    Expired {
        /// How long ago it expired.
        late_ms: u64,
    },

    /// Solved sooner than the challenge's minimum solve age (set under
    /// attack): a wall-clock floor no hardware can compress. Reported only
    /// once every other check passed (the work is valid), and the
    /// challenge is not consumed: the same solution is accepted for the
    /// same place once due ([`PowError::retry_after_ms`]). Code
    /// `pow_too_early` (HTTP 429 with `Retry-After`).
    #[error("solved after {elapsed_ms} ms, minimum is {min_ms} ms")]
    TooFast {
        /// Time since issue.
        elapsed_ms: u64,
        /// The challenge's minimum solve age.
        min_ms: u64,
    },

    /// The challenge was issued for another room. Code `pow_invalid`.
    #[error("challenge issued for another room")]
    WrongRoom,

    /// The number of solutions differs from the challenge's puzzle count.
    /// Code `pow_invalid`.
    #[error("expected {expected} solutions, got {got}")]
    WrongCount {
        /// Puzzles in the challenge.
        expected: usize,
        /// Solutions received.
        got: usize,
    },

    /// A solution's hash has fewer leading zero bits than required. Code
    /// `pow_invalid`.
    #[error("solution {index} has too few leading zero bits")]
    InsufficientWork {
        /// Puzzle index of the failing solution.
        index: usize,
    },

    /// Valid, but this challenge was already redeemed. Code `pow_replayed`.
    #[error("challenge already redeemed")]
    Replayed,

    /// The replay guard's store failed; nothing is known about the
    /// challenge's use. Code `store_unavailable`.
    #[error("replay guard unavailable: {0}")]
    Store(#[from] GuardError),
}

impl PowError {
    /// How long until a solution sent too early is due (`pow_too_early`).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            PowError::TooFast { elapsed_ms, min_ms } => {
                Some(min_ms.saturating_sub(*elapsed_ms).max(1))
            }
            _ => None,
        }
    }

    /// The public API code for this error (API.md): `malformed_request`,
    /// `pow_invalid`, `pow_expired`, `pow_too_early`, `pow_replayed` or
    /// `store_unavailable`.
    pub fn code(&self) -> &'static str {
        match self {
            PowError::Malformed(_) | PowError::NonCanonicalSolution { .. } => "malformed_request",
            PowError::UnknownVersion(_)
            | PowError::UnknownKey(_)
            | PowError::BadTag
            | PowError::FutureDated { .. }
            | PowError::WrongRoom
            | PowError::WrongCount { .. }
            | PowError::InsufficientWork { .. } => "pow_invalid",
            PowError::Expired { .. } => "pow_expired",
            PowError::TooFast { .. } => "pow_too_early",
            PowError::Replayed => "pow_replayed",
            PowError::Store(_) => "store_unavailable",
        }
    }
}

/// A fault of the replay guard's store. The gateway answers 503
/// `store_unavailable`: whether the challenge was used is unknown, so it is
/// neither accepted nor reported as replayed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GuardError {
    /// Redis refused or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),

    /// The in-memory guard holds its maximum number of live entries; it
    /// fails closed rather than forget an unexpired id.
    #[error("in-memory replay guard full ({0} live entries)")]
    Full(usize),
}

/// A [`crate::ChallengeSpec`] that cannot be issued.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpecError {
    /// Room name longer than [`crate::MAX_ROOM_LEN`] bytes.
    #[error("room name is {0} bytes, at most {max} allowed", max = crate::MAX_ROOM_LEN)]
    RoomTooLong(usize),
    /// Puzzle count outside `1..=64`.
    #[error("puzzles must be 1..=64, got {0}")]
    Puzzles(u8),
    /// Difficulty above [`crate::MAX_DIFFICULTY_BITS`].
    #[error("difficulty_bits must be at most {max}, got {0}", max = crate::MAX_DIFFICULTY_BITS)]
    Bits(u8),
    /// Time to live zero or above `u32::MAX` milliseconds.
    #[error("ttl must be between 1 ms and about 49 days")]
    Ttl,
    /// Minimum solve age not shorter than the time to live.
    #[error("min_solve must be shorter than ttl")]
    MinSolve,
}

/// A [`crate::Keyset`] that cannot be built.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeysetError {
    /// A secret shorter than 16 bytes.
    #[error("HMAC secret for kid {0} is shorter than 16 bytes")]
    ShortSecret(u8),
    /// More than two verify-only keys.
    #[error("at most two older keys, got {0}")]
    TooManyOlder(usize),
    /// Two keys share one kid.
    #[error("duplicate key id {0}")]
    DuplicateKid(u8),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_api() {
        assert_eq!(PowError::Malformed("x").code(), "malformed_request");
        assert_eq!(PowError::BadTag.code(), "pow_invalid");
        assert_eq!(PowError::Expired { late_ms: 1 }.code(), "pow_expired");
        assert_eq!(PowError::Replayed.code(), "pow_replayed");
        assert_eq!(
            PowError::Store(GuardError::Full(1)).code(),
            "store_unavailable"
        );
        assert_eq!(PowError::WrongRoom.code(), "pow_invalid");
    }
}
