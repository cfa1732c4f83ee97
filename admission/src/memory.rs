//! The in-memory store: one gateway, no Redis; the reference semantics of
//! [`QueueStore`].
//!
//! Each room is a [`RoomCore`] behind its own mutex (operations are a few
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
use crate::room::{Refusal, RoomCore};
use crate::settings::RoomSettings;
use crate::store::{AdmitOutcome, ClaimOutcome, Floors, JoinOutcome, QueueStore, Result, Snapshot};
use sluice_clock::{Clock, SystemClock};

/// The in-memory store; cheap to clone (clones share the rooms).
#[derive(Clone)]
pub struct MemoryQueueStore {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    rooms: RwLock<HashMap<String, Arc<Mutex<RoomCore>>>>,
    /// Epochs handed out, so a room created again gets a higher one even
    /// when the clock did not move (virtual time).
    last_epoch: Mutex<u64>,
    /// Steering leases: room → (holder, expiry ms).
    leases: Mutex<HashMap<String, (String, u64)>>,
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
            }),
        }
    }

    /// The store's clock.
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    fn room(&self, room: &str) -> Result<Arc<Mutex<RoomCore>>> {
        self.inner
            .rooms
            .read()
            .get(room)
            .cloned()
            .ok_or_else(|| AdmissionError::RoomNotFound(room.to_owned()))
    }

    fn with_room<T>(&self, room: &str, f: impl FnOnce(&mut RoomCore, u64) -> T) -> Result<T> {
        let r = self.room(room)?;
        let mut core = r.lock();
        let now = self.now_ms();
        Ok(f(&mut core, now))
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
            return update(&mut r.lock());
        }
        if expected.is_some() {
            return Err(AdmissionError::RoomNotFound(room.to_owned()));
        }
        let mut rooms = self.inner.rooms.write();
        if let Some(r) = rooms.get(room).cloned() {
            // another caller created it meanwhile: update that one
            drop(rooms);
            return update(&mut r.lock());
        }
        Ok(self.create(&mut rooms, room, settings, now, Floors::default()))
    }

    /// A new state: full bucket at the floors, nothing admitted yet (as
    /// configure.lua).
    fn create(
        &self,
        rooms: &mut HashMap<String, Arc<Mutex<RoomCore>>>,
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
        rooms.insert(room.to_owned(), Arc::new(Mutex::new(core)));
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
            return Ok(reseed(&mut r.lock()));
        }
        let mut rooms = self.inner.rooms.write();
        if let Some(r) = rooms.get(room).cloned() {
            drop(rooms);
            return Ok(reseed(&mut r.lock()));
        }
        Ok(self.create(&mut rooms, room, settings, now, floors))
    }

    /// [`QueueStore::join`], synchronously.
    pub fn join_now(&self, room: &str) -> Result<JoinOutcome> {
        self.with_room(room, |c, now| c.join(now))?
            .map_err(|r| match r {
                Refusal::Closed => AdmissionError::Closed(room.to_owned()),
                Refusal::Full => AdmissionError::Full(room.to_owned()),
            })
    }

    /// [`QueueStore::advance`], synchronously.
    pub fn advance_now(&self, room: &str) -> Result<Snapshot> {
        self.with_room(room, |c, now| {
            c.advance(now);
            c.snapshot(room, now)
        })
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
            Ok(r) => Ok(Some(r.lock().settings().clone())),
            Err(AdmissionError::RoomNotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn join(&self, room: &str) -> Result<JoinOutcome> {
        self.join_now(room)
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
}
