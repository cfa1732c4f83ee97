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
    /// Scheduled waves, `[[events.waves]]` with `at` (RFC 3339 text or
    /// Unix milliseconds), `qty` and, on an event with categories, the
    /// `category` it adds to. Loaded with the event's stock (only into a
    /// store that never had the event, as the stock); a wave whose time
    /// has passed when the stock is loaded is skipped with a warning, not
    /// an error (a config written for a sale keeps starting after it).
    /// Later changes go through `PUT /_sluice/admin/events/{event}/waves`.
    pub waves: Vec<WaveConfig>,
    /// Shards the event's stock is split into (1 to 64; 1: one counter),
    /// each its own Redis hash tag so a Cluster spreads one hot sale over
    /// its primaries (`sluice_reservation::sharded`). No categories or
    /// waves with more than one.
    pub shards: u32,
}

/// One scheduled wave (`[[events.waves]]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaveConfig {
    /// When it opens: RFC 3339 text (`2026-12-01T10:15:00Z`) or Unix ms.
    pub at: toml::Value,
    /// Units it adds (at least 1).
    pub qty: u64,
    /// The category it adds to (required on an event with categories,
    /// refused on one without).
    #[serde(default)]
    pub category: Option<String>,
}

impl WaveConfig {
    /// A wave at `at_ms` (Unix ms) of `qty` units, in `category` if any.
    pub fn at_unix_ms(at_ms: u64, qty: u64, category: Option<&str>) -> WaveConfig {
        WaveConfig {
            at: toml::Value::Integer(i64::try_from(at_ms).unwrap_or(i64::MAX)),
            qty,
            category: category.map(str::to_owned),
        }
    }

    /// `at` in Unix ms.
    pub fn at_ms(&self) -> Result<u64, String> {
        match &self.at {
            toml::Value::Integer(i) => u64::try_from(*i)
                .map_err(|_| "must be Unix milliseconds ≥ 0 or RFC 3339 text".to_owned()),
            toml::Value::String(s) => crate::gate::schedule::parse_rfc3339_ms(s),
            toml::Value::Datetime(d) => crate::gate::schedule::parse_rfc3339_ms(&d.to_string()),
            _ => Err("must be Unix milliseconds or RFC 3339 text".to_owned()),
        }
    }
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
            waves: Vec::new(),
            shards: 1,
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

    /// The configured waves as the stores take them (validated by
    /// [`EventConfig::validate`]; an invalid one is skipped).
    pub fn wave_specs(&self) -> Vec<sluice_reservation::Wave> {
        self.waves
            .iter()
            .filter_map(|w| {
                Some(sluice_reservation::Wave {
                    at_ms: w.at_ms().ok()?,
                    qty: w.qty,
                    category: match &w.category {
                        None => None,
                        Some(c) => Some(sluice_reservation::CategoryId::parse(c)?),
                    },
                })
            })
            .collect()
    }

    /// Checks `[[events.waves]]`: `at` readable, `qty` at least 1, the
    /// category one of the event's (required with categories, refused
    /// without), at most 1000 waves. Whether a wave is past is decided
    /// when the stock is loaded (skipped with a warning).
    fn validate_waves(&self, field: &str) -> Result<(), ConfigError> {
        for (i, w) in self.waves.iter().enumerate() {
            let f = |k: &str| format!("{field}.waves[{i}].{k}");
            w.at_ms().map_err(|e| ConfigError::invalid(f("at"), e))?;
            if w.qty == 0 {
                return Err(ConfigError::invalid(f("qty"), "must be at least 1"));
            }
            match &w.category {
                None if !self.categories.is_empty() => {
                    return Err(ConfigError::invalid(
                        f("category"),
                        "required: the event has categories",
                    ));
                }
                Some(c) if !self.categories.iter().any(|k| &k.id == c) => {
                    return Err(ConfigError::invalid(
                        f("category"),
                        "must be one of the event's categories",
                    ));
                }
                _ => {}
            }
        }
        if let Some(reason) = sluice_reservation::types::waves_problem(&self.wave_specs()) {
            return Err(ConfigError::invalid(format!("{field}.waves"), reason));
        }
        Ok(())
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
        if sluice_reservation::EventId::parse(&self.id).is_none_or(|e| e.is_shard()) {
            return Err(ConfigError::invalid(
                format!("{field}.id"),
                "must match [A-Za-z0-9_-]{1,64}",
            ));
        }
        if !(1..=sluice_reservation::types::MAX_SHARDS).contains(&self.shards) {
            return Err(ConfigError::invalid(
                format!("{field}.shards"),
                "must be from 1 to 64",
            ));
        }
        if self.shards > 1 && !self.categories.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.shards"),
                "an event with categories cannot be sharded",
            ));
        }
        if self.shards > 1 && !self.waves.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.shards"),
                "a sharded event takes no waves",
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
        self.validate_waves(field)?;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn with_waves(cats: &[&str], waves: Vec<WaveConfig>) -> EventConfig {
        EventConfig {
            categories: cats
                .iter()
                .map(|c| CategoryConfig {
                    id: (*c).to_owned(),
                    total: 5,
                    cart_limit: None,
                })
                .collect(),
            waves,
            ..EventConfig::default()
        }
    }

    #[test]
    fn configured_waves_are_checked() {
        let w = |at: toml::Value, qty, c: Option<&str>| WaveConfig {
            at,
            qty,
            category: c.map(str::to_owned),
        };
        let ms = || toml::Value::Integer(1_900_000_000_000);
        let text = || toml::Value::String("2030-03-17T17:46:40Z".into());
        assert!(
            with_waves(&[], vec![w(ms(), 3, None), w(text(), 1, None)])
                .validate("events[0]")
                .is_ok()
        );
        assert_eq!(
            with_waves(&[], vec![w(text(), 1, None)]).wave_specs()[0].at_ms,
            1_900_000_000_000
        );
        assert!(
            with_waves(&["vip"], vec![w(ms(), 3, Some("vip"))])
                .validate("events[0]")
                .is_ok()
        );
        for (cats, wave, field) in [
            (vec![], w(ms(), 0, None), "events[0].waves[0].qty"),
            (
                vec![],
                w(toml::Value::Integer(-5), 1, None),
                "events[0].waves[0].at",
            ),
            (
                vec![],
                w(toml::Value::String("soon".into()), 1, None),
                "events[0].waves[0].at",
            ),
            (
                vec![],
                w(ms(), 1, Some("vip")),
                "events[0].waves[0].category",
            ),
            (vec!["vip"], w(ms(), 1, None), "events[0].waves[0].category"),
            (
                vec!["vip"],
                w(ms(), 1, Some("floor")),
                "events[0].waves[0].category",
            ),
        ] {
            let err = with_waves(&cats, vec![wave.clone()])
                .validate("events[0]")
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{wave:?}: {err}");
        }
    }
}
