//! `[replication]`: how holds and confirmations wait for Redis replicas.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// Replica acknowledgement of reservation writes (README, "Failover").
///
/// Redis replicates asynchronously: without waiting, a hold or a payment
/// confirmation the primary answered can be missing from the replica
/// promoted when the primary dies. With `wait_replicas = n`, every hold and
/// confirmation is followed by `WAIT n wait_timeout` on the same connection;
/// when fewer replicas acknowledge, a fresh hold is released again and
/// answered 503 `store_unavailable`, a confirmation stays applied and is
/// answered 503 so the payment provider retries the webhook. No effect with
/// the in-memory stores.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Replication {
    /// Replicas that must acknowledge a hold or confirmation before it is
    /// answered (`--redis-wait-replicas`, `SLUICE_REDIS_WAIT_REPLICAS`).
    /// 0 (default): answer at once (asynchronous replication).
    pub wait_replicas: u32,
    /// How long to wait for them (`--redis-wait-timeout`,
    /// `SLUICE_REDIS_WAIT_TIMEOUT`). Default `"100ms"`; at most `"1s"`.
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
}

impl Default for Replication {
    fn default() -> Self {
        Replication {
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
        }
    }
}

impl Replication {
    /// Checks the section. The reservation crate's `RedisConfig` takes the
    /// two values as given (it has no check of its own), so the bounds are
    /// the gateway's: a `WAIT` longer than 1s would hold every hold's
    /// answer, and more than 16 replicas is a typo.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.wait_replicas > 16 {
            return Err(ConfigError::invalid(
                "replication.wait_replicas",
                "must be 16 or fewer",
            ));
        }
        if self.wait_timeout.is_zero() || self.wait_timeout > Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "replication.wait_timeout",
                "must be above zero and at most 1s",
            ));
        }
        Ok(())
    }
}
