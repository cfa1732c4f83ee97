//! `[reservation]`: how long ended holds are remembered, and where a
//! gateway remembers which events it has seen loaded.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// How long the reservation store keeps a hold's record once the hold has
/// ended (`[reservation]`), on both stores. The record answers
/// `GET /_sluice/holds/{id}`, a repeated release and a payment webhook;
/// forgetting it changes no counter (the stock, the cart count and the
/// sale stay). Why these defaults: `sluice_reservation::retention`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationConfig {
    /// A hold released (by its visitor or a failed payment) is kept this
    /// long after its release; one that lapsed, this long after its
    /// deadline. Nothing was sold: minutes are enough for the visitor's
    /// page, a retried `DELETE` and a webhook arriving just late (409
    /// `hold_expired`; later than this, 404 `hold_not_found`, and the
    /// provider refunds either way). An `Idempotency-Key` whose hold is
    /// forgotten takes a new hold. Default `"10m"`; at least `"1s"`.
    #[serde(with = "humantime_serde")]
    pub released_hold_retention: Duration,
    /// A confirmed (paid) hold is kept this long after its payment, for as
    /// long as a payment dispute may ask about it: card chargeback windows
    /// run up to 120 days. Default `"180d"` (120 days plus slack); at least
    /// `released_hold_retention`, at most `"3650d"`.
    #[serde(with = "humantime_serde")]
    pub confirmed_hold_retention: Duration,
    /// A file where this gateway records, as JSON, each event (and stock
    /// version) it has seen loaded in the store. Configured stock is never
    /// loaded into a store for an event this file names: so even after a
    /// `FLUSHALL` (which takes the store's own load markers too) and a
    /// restart of every gateway, a gateway with its file does not put sold
    /// stock on sale again. Keep it on a disk that outlives the process
    /// (and the container). Unreadable or malformed: nothing configured is
    /// loaded (the operator loads by hand), with an error in the log.
    /// Default: none (the store's markers and this process's memory only).
    pub state_file: Option<PathBuf>,
}

impl Default for ReservationConfig {
    fn default() -> Self {
        let r = sluice_reservation::Retention::default();
        ReservationConfig {
            released_hold_retention: r.released,
            confirmed_hold_retention: r.confirmed,
            state_file: None,
        }
    }
}

impl ReservationConfig {
    /// The stores' retention.
    pub fn retention(&self) -> sluice_reservation::Retention {
        sluice_reservation::Retention {
            released: self.released_hold_retention,
            confirmed: self.confirmed_hold_retention,
        }
    }

    /// The reservation crate's own check, naming the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use sluice_reservation::RetentionError as E;
        self.retention().validate().map_err(|e| {
            let field = match e {
                E::ReleasedTooShort | E::TooLong("released") => {
                    "reservation.released_hold_retention"
                }
                _ => "reservation.confirmed_hold_retention",
            };
            ConfigError::invalid(field, e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::Config;

    #[test]
    fn hold_retention_is_read_and_checked() {
        let d = Config::default();
        assert_eq!(
            d.reservation.released_hold_retention,
            Duration::from_secs(600)
        );
        assert_eq!(
            d.reservation.confirmed_hold_retention,
            Duration::from_secs(180 * 86_400)
        );
        let c = Config::from_toml(
            "[reservation]\nreleased_hold_retention = \"2m\"\nconfirmed_hold_retention = \"200d\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.reservation.retention().released, Duration::from_secs(120));
        assert_eq!(
            c.reservation.retention().confirmed,
            Duration::from_secs(200 * 86_400)
        );
        for (toml, field) in [
            (
                "released_hold_retention = \"0s\"",
                "reservation.released_hold_retention",
            ),
            (
                "released_hold_retention = \"1h\"\nconfirmed_hold_retention = \"30m\"",
                "reservation.confirmed_hold_retention",
            ),
            (
                "confirmed_hold_retention = \"0s\"",
                "reservation.confirmed_hold_retention",
            ),
            (
                "confirmed_hold_retention = \"3651d\"",
                "reservation.confirmed_hold_retention",
            ),
        ] {
            let text = format!("[reservation]\n{toml}\n");
            let err = Config::from_toml(&text).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains(field), "{toml}: {err}");
        }
        assert!(Config::from_toml("[reservation]\nretention = \"1m\"\n").is_err());
    }
}
