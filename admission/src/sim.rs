//! The discrete-event simulator behind `sluice simulate`: a crowd of
//! visitors run against **the real admission code** in virtual time.
//!
//! Nothing here models the queue a second time. A [`MemoryQueueStore`] on a
//! [`ManualClock`] holds one room; every tick (`tick_ms`, 100 ms like the
//! gateway's ticker) the simulator moves the clock and calls
//! [`MemoryQueueStore::advance_now`], exactly as the gateway's ticker calls
//! `advance`. Between ticks the visitors' own actions go to the same room
//! state machine ([`RoomCore`], through [`MemoryQueueStore::inspect`]) at
//! their exact virtual times: `join`, `claim`, `session_start`,
//! `session_end`. So the token bucket, the passthrough rule, the claim
//! window and its no-show refunds, late claims, the session cap
//! (`max_active`, Little's law) and the poll intervals
//! ([`poll_after_ms_eta`]) are the production ones.
//!
//! # A visitor's life
//!
//! ```text
//! arrive ──solve PoW──▶ join ──▶ passthrough? ──yes──▶ claim + session
//!                                  │ no
//!                                  ▼
//!                 poll every poll_after_ms_eta(position, rate)
//!                  (answered from the last tick's snapshot, as the
//!                   gateway answers from its cached snapshot)
//!                                  │ seq ≤ frontier
//!                                  ▼
//!                          claim + session ──▶ leaves after session_seconds
//! ```
//!
//! - **Arrivals** ([`Arrivals`]): all at once, evenly over a ramp, a Poisson
//!   process, or given times.
//! - **Solve time** ([`Dist`]): arrival → join.
//! - **Patience** (`Option<Dist>`, `None` = infinite): a visitor leaves at
//!   `arrival + patience` if it has not reached the origin by then. It stops
//!   polling and never claims: if the frontier had already passed it, its
//!   place is a no-show and comes back as credit when the claim window
//!   ends. Patience running out during the solve means it never joins.
//! - **Claim**: an admitted visitor only claims its place at its next poll
//!   (like a real page), so waits include the poll granularity.
//! - **Lanes** ([`crate::lanes`]): with a room that has priority lanes,
//!   each arriving visitor is drawn into a lane by `lane_mix` (everyone in
//!   the default lane, the last, without one), joins that lane's FIFO with
//!   [`RoomCore::join_lane`], compares its lane seq with its lane's
//!   frontier, claims the place the store handed its seq, and polls at the
//!   interval of its lane's ETA (its position scaled by the lane's share,
//!   as the gateway's `lane_eta`). The report then carries per lane the
//!   visitors, admissions, waits, drain and Kendall's tau within the lane.
//! - **Session**: a claimed visitor stays `session_seconds`, renewing its
//!   session with each request; the store's session therefore ends
//!   `session_ttl` after its last request (`session_start` with a TTL of
//!   `session_seconds + session_ttl`), or at once at the end of the visit
//!   when `revoke_at_end` (the origin answered `Sluice-Command: revoke`).
//!
//! # What the figures mean
//!
//! - **wait**: from arrival to reaching the origin (the claim), for every
//!   visitor who got there (passthrough included: their wait is the solve).
//! - **drain**: from the start until the frontier reached the tail after the
//!   last join, i.e. the moment the last visitor in line was admitted
//!   (abandoned places in line are passed over too, as in production).
//! - **origin requests/s**: every claimed visitor sends
//!   `requests_per_visitor_per_sec` (the room setting used for calibration)
//!   for `session_seconds`; the value for second `s` is
//!
//!   ```text
//!   origin_rps[s] = requests_per_visitor_per_sec × Σ_visitors overlap([claim, claim + session_seconds], [s, s + 1])
//!   ```
//!
//!   With `session_seconds = 1` and one request per second it is the number
//!   of visitors reaching the origin per second (seed 003's "flat origin
//!   rate of 200/s"); with a 5-minute session it is the load of everyone
//!   browsing at once (Little's law: `rate × session × requests`).
//!   `origin_mean_rps` averages over the seconds from the first to the last
//!   with any load.
//! - **edge polls/s**: status polls per second (joins not included); the
//!   mean is over the seconds from the first to the last poll.
//!
//! # Speed
//!
//! Polls, the bulk of the events (tens per visitor), go to a timing wheel of
//! 100 ms buckets (a poll is never more than 24 s ahead), each sorted by
//! time when its turn comes, so scheduling one is O(1) and the buckets
//! being filled stay in cache; the only other timed event (a revoke at the end
//! of a visit) uses a binary heap. Per visitor the simulator keeps 16 bytes
//! and one `u32` wait (two with lanes: the room's and the lane's); the store's own per-session state is the real one.
//! Deterministic: every random draw comes from one ChaCha8 stream seeded by
//! `seed`, consumed in event order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use rand::{RngExt as _, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};
use serde::Serialize;

use crate::error::AdmissionError;
use crate::lanes::LaneMode;
use crate::memory::MemoryQueueStore;
use crate::poll::{MAX_POLL_MS, MIN_POLL_MS, RateMeter, poll_after_ms_eta};
use crate::prequeue::{PlaceMap, PrequeueDraw};
use crate::room::RoomCore;
use crate::settings::{QueueMethod, RoomSettings};
use crate::store::{LaneSnapshot, QueueStore, Snapshot};
use sluice_clock::ManualClock;

/// The room id the simulator uses inside its private store.
const ROOM: &str = "sim";
/// Width of one timing-wheel bucket, ms. Shorter than the shortest poll
/// interval (800 ms with jitter), so a poll never lands in the bucket being
/// run; coarse enough that the buckets being filled stay in cache.
const BUCKET_MS: u64 = 100;
/// Timing-wheel buckets: a power of two covering the longest poll interval
/// with jitter (`MAX_POLL_MS × 1.2`).
const WHEEL: usize = 256;
const _: () = assert!((MAX_POLL_MS * 12 / 10 / BUCKET_MS) < WHEEL as u64);
const _: () = assert!(BUCKET_MS < MIN_POLL_MS * 8 / 10);
/// The z-score of the 95th percentile of a normal distribution.
const Z95: f64 = 1.644_853_626_951_472_2;
/// The longest virtual time accepted (times are kept in `u32` ms).
pub const MAX_HORIZON_SECONDS: f64 = 40.0 * 86_400.0;
/// A "never" deadline (infinite patience).
const NEVER: u32 = u32::MAX;
/// The arrival time of a visitor carried over from a live room (a pending
/// claim): it reaches the origin like the others, but its wait is unknown,
/// so it is left out of the waits and the admitted count.
const CARRIED: u32 = u32::MAX;

/// When visitors arrive.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrivals {
    /// Everyone at t = 0 (a sale that opens at a fixed time).
    Spike,
    /// Evenly spread over `seconds`: visitor `i` of `n` at `i × seconds / n`.
    Ramp {
        /// Length of the ramp.
        seconds: f64,
    },
    /// A Poisson process of `per_sec` arrivals per second (exponential gaps)
    /// until `visitors` have arrived.
    Poisson {
        /// Mean arrivals per second.
        per_sec: f64,
    },
    /// Given arrival times in seconds (e.g. from a CSV of a past sale); the
    /// number of visitors is the number of times.
    Times(Vec<f64>),
}

/// A distribution of durations, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    /// Always the same.
    Fixed(f64),
    /// Log-normal with the given median and 95th percentile:
    /// `μ = ln(median)`, `σ = ln(p95 / median) / 1.645`.
    LogNormal {
        /// The median, seconds.
        median: f64,
        /// The 95th percentile, seconds (≥ median).
        p95: f64,
    },
}

