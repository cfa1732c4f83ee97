//! Property tests of issue/verify: honest solutions verify; any change to
//! one byte of the challenge or of a solution fails; time, room and key
//! checks answer with the right code; no input makes verify panic.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use sluice_pow::hash::{PuzzleHasher, meets_difficulty};
use sluice_pow::{ChallengeSpec, Keyset, PowError, solve};

const NOW: u64 = 1_800_000_000_000;
const SECRET: &[u8] = b"proptest secret, long enough";

fn keys() -> Keyset {
    Keyset::from_secret(SECRET).unwrap()
}

fn spec(room: &str, puzzles: u8, bits: u8) -> ChallengeSpec {
    ChallengeSpec {
        room: room.to_string(),
        puzzles,
        difficulty_bits: bits,
        ttl: Duration::from_secs(120),
        min_solve: Duration::ZERO,
    }
}

fn room() -> impl Strategy<Value = String> {
    "[a-z0-9_-]{1,64}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn honest_solutions_verify(room in room(), k in 1u8..=8, bits in 4u8..=8, issued in 0u64..=NOW, delay in 0u64..120_000) {
        let ks = keys();
        let c = ks.issue(&spec(&room, k, bits), issued).unwrap();
        let sol = solve(&c.challenge, k, bits, 1);
        let v = ks.verify(&c.challenge, &sol, &room, issued + delay).unwrap();
        prop_assert_eq!(v.id, c.id);
        prop_assert_eq!(v.puzzles, k);
        prop_assert_eq!(v.difficulty_bits, bits);
    }

    #[test]
    fn any_challenge_byte_change_fails(k in 1u8..=4, pos in any::<prop::sample::Index>(), replacement in 0x20u8..0x7f) {
        let ks = keys();
        let c = ks.issue(&spec("drop", k, 4), NOW).unwrap();
        let sol = solve(&c.challenge, k, 4, 1);
        let mut bytes = c.challenge.clone().into_bytes();
        let i = pos.index(bytes.len());
        prop_assume!(bytes[i] != replacement);
        bytes[i] = replacement;
        let mutated = String::from_utf8(bytes).unwrap();
        let err = ks.verify(&mutated, &sol, "drop", NOW).unwrap_err();
        prop_assert!(matches!(err.code(), "pow_invalid" | "malformed_request"), "{err}");
    }

    #[test]
    fn any_solution_byte_change_fails(k in 1u8..=4, which in any::<prop::sample::Index>(), pos in any::<prop::sample::Index>(), replacement in any::<char>()) {
        let ks = keys();
        let bits = 8;
        let c = ks.issue(&spec("drop", k, bits), NOW).unwrap();
        let mut sol = solve(&c.challenge, k, bits, 1);
        let w = which.index(sol.len());
        let mut chars: Vec<char> = sol[w].chars().collect();
        let i = pos.index(chars.len());
        prop_assume!(chars[i] != replacement);
        chars[i] = replacement;
        sol[w] = chars.into_iter().collect();
        let res = ks.verify(&c.challenge, &sol, "drop", NOW);
        // The only way through: the new string is itself a canonical counter
        // that happens to meet the target (probability 2^-8).
        let still_valid = sluice_pow::parse_canonical_u64(&sol[w])
            .is_some_and(|n| meets_difficulty(&PuzzleHasher::new(&c.challenge, u8::try_from(w).unwrap()).hash(n), bits));
        prop_assert_eq!(res.is_ok(), still_valid, "{:?}", res);
    }

    #[test]
    fn expired_and_future_dated(after in 120_000u64..10_000_000, before in 5_001u64..10_000_000) {
        let ks = keys();
        let c = ks.issue(&spec("drop", 2, 4), NOW).unwrap();
        let sol = solve(&c.challenge, 2, 4, 1);
        let e = ks.verify(&c.challenge, &sol, "drop", NOW + after).unwrap_err();
        prop_assert_eq!(e.code(), "pow_expired");
        let expired = matches!(e, PowError::Expired { .. });
        prop_assert!(expired);
        let e = ks.verify(&c.challenge, &sol, "drop", NOW - before).unwrap_err();
        prop_assert_eq!(e.code(), "pow_invalid");
        let future = matches!(e, PowError::FutureDated { .. });
        prop_assert!(future);
    }

    #[test]
    fn wrong_room(a in room(), b in room()) {
        prop_assume!(a != b);
        let ks = keys();
        let c = ks.issue(&spec(&a, 2, 4), NOW).unwrap();
        let sol = solve(&c.challenge, 2, 4, 1);
        let e = ks.verify(&c.challenge, &sol, &b, NOW).unwrap_err();
        prop_assert!(matches!(e, PowError::WrongRoom));
        prop_assert_eq!(e.code(), "pow_invalid");
    }

    #[test]
    fn wrong_key(secret in prop::collection::vec(any::<u8>(), 16..48), kid in any::<u8>()) {
        prop_assume!(secret != SECRET);
        let ks = keys();
        let c = ks.issue(&spec("drop", 2, 4), NOW).unwrap();
        let sol = solve(&c.challenge, 2, 4, 1);
        // Another secret under the same kid: bad tag.
        let same_kid = Keyset::with_keys((ks.current_kid(), secret.clone()), vec![]).unwrap();
        let e = same_kid.verify(&c.challenge, &sol, "drop", NOW).unwrap_err();
        prop_assert!(matches!(e, PowError::BadTag), "{e}");
        prop_assert_eq!(e.code(), "pow_invalid");
        // Another kid entirely: unknown key.
        prop_assume!(kid != ks.current_kid());
        let other = Keyset::with_keys((kid, secret), vec![]).unwrap();
        let e = other.verify(&c.challenge, &sol, "drop", NOW).unwrap_err();
        prop_assert!(matches!(e, PowError::UnknownKey(k) if k == ks.current_kid()), "{e}");
        prop_assert_eq!(e.code(), "pow_invalid");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_strings_never_panic(challenge in ".{0,600}", sols in prop::collection::vec(".{0,24}", 0..70), room in ".{0,70}", now in any::<u64>()) {
        let _ = keys().verify(&challenge, &sols, &room, now);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), now in any::<u64>()) {
        let s = String::from_utf8_lossy(&bytes);
        let _ = keys().verify(&s, &["0"], "drop", now);
    }

    #[test]
    fn base64_shaped_garbage_never_panics(payload in "[A-Za-z0-9_-]{0,140}", tag in "[A-Za-z0-9_-]{40,46}", now in any::<u64>()) {
        let _ = keys().verify(&format!("{payload}.{tag}"), &["1", "2"], "drop", now);
    }

    /// Authenticated payloads with hostile field values (k = 0, k > 64,
    /// b = 255, ttl = 0, issue time at the edges of u64): still no panic,
    /// and nothing passes that should not.
    #[test]
    fn signed_hostile_payloads_never_panic(
        room in prop::collection::vec(any::<u8>(), 0..70),
        k in any::<u8>(),
        bits in any::<u8>(),
        issued in prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
        ttl in any::<u32>(),
        min_solve in any::<u32>(),
        now in prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
        sols in prop::collection::vec("0|[1-9][0-9]{0,19}", 0..66),
    ) {
        let ks = keys();
        let mut p = vec![1u8, ks.current_kid(), u8::try_from(room.len()).unwrap()];
        p.extend_from_slice(&room);
        p.extend_from_slice(&[k, bits]);
        p.extend_from_slice(&issued.to_be_bytes());
        p.extend_from_slice(&ttl.to_be_bytes());
        p.extend_from_slice(&min_solve.to_be_bytes());
        p.extend_from_slice(&[9u8; 16]);
        let challenge = ks.sign_raw_payload(&p);
        let room_str = String::from_utf8_lossy(&room).into_owned();
        if let Ok(v) = ks.verify(&challenge, &sols, &room_str, now) {
            prop_assert_eq!(usize::from(v.puzzles), sols.len());
            prop_assert!(v.puzzles >= 1 && v.puzzles <= 64);
            prop_assert!(now < v.expires_at_ms);
        }
    }
}

#[test]
fn regression_empty_and_dots() {
    let ks = keys();
    for s in [
        "",
        ".",
        "..",
        "a.b.c",
        "AQ.",
        ".AAAA",
        "AQE.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ] {
        let e = ks.verify(s, &["0"], "drop", NOW).unwrap_err();
        assert_eq!(e.code(), "malformed_request", "{s:?}: {e}");
    }
}
