//! sluice-pow: proof of work for the waiting room.
//!
//! Bots must pay for every place in line; fans on a slow phone must barely
//! notice. This crate issues signed, stateless challenges, verifies their
//! solutions, makes each solution buy one place once, decides how hard a
//! challenge is, and solves challenges natively. It does no HTTP: the
//! gateway calls it.
//!
//! # Vocabulary
//!
//! - **Challenge**: an opaque ASCII string
//!   `base64url(payload).base64url(HMAC-SHA256 tag)`; the payload carries
//!   the room, the puzzle count, the difficulty, the issue time, the time to
//!   live, a minimum solve age and 16 random bytes (the challenge **id**).
//!   Layout in [`challenge`].
//! - **Puzzle**: puzzle `i` (0 ≤ i < k) asks for a counter `n_i`, a u64 in
//!   canonical decimal, such that `SHA-256(challenge ":" i ":" n_i)` begins
//!   with at least `b` zero bits. k small puzzles instead of one large one
//!   make solve time predictable and progress honest. Expected work
//!   `k × 2^b`.
//! - **Difficulty bits** `b`: the leading zero bits each puzzle's hash needs.
//! - **kid**: the one-byte id of the HMAC key that signed a challenge; a
//!   [`Keyset`] holds one signing key and up to two older verify-only keys.
//! - **Replay guard**: the store that remembers redeemed challenge ids until
//!   they expire ([`ReplayStore`], [`ReplayGuard`]).
//! - **Level**: the `(k, b, min solve age)` the [`DifficultyPolicy`] picks for
//!   one network prefix ([`NetPrefix`], /24 or /56) at one moment.
//!
//! # Layout
//!
//! | module | what |
//! |---|---|
//! | [`challenge`] | wire format, [`Keyset`], issue and verify |
//! | [`hash`] | the puzzle hash with its prefix state, leading zero bits, canonical counters |
//! | [`guard`] | [`ReplayStore`] trait, memory and Redis guards (the Redis one on any `sluice_redis::RedisConn`), the [`ReplayGuard`] enum |
//! | [`difficulty`] | [`DifficultyPolicy`]: pressure hysteresis and per-prefix decayed sketch |
//! | [`prefix`] | [`network_prefix`] |
//! | [`solver`] | native multi-threaded [`solve`] |
//! | [`error`] | [`PowError`] (public code + private reason), [`GuardError`] |
//! | `conformance` | replay-guard test suite (feature `test-util`) |
//!
//! The browser solver lives in `static/pow-worker.js` and
//! `static/pow-solver.js`; `static/test/vectors.json` (written by
//! `cargo run -p sluice-pow --example js_vectors`) keeps both sides honest.
//!
//! # Invariants
//!
//! - Verification is stateless and writes nothing: everything it needs is in
//!   the signed payload. Only a fully verified challenge reaches the replay
//!   guard ([`redeem`]): an unauthenticated request never writes to a store.
//! - Inputs are bounded before any decoding (challenge ≤ 512 bytes, ≤ 64
//!   solutions); the tag is compared in constant time.
//! - Verifying costs one HMAC and k SHA-256 tails: the constant prefix
//!   `challenge ":" i ":"` is absorbed once per puzzle.
//! - A challenge id is accepted by the guard at most once until
//!   [`Verified::guard_ttl`] has passed, by which time every gateway rejects
//!   the challenge as expired.
//! - Expected work never exceeds `2^max_work_log2` (default 2^24) hashes.
//!
//! # Example
//!
//! ```
//! # tokio_test_block_on(async {
//! use std::time::Duration;
//! use sluice_pow::{ChallengeSpec, Keyset, ReplayGuard, redeem, solve};
//!
//! let keys = Keyset::from_secret(b"a shared secret of 16+ bytes").unwrap();
//! let spec = ChallengeSpec {
//!     room: "drop".into(),
//!     puzzles: 4,
//!     difficulty_bits: 6,
//!     ttl: Duration::from_secs(120),
//!     min_solve: Duration::ZERO,
//! };
//! let now = 1_800_000_000_000;
//! let c = keys.issue(&spec, now).unwrap();
//! let solutions = solve(&c.challenge, c.puzzles, c.difficulty_bits, 2);
//! let guard = ReplayGuard::memory();
//! assert!(redeem(&keys, &guard, &c.challenge, &solutions, "drop", now + 900).await.is_ok());
//! let again = redeem(&keys, &guard, &c.challenge, &solutions, "drop", now + 950).await;
//! assert_eq!(again.unwrap_err().code(), "pow_replayed");
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

