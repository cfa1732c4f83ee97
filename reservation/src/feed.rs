//! Stock feeds: changes of stock sent by an ERP or a marketplace, one row
//! at a time ([`crate::Inventory::apply_stock`]).
//!
//! A row is either
//!
//! - a **delta** ([`StockChange::Delta`]): `+n` units received or `−n`
//!   damaged, with an **idempotency key** (1 to 128 visible ASCII
//!   characters, [`feed_key_ok`]). The key is remembered
//!   [`crate::FEED_KEY_TTL`] (48 h) after the delta was applied: the same
//!   key with the same delta and category answers the first answer again
//!   ([`FeedOutcome::Replayed`]) and changes nothing; with another delta or
//!   category it is refused ([`FeedOutcome::KeyReused`]). A refused delta
//!   is not remembered (a retry once stock came back may apply it);
//! - a **snapshot** ([`StockChange::Snapshot`]): an absolute total with the
//!   source's version. A version not above the last one applied to the
//!   same target is [`FeedOutcome::Stale`] and changes nothing (seed 004's
//!   version guard: the event's own version, shared with
//!   `PUT /_sluice/admin/events/{event}`, for an event without categories;
//!   each category's own version, kept in the event's settings as
//!   `c:{id}:version` and set by snapshots only, for a category; a
//!   category no snapshot has reached yet takes any version).
//!
//! Either targets the event (an event without categories) or one category
//! of it (an event with categories must name one:
//! [`FeedOutcome::CategoryRequired`]). Units move as one: a delta changes
//! the total and the available units by the same amount, in the category
//! and in the event, so `available + held + confirmed = total` stays true
//! in both. Held and sold units are never removed: a negative delta above
//! what is available (after expiring lapsed holds, oldest first, as a hold
//! does) is [`FeedOutcome::StockNegative`], a snapshot below what is held
//! and sold is [`FeedOutcome::BelowCommitted`] or
//! [`FeedOutcome::CategoryBelowCommitted`]. Each row is one atomic step
//! (one Lua script, `lua/feed.lua`, in Redis), all or nothing.
//!
//! Every applied row appends a `stock` entry to the event's stream with the
//! new total (and every category's, as `set_stock` writes them), plus
//! `reason` (`delta` or `snapshot`), `category`, and `key` and `delta` or
//! `source_version`, so the ledger takes the new totals
//! (`reservation/STREAM.md`).

use serde::Serialize;

use crate::MAX_TOTAL;
use crate::types::CategoryId;

/// Longest feed idempotency key, in bytes.
pub const MAX_FEED_KEY_LEN: usize = 128;

/// Whether `key` is a usable feed idempotency key: 1 to 128 visible ASCII
/// characters (`!` to `~`).
pub fn feed_key_ok(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_FEED_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic())
}

/// What a row changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StockChange {
    /// Units added (`delta > 0`) or removed (`delta < 0`), once per key.
    Delta {
        /// Units, `−2^53 ..= 2^53`, not 0.
        delta: i64,
        /// The idempotency key ([`feed_key_ok`]).
        key: String,
    },
    /// An absolute total, applied only above the last version.
    Snapshot {
        /// The new total (of the category, or the event).
        total: u64,
        /// The source's version.
        version: u64,
    },
}

/// One row of a stock feed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StockRow {
    /// The category it targets (`None`: the event, which must then have
    /// no categories).
    pub category: Option<CategoryId>,
    /// The change.
    pub change: StockChange,
}

impl StockRow {
    /// Why every store refuses this row before looking at the event
    /// ([`FeedOutcome::Invalid`]), if it does.
    pub fn problem(&self) -> Option<&'static str> {
        let max = i64::try_from(MAX_TOTAL).unwrap_or(i64::MAX);
        match &self.change {
            StockChange::Delta { delta, key } => {
                if *delta == 0 {
                    Some("delta must not be 0")
                } else if delta.unsigned_abs() > max.unsigned_abs() {
                    Some("delta beyond ±2^53")
                } else if !feed_key_ok(key) {
                    Some("key must be 1 to 128 visible ASCII characters")
                } else {
                    None
                }
            }
            StockChange::Snapshot { total, .. } => {
                (*total > MAX_TOTAL).then_some("total above 2^53")
            }
        }
    }
}

