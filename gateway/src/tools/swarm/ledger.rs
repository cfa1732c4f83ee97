//! The correctness accounting, from the answers alone: every hold granted,
//! and what became of it ([`Ledger`], whose peak of units outstanding is
//! the "oversold seen by the visitors" of the report), and each visitor's
//! [`Cart`] (its distinct holds, held to the cart limit). On an event with
//! categories the same accounting runs per category as well: each hold's
//! units of each category, the peak outstanding in each category (against
//! its own total) and each visitor's units per category (against the
//! category's own cart limit).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

/// A hold granted to one of our visitors.
#[derive(Debug)]
pub(super) struct LiveHold {
    pub(super) qty: u64,
    pub(super) expires_at: u64,
    pub(super) confirmed: bool,
    /// A release was sent: the server may already have put the stock back.
    pub(super) releasing: bool,
    /// Counted in [`Ledger::outstanding`] (and, unless confirmed, listed in
    /// [`Ledger::expiring`]).
    pub(super) counted: bool,
    /// The hold's units per category (empty: an event without categories).
    pub(super) items: Vec<(String, u64)>,
}

impl LiveHold {
    /// What the store must be backing at `now`: a confirmed hold, or a held
    /// one not (possibly) back in stock. A hold within a second of its
    /// expiry may already be reclaimed, so it is not counted.
    fn counts(&self, now: u64) -> bool {
        self.confirmed || (!self.releasing && self.expires_at > now + 1)
    }
}

/// Every hold granted by a successful answer, and what became of it.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    pub(super) live: HashMap<String, LiveHold>,
    /// Units of the live holds that count (see [`LiveHold::counts`]), kept
    /// as a running total: a grant costs O(log n), not a pass over every
    /// hold.
    pub(super) outstanding: u64,
    /// Counted, unconfirmed holds by expiry, to drop them from
    /// `outstanding` when they lapse.
    pub(super) expiring: BTreeSet<(u64, String)>,
    pub(super) holds: u64,
    pub(super) units_held: u64,
    pub(super) units_confirmed: u64,
    pub(super) units_released: u64,
    pub(super) units_lapsed_before_payment: u64,
    pub(super) peak_outstanding: u64,
    pub(super) above_cart_limit: u64,
    pub(super) idempotency_mismatches: u64,
    /// [`Ledger::outstanding`] per category.
    pub(super) outstanding_by_category: HashMap<String, u64>,
    /// [`Ledger::peak_outstanding`] per category.
    pub(super) peak_by_category: BTreeMap<String, u64>,
    /// Units confirmed per category.
    pub(super) confirmed_by_category: BTreeMap<String, u64>,
    /// Visitors whose units of a category went above its cart limit.
    pub(super) above_category_limit: BTreeMap<String, u64>,
}

