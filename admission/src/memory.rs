//! The in-memory store: one gateway, no Redis; the reference semantics of
//! [`QueueStore`].
//!
//! Each room is a [`RoomCore`] (with the solutions spent on its joins,
//! `Solutions`) behind its own mutex (operations are a few
//! hundred nanoseconds, never held across an await), found through a
//! read-mostly map. Time comes from the injected [`Clock`], so with a
//! [`crate::ManualClock`] the store runs in virtual time for tests and the
//! simulator. The futures it returns never wait: they are ready on first
//! poll.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::error::{AdmissionError, validate_room_id};
use crate::prequeue::PrequeueDraw;
use crate::room::{Refusal, RoomCore};
use crate::settings::RoomSettings;
use crate::store::{
    AdmitOutcome, ClaimOutcome, Floors, JoinOnce, JoinOutcome, QueueStore, Result, Snapshot,
    Solution, Spend,
};
use sluice_clock::{Clock, SystemClock};

/// The in-memory store; cheap to clone (clones share the rooms).
#[derive(Clone)]
pub struct MemoryQueueStore {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    rooms: RwLock<HashMap<String, Arc<Mutex<Entry>>>>,
    /// Epochs handed out, so a room created again gets a higher one even
    /// when the clock did not move (virtual time).
    last_epoch: Mutex<u64>,
    /// Steering leases: room → (holder, expiry ms).
    leases: Mutex<HashMap<String, (String, u64)>>,
    /// Shared rate limits ([`crate::rate`]): key → theoretical arrival
    /// time (ms).
    rates: Mutex<HashMap<String, f64>>,
}

/// One room: its state machine and the solutions spent on its joins, under
/// one lock so a join and its replay guard are one step.
struct Entry {
    core: RoomCore,
    solutions: Solutions,
}

impl Entry {
    fn new(core: RoomCore) -> Arc<Mutex<Entry>> {
        Arc::new(Mutex::new(Entry {
            core,
            solutions: Solutions::default(),
        }))
    }
}

/// A room's spent proof-of-work solutions, as `lua/join.lua` keeps them in
/// Redis: id → (forget at, store clock ms; the place noted, `None` for the
/// bare mark). Swept of expired ids when it has doubled since the last
/// sweep; at [`MAX_SOLUTIONS`] live ids it refuses (a store error) rather
/// than forget one early.
#[derive(Default)]
struct Solutions {
    ids: HashMap<[u8; 16], (u64, Option<Box<str>>)>,
    sweep_at: usize,
}

/// The most solutions a room remembers at once (about 80 MB): far above
/// what a rate-limited room takes within a challenge's lifetime.
const MAX_SOLUTIONS: usize = 1 << 20;

impl Solutions {
    /// The live record of `id`: `Some(note)` when spent.
    fn seen(&self, id: &[u8; 16], now: u64) -> Option<Option<String>> {
        self.ids
            .get(id)
            .filter(|(until, _)| *until > now)
            .map(|(_, note)| note.as_deref().map(str::to_owned))
    }

    /// Room for one more id, or a store error when full of live ones.
    fn make_room(&mut self, id: &[u8; 16], now: u64) -> Result<()> {
        if self.ids.len() >= self.sweep_at.max(1024) || self.ids.len() >= MAX_SOLUTIONS {
            self.ids.retain(|_, (until, _)| *until > now);
            self.sweep_at = self.ids.len() * 2;
        }
        if self.ids.len() >= MAX_SOLUTIONS && !self.ids.contains_key(id) {
            return Err(AdmissionError::Store(format!(
                "{MAX_SOLUTIONS} proof-of-work solutions remembered: refusing more"
            )));
        }
        Ok(())
    }

    fn record(&mut self, id: &[u8; 16], now: u64, ttl: Duration, note: Option<String>) {
        let until = now.saturating_add(ttl.as_millis().try_into().unwrap_or(u64::MAX));
        self.ids
            .insert(*id, (until, note.map(String::into_boxed_str)));
    }
}

impl Default for MemoryQueueStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl std::fmt::Debug for MemoryQueueStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryQueueStore")
            .field("rooms", &self.inner.rooms.read().len())
            .finish()
    }
}

pub(crate) fn validate_session_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 128 {
        return Err(AdmissionError::Protocol(
            "session id must be 1 to 128 bytes".into(),
        ));
    }
    Ok(())
}