/// The counters after an applied row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FeedApplied {
    /// The event's total.
    pub total: u64,
    /// The event's available units.
    pub available: u64,
    /// The category's total (a row naming a category).
    pub category_total: Option<u64>,
    /// The category's available units (a row naming a category).
    pub category_available: Option<u64>,
    /// The version guarding the target now: the event's, or the
    /// category's (`None`: a category no snapshot has reached).
    pub version: Option<u64>,
}

/// Answer to [`crate::Inventory::apply_stock`]. Only `Applied` changed
/// anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum FeedOutcome {
    /// The row was applied.
    Applied(FeedApplied),
    /// A delta's key was applied before with the same delta and category:
    /// the first answer, nothing changed.
    Replayed(FeedApplied),
    /// A snapshot whose version is not above the target's (HTTP 409
    /// `stale_version`): nothing changed.
    Stale {
        /// The target's version.
        current_version: u64,
    },
    /// A negative delta above the available units (HTTP 409
    /// `stock_negative`): nothing changed.
    StockNegative {
        /// Units available in the target (after expiring lapsed holds).
        available: u64,
    },
    /// The key was applied before with another delta or category (HTTP
    /// 409 `feed_key_reused`): nothing changed.
    KeyReused,
    /// A snapshot of the event below what is held and sold (HTTP 409
    /// `below_committed`).
    BelowCommitted {
        /// Units held.
        held: u64,
        /// Units sold.
        confirmed: u64,
    },
    /// A snapshot of a category below what is held and sold in it (HTTP
    /// 409 `category_below_committed`).
    CategoryBelowCommitted {
        /// The category.
        category: String,
        /// Units held in it.
        held: u64,
        /// Units sold in it.
        confirmed: u64,
    },
    /// The row names a category the event does not have (or the event has
    /// none): HTTP 404 `category_not_found`.
    CategoryNotFound {
        /// The category.
        category: String,
    },
    /// A row without a category on an event with categories (HTTP 422
    /// `category_required`).
    CategoryRequired,
    /// The event's counters or settings are missing (HTTP 503
    /// `inventory_not_ready`, or 404 for an event the gateway does not
    /// know).
    NotReady,
    /// The row is unusable ([`StockRow::problem`], or a total that would
    /// pass 2^53): HTTP 422 `invalid_setting`.
    Invalid {
        /// What is wrong.
        reason: &'static str,
    },
}

/// A remembered delta key's value: `{category}|{delta}|` then the first
/// answer's numbers (`total|available|category_total|category_available|
/// version`, empty for none). The same text in both stores.
pub(crate) fn key_record(category: Option<&CategoryId>, delta: i64, a: &FeedApplied) -> String {
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    format!(
        "{}|{delta}|{}|{}|{}|{}|{}",
        category.map(CategoryId::as_str).unwrap_or(""),
        a.total,
        a.available,
        opt(a.category_total),
        opt(a.category_available),
        opt(a.version)
    )
}

/// Parses [`key_record`]: the category and delta, and the first answer.
pub(crate) fn parse_key_record(text: &str) -> Option<(String, i64, FeedApplied)> {
    let f: Vec<&str> = text.split('|').collect();
    if f.len() != 7 {
        return None;
    }
    let opt = |s: &str| -> Option<Option<u64>> {
        if s.is_empty() {
            Some(None)
        } else {
            s.parse().ok().map(Some)
        }
    };
    Some((
        f[0].to_owned(),
        f[1].parse().ok()?,
        FeedApplied {
            total: f[2].parse().ok()?,
            available: f[3].parse().ok()?,
            category_total: opt(f[4])?,
            category_available: opt(f[5])?,
            version: opt(f[6])?,
        },
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys() {
        assert!(feed_key_ok("erp-123"));
        assert!(feed_key_ok(&"k".repeat(128)));
        for bad in ["", " ", "a b", "é", "a\n", &"k".repeat(129)] {
            assert!(!feed_key_ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn key_records_round_trip() {
        let a = FeedApplied {
            total: 10,
            available: 4,
            category_total: Some(3),
            category_available: None,
            version: Some(7),
        };
        let c = CategoryId::parse("floor").unwrap();
        let t = key_record(Some(&c), -3, &a);
        assert_eq!(parse_key_record(&t), Some(("floor".into(), -3, a.clone())));
        let t = key_record(None, 5, &a);
        assert_eq!(parse_key_record(&t), Some((String::new(), 5, a)));
        assert_eq!(parse_key_record("x|y"), None);
    }
}
