//! `[feeds]`: the stock feeds' ingestion lane (`crate::reserve::feeds`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// The ingestion lane of `POST /_sluice/admin/events/{event}/feed`: rows
/// accepted at once (202) into a queue (a Redis stream per event, or a
/// bounded queue in memory), applied by a consumer in every gateway at a
/// bounded rate, so a large sync never starves checkout.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeedsConfig {
    /// Rows each gateway's consumer applies per second at most (a token
    /// bucket, bursts of at most a tenth of a second's worth). With n
    /// gateways on one Redis the lane drains at up to n times this.
    /// Default 5000; 1 to 1,000,000.
    pub rows_per_sec: u32,
    /// Most rows one `POST …/feed` carries. Default 10,000; 1 to 100,000.
    pub max_batch: usize,
    /// Most rows waiting in one event's lane: a batch that would pass it
    /// is refused whole (503 `feed_full`). Default 4,000,000 (a
    /// 2-million-row sync twice over); 1 to 100,000,000.
    pub max_depth: u64,
    /// Largest body of a `POST …/feed`, in bytes. Default 4 MiB.
    pub max_body_bytes: usize,
    /// On Redis: rows a consumer took but did not finish (its gateway
    /// died) are taken over by another consumer after this long. A row
    /// applied twice changes nothing (its key replays, its version is
    /// stale). Default `"10s"`; 100 ms to 1 h.
    #[serde(with = "humantime_serde")]
    pub claim_after: Duration,
    /// Most rows a consumer sends to the store in one pipeline (in order,
    /// each row still its own atomic step): more rows per round trip
    /// drain a lane faster under load, fewer keep each pipeline's turn on
    /// Redis shorter. 1 is one round trip per row. Never more than the
    /// batch the consumer takes (a tenth of `rows_per_sec`, at most 500).
    /// Default 32; 1 to 500.
    pub pipeline_rows: usize,
}

impl Default for FeedsConfig {
    fn default() -> Self {
        FeedsConfig {
            rows_per_sec: 5000,
            max_batch: 10_000,
            max_depth: 4_000_000,
            max_body_bytes: 4 << 20,
            claim_after: Duration::from_secs(10),
            pipeline_rows: 32,
        }
    }
}

impl FeedsConfig {
    /// Checks the ranges above.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1_000_000).contains(&self.rows_per_sec) {
            return Err(ConfigError::invalid(
                "feeds.rows_per_sec",
                "must be between 1 and 1000000",
            ));
        }
        if !(1..=100_000).contains(&self.max_batch) {
            return Err(ConfigError::invalid(
                "feeds.max_batch",
                "must be between 1 and 100000",
            ));
        }
        if !(1..=100_000_000).contains(&self.max_depth) {
            return Err(ConfigError::invalid(
                "feeds.max_depth",
                "must be between 1 and 100000000",
            ));
        }
        if !(1024..=(256 << 20)).contains(&self.max_body_bytes) {
            return Err(ConfigError::invalid(
                "feeds.max_body_bytes",
                "must be between 1 KiB and 256 MiB",
            ));
        }
        if !(1..=500).contains(&self.pipeline_rows) {
            return Err(ConfigError::invalid(
                "feeds.pipeline_rows",
                "must be between 1 and 500",
            ));
        }
        if self.claim_after < Duration::from_millis(100)
            || self.claim_after > Duration::from_secs(3600)
        {
            return Err(ConfigError::invalid(
                "feeds.claim_after",
                "must be between 100ms and 1h",
            ));
        }
        Ok(())
    }
}
