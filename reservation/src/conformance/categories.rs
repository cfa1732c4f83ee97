//! Categories (tiers) within an event: a plain model and a driver that runs
//! random interleavings of multi-category holds, bare holds, releases,
//! payments, expiries and stock changes against a store and the model.
//!
//! After every step the driver reads the store and checks, per category
//! and for the event: `available + held + confirmed = total`, nothing
//! oversold, and the counters equal the model's; every answer must equal
//! the model's. At the end each hold's stream entries are checked: one
//! `held` and at most one end, each with the hold's breakdown, so every
//! category's units came back (or were sold) exactly once.
//!
//! Time: expiry is a whole TTL plus a margin (every hold taken before
//! lapses, none after), so one strategy serves the memory store (virtual
//! time) and Redis (real time). The model expires lapsed holds at once;
//! the stores must answer the same whether or not a reaper came by.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;

use super::Harness;
use super::retained::{St, answer_stands, kept};
use crate::{
    CategoryId, CategorySpec, ConfirmOutcome, EventId, FeedApplied, FeedOutcome, HoldId,
    HoldOutcome, Inventory, Item, ReleaseOutcome, SetStockOutcome, StockChange, StockRow,
    StockSpec, TransitionKind,
};

/// Category ids of a case: `c0`, `c1`, … (index `UNKNOWN` names one the
/// event does not have).
const UNKNOWN: u8 = 9;

/// One step.
#[derive(Clone, Debug)]
pub enum CatOp {
    /// `hold_items(visitor, items)`; category indexes may repeat or be
    /// unknown, quantities may be 0.
    Hold {
        /// Visitor index.
        visitor: u8,
        /// `(category index, qty)`.
        items: Vec<(u8, u32)>,
    },
    /// A bare `hold(qty)` on the categorized event (always refused).
    Bare {
        /// Visitor index.
        visitor: u8,
        /// Quantity.
        qty: u32,
    },
    /// The owner releases a hold (index modulo the holds taken).
    Release(u8),
    /// A payment for a hold.
    Pay {
        /// Hold index.
        hold: u8,
        /// Outcome.
        succeeded: bool,
    },
    /// Every hold taken so far lapses (one TTL plus a margin).
    Expire,
    /// `set_stock_with_categories` with these totals, one per category
    /// (same ids and limits).
    Stock(Vec<u64>),
    /// A stock feed delta of category `cat` ([`NO_CATEGORY`]: none) with
    /// key index `key` (a few keys: replays and reuses happen).
    Delta {
        /// Category index.
        cat: u8,
        /// Units (not 0).
        delta: i64,
        /// Key index.
        key: u8,
    },
    /// A stock feed snapshot of category `cat` (versions often stale).
    Snapshot {
        /// Category index.
        cat: u8,
        /// The category's new total.
        total: u64,
        /// The source version.
        version: u64,
    },
}

/// A feed row's category index meaning "no category" (refused on an event
/// with categories).
const NO_CATEGORY: u8 = 8;

/// Settings of one case.
#[derive(Clone, Debug)]
pub struct CatCase {
    /// `(total, cart_limit)` per category.
    pub cats: Vec<(u64, Option<u32>)>,
    /// The event's cart limit (across categories).
    pub cart_limit: u32,
}

