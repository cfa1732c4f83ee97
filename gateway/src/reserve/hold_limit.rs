//! The per-visitor limit on hold requests
//! (`limits.holds_per_visitor_per_min`).
//!
//! An admitted visitor may hold at most the cart limit, but nothing else
//! stopped it from asking: a script with one admission token could send
//! holds (and idempotent replays) as fast as the store answers, each a
//! store round trip and a Lua script, crowding out everyone else's. This
//! limit caps what one visitor costs the store, whatever it sends.
//!
//! - **Key**: the admission token's `sub`, which only the gateway can mint
//!   (a signed token, one per admitted place), so the keys are bounded by
//!   the visitors admitted, not by what a client makes up.
//! - **Algorithm**: governor's keyed GCRA, `n` per minute with a burst of
//!   `n` (default 60: one a second on average, 60 at once), checked before
//!   the body is read or the store asked. Past it: 429 `rate_limited` with
//!   `Retry-After` (seconds until the next request would pass, rounded up),
//!   counted in `sluice_rate_limited_total{limit="holds"}`.
//! - **Replays count**: a repeated `Idempotency-Key` costs the store what a
//!   new hold costs, and waiting loses nothing (the key keeps its hold for
//!   24 h), so it is refused past the limit like any request; the client
//!   retries after `Retry-After` and gets the same answer.
//! - **Memory**: [`HoldLimiter::prune`] (every
//!   [`crate::gate::rooms::LIMITER_PRUNE_EVERY`]) forgets visitors whose budget
//!   is full again, so only visitors active within about a minute are
//!   remembered.
//! - Per gateway process, like the join limit (SECURITY.md, "Known gaps").
//!
//! Tested over HTTP in `tests/tests/reservation_http.rs`
//! (`holds_are_limited_per_visitor…`).

use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// The limiter; `None` inside when the limit is off (0).
pub struct HoldLimiter {
    limiter: Option<DefaultKeyedRateLimiter<String>>,
}

impl HoldLimiter {
    /// `per_min` hold requests per visitor per minute (0: no limit).
    pub fn new(per_min: u32) -> HoldLimiter {
        HoldLimiter {
            limiter: NonZeroU32::new(per_min).map(|n| RateLimiter::keyed(Quota::per_minute(n))),
        }
    }

    /// Takes one request of `visitor`'s budget; `Err(seconds)` to wait
    /// (at least 1) when it is spent.
    #[allow(clippy::ptr_arg)] // governor looks keys up by `&K`, K = String
    pub fn check(&self, visitor: &String) -> Result<(), u64> {
        let Some(l) = &self.limiter else {
            return Ok(());
        };
        l.check_key(visitor).map_err(|not_until| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            u64::try_from(wait.as_millis().div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1)
        })
    }

    /// Forgets visitors whose budget is full again (bounded memory).
    pub fn prune(&self) {
        if let Some(l) = &self.limiter {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    /// Visitors currently remembered.
    pub fn len(&self) -> usize {
        self.limiter.as_ref().map_or(0, |l| l.len())
    }

    /// Whether no visitor is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Prunes `limiter` every [`crate::gate::rooms::LIMITER_PRUNE_EVERY`] until the
/// gateway stops (one of its background tasks).
pub async fn run_pruner(limiter: std::sync::Arc<HoldLimiter>) {
    let mut interval = tokio::time::interval(crate::gate::rooms::LIMITER_PRUNE_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        limiter.prune();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_visitor_has_its_own_budget() {
        let l = HoldLimiter::new(3);
        let (a, b) = ("alice".to_owned(), "bob".to_owned());
        for _ in 0..3 {
            assert_eq!(l.check(&a), Ok(()));
        }
        // Spent: about 20 s until the next one (60 s / 3), rounded up.
        let wait = l.check(&a).unwrap_err();
        assert!((1..=20).contains(&wait), "{wait}");
        assert_eq!(l.check(&b), Ok(()));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn zero_is_no_limit() {
        let l = HoldLimiter::new(0);
        let a = "alice".to_owned();
        for _ in 0..10_000 {
            assert_eq!(l.check(&a), Ok(()));
        }
        assert!(l.is_empty());
        l.prune();
    }

    #[test]
    fn pruning_forgets_refilled_visitors_only() {
        // 60 000 a minute: one back every millisecond.
        let l = HoldLimiter::new(60_000);
        let a = "alice".to_owned();
        assert_eq!(l.check(&a), Ok(()));
        std::thread::sleep(std::time::Duration::from_millis(20));
        l.prune();
        assert!(l.is_empty());
        let slow = HoldLimiter::new(1);
        assert_eq!(slow.check(&a), Ok(()));
        slow.prune();
        assert_eq!(slow.len(), 1, "a visitor with a spent budget is kept");
    }
}
