//! Priority lanes within a room: several FIFOs sharing one admission rate.
//!
//! # Config
//!
//! ```toml
//! [[rooms]]
//! id = "shop"
//! rate_per_sec = 50
//! lanes = [{ id = "presale", weight = 70 }, { id = "public", weight = 30 }]
//! # lane_mode = "strict"   # first lane first, the weights ignored
//! ```
//!
//! A room without `lanes` is exactly today's room: the same Redis keys and
//! fields, the same answers (the stored settings JSON leaves both fields out
//! while empty/weighted). [`RoomSettings::lanes`](crate::RoomSettings) is
//! at most [`MAX_LANES`] lanes, ids `[a-z0-9_-]{1,32}` and unique, weights
//! integers `1..=`[`MAX_WEIGHT`] (only their ratios matter: they need not
//! add up to 100). A room with lanes cannot be scheduled (the pre-queue
//! draw orders one line) and is FIFO or `queue_all` (not `reject`).
//!
//! # Seqs and places
//!
//! Each lane has its own seq space (`tail`, `frontier` per lane, seqs from
//! 1): a queue token holds its lane and its seq in that lane, and a lane's
//! seqs are admitted strictly in order (every lane seq ≤ the lane's frontier
//! is admitted), so FIFO within a lane is exactly today's FIFO.
//!
//! The room keeps its one bucket, one claim bitmap, one list of advance
//! batches (no-show refunds) and one session set, all over **places**: the
//! room-wide numbers the room's `frontier` counts. An advance that admits
//! `n` takes places `frontier+1 ..= frontier+n` and hands them to the lanes
//! (lane 0's share first, in lane-seq order, then lane 1's, ...); each such
//! run is a [`Segment`] (lane, first lane seq, first place, length). A
//! visitor's place is found from its lane seq through the segments
//! ([`LaneBook::place_of`]); claims, refunds, late claims, sessions and the
//! active cap then work on places exactly as they do without lanes. The
//! room's `tail` counts every join (so `tail − frontier` is still the
//! number waiting, summed over the lanes).
//!
//! # The split
//!
//! The bucket decides how many are admitted (`n`, the room's credit, never
//! more than those waiting in all lanes); [`split`] decides from which
//! lanes, inside the same atomic advance (`room.rs` for the memory store,
//! `lua/lib.lua` for Redis), so many gateways meter together: one credit,
//! one split.
//!
//! - **Weighted**: smooth weighted round robin (the nginx upstream
//!   algorithm) over the lanes that have someone waiting. Each pick adds
//!   every eligible lane's weight to its counter, takes the lane with the
//!   highest counter (the first on a tie) and takes the eligible total
//!   from it. The counters persist in the store across advances, so with
//!   every lane backlogged any `W = Σ weights` consecutive admissions give
//!   lane `i` exactly `weight_i`, however the admissions fall into
//!   advances. A lane with nobody waiting is not eligible: its share flows
//!   to the others. When the eligible set changes the counters restart at
//!   zero (which keeps their sum zero, what makes the exact-cycle property
//!   hold). Whole cycles are taken in one step (`k` cycles give lane `i`
//!   `k × weight_i`), so an advance admitting many costs O(lanes), not
//!   O(n × lanes).
//! - **Strict**: the first lane (in config order) with someone waiting takes
//!   everything it can, then the next; a lower lane is never admitted while
//!   a higher one waits.
//!
//! A join admitted on the spot (nobody waiting in any lane, credit left) is
//! unchanged: it takes the next place of its lane.
//!
//! # Which lane a join goes to
//!
//! The `lane` claim of a verified enqueue token, else the room's default
//! lane: the **last** one (the lowest priority). A lane the room does not
//! have is refused before anything is spent (HTTP 422 `lane_not_found`).
//!
//! # Positions and ETAs
//!
//! A waiting visitor's position is `seq − lane frontier` within its lane;
//! its ETA divides that by the lane's measured admission rate (the lane's
//! share), not the room's.
//!
//! # Forgetting
//!
//! A segment is needed while a queue token of one of its seqs can still be
//! presented (to claim the place, or to resume its session). With
//! [`RoomSettings::lane_keep`](crate::RoomSettings) set (the gateway sets
//! its queue token lifetime, plus the account binding's when the room
//! takes enqueue tokens, plus a minute for clock skew), advances note a
//! mark at most every `lane_keep / 16` (at least 1 s): when, and every
//! lane's frontier then. Once a mark is `lane_keep` old, each lane seq at
//! or below its frontier was admitted (so joined, its token signed) before
//! it, and no such token is valid any more: the segments ending there are
//! forgotten ([`LaneBook::forget_through`]). Without it the segments grew
//! for the room's life: with two lanes backlogged every advance writes
//! about two (ten advances a second per gateway: 1.7 million a day).
//!
//! Written here rather than taken from a crate: the split has to run
//! identically in Rust and in Lua (integer arithmetic only, one
//! deterministic tie rule), which rules out a library scheduler.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most lanes a room may have.
pub const MAX_LANES: usize = 10;
/// The highest weight accepted.
pub const MAX_WEIGHT: u32 = 1000;
/// The longest lane id.
pub const MAX_LANE_ID_LEN: usize = 32;

