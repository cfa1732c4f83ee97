//! What a durable record (the PostgreSQL ledger) knows of one event: enough
//! to rebuild its counters, open holds and carts in a store that lost them.
//!
//! The ledger builds an [`EventRecord`] from the stream entries it stored;
//! [`crate::Inventory::restore`] puts it into an empty store. Restoring
//! never overwrites an event the store still has, and never puts more on
//! sale than the record allows: `available = total − held − confirmed`,
//! clamped at zero (bias to under-selling).

use serde::Serialize;

use std::collections::HashMap;

use crate::types::{CategoryId, CategorySpec, HoldId, Item};

/// One hold the ledger saw taken and not yet ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OpenHold {
    /// The hold's id, kept so a webhook for it still finds it.
    pub hold_id: HoldId,
    /// Its owner (the admission token's `sub`).
    pub visitor: String,
    /// Units held.
    pub qty: u32,
    /// Its deadline, Unix milliseconds (the `held` entry's `expires_at_ms`).
    pub expires_at_ms: u64,
}

/// One hold the ledger saw paid: restored as a confirmed hold, so its
/// owner still reads it and a retried webhook for it answers `confirmed`
/// (not `hold_not_found`, which a provider would take for a refund).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SoldHold {
    /// The hold's id.
    pub hold_id: HoldId,
    /// Its owner.
    pub visitor: String,
    /// Units sold.
    pub qty: u32,
}

/// The ledger's view of one event, as of the last entry it stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    /// Units on sale in all (the last `stock` entry's `qty`).
    pub total: u64,
    /// The stock version of that entry.
    pub version: u64,
    /// Units confirmed (sold), per visitor; visitors with none are left out.
    pub confirmed: Vec<(String, u64)>,
    /// Holds taken and not ended (a hold past its deadline included: the
    /// store expires it as it would any lapsed hold, and the stream says so).
    pub open_holds: Vec<OpenHold>,
    /// Holds that ended paid, restored as confirmed records (their units
    /// are already in `confirmed`; the records do not count again).
    pub confirmed_holds: Vec<SoldHold>,
}

impl EventRecord {
    /// Units held by the open holds.
    pub fn held(&self) -> u64 {
        self.open_holds.iter().map(|h| u64::from(h.qty)).sum()
    }

    /// Units sold.
    pub fn confirmed_total(&self) -> u64 {
        self.confirmed.iter().map(|(_, q)| q).sum()
    }

    /// What may go back on sale: `total − held − confirmed`, never below 0.
    pub fn available(&self) -> u64 {
        self.total
            .saturating_sub(self.held())
            .saturating_sub(self.confirmed_total())
    }
}

/// The per-category part of a record ([`crate::Inventory::restore_with_categories`]):
/// kept apart from [`EventRecord`] so a record of an event without
/// categories is written exactly as before.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CategoryRecord {
    /// The categories as last loaded (their totals and cart limits).
    pub categories: Vec<CategorySpec>,
    /// Each open or sold hold's breakdown, by hold id.
    pub hold_items: HashMap<String, Vec<Item>>,
    /// Units sold per visitor and category.
    pub confirmed: Vec<(String, CategoryId, u64)>,
}

impl CategoryRecord {
    /// `(held, confirmed)` units of `category` in `record`'s open holds and
    /// in this record's sales.
    pub fn committed(&self, record: &EventRecord, category: &CategoryId) -> (u64, u64) {
        let held = record
            .open_holds
            .iter()
            .filter_map(|h| self.hold_items.get(h.hold_id.as_str()))
            .flatten()
            .filter(|i| &i.category == category)
            .map(|i| u64::from(i.qty))
            .sum();
        let confirmed = self
            .confirmed
            .iter()
            .filter(|(_, c, _)| c == category)
            .map(|(_, _, q)| q)
            .sum();
        (held, confirmed)
    }
}

/// What [`crate::Inventory::restore`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RestoreOutcome {
    /// The store had no counters for the event: rebuilt from the record.
    Restored {
        /// Units on sale after the rebuild.
        available: u64,
        /// Units held by the restored holds.
        held: u64,
        /// Units confirmed.
        confirmed: u64,
    },
    /// The store still has the event: nothing changed (a rebuild never
    /// overwrites live counters).
    Present,
    /// The record or spec is unusable (a hold of another event, qty 0, a
    /// spec the store would refuse): nothing changed.
    Invalid {
        /// What is wrong.
        reason: String,
    },
}
