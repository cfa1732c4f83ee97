//! The pre-queue of a scheduled room: a verifiable random draw.
//!
//! Visitors who arrive before a room opens get pre-queue tickets numbered
//! 0, 1, 2… in arrival order. Before the opening the operator publishes
//! [`commitment`]`(seed)` (the hex SHA-256 of a secret seed); at the opening
//! the tickets are ordered by [`shuffle_order`]`(seed, n)` and the seed is
//! revealed, so anyone can check both that the seed matches the commitment
//! and that the order follows from it. Arriving early buys a place in the
//! draw, not the front of the line.
//!
//! # The algorithm (stable: changing it breaks published draws)
//!
//! A stream of 64-bit words: block `c` (c = 0, 1, …) is
//! `SHA-256("sluice-prequeue-v1" ‖ seed ‖ c as 8 bytes big-endian)`, read as
//! four big-endian u64 words; the stream is the words of block 0, then of
//! block 1, and so on. Start from `order = [0, 1, …, n−1]`; for `i` from
//! `n−1` down to 1, draw words until one, `w`, is below
//! `2⁶⁴ − (2⁶⁴ mod (i+1))` (rejection keeps the draw unbiased), and swap
//! `order[i]` with `order[w mod (i+1)]` (Fisher–Yates). `order[k]` is the
//! ticket that gets the k-th place (k = 0 first).
//!
//! # In the queue
//!
//! The store keeps dealing in *places* (frontier positions). When a
//! scheduled room opens, the first store operation at or after the opening
//! records the [`PrequeueDraw`] once: `from` (the frontier then: places up
//! to it were admitted before) and `n` (the seqs `from+1 ..= from+n` joined
//! before the opening: the tickets; ticket index = `seq − from − 1`). Place
//! `from + 1 + k` belongs to the ticket `order[k]`; every other seq keeps
//! place = seq (FIFO). A [`PlaceMap`] answers seq → place.
//!
//! # Rolling draws (the `random` queueing method)
//!
//! A `random` room draws again and again. Its frontier never passes the
//! end of the current draw (`from + n`); the first operation that finds
//! the draw exhausted, somebody waiting, and at least a second since the
//! last draw records the next one, `k + 1`: from the frontier then, over
//! everyone who joined meanwhile. So every seq is in exactly one draw (or
//! in none, when it was admitted before the room became `random`: its
//! place is its seq), and each draw's places are a permutation of its own
//! seqs. Draw `k`'s order is [`shuffle_order`] with [`draw_seed`]`(room
//! seed, k)`. The stores keep the draws made within
//! [`RoomSettings::lane_keep`](crate::RoomSettings) (a token of an older
//! one can no longer be presented) for [`crate::QueueStore::draw_of`].

use rand::Rng as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest pre-queue a draw covers (tickets are `u32` indices).
pub const MAX_TICKETS: u64 = u32::MAX as u64;

/// A recorded draw: seqs `from+1 ..= from+n` are its tickets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrequeueDraw {
    /// The frontier when the draw was made (seqs up to it were admitted
    /// before; 0 for a room that opens for the first time).
    pub from: u64,
    /// How many tickets the draw orders.
    pub n: u64,
    /// The draw's index: 0 for a scheduled room's pre-queue (and a room
    /// that never drew), then 1, 2, … for the rolling draws of a `random`
    /// room ("Rolling draws" above). Left out of the JSON while 0, so a
    /// FIFO room's hint reads as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub k: u64,
}

fn is_zero(k: &u64) -> bool {
    *k == 0
}

impl PrequeueDraw {
    /// Whether `seq` holds a ticket of this draw.
    pub fn contains(&self, seq: u64) -> bool {
        seq > self.from && seq - self.from <= self.n
    }

    /// The last seq (and place) of the draw: `from + n`.
    pub fn end(&self) -> u64 {
        self.from.saturating_add(self.n)
    }
}

/// The seed of draw `k` of a `random` room whose seed is `room_seed`:
/// `SHA-256("sluice-draw-v1" ‖ room seed ‖ k as 8 bytes big-endian)`.
/// Knowing one draw's seed tells nothing of the next; the room's seed,
/// revealed when the room closes, lets anyone recompute them all.
pub fn draw_seed(room_seed: &[u8], k: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(DRAW_DOMAIN);
    h.update(room_seed);
    h.update(k.to_be_bytes());
    h.finalize().into()
}

const DRAW_DOMAIN: &[u8] = b"sluice-draw-v1";

/// 32 fresh random bytes, as lowercase hex: a room's pre-queue seed.
pub fn new_seed_hex() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    to_hex(&b)
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of a hex string (either case); `None` when it is not hex.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// seq → place for one draw: the inverse of [`shuffle_order`]. Building
/// it costs the shuffle (about 60 ns a ticket): gateways build it once per
/// draw, off the request path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaceMap {
    draw: PrequeueDraw,
    /// `place_of[ticket]` = k, the 0-based place within the draw.
    place_of: Vec<u32>,
}

