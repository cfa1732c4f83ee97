//! The `QueueStore` trait: the atomic operations of a room's queue, and the
//! values they return (the backends and the enum that picks one are below
//! it: `memory`, `redis_store`, `backend`). `memory.rs` is the reference semantics; `redis.rs`
//! runs the same rules as Lua scripts; `conformance` holds them to one suite.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;

use crate::error::AdmissionError;
use crate::prequeue::PrequeueDraw;
use crate::settings::RoomSettings;

/// Result of the store operations.
pub type Result<T, E = AdmissionError> = std::result::Result<T, E>;

/// What `join` hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct JoinOutcome {
    /// The visitor's sequence number (its place in line), never reissued.
    pub seq: u64,
    /// The room's epoch (goes in the queue token).
    pub epoch: u64,
    /// Admitted at once (passthrough). Such a place is claimed by the join
    /// itself: the gateway hands out the admission token in the same answer.
    pub admitted: bool,
    /// The frontier just after the join (position = `seq − frontier`).
    pub frontier: u64,
    /// The room has not opened yet: this seq is a pre-queue ticket, its
    /// place decided by the draw at the opening.
    pub prequeue: bool,
    /// The lane joined (index in the room's `lanes`); `None` without lanes.
    /// With a lane, `seq` and `frontier` are the lane's.
    pub lane: Option<u8>,
    /// The place (the room-wide number claims and sessions use) when
    /// admitted at once, else 0. Without lanes it is `seq` when admitted.
    pub place: u64,
}

impl JoinOutcome {
    /// 1 = next to be admitted; 0 = admitted.
    pub fn position(&self) -> u64 {
        self.seq.saturating_sub(self.frontier)
    }
}

/// A proof-of-work solution paying for a join ([`QueueStore::join_once`]).
#[derive(Clone, Copy, Debug)]
pub struct Solution<'a> {
    /// The challenge's id: what makes the solution single-use.
    pub id: &'a [u8; 16],
    /// How long the id is remembered: until the challenge can no longer be
    /// accepted anywhere.
    pub ttl: Duration,
    /// The visitor id the place is noted with.
    pub sub: &'a str,
    /// The caller recorded the id itself ([`QueueStore::spend_solution`]):
    /// no replay check, the note is written over.
    pub spent: bool,
    /// The lane to join (index in the room's `lanes`); `None`: the room's
    /// default lane, or the one line of a room without lanes.
    pub lane: Option<u8>,
}

/// What [`QueueStore::join_once`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinOnce {
    /// The solution bought this place now.
    Joined(JoinOutcome),
    /// The solution was spent before; nothing changed. `note`: the place it
    /// bought (`seq:epoch:sub`), `None` when it bought none to give back
    /// (admitted at once, or spent by [`QueueStore::spend_solution`] and
    /// not joined yet).
    Replayed {
        /// The place noted by the first join.
        note: Option<String>,
    },
}

/// What [`QueueStore::spend_solution`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spend {
    /// First use: recorded now.
    First,
    /// Spent before, with the place it bought (see [`JoinOnce::Replayed`]).
    Replayed {
        /// The place noted by the first join.
        note: Option<String>,
    },
}

/// What `claim` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ClaimOutcome {
    /// First claim of an admitted place, within its claim window.
    Claimed,
    /// Claimed before (a retry, a second tab): fine, hand out the token again.
    AlreadyClaimed,
    /// The frontier has not reached this seq (or seq 0): keep waiting.
    NotAdmitted,
    /// First claim after the claim window: the slot had already been given
    /// back as credit. It is **still honoured** (nobody loses a place in
    /// line for a slow network or a sleeping laptop), and it takes the
    /// credit back (credit − 1, possibly below zero), so the origin still
    /// sees no more than the rate. Counted in `late_claims_total`.
    Late,
}