/// Random cases: 1 to 3 categories, 3 visitors, up to `max_ops` steps.
pub fn cat_case(max_ops: usize) -> impl Strategy<Value = (CatCase, Vec<CatOp>)> {
    let cats =
        proptest::collection::vec((0u64..10, proptest::option::weighted(0.5, 1u32..4)), 1..4);
    let case = (cats, 1u32..7).prop_map(|(cats, cart_limit)| CatCase { cats, cart_limit });
    let idx = prop_oneof![20 => 0u8..3, 1 => Just(UNKNOWN)];
    let item = (idx, prop_oneof![10 => 1u32..4, 1 => Just(0u32)]);
    let op = prop_oneof![
        8 => (0u8..3, proptest::collection::vec(item, 1..4))
            .prop_map(|(visitor, items)| CatOp::Hold { visitor, items }),
        1 => (0u8..3, 1u32..3).prop_map(|(visitor, qty)| CatOp::Bare { visitor, qty }),
        2 => any::<u8>().prop_map(CatOp::Release),
        3 => (any::<u8>(), proptest::bool::weighted(0.7))
            .prop_map(|(hold, succeeded)| CatOp::Pay { hold, succeeded }),
        1 => Just(CatOp::Expire),
        1 => proptest::collection::vec(0u64..12, 3).prop_map(CatOp::Stock),
        3 => (feed_cat(), 1i64..5, any::<bool>(), 0u8..3).prop_map(|(cat, n, neg, key)| {
            CatOp::Delta { cat, delta: if neg { -n } else { n }, key }
        }),
        2 => (feed_cat(), 0u64..12, 0u64..5)
            .prop_map(|(cat, total, version)| CatOp::Snapshot { cat, total, version }),
    ];
    (case, proptest::collection::vec(op, 1..max_ops))
}

/// A feed row's category: mostly a real one, sometimes unknown or none.
fn feed_cat() -> impl Strategy<Value = u8> {
    prop_oneof![20 => 0u8..3, 1 => Just(UNKNOWN), 1 => Just(NO_CATEGORY)]
}

struct MHold {
    id: HoldId,
    visitor: String,
    items: Vec<Item>,
    status: St,
    /// The hold's deadline on the store's clock.
    deadline_ms: u64,
    /// When a release or a failed payment ended it (the store's clock).
    released_ms: Option<u64>,
}

struct MCat {
    id: CategoryId,
    total: u64,
    held: u64,
    confirmed: u64,
    limit: Option<u32>,
    /// The last feed snapshot's version.
    version: Option<u64>,
}

impl MCat {
    fn available(&self) -> u64 {
        self.total - self.held - self.confirmed
    }
}

/// The model: counters per category, holds with their breakdowns.
struct Model {
    cats: Vec<MCat>,
    cart_limit: u32,
    holds: Vec<MHold>,
    version: u64,
    /// Feed delta keys applied: key index → (category index, delta, first
    /// answer).
    feed_keys: HashMap<u8, (u8, i64, FeedApplied)>,
}

fn cat_id(i: u8) -> CategoryId {
    CategoryId::parse(&format!("c{i}")).expect("valid category id")
}

impl Model {
    fn cat(&self, id: &CategoryId) -> Option<&MCat> {
        self.cats.iter().find(|c| &c.id == id)
    }

    fn cat_mut(&mut self, id: &CategoryId) -> &mut MCat {
        let i = self.cats.iter().position(|c| &c.id == id);
        &mut self.cats[i.expect("known category")]
    }

    /// Held + confirmed units of `visitor`, in `category` or (None) all.
    fn cart(&self, visitor: &str, category: Option<&CategoryId>) -> u64 {
        self.holds
            .iter()
            .filter(|h| h.visitor == visitor && matches!(h.status, St::Held | St::Confirmed))
            .flat_map(|h| &h.items)
            .filter(|i| category.is_none_or(|c| &i.category == c))
            .map(|i| u64::from(i.qty))
            .sum()
    }