impl Dist {
    /// A log-normal from its median and 95th percentile, or a fixed value
    /// when `p95` is absent or equal to the median.
    pub fn from_median_p95(median: f64, p95: Option<f64>) -> Self {
        match p95 {
            Some(p) if p != median => Dist::LogNormal { median, p95: p },
            _ => Dist::Fixed(median),
        }
    }

    fn validate(&self, what: &str) -> Result<(), SimError> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        match *self {
            Dist::Fixed(v) if ok(v) => Ok(()),
            Dist::LogNormal { median, p95 } if ok(median) && ok(p95) && p95 >= median => Ok(()),
            _ => Err(SimError::Invalid(format!(
                "{what}: durations must be finite, non-negative, and p95 ≥ median ({self:?})"
            ))),
        }
    }

    fn sampler(&self) -> Sampler {
        match *self {
            Dist::Fixed(v) => Sampler::Fixed(v),
            Dist::LogNormal { median, .. } if median <= 0.0 => Sampler::Fixed(0.0),
            Dist::LogNormal { median, p95 } => {
                let sigma = (p95 / median).ln() / Z95;
                match LogNormal::new(median.ln(), sigma) {
                    Ok(d) => Sampler::LogNormal(d),
                    Err(_) => Sampler::Fixed(median),
                }
            }
        }
    }
}

enum Sampler {
    Fixed(f64),
    LogNormal(LogNormal<f64>),
}

impl Sampler {
    /// A sample in whole milliseconds, saturating at `u32::MAX − 1`.
    fn sample_ms(&self, rng: &mut ChaCha8Rng) -> u32 {
        let s = match self {
            Sampler::Fixed(v) => *v,
            Sampler::LogNormal(d) => d.sample(rng),
        };
        secs_to_ms(s)
    }
}

fn secs_to_ms(s: f64) -> u32 {
    let ms = (s * 1000.0).round();
    if ms.is_nan() || ms <= 0.0 {
        0
    } else if ms >= f64::from(NEVER - 1) {
        NEVER - 1
    } else {
        ms as u32
    }
}

/// Everything a simulation run needs.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Visitors who arrive (ignored with [`Arrivals::Times`]: one per time).
    pub visitors: u64,
    /// Visitors already in line at t = 0 (a "what-if" from a live room):
    /// they join first, already solved, and the bucket starts with no
    /// credit (a room with a line has spent its credit).
    pub initial_queue: u64,
    /// Sessions already on the origin at t = 0 (a live room's
    /// `active_sessions`): they hold slots under the cap and load the
    /// origin as if each had just started (they last `session_seconds`,
    /// then their session expires `session_ttl` later, or at once with
    /// `revoke_at_end`): a cautious guess, since their real ages are not
    /// known. Not counted as visitors.
    pub initial_active: u64,
    /// Places already admitted and not yet claimed at t = 0 (a live room's
    /// `pending_claims`): they hold slots under the cap, and their visitors
    /// claim at their next poll and stay like the others. Not counted as
    /// visitors (their waits are not known).
    pub initial_pending: u64,
    /// Per lane of `room.lanes`, the initial line already in it (a live
    /// room's `lanes[].waiting`); empty: all of `initial_queue` in the
    /// default lane. Must add up to `initial_queue`.
    pub initial_lanes: Vec<u64>,
    /// When the `visitors` arrive.
    pub arrivals: Arrivals,
    /// Per lane of `room.lanes`, the share of arriving visitors drawn into
    /// it (adding up to 1); empty: everyone in the default lane (the last),
    /// as visitors without an enqueue token naming a lane.
    pub lane_mix: Vec<f64>,
    /// The room, as the gateway would configure it (rate or capacity
    /// calibration, burst, max_active, claim window, session TTL,
    /// requests per visitor per second for the origin load).
    pub room: RoomSettings,
    /// How long a claimed visitor stays on the origin, seconds (> 0).
    pub session_seconds: f64,
    /// End each session at once when the visit ends (the origin sends
    /// `Sluice-Command: revoke`) instead of letting it expire.
    pub revoke_at_end: bool,
    /// Proof-of-work solve time (arrival → join).
    pub solve: Dist,
    /// How long a visitor is willing to wait for the origin; `None`: forever.
    pub patience: Option<Dist>,
    /// The origin's capacity, requests/s, for the report only (the room's
    /// `capacity_rps` when that is absent).
    pub capacity_rps: Option<f64>,
    /// Seed of the random stream.
    pub seed: u64,
    /// The store tick, ms: a divisor of 1000 (default 100).
    pub tick_ms: u64,
    /// Stop after this much virtual time even if the line is not drained
    /// (the report then says `completed: false`). Default 7 days.
    pub horizon_seconds: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            visitors: 50_000,
            initial_queue: 0,
            initial_active: 0,
            initial_pending: 0,
            initial_lanes: Vec::new(),
            arrivals: Arrivals::Spike,
            lane_mix: Vec::new(),
            room: RoomSettings::default(),
            session_seconds: 1.0,
            revoke_at_end: false,
            solve: Dist::Fixed(0.0),
            patience: None,
            capacity_rps: None,
            seed: 1,
            tick_ms: 100,
            horizon_seconds: 7.0 * 86_400.0,
        }
    }
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A configuration value out of range (the message names it).
    #[error("invalid simulation: {0}")]
    Invalid(String),
    /// The room settings were refused by the store.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
}

impl SimConfig {
    /// The room's settings as the run configures them: a `random` room
    /// without a seed gets one of the run's own (from `seed`), so a run is
    /// repeatable.
    pub fn room_settings(&self) -> RoomSettings {
        let mut room = self.room.clone();
        if room.method == QueueMethod::Random && room.prequeue_seed.is_none() {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&self.seed.to_be_bytes());
            room.prequeue_seed = Some(crate::prequeue::to_hex(&bytes));
        }
        room
    }

    /// Checks every field; the first bad one is reported.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Invalid(m));
        self.room_settings()
            .validate()
            .map_err(AdmissionError::from)?;
        if !(self.tick_ms >= 1 && self.tick_ms <= 1000 && 1000 % self.tick_ms == 0) {
            return bad(format!("tick_ms must divide 1000, got {}", self.tick_ms));
        }
        if !(self.session_seconds.is_finite()
            && self.session_seconds > 0.0
            && self.session_seconds <= 86_400.0)
        {
            return bad("session length must be between 1 ms and 24 h".into());
        }
        if !(self.horizon_seconds.is_finite()
            && self.horizon_seconds > 0.0
            && self.horizon_seconds <= MAX_HORIZON_SECONDS)
        {
            return bad(format!(
                "horizon must be between 0 and {MAX_HORIZON_SECONDS} s"
            ));
        }
        let total = self
            .initial_queue
            .saturating_add(self.initial_pending)
            .saturating_add(self.initial_active)
            .saturating_add(match &self.arrivals {
                Arrivals::Times(t) => t.len() as u64,
                _ => self.visitors,
            });
        if total >= u64::from(u32::MAX) {
            return bad(format!("at most {} visitors", u32::MAX - 1));
        }
        match &self.arrivals {
            Arrivals::Spike => {}
            Arrivals::Ramp { seconds } => {
                if !(seconds.is_finite() && *seconds >= 0.0 && *seconds <= MAX_HORIZON_SECONDS) {
                    return bad(format!("ramp length must be 0 to {MAX_HORIZON_SECONDS} s"));
                }
            }
            Arrivals::Poisson { per_sec } => {
                if !(per_sec.is_finite() && *per_sec > 0.0) {
                    return bad("poisson arrival rate must be positive".into());
                }
            }
            Arrivals::Times(t) => {
                if let Some(x) = t.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
                    return bad(format!("arrival times must be finite and ≥ 0, got {x}"));
                }
            }
        }
        self.validate_lanes()?;
        self.solve.validate("solve time")?;
        if let Some(p) = &self.patience {
            p.validate("patience")?;
        }
        if let Some(c) = self.capacity_rps
            && !(c.is_finite() && c > 0.0)
        {
            return bad("capacity must be positive".into());
        }
        Ok(())
    }
}