impl PlaceMap {
    /// The map of `draw` with `seed` (its bytes).
    pub fn new(seed: &[u8], draw: PrequeueDraw) -> Self {
        let n = draw.n.min(MAX_TICKETS) as u32;
        let order = shuffle_order(seed, n);
        let mut place_of = vec![0u32; order.len()];
        for (k, &ticket) in order.iter().enumerate() {
            place_of[ticket as usize] = k as u32;
        }
        Self { draw, place_of }
    }

    /// The draw it maps.
    pub fn draw(&self) -> PrequeueDraw {
        self.draw
    }

    /// The place (frontier position) of `seq`.
    pub fn place(&self, seq: u64) -> u64 {
        if self.draw.contains(seq) {
            let ticket = (seq - self.draw.from - 1) as usize;
            match self.place_of.get(ticket) {
                Some(&k) => self.draw.from + 1 + u64::from(k),
                None => seq,
            }
        } else {
            seq
        }
    }
}

const DOMAIN: &[u8] = b"sluice-prequeue-v1";

/// The commitment to publish before the opening: hex SHA-256 of the seed.
pub fn commitment(seed: &[u8]) -> String {
    to_hex(&Sha256::digest(seed))
}

struct WordStream<'a> {
    seed: &'a [u8],
    block: u64,
    words: [u64; 4],
    next: usize,
}

impl WordStream<'_> {
    fn next_word(&mut self) -> u64 {
        if self.next == 4 {
            let mut h = Sha256::new();
            h.update(DOMAIN);
            h.update(self.seed);
            h.update(self.block.to_be_bytes());
            let d = h.finalize();
            for (i, w) in self.words.iter_mut().enumerate() {
                let mut b = [0u8; 8];
                b.copy_from_slice(&d[i * 8..i * 8 + 8]);
                *w = u64::from_be_bytes(b);
            }
            self.block += 1;
            self.next = 0;
        }
        let w = self.words[self.next];
        self.next += 1;
        w
    }
}

/// The order of `n` pre-queue tickets drawn with `seed` (see the module
/// docs for the exact algorithm).
pub fn shuffle_order(seed: &[u8], n: u32) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n).collect();
    let mut stream = WordStream {
        seed,
        block: 0,
        words: [0; 4],
        next: 4,
    };
    for i in (1..n as usize).rev() {
        let m = (i + 1) as u64;
        // 2^64 mod m, computed without overflow
        let rem = (u64::MAX % m + 1) % m;
        // words below 2^64 − rem are unbiased; 0 (rem == 0) means every word
        let limit = 0u64.wrapping_sub(rem);
        let w = loop {
            let w = stream.next_word();
            if limit == 0 || w < limit {
                break w;
            }
        };
        order.swap(i, (w % m) as usize);
    }
    order
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn deterministic_permutation() {
        let a = shuffle_order(b"seed-1", 1000);
        let b = shuffle_order(b"seed-1", 1000);
        let c = shuffle_order(b"seed-2", 1000);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(shuffle_order(b"x", 0), Vec::<u32>::new());
        assert_eq!(shuffle_order(b"x", 1), vec![0]);
    }

    #[test]
    fn pinned_vector() {
        // Published draws depend on this never changing.
        assert_eq!(shuffle_order(b"sluice", 8), PINNED.to_vec());
        assert_eq!(
            commitment(b"sluice"),
            "0f5aec3c8edf964bb5260e4ae806d31feaab06f39a65ddba9d86e499bfae8476"
        );
    }

    // Recomputed independently from the module docs (Python hashlib).
    const PINNED: [u32; 8] = [2, 0, 6, 3, 4, 5, 1, 7];

    #[test]
    fn hex_roundtrip() {
        assert_eq!(from_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(from_hex("0F"), Some(vec![15]));
        assert_eq!(from_hex("0"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("é0"), None);
        let s = new_seed_hex();
        assert_eq!(s.len(), 64);
        assert_eq!(to_hex(&from_hex(&s).unwrap()), s);
    }

    proptest::proptest! {
        /// Every ticket gets a unique place in `from+1 ..= from+n` (a
        /// bijection), the places follow `shuffle_order`, and every other
        /// seq keeps its own place (FIFO).
        #[test]
        fn place_map_is_the_draw(from in 0u64..1_000, n in 0u64..300, seed in proptest::collection::vec(0u8..=255, 32)) {
            let draw = PrequeueDraw { from, n, k: 0 };
            let map = PlaceMap::new(&seed, draw);
            let order = shuffle_order(&seed, n as u32);
            let mut seen = std::collections::HashSet::new();
            for seq in from + 1..=from + n {
                let p = map.place(seq);
                proptest::prop_assert!(p > from && p <= from + n);
                proptest::prop_assert!(seen.insert(p));
                // the ticket at place p is this seq's ticket
                proptest::prop_assert_eq!(u64::from(order[(p - from - 1) as usize]), seq - from - 1);
            }
            for seq in (0..=from).chain(from + n + 1..from + n + 20) {
                proptest::prop_assert_eq!(map.place(seq), seq);
            }
        }
    }

    #[test]
    fn roughly_uniform_first_place() {
        let mut counts = [0u32; 4];
        for s in 0..4000u32 {
            counts[shuffle_order(&s.to_be_bytes(), 4)[0] as usize] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
    }
}