    /// What `hold_items` must answer (`None`: a new hold).
    fn expect_hold(&self, visitor: &str, items: &[Item]) -> Option<HoldOutcome> {
        if let Some(c) = crate::types::duplicate_category(items) {
            return Some(HoldOutcome::DuplicateCategory {
                category: c.to_string(),
            });
        }
        if let Some(i) = items.iter().find(|i| self.cat(&i.category).is_none()) {
            return Some(HoldOutcome::CategoryNotFound {
                category: i.category.to_string(),
            });
        }
        let limit = self.cart_limit;
        let sum: u64 = items.iter().map(|i| u64::from(i.qty)).sum();
        if sum == 0 || sum > u64::from(limit) || items.iter().any(|i| i.qty == 0) {
            return Some(HoldOutcome::InvalidQuantity { limit });
        }
        let have = self.cart(visitor, None);
        if have + sum > u64::from(limit) {
            return Some(HoldOutcome::CartLimitExceeded {
                limit,
                held: have as u32,
            });
        }
        for i in items {
            let c = self.cat(&i.category)?;
            if let Some(climit) = c.limit {
                let have = self.cart(visitor, Some(&i.category));
                if have + u64::from(i.qty) > u64::from(climit) {
                    return Some(HoldOutcome::CategoryCartLimitExceeded {
                        category: i.category.to_string(),
                        limit: climit,
                        held: have as u32,
                    });
                }
            }
        }
        for i in items {
            let c = self.cat(&i.category)?;
            if c.available() < u64::from(i.qty) {
                return Some(HoldOutcome::CategorySoldOut {
                    category: i.category.to_string(),
                    available: c.available(),
                });
            }
        }
        None
    }

    fn take(&mut self, items: &[Item]) {
        for i in items {
            self.cat_mut(&i.category).held += u64::from(i.qty);
        }
    }

    /// Ends hold `h` (held now) in `to`.
    fn end(&mut self, h: usize, to: St) {
        let items = self.holds[h].items.clone();
        for i in &items {
            let c = self.cat_mut(&i.category);
            c.held -= u64::from(i.qty);
            if to == St::Confirmed {
                c.confirmed += u64::from(i.qty);
            }
        }
        self.holds[h].status = to;
    }

    /// What a stock change to `totals` must answer.
    fn expect_stock(&self, totals: &[u64]) -> Option<SetStockOutcome> {
        self.cats.iter().zip(totals).find_map(|(c, t)| {
            (*t < c.held + c.confirmed).then(|| SetStockOutcome::CategoryBelowCommitted {
                category: c.id.to_string(),
                held: c.held,
                confirmed: c.confirmed,
            })
        })
    }

    /// The counters an applied feed row on category `c` answers.
    fn applied(&self, c: &CategoryId) -> FeedApplied {
        let mc = self.cat(c).expect("known category");
        FeedApplied {
            total: self.cats.iter().map(|c| c.total).sum(),
            available: self.cats.iter().map(MCat::available).sum(),
            category_total: Some(mc.total),
            category_available: Some(mc.available()),
            version: mc.version,
        }
    }

    /// The refusal of a feed row naming category index `cat` for its
    /// target, if any.
    fn feed_target(&self, cat: u8) -> Result<CategoryId, FeedOutcome> {
        if cat == NO_CATEGORY {
            return Err(FeedOutcome::CategoryRequired);
        }
        let id = cat_id(cat);
        if self.cat(&id).is_none() {
            return Err(FeedOutcome::CategoryNotFound {
                category: id.to_string(),
            });
        }
        Ok(id)
    }

    /// What a feed delta must answer; applies it when it is applied.
    fn feed_delta(&mut self, cat: u8, delta: i64, key: u8) -> FeedOutcome {
        if let Some((c, d, first)) = self.feed_keys.get(&key) {
            return if *c == cat && *d == delta {
                FeedOutcome::Replayed(first.clone())
            } else {
                FeedOutcome::KeyReused
            };
        }
        let id = match self.feed_target(cat) {
            Ok(id) => id,
            Err(refused) => return refused,
        };
        let n = delta.unsigned_abs();
        let c = self.cat_mut(&id);
        if delta < 0 && c.available() < n {
            return FeedOutcome::StockNegative {
                available: c.available(),
            };
        }
        if delta < 0 {
            c.total -= n;
        } else {
            c.total += n;
        }
        let a = self.applied(&id);
        self.feed_keys.insert(key, (cat, delta, a.clone()));
        FeedOutcome::Applied(a)
    }

