//! One room's complete admission state machine: the bucket plus the claim
//! bitmap, the advance batches (no-show refunds) and the sessions (the
//! active cap). Pure and synchronous, with the time passed in: the memory
//! store keeps one per room behind a mutex, the simulator drives it
//! directly, and `lua/lib.lua` is its port.
//!
//! # No-shows
//!
//! Every advance that admits `n > 0` records a batch `(from, to, at_ms)`.
//! When an advance finds a batch older than the claim window, it counts the
//! unclaimed seqs of the batch in the claim bitmap, gives that many slots
//! back as credit (once: the batch is dropped) and moves `settled` to the
//! batch's end. A claim of a seq ≤ `settled` is therefore late
//! ([`ClaimOutcome::Late`]).
//!
//! # The active cap
//!
//! `pending` counts admitted places still inside their claim window and not
//! yet claimed. With a cap, one advance admits at most
//! `max_active − active_sessions − pending` (never below zero): visitors
//! still on their way to claim a place hold a slot too, or a cap would
//! admit a whole window's worth of them at once.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::bucket::{Bucket, BucketParams, MICRO};
use crate::lanes::{LaneBook, split};
use crate::prequeue::PrequeueDraw;
use crate::settings::{QueueMethod, RoomSettings};
use crate::store::{AdmitOutcome, ClaimOutcome, JoinOutcome, LaneSnapshot, Snapshot};

/// How long an ended session stays in the room's ended set past its end:
/// the session's idle lifetime (no admission token of it outlives that,
/// since renewal needs a live session) plus this allowance for clock skew
/// between gateways.
pub const ENDED_SKEW_MS: u64 = 30_000;

/// A lane mark is noted at most every `lane_keep / LANE_MARKS` (so about
/// this many are kept, and a segment outlives `lane_keep` by at most that
/// much).
pub const LANE_MARKS: u64 = 16;

/// A `random` room draws at most this often (store clock, ms): the kept
/// list of draws stays short (one a second at most), and a visitor who
/// joins just after a draw waits at most this much for the next one once
/// the draw is exhausted ([`crate::prequeue`], "Rolling draws").
pub const DRAW_EVERY_MS: u64 = 1_000;

/// Why [`RoomCore::join`] took nobody.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The room is closed.
    Closed,
    /// A `reject` room could not admit on the spot (no seq handed out).
    Full,
    /// The room has no lane of that index (nothing handed out).
    NoLane,
}

/// An advance batch: seqs `from..=to` admitted at `at_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    /// First seq of the batch.
    pub from: u64,
    /// Last seq of the batch.
    pub to: u64,
    /// When they were admitted (store clock, ms).
    pub at_ms: u64,
}

/// One bit per seq.
#[derive(Clone, Debug, Default)]
pub struct ClaimBitmap {
    words: Vec<u64>,
}

impl ClaimBitmap {
    /// Whether `seq` is set.
    pub fn get(&self, seq: u64) -> bool {
        let (w, b) = ((seq / 64) as usize, seq % 64);
        self.words.get(w).is_some_and(|x| x & (1 << b) != 0)
    }

    /// Sets `seq`; returns the previous value.
    pub fn set(&mut self, seq: u64) -> bool {
        let (w, b) = ((seq / 64) as usize, seq % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        was
    }

    /// Set bits in `from..=to`.
    pub fn count(&self, from: u64, to: u64) -> u64 {
        if from > to {
            return 0;
        }
        let mut n = 0u64;
        let (fw, lw) = ((from / 64) as usize, (to / 64) as usize);
        for w in fw..=lw.min(self.words.len().saturating_sub(1)) {
            let mut x = self.words.get(w).copied().unwrap_or(0);
            if w == fw {
                x &= u64::MAX << (from % 64);
            }
            if w == lw {
                let hi = to % 64;
                if hi < 63 {
                    x &= (1u64 << (hi + 1)) - 1;
                }
            }
            n += u64::from(x.count_ones());
        }
        n
    }
}

/// Counters kept for the gateway's rates and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Joins.
    pub joins: u64,
    /// Seqs admitted.
    pub admitted: u64,
    /// Places claimed.
    pub claimed: u64,
    /// No-show slots refunded.
    pub refunded: u64,
    /// Late claims.
    pub late: u64,
}

/// The whole state of one room.
#[derive(Clone, Debug)]
pub struct RoomCore {
    settings: RoomSettings,
    params: BucketParams,
    max_active: Option<u64>,
    claim_window_ms: u64,
    /// The bucket.
    pub bucket: Bucket,
    /// The room's epoch.
    pub epoch: u64,
    claims: ClaimBitmap,
    batches: VecDeque<Batch>,
    pending: u64,
    settled: u64,
    sessions: HashMap<String, u64>,
    deadlines: BTreeSet<(u64, String)>,
    /// Sessions ended by a revoke: id → when (store clock), kept for the
    /// session's idle lifetime (see [`ENDED_SKEW_MS`]) so every gateway
    /// learns them ([`RoomCore::ended_since`]).
    ended: HashMap<String, u64>,
    ended_order: BTreeSet<(u64, String)>,
    ended_total: u64,
    /// The epoch whose seqs this state's floors cover (0: none), and the
    /// tail floor it was created with: a queue token of an older epoch
    /// keeps its seq as its place only when covered (see [`Snapshot`]).
    carried_epoch: u64,
    carried_tail: u64,
    /// Old-epoch places given a place of this epoch: (epoch, seq) → (seq
    /// here, forget at ms).
    reseats: HashMap<(u64, u64), (u64, u64)>,
    /// When the room opens (store clock, ms); 0: not scheduled.
    opens_ms: u64,
    /// The pre-queue draw, or a `random` room's current draw; `None` while
    /// the pre-queue is open (scheduled, not yet drawn). A room never
    /// scheduled starts with the empty draw.
    draw: Option<PrequeueDraw>,
    /// When the last draw was made (store clock, ms; 0: never), and its
    /// index (kept while a new pre-queue is open).
    draw_at_ms: u64,
    draw_k: u64,
    /// A `random` room's draws made within `lane_keep` (every one without
    /// it), with when each was made; oldest first ([`RoomCore::draw_of`]).
    draws: VecDeque<(u64, PrequeueDraw)>,
    /// The priority lanes ([`crate::lanes`]); empty without lanes.
    pub lanes: LaneBook,
    /// Marks for forgetting lane segments ([`crate::lanes`],
    /// "Forgetting"): when, and every lane's frontier then; oldest first.
    lane_marks: VecDeque<(u64, Vec<u64>)>,
    /// Counters.
    pub counters: Counters,
}

