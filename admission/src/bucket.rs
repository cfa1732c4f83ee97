//! The pure token bucket over sequence numbers.
//!
//! No I/O, no clock, no locks: every function takes `now_ms` and mutates a
//! plain value. The memory store wraps it, `lua/lib.lua` is a line-for-line
//! port, and the simulator drives it in virtual time.
//!
//! # Units
//!
//! Everything is an integer so that Rust and Lua (whose numbers are doubles)
//! compute bit-identical results:
//!
//! - the rate in **milli-admissions per second** (`rate_milli`, resolution
//!   0.001/s),
//! - credit and burst in **micro-admissions** (`credit_micro`, 10⁻⁶),
//!
//! so credit earned over `elapsed_ms` is exactly `rate_milli × elapsed_ms`
//! micro-admissions. One `advance` counts at most [`MAX_ELAPSED_MS`] (one
//! hour), which keeps every intermediate value below 2⁵³ at the highest rate
//! accepted (10⁹ × 3.6·10⁶ < 9·10¹⁵).
//!
//! # The rules
//!
//! - `advance(now)`: `earned = rate × elapsed (+ refunds)`,
//!   `credit += earned`; admit `n = min(floor(credit), tail − frontier,
//!   room)`, `frontier += n`, `credit −= n`; then `credit = min(credit,
//!   burst)`.
//!
//!   DESIGN.md writes the cap as `credit = min(credit + earned, max(burst,
//!   earned))` before admitting. Both bound what is saved up while nobody
//!   waits by `burst` and never cap what a waiting queue can use; capping
//!   *after* admission also keeps the fractional remainder when one tick
//!   earns more than `burst` (with burst 1 and 1.5/s at a 1 s tick the
//!   DESIGN form admits 1/s, this one 1.5/s), and it makes any split of the
//!   elapsed time among many callers give exactly the result of one caller
//!   while people wait. Between operations `credit ≤ burst` always holds, so
//!   admissions over any window of `t` seconds are at most
//!   `burst + rate × t` (+ refunds).
//! - Paused or closed: nothing is earned (refunds still count) and credit
//!   stays at most `burst`, so resuming admits at most `burst` at once, never
//!   a stampede of everything a long pause would have earned.
//! - `join`: `seq = ++tail`; passthrough when nobody waits
//!   (`frontier == seq − 1`), `credit ≥ 1`, the room is not paused and there
//!   is room under the active cap.
//!
//! Credit may be negative: a late claim (see [`crate::ClaimOutcome::Late`])
//! takes back a slot that was already refunded.

use crate::settings::RoomSettings;

/// One admission in credit units.
pub const MICRO: i64 = 1_000_000;
/// The most elapsed time one `accrue` counts (1 hour).
pub const MAX_ELAPSED_MS: u64 = 3_600_000;

/// The bucket's parameters, in integer units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketParams {
    /// Admissions per 1000 s (milli-admissions per second).
    pub rate_milli: u64,
    /// The cap on saved-up credit, micro-admissions (≥ [`MICRO`]).
    pub burst_micro: i64,
    /// No admission, no accrual.
    pub paused: bool,
    /// No join, no admission, no accrual.
    pub closed: bool,
}

impl BucketParams {
    /// Converts settings (rates rounded to the unit).
    pub fn from_settings(s: &RoomSettings) -> Self {
        Self {
            rate_milli: (s.rate_per_sec * 1000.0).round().max(0.0) as u64,
            burst_micro: ((s.burst * MICRO as f64).round() as i64).max(MICRO),
            // sold out halts admission as a pause does
            paused: s.paused || s.sold_out,
            closed: s.closed,
        }
    }

    /// Whether admission is stopped (paused or closed).
    pub fn halted(&self) -> bool {
        self.paused || self.closed
    }
}

/// The bucket's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// The last seq handed out (0: none yet).
    pub tail: u64,
    /// Every seq ≤ frontier is admitted.
    pub frontier: u64,
    /// Saved-up admissions, micro-admissions; may be negative.
    pub credit_micro: i64,
    /// When credit was last brought up to date (store clock, ms).
    pub last_ms: u64,
}

impl Bucket {
    /// A fresh bucket, full (`burst` credit), anchored at `now_ms`.
    pub fn new(now_ms: u64, params: &BucketParams) -> Self {
        Self {
            tail: 0,
            frontier: 0,
            credit_micro: params.burst_micro,
            last_ms: now_ms,
        }
    }

