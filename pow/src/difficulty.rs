//! Difficulty policy: how much work a challenge asks, from pressure and
//! from who is asking.
//!
//! Two signals set the level, both fed in with the caller's clock
//! (`now_ms`), so tests and the simulator run it in virtual time:
//!
//! - **Global pressure**: joins per second against admissions per second
//!   ([`DifficultyPolicy::set_pressure`], once per tick). The global level
//!   is a *step* between the floor and one above the ceiling. It goes up one
//!   step as soon as the ratio reaches `raise_ratio` (then at most one step
//!   per `raise_interval`) and down one step only after the ratio stayed
//!   below `lower_ratio` for `lower_after`: raised quickly, lowered slowly,
//!   and a ratio between the two thresholds holds it still (hysteresis).
//! - **Per network prefix** (/24, /56): each challenge issued to a prefix
//!   is counted in a count-min sketch whose counts decay with `half_life`
//!   ([`DifficultyPolicy::observe_challenge`]). A prefix whose decayed count
//!   reaches `prefix_threshold` gets one extra bit, and one more per
//!   doubling of its count. The sketch has a fixed size (4 × 2048 counters,
//!   64 KiB) and stores no address; its hashes are keyed with a per-process
//!   random key so nobody can aim collisions at another prefix. A count-min
//!   sketch only overestimates: a prefix may be charged for a collision,
//!   never let off.
//!
//! Work is capped: `puzzles × 2^bits` never exceeds `2^max_work_log2`
//! (default 2^24): beyond that slow phones suffer more than bots. When a
//! level would go past the ceiling, it stays at the ceiling and is marked
//! *under attack*: the challenge then carries a minimum solve age
//! (`min_solve_under_attack`), a wall-clock floor no GPU compresses.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use thiserror::Error;

use crate::challenge::{ChallengeSpec, MAX_PUZZLES};
use crate::prefix::NetPrefix;

const SKETCH_DEPTH: usize = 4;
const SKETCH_WIDTH: usize = 2048;
/// Renormalise the forward-decay landmark once weights reach 2^this.
const RENORMALISE_EXP: f64 = 40.0;

/// Operator settings of the difficulty policy.
#[derive(Clone, Debug, PartialEq)]
pub struct DifficultyConfig {
    /// Lowest difficulty (leading zero bits per puzzle) ever asked; the
    /// level at rest. Live-editable (`difficulty_floor_bits`).
    pub floor_bits: u8,
    /// Highest difficulty ever asked. Live-editable
    /// (`difficulty_ceiling_bits`). `puzzles × 2^ceiling_bits` must not
    /// exceed `2^max_work_log2`.
    pub ceiling_bits: u8,
    /// The global level at start, before any pressure is seen.
    pub default_bits: u8,
    /// Puzzles per challenge `k` (1 to 64). Several small puzzles make the
    /// solve time predictable and the progress bar honest.
    pub puzzles: u8,
    /// Hard cap on expected work: `puzzles × 2^bits ≤ 2^max_work_log2`.
    pub max_work_log2: u8,
    /// Minimum solve age carried by challenges issued under attack.
    pub min_solve_under_attack: Duration,
    /// Half-life of the per-prefix counts.
    pub half_life: Duration,
    /// Decayed challenge count at which a prefix gets its first extra bit.
    pub prefix_threshold: f64,
    /// Joins/admissions ratio at or above which the global level rises.
    pub raise_ratio: f64,
    /// Ratio below which pressure counts as low.
    pub lower_ratio: f64,
    /// Joins per second below which pressure is low whatever the ratio (a
    /// handful of joins against a paused room is no attack).
    pub min_joins_per_sec: f64,
    /// Least time between two raises of the global level.
    pub raise_interval: Duration,
    /// How long pressure must stay low before the global level drops one
    /// step (and again for each further step).
    pub lower_after: Duration,
}

impl Default for DifficultyConfig {
    /// k = 16, b = 18: about 2^22 expected hashes, a second or so on a
    /// mid-range phone; ceiling 20 (2^24 with k = 16).
    fn default() -> Self {
        DifficultyConfig {
            floor_bits: 18,
            ceiling_bits: 20,
            default_bits: 18,
            puzzles: 16,
            max_work_log2: 24,
            min_solve_under_attack: Duration::from_secs(3),
            half_life: Duration::from_secs(10),
            prefix_threshold: 32.0,
            raise_ratio: 2.0,
            lower_ratio: 1.0,
            min_joins_per_sec: 20.0,
            raise_interval: Duration::from_secs(1),
            lower_after: Duration::from_secs(30),
        }
    }
}