impl MemoryQueueStore {
    /// A store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock,
                rooms: RwLock::new(HashMap::new()),
                last_epoch: Mutex::new(0),
                leases: Mutex::new(HashMap::new()),
                rates: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The store's clock.
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    fn room(&self, room: &str) -> Result<Arc<Mutex<Entry>>> {
        self.inner
            .rooms
            .read()
            .get(room)
            .cloned()
            .ok_or_else(|| AdmissionError::RoomNotFound(room.to_owned()))
    }

    fn with_room<T>(&self, room: &str, f: impl FnOnce(&mut RoomCore, u64) -> T) -> Result<T> {
        let r = self.room(room)?;
        let mut entry = r.lock();
        let now = self.now_ms();
        Ok(f(&mut entry.core, now))
    }

    fn next_epoch(&self, now_ms: u64) -> u64 {
        let mut last = self.inner.last_epoch.lock();
        *last = (*last + 1).max(now_ms);
        *last
    }

    /// Drops a room's state, as a Redis restarted empty would (for tests of
    /// the lost-store path).
    pub fn forget(&self, room: &str) {
        self.inner.rooms.write().remove(room);
    }

    /// Runs `f` on the room's state machine at the store's time: the
    /// simulator's and the tests' way in.
    pub fn inspect<T>(&self, room: &str, f: impl FnOnce(&mut RoomCore, u64) -> T) -> Result<T> {
        self.with_room(room, f)
    }

    /// Creates the room, or (`expected`: the compare-and-set of
    /// [`QueueStore::update_settings`]; `None`: unconditional) changes its
    /// settings; the store assigns the version.
    fn configure_sync(
        &self,
        room: &str,
        settings: &RoomSettings,
        expected: Option<u64>,
    ) -> Result<Snapshot> {
        validate_room_id(room)?;
        settings.to_stored()?;
        let mut settings = settings.clone();
        settings.recalibrate();
        let now = self.now_ms();
        let mut update = |core: &mut RoomCore| -> Result<Snapshot> {
            let current = core.settings().version;
            if expected.is_some_and(|v| v != current) {
                return Err(AdmissionError::SettingsConflict { current });
            }
            settings.version = current + 1;
            core.configure(now, &settings);
            Ok(core.snapshot(room, now))
        };
        if let Some(r) = self.inner.rooms.read().get(room).cloned() {
            return update(&mut r.lock().core);
        }
        if expected.is_some() {
            return Err(AdmissionError::RoomNotFound(room.to_owned()));
        }
        let mut rooms = self.inner.rooms.write();
        if let Some(r) = rooms.get(room).cloned() {
            // another caller created it meanwhile: update that one
            drop(rooms);
            return update(&mut r.lock().core);
        }
        Ok(self.create(&mut rooms, room, settings, now, Floors::default()))
    }

    /// A new state: full bucket at the floors, nothing admitted yet (as
    /// configure.lua).
    fn create(
        &self,
        rooms: &mut HashMap<String, Arc<Mutex<Entry>>>,
        room: &str,
        mut settings: RoomSettings,
        now: u64,
        floors: Floors,
    ) -> Snapshot {
        settings.version = 1;
        let epoch = self.next_epoch(now);
        let core = RoomCore::carrying(
            now,
            &settings,
            epoch,
            floors.tail,
            floors.frontier,
            floors.epoch,
        );
        let snap = core.snapshot(room, now);
        rooms.insert(room.to_owned(), Entry::new(core));
        snap
    }

    fn recover_sync(
        &self,
        room: &str,
        settings: &RoomSettings,
        floors: Floors,
    ) -> Result<Snapshot> {
        validate_room_id(room)?;
        settings.to_stored()?;
        let mut settings = settings.clone();
        settings.recalibrate();
        let now = self.now_ms();
        let reseed = |core: &mut RoomCore| {
            core.extend_carry(floors.tail, floors.frontier, floors.epoch);
            core.snapshot(room, now)
        };
        if let Some(r) = self.inner.rooms.read().get(room).cloned() {
            return Ok(reseed(&mut r.lock().core));
        }
        let mut rooms = self.inner.rooms.write();
        if let Some(r) = rooms.get(room).cloned() {
            drop(rooms);
            return Ok(reseed(&mut r.lock().core));
        }
        Ok(self.create(&mut rooms, room, settings, now, floors))
    }

    /// [`QueueStore::join`], synchronously.
    pub fn join_now(&self, room: &str) -> Result<JoinOutcome> {
        self.with_room(room, |c, now| c.join(now))?
            .map_err(|r| refusal(room, r))
    }