/// What [`QueueStore::admit`] found: a claim and the place's session in
/// one atomic step (one place, one session).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum AdmitOutcome {
    /// The frontier has not reached this place: keep waiting.
    NotAdmitted,
    /// First claim of the place: its session started. `late`: after the
    /// claim window (honoured; see [`ClaimOutcome::Late`]).
    Started {
        /// Claimed after the claim window.
        late: bool,
    },
    /// Claimed before (a retry, a second tab) and its session is live: the
    /// same session, renewed. Never a second one.
    Resumed,
    /// Claimed before and its session is over (revoked, or expired): the
    /// place is spent and admits nobody again.
    Spent,
}

impl AdmitOutcome {
    /// Whether the visitor may have its admission token.
    pub fn is_admitted(self) -> bool {
        matches!(self, AdmitOutcome::Started { .. } | AdmitOutcome::Resumed)
    }
}

/// The floors a gateway recovers a lost room with: the highest tail and
/// frontier it has seen, and the epoch they were seen in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Floors {
    /// Highest tail seen.
    pub tail: u64,
    /// Highest frontier seen.
    pub frontier: u64,
    /// The epoch they belong to (0: none seen).
    pub epoch: u64,
}

impl ClaimOutcome {
    /// Whether the visitor may have its admission token.
    pub fn is_admitted(self) -> bool {
        !matches!(self, ClaimOutcome::NotAdmitted)
    }
}

/// A room's state at one instant of the store's clock. Gateways cache the
/// latest one and answer status polls from it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    /// The room id.
    pub room: String,
    /// Last seq handed out.
    pub tail: u64,
    /// Every seq ≤ frontier is admitted.
    pub frontier: u64,
    /// Saved-up admissions (may be negative after late claims).
    pub credit: f64,
    /// Admissions per second in force.
    pub rate_per_sec: f64,
    /// Burst in force.
    pub burst: f64,
    /// Admission paused.
    pub paused: bool,
    /// Room closed.
    pub closed: bool,
    /// Changes when the store's state was created anew (a lost store).
    pub epoch: u64,
    /// Sessions not yet expired.
    pub active_sessions: u64,
    /// Admitted places not yet claimed, still within their claim window.
    pub pending_claims: u64,
    /// The cap on `active_sessions + pending_claims`, if any.
    pub max_active: Option<u64>,
    /// Every seq ever admitted (including passthrough).
    pub admitted_total: u64,
    /// Every admitted place claimed (including late ones and passthrough).
    pub claimed_total: u64,
    /// Every join.
    pub joins_total: u64,
    /// No-show slots given back as credit.
    pub refunded_total: u64,
    /// Claims after the claim window (honoured, see [`ClaimOutcome::Late`]).
    pub late_claims_total: u64,
    /// The store's clock when the snapshot was taken (ms since the epoch).
    pub store_now_ms: u64,
    /// When the room opens (or opened), if it is scheduled.
    pub opens_at_ms: Option<u64>,
    /// The pre-queue is open: the room is scheduled and its draw not made
    /// yet (nobody is admitted; joins are pre-queue tickets).
    pub prequeue_open: bool,
    /// The draw made at the opening, if the room had one (and kept until a
    /// new schedule replaces it). Places of its tickets come from
    /// [`crate::PlaceMap`]; `frontier` counts places.
    pub prequeue_draw: Option<PrequeueDraw>,
    /// Sessions ended by revoke so far (a gateway fetches the ended set
    /// when this moves: [`QueueStore::ended_since`]).
    pub ended_total: u64,
    /// The epoch whose seqs this state was created above (0: none known).
    /// A queue token of an older epoch keeps its seq as its place only when
    /// its epoch is at most this and its seq at most `carried_tail`; any
    /// other is given a place of this epoch ([`QueueStore::reseat`]).
    pub carried_epoch: u64,
    /// The tail floor this state was created with.
    pub carried_tail: u64,
    /// The version of the room's settings in the store.
    pub settings_version: u64,
    /// Per lane, in config order ([`crate::lanes`]); empty without lanes.
    /// Left out of the JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneSnapshot>,
}

