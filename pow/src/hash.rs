//! The puzzle hash: `SHA-256(challenge ":" i ":" n)` and its leading zero
//! bits.
//!
//! The prefix `challenge ":" i ":"` is constant for a puzzle, so it is
//! absorbed once ([`PuzzleHasher::new`]) and the hasher state is cloned per
//! counter: only the tail (the counter's digits and SHA-256 padding) is
//! compressed again.

use sha2::{Digest, Sha256};

/// Leading zero bits of `bytes`, counted from the most significant bit of
/// the first byte (the order API.md specifies).
pub fn leading_zero_bits(bytes: &[u8]) -> u32 {
    let mut bits = 0;
    for &b in bytes {
        if b == 0 {
            bits += 8;
        } else {
            return bits + b.leading_zeros();
        }
    }
    bits
}

/// Whether `hash` begins with at least `bits` zero bits. Faster than
/// comparing [`leading_zero_bits`] because it stops at the first byte that
/// decides.
#[inline]
pub fn meets_difficulty(hash: &[u8], bits: u8) -> bool {
    let full = usize::from(bits / 8);
    let rest = bits % 8;
    if hash.len() * 8 < usize::from(bits) {
        return false;
    }
    if hash[..full].iter().any(|&b| b != 0) {
        return false;
    }
    rest == 0 || hash[full] >> (8 - rest) == 0
}

/// Writes `n` in decimal into the end of `buf`, returning the digits.
#[inline]
pub(crate) fn decimal(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        // n % 10 < 10, so the cast cannot truncate.
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Parses a canonical decimal `u64`: ASCII digits only, no sign, no
/// leading zero (except `"0"` itself), at most 20 digits, no overflow.
pub fn parse_canonical_u64(s: &str) -> Option<u64> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    if bytes.len() > 1 && bytes[0] == b'0' {
        return None;
    }
    let mut n: u64 = 0;
    for &c in bytes {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(n)
}

/// A SHA-256 state that has absorbed a challenge; [`ChallengeHasher::puzzle`]
/// extends it to one puzzle's constant prefix.
#[derive(Clone)]
pub struct ChallengeHasher(Sha256);

impl ChallengeHasher {
    /// Absorbs `challenge`.
    pub fn new(challenge: &str) -> Self {
        let mut h = Sha256::new();
        h.update(challenge.as_bytes());
        ChallengeHasher(h)
    }

    /// The hasher for puzzle `index`: state after `challenge ":" index ":"`.
    pub fn puzzle(&self, index: u8) -> PuzzleHasher {
        let mut h = self.0.clone();
        let mut buf = [0u8; 20];
        h.update(b":");
        h.update(decimal(u64::from(index), &mut buf));
        h.update(b":");
        PuzzleHasher(h)
    }
}

/// A SHA-256 state that has absorbed one puzzle's constant prefix
/// `challenge ":" i ":"`.
#[derive(Clone)]
pub struct PuzzleHasher(Sha256);

impl PuzzleHasher {
    /// The prefix state for puzzle `index` of `challenge`.
    pub fn new(challenge: &str, index: u8) -> Self {
        ChallengeHasher::new(challenge).puzzle(index)
    }

    /// `SHA-256(challenge ":" i ":" digits)` for counter digits as given.
    #[inline]
    pub fn hash_digits(&self, digits: &[u8]) -> [u8; 32] {
        let mut h = self.0.clone();
        h.update(digits);
        h.finalize().into()
    }

    /// `SHA-256(challenge ":" i ":" n)` with `n` in canonical decimal.
    #[inline]
    pub fn hash(&self, n: u64) -> [u8; 32] {
        let mut buf = [0u8; 20];
        self.hash_digits(decimal(n, &mut buf))
    }
}

/// The full puzzle hash, computed the plain way (for tests and vectors).
pub fn puzzle_hash(challenge: &str, index: u8, n: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(format!("{challenge}:{index}:{n}").as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn zero_bits() {
        assert_eq!(leading_zero_bits(&[]), 0);
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0x01]), 7);
        assert_eq!(leading_zero_bits(&[0, 0, 0x10]), 19);
        assert_eq!(leading_zero_bits(&[0; 32]), 256);
    }

    #[test]
    fn meets_agrees_with_count() {
        let samples: [&[u8]; 5] = [
            &[0x80, 0],
            &[0, 0x01],
            &[0, 0, 0x10],
            &[0x0f, 0xff],
            &[0, 0],
        ];
        for s in samples {
            for bits in 0..=17u8 {
                assert_eq!(
                    meets_difficulty(s, bits),
                    leading_zero_bits(s) >= u32::from(bits),
                    "{s:?} {bits}"
                );
            }
        }
    }

    #[test]
    fn canonical() {
        assert_eq!(parse_canonical_u64("0"), Some(0));
        assert_eq!(parse_canonical_u64("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "00",
            "01",
            "-1",
            "+1",
            " 1",
            "1 ",
            "18446744073709551616",
            "1e3",
            "٣",
        ] {
            assert_eq!(parse_canonical_u64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decimal_roundtrip() {
        let mut buf = [0u8; 20];
        for n in [0, 9, 10, 12345, u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
    }

    #[test]
    fn prefix_state_matches_plain_hash() {
        let ch = "abc.def";
        for i in [0u8, 7, 63] {
            let h = PuzzleHasher::new(ch, i);
            for n in [0u64, 1, 99, 1 << 40] {
                assert_eq!(h.hash(n), puzzle_hash(ch, i, n));
            }
        }
    }
}
