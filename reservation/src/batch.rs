//! Holds sent together: the holds of one event that arrive while its
//! batcher's steps are on their way to Redis (at most [`MAX_IN_FLIGHT`])
//! go to it as one call of `hold.lua`'s mode `many` once one is back
//! (group commit, [`sluice_redis::batch`]; README, "Holds sent together").
//!
//! Nothing waits for a batch to fill: a hold that finds fewer steps on
//! their way is sent at once, alone, by the one-hold call it always was;
//! only holds that would have queued behind others on the store anyway are
//! gathered. The script makes each hold of a batch exactly as its own call
//! would have made it, one after the other, so what a batch changes is
//! the cost (Redis reads the event's settings and reaps once per batch)
//! and never an answer. A hold whose request is dropped while it waits is
//! still sent with its batch: its hold stands and lapses at its deadline,
//! as when the request of a hold sent alone is dropped after Redis took
//! it.

pub use sluice_redis::batch::BatchStats;
use sluice_redis::batch::StepError;

use crate::error::ReservationError;

/// The most steps of one batcher on their way at once: a hold that finds
/// fewer goes at once, so under load a hold waits for at most one step
/// before its own. `SLUICE_HOLD_STEPS=n` (1 to 8) in the environment sets
/// another bound, for measuring the trade (fewer steps on their way:
/// larger batches, a longer wait behind them).
pub const MAX_IN_FLIGHT: usize = 2;

/// [`MAX_IN_FLIGHT`], or the environment's `SLUICE_HOLD_STEPS`.
pub(crate) fn max_in_flight() -> usize {
    static BOUND: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BOUND.get_or_init(|| {
        std::env::var("SLUICE_HOLD_STEPS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(MAX_IN_FLIGHT, |n| n.clamp(1, 8))
    })
}

impl StepError for ReservationError {
    fn unreachable(&self) -> bool {
        self.is_unavailable()
    }

    fn duplicate(&self) -> Self {
        match self {
            Self::Unavailable(e) => Self::Unavailable(e.clone()),
            Self::Timeout(d) => Self::Timeout(*d),
            Self::Script(e) => Self::Script(e.clone()),
            Self::NotReplicated { wanted, acked } => Self::NotReplicated {
                wanted: *wanted,
                acked: *acked,
            },
            Self::Protocol(s) => Self::Protocol(s.clone()),
            Self::Contended { rounds } => Self::Contended { rounds: *rounds },
            Self::Config(s) => Self::Config(s.clone()),
        }
    }

    fn dropped() -> Self {
        Self::Protocol("the hold's store step was dropped (the gateway is stopping)".into())
    }

    fn miscounted(sent: usize, answered: usize) -> Self {
        Self::Protocol(format!("a step of {sent} holds answered {answered}"))
    }
}