    /// What a feed snapshot must answer; applies it when it is applied.
    fn feed_snapshot(&mut self, cat: u8, total: u64, version: u64) -> FeedOutcome {
        let id = match self.feed_target(cat) {
            Ok(id) => id,
            Err(refused) => return refused,
        };
        let c = self.cat_mut(&id);
        if let Some(v) = c.version
            && version <= v
        {
            return FeedOutcome::Stale { current_version: v };
        }
        if total < c.held + c.confirmed {
            return FeedOutcome::CategoryBelowCommitted {
                category: id.to_string(),
                held: c.held,
                confirmed: c.confirmed,
            };
        }
        c.total = total;
        c.version = Some(version);
        FeedOutcome::Applied(self.applied(&id))
    }

    fn specs(&self) -> Vec<CategorySpec> {
        self.cats
            .iter()
            .map(|c| CategorySpec {
                id: c.id.clone(),
                total: c.total,
                cart_limit: c.limit,
            })
            .collect()
    }
}

fn spec_of(m: &Model, ttl: Duration) -> StockSpec {
    StockSpec {
        total: 0,
        cart_limit: m.cart_limit,
        hold_ttl: ttl,
        version: m.version,
        room: "default".into(),
    }
}

/// Runs one case against `h`'s store; `Err` describes the first
/// disagreement or broken invariant.
pub async fn run_cat_case(h: &Harness, case: &CatCase, ops: &[CatOp]) -> Result<(), String> {
    let ev = h.event("cat");
    let ttl = h.short_ttl;
    let mut m = Model {
        cats: case
            .cats
            .iter()
            .enumerate()
            .map(|(i, (total, limit))| MCat {
                id: cat_id(i as u8),
                total: *total,
                held: 0,
                confirmed: 0,
                limit: *limit,
                version: None,
            })
            .collect(),
        cart_limit: case.cart_limit,
        holds: Vec::new(),
        version: 1,
        feed_keys: HashMap::new(),
    };
    let out = h
        .inv
        .set_stock_with_categories(&ev, &spec_of(&m, ttl), &m.specs())
        .await
        .map_err(|e| e.to_string())?;
    if !matches!(out, SetStockOutcome::Created { .. }) {
        return Err(format!("create: {out:?}"));
    }
    let mut payment = 0u32;
    for (step, op) in ops.iter().enumerate() {
        step_once(h, &ev, &mut m, op, &mut payment)
            .await
            .map_err(|e| format!("step {step} {op:?}: {e}"))?;
        check_counters(h, &ev, &m)
            .await
            .map_err(|e| format!("after step {step} {op:?}: {e}"))?;
        h.step_check(&ev)
            .await
            .map_err(|e| format!("after step {step} {op:?}: {e}"))?;
    }
    check_stream(h, &ev, &m).await
}

