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

use crate::clock::{Clock, SystemClock};
use crate::error::{AdmissionError, validate_room_id};
use crate::room::RoomCore;
use crate::settings::RoomSettings;
use crate::store::{ClaimOutcome, JoinOutcome, QueueStore, Result, Snapshot};

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

    fn recover_sync(
        &self,
        room: &str,
        settings: &RoomSettings,
        min_tail: u64,
        min_frontier: u64,
    ) -> Result<Snapshot> {
        validate_room_id(room)?;
        settings.validate()?;
        let mut settings = settings.clone();
        settings.recalibrate();
        let now = self.now_ms();
        let existing = self.inner.rooms.read().get(room).cloned();
        if let Some(r) = existing {
            let mut core = r.lock();
            core.configure(now, &settings);
            core.reseed(min_tail, min_frontier);
            return Ok(core.snapshot(room, now));
        }
        let mut rooms = self.inner.rooms.write();
        if let Some(r) = rooms.get(room).cloned() {
            // another caller created it meanwhile: update that one
            drop(rooms);
            let mut core = r.lock();
            core.configure(now, &settings);
            core.reseed(min_tail, min_frontier);
            return Ok(core.snapshot(room, now));
        }
        // a new state: full bucket at the floors, nothing admitted yet
        // (as configure.lua)
        let epoch = self.next_epoch(now);
        let core = RoomCore::new(now, &settings, epoch, min_tail, min_frontier);
        let snap = core.snapshot(room, now);
        rooms.insert(room.to_owned(), Arc::new(Mutex::new(core)));
        Ok(snap)
    }

    /// [`QueueStore::join`], synchronously.
    pub fn join_now(&self, room: &str) -> Result<JoinOutcome> {
        self.with_room(room, |c, now| c.join(now))?
            .ok_or_else(|| AdmissionError::Closed(room.to_owned()))
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
        self.recover_sync(room, settings, 0, 0)
    }

    async fn recover(
        &self,
        room: &str,
        settings: &RoomSettings,
        min_tail: u64,
        min_frontier: u64,
    ) -> Result<Snapshot> {
        self.recover_sync(room, settings, min_tail, min_frontier)
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
