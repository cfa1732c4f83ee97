//! Issuing and verifying signed challenges.
//!
//! # Wire format (version 1)
//!
//! A challenge is `base64url(payload) "." base64url(tag)`, both without
//! padding, where `tag = HMAC-SHA256(key[kid], payload)` and the payload is
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version, `1` |
//! | 1 | kid, the key that signed it |
//! | 1 | room length `L`, at most [`MAX_ROOM_LEN`] |
//! | L | room name, UTF-8 |
//! | 1 | puzzles `k`, 1 to 64 |
//! | 1 | difficulty bits `b` |
//! | 8 | issue time, Unix milliseconds, big-endian |
//! | 4 | time to live, milliseconds, big-endian |
//! | 4 | minimum solve age, milliseconds, big-endian (0 = none) |
//! | 16 | random bytes: the challenge id |
//!
//! Everything verification needs is in the signed payload: nothing is
//! looked up or recomputed, so any gateway holding the key verifies any
//! gateway's challenge. With a 16-byte room the string is 115 characters.
//!
//! # Keys
//!
//! The HMAC key is derived from the operator's secret (`HMAC-SHA256(secret,
//! "sluice/pow/v1")`), so a secret shared with another purpose (webhooks)
//! still cannot forge challenges. The kid is the first byte of
//! `SHA-256(secret)`: gateways sharing a secret agree on it with no
//! configuration. One current key signs; up to two older keys still verify,
//! so a secret rotates without a flag day.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::error::{KeysetError, PowError, SpecError};
use crate::hash::{ChallengeHasher, meets_difficulty, parse_canonical_u64};

type HmacSha256 = Hmac<Sha256>;

/// The only payload version this build issues and accepts.
pub const VERSION: u8 = 1;
/// Longest room name a challenge carries, in bytes.
pub const MAX_ROOM_LEN: usize = 64;
/// Most puzzles in one challenge (and most solutions accepted).
pub const MAX_PUZZLES: usize = 64;
/// Highest difficulty a challenge may carry. Far above any sane policy
/// (which stops near 20); it only keeps `issue` honest.
pub const MAX_DIFFICULTY_BITS: u8 = 40;
/// Longest challenge string accepted before any decoding.
pub const MAX_CHALLENGE_LEN: usize = 512;
/// How far in the future an issue time may lie (clocks of gateways sharing
/// a key differ a little).
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);

const FIXED_LEN: usize = 3 + 1 + 1 + 8 + 4 + 4 + 16;
const MAX_PAYLOAD_LEN: usize = FIXED_LEN + MAX_ROOM_LEN;
const TAG_LEN: usize = 32;
const TAG_B64_LEN: usize = 43;
const KEY_CONTEXT: &[u8] = b"sluice/pow/v1";
const MIN_SECRET_LEN: usize = 16;

/// What to issue: the room and the level the difficulty policy chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChallengeSpec {
    /// Room the challenge buys a place in (at most [`MAX_ROOM_LEN`] bytes).
    pub room: String,
    /// Puzzles `k`, 1 to 64.
    pub puzzles: u8,
    /// Leading zero bits `b` each puzzle's hash needs.
    pub difficulty_bits: u8,
    /// How long the challenge may be redeemed after issue.
    pub ttl: Duration,
    /// Minimum time between issue and redemption (zero = none).
    pub min_solve: Duration,
}

impl ChallengeSpec {
    /// Checks the spec fits the wire format.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.room.len() > MAX_ROOM_LEN {
            return Err(SpecError::RoomTooLong(self.room.len()));
        }
        if self.puzzles == 0 || usize::from(self.puzzles) > MAX_PUZZLES {
            return Err(SpecError::Puzzles(self.puzzles));
        }
        if self.difficulty_bits > MAX_DIFFICULTY_BITS {
            return Err(SpecError::Bits(self.difficulty_bits));
        }
        let ttl = self.ttl.as_millis();
        if ttl == 0 || ttl > u128::from(u32::MAX) {
            return Err(SpecError::Ttl);
        }
        if self.min_solve.as_millis() >= ttl {
            return Err(SpecError::MinSolve);
        }
        Ok(())
    }
}