async fn step_once(
    h: &Harness,
    ev: &EventId,
    m: &mut Model,
    op: &CatOp,
    payment: &mut u32,
) -> Result<(), String> {
    let visitor = |v: u8| format!("v{v}");
    match op {
        CatOp::Hold { visitor: v, items } => {
            let items: Vec<Item> = items
                .iter()
                .map(|(c, q)| Item {
                    category: cat_id(*c),
                    qty: *q,
                })
                .collect();
            let expected = m.expect_hold(&visitor(*v), &items);
            let got = h
                .inv
                .hold_items(ev, &visitor(*v), &items, None)
                .await
                .map_err(|e| e.to_string())?;
            match (expected, got) {
                (None, HoldOutcome::Held(view)) => {
                    if view.items != items {
                        return Err(format!("held items {:?}", view.items));
                    }
                    m.take(&items);
                    m.holds.push(MHold {
                        id: view.hold_id,
                        visitor: visitor(*v),
                        items,
                        status: St::Held,
                        deadline_ms: view.expires_at_ms,
                        released_ms: None,
                    });
                }
                (Some(e), g) if e == g => {}
                (e, g) => return Err(format!("expected {e:?}, got {g:?}")),
            }
        }
        CatOp::Bare { visitor: v, qty } => {
            let got = h
                .inv
                .hold(ev, &visitor(*v), *qty, None)
                .await
                .map_err(|e| e.to_string())?;
            if got != HoldOutcome::ItemsRequired {
                return Err(format!("bare hold answered {got:?}"));
            }
        }
        CatOp::Release(i) => {
            if m.holds.is_empty() {
                return Ok(());
            }
            let k = usize::from(*i) % m.holds.len();
            let (id, owner, status) = (
                m.holds[k].id.clone(),
                m.holds[k].visitor.clone(),
                m.holds[k].status,
            );
            let expected = match status {
                St::Held => ReleaseOutcome::Released,
                St::Confirmed => ReleaseOutcome::Confirmed,
                St::Released => ReleaseOutcome::AlreadyReleased,
                St::Expired => ReleaseOutcome::Expired,
            };
            let mh = &m.holds[k];
            let record = kept(h, status, mh.deadline_ms, mh.released_ms, h.now_ms());
            let got = h
                .inv
                .release(&id, &owner)
                .await
                .map_err(|e| e.to_string())?;
            let forgotten = got == ReleaseOutcome::NotFound;
            if !answer_stands(record, got == expected, forgotten) {
                return Err(format!("release: expected {expected:?}, got {got:?}"));
            }
            if status == St::Held {
                m.end(k, St::Released);
                m.holds[k].released_ms = Some(h.now_ms());
            }
        }
        CatOp::Pay { hold, succeeded } => {
            if m.holds.is_empty() {
                return Ok(());
            }
            let k = usize::from(*hold) % m.holds.len();
            let status = m.holds[k].status;
            let expected = match (status, succeeded) {
                (St::Held, true) | (St::Confirmed, _) => ConfirmOutcome::Confirmed,
                (St::Held, false) | (St::Released, _) => ConfirmOutcome::Released,
                (St::Expired, _) => ConfirmOutcome::Expired,
            };
            *payment += 1;
            let mh = &m.holds[k];
            let record = kept(h, status, mh.deadline_ms, mh.released_ms, h.now_ms());
            let got = h
                .inv
                .confirm(&m.holds[k].id, &format!("pay{payment}"), *succeeded)
                .await
                .map_err(|e| e.to_string())?;
            let forgotten = got == ConfirmOutcome::NotFound;
            if !answer_stands(record, got == expected, forgotten) {
                return Err(format!("confirm: expected {expected:?}, got {got:?}"));
            }
            if status == St::Held && *succeeded {
                m.end(k, St::Confirmed);
            } else if status == St::Held {
                m.end(k, St::Released);
                m.holds[k].released_ms = Some(h.now_ms());
            }
        }
        CatOp::Expire => {
            h.advance(h.short_ttl + Duration::from_millis(150)).await;
            for k in 0..m.holds.len() {
                if m.holds[k].status == St::Held {
                    m.end(k, St::Expired);
                }
            }
        }
        CatOp::Delta { cat, delta, key } => {
            let row = StockRow {
                category: (*cat != NO_CATEGORY).then(|| cat_id(*cat)),
                change: StockChange::Delta {
                    delta: *delta,
                    key: format!("erp-{key}"),
                },
            };
            let expected = m.feed_delta(*cat, *delta, *key);
            let got = h
                .inv
                .apply_stock(ev, &row)
                .await
                .map_err(|e| e.to_string())?;
            if got != expected {
                return Err(format!("delta: expected {expected:?}, got {got:?}"));
            }
        }
        CatOp::Snapshot {
            cat,
            total,
            version,
        } => {
            let row = StockRow {
                category: (*cat != NO_CATEGORY).then(|| cat_id(*cat)),
                change: StockChange::Snapshot {
                    total: *total,
                    version: *version,
                },
            };
            let expected = m.feed_snapshot(*cat, *total, *version);
            let got = h
                .inv
                .apply_stock(ev, &row)
                .await
                .map_err(|e| e.to_string())?;
            if got != expected {
                return Err(format!("snapshot: expected {expected:?}, got {got:?}"));
            }
        }
        CatOp::Stock(totals) => {
            let totals: Vec<u64> = totals.iter().copied().take(m.cats.len()).collect();
            let expected = m.expect_stock(&totals);
            m.version += 1;
            let mut specs = m.specs();
            for (s, t) in specs.iter_mut().zip(&totals) {
                s.total = *t;
            }
            let got = h
                .inv
                .set_stock_with_categories(ev, &spec_of(m, h.short_ttl), &specs)
                .await
                .map_err(|e| e.to_string())?;
            match (expected, got) {
                (None, SetStockOutcome::Updated { .. }) => {
                    for (c, t) in m.cats.iter_mut().zip(&totals) {
                        c.total = *t;
                    }
                }
                (Some(e), g) if e == g => {}
                (e, g) => return Err(format!("stock: expected {e:?}, got {g:?}")),
            }
        }
    }
    Ok(())
}