/// One lane of a room's config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lane {
    /// The lane's name (the enqueue token's `lane` claim names it).
    pub id: String,
    /// Its share of the room's rate, relative to the other lanes' weights.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// How lanes share the rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaneMode {
    /// By weight, unused share flowing to the others.
    #[default]
    Weighted,
    /// First lane first.
    Strict,
}

impl LaneMode {
    /// The store's number for it (the Lua state's `lmode`).
    pub fn code(self) -> u8 {
        match self {
            LaneMode::Weighted => 0,
            LaneMode::Strict => 1,
        }
    }

    pub(crate) fn is_weighted(&self) -> bool {
        *self == LaneMode::Weighted
    }
}

/// Checks a lane list: why it is bad, for the operator (`lanes` invalid).
pub fn validate_lanes(lanes: &[Lane]) -> Result<(), String> {
    if lanes.len() > MAX_LANES {
        return Err(format!("at most {MAX_LANES} lanes"));
    }
    for (i, l) in lanes.iter().enumerate() {
        if l.id.is_empty()
            || l.id.len() > MAX_LANE_ID_LEN
            || !l
                .id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "lane id {:?} must be 1 to {MAX_LANE_ID_LEN} of a-z, 0-9, _ and -",
                l.id
            ));
        }
        if lanes[..i].iter().any(|o| o.id == l.id) {
            return Err(format!("lane id {:?} given twice", l.id));
        }
        if l.weight == 0 || l.weight > MAX_WEIGHT {
            return Err(format!(
                "lane {:?}: weight must be an integer from 1 to {MAX_WEIGHT}, got {}",
                l.id, l.weight
            ));
        }
    }
    Ok(())
}

/// The index of lane `id` in `lanes`; `None` (no id) is the default lane,
/// the last. `Err(())` when the room has no such lane (or no lanes and an
/// id was named).
#[allow(clippy::result_unit_err)]
pub fn lane_index(lanes: &[Lane], id: Option<&str>) -> Result<Option<usize>, ()> {
    if lanes.is_empty() {
        return match id {
            None => Ok(None),
            Some(_) => Err(()),
        };
    }
    match id {
        None => Ok(Some(lanes.len() - 1)),
        Some(id) => lanes.iter().position(|l| l.id == id).map(Some).ok_or(()),
    }
}

/// One lane's queue state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneState {
    /// Last lane seq handed out.
    pub tail: u64,
    /// Every lane seq ≤ frontier is admitted.
    pub frontier: u64,
    /// The weighted round robin counter.
    pub current: i64,
    /// Admitted from this lane so far.
    pub admitted: u64,
}