impl SimConfig {
    fn validate_lanes(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Invalid(m));
        let k = self.room.lanes.len();
        if !self.lane_mix.is_empty() {
            if k == 0 {
                return bad("a lane mix needs a room with lanes".into());
            }
            if self.lane_mix.len() != k {
                return bad(format!(
                    "the lane mix has {} shares for {k} lanes",
                    self.lane_mix.len()
                ));
            }
            if let Some(x) = self
                .lane_mix
                .iter()
                .find(|x| !(x.is_finite() && **x >= 0.0 && **x <= 1.0))
            {
                return bad(format!("a lane's share must be between 0 and 1, got {x}"));
            }
            let sum: f64 = self.lane_mix.iter().sum();
            if (sum - 1.0).abs() > 1e-6 {
                return bad(format!("the lanes' shares must add up to 1, got {sum}"));
            }
        }
        if !self.initial_lanes.is_empty() {
            if self.initial_lanes.len() != k {
                return bad(format!(
                    "the initial line has {} lanes for a room with {k}",
                    self.initial_lanes.len()
                ));
            }
            let sum = self
                .initial_lanes
                .iter()
                .fold(0u64, |a, b| a.saturating_add(*b));
            if sum != self.initial_queue {
                return bad(format!(
                    "the initial line's lanes add up to {sum}, not {}",
                    self.initial_queue
                ));
            }
        }
        Ok(())
    }
}

/// One lane's figures in a [`SimReport`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LaneReport {
    /// The lane's id.
    pub id: String,
    /// Its weight.
    pub weight: u32,
    /// Visitors drawn into it (the initial line's included).
    pub visitors: u64,
    /// Those who reached the origin.
    pub admitted: u64,
    /// Those who gave up.
    pub abandoned: u64,
    /// Admitted on the spot at join.
    pub passthrough: u64,
    /// Arrival → origin, for those admitted.
    pub wait_seconds: WaitStats,
    /// Seconds until the lane's last visitor in line was admitted; `None`
    /// when it never drained within the horizon, or nobody was in it.
    pub drain_seconds: Option<f64>,
    /// Kendall's tau-b between arrival order and lane seq within the lane
    /// (FIFO within a lane: 1 when solve times are equal).
    pub kendall_tau: Option<f64>,
}

/// Wait statistics, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WaitStats {
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Longest.
    pub max: f64,
}

/// Edge status polls per second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PollStats {
    /// Mean over the seconds from the first to the last poll.
    pub mean: f64,
    /// The busiest second.
    pub peak: u64,
    /// Every poll.
    pub total: u64,
}

/// One second of the time series (values at the end of second `t`, counts
/// during it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SecondRow {
    /// The second (from the start).
    pub t: u64,
    /// Visitors in line (`tail − frontier`) at the end of the second.
    pub queue_length: u64,
    /// Joins during the second.
    pub joined: u64,
    /// Seqs the frontier passed during the second (passthrough included).
    pub admitted_per_sec: u64,
    /// Places claimed during the second (visitors reaching the origin).
    pub claimed: u64,
    /// Visitors who gave up during the second.
    pub abandoned: u64,
    /// Sessions the store counts at the end of the second.
    pub active_sessions: u64,
    /// Admitted places not yet claimed (within their claim window).
    pub pending_claims: u64,
    /// Origin requests during the second (see the module docs).
    pub origin_rps: f64,
    /// Edge status polls during the second.
    pub polls: u64,
    /// Edge requests of the same visitors pushed instead of polling (a
    /// stream opened after each join, one poll at each admission): the
    /// status events pushed meanwhile follow the same cadence as the
    /// polls, at most as many (`visitor::stream`'s buckets).
    pub push_requests: u64,
}

/// What a run found. Serialises (without the series) as the JSON of
/// `sluice simulate --json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SimReport {
    /// Visitors simulated (arrivals plus the initial line).
    pub visitors: u64,
    /// Visitors who reached the origin (claimed their place).
    pub admitted: u64,
    /// Visitors who gave up before reaching the origin (during the solve,
    /// in line, or admitted but gone before their next poll).
    pub abandoned: u64,
    /// Visitors neither admitted nor gone when the horizon stopped the run.
    pub unfinished: u64,
    /// Admitted on the spot at join (nobody waiting, credit left).
    pub passthrough: u64,
    /// Seqs the frontier passed (claimed or not).
    pub frontier_admitted: u64,
    /// No-show slots given back as credit after the claim window.
    pub refunded: u64,
    /// Claims after the claim window (honoured, credit taken back).
    pub late_claims: u64,
    /// Whether the run ended by itself (everyone admitted or gone, line
    /// drained) rather than at the horizon.
    pub completed: bool,
    /// Seconds until the last visitor in line was admitted; `None` when the
    /// line never drained within the horizon.
    pub drain_seconds: Option<f64>,
    /// The longest line seen (`tail − frontier`).
    pub peak_queue_length: u64,
    /// Arrival → origin, for those admitted.
    pub wait_seconds: WaitStats,
    /// Kendall's tau-b between the order the admitted visitors arrived in
    /// (at the waiting room, before their proof of work) and their places
    /// ([`crate::fairness`]): 1 when nobody was overtaken; below 1 as solve
    /// times differ (a slow device joins later than it arrived). `None`
    /// when undefined: fewer than two admitted, or all arriving at once (a
    /// spike has no arrival order).
    pub kendall_tau: Option<f64>,
    /// The busiest second of origin requests.
    pub origin_peak_rps: f64,
    /// Mean origin requests/s over the seconds with load.
    pub origin_mean_rps: f64,
    /// The origin capacity stated, if any.
    pub capacity_rps: Option<f64>,
    /// The admission rate in force (after calibration).
    pub rate_per_sec: f64,
    /// The burst in force.
    pub burst: f64,
    /// The cap on active sessions in force, if any.
    pub max_active: Option<u64>,
    /// Edge status polls.
    pub edge_polls_per_sec: PollStats,
    /// Edge requests per second polling (joins and status polls).
    pub edge_requests_polling: PollStats,
    /// Edge requests per second with push (joins, stream opens and one
    /// poll per admission): what the waiting line costs the edge in
    /// requests when the page streams its status.
    pub edge_requests_pushed: PollStats,
    /// Per lane, in the room's order; empty (and left out of the JSON)
    /// without lanes. With lanes `kendall_tau` above is room-wide (arrival
    /// against the place the store handed out), which the lanes reorder on
    /// purpose; each lane's own is FIFO's measure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneReport>,
    /// Virtual seconds simulated.
    pub simulated_seconds: f64,
    /// The per-second time series (not serialised: `--csv` writes it).
    #[serde(skip)]
    pub series: Vec<SecondRow>,
}