    /// [`QueueStore::join_lane`], synchronously.
    pub fn join_lane_now(&self, room: &str, lane: Option<u8>) -> Result<JoinOutcome> {
        self.with_room(room, |c, now| c.join_lane(now, lane.map(usize::from)))?
            .map_err(|r| refusal(room, r))
    }

    /// [`QueueStore::join_once`], synchronously.
    pub fn join_once_now(&self, room: &str, solution: Solution<'_>) -> Result<JoinOnce> {
        let r = self.room(room)?;
        let mut entry = r.lock();
        let now = self.now_ms();
        join_once_in(&mut entry, room, now, solution)
    }

    /// [`QueueStore::join_once_many`], synchronously: under one hold of
    /// the room's lock, at one instant.
    pub fn join_once_many_now(
        &self,
        room: &str,
        solutions: &[Solution<'_>],
    ) -> Result<Vec<Result<JoinOnce>>> {
        let r = self.room(room)?;
        let mut entry = r.lock();
        let now = self.now_ms();
        Ok(solutions
            .iter()
            .map(|s| join_once_in(&mut entry, room, now, *s))
            .collect())
    }

    /// [`QueueStore::advance`], synchronously.
    pub fn advance_now(&self, room: &str) -> Result<Snapshot> {
        self.with_room(room, |c, now| {
            c.advance(now);
            c.snapshot(room, now)
        })
    }
}

/// One [`QueueStore::join_once`] on a room's locked entry at `now`.
fn join_once_in(
    entry: &mut Entry,
    room: &str,
    now: u64,
    solution: Solution<'_>,
) -> Result<JoinOnce> {
    if !solution.spent
        && let Some(note) = entry.solutions.seen(solution.id, now)
    {
        return Ok(JoinOnce::Replayed { note });
    }
    entry.solutions.make_room(solution.id, now)?;
    let outcome = entry
        .core
        .join_lane(now, solution.lane.map(usize::from))
        .map_err(|r| refusal(room, r))?;
    let note =
        (!outcome.admitted).then(|| format!("{}:{}:{}", outcome.seq, outcome.epoch, solution.sub));
    entry.solutions.record(solution.id, now, solution.ttl, note);
    Ok(JoinOnce::Joined(outcome))
}

fn refusal(room: &str, r: Refusal) -> AdmissionError {
    match r {
        Refusal::Closed => AdmissionError::Closed(room.to_owned()),
        Refusal::Full => AdmissionError::Full(room.to_owned()),
        Refusal::NoLane => AdmissionError::LaneNotFound(room.to_owned()),
    }
}

impl QueueStore for MemoryQueueStore {
    async fn configure(&self, room: &str, settings: &RoomSettings) -> Result<Snapshot> {
        self.configure_sync(room, settings, None)
    }

    async fn recover(
        &self,
        room: &str,
        settings: &RoomSettings,
        floors: Floors,
    ) -> Result<Snapshot> {
        self.recover_sync(room, settings, floors)
    }

    async fn update_settings(&self, room: &str, settings: &RoomSettings) -> Result<Snapshot> {
        self.configure_sync(room, settings, Some(settings.version))
    }

    async fn passthrough(&self, room: &str) -> Result<Option<JoinOutcome>> {
        self.with_room(room, |c, now| c.passthrough(now))
    }

    async fn reseat(
        &self,
        room: &str,
        old_epoch: u64,
        old_seq: u64,
        ttl: Duration,
    ) -> Result<JoinOutcome> {
        self.with_room(room, |c, now| {
            c.reseat(now, old_epoch, old_seq, ttl.as_millis() as u64)
        })?
        .ok_or_else(|| AdmissionError::Closed(room.to_owned()))
    }

    async fn admit(
        &self,
        room: &str,
        place: u64,
        session_id: &str,
        ttl: Duration,
    ) -> Result<AdmitOutcome> {
        validate_session_id(session_id)?;
        self.with_room(room, |c, now| {
            c.admit(now, place, session_id, ttl.as_millis() as u64)
        })
    }

