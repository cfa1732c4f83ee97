//! `[[events]]`: the events sold through the reservation module.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// One event sold through the reservation module.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventConfig {
    /// Event id (`[A-Za-z0-9_-]{1,64}`).
    pub id: String,
    /// The room whose admitted visitors may buy.
    pub room: String,
    /// Units loaded at start when the store has none (0: load nothing;
    /// stock then comes from the admin API).
    pub total: u64,
    /// Most units one visitor may hold and buy.
    pub cart_limit: u32,
    /// How long a hold lasts before its stock goes back.
    #[serde(with = "humantime_serde")]
    pub hold_ttl: Duration,
}

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig {
            id: "demo".to_owned(),
            room: "default".to_owned(),
            total: 100,
            cart_limit: 4,
            hold_ttl: Duration::from_secs(300),
        }
    }
}

impl EventConfig {
    /// Checks one event; `field` is where it sits (`events[0]`). Whether
    /// its id is unique and its room configured is
    /// [`crate::config::Config::validate`]'s to check.
    pub fn validate(&self, field: &str) -> Result<(), ConfigError> {
        // The reservation crate's event id, the Redis hash tag of its keys.
        if sluice_reservation::EventId::parse(&self.id).is_none() {
            return Err(ConfigError::invalid(
                format!("{field}.id"),
                "must match [A-Za-z0-9_-]{1,64}",
            ));
        }
        // The gateway's own floor, stricter than the stores' (which take
        // any TTL above zero): kept as it was.
        if self.hold_ttl < Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                format!("{field}.hold_ttl"),
                "must be at least 1s",
            ));
        }
        // The stores' own check of the stock this event is loaded with
        // (a total above 2^53 would otherwise be skipped at start with
        // a log line, the event never ready; a cart limit of 0).
        let spec = sluice_reservation::StockSpec {
            total: self.total,
            cart_limit: self.cart_limit,
            hold_ttl: self.hold_ttl,
            version: 1,
            room: self.room.clone(),
        };
        if let Some(reason) = spec.problem() {
            return Err(ConfigError::invalid(field, reason));
        }
        Ok(())
    }
}
