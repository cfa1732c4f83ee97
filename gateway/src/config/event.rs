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
    /// Categories (tiers) of the event, `[[events.categories]]` with `id`,
    /// `total` and an optional `cart_limit`. When given, the event's
    /// total is their sum (`total` must then be left out or equal it) and
    /// holds name categories (`items`).
    pub categories: Vec<CategoryConfig>,
}

/// One category of an event (`[[events.categories]]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CategoryConfig {
    /// Category id (`[A-Za-z0-9_-]{1,32}`).
    pub id: String,
    /// Units of it.
    pub total: u64,
    /// Most units of it one visitor may hold and buy (the event's cart
    /// limit applies across all categories as well).
    #[serde(default)]
    pub cart_limit: Option<u32>,
}

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig {
            id: "demo".to_owned(),
            room: "default".to_owned(),
            total: 100,
            cart_limit: 4,
            hold_ttl: Duration::from_secs(300),
            categories: Vec::new(),
        }
    }
}

impl EventConfig {
    /// The categories as the stores take them (validated by
    /// [`EventConfig::validate`]; an invalid id is skipped).
    pub fn category_specs(&self) -> Vec<sluice_reservation::CategorySpec> {
        self.categories
            .iter()
            .filter_map(|c| {
                Some(sluice_reservation::CategorySpec {
                    id: sluice_reservation::CategoryId::parse(&c.id)?,
                    total: c.total,
                    cart_limit: c.cart_limit,
                })
            })
            .collect()
    }

    /// The total loaded: the categories' sum when there are any.
    pub fn effective_total(&self) -> u64 {
        if self.categories.is_empty() {
            self.total
        } else {
            self.categories
                .iter()
                .fold(0u64, |a, c| a.saturating_add(c.total))
        }
    }

    /// Checks `[[events.categories]]`: ids valid and unique, cart limits at
    /// least 1, at most 64, and `total` left at its default or equal to
    /// their sum.
    fn validate_categories(&self, field: &str) -> Result<(), ConfigError> {
        for (i, c) in self.categories.iter().enumerate() {
            if sluice_reservation::CategoryId::parse(&c.id).is_none() {
                return Err(ConfigError::invalid(
                    format!("{field}.categories[{i}].id"),
                    "must match [A-Za-z0-9_-]{1,32}",
                ));
            }
            if c.cart_limit == Some(0) {
                return Err(ConfigError::invalid(
                    format!("{field}.categories[{i}].cart_limit"),
                    "must be at least 1",
                ));
            }
        }
        if let Some(reason) = sluice_reservation::types::categories_problem(&self.category_specs())
        {
            return Err(ConfigError::invalid(format!("{field}.categories"), reason));
        }
        let default_total = EventConfig::default().total;
        if !self.categories.is_empty()
            && self.total != default_total
            && self.total != self.effective_total()
        {
            return Err(ConfigError::invalid(
                format!("{field}.total"),
                "must equal the sum of the categories' totals (or be left out)",
            ));
        }
        Ok(())
    }

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
        self.validate_categories(field)?;
        let spec = sluice_reservation::StockSpec {
            total: self.effective_total(),
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