/// A [`DifficultyConfig`] that makes no sense.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum DifficultyConfigError {
    /// `puzzles` outside 1..=64.
    #[error("puzzles must be 1..=64, got {0}")]
    Puzzles(u8),
    /// `floor_bits > ceiling_bits`, or `default_bits` outside them.
    #[error("need floor_bits <= default_bits <= ceiling_bits, got {floor} / {default} / {ceiling}")]
    Order {
        /// Floor.
        floor: u8,
        /// Default.
        default: u8,
        /// Ceiling.
        ceiling: u8,
    },
    /// The ceiling asks more work than the cap allows.
    #[error(
        "ceiling_bits {ceiling} with {puzzles} puzzles exceeds 2^{cap} hashes (max ceiling {max})"
    )]
    OverCap {
        /// Ceiling asked.
        ceiling: u8,
        /// Puzzles.
        puzzles: u8,
        /// `max_work_log2`.
        cap: u8,
        /// Highest ceiling the cap allows.
        max: u8,
    },
    /// `max_work_log2` above 32.
    #[error("max_work_log2 must be at most 32")]
    Cap,
    /// A duration or rate that must be positive is not, or the thresholds
    /// are inverted.
    #[error("{0}")]
    Value(&'static str),
}

/// Smallest `e` with `2^e >= k`.
fn ceil_log2(k: u8) -> u8 {
    // k <= 64, so the result is at most 6.
    u8::try_from(u32::from(k.max(1)).next_power_of_two().trailing_zeros()).unwrap_or(6)
}

impl DifficultyConfig {
    /// Highest difficulty the work cap allows with this many puzzles.
    pub fn max_bits_for_cap(&self) -> u8 {
        self.max_work_log2.saturating_sub(ceil_log2(self.puzzles))
    }

    /// Checks every field; call before building the policy.
    pub fn validate(&self) -> Result<(), DifficultyConfigError> {
        if self.puzzles == 0 || usize::from(self.puzzles) > MAX_PUZZLES {
            return Err(DifficultyConfigError::Puzzles(self.puzzles));
        }
        if self.max_work_log2 > 32 {
            return Err(DifficultyConfigError::Cap);
        }
        self.check_bits(self.floor_bits, self.ceiling_bits)?;
        if self.default_bits < self.floor_bits || self.default_bits > self.ceiling_bits {
            return Err(DifficultyConfigError::Order {
                floor: self.floor_bits,
                default: self.default_bits,
                ceiling: self.ceiling_bits,
            });
        }
        if self.half_life.is_zero() {
            return Err(DifficultyConfigError::Value("half_life must be positive"));
        }
        if self.lower_after.is_zero() {
            return Err(DifficultyConfigError::Value("lower_after must be positive"));
        }
        if !(self.prefix_threshold.is_finite() && self.prefix_threshold >= 1.0) {
            return Err(DifficultyConfigError::Value(
                "prefix_threshold must be at least 1",
            ));
        }
        if !(self.lower_ratio.is_finite() && self.raise_ratio.is_finite() && 0.0 < self.lower_ratio)
            || self.lower_ratio >= self.raise_ratio
        {
            return Err(DifficultyConfigError::Value(
                "need 0 < lower_ratio < raise_ratio",
            ));
        }
        if !(self.min_joins_per_sec.is_finite() && self.min_joins_per_sec >= 0.0) {
            return Err(DifficultyConfigError::Value(
                "min_joins_per_sec must be >= 0",
            ));
        }
        Ok(())
    }

    /// Checks a floor and a ceiling against this configuration's work cap
    /// (what [`DifficultyPolicy::set_floor_ceiling`] accepts).
    pub fn check_bits(&self, floor: u8, ceiling: u8) -> Result<(), DifficultyConfigError> {
        if floor > ceiling {
            return Err(DifficultyConfigError::Order {
                floor,
                default: self.default_bits,
                ceiling,
            });
        }
        let max = self.max_bits_for_cap();
        if ceiling > max {
            return Err(DifficultyConfigError::OverCap {
                ceiling,
                puzzles: self.puzzles,
                cap: self.max_work_log2,
                max,
            });
        }
        Ok(())
    }
}

/// The work a challenge asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    /// Puzzles `k`.
    pub puzzles: u8,
    /// Leading zero bits per puzzle.
    pub difficulty_bits: u8,
    /// Minimum solve age (zero unless under attack).
    pub min_solve: Duration,
    /// Whether the level would be past the ceiling: work is capped and a
    /// minimum solve age applies instead.
    pub under_attack: bool,
}

