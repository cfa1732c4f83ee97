//! `[ledger]`: the PostgreSQL record of every hold and payment, run
//! in-process by `serve`, and how the gateways watch it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// The ledger (README, "Beyond one machine"): the reservation streams
/// written into PostgreSQL, the record a lost Redis is rebuilt from.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// PostgreSQL URL (`--postgres`, `SLUICE_POSTGRES_URL`), e.g.
    /// `postgres://sluice@db/sluice`. With Redis, `serve` runs a ledger
    /// consumer in-process (one member of the consumer group; separate
    /// `sluice ledger` processes may run beside it) and the admin API can
    /// rebuild a lost event from it. None (default): no ledger.
    pub postgres: Option<String>,
    /// Most stream entries written in one transaction.
    pub batch: usize,
    /// How long a consumer waits for new entries before it writes what it
    /// has.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Rebuild an event from the ledger as soon as a gateway finds its
    /// counters missing from Redis (default yes). No: it stays
    /// `inventory_not_ready` until `sluice admin event NAME rebuild`.
    pub auto_rebuild: bool,
    /// Unwritten entries past which the gateways say the ledger is behind
    /// (readiness detail, `sluice_ledger_behind`, the dashboard).
    pub lag_alert_entries: u64,
    /// Age of the oldest unwritten entry past which they say so too.
    #[serde(with = "humantime_serde")]
    pub lag_alert: Duration,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            postgres: None,
            batch: 500,
            flush_interval: Duration::from_millis(100),
            auto_rebuild: true,
            lag_alert_entries: 100_000,
            lag_alert: Duration::from_secs(60),
        }
    }
}

impl LedgerConfig {
    /// Checks the section: a URL PostgreSQL's client can parse, a batch a
    /// transaction can hold, a flush interval the consumer can block on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.postgres
            && url.trim().is_empty()
        {
            return Err(ConfigError::invalid("ledger.postgres", "must not be empty"));
        }
        if !(1..=10_000).contains(&self.batch) {
            return Err(ConfigError::invalid(
                "ledger.batch",
                "must be between 1 and 10000",
            ));
        }
        if self.flush_interval.is_zero() || self.flush_interval > Duration::from_secs(10) {
            return Err(ConfigError::invalid(
                "ledger.flush_interval",
                "must be above zero and at most 10s",
            ));
        }
        if self.lag_alert.is_zero() || self.lag_alert_entries == 0 {
            return Err(ConfigError::invalid(
                "ledger.lag_alert",
                "lag_alert and lag_alert_entries must be above zero",
            ));
        }
        Ok(())
    }
}