/// One visitor before it joins, 16 bytes, in join order.
#[derive(Clone, Copy, Debug)]
struct Visitor {
    /// Arrival, ms.
    arrival: u32,
    /// Join (arrival + solve), ms.
    join: u32,
    /// Leaves at this time if not admitted ([`NEVER`]: never).
    deadline: u32,
    /// Its lane (index in the room's lanes; 0 without lanes).
    lane: u8,
}

/// A visitor in line, as it sits in the timing wheel: everything a poll
/// needs travels with it, so a poll touches no per-visitor array (random
/// accesses to one would cost a cache miss per poll).
#[derive(Clone, Copy, Debug)]
struct Waiting {
    /// When the poll is due, ms.
    at: u32,
    seq: u32,
    arrival: u32,
    deadline: u32,
    lane: u8,
}

/// The lane of a [`Waiting`] that is a place rather than a lane seq (a
/// live room's pending claim carried over): claimed as a place.
const PLACE: u8 = u8::MAX;

/// One lane's running figures.
#[derive(Default)]
struct LaneAcc {
    visitors: u64,
    /// Visitors whose join time came (joined, refused or gone while
    /// solving).
    join_done: u64,
    admitted: u64,
    abandoned: u64,
    passthrough: u64,
    waits_ms: Vec<u32>,
    wait_sum_ms: u128,
    /// (arrival ms, lane seq) of every visitor admitted.
    order: Vec<(u32, u32)>,
    drain_ms: Option<u64>,
}

/// Polls a future the memory store returned: they never wait.
fn now_or_never<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

fn bump(v: &mut Vec<u64>, i: usize) {
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += 1;
}

/// The mutable state of a run, apart from the store.
/// A `random` room's places, as a gateway finds them: the draw that holds
/// a seq ([`RoomCore::draw_of`]) and that draw's place map, built once.
struct DrawPlaces {
    seed: Vec<u8>,
    maps: std::collections::HashMap<u64, PlaceMap>,
}

impl DrawPlaces {
    /// The place of `seq`; `None` while it waits for its draw.
    fn place(&mut self, core: &RoomCore, seq: u64, frontier: u64) -> Option<u64> {
        match core.draw_of(seq) {
            Some(d) => {
                let seed = &self.seed;
                let map = self.maps.entry(d.from).or_insert_with(|| {
                    let s = match d.k {
                        0 => seed.clone(),
                        k => crate::prequeue::draw_seed(seed, k).to_vec(),
                    };
                    PlaceMap::new(&s, d)
                });
                Some(map.place(seq))
            }
            None => (seq <= frontier).then_some(seq),
        }
    }
}

/// The position a `random` room shows a seq waiting for its draw (as the
/// gateway's `next_draw_position`): those left in the current draw plus
/// half of those waiting for the next.
fn next_draw_position(core: &RoomCore, frontier: u64) -> u64 {
    let end = core
        .current_draw()
        .map_or(frontier, |d: PrequeueDraw| d.end().max(frontier));
    let next = core.bucket.tail.saturating_sub(end);
    ((end - frontier) + next.div_ceil(2)).max(1)
}

struct Engine {
    rng: ChaCha8Rng,
    /// A `random` room's places ([`DrawPlaces`]); `None` for any other.
    draws: Option<DrawPlaces>,
    visitors: Vec<Visitor>,
    next_join: usize,
    /// Polls due, by bucket of [`BUCKET_MS`].
    wheel: Vec<Vec<Waiting>>,
    /// Polls scheduled and not yet run (in the wheel or in `due`).
    wheel_len: usize,
    /// The bucket being run, sorted by (time, seq), and the next to run.
    due: Vec<Waiting>,
    due_pos: usize,
    /// Revokes due: (ms, seq).
    revokes: BinaryHeap<Reverse<(u64, u64)>>,
    /// The gateway's cached view, refreshed every tick.
    frontier: u64,
    poll_rate: f64,
    session_ms: u64,
    session_ttl_ms: u64,
    revoke: bool,
    /// Lanes: how they share the rate, the last tick's lane snapshots
    /// (the gateway's cached view; empty without lanes) and each lane's
    /// figures.
    lane_mode: LaneMode,
    lane_snap: Vec<LaneSnapshot>,
    lane_acc: Vec<LaneAcc>,
    /// Whether sessions go to the store (see [`run`]'s docs); otherwise
    /// they are counted in `sessions_diff` (by second, difference array).
    store_sessions: bool,
    sessions_diff: Vec<i64>,
    sid: String,
    // results
    waits_ms: Vec<u32>,
    /// (arrival ms, place) of every visitor admitted, for the fairness
    /// measure.
    order: Vec<(u32, u32)>,
    wait_sum_ms: u128,
    admitted: u64,
    abandoned: u64,
    passthrough: u64,
    peak_queue: u64,
    drain_ms: Option<u64>,
    origin_end_ms: u64,
    polls_per_sec: Vec<u64>,
    joins_per_sec: Vec<u64>,
    /// Requests a pushed visitor makes instead of polls: the stream's
    /// open (once, after its join) and the one poll that sets the
    /// admission cookie.
    push_requests_per_sec: Vec<u64>,
    abandoned_per_sec: Vec<u64>,
    /// Origin load: whole seconds by difference array, partial seconds
    /// directly (visitor-seconds).
    origin_diff: Vec<i64>,
    origin_part: Vec<f64>,
}

impl Engine {
    fn abandon_at(&mut self, ms: u32, lane: u8) {
        self.abandoned += 1;
        bump(&mut self.abandoned_per_sec, (ms / 1000) as usize);
        if let Some(a) = self.lane_acc.get_mut(usize::from(lane)) {
            a.abandoned += 1;
        }
    }

    /// The position the poll interval of a visitor at `position` in `lane`
    /// is computed from: scaled by the lane's share of the rate, as the
    /// gateway's ETA (`visitor::lane_eta`): weighted, by the weights of
    /// the lanes with someone waiting over its own; strict, behind
    /// everyone waiting in the lanes above it.
    fn lane_position(&self, lane: usize, position: u64) -> u64 {
        let snap = &self.lane_snap;
        match self.lane_mode {
            LaneMode::Strict => {
                snap[..lane].iter().map(LaneSnapshot::waiting).sum::<u64>() + position
            }
            LaneMode::Weighted => {
                let wsum: u64 = snap
                    .iter()
                    .enumerate()
                    .filter(|(j, l)| *j == lane || l.waiting() > 0)
                    .map(|(_, l)| u64::from(l.weight))
                    .sum();
                let w = u64::from(snap[lane].weight).max(1);
                (position * wsum).div_ceil(w)
            }
        }
    }

    /// The session id of `seq` as the gateway names it
    /// ([`crate::session_of`]: the store starts that session itself for a
    /// place admitted at once), in a reused buffer taken out of `self`
    /// (give it back after use).
    fn take_session_id(&mut self, epoch: u64, seq: u64) -> String {
        let mut sid = std::mem::take(&mut self.sid);
        sid.clear();
        let _ = write!(sid, "{epoch}.{seq}");
        sid
    }