/// A freshly issued challenge, as the challenge endpoint returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedChallenge {
    /// The opaque ASCII challenge string.
    pub challenge: String,
    /// Puzzles `k`.
    pub puzzles: u8,
    /// Leading zero bits per puzzle.
    pub difficulty_bits: u8,
    /// Expiry, Unix seconds (rounded down).
    pub expires_at: u64,
    /// Expiry, Unix milliseconds.
    pub expires_at_ms: u64,
    /// The challenge id (its random bytes), the replay guard's key.
    pub id: [u8; 16],
}

/// A challenge whose signature, time window, room and solutions all
/// checked out. Not yet redeemed: see [`crate::redeem`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The challenge id, unique per issue: the replay guard's key.
    pub id: [u8; 16],
    /// When the challenge stops being accepted, Unix milliseconds.
    pub expires_at_ms: u64,
    /// When it was issued, Unix milliseconds.
    pub issued_at_ms: u64,
    /// Puzzles `k` it carried.
    pub puzzles: u8,
    /// Difficulty bits it carried.
    pub difficulty_bits: u8,
}

impl Verified {
    /// How long the replay guard must remember this id, from `now_ms`: until
    /// no gateway (clocks up to [`CLOCK_SKEW`] behind ours) would still
    /// accept the challenge. At least one millisecond.
    pub fn guard_ttl(&self, now_ms: u64) -> Duration {
        let skew = u64::try_from(CLOCK_SKEW.as_millis()).unwrap_or(u64::MAX);
        let ms = self
            .expires_at_ms
            .saturating_sub(now_ms)
            .saturating_add(skew)
            .max(1);
        Duration::from_millis(ms)
    }
}

/// The decoded fields of a payload (borrowing the room).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Payload<'a> {
    pub(crate) version: u8,
    pub(crate) kid: u8,
    pub(crate) room: &'a [u8],
    pub(crate) puzzles: u8,
    pub(crate) bits: u8,
    pub(crate) issued_ms: u64,
    pub(crate) ttl_ms: u32,
    pub(crate) min_solve_ms: u32,
    pub(crate) id: [u8; 16],
}

impl<'a> Payload<'a> {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED_LEN + self.room.len());
        out.push(self.version);
        out.push(self.kid);
        // The caller checked room.len() <= MAX_ROOM_LEN (64).
        out.push(u8::try_from(self.room.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(self.room);
        out.push(self.puzzles);
        out.push(self.bits);
        out.extend_from_slice(&self.issued_ms.to_be_bytes());
        out.extend_from_slice(&self.ttl_ms.to_be_bytes());
        out.extend_from_slice(&self.min_solve_ms.to_be_bytes());
        out.extend_from_slice(&self.id);
        out
    }

    /// Decodes a payload; only the layout is checked here.
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<Self, PowError> {
        let (&version, rest) = bytes
            .split_first()
            .ok_or(PowError::Malformed("empty payload"))?;
        if version != VERSION {
            return Err(PowError::UnknownVersion(version));
        }
        let [kid, room_len, rest @ ..] = rest else {
            return Err(PowError::Malformed("payload too short"));
        };
        let room_len = usize::from(*room_len);
        if room_len > MAX_ROOM_LEN || rest.len() != FIXED_LEN - 3 + room_len {
            return Err(PowError::Malformed("payload length"));
        }
        let (room, rest) = rest.split_at(room_len);
        let mut r = Reader(rest);
        Ok(Payload {
            version,
            kid: *kid,
            room,
            puzzles: r.u8(),
            bits: r.u8(),
            issued_ms: u64::from_be_bytes(r.array()),
            ttl_ms: u32::from_be_bytes(r.array()),
            min_solve_ms: u32::from_be_bytes(r.array()),
            id: r.array(),
        })
    }
}

/// Reads fixed fields from a slice whose length was checked beforehand.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }
}

/// One key: its id and the keyed HMAC state (cloned per use, so the key
/// schedule runs once).
#[derive(Clone)]
struct Key {
    kid: u8,
    mac: HmacSha256,
}