/// The store's counters equal the model's; every invariant holds.
async fn check_counters(h: &Harness, ev: &EventId, m: &Model) -> Result<(), String> {
    let s = h
        .inv
        .read(ev)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("event gone")?;
    if !s.invariant_holds {
        return Err(format!("invariant broken: {s:?}"));
    }
    let got: Vec<(String, u64, u64, u64, u64)> = s
        .categories
        .iter()
        .map(|c| (c.id.to_string(), c.total, c.available, c.held, c.confirmed))
        .collect();
    let want: Vec<(String, u64, u64, u64, u64)> = m
        .cats
        .iter()
        .map(|c| {
            (
                c.id.to_string(),
                c.total,
                c.available(),
                c.held,
                c.confirmed,
            )
        })
        .collect();
    if got != want {
        return Err(format!("categories: store {got:?}, model {want:?}"));
    }
    for v in 0..3 {
        let visitor = format!("v{v}");
        if m.cart(&visitor, None) > u64::from(m.cart_limit) {
            return Err(format!("{visitor} over the event's cart limit"));
        }
        for c in &m.cats {
            if c.limit
                .is_some_and(|l| m.cart(&visitor, Some(&c.id)) > u64::from(l))
            {
                return Err(format!("{visitor} over {}'s cart limit", c.id));
            }
        }
    }
    Ok(())
}

/// Each hold's stream entries: one `held`, and one end exactly when the
/// model ended it, each with the hold's breakdown.
async fn check_stream(h: &Harness, ev: &EventId, m: &Model) -> Result<(), String> {
    let log = h.history(ev, 100_000).await?;
    let mut by_hold: HashMap<&str, Vec<(TransitionKind, &[Item])>> = HashMap::new();
    for t in &log {
        by_hold
            .entry(t.hold_id.as_str())
            .or_default()
            .push((t.kind, &t.items));
    }
    for hold in &m.holds {
        let entries = by_hold.get(hold.id.as_str()).cloned().unwrap_or_default();
        let want_end = match hold.status {
            St::Held => None,
            St::Confirmed => Some(TransitionKind::Confirmed),
            St::Released => Some(TransitionKind::Released),
            St::Expired => Some(TransitionKind::Expired),
        };
        let want: Vec<TransitionKind> = std::iter::once(TransitionKind::Held)
            .chain(want_end)
            .collect();
        let kinds: Vec<TransitionKind> = entries.iter().map(|(k, _)| *k).collect();
        if kinds != want {
            return Err(format!("hold {}: stream {kinds:?}, want {want:?}", hold.id));
        }
        if entries
            .iter()
            .any(|(_, items)| *items != hold.items.as_slice())
        {
            return Err(format!("hold {}: stream items differ", hold.id));
        }
    }
    Ok(())
}