impl Level {
    /// Expected hashes to solve: `puzzles × 2^bits`.
    pub fn expected_hashes(&self) -> u64 {
        u64::from(self.puzzles) << self.difficulty_bits.min(56)
    }

    /// The challenge spec for this level.
    pub fn spec(&self, room: impl Into<String>, ttl: Duration) -> ChallengeSpec {
        ChallengeSpec {
            room: room.into(),
            puzzles: self.puzzles,
            difficulty_bits: self.difficulty_bits,
            ttl,
            min_solve: self.min_solve,
        }
    }
}

/// A point-in-time view for the admin API and metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DifficultySnapshot {
    /// The global level (no per-prefix extra).
    pub level: Level,
    /// The last joins/admissions ratio seen (0 when below
    /// `min_joins_per_sec`).
    pub pressure_ratio: f64,
    /// Current floor.
    pub floor_bits: u8,
    /// Current ceiling.
    pub ceiling_bits: u8,
}

/// A count-min sketch with exponential time decay (forward decay: an event
/// at `t` adds `2^((t - landmark) / half_life)`; a read scales back by the
/// same factor at `now`, so no counter needs its own timestamp).
struct Sketch {
    cells: Vec<f64>,
    landmark_ms: u64,
    started: bool,
    hasher: std::hash::RandomState,
}

impl Sketch {
    fn new() -> Self {
        Sketch {
            cells: vec![0.0; SKETCH_DEPTH * SKETCH_WIDTH],
            landmark_ms: 0,
            started: false,
            hasher: std::hash::RandomState::new(),
        }
    }

    fn indices(&self, prefix: &NetPrefix) -> [usize; SKETCH_DEPTH] {
        let h = self.hasher.hash_one(prefix);
        let h1 = h & 0xffff_ffff;
        let h2 = (h >> 32) | 1;
        std::array::from_fn(|row| {
            let col = h1.wrapping_add((row as u64).wrapping_mul(h2)) as usize % SKETCH_WIDTH;
            row * SKETCH_WIDTH + col
        })
    }

    fn exponent(&self, now_ms: u64, half_life_ms: f64) -> f64 {
        (now_ms as f64 - self.landmark_ms as f64) / half_life_ms
    }

    fn add(&mut self, prefix: &NetPrefix, now_ms: u64, half_life_ms: f64) {
        if !self.started {
            self.started = true;
            self.landmark_ms = now_ms;
        }
        let mut e = self.exponent(now_ms, half_life_ms);
        if e > RENORMALISE_EXP {
            let scale = (-e).exp2();
            for c in &mut self.cells {
                *c *= scale;
            }
            self.landmark_ms = now_ms;
            e = 0.0;
        }
        let w = e.exp2();
        for i in self.indices(prefix) {
            self.cells[i] += w;
        }
    }

    fn estimate(&self, prefix: &NetPrefix, now_ms: u64, half_life_ms: f64) -> f64 {
        let min = self
            .indices(prefix)
            .iter()
            .map(|&i| self.cells[i])
            .fold(f64::INFINITY, f64::min);
        min * (-self.exponent(now_ms, half_life_ms)).exp2()
    }
}

struct Global {
    /// `floor..=ceiling` are bit levels; `ceiling + 1` is "under attack".
    step: u8,
    last_raise_ms: Option<u64>,
    low_since_ms: Option<u64>,
    ratio: f64,
}

/// The live difficulty policy. Thread-safe and cheap: `&self` methods, two
/// small mutexes held for a few hundred nanoseconds at most.
pub struct DifficultyPolicy {
    config: DifficultyConfig,
    floor: AtomicU8,
    ceiling: AtomicU8,
    global: Mutex<Global>,
    sketch: Mutex<Sketch>,
}

impl std::fmt::Debug for DifficultyPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DifficultyPolicy")
            .field("snapshot", &self.snapshot())
            .finish_non_exhaustive()
    }
}

impl DifficultyPolicy {
    /// A policy at `config.default_bits`, with an empty sketch.
    pub fn new(config: DifficultyConfig) -> Result<Self, DifficultyConfigError> {
        config.validate()?;
        Ok(DifficultyPolicy {
            floor: AtomicU8::new(config.floor_bits),
            ceiling: AtomicU8::new(config.ceiling_bits),
            global: Mutex::new(Global {
                step: config.default_bits,
                last_raise_ms: None,
                low_since_ms: None,
                ratio: 0.0,
            }),
            sketch: Mutex::new(Sketch::new()),
            config,
        })
    }