impl Key {
    fn new(kid: u8, secret: &[u8]) -> Result<Self, KeysetError> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(KeysetError::ShortSecret(kid));
        }
        let mut derive = <HmacSha256 as KeyInit>::new_from_slice(secret)
            .map_err(|_| KeysetError::ShortSecret(kid))?;
        derive.update(KEY_CONTEXT);
        let key = derive.finalize().into_bytes();
        let mac = <HmacSha256 as KeyInit>::new_from_slice(&key)
            .map_err(|_| KeysetError::ShortSecret(kid))?;
        Ok(Key { kid, mac })
    }
}

/// The HMAC keys that sign and verify challenges: one current key and up
/// to two older, verify-only ones.
#[derive(Clone)]
pub struct Keyset {
    current: Key,
    older: Vec<Key>,
}

impl std::fmt::Debug for Keyset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyset")
            .field("current_kid", &self.current.kid)
            .field(
                "older_kids",
                &self.older.iter().map(|k| k.kid).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// The key id derived from a secret: the first byte of its SHA-256.
pub fn kid_for_secret(secret: &[u8]) -> u8 {
    Sha256::digest(secret)[0]
}

impl Keyset {
    /// A keyset of one secret (at least 16 bytes), its kid derived from it.
    pub fn from_secret(secret: &[u8]) -> Result<Self, KeysetError> {
        Self::with_keys((kid_for_secret(secret), secret.to_vec()), Vec::new())
    }

    /// A keyset signing with `current` and still verifying the `older`
    /// secrets (at most two), every kid derived from its secret.
    pub fn from_secrets(current: &[u8], older: &[&[u8]]) -> Result<Self, KeysetError> {
        Self::with_keys(
            (kid_for_secret(current), current.to_vec()),
            older
                .iter()
                .map(|s| (kid_for_secret(s), s.to_vec()))
                .collect(),
        )
    }

    /// A keyset with explicit key ids.
    pub fn with_keys(
        current: (u8, Vec<u8>),
        older: Vec<(u8, Vec<u8>)>,
    ) -> Result<Self, KeysetError> {
        if older.len() > 2 {
            return Err(KeysetError::TooManyOlder(older.len()));
        }
        let current = Key::new(current.0, &current.1)?;
        let mut keys: Vec<Key> = Vec::with_capacity(older.len());
        for (kid, secret) in older {
            if kid == current.kid || keys.iter().any(|k| k.kid == kid) {
                return Err(KeysetError::DuplicateKid(kid));
            }
            keys.push(Key::new(kid, &secret)?);
        }
        Ok(Keyset {
            current,
            older: keys,
        })
    }

    /// A keyset of one fresh random 32-byte secret: for a single gateway
    /// (challenges die with the process, which is harmless).
    pub fn random() -> Self {
        let secret: [u8; 32] = rand::random();
        let key = Key::new(kid_for_secret(&secret), &secret);
        match key {
            Ok(current) => Keyset {
                current,
                older: Vec::new(),
            },
            // 32 bytes always pass the length check.
            Err(_) => unreachable!("a 32-byte secret is long enough"),
        }
    }

    /// The kid of the signing key.
    pub fn current_kid(&self) -> u8 {
        self.current.kid
    }

    fn key(&self, kid: u8) -> Option<&Key> {
        if self.current.kid == kid {
            return Some(&self.current);
        }
        self.older.iter().find(|k| k.kid == kid)
    }

    /// Issues a challenge for `spec` at `now_unix_ms`, with fresh random
    /// bytes as its id.
    pub fn issue(
        &self,
        spec: &ChallengeSpec,
        now_unix_ms: u64,
    ) -> Result<IssuedChallenge, SpecError> {
        self.issue_with_id(spec, now_unix_ms, rand::random())
    }

    /// Issues a challenge with the given id bytes. Deterministic: for test
    /// vectors. Production code uses [`Keyset::issue`]: ids must never
    /// repeat.
    pub fn issue_with_id(
        &self,
        spec: &ChallengeSpec,
        now_unix_ms: u64,
        id: [u8; 16],
    ) -> Result<IssuedChallenge, SpecError> {
        spec.validate()?;
        let ttl_ms = u32::try_from(spec.ttl.as_millis()).map_err(|_| SpecError::Ttl)?;
        let min_solve_ms =
            u32::try_from(spec.min_solve.as_millis()).map_err(|_| SpecError::MinSolve)?;
        let payload = Payload {
            version: VERSION,
            kid: self.current.kid,
            room: spec.room.as_bytes(),
            puzzles: spec.puzzles,
            bits: spec.difficulty_bits,
            issued_ms: now_unix_ms,
            ttl_ms,
            min_solve_ms,
            id,
        }
        .encode();
        let mut mac = self.current.mac.clone();
        mac.update(&payload);
        let tag = mac.finalize().into_bytes();
        let mut challenge =
            String::with_capacity((payload.len() * 4).div_ceil(3) + 1 + TAG_B64_LEN);
        URL_SAFE_NO_PAD.encode_string(&payload, &mut challenge);
        challenge.push('.');
        URL_SAFE_NO_PAD.encode_string(tag, &mut challenge);
        let expires_at_ms = now_unix_ms.saturating_add(u64::from(ttl_ms));
        Ok(IssuedChallenge {
            challenge,
            puzzles: spec.puzzles,
            difficulty_bits: spec.difficulty_bits,
            expires_at: expires_at_ms / 1000,
            expires_at_ms,
            id,
        })
    }

    /// Signs arbitrary payload bytes with the current key: a challenge
    /// string that passes the tag check whatever its content. Only for
    /// tests that drive the post-authentication checks with hostile values.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn sign_raw_payload(&self, payload: &[u8]) -> String {
        let mut mac = self.current.mac.clone();
        mac.update(payload);
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    /// Verifies `challenge` and its `solutions` for `room` at `now_unix_ms`.
    ///
    /// Checks, in order, stopping at the first failure: sizes (challenge at
    /// most [`MAX_CHALLENGE_LEN`] bytes, at most [`MAX_PUZZLES`] solutions)
    /// and layout, version, kid, the HMAC tag (constant time), issue time
    /// not beyond [`CLOCK_SKEW`] in the future, expiry, minimum solve age,
    /// room, solution count, each solution canonical, each hash's leading
    /// zero bits. Costs one HMAC and `k` SHA-256 tails. Writes nothing:
    /// pair it with a replay guard ([`crate::redeem`]).
    pub fn verify<S: AsRef<str>>(
        &self,
        challenge: &str,
        solutions: &[S],
        room: &str,
        now_unix_ms: u64,
    ) -> Result<Verified, PowError> {
        if challenge.len() > MAX_CHALLENGE_LEN {
            return Err(PowError::Malformed("challenge too long"));
        }
        if solutions.len() > MAX_PUZZLES {
            return Err(PowError::Malformed("too many solutions"));
        }
        let (payload_b64, tag_b64) = challenge
            .split_once('.')
            .ok_or(PowError::Malformed("no tag separator"))?;
        if payload_b64.len() > (MAX_PAYLOAD_LEN * 4).div_ceil(3) || tag_b64.len() != TAG_B64_LEN {
            return Err(PowError::Malformed("part length"));
        }
        let mut payload_buf = [0u8; MAX_PAYLOAD_LEN + 3];
        let n = URL_SAFE_NO_PAD
            .decode_slice(payload_b64, &mut payload_buf)
            .map_err(|_| PowError::Malformed("payload base64"))?;
        let payload_bytes = &payload_buf[..n];
        let mut tag = [0u8; TAG_LEN + 3];
        let tag_len = URL_SAFE_NO_PAD
            .decode_slice(tag_b64, &mut tag)
            .map_err(|_| PowError::Malformed("tag base64"))?;
        if tag_len != TAG_LEN {
            return Err(PowError::Malformed("tag length"));
        }
        let p = Payload::decode(payload_bytes)?;
        let key = self.key(p.kid).ok_or(PowError::UnknownKey(p.kid))?;
        let mut mac = key.mac.clone();
        mac.update(payload_bytes);
        // `verify_slice` compares in constant time.
        mac.verify_slice(&tag[..TAG_LEN])
            .map_err(|_| PowError::BadTag)?;

        // Authenticated from here on.
        let skew = u64::try_from(CLOCK_SKEW.as_millis()).unwrap_or(u64::MAX);
        if p.issued_ms > now_unix_ms.saturating_add(skew) {
            return Err(PowError::FutureDated {
                ahead_ms: p.issued_ms - now_unix_ms,
            });
        }
        let expires_at_ms = p.issued_ms.saturating_add(u64::from(p.ttl_ms));
        if now_unix_ms >= expires_at_ms {
            return Err(PowError::Expired {
                late_ms: now_unix_ms - expires_at_ms,
            });
        }
        if p.room != room.as_bytes() {
            return Err(PowError::WrongRoom);
        }
        let k = usize::from(p.puzzles);
        if solutions.len() != k || k == 0 || k > MAX_PUZZLES {
            return Err(PowError::WrongCount {
                expected: k,
                got: solutions.len(),
            });
        }
        for (index, s) in solutions.iter().enumerate() {
            if parse_canonical_u64(s.as_ref()).is_none() {
                return Err(PowError::NonCanonicalSolution { index });
            }
        }
        let base = ChallengeHasher::new(challenge);
        for (index, s) in solutions.iter().enumerate() {
            // index < k <= 64, so it fits a u8.
            let i = u8::try_from(index).map_err(|_| PowError::Malformed("index"))?;
            let hash = base.puzzle(i).hash_digits(s.as_ref().as_bytes());
            if !meets_difficulty(&hash, p.bits) {
                return Err(PowError::InsufficientWork { index });
            }
        }
        // Last, once the work is known good: "too early" tells the client
        // only to come back with the same solution (the guard is not
        // touched), so it must not be answered to a solution that fails.
        let elapsed_ms = now_unix_ms.saturating_sub(p.issued_ms);
        if elapsed_ms < u64::from(p.min_solve_ms) {
            return Err(PowError::TooFast {
                elapsed_ms,
                min_ms: u64::from(p.min_solve_ms),
            });
        }
        Ok(Verified {
            id: p.id,
            expires_at_ms,
            issued_at_ms: p.issued_ms,
            puzzles: p.puzzles,
            difficulty_bits: p.bits,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::solver::solve;

    const NOW: u64 = 1_800_000_000_000;

    fn spec(bits: u8) -> ChallengeSpec {
        ChallengeSpec {
            room: "drop".into(),
            puzzles: 4,
            difficulty_bits: bits,
            ttl: Duration::from_secs(60),
            min_solve: Duration::ZERO,
        }
    }

    fn keys() -> Keyset {
        Keyset::from_secret(b"0123456789abcdef0123456789abcdef").unwrap()
    }

    #[test]
    fn roundtrip() {
        let ks = keys();
        let c = ks.issue(&spec(6), NOW).unwrap();
        assert!(c.challenge.is_ascii());
        assert_eq!(c.expires_at, (NOW + 60_000) / 1000);
        let sol = solve(&c.challenge, 4, 6, 1);
        let v = ks.verify(&c.challenge, &sol, "drop", NOW + 1000).unwrap();
        assert_eq!(v.id, c.id);
        assert_eq!(v.expires_at_ms, NOW + 60_000);
    }

    #[test]
    fn challenge_is_short() {
        let c = keys().issue(&spec(6), NOW).unwrap();
        // 4-byte room: 41-byte payload -> 55 chars, '.', 43 chars.
        assert_eq!(c.challenge.len(), 55 + 1 + 43);
        let long = ChallengeSpec {
            room: "r".repeat(MAX_ROOM_LEN),
            ..spec(6)
        };
        let c = keys().issue(&long, NOW).unwrap();
        assert!(c.challenge.len() < 200 && c.challenge.len() <= MAX_CHALLENGE_LEN);
    }

    #[test]
    fn spec_limits() {
        let ks = keys();
        let too_long = ChallengeSpec {
            room: "r".repeat(MAX_ROOM_LEN + 1),
            ..spec(6)
        };
        assert_eq!(ks.issue(&too_long, NOW), Err(SpecError::RoomTooLong(65)));
        assert_eq!(
            ks.issue(
                &ChallengeSpec {
                    puzzles: 0,
                    ..spec(6)
                },
                NOW
            ),
            Err(SpecError::Puzzles(0))
        );
        assert_eq!(
            ks.issue(
                &ChallengeSpec {
                    puzzles: 65,
                    ..spec(6)
                },
                NOW
            ),
            Err(SpecError::Puzzles(65))
        );
        assert_eq!(
            ks.issue(
                &ChallengeSpec {
                    ttl: Duration::ZERO,
                    ..spec(6)
                },
                NOW
            ),
            Err(SpecError::Ttl)
        );
        let ms = ChallengeSpec {
            min_solve: Duration::from_secs(60),
            ..spec(6)
        };
        assert_eq!(ks.issue(&ms, NOW), Err(SpecError::MinSolve));
    }

    #[test]
    fn time_window() {
        let ks = keys();
        let c = ks.issue(&spec(4), NOW).unwrap();
        let sol = solve(&c.challenge, 4, 4, 1);
        // Within the skew allowance: fine.
        assert!(ks.verify(&c.challenge, &sol, "drop", NOW - 4_000).is_ok());
        let e = ks
            .verify(&c.challenge, &sol, "drop", NOW - 6_000)
            .unwrap_err();
        assert!(matches!(e, PowError::FutureDated { .. }), "{e}");
        assert!(ks.verify(&c.challenge, &sol, "drop", NOW + 59_999).is_ok());
        let e = ks
            .verify(&c.challenge, &sol, "drop", NOW + 60_000)
            .unwrap_err();
        assert_eq!(e.code(), "pow_expired");
    }

    #[test]
    fn min_solve_age() {
        let ks = keys();
        let s = ChallengeSpec {
            min_solve: Duration::from_secs(2),
            ..spec(4)
        };
        let c = ks.issue(&s, NOW).unwrap();
        let sol = solve(&c.challenge, 4, 4, 1);
        let e = ks
            .verify(&c.challenge, &sol, "drop", NOW + 1_999)
            .unwrap_err();
        assert!(
            matches!(
                e,
                PowError::TooFast {
                    elapsed_ms: 1999,
                    min_ms: 2000
                }
            ),
            "{e}"
        );
        assert!(ks.verify(&c.challenge, &sol, "drop", NOW + 2_000).is_ok());
        assert_eq!(e.code(), "pow_too_early");
        assert_eq!(e.retry_after_ms(), Some(1));
        // a wrong solution sent early is refused as wrong, never "too early":
        // "come back later" is only ever said of work that is good
        // (a counter that is really wrong: at 4 bits one in 16 neighbours of
        // a solution solves the puzzle too, and is then good work)
        let mut bad = sol.clone();
        let mut n = bad[0].parse::<u64>().unwrap();
        loop {
            n += 1;
            bad[0] = n.to_string();
            if ks.verify(&c.challenge, &bad, "drop", NOW + 2_000).is_err() {
                break;
            }
        }
        for early in [0, 500, 1_999] {
            let e = ks.verify(&c.challenge, &bad, "drop", NOW + early);
            assert!(matches!(e, Err(PowError::InsufficientWork { .. })), "{e:?}");
            let e = ks
                .verify(&c.challenge, &sol[..3], "drop", NOW + early)
                .unwrap_err();
            assert_eq!(e.code(), "pow_invalid");
        }
    }

    #[test]
    fn rotation() {
        let old = Keyset::from_secret(b"old secret, sixteen+ bytes").unwrap();
        let c = old.issue(&spec(4), NOW).unwrap();
        let sol = solve(&c.challenge, 4, 4, 1);
        let rotated = Keyset::from_secrets(
            b"new secret, sixteen+ bytes",
            &[b"old secret, sixteen+ bytes"],
        )
        .unwrap();
        assert!(rotated.verify(&c.challenge, &sol, "drop", NOW).is_ok());
        let fresh = Keyset::from_secret(b"new secret, sixteen+ bytes").unwrap();
        let e = fresh.verify(&c.challenge, &sol, "drop", NOW).unwrap_err();
        assert!(matches!(e, PowError::UnknownKey(_)), "{e}");
        // Same kid, different secret: the tag fails.
        let forged = Keyset::with_keys(
            (old.current_kid(), b"another secret, long enough".to_vec()),
            vec![],
        )
        .unwrap();
        let e = forged.verify(&c.challenge, &sol, "drop", NOW).unwrap_err();
        assert!(matches!(e, PowError::BadTag), "{e}");
    }

    #[test]
    fn keyset_errors() {
        assert_eq!(
            Keyset::from_secret(b"short").unwrap_err(),
            KeysetError::ShortSecret(kid_for_secret(b"short"))
        );
        let s = b"0123456789abcdef".to_vec();
        assert_eq!(
            Keyset::with_keys((1, s.clone()), vec![(1, s.clone())]).unwrap_err(),
            KeysetError::DuplicateKid(1)
        );
        assert_eq!(
            Keyset::with_keys((1, s.clone()), vec![(2, s.clone()), (3, s.clone()), (4, s)])
                .unwrap_err(),
            KeysetError::TooManyOlder(3)
        );
        assert!(!format!("{:?}", keys()).contains("0123"));
    }

    #[test]
    fn wrong_room_count_and_work() {
        let ks = keys();
        let c = ks.issue(&spec(8), NOW).unwrap();
        let sol = solve(&c.challenge, 4, 8, 2);
        assert!(matches!(
            ks.verify(&c.challenge, &sol, "other", NOW),
            Err(PowError::WrongRoom)
        ));
        assert!(matches!(
            ks.verify(&c.challenge, &sol[..3], "drop", NOW),
            Err(PowError::WrongCount {
                expected: 4,
                got: 3
            })
        ));
        let mut bad = sol.clone();
        bad[2] = format!("0{}", bad[2]);
        assert_eq!(
            ks.verify(&c.challenge, &bad, "drop", NOW)
                .unwrap_err()
                .code(),
            "malformed_request"
        );
        // A counter that misses the target (at b = 8 most do).
        let mut miss = sol.clone();
        let n: u64 = sol[1].parse().unwrap();
        let h = crate::hash::PuzzleHasher::new(&c.challenge, 1);
        let wrong = (n + 1..)
            .find(|&m| !meets_difficulty(&h.hash(m), 8))
            .unwrap();
        miss[1] = wrong.to_string();
        assert!(matches!(
            ks.verify(&c.challenge, &miss, "drop", NOW),
            Err(PowError::InsufficientWork { index: 1 })
        ));
    }

    #[test]
    fn size_bounds_before_decoding() {
        let ks = keys();
        let long = "a".repeat(MAX_CHALLENGE_LEN + 1);
        assert!(matches!(
            ks.verify::<&str>(&long, &[], "drop", NOW),
            Err(PowError::Malformed(_))
        ));
        let c = ks.issue(&spec(4), NOW).unwrap();
        let many = vec!["0"; 65];
        assert!(matches!(
            ks.verify(&c.challenge, &many, "drop", NOW),
            Err(PowError::Malformed(_))
        ));
    }

    #[test]
    fn unknown_version() {
        let ks = keys();
        let c = ks.issue(&spec(4), NOW).unwrap();
        let (p, t) = c.challenge.split_once('.').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(p).unwrap();
        bytes[0] = 2;
        let forged = format!("{}.{t}", URL_SAFE_NO_PAD.encode(&bytes));
        assert!(matches!(
            ks.verify::<&str>(&forged, &[], "drop", NOW),
            Err(PowError::UnknownVersion(2))
        ));
    }

    #[test]
    fn payload_decode_roundtrip() {
        let p = Payload {
            version: VERSION,
            kid: 9,
            room: b"room",
            puzzles: 16,
            bits: 18,
            issued_ms: NOW,
            ttl_ms: 300_000,
            min_solve_ms: 1500,
            id: [7; 16],
        };
        let bytes = p.encode();
        assert_eq!(Payload::decode(&bytes).unwrap(), p);
        for cut in 0..bytes.len() {
            assert!(Payload::decode(&bytes[..cut]).is_err());
        }
    }
}