/// One lane's state in a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LaneSnapshot {
    /// Its weight (the id is the settings' lane of the same index).
    pub weight: u32,
    /// Last lane seq handed out.
    pub tail: u64,
    /// Every lane seq ≤ frontier is admitted.
    pub frontier: u64,
    /// Admitted from this lane so far.
    pub admitted_total: u64,
}

impl LaneSnapshot {
    /// Waiting in this lane.
    pub fn waiting(&self) -> u64 {
        self.tail.saturating_sub(self.frontier)
    }

    /// The position of lane seq `seq` (1 = next in this lane), 0 when
    /// admitted.
    pub fn position(&self, seq: u64) -> u64 {
        seq.saturating_sub(self.frontier)
    }
}

impl Snapshot {
    /// Whether a queue token of `epoch` holding `seq` keeps `seq` as its
    /// place here: a token of this epoch, or of an older one whose seqs this
    /// state was created above. Any other (an epoch this state knows
    /// nothing of, or a newer one: the store went back) is reseated.
    pub fn covers(&self, epoch: u64, seq: u64) -> bool {
        epoch == self.epoch
            || (epoch < self.epoch && epoch <= self.carried_epoch && seq <= self.carried_tail)
    }

    /// Visitors waiting (or holding pre-queue tickets): `tail − frontier`.
    pub fn queue_length(&self) -> u64 {
        self.tail.saturating_sub(self.frontier)
    }

    /// The position of the place `place` (1 = next), 0 when admitted. A
    /// seq is its own place unless it holds a pre-queue ticket
    /// ([`crate::PlaceMap`]).
    pub fn position(&self, place: u64) -> u64 {
        place.saturating_sub(self.frontier)
    }

    /// Whether the place `place` is admitted.
    pub fn is_admitted(&self, place: u64) -> bool {
        place != 0 && place <= self.frontier
    }
}

/// The atomic operations of a room's queue. Every operation that changes
/// the bucket first brings it up to the store's clock (so `join` also
/// admits those waiting when credit allows), and every one of them is
/// atomic: many gateways may call them at once.
pub trait QueueStore: Send + Sync {
    /// Creates the room (with a new epoch) or changes its settings. A change
    /// re-anchors the bucket atomically: credit earned so far at the old
    /// rate is settled first.
    fn configure(
        &self,
        room: &str,
        settings: &RoomSettings,
    ) -> impl Future<Output = Result<Snapshot>> + Send;

    /// Recreates a room the store lost, above the floors: a new state (new
    /// epoch) with `settings`, tail and frontier at least the floors, and
    /// the floors' epoch recorded as covered ([`Snapshot::carried_epoch`]).
    /// When the room has a state (another gateway recovered it first, or a
    /// replica went back in time) the floors are raised, settings and epoch
    /// untouched; while that state has handed out no seq yet, floors of the
    /// epoch it covers (or of any, if it covers none) widen its coverage. The gateway calls it with the highest values it has
    /// seen, so no seq is reissued and no position moves back.
    fn recover(
        &self,
        room: &str,
        settings: &RoomSettings,
        floors: Floors,
    ) -> impl Future<Output = Result<Snapshot>> + Send;

    /// The room's settings (with the store's [`RoomSettings::version`]),
    /// `None` when the store has no state for it.
    /// [`AdmissionError::StoredSettings`] when what the store holds is
    /// unparseable, oversized or invalid: the caller keeps its last good
    /// copy.
    fn settings(&self, room: &str) -> impl Future<Output = Result<Option<RoomSettings>>> + Send;

    /// Writes `settings` if the store's version is still
    /// `settings.version` (compare and set), bumping it:
    /// [`AdmissionError::SettingsConflict`] when another write came first
    /// (read again, apply the change again, retry), `RoomNotFound` when the
    /// room has no state. Re-anchors the bucket as `configure` does.
    fn update_settings(
        &self,
        room: &str,
        settings: &RoomSettings,
    ) -> impl Future<Output = Result<Snapshot>> + Send;