    /// Waiting visitors: `tail − frontier`.
    pub fn queue_length(&self) -> u64 {
        self.tail - self.frontier
    }

    /// Adds credit earned since `last_ms` plus `refund_micro` (no-show slots
    /// given back), uncapped: only [`Bucket::advance`] and
    /// [`Bucket::reanchor`] call it, and both cap afterwards. A clock that
    /// went backwards earns nothing.
    fn accrue(&mut self, now_ms: u64, p: &BucketParams, refund_micro: i64) {
        let elapsed = now_ms.saturating_sub(self.last_ms).min(MAX_ELAPSED_MS);
        if now_ms > self.last_ms {
            self.last_ms = now_ms;
        }
        let earned = if p.halted() {
            0
        } else {
            (p.rate_milli * elapsed) as i64
        };
        self.credit_micro += earned + refund_micro;
    }

    /// Brings credit up to `now_ms` (plus `refund_micro`), admits as many
    /// waiting seqs as credit allows but at most `room`, then caps credit at
    /// `burst`. Returns how many were admitted.
    pub fn advance(&mut self, now_ms: u64, p: &BucketParams, room: u64, refund_micro: i64) -> u64 {
        self.accrue(now_ms, p, refund_micro);
        let mut n = 0;
        if !p.halted() && self.credit_micro >= MICRO {
            let whole = (self.credit_micro / MICRO) as u64;
            n = whole.min(self.queue_length()).min(room);
            self.frontier += n;
            self.credit_micro -= n as i64 * MICRO;
        }
        self.credit_micro = self.credit_micro.min(p.burst_micro);
        n
    }

    /// Hands out the next seq and admits it at once when nobody waits and
    /// credit and `room` allow (passthrough). Call [`Bucket::advance`] first
    /// so that credit is current and those already waiting go first. Returns
    /// `(seq, admitted)`.
    pub fn join(&mut self, p: &BucketParams, room: u64) -> (u64, bool) {
        self.tail += 1;
        let seq = self.tail;
        let pass =
            !p.halted() && self.frontier == seq - 1 && self.credit_micro >= MICRO && room >= 1;
        if pass {
            self.frontier = seq;
            self.credit_micro -= MICRO;
        }
        (seq, pass)
    }

    /// Raises tail and frontier to at least the given floors (never
    /// lowers them); keeps `frontier ≤ tail`.
    pub fn reseed(&mut self, min_tail: u64, min_frontier: u64) {
        self.tail = self.tail.max(min_tail).max(min_frontier);
        self.frontier = self.frontier.max(min_frontier);
    }