    /// The configuration it was built with (floor and ceiling may have
    /// changed since: see [`DifficultyPolicy::snapshot`]).
    pub fn config(&self) -> &DifficultyConfig {
        &self.config
    }

    fn half_life_ms(&self) -> f64 {
        self.config.half_life.as_secs_f64() * 1000.0
    }

    fn ms(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    /// Counts one challenge issued to `prefix` at `now_ms`.
    pub fn observe_challenge(&self, prefix: NetPrefix, now_ms: u64) {
        let hl = self.half_life_ms();
        self.sketch.lock().add(&prefix, now_ms, hl);
    }

    /// The decayed count of challenges issued to `prefix` (an
    /// overestimate at worst).
    pub fn prefix_count(&self, prefix: NetPrefix, now_ms: u64) -> f64 {
        let hl = self.half_life_ms();
        self.sketch.lock().estimate(&prefix, now_ms, hl)
    }

    /// Feeds the latest pressure (both rates per second, measured by the
    /// caller over its last tick) and moves the global level by at most one
    /// step.
    pub fn set_pressure(&self, joins_per_sec: f64, admits_per_sec: f64, now_ms: u64) {
        let c = &self.config;
        let ratio = if !(joins_per_sec.is_finite()) || joins_per_sec < c.min_joins_per_sec {
            0.0
        } else {
            joins_per_sec / admits_per_sec.max(1.0)
        };
        let floor = self.floor.load(Ordering::Relaxed);
        let top = self.ceiling.load(Ordering::Relaxed).saturating_add(1);
        let mut g = self.global.lock();
        g.ratio = ratio;
        g.step = g.step.clamp(floor, top);
        if ratio >= c.raise_ratio {
            g.low_since_ms = None;
            let due = g
                .last_raise_ms
                .is_none_or(|t| now_ms >= t.saturating_add(Self::ms(c.raise_interval)));
            if due && g.step < top {
                g.step += 1;
                g.last_raise_ms = Some(now_ms);
            }
        } else if ratio < c.lower_ratio {
            let since = *g.low_since_ms.get_or_insert(now_ms);
            if now_ms >= since.saturating_add(Self::ms(c.lower_after)) {
                if g.step > floor {
                    g.step -= 1;
                }
                g.low_since_ms = Some(now_ms);
            }
        } else {
            g.low_since_ms = None;
        }
    }

    fn level_at(&self, global_step: u8, extra: u32) -> Level {
        let floor = self.floor.load(Ordering::Relaxed);
        let ceiling = self.ceiling.load(Ordering::Relaxed);
        let wanted = u32::from(global_step.max(floor)) + extra;
        let under_attack = wanted > u32::from(ceiling);
        let bits = u8::try_from(wanted.min(u32::from(ceiling))).unwrap_or(ceiling);
        Level {
            puzzles: self.config.puzzles,
            difficulty_bits: bits,
            min_solve: if under_attack {
                self.config.min_solve_under_attack
            } else {
                Duration::ZERO
            },
            under_attack,
        }
    }

    fn extra_bits(&self, count: f64) -> u32 {
        let t = self.config.prefix_threshold;
        if count < t {
            0
        } else {
            // count >= t >= 1, so the log is >= 0; capped far above any ceiling.
            1 + (count / t).log2().floor().min(64.0) as u32
        }
    }

    /// The level for a challenge to `prefix` at `now_ms`: the global level,
    /// plus extra bits for a flooding prefix, capped at the ceiling (past
    /// it: under attack, with a minimum solve age).
    pub fn level_for(&self, prefix: NetPrefix, now_ms: u64) -> Level {
        let count = self.prefix_count(prefix, now_ms);
        let step = self.global.lock().step;
        self.level_at(step, self.extra_bits(count))
    }

    /// [`observe_challenge`](Self::observe_challenge) then
    /// [`level_for`](Self::level_for), as the challenge endpoint does.
    pub fn observe_and_level(&self, prefix: NetPrefix, now_ms: u64) -> Level {
        let hl = self.half_life_ms();
        let count = {
            let mut s = self.sketch.lock();
            s.add(&prefix, now_ms, hl);
            s.estimate(&prefix, now_ms, hl)
        };
        let step = self.global.lock().step;
        self.level_at(step, self.extra_bits(count))
    }

    /// The global level, without per-prefix extra.
    pub fn current_level(&self) -> Level {
        let step = self.global.lock().step;
        self.level_at(step, 0)
    }

    /// Level, pressure and bounds, for the admin state and metrics.
    pub fn snapshot(&self) -> DifficultySnapshot {
        let (step, ratio) = {
            let g = self.global.lock();
            (g.step, g.ratio)
        };
        DifficultySnapshot {
            level: self.level_at(step, 0),
            pressure_ratio: ratio,
            floor_bits: self.floor.load(Ordering::Relaxed),
            ceiling_bits: self.ceiling.load(Ordering::Relaxed),
        }
    }

    /// Changes floor and ceiling live (admin `difficulty_floor_bits`,
    /// `difficulty_ceiling_bits`); the global level is clamped into them.
    pub fn set_floor_ceiling(
        &self,
        floor_bits: u8,
        ceiling_bits: u8,
    ) -> Result<(), DifficultyConfigError> {
        self.config.check_bits(floor_bits, ceiling_bits)?;
        let mut g = self.global.lock();
        let old_floor = self.floor.swap(floor_bits, Ordering::Relaxed);
        let old_ceiling = self.ceiling.swap(ceiling_bits, Ordering::Relaxed);
        // Only pressure marks a room under attack. A room at rest (at its
        // floor) follows its floor; one pressure pushed past the ceiling
        // stays past the new one; anything between is kept within bounds.
        // Moving the bounds alone never puts a room past its ceiling.
        g.step = if g.step > old_ceiling {
            ceiling_bits.saturating_add(1)
        } else if g.step <= old_floor {
            floor_bits
        } else {
            g.step.clamp(floor_bits, ceiling_bits)
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::prefix::network_prefix;

    fn pfx(s: &str) -> NetPrefix {
        network_prefix(s.parse().unwrap())
    }

    fn cfg() -> DifficultyConfig {
        DifficultyConfig {
            floor_bits: 14,
            default_bits: 14,
            ..DifficultyConfig::default()
        }
    }

    proptest::proptest! {
        /// Moving a room's floor and ceiling never puts it under attack by
        /// itself: a room at rest stays at rest (at its new floor) whatever
        /// bounds it is given, and one under attack by pressure stays so.
        #[test]
        fn bounds_alone_never_mark_a_room_under_attack(
            moves in proptest::collection::vec((0u8..=20, 0u8..=20), 1..20),
        ) {
            let p = DifficultyPolicy::new(cfg()).unwrap();
            for (a, b) in moves {
                let (floor, ceiling) = (a.min(b), a.max(b));
                p.set_floor_ceiling(floor, ceiling).unwrap();
                let l = p.current_level();
                proptest::prop_assert!(!l.under_attack, "{floor}..{ceiling}: {l:?}");
                proptest::prop_assert_eq!(l.difficulty_bits, floor);
                proptest::prop_assert_eq!(l.min_solve, Duration::ZERO);
            }
        }
    }

    #[test]
    fn a_room_under_attack_stays_so_when_its_bounds_move() {
        let p = DifficultyPolicy::new(cfg()).unwrap();
        let top = p.snapshot().ceiling_bits;
        for i in 0..=u64::from(top) {
            p.set_pressure(1000.0, 1.0, i * 3_600_000);
        }
        assert!(p.current_level().under_attack);
        p.set_floor_ceiling(10, 16).unwrap();
        assert!(p.current_level().under_attack);
        assert_eq!(p.current_level().difficulty_bits, 16);
        // raised by pressure but below the ceiling: kept within the bounds
        let q = DifficultyPolicy::new(cfg()).unwrap();
        q.set_pressure(1000.0, 1.0, 0);
        let raised = q.current_level().difficulty_bits;
        assert!(raised > 14 && !q.current_level().under_attack);
        q.set_floor_ceiling(12, 20).unwrap();
        assert_eq!(q.current_level().difficulty_bits, raised);
        assert!(!q.current_level().under_attack);
    }

    #[test]
    fn default_is_valid_and_about_2_pow_22() {
        let c = DifficultyConfig::default();
        c.validate().unwrap();
        let p = DifficultyPolicy::new(c).unwrap();
        assert_eq!(p.current_level().expected_hashes(), 1 << 22);
        assert_eq!(p.config().max_bits_for_cap(), 20);
    }

    #[test]
    fn validate_rejects_nonsense() {
        let d = DifficultyConfig::default();
        assert!(matches!(
            DifficultyConfig {
                ceiling_bits: 21,
                ..d.clone()
            }
            .validate(),
            Err(DifficultyConfigError::OverCap { max: 20, .. })
        ));
        assert!(
            DifficultyConfig {
                floor_bits: 19,
                ..d.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            DifficultyConfig {
                puzzles: 0,
                ..d.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            DifficultyConfig {
                puzzles: 65,
                ..d.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            DifficultyConfig {
                half_life: Duration::ZERO,
                ..d.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            DifficultyConfig {
                lower_ratio: 3.0,
                ..d.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            DifficultyConfig {
                prefix_threshold: f64::NAN,
                ..d.clone()
            }
            .validate()
            .is_err()
        );
        // k = 1 allows up to 24 bits.
        DifficultyConfig {
            puzzles: 1,
            ceiling_bits: 24,
            ..d
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn pressure_raises_fast_and_lowers_slowly() {
        let p = DifficultyPolicy::new(cfg()).unwrap();
        let mut now = 1_000_000;
        p.set_pressure(5_000.0, 100.0, now);
        assert_eq!(
            p.current_level().difficulty_bits,
            15,
            "first high reading raises at once"
        );
        p.set_pressure(5_000.0, 100.0, now + 10);
        assert_eq!(
            p.current_level().difficulty_bits,
            15,
            "at most one step per raise_interval"
        );
        for _ in 0..10 {
            now += 1000;
            p.set_pressure(5_000.0, 100.0, now);
        }
        let l = p.current_level();
        assert_eq!(l.difficulty_bits, 20);
        assert!(l.under_attack);
        assert_eq!(l.min_solve, Duration::from_secs(3));
        // Pressure in the band between the thresholds: no change.
        for _ in 0..100 {
            now += 1000;
            p.set_pressure(150.0, 100.0, now);
        }
        assert!(p.current_level().under_attack);
        // Low pressure: one step per 30 s.
        now += 1000;
        p.set_pressure(10.0, 100.0, now);
        for _ in 0..29 {
            now += 1000;
            p.set_pressure(10.0, 100.0, now);
        }
        assert!(
            p.current_level().under_attack,
            "29 s of low pressure: not yet"
        );
        now += 1000;
        p.set_pressure(10.0, 100.0, now);
        assert!(!p.current_level().under_attack, "one step down after 30 s");
        assert_eq!(p.current_level().difficulty_bits, 20);
        for _ in 0..(6 * 30) {
            now += 1000;
            p.set_pressure(10.0, 100.0, now);
        }
        assert_eq!(p.current_level().difficulty_bits, 14, "back at the floor");
        assert_eq!(p.snapshot().pressure_ratio, 0.0);
    }

    #[test]
    fn few_joins_are_no_pressure() {
        let p = DifficultyPolicy::new(cfg()).unwrap();
        p.set_pressure(10.0, 0.0, 1000);
        assert_eq!(p.current_level().difficulty_bits, 14);
    }

    #[test]
    fn admin_floor_ceiling() {
        let p = DifficultyPolicy::new(cfg()).unwrap();
        p.set_floor_ceiling(16, 18).unwrap();
        assert_eq!(p.current_level().difficulty_bits, 16);
        assert!(p.set_floor_ceiling(19, 18).is_err());
        assert!(p.set_floor_ceiling(10, 21).is_err());
        let s = p.snapshot();
        assert_eq!((s.floor_bits, s.ceiling_bits), (16, 18));
    }

    #[test]
    fn sketch_decays_by_half_life() {
        let p = DifficultyPolicy::new(cfg()).unwrap();
        let a = pfx("198.51.100.1");
        for _ in 0..64 {
            p.observe_challenge(a, 5_000);
        }
        assert!((p.prefix_count(a, 5_000) - 64.0).abs() < 1e-6);
        assert!((p.prefix_count(a, 15_000) - 32.0).abs() < 1e-6);
        assert!(p.prefix_count(pfx("198.51.101.1"), 5_000) < 1.0);
    }

    #[test]
    fn sketch_survives_renormalisation() {
        let p = DifficultyPolicy::new(cfg()).unwrap();
        let a = pfx("198.51.100.1");
        // 50 half-lives apart, then 50 more: crosses the renormalisation point.
        p.observe_challenge(a, 1_000);
        p.observe_challenge(a, 501_000);
        p.observe_challenge(a, 1_001_000);
        let c = p.prefix_count(a, 1_001_000);
        assert!((c - 1.0).abs() < 1e-6, "{c}");
        assert!(c.is_finite());
    }
}
