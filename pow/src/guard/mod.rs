//! The replay guard: a solved challenge buys one place in line, once.
//!
//! Verification is stateless; what makes a solution single-use is one
//! atomic insert-if-absent of the challenge id, kept until the challenge
//! can no longer be accepted anywhere ([`crate::Verified::guard_ttl`]).
//! [`ReplayStore`] is that one operation. [`MemoryReplayGuard`] is the
//! reference semantics (one gateway); [`RedisReplayGuard`] shares the
//! memory across every gateway on one Redis. Both pass
//! `crate::conformance` (feature `test-util`). The gateway holds the
//! [`ReplayGuard`] enum, so no generic leaks into it.

mod memory;
mod redis;

use std::future::Future;
use std::time::Duration;

pub use self::memory::MemoryReplayGuard;
pub use self::redis::RedisReplayGuard;
use crate::error::GuardError;

/// A store that remembers challenge ids.
pub trait ReplayStore: Send + Sync {
    /// Atomically records `id` for `ttl` if it is not already recorded.
    /// `Ok(true)`: first use, the caller may proceed. `Ok(false)`: seen
    /// before and not yet expired, a replay. `Err`: the store failed and
    /// nothing is known.
    fn consume_once(
        &self,
        id: &[u8; 16],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, GuardError>> + Send;

    /// Records what redeeming `id` bought (an opaque, non-empty note: the
    /// gateway writes the place in line), kept as long as the id itself, so
    /// a client that lost the answer and resubmits the same solution can be
    /// given the same thing back instead of a refusal. Does nothing when
    /// `id` is not (or no longer) recorded.
    fn note(
        &self,
        id: &[u8; 16],
        note: &str,
    ) -> impl Future<Output = Result<(), GuardError>> + Send;

    /// The note recorded for `id`, if it is recorded and has one.
    fn noted(
        &self,
        id: &[u8; 16],
    ) -> impl Future<Output = Result<Option<String>, GuardError>> + Send;

    /// Forgets `id` (and its note), so the same solution may be redeemed
    /// again: for a redemption whose purchase then failed (the join's store
    /// was down, the room closed meanwhile), so the client's work is not
    /// lost with it.
    fn release(&self, id: &[u8; 16]) -> impl Future<Output = Result<(), GuardError>> + Send;
}

/// The replay guard the gateway holds: one of the two backends.
#[derive(Clone, Debug)]
pub enum ReplayGuard {
    /// In-process memory: a single gateway.
    Memory(MemoryReplayGuard),
    /// Redis: every gateway sharing it.
    Redis(RedisReplayGuard),
}

impl ReplayGuard {
    /// An in-memory guard with default capacity.
    pub fn memory() -> Self {
        ReplayGuard::Memory(MemoryReplayGuard::default())
    }
}

impl ReplayStore for ReplayGuard {
    async fn consume_once(&self, id: &[u8; 16], ttl: Duration) -> Result<bool, GuardError> {
        match self {
            ReplayGuard::Memory(g) => g.consume_once(id, ttl).await,
            ReplayGuard::Redis(g) => g.consume_once(id, ttl).await,
        }
    }

    async fn note(&self, id: &[u8; 16], note: &str) -> Result<(), GuardError> {
        match self {
            ReplayGuard::Memory(g) => g.note(id, note).await,
            ReplayGuard::Redis(g) => g.note(id, note).await,
        }
    }

    async fn noted(&self, id: &[u8; 16]) -> Result<Option<String>, GuardError> {
        match self {
            ReplayGuard::Memory(g) => g.noted(id).await,
            ReplayGuard::Redis(g) => g.noted(id).await,
        }
    }

    async fn release(&self, id: &[u8; 16]) -> Result<(), GuardError> {
        match self {
            ReplayGuard::Memory(g) => g.release(id).await,
            ReplayGuard::Redis(g) => g.release(id).await,
        }
    }
}

impl From<MemoryReplayGuard> for ReplayGuard {
    fn from(g: MemoryReplayGuard) -> Self {
        ReplayGuard::Memory(g)
    }
}

impl From<RedisReplayGuard> for ReplayGuard {
    fn from(g: RedisReplayGuard) -> Self {
        ReplayGuard::Redis(g)
    }
}

impl<T: ReplayStore> ReplayStore for std::sync::Arc<T> {
    fn consume_once(
        &self,
        id: &[u8; 16],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, GuardError>> + Send {
        (**self).consume_once(id, ttl)
    }

    fn note(
        &self,
        id: &[u8; 16],
        note: &str,
    ) -> impl Future<Output = Result<(), GuardError>> + Send {
        (**self).note(id, note)
    }

    fn noted(
        &self,
        id: &[u8; 16],
    ) -> impl Future<Output = Result<Option<String>, GuardError>> + Send {
        (**self).noted(id)
    }

    fn release(&self, id: &[u8; 16]) -> impl Future<Output = Result<(), GuardError>> + Send {
        (**self).release(id)
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}