pub(super) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Ledger {
    /// Records a 201; returns whether the hold is new (not an idempotent
    /// repeat).
    pub(super) fn grant(
        &mut self,
        id: &str,
        qty: u64,
        expires_at: u64,
        items: &[(String, u64)],
    ) -> bool {
        self.grant_at(id, qty, expires_at, items, now_unix())
    }

    fn grant_at(
        &mut self,
        id: &str,
        qty: u64,
        expires_at: u64,
        items: &[(String, u64)],
        now: u64,
    ) -> bool {
        if self.live.contains_key(id) {
            return false;
        }
        self.live.insert(
            id.to_owned(),
            LiveHold {
                qty,
                expires_at,
                confirmed: false,
                releasing: false,
                counted: false,
                items: items.to_vec(),
            },
        );
        self.holds += 1;
        self.units_held += qty;
        self.recount(id, now);
        // holds that lapsed since the last grant no longer count
        while let Some((at, _)) = self.expiring.first() {
            if *at > now + 1 {
                break;
            }
            if let Some((_, lapsed)) = self.expiring.pop_first() {
                self.recount(&lapsed, now);
            }
        }
        self.peak_outstanding = self.peak_outstanding.max(self.outstanding);
        // only a grant raises a category's outstanding units
        for (c, _) in items {
            let now_out = self.outstanding_by_category.get(c).copied().unwrap_or(0);
            let peak = self.peak_by_category.entry(c.clone()).or_default();
            *peak = (*peak).max(now_out);
        }
        true
    }

    /// Moves a hold's units of each category in or out of
    /// [`Ledger::outstanding_by_category`].
    fn count_items(by: &mut HashMap<String, u64>, items: &[(String, u64)], add: bool) {
        for (c, q) in items {
            let n = by.entry(c.clone()).or_default();
            *n = if add { *n + q } else { n.saturating_sub(*q) };
        }
    }

    /// Brings one hold's share of `outstanding` (and its place in
    /// `expiring`) in line with its state at `now`.
    fn recount(&mut self, id: &str, now: u64) {
        let Some(h) = self.live.get_mut(id) else {
            return;
        };
        let counts = h.counts(now);
        if counts != h.counted {
            if counts {
                self.outstanding += h.qty;
            } else {
                self.outstanding = self.outstanding.saturating_sub(h.qty);
            }
            Self::count_items(&mut self.outstanding_by_category, &h.items, counts);
            h.counted = counts;
        }
        let key = (h.expires_at, id.to_owned());
        if h.counted && !h.confirmed {
            self.expiring.insert(key);
        } else {
            self.expiring.remove(&key);
        }
    }

    /// Forgets a hold (released or lapsed); returns its quantity.
    fn remove(&mut self, id: &str) -> Option<u64> {
        let h = self.live.remove(id)?;
        if h.counted {
            self.outstanding = self.outstanding.saturating_sub(h.qty);
            Self::count_items(&mut self.outstanding_by_category, &h.items, false);
        }
        self.expiring.remove(&(h.expires_at, id.to_owned()));
        Some(h.qty)
    }

    pub(super) fn set_releasing(&mut self, id: &str, on: bool) {
        if let Some(h) = self.live.get_mut(id) {
            h.releasing = on;
            self.recount(id, now_unix());
        }
    }

    pub(super) fn confirm(&mut self, id: &str) {
        if let Some(h) = self.live.get_mut(id)
            && !h.confirmed
        {
            h.confirmed = true;
            self.units_confirmed += h.qty;
            for (c, q) in &h.items {
                *self.confirmed_by_category.entry(c.clone()).or_default() += q;
            }
            self.recount(id, now_unix());
        }
    }

    pub(super) fn released(&mut self, id: &str) {
        if let Some(qty) = self.remove(id) {
            self.units_released += qty;
        }
    }

    pub(super) fn lapsed(&mut self, id: &str) {
        if let Some(qty) = self.remove(id) {
            self.units_lapsed_before_payment += qty;
        }
    }
}

/// The distinct holds one visitor was granted, and their units (in all
/// and per category).
#[derive(Debug, Default)]
pub(super) struct Cart {
    pub(super) ids: Vec<String>,
    pub(super) units: u64,
    pub(super) by_category: BTreeMap<String, u64>,
}

