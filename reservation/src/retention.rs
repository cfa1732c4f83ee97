//! How long a hold is remembered once it has ended.
//!
//! A hold's record (the Redis hash `sluice:{ev}:hold:{suffix}`, a
//! `HoldRec` in memory) is what answers `GET /_sluice/holds/{id}`, a second
//! release and a payment webhook. Its units are accounted for elsewhere
//! (the counters and the deadline index), so forgetting a record never
//! changes stock, the cart count or any answer about availability: only
//! questions about that one hold then answer "no such hold".
//!
//! The two ends are kept for very different times:
//!
//! - **Released or expired**: nothing was sold, so the record matters only
//!   for the moments after (the visitor's page reading it, a retried
//!   `DELETE`, a payment webhook arriving just after the deadline, which is
//!   told 409 `hold_expired` and must refund). Minutes are enough; at a
//!   flash sale's rate of abandoned carts, days of them would be most of
//!   the store's memory. Default [`DEFAULT_RELEASED`] (10 minutes), counted
//!   from the release, or from the deadline for a hold that lapsed. A
//!   payment webhook for such a hold arriving later than that answers 404
//!   `hold_not_found`: still never a sale, and the provider must refund
//!   either way.
//! - **Confirmed**: a sale. Its record must outlive any question a payment
//!   dispute may raise about it: card networks let a cardholder dispute a
//!   payment for up to 120 days (Visa and Mastercard, from the transaction
//!   or the expected delivery), and a merchant answering a chargeback, or
//!   a provider re-delivering its webhooks, can come later still. Default
//!   [`DEFAULT_CONFIRMED`] (180 days: 120 days plus slack), counted from the
//!   confirmation.
//!
//! An `Idempotency-Key` replays its hold while both the key (24 h) and the
//! hold's record are remembered; once the record is forgotten the key takes
//! a new hold, with a new id (an id is never given to a second hold).
//! Checked on both stores by the conformance suite
//! (`released_and_expired_holds_are_kept_for_their_retention`,
//! `confirmed_holds_are_kept_for_their_retention`).

use std::time::Duration;

/// Default retention of a released or expired hold.
pub const DEFAULT_RELEASED: Duration = Duration::from_secs(10 * 60);
/// Default retention of a confirmed hold: card chargeback windows run up
/// to 120 days, plus slack.
pub const DEFAULT_CONFIRMED: Duration = Duration::from_secs(180 * 24 * 3600);
/// Longest retention accepted (ten years): beyond it is a typo, and the
/// store's expiry times stay far from overflowing.
pub const MAX_RETENTION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// How long ended holds are kept, per end. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// A released hold (by its visitor or a failed payment), from its
    /// release; an expired one, from its deadline. Default 10 minutes.
    pub released: Duration,
    /// A confirmed (paid) hold, from its confirmation. Default 180 days.
    /// At least [`Retention::released`].
    pub confirmed: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            released: DEFAULT_RELEASED,
            confirmed: DEFAULT_CONFIRMED,
        }
    }
}

/// A [`Retention`] that makes no sense.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetentionError {
    /// The released retention is under a second: a visitor could not even
    /// read back the hold it just gave up.
    #[error("released retention must be at least 1s")]
    ReleasedTooShort,
    /// The confirmed retention is shorter than the released one: a sale
    /// would be forgotten before an abandoned cart.
    #[error("confirmed retention must be at least the released retention")]
    ConfirmedShorter,
    /// A retention above [`MAX_RETENTION`] (the field named).
    #[error("{0} retention must be at most 3650 days")]
    TooLong(&'static str),
}

impl Retention {
    /// Checks the two durations; call before building a store.
    pub fn validate(&self) -> Result<(), RetentionError> {
        if self.released < Duration::from_secs(1) {
            return Err(RetentionError::ReleasedTooShort);
        }
        if self.released > MAX_RETENTION {
            return Err(RetentionError::TooLong("released"));
        }
        if self.confirmed > MAX_RETENTION {
            return Err(RetentionError::TooLong("confirmed"));
        }
        if self.confirmed < self.released {
            return Err(RetentionError::ConfirmedShorter);
        }
        Ok(())
    }

    /// The released retention in whole milliseconds.
    pub(crate) fn released_ms(&self) -> u64 {
        ms(self.released)
    }

    /// The confirmed retention in whole milliseconds.
    pub(crate) fn confirmed_ms(&self) -> u64 {
        ms(self.confirmed)
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented() {
        let r = Retention::default();
        assert_eq!(r.validate(), Ok(()));
        assert_eq!(r.released, Duration::from_secs(600));
        assert_eq!(r.confirmed, Duration::from_secs(180 * 86_400));
        assert!(r.confirmed > Duration::from_secs(120 * 86_400));
    }

    #[test]
    fn nonsense_is_refused() {
        let s = Duration::from_secs;
        for (released, confirmed, err) in [
            (s(0), s(60), RetentionError::ReleasedTooShort),
            (
                Duration::from_millis(999),
                s(60),
                RetentionError::ReleasedTooShort,
            ),
            (s(600), s(0), RetentionError::ConfirmedShorter),
            (s(600), s(599), RetentionError::ConfirmedShorter),
            (
                MAX_RETENTION + s(1),
                MAX_RETENTION + s(1),
                RetentionError::TooLong("released"),
            ),
            (
                s(1),
                MAX_RETENTION + s(1),
                RetentionError::TooLong("confirmed"),
            ),
        ] {
            let r = Retention {
                released,
                confirmed,
            };
            assert_eq!(r.validate(), Err(err), "{r:?}");
        }
        let equal = Retention {
            released: s(1),
            confirmed: s(1),
        };
        assert_eq!(equal.validate(), Ok(()));
    }
}
