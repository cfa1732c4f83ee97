//! [`QueueBackend`]: the store a gateway runs on, picked at start-up, so
//! that generics do not leak through the gateway.

use std::time::Duration;

use crate::memory::MemoryQueueStore;
use crate::prequeue::PrequeueDraw;
use crate::redis_store::RedisQueueStore;
use crate::settings::RoomSettings;
use crate::store::{
    AdmitOutcome, ClaimOutcome, Floors, JoinOnce, JoinOutcome, QueueStore, Result, Snapshot,
    Solution, Spend,
};

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
        floors: Floors,
    ) -> Result<Snapshot> {
        delegate!(self, s => s.recover(room, settings, floors))
    }
    async fn settings(&self, room: &str) -> Result<Option<RoomSettings>> {
        delegate!(self, s => s.settings(room))
    }
    async fn update_settings(&self, room: &str, settings: &RoomSettings) -> Result<Snapshot> {
        delegate!(self, s => s.update_settings(room, settings))
    }
    async fn passthrough(&self, room: &str) -> Result<Option<JoinOutcome>> {
        delegate!(self, s => s.passthrough(room))
    }
    async fn reseat(
        &self,
        room: &str,
        old_epoch: u64,
        old_seq: u64,
        ttl: Duration,
    ) -> Result<JoinOutcome> {
        delegate!(self, s => s.reseat(room, old_epoch, old_seq, ttl))
    }
    async fn admit(
        &self,
        room: &str,
        place: u64,
        session_id: &str,
        ttl: Duration,
    ) -> Result<AdmitOutcome> {
        delegate!(self, s => s.admit(room, place, session_id, ttl))
    }
    async fn ended_since(
        &self,
        room: &str,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>> {
        delegate!(self, s => s.ended_since(room, since_ms, limit))
    }
    async fn join(&self, room: &str) -> Result<JoinOutcome> {
        delegate!(self, s => s.join(room))
    }

    async fn join_lane(&self, room: &str, lane: Option<u8>) -> Result<JoinOutcome> {
        delegate!(self, s => s.join_lane(room, lane))
    }

    async fn lane_place(&self, room: &str, lane: u8, seq: u64) -> Result<Option<u64>> {
        delegate!(self, s => s.lane_place(room, lane, seq))
    }
    async fn draw_of(&self, room: &str, seq: u64) -> Result<Option<PrequeueDraw>> {
        delegate!(self, s => s.draw_of(room, seq))
    }
    async fn keep_draws(&self, room: &str, draws: &[PrequeueDraw]) -> Result<()> {
        delegate!(self, s => s.keep_draws(room, draws))
    }
    async fn join_once(&self, room: &str, solution: Solution<'_>) -> Result<JoinOnce> {
        delegate!(self, s => s.join_once(room, solution))
    }
    async fn join_once_many(
        &self,
        room: &str,
        solutions: &[Solution<'_>],
    ) -> Result<Vec<Result<JoinOnce>>> {
        delegate!(self, s => s.join_once_many(room, solutions))
    }
    async fn spend_solution(&self, room: &str, id: &[u8; 16], ttl: Duration) -> Result<Spend> {
        delegate!(self, s => s.spend_solution(room, id, ttl))
    }
    async fn release_solution(&self, room: &str, id: &[u8; 16]) -> Result<()> {
        delegate!(self, s => s.release_solution(room, id))
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

    async fn take_rate(&self, key: &str, per_sec: f64, burst: u32) -> Result<Option<u64>> {
        delegate!(self, s => s.take_rate(key, per_sec, burst))
    }
}
