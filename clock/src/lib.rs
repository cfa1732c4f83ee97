//! Time, injected: the one [`Clock`] of the admission queue's and the
//! reservation inventory's memory stores, and the gateway's "now".
//!
//! The memory stores read the time through a [`Clock`], so tests and the
//! simulator run the real logic in virtual time with a [`ManualClock`];
//! in production they read the [`SystemClock`]. The Redis stores never ask
//! a `Clock`: there the server's own `TIME`, read inside each script, is
//! the only clock, so gateways with skewed clocks still agree. The gateway
//! stamps and checks tokens, challenges and webhooks with [`now_ms`] and
//! [`now_s`], the system clock's reading.
//!
//! A crate of its own because both domain crates need it and neither may
//! depend on the other, and the store-connection crate (`sluice-redis`)
//! has no business with time.
//!
//! # Vocabulary
//!
//! - **now**: Unix time in milliseconds (`u64`), the unit of every stored
//!   deadline (`last_ms`, a hold's deadline, a session's expiry). Seconds
//!   ([`now_s`]) only where a token's `iat`/`exp` want them.
//!
//! # Invariants
//!
//! - A clock is expected not to go backwards; the stores stay safe if it
//!   does (the bucket earns nothing until it catches up, a hold lapses no
//!   earlier). [`ManualClock::set_ms`] may move it back, to test exactly
//!   that.
//! - Clones of a [`ManualClock`] share one time: the test moves the clock
//!   the store reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock milliseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch (or since any fixed origin, for a
    /// virtual clock).
    fn now_ms(&self) -> u64;
}

/// Milliseconds since the Unix epoch, by the machine's clock (0 if the
/// clock reads before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Seconds since the Unix epoch, by the machine's clock.
pub fn now_s() -> u64 {
    now_ms() / 1000
}

/// The machine's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
}

/// A clock that moves only when told to, for tests and virtual-time runs;
/// cheap to clone (clones share the same time).
#[derive(Clone, Debug)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock stopped at `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.advance_ms(u64::try_from(by.as_millis()).unwrap_or(u64::MAX));
    }

    /// Sets the clock to `ms` (it may go backwards: tests of clock skew).
    pub fn set_ms(&self, ms: u64) {
        self.now_ms.store(ms, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    /// Starts at 2026-01-01T00:00:00Z, a realistic Unix time.
    fn default() -> Self {
        Self::new(1_767_225_600_000)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Clock, ManualClock, SystemClock};

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = ManualClock::new(1_000);
        let seen_by_store: Arc<dyn Clock> = Arc::new(clock.clone());
        assert_eq!(seen_by_store.now_ms(), 1_000);
        clock.advance(Duration::from_millis(250));
        clock.advance_ms(50);
        assert_eq!(seen_by_store.now_ms(), 1_300);
        clock.set_ms(10);
        assert_eq!(seen_by_store.now_ms(), 10);
    }

    #[test]
    fn system_clock_reads_unix_milliseconds() {
        let now = SystemClock.now_ms();
        assert!(now > 1_767_225_600_000, "{now}");
        let s = super::now_s();
        assert!(s >= now / 1000 && s <= now / 1000 + 1, "{s}");
    }
}