impl RoomCore {
    /// A new room at `now_ms` with the given settings (assumed valid) and
    /// epoch, its tail and frontier raised to the floors.
    pub fn new(
        now_ms: u64,
        settings: &RoomSettings,
        epoch: u64,
        min_tail: u64,
        min_frontier: u64,
    ) -> Self {
        Self::carrying(now_ms, settings, epoch, min_tail, min_frontier, 0)
    }

    /// [`RoomCore::new`] for a state recovered from a lost one: the floors
    /// are the highest tail and frontier seen of `carried_epoch` (0: none
    /// known), so that epoch's seqs up to the tail floor keep their places.
    pub fn carrying(
        now_ms: u64,
        settings: &RoomSettings,
        epoch: u64,
        min_tail: u64,
        min_frontier: u64,
        carried_epoch: u64,
    ) -> Self {
        let params = BucketParams::from_settings(settings);
        let mut bucket = Bucket::new(now_ms, &params);
        bucket.reseed(min_tail, min_frontier);
        let opens_ms = settings.opens_at_ms.unwrap_or(0);
        // a recovered draw (a hint from a gateway) wins; else a scheduled
        // room starts with its pre-queue open
        let draw = match (settings.prequeue_draw, opens_ms) {
            (Some(d), _) => Some(d),
            (None, 0) => Some(PrequeueDraw::default()),
            (None, _) => None,
        };
        // a random room's hinted draw is kept as one it made, so a gateway
        // that did not see it can still ask for it ([`RoomCore::draw_of`])
        let draws = match settings.prequeue_draw {
            Some(d) if settings.method == QueueMethod::Random => VecDeque::from([(now_ms, d)]),
            _ => VecDeque::new(),
        };
        Self {
            opens_ms,
            draw,
            draw_at_ms: 0,
            draw_k: draw.map_or(0, |d| d.k),
            draws,
            settings: settings.clone(),
            params,
            max_active: settings.effective_max_active(),
            claim_window_ms: settings.claim_window.as_millis() as u64,
            bucket,
            epoch,
            claims: ClaimBitmap::default(),
            batches: VecDeque::new(),
            pending: 0,
            settled: min_frontier,
            sessions: HashMap::new(),
            deadlines: BTreeSet::new(),
            ended: HashMap::new(),
            ended_order: BTreeSet::new(),
            ended_total: 0,
            carried_epoch: if min_tail.max(min_frontier) > 0 {
                carried_epoch
            } else {
                0
            },
            carried_tail: min_tail.max(min_frontier),
            reseats: HashMap::new(),
            lanes: {
                let mut b = LaneBook::default();
                b.resize(settings.lanes.len());
                b
            },
            lane_marks: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// Whether the room has lanes.
    pub fn has_lanes(&self) -> bool {
        !self.settings.lanes.is_empty()
    }

    /// Waiting in all lanes.
    fn lanes_waiting(&self) -> u64 {
        self.lanes.lanes[..self.settings.lanes.len()]
            .iter()
            .map(|l| l.waiting())
            .sum()
    }

    /// The place of lane `lane`'s seq `seq` once admitted (`None`: not
    /// admitted, or no such lane). Without lanes a seq is its own place.
    pub fn place_of(&self, lane: Option<usize>, seq: u64) -> Option<u64> {
        match lane {
            None if !self.has_lanes() => self.is_admitted_place(seq).then_some(seq),
            None => None,
            Some(i) if i < self.settings.lanes.len() => self.lanes.place_of(i, seq),
            Some(_) => None,
        }
    }

    fn is_admitted_place(&self, place: u64) -> bool {
        place != 0 && place <= self.bucket.frontier
    }

    /// The settings in force.
    pub fn settings(&self) -> &RoomSettings {
        &self.settings
    }

    /// Changes the settings, re-anchoring the bucket at `now_ms` (credit
    /// earned at the old rate is settled first).
    pub fn configure(&mut self, now_ms: u64, settings: &RoomSettings) {
        self.advance(now_ms);
        let opens = settings.opens_at_ms.unwrap_or(0);
        if opens != self.opens_ms {
            // a new opening in the future starts a new pre-queue, unless
            // tickets of the last draw still wait (their places come from
            // it); one in the past (or none) before the draw opens the room
            // at the next operation
            let drained = self
                .draw
                .is_none_or(|d| self.bucket.frontier >= d.from + d.n);
            if opens > now_ms && drained {
                self.draw = None;
            }
            self.opens_ms = opens;
        }
        if self.draw.is_none() {
            self.draw = settings.prequeue_draw;
            if let Some(d) = self.draw {
                self.draw_k = d.k;
                if settings.method == QueueMethod::Random {
                    self.draws.push_back((now_ms, d));
                }
            }
        }
        let new = BucketParams::from_settings(settings);
        self.bucket.reanchor(now_ms, &self.params, &new);
        self.params = new;
        self.max_active = settings.effective_max_active();
        self.claim_window_ms = settings.claim_window.as_millis() as u64;
        self.lanes.resize(settings.lanes.len());
        self.settings = settings.clone();
    }

    fn prune_sessions(&mut self, now_ms: u64) {
        while let Some((deadline, _)) = self.deadlines.first() {
            if *deadline > now_ms {
                break;
            }
            if let Some((_, id)) = self.deadlines.pop_first() {
                self.sessions.remove(&id);
            }
        }
    }

    /// Gives back unclaimed slots of batches whose window has passed;
    /// returns the refund in micro-admissions.
    fn settle(&mut self, now_ms: u64) -> i64 {
        let mut refund = 0u64;
        while let Some(b) = self.batches.front().copied() {
            if b.at_ms + self.claim_window_ms > now_ms {
                break;
            }
            self.batches.pop_front();
            let unclaimed = (b.to - b.from + 1) - self.claims.count(b.from, b.to);
            refund += unclaimed;
            self.pending = self.pending.saturating_sub(unclaimed);
            self.settled = self.settled.max(b.to);
        }
        self.counters.refunded += refund;
        refund as i64 * MICRO
    }

    fn room_under_cap(&self) -> u64 {
        match self.max_active {
            Some(m) => m.saturating_sub(self.sessions.len() as u64 + self.pending),
            None => u64::MAX,
        }
    }

    /// Closes the pre-queue at the first operation at or after the opening:
    /// records the draw (once) and starts earning credit from the opening.
    /// A `random` room also makes its next draw here: when the current one
    /// is exhausted (the frontier at its end), somebody waits, the room is
    /// not paused or closed (a draw orders who is there when admission can
    /// go on), and the last draw is [`DRAW_EVERY_MS`] old ([`crate::prequeue`], "Rolling draws").
    fn draw_if_due(&mut self, now_ms: u64) {
        let b = &self.bucket;
        if self.draw.is_none() && (self.opens_ms == 0 || now_ms >= self.opens_ms) {
            // after rolling draws the count goes on (a seed per index; a
            // gateway places seqs before a draw of index 0 as their own)
            let k = if self.draws.is_empty() {
                0
            } else {
                self.draw_k + 1
            };
            self.record_draw(now_ms, k);
            self.bucket.last_ms = self.bucket.last_ms.max(self.opens_ms);
        } else if self.settings.method == QueueMethod::Random
            && !self.params.halted()
            && let Some(d) = self.draw
            && b.frontier >= d.end()
            && b.tail > b.frontier
            && now_ms >= self.draw_at_ms.saturating_add(DRAW_EVERY_MS)
        {
            self.record_draw(now_ms, d.k + 1);
        }
    }

    /// Records draw `k` of everyone waiting now (at most
    /// [`crate::prequeue::MAX_TICKETS`]: the rest wait for the next).
    fn record_draw(&mut self, now_ms: u64, k: u64) {
        let b = &self.bucket;
        let d = PrequeueDraw {
            from: b.frontier,
            n: (b.tail - b.frontier).min(crate::prequeue::MAX_TICKETS),
            k,
        };
        self.draw = Some(d);
        self.draw_at_ms = now_ms;
        self.draw_k = k;
        if self.settings.method == QueueMethod::Random {
            self.draws.push_back((now_ms, d));
            if let Some(keep) = self.settings.lane_keep {
                let keep = keep.as_millis() as u64;
                while self
                    .draws
                    .front()
                    .is_some_and(|&(at, _)| at.saturating_add(keep) <= now_ms)
                {
                    self.draws.pop_front();
                }
            }
        }
    }

    /// The draw that holds `seq`: the current one, or one of the kept
    /// draws of a `random` room; `None` when no kept draw does (the seq's
    /// place is its own, or its draw is older than `lane_keep`).
    pub fn draw_of(&self, seq: u64) -> Option<PrequeueDraw> {
        if let Some(d) = self.draw.filter(|d| d.contains(seq)) {
            return Some(d);
        }
        let i = self.draws.partition_point(|(_, d)| d.from < seq);
        let (_, d) = self.draws.get(i.checked_sub(1)?)?;
        d.contains(seq).then_some(*d)
    }

    /// [`crate::QueueStore::keep_draws`]: each draw of `draws` (with
    /// tickets) whose first seq no kept draw has is kept, as made at
    /// `now_ms`, in order. Nothing unless the room is `random`.
    pub fn keep_draws(&mut self, now_ms: u64, draws: &[PrequeueDraw]) {
        if self.settings.method != QueueMethod::Random {
            return;
        }
        for &d in draws.iter().filter(|d| d.n > 0) {
            let i = self.draws.partition_point(|(_, k)| k.from < d.from);
            if self.draws.get(i).is_none_or(|(_, k)| k.from != d.from) {
                self.draws.insert(i, (now_ms, d));
            }
        }
    }

    /// The current draw (`None` while a pre-queue is open).
    pub fn current_draw(&self) -> Option<PrequeueDraw> {
        self.draw
    }

    /// How many draws a `random` room keeps.
    pub fn kept_draws(&self) -> usize {
        self.draws.len()
    }

    /// The bucket parameters in force: the pre-queue halts admission as a
    /// pause does.
    fn live_params(&self) -> BucketParams {
        let mut p = self.params;
        p.paused |= self.draw.is_none();
        p
    }

    /// The pre-queue is open (scheduled, not yet drawn).
    pub fn prequeue_open(&self) -> bool {
        self.draw.is_none()
    }

    /// Brings the room up to `now_ms`; returns how many were admitted.
    pub fn advance(&mut self, now_ms: u64) -> u64 {
        self.prune_sessions(now_ms);
        self.draw_if_due(now_ms);
        let refund = self.settle(now_ms);
        let mut room = self.room_under_cap();
        if self.has_lanes() {
            room = room.min(self.lanes_waiting());
        }
        if self.settings.method == QueueMethod::Random {
            // never past the current draw: the rest wait for the next one
            let end = self.draw.map_or(0, |d| d.end());
            room = room.min(end.saturating_sub(self.bucket.frontier));
        }
        let params = self.live_params();
        let n = self.bucket.advance(now_ms, &params, room, refund);
        if n > 0 && self.has_lanes() {
            self.split_places(n);
        }
        if self.has_lanes() {
            self.forget_old_segments(now_ms);
        }
        if n > 0 {
            let to = self.bucket.frontier;
            self.batches.push_back(Batch {
                from: to - n + 1,
                to,
                at_ms: now_ms,
            });
            self.pending += n;
            self.counters.admitted += n;
        }
        n
    }

    /// Notes a mark when one is due and forgets the segments of the newest
    /// mark that is `lane_keep` old ([`crate::lanes`], "Forgetting").
    fn forget_old_segments(&mut self, now_ms: u64) {
        let Some(keep) = self.settings.lane_keep else {
            return;
        };
        let keep_ms = keep.as_millis() as u64;
        let every = (keep_ms / LANE_MARKS).max(1_000);
        if self
            .lane_marks
            .back()
            .is_none_or(|&(at, _)| now_ms >= at + every)
        {
            let k = self.settings.lanes.len();
            let frontiers = self.lanes.lanes[..k].iter().map(|l| l.frontier).collect();
            self.lane_marks.push_back((now_ms, frontiers));
        }
        let mut cut = None;
        while let Some((at, _)) = self.lane_marks.front()
            && at + keep_ms <= now_ms
        {
            cut = self.lane_marks.pop_front().map(|(_, f)| f);
        }
        for (i, &seq) in cut.iter().flatten().enumerate() {
            self.lanes.forget_through(i, seq);
        }
    }

    /// Hands the places just admitted (`frontier − n + 1 ..= frontier`) to
    /// the lanes by [`split`], in lane order.
    fn split_places(&mut self, n: u64) {
        let k = self.settings.lanes.len();
        let weights: Vec<u32> = self.settings.lanes.iter().map(|l| l.weight).collect();
        let give = split(
            n,
            &weights,
            self.settings.lane_mode,
            &mut self.lanes.lanes[..k],
            &mut self.lanes.mask,
        );
        let mut place = self.bucket.frontier - n + 1;
        for (i, g) in give.into_iter().enumerate() {
            if g == 0 {
                continue;
            }
            let seq = self.lanes.lanes[i].frontier + 1;
            self.lanes.record(i, seq, place, g);
            self.lanes.lanes[i].frontier += g;
            self.lanes.lanes[i].admitted += g;
            place += g;
        }
        debug_assert_eq!(
            place,
            self.bucket.frontier + 1,
            "split handed out every place"
        );
    }

    /// Takes the next seq of lane `lane` (the room's tail moves too);
    /// `place` when admitted on the spot.
    fn lane_join(&mut self, lane: usize, place: Option<u64>) -> u64 {
        let l = &mut self.lanes.lanes[lane];
        l.tail += 1;
        let seq = l.tail;
        if let Some(p) = place {
            l.frontier = seq;
            l.admitted += 1;
            self.lanes.record(lane, seq, p, 1);
        }
        seq
    }

    /// A place admitted on the spot, or nothing: only when nobody waits,
    /// credit allows, the room is not halted and is under its cap. Unlike
    /// [`RoomCore::join`] it never hands out a seq it does not admit (a
    /// place in line is bought with proof of work, at the join endpoint).
    /// The place is claimed, and its session started, by the call itself.
    pub fn passthrough(&mut self, now_ms: u64) -> Option<JoinOutcome> {
        if self.params.closed || !self.settings.method.passes_through() {
            return None;
        }
        self.advance(now_ms);
        let room = self.room_under_cap();
        let params = self.live_params();
        let b = &self.bucket;
        let nobody = if self.has_lanes() {
            self.lanes_waiting() == 0
        } else {
            b.frontier == b.tail
        };
        if params.halted() || !nobody || b.credit_micro < MICRO || room < 1 {
            return None;
        }
        if self.has_lanes() {
            // the room's tail may be above its frontier after a reseed
            self.bucket.tail = self.bucket.frontier;
        }
        let (place, admitted) = self.bucket.join(&params, room);
        debug_assert!(admitted, "checked above");
        self.counters.joins += 1;
        self.counters.admitted += 1;
        self.counters.claimed += 1;
        self.claims.set(place);
        self.start_own_session(now_ms, place);
        let lane = self.has_lanes().then(|| self.settings.lanes.len() - 1);
        let seq = match lane {
            Some(i) => self.lane_join(i, Some(place)),
            None => place,
        };
        Some(JoinOutcome {
            seq,
            epoch: self.epoch,
            admitted: true,
            frontier: self.lane_frontier(lane),
            prequeue: false,
            lane: lane.map(|i| i as u8),
            place,
        })
    }

    /// A place of this epoch for a queue token of another (`old_epoch`,
    /// `old_seq`) that this state's floors do not cover: the same one
    /// however often asked (until `ttl_ms` after the last ask), a new seq
    /// at the back of the line the first time, never admitted on the spot.
    /// `None` when the room is closed.
    pub fn reseat(
        &mut self,
        now_ms: u64,
        old_epoch: u64,
        old_seq: u64,
        ttl_ms: u64,
    ) -> Option<JoinOutcome> {
        if self.params.closed {
            return None;
        }
        self.advance(now_ms);
        if self.reseats.len() >= 4096 {
            self.reseats.retain(|_, (_, until)| *until > now_ms);
        }
        let forget = now_ms.saturating_add(ttl_ms);
        let seq = match self.reseats.get_mut(&(old_epoch, old_seq)) {
            Some((seq, until)) => {
                *until = forget;
                *seq
            }
            None => {
                self.bucket.tail += 1;
                self.counters.joins += 1;
                // with lanes: at the back of the default lane (the lane of
                // the lost place is not known here)
                let seq = match self.default_lane() {
                    Some(i) => self.lane_join(i, None),
                    None => self.bucket.tail,
                };
                self.reseats.insert((old_epoch, old_seq), (seq, forget));
                seq
            }
        };
        let lane = self.default_lane();
        Some(JoinOutcome {
            seq,
            epoch: self.epoch,
            admitted: false,
            frontier: self.lane_frontier(lane),
            prequeue: self.draw.is_none(),
            lane: lane.map(|i| i as u8),
            place: 0,
        })
    }

    /// Claims the place `place` and starts its session `sid` in one step,
    /// so that one place is one session however often (and from however
    /// many tabs) it is claimed: a place claimed before resumes its session
    /// (renewed for `ttl_ms`) while it lives, and is spent once it ended
    /// (revoked, or expired). A late claim (after the claim window) waits
    /// while the room is at its cap.
    pub fn admit(&mut self, now_ms: u64, place: u64, sid: &str, ttl_ms: u64) -> AdmitOutcome {
        self.prune_sessions(now_ms);
        // A late claim's slot went back as credit (and may be in use by
        // someone admitted since): it is honoured only while the room is
        // under its cap, else it waits for a slot like anyone admitted.
        let late_unclaimed = place != 0
            && place <= self.bucket.frontier
            && place <= self.settled
            && !self.claims.get(place);
        if late_unclaimed && self.room_under_cap() < 1 {
            return AdmitOutcome::NotAdmitted;
        }
        match self.claim(place) {
            ClaimOutcome::NotAdmitted => AdmitOutcome::NotAdmitted,
            ClaimOutcome::Claimed | ClaimOutcome::Late if self.ended.contains_key(sid) => {
                AdmitOutcome::Spent
            }
            c @ (ClaimOutcome::Claimed | ClaimOutcome::Late) => {
                self.session_start(now_ms, sid, ttl_ms);
                AdmitOutcome::Started {
                    late: c == ClaimOutcome::Late,
                }
            }
            ClaimOutcome::AlreadyClaimed => {
                if self.sessions.contains_key(sid) && !self.ended.contains_key(sid) {
                    self.session_start(now_ms, sid, ttl_ms);
                    AdmitOutcome::Resumed
                } else {
                    AdmitOutcome::Spent
                }
            }
        }
    }

    /// Joins: a seq, admitted at once when nobody waits and credit allows
    /// (passthrough) unless the room's method never passes through
    /// ([`QueueMethod::passes_through`]). A `reject` room admits on the spot
    /// or refuses ([`Refusal::Full`]) without handing out a seq.
    pub fn join(&mut self, now_ms: u64) -> Result<JoinOutcome, Refusal> {
        self.join_lane(now_ms, None)
    }

    /// The default lane (the last), `None` without lanes.
    pub fn default_lane(&self) -> Option<usize> {
        self.settings.lanes.len().checked_sub(1)
    }

    /// The frontier a visitor of `lane` compares its seq with.
    pub fn lane_frontier(&self, lane: Option<usize>) -> u64 {
        match lane {
            Some(i) => self.lanes.lanes.get(i).map_or(0, |l| l.frontier),
            None => self.bucket.frontier,
        }
    }

    /// [`RoomCore::join`] into lane `lane` (`None`: the default lane; an
    /// index the room does not have is [`Refusal::NoLane`], and so is any
    /// index at a room without lanes).
    pub fn join_lane(&mut self, now_ms: u64, lane: Option<usize>) -> Result<JoinOutcome, Refusal> {
        if lane.is_some_and(|i| i >= self.settings.lanes.len()) {
            return Err(Refusal::NoLane);
        }
        if self.params.closed {
            return Err(Refusal::Closed);
        }
        if self.has_lanes() {
            let lane = lane.or(self.default_lane()).unwrap_or(0);
            return Ok(self.join_in_lane(now_ms, lane));
        }
        if self.settings.method == QueueMethod::Reject {
            return self.passthrough(now_ms).ok_or(Refusal::Full);
        }
        self.advance(now_ms);
        let room = if self.settings.method.passes_through() {
            self.room_under_cap()
        } else {
            0
        };
        let params = self.live_params();
        let (seq, admitted) = self.bucket.join(&params, room);
        self.counters.joins += 1;
        if admitted {
            self.counters.admitted += 1;
            self.counters.claimed += 1;
            self.claims.set(seq);
            self.start_own_session(now_ms, seq);
        }
        Ok(JoinOutcome {
            seq,
            epoch: self.epoch,
            admitted,
            frontier: self.bucket.frontier,
            prequeue: self.draw.is_none(),
            lane: None,
            place: if admitted { seq } else { 0 },
        })
    }

    /// A join at a room with lanes (not closed, `lane` valid): the lane's
    /// next seq, admitted at once when nobody waits in any lane, as
    /// [`RoomCore::join`] without lanes.
    fn join_in_lane(&mut self, now_ms: u64, lane: usize) -> JoinOutcome {
        self.advance(now_ms);
        let room = if self.settings.method.passes_through() {
            self.room_under_cap()
        } else {
            0
        };
        let params = self.live_params();
        let b = &self.bucket;
        let pass =
            !params.halted() && self.lanes_waiting() == 0 && b.credit_micro >= MICRO && room >= 1;
        self.counters.joins += 1;
        let place = if pass {
            // the room's tail may be above its frontier after a reseed
            self.bucket.tail = self.bucket.frontier;
            let (place, admitted) = self.bucket.join(&params, room);
            debug_assert!(admitted, "checked above");
            self.counters.admitted += 1;
            self.counters.claimed += 1;
            self.claims.set(place);
            self.start_own_session(now_ms, place);
            Some(place)
        } else {
            self.bucket.tail += 1;
            None
        };
        let seq = self.lane_join(lane, place);
        JoinOutcome {
            seq,
            epoch: self.epoch,
            admitted: place.is_some(),
            frontier: self.lanes.lanes[lane].frontier,
            prequeue: false,
            lane: Some(lane as u8),
            place: place.unwrap_or(0),
        }
    }

    /// Claims an admitted place.
    pub fn claim(&mut self, seq: u64) -> ClaimOutcome {
        if seq == 0 || seq > self.bucket.frontier {
            return ClaimOutcome::NotAdmitted;
        }
        if self.claims.set(seq) {
            return ClaimOutcome::AlreadyClaimed;
        }
        self.counters.claimed += 1;
        if seq > self.settled {
            self.pending = self.pending.saturating_sub(1);
            ClaimOutcome::Claimed
        } else {
            self.counters.late += 1;
            self.bucket.credit_micro -= MICRO;
            ClaimOutcome::Late
        }
    }

    /// Starts the session of a place admitted on the spot (a passthrough,
    /// or a join admitted at once) in the same step as the admission, so a
    /// racing admission already counts it against `max_active`: the cap
    /// holds whatever the number of requests racing at an idle room.
    fn start_own_session(&mut self, now_ms: u64, seq: u64) {
        let ttl_ms = self.settings.session_ttl.as_millis() as u64;
        self.session_start(now_ms, &crate::tokens::session_of(self.epoch, seq), ttl_ms);
    }

    /// Starts or renews a session; returns the active count.
    pub fn session_start(&mut self, now_ms: u64, id: &str, ttl_ms: u64) -> u64 {
        self.prune_sessions(now_ms);
        let deadline = now_ms + ttl_ms;
        if let Some(old) = self.sessions.insert(id.to_owned(), deadline) {
            self.deadlines.remove(&(old, id.to_owned()));
        }
        self.deadlines.insert((deadline, id.to_owned()));
        self.sessions.len() as u64
    }

    /// Renews a live session.
    pub fn session_touch(&mut self, now_ms: u64, id: &str, ttl_ms: u64) -> bool {
        self.prune_sessions(now_ms);
        if self.sessions.contains_key(id) {
            self.session_start(now_ms, id, ttl_ms);
            true
        } else {
            false
        }
    }

    /// Ends a session (a revoke): it leaves the active count, and joins
    /// the ended set (whether it was active or not: a revoke of a session
    /// that expired meanwhile still spends it) for the session's idle
    /// lifetime, so every gateway refuses its tokens.
    pub fn session_end(&mut self, now_ms: u64, id: &str) -> bool {
        self.prune_sessions(now_ms);
        self.prune_ended(now_ms);
        if !self.ended.contains_key(id) {
            self.ended.insert(id.to_owned(), now_ms);
            self.ended_order.insert((now_ms, id.to_owned()));
            self.ended_total += 1;
        }
        match self.sessions.remove(id) {
            Some(d) => {
                self.deadlines.remove(&(d, id.to_owned()));
                true
            }
            None => false,
        }
    }

    /// How long an ended session is kept in the ended set.
    fn ended_keep_ms(&self) -> u64 {
        self.settings.session_ttl.as_millis() as u64 + ENDED_SKEW_MS
    }

    fn prune_ended(&mut self, now_ms: u64) {
        let keep = self.ended_keep_ms();
        while let Some((at, _)) = self.ended_order.first() {
            if at.saturating_add(keep) > now_ms {
                break;
            }
            if let Some((_, id)) = self.ended_order.pop_first() {
                self.ended.remove(&id);
            }
        }
    }

    /// Sessions ended at or after `since_ms` (store clock), oldest first,
    /// at most `limit`, with when each ended.
    pub fn ended_since(&self, since_ms: u64, limit: usize) -> Vec<(String, u64)> {
        self.ended_order
            .range((since_ms, String::new())..)
            .take(limit)
            .map(|(at, id)| (id.clone(), *at))
            .collect()
    }

    /// Seeds `n` places admitted at `now_ms` and not yet claimed (the
    /// simulator starting from a live room's pending claims): tail and
    /// frontier move up by `n` in one batch, so the places hold slots under
    /// the cap until claimed, or come back as credit when the claim window
    /// ends. Returns the first seq of the batch.
    pub fn seed_pending(&mut self, now_ms: u64, n: u64) -> u64 {
        let from = self.bucket.frontier + 1;
        if n == 0 {
            return from;
        }
        let to = self.bucket.frontier + n;
        self.bucket.frontier = to;
        self.bucket.tail = self.bucket.tail.max(to);
        self.batches.push_back(Batch {
            from,
            to,
            at_ms: now_ms,
        });
        self.pending += n;
        from
    }

    /// A later recovery of the same loss ([`crate::QueueStore::recover`] of
    /// a state that exists): while this state has handed out no seq of its
    /// own, the floors of another gateway (which may have seen more of the
    /// lost epoch) widen what it covers; once it has, only the floors rise.
    pub fn extend_carry(&mut self, min_tail: u64, min_frontier: u64, epoch: u64) {
        let fresh = self.counters.joins == 0;
        let floor = min_tail.max(min_frontier);
        if fresh
            && epoch > 0
            && epoch < self.epoch
            && floor > 0
            && (self.carried_epoch == 0 || self.carried_epoch == epoch)
        {
            self.carried_epoch = epoch;
            self.carried_tail = self.carried_tail.max(floor);
        }
        self.reseed(min_tail, min_frontier);
    }

    /// Raises tail and frontier. Seqs admitted this way are in no batch:
    /// they are treated as settled.
    pub fn reseed(&mut self, min_tail: u64, min_frontier: u64) {
        let before = self.bucket.frontier;
        if self.has_lanes() {
            // places are only numbers: both move up together, so the room's
            // `tail − frontier` stays the number waiting in the lanes
            let d = min_tail
                .max(min_frontier)
                .saturating_sub(self.bucket.frontier);
            self.bucket.tail += d;
            self.bucket.frontier += d;
            if d > 0 {
                self.settled = self.settled.max(self.bucket.frontier);
            }
            return;
        }
        self.bucket.reseed(min_tail, min_frontier);
        if self.bucket.frontier > before {
            self.settled = self.settled.max(self.bucket.frontier);
        }
    }

    /// The state at `now_ms` (sessions past their deadline not counted).
    pub fn snapshot(&self, room: &str, now_ms: u64) -> Snapshot {
        let expired = self.deadlines.range(..(now_ms + 1, String::new())).count() as u64;
        Snapshot {
            room: room.to_owned(),
            tail: self.bucket.tail,
            frontier: self.bucket.frontier,
            credit: self.bucket.credit_micro as f64 / MICRO as f64,
            rate_per_sec: self.params.rate_milli as f64 / 1000.0,
            burst: self.params.burst_micro as f64 / MICRO as f64,
            paused: self.params.paused,
            closed: self.params.closed,
            epoch: self.epoch,
            active_sessions: self.sessions.len() as u64 - expired,
            pending_claims: self.pending,
            max_active: self.max_active,
            admitted_total: self.counters.admitted,
            claimed_total: self.counters.claimed,
            joins_total: self.counters.joins,
            refunded_total: self.counters.refunded,
            late_claims_total: self.counters.late,
            store_now_ms: now_ms,
            opens_at_ms: (self.opens_ms > 0).then_some(self.opens_ms),
            prequeue_open: self.draw.is_none(),
            prequeue_draw: self
                .draw
                .filter(|d| self.opens_ms > 0 || *d != PrequeueDraw::default()),
            ended_total: self.ended_total,
            carried_epoch: self.carried_epoch,
            carried_tail: self.carried_tail,
            settings_version: self.settings.version,
            lanes: self
                .settings
                .lanes
                .iter()
                .zip(&self.lanes.lanes)
                .map(|(l, s)| LaneSnapshot {
                    weight: l.weight,
                    tail: s.tail,
                    frontier: s.frontier,
                    admitted_total: s.admitted,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[test]
    fn bitmap_counts_ranges() {
        let mut b = ClaimBitmap::default();
        for s in [1, 2, 63, 64, 65, 200] {
            assert!(!b.set(s));
        }
        assert!(b.set(64));
        assert_eq!(b.count(1, 200), 6);
        assert_eq!(b.count(3, 63), 1);
        assert_eq!(b.count(63, 64), 2);
        assert_eq!(b.count(66, 199), 0);
        assert_eq!(b.count(0, 1_000_000), 6);
        assert_eq!(b.count(5, 4), 0);
    }

    proptest::proptest! {
        /// A `random` room under any run of joins, advances and pauses: the
        /// frontier never passes the current draw (nobody undrawn is
        /// admitted, nobody joins on the spot); each draw starts where the
        /// last one ended, once it was exhausted, somebody waited and a
        /// second had passed, with the next index; so every admitted seq is
        /// in exactly one draw, and `draw_of` finds it for as long as its
        /// draw is younger than `lane_keep`.
        #[test]
        fn random_rolling_draws(
            keep in proptest::option::of(1_000u64..8_000),
            ops in proptest::collection::vec((0u64..1_500, 0u64..5, 0u8..8), 1..150),
        ) {
            let mut s = RoomSettings {
                rate_per_sec: 4.0,
                burst: 3.0,
                method: QueueMethod::Random,
                prequeue_seed: Some("00".repeat(32)),
                lane_keep: keep.map(Duration::from_millis),
                ..Default::default()
            };
            let mut r = RoomCore::new(0, &s, 1, 0, 0);
            let mut now = 0u64;
            let mut made: Vec<(u64, PrequeueDraw)> = Vec::new();
            for (dt, joins, flip) in ops {
                now += dt;
                if flip == 0 {
                    s.paused = !s.paused;
                    r.configure(now, &s);
                }
                for _ in 0..joins {
                    let j = r.join(now).unwrap();
                    proptest::prop_assert!(!j.admitted, "nobody joins on the spot");
                }
                r.advance(now);
                let d = r.draw.unwrap();
                let (last_at, last) = made.last().copied().unwrap_or((0, PrequeueDraw::default()));
                if d != last {
                    proptest::prop_assert_eq!(d.k, last.k + 1);
                    proptest::prop_assert_eq!(d.from, last.end(), "no gap, no overlap");
                    proptest::prop_assert!(d.n > 0, "a draw only when somebody waits");
                    proptest::prop_assert!(made.is_empty() || r.draw_at_ms >= last_at + DRAW_EVERY_MS);
                    made.push((r.draw_at_ms, d));
                }
                let b = &r.bucket;
                proptest::prop_assert!(b.frontier <= d.end(), "never past the draw");
                proptest::prop_assert!(d.end() <= b.tail);
                // every seq admitted is in exactly one draw, and draw_of finds
                // it while its draw is kept
                for seq in 1..=b.frontier {
                    let holders: Vec<_> = made.iter().filter(|(_, m)| m.contains(seq)).collect();
                    proptest::prop_assert_eq!(holders.len(), 1, "seq {}", seq);
                    let (at, m) = *holders[0];
                    match r.draw_of(seq) {
                        Some(found) => proptest::prop_assert_eq!(found, m),
                        None => proptest::prop_assert!(
                            keep.is_some_and(|k| at + k <= now),
                            "draw {:?} of seq {} forgotten too soon", m, seq
                        ),
                    }
                }
                proptest::prop_assert_eq!(r.draw_of(b.tail + 1), None);
            }
        }
    }

    proptest::proptest! {
        /// A scheduled room under any run of joins and advances: before the
        /// opening nobody is admitted (no passthrough, frontier still); the
        /// draw is recorded exactly once, at the first operation at or after
        /// the opening, with n = the tail then; every ticket was joined
        /// before it and every later seq after it.
        #[test]
        fn prequeue_invariants(
            opens in 1u64..5_000,
            ops in proptest::collection::vec((0u64..300, proptest::bool::ANY), 1..200),
        ) {
            let s = RoomSettings {
                rate_per_sec: 50.0,
                burst: 5.0,
                opens_at_ms: Some(opens),
                prequeue_seed: Some("00".repeat(32)),
                ..Default::default()
            };
            let mut r = RoomCore::new(0, &s, 1, 0, 0);
            let mut now = 0u64;
            let mut drawn: Option<PrequeueDraw> = None;
            let mut tickets = 0u64;
            for (dt, join) in ops {
                now += dt;
                let tail_before = r.bucket.tail;
                if join {
                    let j = r.join(now).unwrap();
                    proptest::prop_assert_eq!(j.prequeue, now < opens);
                    if j.prequeue {
                        tickets += 1;
                        proptest::prop_assert!(!j.admitted);
                    }
                } else {
                    r.advance(now);
                }
                let snap = r.snapshot("r", now);
                if now < opens {
                    proptest::prop_assert_eq!(snap.frontier, 0);
                    proptest::prop_assert!(snap.prequeue_open);
                } else {
                    let d = snap.prequeue_draw.unwrap();
                    match drawn {
                        None => {
                            proptest::prop_assert_eq!(d, PrequeueDraw { from: 0, n: tail_before, k: 0 });
                            drawn = Some(d);
                        }
                        Some(prev) => proptest::prop_assert_eq!(d, prev),
                    }
                    proptest::prop_assert_eq!(d.n, tickets);
                }
            }
        }
    }

    proptest::proptest! {
        /// Whatever visitors do (join, passthrough, claim their place any
        /// number of times, get revoked, come back with a token of a lost
        /// epoch), under a cap: active sessions never exceed `max_active`,
        /// a passthrough that admits nobody hands out no seq, no seq is
        /// handed out twice, and a revoked place never admits again.
        #[test]
        fn one_place_one_session_and_a_real_cap(
            cap in 1u64..6,
            ops in proptest::collection::vec((0u8..6, 0u64..40, 0u64..400), 1..300),
        ) {
            let s = RoomSettings {
                rate_per_sec: 20.0,
                burst: 3.0,
                max_active: Some(cap),
                claim_window: Duration::from_secs(2),
                session_ttl: Duration::from_secs(3),
                ..Default::default()
            };
            let mut r = RoomCore::new(0, &s, 1, 0, 0);
            let mut now = 0u64;
            let mut handed = std::collections::HashSet::new();
            let mut revoked = std::collections::HashSet::new();
            let ttl = 3_000;
            // the gateway's session ids: a start after an admission at once
            // renews the session the store started with it
            use crate::tokens::session_of;
            for (op, arg, dt) in ops {
                now += dt;
                match op {
                    0 => {
                        let j = r.join(now).unwrap();
                        proptest::prop_assert!(handed.insert(j.seq));
                        if j.admitted {
                            r.session_start(now, &session_of(j.epoch, j.seq), ttl);
                        }
                    }
                    1 => {
                        let tail = r.bucket.tail;
                        match r.passthrough(now) {
                            Some(j) => {
                                proptest::prop_assert!(j.admitted);
                                proptest::prop_assert!(handed.insert(j.seq));
                                r.session_start(now, &session_of(j.epoch, j.seq), ttl);
                            }
                            None => proptest::prop_assert_eq!(r.bucket.tail, tail),
                        }
                    }
                    2 | 3 => {
                        let seq = arg.min(r.bucket.tail).max(1);
                        let sid = session_of(r.epoch, seq);
                        let o = r.admit(now, seq, &sid, ttl);
                        if revoked.contains(&seq) {
                            proptest::prop_assert!(!o.is_admitted(), "{o:?}");
                        }
                    }
                    4 => {
                        // the origin revokes a session it saw: a claimed place's
                        let seq = arg.min(r.bucket.tail).max(1);
                        if r.claims.get(seq) {
                            r.session_end(now, &session_of(r.epoch, seq));
                            revoked.insert(seq);
                        }
                    }
                    _ => {
                        let j = r.reseat(now, 0, arg, 60_000).unwrap();
                        let again = r.reseat(now, 0, arg, 60_000).unwrap();
                        proptest::prop_assert_eq!(j.seq, again.seq);
                        handed.insert(j.seq);
                    }
                }
                r.advance(now);
                let snap = r.snapshot("r", now);
                proptest::prop_assert!(
                    snap.active_sessions <= cap,
                    "{} active over a cap of {}", snap.active_sessions, cap
                );
                proptest::prop_assert!(snap.frontier <= snap.tail);
            }
        }
    }

    #[test]
    fn no_show_refund_then_late_claim() {
        let s = RoomSettings {
            rate_per_sec: 10.0,
            burst: 1.0,
            claim_window: Duration::from_secs(5),
            ..Default::default()
        };
        let mut r = RoomCore::new(0, &s, 1, 0, 0);
        r.bucket.credit_micro = 0;
        for _ in 0..20 {
            r.join(0).unwrap();
        }
        assert_eq!(r.advance(1_000), 10);
        assert_eq!(r.claim(3), ClaimOutcome::Claimed);
        assert_eq!(r.claim(3), ClaimOutcome::AlreadyClaimed);
        assert_eq!(r.claim(11), ClaimOutcome::NotAdmitted);
        assert_eq!(r.advance(5_999), 10); // capped by the queue: 10 left
        // window passes: 9 unclaimed slots refunded
        r.advance(6_000);
        assert_eq!(r.counters.refunded, 9);
        assert_eq!(r.claim(4), ClaimOutcome::Late);
        assert_eq!(r.claim(4), ClaimOutcome::AlreadyClaimed);
    }

    fn lane_room(weights: &[u32], strict: bool, rate: f64, burst: f64) -> RoomCore {
        let s = RoomSettings {
            rate_per_sec: rate,
            burst,
            lanes: weights
                .iter()
                .enumerate()
                .map(|(i, &weight)| crate::lanes::Lane {
                    id: format!("l{i}"),
                    weight,
                })
                .collect(),
            lane_mode: if strict {
                crate::lanes::LaneMode::Strict
            } else {
                crate::lanes::LaneMode::Weighted
            },
            ..Default::default()
        };
        RoomCore::new(0, &s, 1, 0, 0)
    }

    proptest::proptest! {
        /// Random joins into random lanes (or the default) and random
        /// advances: within each lane, admissions are in seq order (a lane
        /// seq's place is above every earlier seq's, and no seq waits
        /// behind a later one admitted); places are never shared; the
        /// total admitted over any window never passes rate × window +
        /// burst (+1); strict never admits a lower lane while a higher one
        /// waits after the advance; and the room's counts are the lanes'
        /// sums.
        #[test]
        fn lanes_invariants(
            weights in proptest::collection::vec(1u32..10, 1..5),
            strict in proptest::bool::ANY,
            rate in 1.0f64..200.0,
            burst in 1.0f64..20.0,
            ops in proptest::collection::vec((0u64..300, 0u8..6), 1..300),
        ) {
            let mut r = lane_room(&weights, strict, rate, burst);
            let k = weights.len();
            let mut now = 0u64;
            let mut admits: Vec<(u64, u64)> = Vec::new();
            for (dt, op) in ops {
                now += dt;
                let before: Vec<_> = r.lanes.lanes[..k].to_vec();
                let f0 = r.bucket.frontier;
                if op == 0 {
                    r.advance(now);
                } else {
                    let lane = (usize::from(op) - 1 < k).then(|| usize::from(op) - 1);
                    let j = r.join_lane(now, lane).unwrap();
                    let lane = lane.unwrap_or(k - 1);
                    proptest::prop_assert_eq!(j.lane, Some(lane as u8));
                    proptest::prop_assert_eq!(j.seq, r.lanes.lanes[lane].tail);
                }
                admits.push((now, r.bucket.frontier - f0));
                let after = &r.lanes.lanes[..k];
                if strict {
                    for i in 0..k {
                        if after[i].frontier > before[i].frontier && op == 0 {
                            for (j, a) in after.iter().enumerate().take(i) {
                                proptest::prop_assert_eq!(a.waiting(), 0, "lane {} waits while {} admitted", j, i);
                            }
                        }
                    }
                }
                let admitted: u64 = after.iter().map(|l| l.frontier).sum();
                let joined: u64 = after.iter().map(|l| l.tail).sum();
                proptest::prop_assert_eq!(admitted, r.bucket.frontier);
                proptest::prop_assert_eq!(joined, r.bucket.tail);
                proptest::prop_assert_eq!(joined, r.counters.joins);
            }
            let mut seen = std::collections::HashSet::new();
            for i in 0..k {
                let l = r.lanes.lanes[i];
                let mut last = 0;
                for seq in 1..=l.tail {
                    match r.place_of(Some(i), seq) {
                        Some(p) => {
                            proptest::prop_assert!(seq <= l.frontier);
                            proptest::prop_assert!(p > last, "lane {} seq {} place {} after {}", i, seq, p, last);
                            proptest::prop_assert!(seen.insert(p));
                            last = p;
                        }
                        None => proptest::prop_assert!(seq > l.frontier),
                    }
                }
            }
            for i in 0..admits.len() {
                let start = if i == 0 { 0 } else { admits[i - 1].0 };
                let mut sum = 0u64;
                for &(t, n) in &admits[i..] {
                    sum += n;
                    let bound = rate * (t - start) as f64 / 1000.0 + burst + 1.0;
                    proptest::prop_assert!(sum as f64 <= bound, "{} admitted, bound {}", sum, bound);
                }
            }
        }

        /// With `lane_keep`: an admitted lane seq's place is found for as
        /// long as a token signed at its join can be presented (`lane_keep`
        /// after the join), whatever the joins and advances; and a room
        /// that stood still long enough has forgotten every segment.
        #[test]
        fn lanes_forget_only_what_no_token_reaches(
            weights in proptest::collection::vec(1u32..10, 1..4),
            keep_s in 1u64..5,
            ops in proptest::collection::vec((0u64..800, 0u8..5), 1..300),
        ) {
            let mut r = lane_room(&weights, false, 20.0, 5.0);
            let keep_ms = keep_s * 1000;
            let mut s = r.settings.clone();
            s.lane_keep = Some(std::time::Duration::from_millis(keep_ms));
            r.configure(0, &s);
            let k = weights.len();
            let mut joined_at: Vec<Vec<u64>> = vec![Vec::new(); k];
            let mut now = 0u64;
            for (dt, op) in ops {
                now += dt;
                if op == 0 {
                    r.advance(now);
                } else {
                    let lane = (usize::from(op) - 1 < k).then(|| usize::from(op) - 1);
                    let j = r.join_lane(now, lane).unwrap();
                    joined_at[usize::from(j.lane.unwrap())].push(now);
                }
                for (i, times) in joined_at.iter().enumerate() {
                    let f = r.lanes.lanes[i].frontier;
                    for (s0, &at) in times.iter().enumerate() {
                        let seq = s0 as u64 + 1;
                        if seq <= f && at + keep_ms > now {
                            proptest::prop_assert!(r.place_of(Some(i), seq).is_some(),
                                "lane {} seq {} joined at {} gone at {}", i, seq, at, now);
                        }
                    }
                }
            }
            while r.lanes_waiting() > 0 {
                now += 1_000;
                r.advance(now);
            }
            let idle = 2 * (keep_ms + keep_ms / LANE_MARKS + 1_000);
            r.advance(now + idle / 2);
            r.advance(now + idle);
            proptest::prop_assert_eq!(r.lanes.segment_count(), 0);
        }

        /// Every lane backlogged, weighted: the admitted split converges
        /// to the weights (within one round of weights, whatever the
        /// advance times).
        #[test]
        fn lanes_split_follows_weights(
            weights in proptest::collection::vec(1u32..10, 2..5),
            ticks in proptest::collection::vec(1u64..500, 20..100),
        ) {
            let mut r = lane_room(&weights, false, 20.0, 1.0);
            let k = weights.len();
            for i in 0..k {
                for _ in 0..2_000 {
                    r.join_lane(0, Some(i)).unwrap();
                }
            }
            // the joins passed some through: count from here
            let start: Vec<u64> = r.lanes.lanes[..k].iter().map(|l| l.frontier).collect();
            let mut now = 0;
            for t in ticks {
                now += t;
                r.advance(now);
            }
            let got: Vec<u64> = (0..k).map(|i| r.lanes.lanes[i].frontier - start[i]).collect();
            let total: u64 = got.iter().sum();
            let wsum: u64 = weights.iter().map(|&w| u64::from(w)).sum();
            proptest::prop_assert!(r.lanes.lanes[..k].iter().all(|l| l.waiting() > 0), "stayed backlogged");
            for i in 0..k {
                let exact = total as f64 * f64::from(weights[i]) / wsum as f64;
                proptest::prop_assert!((got[i] as f64 - exact).abs() <= wsum as f64,
                    "lane {} got {} of {}, exact {}", i, got[i], total, exact);
            }
        }
    }
}