impl LaneState {
    /// Waiting in this lane.
    pub fn waiting(&self) -> u64 {
        self.tail.saturating_sub(self.frontier)
    }
}

/// Splits `n` admissions among `lanes` (weights `weights`, same length):
/// returns how many each lane gets (never more than it has waiting; the
/// sum is `min(n, Σ waiting)`). Updates the round robin counters and the
/// eligible-set mask, not the frontiers. `lua/lib.lua` `lane_split` is its
/// port.
pub fn split(
    n: u64,
    weights: &[u32],
    mode: LaneMode,
    lanes: &mut [LaneState],
    mask: &mut u64,
) -> Vec<u64> {
    let k = lanes.len();
    let mut give = vec![0u64; k];
    let mut waiting: Vec<u64> = lanes.iter().map(LaneState::waiting).collect();
    let mut n = n;
    if mode == LaneMode::Strict {
        for i in 0..k {
            let g = n.min(waiting[i]);
            give[i] = g;
            n -= g;
        }
        return give;
    }
    while n > 0 {
        let eligible: u64 = (0..k)
            .filter(|&i| waiting[i] > 0)
            .fold(0, |m, i| m | (1 << i));
        if eligible == 0 {
            break;
        }
        if eligible != *mask {
            for l in lanes.iter_mut() {
                l.current = 0;
            }
            *mask = eligible;
        }
        let on = |i: usize| eligible & (1 << i) != 0;
        let wsum: u64 = (0..k)
            .filter(|&i| on(i))
            .map(|i| u64::from(weights[i]))
            .sum();
        // whole cycles at once: each gives lane i exactly weight_i and
        // leaves the counters where they were
        let mut cycles = n / wsum;
        for i in (0..k).filter(|&i| on(i)) {
            cycles = cycles.min(waiting[i] / u64::from(weights[i]));
        }
        if cycles > 0 {
            for i in (0..k).filter(|&i| on(i)) {
                let g = cycles * u64::from(weights[i]);
                give[i] += g;
                waiting[i] -= g;
            }
            n -= cycles * wsum;
            continue;
        }
        let mut best = usize::MAX;
        for i in (0..k).filter(|&i| on(i)) {
            lanes[i].current += i64::from(weights[i]);
            if best == usize::MAX || lanes[i].current > lanes[best].current {
                best = i;
            }
        }
        lanes[best].current -= wsum as i64;
        give[best] += 1;
        waiting[best] -= 1;
        n -= 1;
    }
    give
}

/// A run of places handed to one lane by one advance: lane seqs
/// `seq ..seq+len` are places `place ..place+len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First place.
    pub place: u64,
    /// Length.
    pub len: u64,
}

/// A room's lanes: their states, the round robin mask and the segments.
#[derive(Clone, Debug, Default)]
pub struct LaneBook {
    /// Per lane, in config order.
    pub lanes: Vec<LaneState>,
    /// The eligible set of the last weighted pick.
    pub mask: u64,
    /// Per lane: first lane seq → segment.
    segments: Vec<BTreeMap<u64, Segment>>,
}

impl LaneBook {
    /// Grows to `k` lanes (a config that adds lanes); never shrinks.
    pub fn resize(&mut self, k: usize) {
        if self.lanes.len() < k {
            self.lanes.resize(k, LaneState::default());
            self.segments.resize(k, BTreeMap::new());
        }
    }

    /// Records that lane `lane`'s seqs from `seq` (its next `len`) are
    /// places from `place`, merged with the lane's last run when both
    /// continue it.
    pub fn record(&mut self, lane: usize, seq: u64, place: u64, len: u64) {
        if len == 0 {
            return;
        }
        let map = &mut self.segments[lane];
        if let Some((&s, seg)) = map.iter_mut().next_back()
            && s + seg.len == seq
            && seg.place + seg.len == place
        {
            seg.len += len;
            return;
        }
        map.insert(seq, Segment { place, len });
    }