    async fn ended_since(
        &self,
        room: &str,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>> {
        self.with_room(room, |c, _| c.ended_since(since_ms, limit))
    }

    async fn settings(&self, room: &str) -> Result<Option<RoomSettings>> {
        match self.room(room) {
            Ok(r) => Ok(Some(r.lock().core.settings().clone())),
            Err(AdmissionError::RoomNotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn join(&self, room: &str) -> Result<JoinOutcome> {
        self.join_now(room)
    }

    async fn join_lane(&self, room: &str, lane: Option<u8>) -> Result<JoinOutcome> {
        self.join_lane_now(room, lane)
    }

    async fn lane_place(&self, room: &str, lane: u8, seq: u64) -> Result<Option<u64>> {
        self.with_room(room, |c, _| c.place_of(Some(usize::from(lane)), seq))
    }

    async fn draw_of(&self, room: &str, seq: u64) -> Result<Option<PrequeueDraw>> {
        self.with_room(room, |c, _| c.draw_of(seq))
    }

    async fn keep_draws(&self, room: &str, draws: &[PrequeueDraw]) -> Result<()> {
        self.with_room(room, |c, now| c.keep_draws(now, draws))
    }

    async fn join_once(&self, room: &str, solution: Solution<'_>) -> Result<JoinOnce> {
        self.join_once_now(room, solution)
    }

    async fn join_once_many(
        &self,
        room: &str,
        solutions: &[Solution<'_>],
    ) -> Result<Vec<Result<JoinOnce>>> {
        self.join_once_many_now(room, solutions)
    }

    async fn spend_solution(&self, room: &str, id: &[u8; 16], ttl: Duration) -> Result<Spend> {
        let r = self.room(room)?;
        let mut entry = r.lock();
        let now = self.now_ms();
        if let Some(note) = entry.solutions.seen(id, now) {
            return Ok(Spend::Replayed { note });
        }
        entry.solutions.make_room(id, now)?;
        entry.solutions.record(id, now, ttl, None);
        Ok(Spend::First)
    }

    async fn release_solution(&self, room: &str, id: &[u8; 16]) -> Result<()> {
        if let Ok(r) = self.room(room) {
            r.lock().solutions.ids.remove(id);
        }
        Ok(())
    }

    async fn advance(&self, room: &str) -> Result<Snapshot> {
        self.advance_now(room)
    }

    async fn snapshot(&self, room: &str) -> Result<Snapshot> {
        self.with_room(room, |c, now| c.snapshot(room, now))
    }

    async fn claim(&self, room: &str, seq: u64) -> Result<ClaimOutcome> {
        self.with_room(room, |c, _| c.claim(seq))
    }

    async fn session_start(&self, room: &str, session_id: &str, ttl: Duration) -> Result<u64> {
        validate_session_id(session_id)?;
        self.with_room(room, |c, now| {
            c.session_start(now, session_id, ttl.as_millis() as u64)
        })
    }

    async fn session_touch(&self, room: &str, session_id: &str, ttl: Duration) -> Result<bool> {
        validate_session_id(session_id)?;
        self.with_room(room, |c, now| {
            c.session_touch(now, session_id, ttl.as_millis() as u64)
        })
    }

    async fn session_end(&self, room: &str, session_id: &str) -> Result<bool> {
        self.with_room(room, |c, now| c.session_end(now, session_id))
    }

    async fn reseed(&self, room: &str, min_tail: u64, min_frontier: u64) -> Result<Snapshot> {
        self.with_room(room, |c, now| {
            c.reseed(min_tail, min_frontier);
            c.snapshot(room, now)
        })
    }

    async fn lease(&self, room: &str, holder: &str, ttl: Duration) -> Result<bool> {
        validate_room_id(room)?;
        validate_session_id(holder)?;
        let now = self.now_ms();
        let mut leases = self.inner.leases.lock();
        let free = match leases.get(room) {
            Some((h, until)) => h == holder || *until <= now,
            None => true,
        };
        if free {
            leases.insert(
                room.to_owned(),
                (holder.to_owned(), now + ttl.as_millis() as u64),
            );
        }
        Ok(free)
    }

    async fn take_rate(&self, key: &str, per_sec: f64, burst: u32) -> Result<Option<u64>> {
        crate::rate::check(key, per_sec, burst)?;
        let now = self.now_ms() as f64;
        let mut rates = self.inner.rates.lock();
        // forget buckets whose time has passed (the same as none)
        if rates.len() >= 4096 {
            rates.retain(|_, tat| *tat > now);
        }
        match crate::rate::take(rates.get(key).copied(), now, per_sec, burst) {
            Ok(tat) => {
                rates.insert(key.to_owned(), tat);
                Ok(None)
            }
            Err(wait) => Ok(Some(wait)),
        }
    }
}
