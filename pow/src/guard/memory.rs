//! In-memory replay guard: the reference semantics.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::ReplayStore;
use crate::error::GuardError;

const SHARDS: usize = 16;
/// Default cap on live entries (about 40 MB at worst): far above what a
/// rate-limited challenge endpoint can fill within one TTL.
pub(crate) const DEFAULT_CAPACITY: usize = 1 << 20;
/// A shard is swept of expired entries when it grows past this many
/// entries since its last sweep.
const MIN_SWEEP_AT: usize = 1024;

/// Challenge ids held in memory until they expire.
///
/// Sixteen shards, each a mutex over a map from id to expiry, chosen by the
/// id's first byte (ids are random, so shards fill evenly and racing
/// gateways threads rarely meet on one lock). A shard sweeps its expired
/// entries when it has doubled since the last sweep, so memory stays
/// proportional to the live ids; [`MemoryReplayGuard::sweep`] may also be
/// called periodically. At `capacity` live entries it fails closed
/// ([`GuardError::Full`]) rather than forget an id early. Clones share the
/// same memory.
#[derive(Clone, Debug)]
pub struct MemoryReplayGuard {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: [Mutex<Shard>; SHARDS],
    capacity_per_shard: usize,
    live: AtomicUsize,
}

/// One consumed id: when it may be forgotten, and what it bought.
#[derive(Debug)]
struct Entry {
    expiry: Instant,
    note: Option<Box<str>>,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<[u8; 16], Entry>,
    sweep_at: usize,
}

impl Shard {
    fn sweep(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, e| e.expiry > now);
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP_AT);
        before - self.entries.len()
    }
}

impl Default for MemoryReplayGuard {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }
}

impl MemoryReplayGuard {
    /// A guard holding at most about `capacity` live ids.
    pub fn with_capacity(capacity: usize) -> Self {
        let shards = std::array::from_fn(|_| {
            Mutex::new(Shard {
                entries: HashMap::new(),
                sweep_at: MIN_SWEEP_AT,
            })
        });
        MemoryReplayGuard {
            inner: Arc::new(Inner {
                shards,
                capacity_per_shard: capacity.div_ceil(SHARDS).max(1),
                live: AtomicUsize::new(0),
            }),
        }
    }

    /// The synchronous operation behind [`ReplayStore::consume_once`].
    pub fn consume_once_sync(&self, id: &[u8; 16], ttl: Duration) -> Result<bool, GuardError> {
        let now = Instant::now();
        let shard = &self.inner.shards[usize::from(id[0]) % SHARDS];
        let mut s = shard.lock();
        if s.entries.get(id).is_some_and(|e| e.expiry > now) {
            return Ok(false);
        }
        if s.entries.len() >= s.sweep_at || s.entries.len() >= self.inner.capacity_per_shard {
            let removed = s.sweep(now);
            self.inner.live.fetch_sub(removed, Ordering::Relaxed);
        }
        if s.entries.len() >= self.inner.capacity_per_shard && !s.entries.contains_key(id) {
            return Err(GuardError::Full(self.inner.capacity_per_shard * SHARDS));
        }
        let expiry = now
            .checked_add(ttl)
            .unwrap_or(now + Duration::from_secs(86_400 * 365));
        if s.entries
            .insert(*id, Entry { expiry, note: None })
            .is_none()
        {
            self.inner.live.fetch_add(1, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// The synchronous operation behind [`ReplayStore::note`].
    pub fn note_sync(&self, id: &[u8; 16], note: &str) {
        if note.is_empty() {
            return;
        }
        let now = Instant::now();
        let shard = &self.inner.shards[usize::from(id[0]) % SHARDS];
        if let Some(e) = shard.lock().entries.get_mut(id).filter(|e| e.expiry > now) {
            e.note = Some(note.into());
        }
    }

    /// The synchronous operation behind [`ReplayStore::release`].
    pub fn release_sync(&self, id: &[u8; 16]) {
        let shard = &self.inner.shards[usize::from(id[0]) % SHARDS];
        if shard.lock().entries.remove(id).is_some() {
            self.inner.live.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The synchronous operation behind [`ReplayStore::noted`].
    pub fn noted_sync(&self, id: &[u8; 16]) -> Option<String> {
        let now = Instant::now();
        let shard = &self.inner.shards[usize::from(id[0]) % SHARDS];
        let s = shard.lock();
        let e = s.entries.get(id).filter(|e| e.expiry > now)?;
        e.note.as_deref().map(str::to_owned)
    }

    /// Drops every expired entry now; returns how many went.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let mut removed = 0;
        for shard in &self.inner.shards {
            removed += shard.lock().sweep(now);
        }
        self.inner.live.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Entries held (live, or expired and not yet swept).
    pub fn len(&self) -> usize {
        self.inner.live.load(Ordering::Relaxed)
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ReplayStore for MemoryReplayGuard {
    async fn consume_once(&self, id: &[u8; 16], ttl: Duration) -> Result<bool, GuardError> {
        self.consume_once_sync(id, ttl)
    }

    async fn note(&self, id: &[u8; 16], note: &str) -> Result<(), GuardError> {
        self.note_sync(id, note);
        Ok(())
    }

    async fn noted(&self, id: &[u8; 16]) -> Result<Option<String>, GuardError> {
        Ok(self.noted_sync(id))
    }

    async fn release(&self, id: &[u8; 16]) -> Result<(), GuardError> {
        self.release_sync(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn id(n: u32) -> [u8; 16] {
        let mut id = [0u8; 16];
        id[..4].copy_from_slice(&n.to_le_bytes());
        id
    }

    #[test]
    fn once_then_replay_then_expiry() {
        let g = MemoryReplayGuard::default();
        assert!(
            g.consume_once_sync(&id(1), Duration::from_millis(30))
                .unwrap()
        );
        assert!(
            !g.consume_once_sync(&id(1), Duration::from_millis(30))
                .unwrap()
        );
        std::thread::sleep(Duration::from_millis(40));
        assert!(
            g.consume_once_sync(&id(1), Duration::from_millis(30))
                .unwrap()
        );
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn memory_is_bounded_by_sweeping() {
        let g = MemoryReplayGuard::default();
        for n in 0..50_000 {
            g.consume_once_sync(&id(n), Duration::from_millis(1))
                .unwrap();
            if n % 10_000 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        // Expired entries were swept as shards grew: far fewer than 50,000 held.
        std::thread::sleep(Duration::from_millis(2));
        g.sweep();
        assert!(g.is_empty(), "{}", g.len());
    }

    #[test]
    fn full_fails_closed() {
        let g = MemoryReplayGuard::with_capacity(SHARDS);
        // One per shard at most: ids 0 and 16 share shard 0.
        assert!(
            g.consume_once_sync(&id(0), Duration::from_secs(60))
                .unwrap()
        );
        assert!(matches!(
            g.consume_once_sync(&id(16), Duration::from_secs(60)),
            Err(GuardError::Full(_))
        ));
        // A replay of a held id is still a replay, not an error.
        assert!(
            !g.consume_once_sync(&id(0), Duration::from_secs(60))
                .unwrap()
        );
    }
}