    /// The place of lane `lane`'s seq `seq`, once admitted.
    pub fn place_of(&self, lane: usize, seq: u64) -> Option<u64> {
        let map = self.segments.get(lane)?;
        let (&s, seg) = map.range(..=seq).next_back()?;
        (seq < s + seg.len).then(|| seg.place + (seq - s))
    }

    /// Forgets lane `lane`'s segments that end at or before its seq `seq`
    /// (a segment running past it stays whole): the room's
    /// [`RoomCore`](crate::RoomCore) calls it once no queue token of those
    /// seqs can still be presented (see "Forgetting" above).
    pub fn forget_through(&mut self, lane: usize, seq: u64) {
        let Some(map) = self.segments.get_mut(lane) else {
            return;
        };
        let first_kept = match map.range(..=seq).next_back() {
            None => return,
            Some((&s, seg)) if s + seg.len - 1 > seq => s,
            Some((&s, _)) => s + 1,
        };
        *map = map.split_off(&first_kept);
    }

    /// Segments kept (all lanes).
    pub fn segment_count(&self) -> usize {
        self.segments.iter().map(BTreeMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn backlogged(k: usize) -> Vec<LaneState> {
        vec![
            LaneState {
                tail: 1_000_000,
                ..Default::default()
            };
            k
        ]
    }

    #[test]
    fn seventy_thirty() {
        let mut lanes = backlogged(2);
        let mut mask = 0;
        let mut total = [0u64; 2];
        for _ in 0..100 {
            let g = split(1, &[70, 30], LaneMode::Weighted, &mut lanes, &mut mask);
            total[0] += g[0];
            total[1] += g[1];
        }
        assert_eq!(total, [70, 30]);
        // many at once: whole cycles, then picks
        let g = split(1000, &[70, 30], LaneMode::Weighted, &mut lanes, &mut mask);
        assert_eq!(g, vec![700, 300]);
    }

    #[test]
    fn unused_share_flows_on() {
        let mut lanes = backlogged(2);
        lanes[0].tail = 3;
        let mut mask = 0;
        let g = split(10, &[70, 30], LaneMode::Weighted, &mut lanes, &mut mask);
        assert_eq!(g, vec![3, 7]);
        let g = split(10, &[70, 30], LaneMode::Strict, &mut lanes, &mut mask);
        assert_eq!(g, vec![3, 7]);
        lanes[0].tail = 0;
        let g = split(5, &[1, 1], LaneMode::Weighted, &mut lanes, &mut mask);
        assert_eq!(g, vec![0, 5]);
    }

    #[test]
    fn bad_lanes() {
        let l = |id: &str, weight| Lane {
            id: id.into(),
            weight,
        };
        assert!(validate_lanes(&[l("a", 1), l("b", 1000)]).is_ok());
        assert!(validate_lanes(&[l("a", 0)]).is_err());
        assert!(validate_lanes(&[l("a", 1001)]).is_err());
        assert!(validate_lanes(&[l("a", 1), l("a", 2)]).is_err());
        assert!(validate_lanes(&[l("A", 1)]).is_err());
        assert!(validate_lanes(&[l("", 1)]).is_err());
        assert!(validate_lanes(&vec![l("a", 1); 11]).is_err());
        let lanes = [l("presale", 70), l("public", 30)];
        assert_eq!(lane_index(&lanes, None), Ok(Some(1)));
        assert_eq!(lane_index(&lanes, Some("presale")), Ok(Some(0)));
        assert_eq!(lane_index(&lanes, Some("vip")), Err(()));
        assert_eq!(lane_index(&[], Some("vip")), Err(()));
        assert_eq!(lane_index(&[], None), Ok(None));
    }

    #[test]
    fn segments_map_seqs_to_places() {
        let mut b = LaneBook::default();
        b.resize(2);
        b.record(0, 1, 1, 3);
        b.record(1, 1, 4, 2);
        b.record(0, 4, 6, 1);
        b.record(0, 5, 7, 2); // continues the last run: merged
        assert_eq!(b.segment_count(), 3);
        assert_eq!(b.place_of(0, 2), Some(2));
        assert_eq!(b.place_of(1, 2), Some(5));
        assert_eq!(b.place_of(0, 6), Some(8));
        assert_eq!(b.place_of(0, 7), None);
        assert_eq!(b.place_of(1, 3), None);
        assert_eq!(b.place_of(5, 1), None);
    }

    #[test]
    fn forgetting_keeps_what_runs_past_the_cut() {
        let mut b = LaneBook::default();
        b.resize(2);
        b.record(0, 1, 1, 3); // seqs 1..=3
        b.record(1, 1, 4, 2);
        b.record(0, 4, 6, 2); // seqs 4..=5
        b.record(0, 6, 9, 4); // seqs 6..=9
        b.forget_through(0, 6); // 6 is inside the last run: it stays
        assert_eq!((b.place_of(0, 3), b.place_of(0, 5)), (None, None));
        assert_eq!((b.place_of(0, 6), b.place_of(0, 9)), (Some(9), Some(12)));
        assert_eq!(b.place_of(1, 2), Some(5), "another lane untouched");
        b.forget_through(1, 2); // ends exactly at the cut: gone
        assert_eq!(b.place_of(1, 1), None);
        b.forget_through(0, 0);
        b.forget_through(7, 100); // no such lane: nothing
        assert_eq!(b.segment_count(), 1);
    }

    proptest! {
        /// Any sequence of advances with every lane backlogged: over the
        /// whole run each lane is within one cycle of its exact share, and
        /// nobody gets more than is waiting.
        #[test]
        fn split_converges(
            weights in proptest::collection::vec(1u32..20, 1..5),
            ns in proptest::collection::vec(0u64..50, 1..200),
        ) {
            let k = weights.len();
            let mut lanes = backlogged(k);
            let mut mask = 0;
            let mut total = vec![0u64; k];
            for n in &ns {
                let g = split(*n, &weights, LaneMode::Weighted, &mut lanes, &mut mask);
                prop_assert_eq!(g.iter().sum::<u64>(), *n);
                for i in 0..k {
                    total[i] += g[i];
                    lanes[i].frontier += g[i];
                }
            }
            let all: u64 = total.iter().sum();
            let wsum: u64 = weights.iter().map(|&w| u64::from(w)).sum();
            for i in 0..k {
                let exact = all as f64 * f64::from(weights[i]) / wsum as f64;
                prop_assert!((total[i] as f64 - exact).abs() <= wsum as f64,
                    "lane {} got {} of {}, exact {}", i, total[i], all, exact);
            }
        }

        /// Random waiting counts: never more than waiting, all of `n` used
        /// while anyone waits, strict never skips a waiting higher lane.
        #[test]
        fn split_bounds(
            weights in proptest::collection::vec(1u32..20, 1..5),
            waiting in proptest::collection::vec(0u64..30, 5),
            n in 0u64..100,
            strict in any::<bool>(),
        ) {
            let k = weights.len();
            let mut lanes: Vec<LaneState> = (0..k).map(|i| LaneState { tail: waiting[i], ..Default::default() }).collect();
            let mut mask = 0;
            let mode = if strict { LaneMode::Strict } else { LaneMode::Weighted };
            let g = split(n, &weights, mode, &mut lanes, &mut mask);
            let w: u64 = waiting[..k].iter().sum();
            prop_assert_eq!(g.iter().sum::<u64>(), n.min(w));
            for i in 0..k {
                prop_assert!(g[i] <= waiting[i]);
                if strict && g[i] > 0 {
                    for j in 0..i {
                        prop_assert_eq!(g[j], waiting[j], "strict skipped lane {}", j);
                    }
                }
            }
        }
    }
}