    /// A visitor reaches the origin at `t` on place `seq` (its lane seq
    /// `lane_seq` in lane `lane`, with lanes).
    fn reach_origin(
        &mut self,
        core: &mut RoomCore,
        t: u64,
        seq: u64,
        arrival: u32,
        (lane, lane_seq): (u8, u64),
    ) {
        let ttl = self.session_ms + self.session_ttl_ms;
        if self.store_sessions {
            let sid = self.take_session_id(core.epoch, seq);
            core.session_start(t, &sid, ttl);
            self.sid = sid;
            if self.revoke {
                self.revokes.push(Reverse((t + self.session_ms, seq)));
            }
        } else {
            if self.revoke {
                // a revoke at `end` is run after the tick ending at `end`
                let end = t + self.session_ms;
                self.count_session(t, end / 1000);
            } else {
                // expired at `now` when `deadline ≤ now`
                let deadline = t + ttl;
                self.count_session(t, deadline.div_ceil(1000).saturating_sub(1));
            }
        }
        self.add_origin(t, t + self.session_ms);
        if arrival == CARRIED {
            return;
        }
        let wait = t.saturating_sub(u64::from(arrival));
        self.waits_ms.push(wait.min(u64::from(u32::MAX)) as u32);
        self.order
            .push((arrival, seq.min(u64::from(u32::MAX)) as u32));
        self.wait_sum_ms += u128::from(wait);
        self.admitted += 1;
        if let Some(a) = self.lane_acc.get_mut(usize::from(lane)) {
            a.waits_ms.push(wait.min(u64::from(u32::MAX)) as u32);
            a.order
                .push((arrival, lane_seq.min(u64::from(u32::MAX)) as u32));
            a.wait_sum_ms += u128::from(wait);
            a.admitted += 1;
        }
    }

    /// Counts a session started at `start` in the rows of the seconds from
    /// `start`'s to `first_gone` (excluded), as the store's snapshot at the
    /// end of each second would.
    fn count_session(&mut self, start: u64, first_gone: u64) {
        let a = (start / 1000) as usize;
        let r = first_gone as usize;
        if r <= a {
            return;
        }
        if self.sessions_diff.len() <= r {
            self.sessions_diff.resize(r + 1, 0);
        }
        self.sessions_diff[a] += 1;
        self.sessions_diff[r] -= 1;
    }

    fn add_origin(&mut self, a: u64, b: u64) {
        self.origin_end_ms = self.origin_end_ms.max(b);
        let (sa, sb) = ((a / 1000) as usize, (b / 1000) as usize);
        if self.origin_part.len() <= sb + 1 {
            self.origin_part.resize(sb + 2, 0.0);
            self.origin_diff.resize(sb + 2, 0);
        }
        if sa == sb {
            self.origin_part[sa] += (b - a) as f64 / 1000.0;
        } else {
            self.origin_part[sa] += ((sa as u64 + 1) * 1000 - a) as f64 / 1000.0;
            self.origin_part[sb] += (b - sb as u64 * 1000) as f64 / 1000.0;
            self.origin_diff[sa + 1] += 1;
            self.origin_diff[sb] -= 1;
        }
    }

    /// Schedules the next poll of a waiting visitor, or its departure if its
    /// patience runs out first.
    fn schedule_poll(&mut self, t: u64, mut w: Waiting, position: u64) {
        let dt = poll_after_ms_eta(position.max(1), self.poll_rate, &mut self.rng);
        let next = t + dt.clamp(BUCKET_MS, (WHEEL as u64 - 1) * BUCKET_MS);
        if next > u64::from(w.deadline) {
            self.abandon_at(w.deadline, w.lane);
        } else {
            w.at = next as u32;
            self.wheel[(next / BUCKET_MS) as usize & (WHEEL - 1)].push(w);
            self.wheel_len += 1;
        }
    }

    fn join(&mut self, core: &mut RoomCore, t: u64) {
        let idx = self.next_join;
        self.next_join += 1;
        let v = self.visitors[idx];
        let lanes = !self.lane_acc.is_empty();
        if lanes {
            self.lane_acc[usize::from(v.lane)].join_done += 1;
        }
        if v.join > v.deadline {
            // gave up while solving
            self.abandon_at(v.deadline, v.lane);
            return;
        }
        bump(&mut self.joins_per_sec, (t / 1000) as usize);
        let lane = lanes.then_some(usize::from(v.lane));
        let Ok(o) = core.join_lane(t, lane) else {
            // a closed (or full `reject`) room turns the visitor away
            self.abandon_at(v.join, v.lane);
            return;
        };
        if o.admitted {
            // the join itself claims a passthrough place
            self.passthrough += 1;
            let place = if lanes {
                self.lane_acc[usize::from(v.lane)].passthrough += 1;
                o.place
            } else {
                o.seq
            };
            self.reach_origin(core, t, place, v.arrival, (v.lane, o.seq));
        } else {
            let w = Waiting {
                at: 0,
                seq: o.seq as u32,
                arrival: v.arrival,
                deadline: v.deadline,
                lane: v.lane,
            };
            // Pushed, it opens its stream now.
            bump(&mut self.push_requests_per_sec, (t / 1000) as usize);
            let position = match lane {
                Some(i) => self.lane_position(i, o.position()),
                None => o.position(),
            };
            self.schedule_poll(t, w, position);
        }
    }

    fn poll(&mut self, core: &mut RoomCore, t: u64, w: Waiting) {
        bump(&mut self.polls_per_sec, (t / 1000) as usize);
        let seq = u64::from(w.seq);
        if !self.lane_snap.is_empty() && w.lane != PLACE {
            // a lane seq: admitted once its lane's frontier passed it,
            // on the place the store handed it
            let lane = usize::from(w.lane);
            let front = self.lane_snap[lane].frontier;
            if seq <= front
                && let Some(place) = core.place_of(Some(lane), seq)
                && core.claim(place).is_admitted()
            {
                bump(&mut self.push_requests_per_sec, (t / 1000) as usize);
                self.reach_origin(core, t, place, w.arrival, (w.lane, seq));
            } else {
                let position = self.lane_position(lane, seq.saturating_sub(front));
                self.schedule_poll(t, w, position);
            }
            return;
        }
        // a random room's seq is admitted by its place in its draw
        let place = match &mut self.draws {
            Some(d) if w.lane != PLACE => d.place(core, seq, self.frontier),
            _ => Some(seq),
        };
        match place {
            Some(p) if p <= self.frontier && core.claim(p).is_admitted() => {
                // Pushed, the admission comes on the stream and one poll
                // fetches its cookie.
                bump(&mut self.push_requests_per_sec, (t / 1000) as usize);
                self.reach_origin(core, t, p, w.arrival, (PLACE, seq));
            }
            Some(p) => self.schedule_poll(t, w, p.saturating_sub(self.frontier)),
            None => {
                let position = next_draw_position(core, self.frontier);
                self.schedule_poll(t, w, position);
            }
        }
    }

