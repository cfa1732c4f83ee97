//! Scheduled waves: a plain model and a driver that runs random
//! interleavings of holds, releases, payments, expiries, schedule
//! replacements and wave releases (time moved past a wave's `at`) against
//! a store and the model, plus fixed tests of the refusals and of many
//! callers racing on one due wave.
//!
//! After every step the driver reads the store and checks, per category
//! and for the event: `available + held + confirmed = total`, nothing
//! oversold, no visitor over a cart limit, the counters and the pending
//! schedule equal the model's; every answer must equal the model's. At the
//! end the stream holds exactly one `stock` entry `reason=wave` per wave
//! the model released, each with the total after it.
//!
//! Time: the model releases a wave when time passes its `at`; no
//! operation runs near a wave's time (the driver first moves time past a
//! wave due within [`NEAR_MS`]), so the model knows which waves each
//! operation sees, with real time (Redis) as with virtual time (memory).

use std::time::Duration;

use proptest::prelude::*;

use super::retained::{St, answer_stands, kept};
use super::{Harness, TimeControl};
use crate::{
    CategoryId, CategorySpec, ConfirmOutcome, EventId, HoldId, HoldOutcome, Inventory, Item,
    ReleaseOutcome, ScheduleOutcome, SetStockOutcome, StockSpec, TransitionKind, Wave,
};

/// A wave due within this many ms of an operation is made due first.
pub const NEAR_MS: u64 = 120;
/// Category index naming a category the event does not have.
const UNKNOWN: u8 = 9;

/// One step.
#[derive(Clone, Debug)]
pub enum WaveOp {
    /// A hold: items (categorized case) or their sum as a bare qty (plain).
    Hold {
        /// Visitor index.
        visitor: u8,
        /// `(category index, qty)`.
        items: Vec<(u8, u32)>,
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
    /// Replaces the schedule: `(category index, qty, slot)`, the wave at
    /// now + (slot + 1) gaps; slot 255: at now − 1 (in the past).
    Schedule(Vec<(u8, u64, u8)>),
    /// Time moves past the next pending wave.
    NextWave,
    /// Another reader reads (and so releases what is due).
    Read,
}

/// Settings of one case.
#[derive(Clone, Debug)]
pub struct WaveCase {
    /// `(total, cart_limit)` per category; plain: one, without an id.
    pub cats: Vec<(u64, Option<u32>)>,
    /// An event without categories (holds are bare `qty`).
    pub plain: bool,
    /// The event's cart limit.
    pub cart_limit: u32,
}

/// Random cases: plain or 1 to 3 categories, 3 visitors, up to
/// `max_ops` steps.
pub fn wave_case(max_ops: usize) -> impl Strategy<Value = (WaveCase, Vec<WaveOp>)> {
    let cats = proptest::collection::vec((0u64..6, proptest::option::weighted(0.4, 1u32..4)), 1..4);
    let case = (cats, any::<bool>(), 1u32..7).prop_map(|(cats, plain, cart_limit)| WaveCase {
        cats: if plain { vec![(cats[0].0, None)] } else { cats },
        plain,
        cart_limit,
    });
    let idx = prop_oneof![20 => 0u8..3, 1 => Just(UNKNOWN)];
    let item = (idx.clone(), prop_oneof![10 => 1u32..4, 1 => Just(0u32)]);
    let wave = (
        idx,
        prop_oneof![12 => 1u64..6, 1 => Just(0u64)],
        prop_oneof![12 => 0u8..3, 1 => Just(255u8)],
    );
    let op = prop_oneof![
        8 => (0u8..3, proptest::collection::vec(item, 1..3))
            .prop_map(|(visitor, items)| WaveOp::Hold { visitor, items }),
        2 => any::<u8>().prop_map(WaveOp::Release),
        3 => (any::<u8>(), proptest::bool::weighted(0.7))
            .prop_map(|(hold, succeeded)| WaveOp::Pay { hold, succeeded }),
        1 => Just(WaveOp::Expire),
        2 => proptest::collection::vec(wave, 0..4).prop_map(WaveOp::Schedule),
        3 => Just(WaveOp::NextWave),
        1 => Just(WaveOp::Read),
    ];
    (case, proptest::collection::vec(op, 1..max_ops))
}

struct MHold {
    id: HoldId,
    visitor: String,
    items: Vec<Item>,
    status: St,
    /// The hold's deadline on the store's clock.
    deadline_ms: u64,
    /// When a release ended it (the store's clock); a lapsed hold's
    /// retention counts from its deadline instead.
    released_ms: Option<u64>,
}

struct MCat {
    id: CategoryId,
    total: u64,
    held: u64,
    confirmed: u64,
    limit: Option<u32>,
}

impl MCat {
    fn available(&self) -> u64 {
        self.total - self.held - self.confirmed
    }
}

struct Model {
    plain: bool,
    cats: Vec<MCat>,
    cart_limit: u32,
    holds: Vec<MHold>,
    waves: Vec<Wave>,
    /// Totals after each wave released, in order.
    released: Vec<u64>,
}

fn cat_id(i: u8) -> CategoryId {
    CategoryId::parse(&format!("c{i}")).expect("valid category id")
}

impl Model {
    fn total(&self) -> u64 {
        self.cats.iter().map(|c| c.total).sum()
    }

