//! `[rooms.adaptive]`: the settings of adaptive admission
//! ([`crate::gate::adaptive`]), and their check.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// `[rooms.adaptive]`: adaptive admission of one room. Off by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveConfig {
    /// Steer the rate from the origin's latency and errors (switchable live
    /// through the admin API's `adaptive_enabled`).
    pub enabled: bool,
    /// The latency objective: the origin's p99, in milliseconds.
    pub latency_p99_ms: f64,
    /// The most upstream requests that may fail (5xx, unreachable, timeout),
    /// as a share in [0, 1].
    pub max_error_ratio: f64,
    /// Never below this rate (admissions/s).
    pub floor_rate: f64,
    /// Never above this rate (nor above the capacity-derived rate when
    /// `capacity_rps` is set).
    pub ceiling_rate: f64,
    /// On a breach the rate is multiplied by this, in (0, 1).
    pub decrease_factor: f64,
    /// While healthy and used, the rate grows by this much per interval.
    pub increase_step: f64,
    /// How often the steering gateway decides (its window's length).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How long an operator's manual rate overrides adaptation.
    #[serde(rename = "override", with = "humantime_serde")]
    pub override_for: Duration,
    /// Fewer upstream requests than this in a window: hold (too little to
    /// tell).
    pub min_samples: u64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            enabled: false,
            latency_p99_ms: 500.0,
            max_error_ratio: 0.01,
            floor_rate: 1.0,
            ceiling_rate: 1_000.0,
            decrease_factor: 0.7,
            increase_step: 2.0,
            interval: Duration::from_secs(2),
            override_for: Duration::from_secs(600),
            min_samples: 20,
        }
    }
}

impl AdaptiveConfig {
    /// Checks every field; `field` is where it sits (`rooms[0].adaptive`).
    pub fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let bad =
            |name: &str, reason: &str| ConfigError::invalid(format!("{field}.{name}"), reason);
        let pos = |v: f64| v.is_finite() && v > 0.0;
        if !(pos(self.latency_p99_ms) && self.latency_p99_ms <= 3_600_000.0) {
            return Err(bad("latency_p99_ms", "must be a number of ms > 0"));
        }
        if !(self.max_error_ratio.is_finite() && (0.0..=1.0).contains(&self.max_error_ratio)) {
            return Err(bad("max_error_ratio", "must be in [0, 1]"));
        }
        if !(self.floor_rate.is_finite() && self.floor_rate >= 0.0) {
            return Err(bad("floor_rate", "must be a number ≥ 0"));
        }
        if !(pos(self.ceiling_rate)
            && self.ceiling_rate >= self.floor_rate
            && self.ceiling_rate <= sluice_admission::settings::MAX_RATE_PER_SEC)
        {
            return Err(bad(
                "ceiling_rate",
                "must be > 0, at least floor_rate and at most 1000000",
            ));
        }
        if !(self.decrease_factor.is_finite()
            && self.decrease_factor > 0.0
            && self.decrease_factor < 1.0)
        {
            return Err(bad("decrease_factor", "must be in (0, 1)"));
        }
        if !(self.increase_step.is_finite() && self.increase_step >= 0.0) {
            return Err(bad("increase_step", "must be a number ≥ 0"));
        }
        if self.interval < Duration::from_millis(100) || self.interval > Duration::from_secs(3600) {
            return Err(bad("interval", "must be between 100ms and 1h"));
        }
        if self.override_for > Duration::from_secs(7 * 86_400) {
            return Err(bad("override", "must be at most 7 days"));
        }
        Ok(())
    }
}

/// The range the rate must stay in: `[min(floor, ceiling), ceiling]` with
/// the ceiling lowered to the capacity-derived rate.
pub fn bounds(cfg: &AdaptiveConfig, capacity_rate: Option<f64>) -> (f64, f64) {
    let hi = match capacity_rate {
        Some(c) if c.is_finite() && c >= 0.0 => cfg.ceiling_rate.min(c),
        _ => cfg.ceiling_rate,
    };
    (cfg.floor_rate.min(hi), hi)
}