    /// Makes the bucket starting at `t` the one being run. The previous
    /// one is spent; its allocation goes back to the wheel for reuse. No
    /// poll lands in the bucket being run (they are ≥ 800 ms ahead), so its
    /// slot is empty.
    fn load_bucket(&mut self, t: u64) {
        let slot = (t / BUCKET_MS) as usize & (WHEEL - 1);
        let bucket = std::mem::take(&mut self.wheel[slot]);
        // counting sort by ms (stable: same-ms polls in scheduling order)
        let mut start = [0usize; BUCKET_MS as usize + 1];
        for w in &bucket {
            start[(u64::from(w.at) - t) as usize + 1] += 1;
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        let mut sorted = std::mem::take(&mut self.due);
        sorted.clear();
        sorted.resize(
            bucket.len(),
            Waiting {
                at: 0,
                seq: 0,
                arrival: 0,
                deadline: 0,
                lane: 0,
            },
        );
        for w in &bucket {
            let k = (u64::from(w.at) - t) as usize;
            sorted[start[k]] = *w;
            start[k] += 1;
        }
        let mut spent = bucket;
        spent.clear();
        self.wheel[slot] = spent;
        self.due = sorted;
        self.due_pos = 0;
    }

    fn pending_before(&self, t1: u64) -> bool {
        self.wheel_len > 0
            || self
                .visitors
                .get(self.next_join)
                .is_some_and(|v| u64::from(v.join) < t1)
            || self.revokes.peek().is_some_and(|Reverse((t, _))| *t < t1)
    }

    /// Runs every visitor action in `[t0, t1)` against the room, in time
    /// order (within one ms: revokes, joins, polls).
    fn step(&mut self, core: &mut RoomCore, t0: u64, t1: u64) {
        if self.pending_before(t1) {
            for t in t0..t1 {
                while let Some(&Reverse((te, seq))) = self.revokes.peek() {
                    if te > t {
                        break;
                    }
                    self.revokes.pop();
                    let sid = self.take_session_id(core.epoch, seq);
                    core.session_end(t, &sid);
                    self.sid = sid;
                }
                while self
                    .visitors
                    .get(self.next_join)
                    .is_some_and(|v| u64::from(v.join) <= t)
                {
                    self.join(core, t);
                    if self.next_join == self.visitors.len()
                        && self.drain_ms.is_none()
                        && core.bucket.queue_length() == 0
                    {
                        self.drain_ms = Some(t);
                    }
                }
                if self.wheel_len > 0 {
                    if t.is_multiple_of(BUCKET_MS) {
                        self.load_bucket(t);
                    }
                    while let Some(&w) = self.due.get(self.due_pos) {
                        if u64::from(w.at) > t {
                            break;
                        }
                        self.due_pos += 1;
                        self.wheel_len -= 1;
                        self.poll(core, t, w);
                    }
                }
            }
        }
        self.peak_queue = self.peak_queue.max(core.bucket.queue_length());
    }
}

/// Runs a simulation; `progress` is called now and then with the share of
/// visitors done (admitted or gone), from 0 to 1.
///
/// Sessions go to the store (`session_start`, `session_end`) whenever a cap
/// on active sessions is in force, since they then decide admissions. With
/// no cap they change nothing in the room, and the store's per-session
/// bookkeeping (two owned strings per visitor) would dominate a 3-million
/// visitor run, so the simulator counts them itself with the same
/// deadlines; `active_sessions` means the same either way (a test holds the
/// two to each other).
///
/// One piece on purpose: the event loop of the simulator (set-up, the
/// ticks, the summary), hot over millions of visitors, its state in locals
/// the steps share; its parts that stand alone are `Engine`'s methods.
pub fn run(cfg: &SimConfig, mut progress: impl FnMut(f64)) -> Result<SimReport, SimError> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let visitors = make_visitors(cfg, &mut rng);
    let total = visitors.len() as u64;
    let mut visitors_per_lane = vec![0u64; cfg.room.lanes.len()];
    if !visitors_per_lane.is_empty() {
        for v in &visitors {
            visitors_per_lane[usize::from(v.lane)] += 1;
        }
    }

    let clock = ManualClock::new(0);
    let store = MemoryQueueStore::new(Arc::new(clock.clone()));
    let room = cfg.room_settings();
    let snap = now_or_never(store.configure(ROOM, &room))
        .ok_or_else(|| SimError::Invalid("the memory store did not answer at once".into()))??;
    if cfg.initial_queue > 0 {
        store.inspect(ROOM, |core, _| core.bucket.credit_micro = 0)?;
    }
    let settings = now_or_never(store.settings(ROOM))
        .and_then(Result::ok)
        .flatten()
        .unwrap_or_else(|| room.clone());

    let mut e = Engine {
        rng,
        draws: (settings.method == QueueMethod::Random)
            .then(|| {
                settings
                    .prequeue_seed
                    .as_deref()
                    .and_then(crate::prequeue::from_hex)
            })
            .flatten()
            .map(|seed| DrawPlaces {
                seed,
                maps: std::collections::HashMap::new(),
            }),
        visitors,
        next_join: 0,
        wheel: vec![Vec::new(); WHEEL],
        wheel_len: 0,
        due: Vec::new(),
        due_pos: 0,
        revokes: BinaryHeap::new(),
        frontier: snap.frontier,
        poll_rate: snap.rate_per_sec,
        lane_mode: settings.lane_mode,
        lane_snap: snap.lanes.clone(),
        lane_acc: lane_accs(&visitors_per_lane),
        session_ms: u64::from(secs_to_ms(cfg.session_seconds).max(1)),
        session_ttl_ms: settings.session_ttl.as_millis() as u64,
        revoke: cfg.revoke_at_end,
        store_sessions: settings.effective_max_active().is_some(),
        sessions_diff: Vec::new(),
        sid: String::with_capacity(16),
        waits_ms: Vec::with_capacity(total as usize),
        order: Vec::with_capacity(total as usize),
        wait_sum_ms: 0,
        admitted: 0,
        abandoned: 0,
        passthrough: 0,
        peak_queue: 0,
        drain_ms: None,
        origin_end_ms: 0,
        polls_per_sec: Vec::new(),
        joins_per_sec: Vec::new(),
        push_requests_per_sec: Vec::new(),
        abandoned_per_sec: Vec::new(),
        origin_diff: Vec::new(),
        origin_part: Vec::new(),
    };

    // a live room's state beyond its line: sessions on the origin and
    // places admitted but not yet claimed (see `initial_active`,
    // `initial_pending`)
    if cfg.initial_active > 0 || cfg.initial_pending > 0 {
        store.inspect(ROOM, |core, _| {
            for i in 0..cfg.initial_active {
                // session ids above every seq
                e.reach_origin(core, 0, (1 << 40) + i, CARRIED, (PLACE, 0));
            }
            let from = core.seed_pending(0, cfg.initial_pending);
            for seq in from..from + cfg.initial_pending {
                let w = Waiting {
                    at: 0,
                    seq: seq as u32,
                    arrival: CARRIED,
                    deadline: NEVER,
                    lane: PLACE,
                };
                e.schedule_poll(0, w, 1);
            }
            e.frontier = core.bucket.frontier;
        })?;
    }
    let tick = cfg.tick_ms;
    let horizon_ms = (cfg.horizon_seconds * 1000.0).ceil() as u64;
    let mut meter = RateMeter::new(5_000); // as the gateway's rooms
    let mut rows: Vec<SecondRow> = Vec::new();
    let mut last: Snapshot = snap;
    let (mut sec_admitted, mut sec_claimed) = (last.admitted_total, last.claimed_total);
    if e.visitors.is_empty() {
        e.drain_ms = Some(0);
    }
    let mut t0 = 0u64;
    let mut completed = false;
    let mut ticks = 0u64;
    progress(0.0);
    loop {
        let t1 = t0 + tick;
        store.inspect(ROOM, |core, _| e.step(core, t0, t1))?;
        clock.set_ms(t1);
        let snap = store.advance_now(ROOM)?;
        e.peak_queue = e.peak_queue.max(snap.queue_length());
        meter.record(snap.store_now_ms, snap.admitted_total);
        e.frontier = snap.frontier;
        e.poll_rate = meter.rate().unwrap_or(0.0).max(snap.rate_per_sec);
        if !e.lane_acc.is_empty() {
            for (a, l) in e.lane_acc.iter_mut().zip(&snap.lanes) {
                if a.drain_ms.is_none()
                    && a.visitors > 0
                    && a.join_done == a.visitors
                    && l.waiting() == 0
                {
                    a.drain_ms = Some(t1);
                }
            }
            e.lane_snap.clone_from(&snap.lanes);
        }
        let all_joined = e.next_join == e.visitors.len();
        if all_joined && e.drain_ms.is_none() && snap.queue_length() == 0 {
            e.drain_ms = Some(t1);
        }
        if t1.is_multiple_of(1000) {
            let s = (t1 / 1000 - 1) as usize;
            rows.push(SecondRow {
                t: s as u64,
                queue_length: snap.queue_length(),
                admitted_per_sec: snap.admitted_total - sec_admitted,
                claimed: snap.claimed_total - sec_claimed,
                active_sessions: snap.active_sessions,
                pending_claims: snap.pending_claims,
                ..SecondRow::default()
            });
            sec_admitted = snap.admitted_total;
            sec_claimed = snap.claimed_total;
        }
        last = snap;
        t0 = t1;
        ticks += 1;
        let done = all_joined
            && e.wheel_len == 0
            && e.revokes.is_empty()
            && last.queue_length() == 0
            && t1 >= e.origin_end_ms;
        if done && t1.is_multiple_of(1000) {
            completed = true;
            break;
        }
        if t1 >= horizon_ms {
            break;
        }
        if ticks.is_multiple_of(256) && total > 0 {
            progress((e.admitted + e.abandoned) as f64 / total as f64);
        }
    }
    progress(1.0);

