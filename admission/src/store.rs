//! The `QueueStore` trait: the atomic operations of a room's queue, and the
//! values they return. `memory.rs` is the reference semantics; `redis.rs`
//! runs the same rules as Lua scripts; `conformance` holds them to one suite.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;

use crate::error::AdmissionError;
use crate::memory::MemoryQueueStore;
use crate::prequeue::PrequeueDraw;
use crate::redis_store::RedisQueueStore;
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
}

impl JoinOutcome {
    /// 1 = next to be admitted; 0 = admitted.
    pub fn position(&self) -> u64 {
        self.seq.saturating_sub(self.frontier)
    }
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
}

impl Snapshot {
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

    /// Like [`QueueStore::configure`], and raises tail and frontier to at
    /// least the given floors in the same atomic step. The gateway calls it
    /// when an operation answered [`AdmissionError::RoomNotFound`] (the store
    /// lost its state), with the highest tail and frontier it has seen, so no
    /// seq is reissued and no position moves back.
    fn recover(
        &self,
        room: &str,
        settings: &RoomSettings,
        min_tail: u64,
        min_frontier: u64,
    ) -> impl Future<Output = Result<Snapshot>> + Send;

    /// The room's settings, `None` when the store has no state for it.
    fn settings(&self, room: &str) -> impl Future<Output = Result<Option<RoomSettings>>> + Send;

    /// Hands out the next seq; admits it at once when nobody waits and credit
    /// allows (passthrough). [`AdmissionError::Closed`] when the room is closed.
    fn join(&self, room: &str) -> impl Future<Output = Result<JoinOutcome>> + Send;

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

    /// Ends a session at once (revoke), freeing its slot; `false` when it
    /// was not active.
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
}

/// The store a gateway runs on, chosen at start-up.
#[derive(Clone)]
pub enum QueueBackend {
    /// One process, no Redis.
    Memory(MemoryQueueStore),
    /// Many gateways sharing Redis (standalone or cluster).
    Redis(RedisQueueStore),
}

impl From<MemoryQueueStore> for QueueBackend {
    fn from(s: MemoryQueueStore) -> Self {
        QueueBackend::Memory(s)
    }
}

impl From<RedisQueueStore> for QueueBackend {
    fn from(s: RedisQueueStore) -> Self {
        QueueBackend::Redis(s)
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            QueueBackend::Memory($s) => $e.await,
            QueueBackend::Redis($s) => $e.await,
        }
    };
}

impl QueueStore for QueueBackend {
    async fn configure(&self, room: &str, settings: &RoomSettings) -> Result<Snapshot> {
        delegate!(self, s => s.configure(room, settings))
    }
    async fn recover(
        &self,
        room: &str,
        settings: &RoomSettings,
        min_tail: u64,
        min_frontier: u64,
    ) -> Result<Snapshot> {
        delegate!(self, s => s.recover(room, settings, min_tail, min_frontier))
    }
    async fn settings(&self, room: &str) -> Result<Option<RoomSettings>> {
        delegate!(self, s => s.settings(room))
    }
    async fn join(&self, room: &str) -> Result<JoinOutcome> {
        delegate!(self, s => s.join(room))
    }
    async fn advance(&self, room: &str) -> Result<Snapshot> {
        delegate!(self, s => s.advance(room))
    }
    async fn snapshot(&self, room: &str) -> Result<Snapshot> {
        delegate!(self, s => s.snapshot(room))
    }
    async fn claim(&self, room: &str, seq: u64) -> Result<ClaimOutcome> {
        delegate!(self, s => s.claim(room, seq))
    }
    async fn session_start(&self, room: &str, session_id: &str, ttl: Duration) -> Result<u64> {
        delegate!(self, s => s.session_start(room, session_id, ttl))
    }
    async fn session_touch(&self, room: &str, session_id: &str, ttl: Duration) -> Result<bool> {
        delegate!(self, s => s.session_touch(room, session_id, ttl))
    }
    async fn session_end(&self, room: &str, session_id: &str) -> Result<bool> {
        delegate!(self, s => s.session_end(room, session_id))
    }
    async fn reseed(&self, room: &str, min_tail: u64, min_frontier: u64) -> Result<Snapshot> {
        delegate!(self, s => s.reseed(room, min_tail, min_frontier))
    }
    async fn lease(&self, room: &str, holder: &str, ttl: Duration) -> Result<bool> {
        delegate!(self, s => s.lease(room, holder, ttl))
    }
}