    /// Changes parameters without losing or inventing credit: credit earned
    /// so far at the old parameters is settled first, then credit above the
    /// new burst is dropped.
    pub fn reanchor(&mut self, now_ms: u64, old: &BucketParams, new: &BucketParams) {
        self.accrue(now_ms, old, 0);
        self.credit_micro = self.credit_micro.min(old.burst_micro).min(new.burst_micro);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn params(rate: f64, burst: f64) -> BucketParams {
        BucketParams::from_settings(&RoomSettings {
            rate_per_sec: rate,
            burst,
            ..Default::default()
        })
    }

    #[test]
    fn passthrough_until_burst_is_spent() {
        let p = params(1.0, 3.0);
        let mut b = Bucket::new(0, &p);
        for i in 1..=3 {
            b.advance(0, &p, u64::MAX, 0);
            assert_eq!(b.join(&p, u64::MAX), (i, true));
        }
        b.advance(0, &p, u64::MAX, 0);
        assert_eq!(b.join(&p, u64::MAX), (4, false));
        assert_eq!(b.advance(999, &p, u64::MAX, 0), 0);
        assert_eq!(b.advance(1000, &p, u64::MAX, 0), 1);
        assert_eq!(b.frontier, 4);
    }

    #[test]
    fn coarse_tick_keeps_the_rate() {
        // burst 1 and a 10 s tick: the rate is not held below 5/s.
        let p = params(5.0, 1.0);
        let mut b = Bucket::new(0, &p);
        b.credit_micro = 0;
        b.tail = 1_000;
        assert_eq!(b.advance(10_000, &p, u64::MAX, 0), 50);
        // and the fraction is kept: 1.5/s at 1 s ticks admits 3 in 2 s
        let p = params(1.5, 1.0);
        let mut b = Bucket::new(0, &p);
        b.credit_micro = 0;
        b.tail = 1_000;
        assert_eq!(
            b.advance(1_000, &p, u64::MAX, 0) + b.advance(2_000, &p, u64::MAX, 0),
            3
        );
    }

    #[test]
    fn pause_holds_credit_at_burst() {
        let mut p = params(100.0, 5.0);
        let mut b = Bucket::new(0, &p);
        b.tail = 10_000;
        p.paused = true;
        assert_eq!(b.advance(60_000, &p, u64::MAX, 0), 0);
        p.paused = false;
        // resuming right away: only the burst goes through
        assert_eq!(b.advance(60_000, &p, u64::MAX, 0), 5);
        assert_eq!(b.advance(60_100, &p, u64::MAX, 0), 10);
    }

    #[test]
    fn room_caps_admission_and_credit_waits() {
        let p = params(10.0, 10.0);
        let mut b = Bucket::new(0, &p);
        b.tail = 100;
        assert_eq!(b.advance(0, &p, 3, 0), 3);
        assert_eq!(b.advance(0, &p, 0, 0), 0);
        assert_eq!(b.advance(0, &p, 100, 0), 7);
        assert_eq!(b.advance(100, &p, 100, 0), 1);
    }

    #[test]
    fn reanchor_settles_old_rate_first() {
        let old = params(10.0, 1000.0);
        let new = params(1.0, 1000.0);
        let mut b = Bucket::new(0, &old);
        b.credit_micro = 0;
        b.tail = 1_000;
        b.reanchor(2_000, &old, &new);
        assert_eq!(b.credit_micro, 20 * MICRO);
        assert_eq!(b.advance(3_000, &new, u64::MAX, 0), 21);
    }

    proptest! {
        /// Over any run of joins and advances at random times: seqs are
        /// unique and increasing, the frontier never moves back nor passes
        /// the tail, and admissions over any window stay within
        /// rate × window + burst (+1 for rounding).
        #[test]
        fn bucket_invariants(
            rate in 0.0f64..200.0,
            burst in 1.0f64..50.0,
            ops in proptest::collection::vec((0u64..400, 0u8..4), 1..300),
        ) {
            let p = params(rate, burst);
            let mut b = Bucket::new(0, &p);
            let mut now = 0u64;
            let mut last_seq = 0;
            let mut admits: Vec<(u64, u64)> = Vec::new(); // (time, count)
            for (dt, op) in ops {
                now += dt;
                let before = b.frontier;
                if op == 0 {
                    let n = b.advance(now, &p, u64::MAX, 0);
                    prop_assert_eq!(b.frontier, before + n);
                } else {
                    b.advance(now, &p, u64::MAX, 0);
                    let (seq, _) = b.join(&p, u64::MAX);
                    prop_assert!(seq > last_seq);
                    last_seq = seq;
                }
                prop_assert!(b.frontier >= before);
                prop_assert!(b.frontier <= b.tail);
                admits.push((now, b.frontier - before));
            }
            // every window: admitted by ops i..=j ≤ rate × (t_j − t_{i−1}) +
            // burst + 1, where t_{i−1} is the previous op (credit was last
            // capped at burst then; the first op counts from creation at 0)
            for i in 0..admits.len() {
                let start = if i == 0 { 0 } else { admits[i - 1].0 };
                let mut sum = 0u64;
                for &(t, n) in &admits[i..] {
                    sum += n;
                    let window_s = (t - start) as f64 / 1000.0;
                    let bound = rate * window_s + burst + 1.0;
                    prop_assert!(sum as f64 <= bound, "{} admitted in {} s (bound {})", sum, window_s, bound);
                }
            }
        }

        /// Splitting the elapsed time among many callers changes nothing
        /// while people wait.
        #[test]
        fn split_advance_equals_one(rate in 0.0f64..500.0, cuts in proptest::collection::vec(0u64..5_000, 0..20)) {
            let p = params(rate, 10.0);
            let mut one = Bucket::new(0, &p);
            one.credit_micro = 0;
            one.tail = 1_000_000;
            let mut many = one.clone();
            let mut cuts = cuts;
            cuts.sort_unstable();
            for c in &cuts {
                many.advance(*c, &p, u64::MAX, 0);
            }
            many.advance(5_000, &p, u64::MAX, 0);
            one.advance(5_000, &p, u64::MAX, 0);
            prop_assert_eq!(one, many);
        }
    }
}