    // fill in the per-visitor series
    let mut whole: i64 = 0;
    let mut sessions: i64 = 0;
    for (i, row) in rows.iter_mut().enumerate() {
        whole += e.origin_diff.get(i).copied().unwrap_or(0);
        if !e.store_sessions {
            sessions += e.sessions_diff.get(i).copied().unwrap_or(0);
            row.active_sessions = sessions.max(0) as u64;
        }
        let part = e.origin_part.get(i).copied().unwrap_or(0.0);
        row.origin_rps = cfg.room.requests_per_visitor_per_sec * (whole as f64 + part);
        row.polls = e.polls_per_sec.get(i).copied().unwrap_or(0);
        row.push_requests = e.push_requests_per_sec.get(i).copied().unwrap_or(0);
        row.joined = e.joins_per_sec.get(i).copied().unwrap_or(0);
        row.abandoned = e.abandoned_per_sec.get(i).copied().unwrap_or(0);
    }

    let wait_seconds = wait_stats(&mut e.waits_ms, e.wait_sum_ms);
    let kendall_tau = crate::fairness::kendall_tau_b(&e.order).map(|t| (t * 1e6).round() / 1e6);
    e.order = Vec::new();
    let origin_peak_rps = rows.iter().map(|r| r.origin_rps).fold(0.0, f64::max);
    let origin_mean_rps = mean_over_active(rows.iter().map(|r| r.origin_rps));
    let polls_total: u64 = rows.iter().map(|r| r.polls).sum();
    let edge_polls_per_sec = PollStats {
        mean: mean_over_active(rows.iter().map(|r| r.polls as f64)),
        peak: rows.iter().map(|r| r.polls).max().unwrap_or(0),
        total: polls_total,
    };
    let per_sec = |f: &dyn Fn(&SecondRow) -> u64| PollStats {
        mean: mean_over_active(rows.iter().map(|r| f(r) as f64)),
        peak: rows.iter().map(f).max().unwrap_or(0),
        total: rows.iter().map(f).sum(),
    };
    let lanes = cfg
        .room
        .lanes
        .iter()
        .zip(&mut e.lane_acc)
        .map(|(l, a)| LaneReport {
            id: l.id.clone(),
            weight: l.weight,
            visitors: a.visitors,
            admitted: a.admitted,
            abandoned: a.abandoned,
            passthrough: a.passthrough,
            wait_seconds: wait_stats(&mut a.waits_ms, a.wait_sum_ms),
            drain_seconds: a.drain_ms.map(|ms| ms as f64 / 1000.0),
            kendall_tau: crate::fairness::kendall_tau_b(&a.order).map(|t| (t * 1e6).round() / 1e6),
        })
        .collect();
    let edge_requests_polling = per_sec(&|r| r.joined + r.polls);
    let edge_requests_pushed = per_sec(&|r| r.joined + r.push_requests);
    Ok(SimReport {
        visitors: total,
        admitted: e.admitted,
        abandoned: e.abandoned,
        unfinished: total - e.admitted - e.abandoned,
        passthrough: e.passthrough,
        frontier_admitted: last.admitted_total,
        refunded: last.refunded_total,
        late_claims: last.late_claims_total,
        completed,
        drain_seconds: e.drain_ms.map(|ms| ms as f64 / 1000.0),
        peak_queue_length: e.peak_queue,
        wait_seconds,
        kendall_tau,
        origin_peak_rps,
        origin_mean_rps,
        capacity_rps: cfg.capacity_rps.or(settings.capacity_rps),
        rate_per_sec: last.rate_per_sec,
        burst: last.burst,
        max_active: last.max_active,
        edge_polls_per_sec,
        edge_requests_polling,
        edge_requests_pushed,
        lanes,
        simulated_seconds: t0 as f64 / 1000.0,
        series: rows,
    })
}

/// Each lane's running figures, from its number of visitors; empty
/// without lanes.
fn lane_accs(visitors: &[u64]) -> Vec<LaneAcc> {
    visitors
        .iter()
        .map(|&n| LaneAcc {
            visitors: n,
            ..LaneAcc::default()
        })
        .collect()
}

/// The mean of the values from the first non-zero one to the last.
fn mean_over_active(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    let first = v.iter().position(|x| *x > 0.0);
    let last = v.iter().rposition(|x| *x > 0.0);
    match (first, last) {
        (Some(a), Some(b)) => v[a..=b].iter().sum::<f64>() / (b - a + 1) as f64,
        _ => 0.0,
    }
}

fn wait_stats(waits: &mut [u32], sum_ms: u128) -> WaitStats {
    if waits.is_empty() {
        return WaitStats::default();
    }
    waits.sort_unstable();
    let n = waits.len();
    let rank = |q: f64| {
        let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        f64::from(waits[i]) / 1000.0
    };
    WaitStats {
        mean: sum_ms as f64 / n as f64 / 1000.0,
        p50: rank(0.50),
        p95: rank(0.95),
        p99: rank(0.99),
        max: f64::from(waits[n - 1]) / 1000.0,
    }
}