impl Cart {
    /// Adds a granted hold; returns whether it is new to this visitor (a
    /// hold named again, e.g. by an idempotent replay, is counted once).
    pub(super) fn add(&mut self, id: &str, units: u64, items: &[(String, u64)]) -> bool {
        if self.ids.iter().any(|x| x == id) {
            return false;
        }
        self.ids.push(id.to_owned());
        self.units += units;
        for (c, q) in items {
            *self.by_category.entry(c.clone()).or_default() += q;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn ledger_counts_outstanding_at_each_grant() {
        let far = now_unix() + 600;
        let mut l = Ledger::default();
        assert!(l.grant("a", 3, far, &[]));
        assert!(
            !l.grant("a", 3, far, &[]),
            "an idempotent repeat is no new hold"
        );
        assert!(l.grant("b", 2, far, &[]));
        assert_eq!(l.peak_outstanding, 5);
        l.set_releasing("a", true);
        l.released("a");
        l.confirm("b");
        assert!(l.grant("c", 1, far, &[]));
        assert_eq!(l.peak_outstanding, 5);
        assert_eq!(
            (l.units_held, l.units_released, l.units_confirmed),
            (6, 3, 2)
        );
        // a lapsed hold no longer counts
        assert!(l.grant("d", 4, 0, &[]));
        assert_eq!(l.peak_outstanding, 5);
        assert_eq!(l.outstanding, 3, "b (confirmed) and c");
    }

    /// The running total against a recount of every hold, through grants,
    /// expiries, releases (also ones that fail) and confirmations.
    #[test]
    fn ledger_running_total_matches_a_recount() {
        let recount = |l: &Ledger, now: u64| -> u64 {
            l.live
                .values()
                .filter(|h| h.counts(now))
                .map(|h| h.qty)
                .sum()
        };
        // confirm and set_releasing read the wall clock: the grants' clock
        // starts there and only moves ahead of it
        let base = now_unix();
        let mut l = Ledger::default();
        let mut peak = 0;
        for i in 0..5_000u64 {
            let now = base + i / 10; // time moves on
            let id = format!("h{i}");
            assert!(l.grant_at(&id, 1 + i % 4, now + 5 + i % 30, &[], now));
            assert_eq!(l.outstanding, recount(&l, now), "after grant {i}");
            peak = peak.max(l.outstanding);
            match i % 7 {
                0 => l.confirm(&format!("h{}", i / 2)),
                1 => {
                    let old = format!("h{}", i - 1);
                    l.set_releasing(&old, true);
                    l.released(&old);
                }
                2 => {
                    // a release that failed: counts again
                    l.set_releasing(&id, true);
                    l.set_releasing(&id, false);
                }
                3 => l.lapsed(&format!("h{}", i / 3)),
                _ => {}
            }
        }
        assert_eq!(l.peak_outstanding, peak);
        // a confirmed hold outlives its expiry; the others lapse
        let mut l = Ledger::default();
        l.grant_at("x", 2, base + 110, &[], base + 100);
        l.grant_at("y", 3, base + 110, &[], base + 100);
        l.confirm("x");
        l.grant_at("z", 1, base + 500, &[], base + 200);
        assert_eq!(l.outstanding, 3, "x (confirmed) and z; y lapsed");
        assert!(l.expiring.iter().all(|(_, id)| id == "z"));
    }

    /// Per category: outstanding units follow grants, releases, lapses and
    /// payments, and the peak is each category's own.
    #[test]
    fn categories_are_accounted_each_on_their_own() {
        let far = now_unix() + 600;
        let it = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(c, q)| ((*c).to_owned(), *q)).collect()
        };
        let mut l = Ledger::default();
        assert!(l.grant("a", 3, far, &it(&[("floor", 2), ("vip", 1)])));
        assert!(l.grant("b", 2, far, &it(&[("floor", 2)])));
        assert_eq!(l.peak_by_category["floor"], 4);
        assert_eq!(l.peak_by_category["vip"], 1);
        l.set_releasing("b", true);
        l.released("b");
        assert_eq!(l.outstanding_by_category["floor"], 2);
        l.confirm("a");
        assert_eq!(l.confirmed_by_category["floor"], 2);
        assert_eq!(l.confirmed_by_category["vip"], 1);
        assert!(l.grant("c", 1, 0, &it(&[("vip", 1)])), "lapsed at once");
        assert_eq!(l.outstanding_by_category["vip"], 1, "only a's");
        assert!(l.grant("d", 1, far, &it(&[("vip", 1)])));
        assert_eq!(l.peak_by_category["vip"], 2);
        assert_eq!(l.peak_by_category["floor"], 4, "a peak is never lowered");
        let mut cart = Cart::default();
        assert!(cart.add("a", 3, &it(&[("floor", 2), ("vip", 1)])));
        assert!(!cart.add("a", 3, &it(&[("floor", 2), ("vip", 1)])));
        assert!(cart.add("d", 1, &it(&[("vip", 1)])));
        assert_eq!((cart.units, cart.by_category["vip"]), (4, 2));
    }

    #[test]
    fn a_replay_naming_another_hold_counts_toward_the_cart() {
        let mut c = Cart::default();
        assert!(c.add("h1", 3, &[]));
        assert!(
            !c.add("h1", 3, &[]),
            "the same hold again is not counted twice"
        );
        assert_eq!(c.units, 3);
        // an idempotent replay that came back with a different hold
        assert!(c.add("h2", 3, &[]));
        assert_eq!(c.units, 6, "both holds are the visitor's");
        assert_eq!(c.ids, ["h1", "h2"]);
    }
}