    /// Admits a new visitor on the spot when nobody waits and credit (and
    /// the active cap) allow, claiming the place; otherwise changes nothing
    /// and hands out no seq (`None`). For requests without proof of work: a
    /// place in line is only ever bought at [`QueueStore::join`].
    fn passthrough(&self, room: &str) -> impl Future<Output = Result<Option<JoinOutcome>>> + Send;

    /// A place of the current epoch for a queue token of `old_epoch` that
    /// the state does not cover ([`Snapshot::covers`]): a new seq at the
    /// back the first time, the same one for every later ask (remembered
    /// for `ttl` after the last), never shared with any other visitor.
    fn reseat(
        &self,
        room: &str,
        old_epoch: u64,
        old_seq: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<JoinOutcome>> + Send;

    /// Claims `place` and starts (or resumes) its session `session_id` in
    /// one atomic step: see [`AdmitOutcome`].
    fn admit(
        &self,
        room: &str,
        place: u64,
        session_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<AdmitOutcome>> + Send;

    /// Sessions ended (revoked) at or after `since_ms` (store clock), with
    /// when each ended, oldest first, at most `limit`.
    fn ended_since(
        &self,
        room: &str,
        since_ms: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, u64)>>> + Send;

    /// Hands out the next seq; admits it at once when nobody waits and credit
    /// allows (passthrough). [`AdmissionError::Closed`] when the room is closed.
    fn join(&self, room: &str) -> impl Future<Output = Result<JoinOutcome>> + Send;

    /// [`QueueStore::join`] into lane `lane` (index in the room's `lanes`;
    /// `None`: the default lane, the last). A lane the room does not have
    /// (any lane at a room without lanes) is
    /// [`AdmissionError::LaneNotFound`], nothing handed out.
    fn join_lane(
        &self,
        room: &str,
        lane: Option<u8>,
    ) -> impl Future<Output = Result<JoinOutcome>> + Send;

    /// The place (the room-wide number [`QueueStore::admit`] takes) of
    /// lane `lane`'s seq `seq`, once admitted; `None` while it waits (or no
    /// such lane).
    fn lane_place(
        &self,
        room: &str,
        lane: u8,
        seq: u64,
    ) -> impl Future<Output = Result<Option<u64>>> + Send;

    /// The draw that holds `seq` ([`crate::prequeue`], "Rolling draws"):
    /// the current one or one the store keeps; `None` when none does (the
    /// seq's place is its own). What a gateway asks when a queue token names
    /// a seq of a draw it did not see being made.
    fn draw_of(
        &self,
        room: &str,
        seq: u64,
    ) -> impl Future<Output = Result<Option<PrequeueDraw>>> + Send;

    /// Adds to a `random` room's kept draws those of `draws` it does not
    /// hold (by their first seq), as made now: what a gateway that saw them
    /// hands a store that lost its state, after [`QueueStore::recover`], so
    /// a gateway that did not see them can still ask [`QueueStore::draw_of`].
    /// Nothing for a room of another method.
    fn keep_draws(
        &self,
        room: &str,
        draws: &[PrequeueDraw],
    ) -> impl Future<Output = Result<()>> + Send;

    /// The replay guard and [`QueueStore::join`] in one atomic step: a
    /// solution recorded before (and not `spent` by this caller) changes
    /// nothing and returns its note; otherwise the join, and when it hands
    /// out a seq the solution is recorded for its ttl with the place
    /// (`seq:epoch:sub`; no place when admitted at once). A join that hands
    /// out nothing (closed, full, no state) records nothing: the solution
    /// stays good. So a solution buys one place, and every replay of it
    /// sees that place, however many gateways race.
    fn join_once(
        &self,
        room: &str,
        solution: Solution<'_>,
    ) -> impl Future<Output = Result<JoinOnce>> + Send;

    /// [`QueueStore::join_once`] for each of `solutions`, in order, as one
    /// atomic step: each exactly as its own call would make it, one after
    /// the other at one instant (the same solution twice: the second a
    /// replay of the first). `Err` when the step as a whole failed (the
    /// store unreachable, a timeout, too few replicas): then none, or all,
    /// of the joins happened, as for one `join_once`; otherwise one result
    /// per solution, a refusal (closed, full, no such lane, no state) for
    /// that one alone. On Redis one script call for them all, a third of
    /// the store's work per join of calls one each (README, "Joins sent
    /// together").
    fn join_once_many(
        &self,
        room: &str,
        solutions: &[Solution<'_>],
    ) -> impl Future<Output = Result<Vec<Result<JoinOnce>>>> + Send;

    /// Records a solution's id for `ttl` if it is not recorded: for a join
    /// with steps of its own between the spending and the place (invites,
    /// accounts), which then calls [`QueueStore::join_once`] with `spent`.
    fn spend_solution(
        &self,
        room: &str,
        id: &[u8; 16],
        ttl: Duration,
    ) -> impl Future<Output = Result<Spend>> + Send;

    /// Forgets a solution's id (and its note), so it may pay again: for a
    /// join whose purchase failed after [`QueueStore::spend_solution`].
    fn release_solution(
        &self,
        room: &str,
        id: &[u8; 16],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Brings the bucket up to the store's clock: refunds no-shows, prunes
    /// expired sessions, admits what credit and the active cap allow.
    fn advance(&self, room: &str) -> impl Future<Output = Result<Snapshot>> + Send;

    /// The room's state, changing nothing.
    fn snapshot(&self, room: &str) -> impl Future<Output = Result<Snapshot>> + Send;

    /// Marks an admitted place as claimed (its visitor fetched the admission
    /// token). `seq` is the **place** (its seq unless it holds a pre-queue
    /// ticket: see [`crate::PlaceMap`]): the claim bitmap counts places, as
    /// the frontier does.
    fn claim(&self, room: &str, seq: u64) -> impl Future<Output = Result<ClaimOutcome>> + Send;

    /// Starts (or renews) a session for `ttl`; returns the active count.
    fn session_start(
        &self,
        room: &str,
        session_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Renews a live session; `false` when it had expired or never existed.
    fn session_touch(
        &self,
        room: &str,
        session_id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Ends a session at once (revoke), freeing its slot, and records it in
    /// the room's ended set (kept for the session's idle lifetime, see
    /// [`QueueStore::ended_since`]); `false` when it was not active.
    fn session_end(
        &self,
        room: &str,
        session_id: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Raises tail and frontier to at least the given floors (never lowers
    /// them). [`AdmissionError::RoomNotFound`] when the room has no state:
    /// use [`QueueStore::recover`] then.
    fn reseed(
        &self,
        room: &str,
        min_tail: u64,
        min_frontier: u64,
    ) -> impl Future<Output = Result<Snapshot>> + Send;

    /// Takes or renews the room's steering lease for `holder` (one gateway
    /// id) for `ttl`: `true` when `holder` holds it now (it was free,
    /// expired, or already `holder`'s), `false` while another holder's lease
    /// runs. One gateway at a time steers a room's rate (adaptive
    /// admission); a holder that stops renewing loses the lease after `ttl`.
    /// Independent of the room's queue state (works before `configure`).
    fn lease(
        &self,
        room: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// One take from the rate limit `key` (`[A-Za-z0-9._-]{1,100}`),
    /// `per_sec` a second and `burst` at once, shared by every gateway on
    /// this store ([`crate::rate`]: GCRA on the store's clock): `None` when
    /// taken, `Some(ms)` when refused (nothing changed; allowed again in
    /// `ms`). Independent of rooms.
    fn take_rate(
        &self,
        key: &str,
        per_sec: f64,
        burst: u32,
    ) -> impl Future<Output = Result<Option<u64>>> + Send;
}