/// Draws arrivals, solve times and patience, and orders visitors by join
/// time (the initial line first).
fn make_visitors(cfg: &SimConfig, rng: &mut ChaCha8Rng) -> Vec<Visitor> {
    let n = match &cfg.arrivals {
        Arrivals::Times(t) => t.len(),
        _ => cfg.visitors as usize,
    };
    let q = cfg.initial_queue as usize;
    let mut arrivals_ms: Vec<u32> = match &cfg.arrivals {
        Arrivals::Spike => vec![0; n],
        Arrivals::Ramp { seconds } => (0..n)
            .map(|i| secs_to_ms(seconds * i as f64 / n as f64))
            .collect(),
        Arrivals::Poisson { per_sec } => match Exp::new(*per_sec) {
            Ok(exp) => {
                let mut t = 0.0f64;
                (0..n)
                    .map(|_| {
                        t += exp.sample(rng);
                        secs_to_ms(t)
                    })
                    .collect()
            }
            Err(_) => vec![0; n],
        },
        Arrivals::Times(times) => times.iter().map(|s| secs_to_ms(*s)).collect(),
    };
    arrivals_ms.sort_unstable();
    let solve = cfg.solve.sampler();
    let patience = cfg.patience.as_ref().map(Dist::sampler);
    let deadline = |rng: &mut ChaCha8Rng, arrival: u32| match &patience {
        Some(p) => arrival.saturating_add(p.sample_ms(rng)).min(NEVER - 1),
        None => NEVER,
    };
    // the lanes: the default (the last) unless the mix draws another;
    // the initial line lane by lane, as the live room holds it
    let default_lane = cfg.room.lanes.len().saturating_sub(1) as u8;
    let mut initial_lane = cfg
        .initial_lanes
        .iter()
        .enumerate()
        .flat_map(|(i, &k)| std::iter::repeat_n(i as u8, k as usize));
    let mut cumulative = Vec::with_capacity(cfg.lane_mix.len());
    let mut sum = 0.0;
    for share in &cfg.lane_mix {
        sum += share;
        cumulative.push(sum);
    }
    let draw_lane = |rng: &mut ChaCha8Rng| -> u8 {
        if cumulative.is_empty() {
            return default_lane;
        }
        let u: f64 = rng.random();
        // the first lane whose cumulative share passes u; rounding leaves
        // the rest to the last lane with a share
        cumulative
            .iter()
            .position(|c| u < *c)
            .or_else(|| cfg.lane_mix.iter().rposition(|x| *x > 0.0))
            .unwrap_or(default_lane.into()) as u8
    };
    let mut out = Vec::with_capacity(q + n);
    for _ in 0..q {
        let d = deadline(rng, 0);
        out.push(Visitor {
            arrival: 0,
            join: 0,
            deadline: d,
            lane: initial_lane.next().unwrap_or(default_lane),
        });
    }
    for a in arrivals_ms {
        let join = a.saturating_add(solve.sample_ms(rng)).min(NEVER - 1);
        let d = deadline(rng, a);
        let lane = draw_lane(rng);
        out.push(Visitor {
            arrival: a,
            join,
            deadline: d,
            lane,
        });
    }
    // stable: the initial line (join 0) stays first
    out[q..].sort_by_key(|v| v.join);
    out
}

/// Reads arrival times (seconds) from CSV text: the first field of each
/// line; blank lines, `#` comments and a non-numeric header line are
/// skipped. Times are shifted so that the earliest is 0.
pub fn parse_arrival_times(text: &str) -> Result<Vec<f64>, SimError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let field = line.split([',', ';', '\t']).next().unwrap_or("").trim();
        match field.parse::<f64>() {
            Ok(v) if v.is_finite() => out.push(v),
            _ if out.is_empty() && i == 0 => continue, // header
            _ => {
                return Err(SimError::Invalid(format!(
                    "line {}: not a time in seconds: {field:?}",
                    i + 1
                )));
            }
        }
    }
    let min = out.iter().copied().fold(f64::INFINITY, f64::min);
    if min.is_finite() {
        for v in &mut out {
            *v -= min;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A `random` room in the simulator: everyone admitted once, each on
    /// a place of its own. A crowd arriving at once is one draw: an order
    /// unrelated to arrival (tau near 0), where a FIFO room admits it in
    /// arrival order. A crowd arriving over a while is drawn in rounds:
    /// random within each, earlier rounds first (tau between the two).
    #[test]
    fn random_rooms_admit_everyone_in_drawn_order() {
        let run_with = |method, arrivals| {
            let cfg = SimConfig {
                visitors: 3_000,
                arrivals,
                room: RoomSettings {
                    rate_per_sec: 50.0,
                    burst: 10.0,
                    method,
                    ..Default::default()
                },
                ..Default::default()
            };
            run(&cfg, |_| {}).unwrap()
        };
        let ramp = Arrivals::Ramp { seconds: 20.0 };
        // (arrival times must differ for a tau: half a second is before
        // the room's first draw, a second in)
        let fifo = run_with(QueueMethod::Fifo, ramp.clone());
        let once = run_with(QueueMethod::Random, Arrivals::Ramp { seconds: 0.5 });
        let rounds = run_with(QueueMethod::Random, ramp);
        for r in [&fifo, &once, &rounds] {
            assert_eq!(r.admitted + r.abandoned + r.unfinished, 3_000);
            assert_eq!(r.abandoned + r.unfinished, 0, "everyone admitted");
        }
        let f = fifo.kendall_tau.unwrap();
        let (t1, t2) = (once.kendall_tau.unwrap(), rounds.kendall_tau.unwrap());
        assert!(f > 0.999, "fifo {f}");
        assert!(t1.abs() < 0.1, "one draw {t1}");
        assert!(t2 > 0.2 && t2 < 0.95, "rounds {t2}");
        assert_eq!(
            once.passthrough + rounds.passthrough,
            0,
            "nobody straight through"
        );
    }

    #[test]
    fn csv_times() {
        let t = parse_arrival_times("time,who\n# c\n10.5,a\n\n12,b\n11\n").unwrap();
        assert_eq!(t, vec![0.0, 1.5, 0.5]);
        assert!(parse_arrival_times("1\nx\n").is_err());
    }

    #[test]
    fn lognormal_median_and_p95() {
        let s = Dist::from_median_p95(2.0, Some(6.0)).sampler();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut v: Vec<u32> = (0..20_000).map(|_| s.sample_ms(&mut rng)).collect();
        v.sort_unstable();
        let med = f64::from(v[10_000]) / 1000.0;
        let p95 = f64::from(v[19_000]) / 1000.0;
        assert!((med - 2.0).abs() < 0.1, "{med}");
        assert!((p95 - 6.0).abs() < 0.4, "{p95}");
    }

    #[test]
    fn origin_overlap_is_split_by_second() {
        let mut e = Engine {
            rng: ChaCha8Rng::seed_from_u64(1),
            draws: None,
            visitors: Vec::new(),
            next_join: 0,
            wheel: Vec::new(),
            wheel_len: 0,
            due: Vec::new(),
            due_pos: 0,
            revokes: BinaryHeap::new(),
            frontier: 0,
            poll_rate: 0.0,
            lane_mode: LaneMode::Weighted,
            lane_snap: Vec::new(),
            lane_acc: Vec::new(),
            session_ms: 0,
            session_ttl_ms: 0,
            revoke: false,
            store_sessions: false,
            sessions_diff: Vec::new(),
            sid: String::new(),
            waits_ms: Vec::new(),
            order: Vec::new(),
            wait_sum_ms: 0,
            admitted: 0,
            abandoned: 0,
            passthrough: 0,
            peak_queue: 0,
            drain_ms: None,
            origin_end_ms: 0,
            polls_per_sec: Vec::new(),
            joins_per_sec: Vec::new(),
            push_requests_per_sec: Vec::new(),
            abandoned_per_sec: Vec::new(),
            origin_diff: Vec::new(),
            origin_part: Vec::new(),
        };
        e.add_origin(500, 3_250); // 0.5 + 1 + 1 + 0.25
        e.add_origin(4_100, 4_600); // 0.5
        let mut whole = 0;
        let got: Vec<f64> = (0..5)
            .map(|i| {
                whole += e.origin_diff[i];
                whole as f64 + e.origin_part[i]
            })
            .collect();
        assert_eq!(got, vec![0.5, 1.0, 1.0, 0.25, 0.5]);
    }
}