    fn cat_index(&self, id: &Option<CategoryId>) -> Option<usize> {
        match id {
            None if self.plain => Some(0),
            None => None,
            Some(_) if self.plain => None,
            Some(id) => self.cats.iter().position(|c| &c.id == id),
        }
    }

    /// Held + confirmed units of `visitor`, in category `k` or (None) all.
    fn cart(&self, visitor: &str, k: Option<usize>) -> u64 {
        self.holds
            .iter()
            .filter(|h| h.visitor == visitor && matches!(h.status, St::Held | St::Confirmed))
            .flat_map(|h| &h.items)
            .filter(|i| k.is_none_or(|k| i.category == self.cats[k].id))
            .map(|i| u64::from(i.qty))
            .sum()
    }

    /// Releases every wave due by `now`.
    fn release_due(&mut self, now: u64) {
        while self.waves.first().is_some_and(|w| w.at_ms <= now) {
            let w = self.waves.remove(0);
            if let Some(k) = self.cat_index(&w.category) {
                self.cats[k].total += w.qty;
                let t = self.total();
                self.released.push(t);
            }
        }
    }

    /// What a hold must answer (`None`: a new hold). Plain holds carry one
    /// pseudo-item of the only "category".
    fn expect_hold(&self, visitor: &str, items: &[Item]) -> Option<HoldOutcome> {
        if !self.plain {
            if let Some(c) = crate::types::duplicate_category(items) {
                return Some(HoldOutcome::DuplicateCategory {
                    category: c.to_string(),
                });
            }
            if let Some(i) = items
                .iter()
                .find(|i| !self.cats.iter().any(|c| c.id == i.category))
            {
                return Some(HoldOutcome::CategoryNotFound {
                    category: i.category.to_string(),
                });
            }
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
        if self.plain {
            let a = self.cats[0].available();
            return (a < sum).then_some(HoldOutcome::SoldOut { available: a });
        }
        for i in items {
            let k = self.cats.iter().position(|c| c.id == i.category)?;
            if let Some(climit) = self.cats[k].limit {
                let have = self.cart(visitor, Some(k));
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
            let c = self.cats.iter().find(|c| c.id == i.category)?;
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
            let k = self.item_cat(i);
            self.cats[k].held += u64::from(i.qty);
        }
    }

    fn item_cat(&self, i: &Item) -> usize {
        if self.plain {
            0
        } else {
            self.cats
                .iter()
                .position(|c| c.id == i.category)
                .expect("known category")
        }
    }

    fn end(&mut self, h: usize, to: St) {
        let items = self.holds[h].items.clone();
        for i in &items {
            let k = self.item_cat(i);
            let c = &mut self.cats[k];
            c.held -= u64::from(i.qty);
            if to == St::Confirmed {
                c.confirmed += u64::from(i.qty);
            }
        }
        self.holds[h].status = to;
    }

    /// What replacing the schedule with `waves` (sorted) answers at `now`.
    fn expect_schedule(&self, waves: &[Wave], now: u64) -> Option<ScheduleOutcome> {
        if let Some(reason) = crate::types::waves_problem(waves) {
            return Some(ScheduleOutcome::Invalid { reason });
        }
        for w in waves {
            if w.at_ms <= now {
                return Some(ScheduleOutcome::WaveInPast {
                    at_ms: w.at_ms,
                    now_ms: now,
                });
            }
            match &w.category {
                None if !self.plain => {
                    return Some(ScheduleOutcome::Invalid {
                        reason: "a wave of an event with categories names its category",
                    });
                }
                Some(c) if self.cat_index(&w.category).is_none() => {
                    return Some(ScheduleOutcome::CategoryNotFound {
                        category: c.to_string(),
                    });
                }
                _ => {}
            }
        }
        None
    }
}

impl Harness {
    /// Moves time to `at_ms` plus a margin (nothing when already past).
    pub async fn advance_past(&self, at_ms: u64) {
        let now = self.now_ms();
        let target = at_ms + 40;
        if target > now {
            self.advance(Duration::from_millis(target - now)).await;
        }
    }
}

/// Moves time past `at_ms` and past every open hold's deadline (so the
/// model never has to guess which side of a deadline an operation ran
/// on); every held hold of the model lapses.
async fn pass_wave(h: &Harness, m: &mut Model, at_ms: u64) {
    let now = h.now_ms();
    let ttl = u64::try_from(h.short_ttl.as_millis()).unwrap_or(u64::MAX);
    h.advance_past(at_ms.max(now + ttl + 110)).await;
    for k in 0..m.holds.len() {
        if m.holds[k].status == St::Held {
            m.end(k, St::Expired);
        }
    }
}

/// The gap between waves of a case: long enough that a few operations
/// never reach a wave by accident where time is real.
fn gap_ms(h: &Harness) -> u64 {
    if h.virtual_time() { 60_000 } else { 600 }
}

/// Runs one case against `h`'s store; `Err` describes the first
/// disagreement or broken invariant.
pub async fn run_wave_case(h: &Harness, case: &WaveCase, ops: &[WaveOp]) -> Result<(), String> {
    let ev = h.event("wave");
    let mut m = Model {
        plain: case.plain,
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
            })
            .collect(),
        cart_limit: case.cart_limit,
        holds: Vec::new(),
        waves: Vec::new(),
        released: Vec::new(),
    };
    let spec = StockSpec {
        total: m.total(),
        cart_limit: m.cart_limit,
        hold_ttl: h.short_ttl,
        version: 1,
        room: "default".into(),
    };
    let specs: Vec<CategorySpec> = if m.plain {
        Vec::new()
    } else {
        m.cats
            .iter()
            .map(|c| CategorySpec {
                id: c.id.clone(),
                total: c.total,
                cart_limit: c.limit,
            })
            .collect()
    };
    let out = h
        .inv
        .set_stock_with_categories(&ev, &spec, &specs)
        .await
        .map_err(|e| e.to_string())?;
    if !matches!(out, SetStockOutcome::Created { .. }) {
        return Err(format!("create: {out:?}"));
    }
    let mut payment = 0u32;
    for (step, op) in ops.iter().enumerate() {
        // No operation runs near a wave's time: move past it first.
        if let Some(at) = m.waves.first().map(|w| w.at_ms)
            && at <= h.now_ms() + NEAR_MS
        {
            pass_wave(h, &mut m, at).await;
        }
        m.release_due(h.now_ms());
        step_once(h, &ev, &mut m, op, &mut payment)
            .await
            .map_err(|e| format!("step {step} {op:?}: {e}"))?;
        m.release_due(h.now_ms());
        check_state(h, &ev, &m)
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
    op: &WaveOp,
    payment: &mut u32,
) -> Result<(), String> {
    let visitor = |v: u8| format!("v{v}");
    match op {
        WaveOp::Hold { visitor: v, items } => {
            let items: Vec<Item> = items
                .iter()
                .map(|(c, q)| Item {
                    category: cat_id(*c),
                    qty: *q,
                })
                .collect();
            let (items, got) = if m.plain {
                let qty: u32 = items.iter().map(|i| i.qty).sum();
                let items = vec![Item {
                    category: cat_id(0),
                    qty,
                }];
                let got = h.inv.hold(ev, &visitor(*v), qty, None).await;
                (items, got)
            } else {
                let got = h.inv.hold_items(ev, &visitor(*v), &items, None).await;
                (items, got)
            };
            let got = got.map_err(|e| e.to_string())?;
            match (m.expect_hold(&visitor(*v), &items), got) {
                (None, HoldOutcome::Held(view)) => {
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
                (e, g) => return Err(format!("hold: expected {e:?}, got {g:?}")),
            }
        }
        WaveOp::Release(i) => {
            if m.holds.is_empty() {
                return Ok(());
            }
            let k = usize::from(*i) % m.holds.len();
            let status = m.holds[k].status;
            let expected = match status {
                St::Held => ReleaseOutcome::Released,
                St::Confirmed => ReleaseOutcome::Confirmed,
                St::Released => ReleaseOutcome::AlreadyReleased,
                St::Expired => ReleaseOutcome::Expired,
            };
            let mh = &m.holds[k];
            let record = kept(h, mh.status, mh.deadline_ms, mh.released_ms, h.now_ms());
            let got = h
                .inv
                .release(&m.holds[k].id, &m.holds[k].visitor)
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
        WaveOp::Pay { hold, succeeded } => {
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
            let record = kept(h, mh.status, mh.deadline_ms, mh.released_ms, h.now_ms());
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
        WaveOp::Expire => {
            // Stop short of a wave: its time is NextWave's to pass.
            let by = h.short_ttl + Duration::from_millis(150);
            h.advance(by).await;
            for k in 0..m.holds.len() {
                if m.holds[k].status == St::Held {
                    m.end(k, St::Expired);
                }
            }
        }
        WaveOp::Schedule(list) => {
            let now = h.now_ms();
            let gap = gap_ms(h);
            let waves: Vec<Wave> = list
                .iter()
                .map(|(c, qty, slot)| Wave {
                    at_ms: if *slot == 255 {
                        now - 1
                    } else {
                        now + gap * (u64::from(*slot) + 1)
                    },
                    qty: *qty,
                    category: (!m.plain || *c == UNKNOWN).then(|| cat_id(*c)),
                })
                .collect();
            let mut sorted = waves.clone();
            sorted.sort();
            let got = h
                .inv
                .schedule_waves(ev, &waves)
                .await
                .map_err(|e| e.to_string())?;
            let expected = m.expect_schedule(&sorted, now);
            match (expected, got) {
                (None, ScheduleOutcome::Scheduled { waves }) if waves == sorted => {
                    m.waves = sorted;
                }
                // The store's clock is a few ms past the driver's: only
                // the shape of a refusal for a wave in the past is compared.
                (
                    Some(ScheduleOutcome::WaveInPast { at_ms, .. }),
                    ScheduleOutcome::WaveInPast { at_ms: got, .. },
                ) if at_ms == got => {}
                (Some(e), g) if e == g => {}
                (e, g) => return Err(format!("schedule: expected {e:?}, got {g:?}")),
            }
        }
        WaveOp::NextWave => {
            if let Some(at) = m.waves.first().map(|w| w.at_ms) {
                pass_wave(h, m, at).await;
            }
        }
        WaveOp::Read => {
            h.inv.read(ev).await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The store's counters and schedule equal the model's; every invariant
/// holds.
async fn check_state(h: &Harness, ev: &EventId, m: &Model) -> Result<(), String> {
    let s = h
        .inv
        .read(ev)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("event gone")?;
    if !s.invariant_holds {
        return Err(format!("invariant broken: {s:?}"));
    }
    let avail = s.available.ok_or("not ready")?;
    if avail + s.held + s.confirmed != s.total || s.total != m.total() {
        return Err(format!("event counters {s:?}, model total {}", m.total()));
    }
    if m.plain {
        let c = &m.cats[0];
        if (avail, s.held, s.confirmed) != (c.available(), c.held, c.confirmed) {
            return Err(format!(
                "counters: store {s:?}, model {:?}",
                (c.total, c.available(), c.held, c.confirmed)
            ));
        }
    } else {
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
    }
    if s.waves != m.waves {
        return Err(format!("waves: store {:?}, model {:?}", s.waves, m.waves));
    }
    for v in 0..3 {
        let visitor = format!("v{v}");
        if m.cart(&visitor, None) > u64::from(m.cart_limit) {
            return Err(format!("{visitor} over the event's cart limit"));
        }
        for (k, c) in m.cats.iter().enumerate() {
            if c.limit
                .is_some_and(|l| m.cart(&visitor, Some(k)) > u64::from(l))
            {
                return Err(format!("{visitor} over {}'s cart limit", c.id));
            }
        }
    }
    Ok(())
}

/// One `stock` entry `reason=wave` per wave released, in order, each
/// with the total after it.
async fn check_stream(h: &Harness, ev: &EventId, m: &Model) -> Result<(), String> {
    let log = h.history(ev, 100_000).await?;
    let totals: Vec<u64> = log
        .iter()
        .filter(|t| t.kind == TransitionKind::Stock && t.reason.as_deref() == Some("wave"))
        .map(|t| t.qty)
        .collect();
    if totals != m.released {
        return Err(format!(
            "wave entries: stream {totals:?}, model {:?}",
            m.released
        ));
    }
    Ok(())
}

/// The refusals of `schedule_waves`, each changing nothing; a wave in
/// the future is pending, not on sale, and a due one is on sale for the
/// next hold whether or not a reader or reaper came by.
pub async fn schedule_refusals_and_lazy_release(h: &Harness) {
    let ev = h.event("wavebad");
    let c = |s: &str| CategoryId::parse(s).unwrap();
    let spec = StockSpec {
        total: 0,
        cart_limit: 4,
        hold_ttl: Duration::from_secs(3600),
        version: 1,
        room: "default".into(),
    };
    let cats = [CategorySpec {
        id: c("floor"),
        total: 1,
        cart_limit: None,
    }];
    let missing = h.event("wavenone");
    assert_eq!(
        h.inv.schedule_waves(&missing, &[]).await.unwrap(),
        ScheduleOutcome::NotReady
    );
    h.inv
        .set_stock_with_categories(&ev, &spec, &cats)
        .await
        .unwrap();
    let now = h.now_ms();
    let gap = gap_ms(h) * 2;
    let wave = |at: u64, qty: u64, cat: Option<&str>| Wave {
        at_ms: at,
        qty,
        category: cat.map(c),
    };
    let good = wave(now + gap, 5, Some("floor"));
    for (bad, want) in [
        (wave(now + gap, 0, Some("floor")), "invalid"),
        (wave(now.saturating_sub(1000), 5, Some("floor")), "past"),
        (wave(now + gap, 5, Some("vip")), "category"),
        (wave(now + gap, 5, None), "invalid"),
        (wave(now + gap, crate::MAX_TOTAL, Some("floor")), "invalid"),
    ] {
        let out = h
            .inv
            .schedule_waves(&ev, &[good.clone(), bad.clone()])
            .await
            .unwrap();
        let ok = match want {
            "invalid" => matches!(out, ScheduleOutcome::Invalid { .. }),
            "past" => {
                matches!(out, ScheduleOutcome::WaveInPast { at_ms, .. } if at_ms == bad.at_ms)
            }
            _ => {
                matches!(out, ScheduleOutcome::CategoryNotFound { ref category } if category == "vip")
            }
        };
        assert!(ok, "{bad:?}: {out:?}");
        // Nothing partially applied.
        let s = h.inv.read(&ev).await.unwrap().unwrap();
        assert!(s.waves.is_empty(), "{s:?}");
    }
    let out = h
        .inv
        .schedule_waves(&ev, std::slice::from_ref(&good))
        .await
        .unwrap();
    assert_eq!(
        out,
        ScheduleOutcome::Scheduled {
            waves: vec![good.clone()]
        }
    );
    let item = |q| {
        vec![Item {
            category: c("floor"),
            qty: q,
        }]
    };
    assert!(matches!(
        h.inv.hold_items(&ev, "a", &item(1), None).await.unwrap(),
        HoldOutcome::Held(_)
    ));
    assert_eq!(
        h.inv.hold_items(&ev, "b", &item(1), None).await.unwrap(),
        HoldOutcome::CategorySoldOut {
            category: "floor".into(),
            available: 0
        }
    );
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert_eq!(
        (s.next_wave_at_ms(), s.next_wave_qty(), s.pending_waves()),
        (Some(good.at_ms), 5, 1)
    );
    // Time passes the wave; the very next operation is a hold: it sees
    // the wave's units although no reader or reaper came by.
    h.advance_past(good.at_ms).await;
    assert!(matches!(
        h.inv.hold_items(&ev, "b", &item(4), None).await.unwrap(),
        HoldOutcome::Held(_)
    ));
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert_eq!((s.total, s.available, s.held), (6, Some(1), 5));
    assert!(s.invariant_holds && s.waves.is_empty(), "{s:?}");
    let log = h.inv.recent_transitions(&ev, 100).await.unwrap();
    let entries: Vec<_> = log
        .iter()
        .filter(|t| t.kind == TransitionKind::Stock && t.reason.is_some())
        .collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[0].reason.as_deref(), Some("waves"));
    assert_eq!(entries[0].waves, vec![good.clone()]);
    assert_eq!(entries[1].reason.as_deref(), Some("wave"));
    assert_eq!(entries[1].qty, 6);
    assert!(entries[1].waves.is_empty());
    assert_eq!(entries[1].categories[0].total, 6);
    // Replacing the schedule with nothing clears it.
    let later = wave(h.now_ms() + gap, 2, Some("floor"));
    h.inv.schedule_waves(&ev, &[later]).await.unwrap();
    assert_eq!(
        h.inv.schedule_waves(&ev, &[]).await.unwrap(),
        ScheduleOutcome::Scheduled { waves: vec![] }
    );
    assert!(h.inv.read(&ev).await.unwrap().unwrap().waves.is_empty());
}

/// Many tasks (holds, reads, reaps) race across a due wave: it is applied
/// exactly once (one `reason=wave` entry, the total raised once), and no
/// unit is sold twice.
pub async fn racing_callers_release_a_wave_once(h: &Harness) {
    let ev = h.event("waverace");
    let spec = StockSpec {
        total: 0,
        cart_limit: 1_000,
        hold_ttl: Duration::from_secs(60),
        version: 1,
        room: "default".into(),
    };
    h.inv.set_stock(&ev, &spec).await.unwrap();
    let at = h.now_ms() + 300;
    let waves = [
        Wave {
            at_ms: at,
            qty: 50,
            category: None,
        },
        Wave {
            at_ms: at + 1,
            qty: 7,
            category: None,
        },
    ];
    assert!(matches!(
        h.inv.schedule_waves(&ev, &waves).await.unwrap(),
        ScheduleOutcome::Scheduled { .. }
    ));
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let inv = h.inv.clone();
        let ev = ev.clone();
        let clock = match &h.time {
            TimeControl::Manual(c) => Some(c.clone()),
            TimeControl::Real => None,
        };
        tasks.push(tokio::spawn(async move {
            let mut held = 0u64;
            for i in 0..200u32 {
                match (t + i) % 3 {
                    0 => {
                        if let HoldOutcome::Held(v) =
                            inv.hold(&ev, &format!("t{t}"), 1, None).await.unwrap()
                        {
                            held += u64::from(v.qty);
                        }
                    }
                    1 => {
                        inv.read(&ev).await.unwrap();
                    }
                    _ => {
                        inv.reap(&ev, 100).await.unwrap();
                    }
                }
                match &clock {
                    // Virtual time: one task moves it past the wave
                    // halfway through, while the others keep going.
                    Some(c) => {
                        if t == 0 && i == 100 {
                            c.advance(Duration::from_millis(400));
                        }
                        tokio::task::yield_now().await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(3)).await,
                }
            }
            held
        }));
    }
    let mut held = 0;
    for t in tasks {
        held += t.await.unwrap();
    }
    h.advance_past(at + 1).await;
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert!(s.invariant_holds, "{s:?}");
    assert_eq!(s.total, 57, "{s:?}");
    assert_eq!(s.held, held, "{s:?}");
    assert!(held <= 57);
    let log = h.inv.recent_transitions(&ev, 100_000).await.unwrap();
    let totals: Vec<u64> = log
        .iter()
        .filter(|t| t.reason.as_deref() == Some("wave"))
        .map(|t| t.qty)
        .collect();
    assert_eq!(totals, vec![50, 57]);
}

/// A due wave is on sale for the very next hold of a bare qty (an event
/// without categories), although no reader or reaper came by: the hold
/// compares qty with the stock counter after releasing the wave, never
/// with the counter it read before (hold.lua reuses its first read only
/// when nothing moved the counter since).
pub async fn a_due_wave_is_on_sale_for_a_bare_hold(h: &Harness) {
    let ev = h.event("wavebare");
    h.stock(&ev, 1, 4, Duration::from_secs(3600)).await;
    assert!(matches!(
        h.inv.hold(&ev, "a", 1, None).await.unwrap(),
        HoldOutcome::Held(_)
    ));
    let at_ms = h.now_ms() + gap_ms(h);
    let wave = Wave {
        at_ms,
        qty: 3,
        category: None,
    };
    assert_eq!(
        h.inv
            .schedule_waves(&ev, std::slice::from_ref(&wave))
            .await
            .unwrap(),
        ScheduleOutcome::Scheduled { waves: vec![wave] }
    );
    assert_eq!(
        h.inv.hold(&ev, "b", 3, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    );
    h.advance_past(at_ms).await;
    let HoldOutcome::Held(v) = h.inv.hold(&ev, "b", 3, None).await.unwrap() else {
        panic!("the due wave's 3 units were not on sale");
    };
    assert_eq!(v.available, 0);
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert_eq!((s.total, s.available, s.held), (4, Some(0), 4));
    assert!(s.invariant_holds, "{s:?}");
}