pub mod challenge;
#[cfg(feature = "test-util")]
pub mod conformance;
pub mod difficulty;
pub mod error;
pub mod guard;
pub mod hash;
pub mod prefix;
pub mod solver;

pub use challenge::{
    CLOCK_SKEW, ChallengeSpec, IssuedChallenge, Keyset, MAX_CHALLENGE_LEN, MAX_DIFFICULTY_BITS,
    MAX_PUZZLES, MAX_ROOM_LEN, Verified, kid_for_secret,
};
pub use difficulty::{
    DifficultyConfig, DifficultyConfigError, DifficultyPolicy, DifficultySnapshot, Level,
};
pub use error::{GuardError, KeysetError, PowError, SpecError};
pub use guard::{MemoryReplayGuard, RedisReplayGuard, ReplayGuard, ReplayStore};
pub use hash::{leading_zero_bits, parse_canonical_u64};
pub use prefix::{NetPrefix, network_prefix};
pub use solver::{solve, solve_puzzle};

/// What [`redeem_or_recall`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redemption {
    /// First use: the id is consumed now.
    New(Verified),
    /// A valid solution whose id was already consumed, with the note the
    /// first redemption left ([`ReplayStore::note`]), if any: the caller
    /// may answer with what the first one bought.
    Replayed {
        /// The challenge, verified again in full.
        verified: Verified,
        /// The first redemption's note.
        note: Option<String>,
    },
}

/// Like [`redeem`], but a replay of a fully verified solution is returned
/// with the first redemption's note instead of [`PowError::Replayed`], so a
/// client that lost the answer to its join can get its place back.
pub async fn redeem_or_recall<G: ReplayStore, S: AsRef<str>>(
    keyset: &Keyset,
    guard: &G,
    challenge: &str,
    solutions: &[S],
    room: &str,
    now_ms: u64,
) -> Result<Redemption, PowError> {
    let (verified, first) =
        verify_and_consume(keyset, guard, challenge, solutions, room, now_ms).await?;
    if first {
        Ok(Redemption::New(verified))
    } else {
        let note = guard.noted(&verified.id).await?;
        Ok(Redemption::Replayed { verified, note })
    }
}

/// Verifies a challenge completely, then consumes its id once.
///
/// The replay guard is touched only after every check of
/// [`Keyset::verify`] passed. Errors: those of `verify`;
/// [`PowError::Replayed`] when the id was already redeemed;
/// [`PowError::Store`] when the guard failed (code `store_unavailable`).
pub async fn redeem<G: ReplayStore, S: AsRef<str>>(
    keyset: &Keyset,
    guard: &G,
    challenge: &str,
    solutions: &[S],
    room: &str,
    now_ms: u64,
) -> Result<Verified, PowError> {
    match verify_and_consume(keyset, guard, challenge, solutions, room, now_ms).await? {
        (verified, true) => Ok(verified),
        (_, false) => Err(PowError::Replayed),
    }
}

/// Every check of [`Keyset::verify`], then (only then) the guard's
/// insert-if-absent: the verified challenge and whether this was its first
/// use.
async fn verify_and_consume<G: ReplayStore, S: AsRef<str>>(
    keyset: &Keyset,
    guard: &G,
    challenge: &str,
    solutions: &[S],
    room: &str,
    now_ms: u64,
) -> Result<(Verified, bool), PowError> {
    let verified = keyset.verify(challenge, solutions, room, now_ms)?;
    let first = guard
        .consume_once(&verified.id, verified.guard_ttl(now_ms))
        .await?;
    Ok((verified, first))
}
