//! One test suite for every [`Inventory`] (feature `test-util`).
//!
//! Each `pub async fn` here is a test: it takes a [`Harness`] (the store
//! under test plus a way to move time) and panics on a violation. The
//! memory store runs them in `tests/memory.rs` with a [`ManualClock`]; the
//! Redis store in `tests/redis.rs` against a real `redis-server`, where time
//! is real and TTLs are short. [`model`] holds the plain model the property
//! tests compare both stores against.
//!
//! Every test works on fresh event ids ([`Harness::event`]), so tests may
//! share a store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod categories;
pub mod category_loss;
pub mod feeds;
mod losing;
pub mod loss;
pub mod model;
mod retained;
pub mod shards;
pub mod waves;

pub use category_loss::{
    restore_with_categories_puts_back_each_tier, restore_with_categories_refuses_inexact_records,
};
pub use feeds::{feed_categories, feed_deltas_and_snapshots, feed_race};
pub use losing::{
    sharded_a_buyer_who_always_loses,
    sharded_a_transfer_in_flight_lands_for_a_buyer_past_its_patience,
};
pub use shards::{
    sharded_reshard_only_when_idle, sharded_routing_and_refusals, sharded_stock_changes,
    sharded_transfer_cut_in_half_lands_once,
};
pub use waves::{
    a_due_wave_is_on_sale_for_a_bare_hold, racing_callers_release_a_wave_once,
    schedule_refusals_and_lazy_release,
};

pub use loss::{
    load_only_into_a_store_that_never_had_the_event,
    restore_of_an_inconsistent_record_sells_nothing, restore_refused_when_present_or_invalid,
    restore_then_hold_confirm_release, restored_lapsed_holds_return_once,
};

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::{
    ConfirmOutcome, EventId, HoldId, HoldOutcome, HoldStatus, Inventory, InventoryBackend,
    ManualClock, MemoryInventory, ReleaseOutcome, Retention, SetStockOutcome, StockSpec,
    TransitionKind,
};

/// How a test moves time.
#[derive(Clone)]
pub enum TimeControl {
    /// The store runs on this clock: advancing is instant.
    Manual(Arc<ManualClock>),
    /// The store's own clock (Redis `TIME`): advancing sleeps.
    Real,
}

/// The store under test.
pub struct Harness {
    /// The store.
    pub inv: InventoryBackend,
    /// How to move its time.
    pub time: TimeControl,
    /// A hold TTL for expiry tests: long enough that a burst of operations
    /// finishes well inside it, short enough to wait for in real time.
    pub short_ttl: Duration,
    /// The retention the store was built with (the retention tests wait
    /// for it: keep it short where time is real).
    pub retention: Retention,
    /// Run by the property drivers after every step's own checks (see
    /// [`Harness::with_step_check`]).
    step_check: Option<StepCheck>,
    /// Where the drivers read an event's history at the end of a case
    /// (see [`Harness::with_history`]); `None`: the store's own stream.
    history: Option<HistorySource>,
    _guard: Option<Box<dyn Any + Send + Sync>>,
}

/// An event's transitions, oldest first, from somewhere other than the
/// store's stream (e.g. the ledger's table, when a ledger consumes and
/// trims the stream).
pub type HistorySource = Arc<
    dyn Fn(
            EventId,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Vec<crate::Transition>, String>> + Send>,
        > + Send
        + Sync,
>;

/// A check run after every step of a property driver, given the event:
/// e.g. that a ledger fed by the store's stream agrees with the store.
pub type StepCheck = Arc<
    dyn Fn(
            EventId,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

static EVENT_SEQ: AtomicU64 = AtomicU64::new(0);

impl Harness {
    /// A memory store on a manual clock.
    pub fn memory() -> Self {
        let clock = Arc::new(ManualClock::default());
        let inv = MemoryInventory::with_clock(clock.clone());
        Self::new(
            InventoryBackend::Memory(inv),
            TimeControl::Manual(clock),
            Duration::from_secs(60),
        )
    }

    /// A harness over any store.
    pub fn new(inv: InventoryBackend, time: TimeControl, short_ttl: Duration) -> Self {
        Self {
            inv,
            time,
            short_ttl,
            retention: Retention::default(),
            step_check: None,
            history: None,
            _guard: None,
        }
    }

    /// Adds a check the property drivers (categories, waves) run after
    /// every step, once the store itself was checked against the model.
    pub fn with_step_check(mut self, check: StepCheck) -> Self {
        self.step_check = Some(check);
        self
    }

    /// Makes the property drivers check each hold's transitions, at the
    /// end of a case, in `history` instead of the store's stream (which a
    /// ledger trims as it goes).
    pub fn with_history(mut self, history: HistorySource) -> Self {
        self.history = Some(history);
        self
    }

    /// The last `n` transitions of `event`, oldest first: from the
    /// history source when there is one, else the store's stream.
    pub async fn history(
        &self,
        event: &EventId,
        n: usize,
    ) -> Result<Vec<crate::Transition>, String> {
        match &self.history {
            Some(h) => {
                let mut all = h(event.clone()).await?;
                let skip = all.len().saturating_sub(n);
                all.drain(..skip);
                Ok(all)
            }
            None => self
                .inv
                .recent_transitions(event, n)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Runs the step check, when there is one.
    pub async fn step_check(&self, event: &EventId) -> Result<(), String> {
        match &self.step_check {
            Some(check) => check(event.clone()).await,
            None => Ok(()),
        }
    }

    /// Records the retention the store was built with.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Keeps `guard` (e.g. the test's `redis-server`) alive as long as the
    /// harness.
    pub fn with_guard(mut self, guard: impl Any + Send + Sync) -> Self {
        self._guard = Some(Box::new(guard));
        self
    }

    /// Moves the store's time forward (sleeps when time is real).
    pub async fn advance(&self, by: Duration) {
        match &self.time {
            TimeControl::Manual(c) => c.advance(by),
            TimeControl::Real => tokio::time::sleep(by).await,
        }
    }

    /// Whether time is virtual (memory).
    pub fn virtual_time(&self) -> bool {
        matches!(self.time, TimeControl::Manual(_))
    }

    /// A fresh event id, unique in this process and across runs.
    pub fn event(&self, name: &str) -> EventId {
        let n = EVENT_SEQ.fetch_add(1, Ordering::Relaxed);
        let r: u32 = rand::random();
        EventId::parse(&format!("{name}-{n}-{r:08x}")).expect("valid event id")
    }

    /// Creates `event` with the given stock (version 1, room `default`).
    pub async fn stock(&self, event: &EventId, total: u64, cart_limit: u32, ttl: Duration) {
        let out = self
            .inv
            .set_stock(event, &spec(total, cart_limit, ttl, 1))
            .await
            .unwrap();
        assert!(matches!(out, SetStockOutcome::Created { .. }), "{out:?}");
    }

    /// `(available, held, confirmed)` as stored, without reaping (see
    /// `stored_counters` of each store).
    pub async fn stored_counts(&self, event: &EventId) -> Option<(u64, u64, u64)> {
        match &self.inv {
            InventoryBackend::Memory(m) => m.stored_counters(event),
            InventoryBackend::Redis(r) => r.stored_counters(event).await.unwrap(),
        }
    }

    /// The status of a hold its owner can see.
    ///
    /// Panics when the owner cannot see it (forgotten, or never there).
    pub async fn status(&self, hold: &HoldId, visitor: &str) -> HoldStatus {
        self.inv
            .get_hold(hold, visitor)
            .await
            .unwrap()
            .expect("the owner sees the hold")
            .status
    }

    /// Reads the event and asserts the invariant; returns
    /// (available, held, confirmed).
    pub async fn counts(&self, event: &EventId) -> (u64, u64, u64) {
        let s = self.inv.read(event).await.unwrap().expect("event exists");
        assert!(s.invariant_holds, "invariant broken: {s:?}");
        (s.available.unwrap(), s.held, s.confirmed)
    }
}

/// A spec with room `default`.
pub fn spec(total: u64, cart_limit: u32, hold_ttl: Duration, version: u64) -> StockSpec {
    StockSpec {
        total,
        cart_limit,
        hold_ttl,
        version,
        room: "default".into(),
    }
}

fn held(out: HoldOutcome) -> crate::HoldView {
    match out {
        HoldOutcome::Held(v) => v,
        other => panic!("expected Held, got {other:?}"),
    }
}

// === the suite ===

/// Versioned stock sync: create, stale versions refused, updates keep the
/// invariant, totals below what is committed are refused.
pub async fn set_stock_versions(h: &Harness) {
    let ev = h.event("stock");
    let ttl = Duration::from_secs(600);
    assert_eq!(h.inv.read(&ev).await.unwrap(), None);
    assert_eq!(
        h.inv.set_stock(&ev, &spec(10, 4, ttl, 5)).await.unwrap(),
        SetStockOutcome::Created { available: 10 }
    );
    for v in [5, 4, 0] {
        assert_eq!(
            h.inv.set_stock(&ev, &spec(99, 4, ttl, v)).await.unwrap(),
            SetStockOutcome::Stale { current_version: 5 }
        );
    }
    assert!(h.inv.events().await.unwrap().contains(&ev));
    let v = held(h.inv.hold(&ev, "alice", 3, None).await.unwrap());
    assert_eq!(v.available, 7);
    assert_eq!(
        h.inv.confirm(&v.hold_id, "p1", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    held(h.inv.hold(&ev, "bob", 2, None).await.unwrap());
    assert_eq!(h.counts(&ev).await, (5, 2, 3));
    // Lower the total: available follows, held and confirmed stay.
    assert_eq!(
        h.inv.set_stock(&ev, &spec(6, 2, ttl, 6)).await.unwrap(),
        SetStockOutcome::Updated { available: 1 }
    );
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert_eq!(
        (s.total, s.available, s.held, s.confirmed),
        (6, Some(1), 2, 3)
    );
    assert_eq!((s.version, s.cart_limit, s.hold_ttl_secs), (6, 2, 600));
    assert!(s.invariant_holds && s.ready());
    // Below held + confirmed: refused, nothing changed.
    assert_eq!(
        h.inv.set_stock(&ev, &spec(4, 4, ttl, 7)).await.unwrap(),
        SetStockOutcome::BelowCommitted {
            held: 2,
            confirmed: 3
        }
    );
    assert_eq!(h.counts(&ev).await, (1, 2, 3));
    assert_eq!(h.inv.read(&ev).await.unwrap().unwrap().version, 6);
    // Exactly committed is fine: nothing left to sell.
    assert_eq!(
        h.inv.set_stock(&ev, &spec(5, 4, ttl, 8)).await.unwrap(),
        SetStockOutcome::Updated { available: 0 }
    );
    assert!(matches!(
        h.inv.hold(&ev, "carol", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    ));
    // Unusable specs.
    for bad in [spec(5, 0, ttl, 9), spec(5, 1, Duration::ZERO, 9)] {
        assert!(matches!(
            h.inv.set_stock(&ev, &bad).await.unwrap(),
            SetStockOutcome::Invalid { .. }
        ));
    }
    // u64 versions compare exactly, beyond 2^53.
    let big = (1u64 << 60) + 1;
    assert!(matches!(
        h.inv.set_stock(&ev, &spec(5, 4, ttl, big)).await.unwrap(),
        SetStockOutcome::Updated { .. }
    ));
    assert_eq!(
        h.inv
            .set_stock(&ev, &spec(5, 4, ttl, big - 1))
            .await
            .unwrap(),
        SetStockOutcome::Stale {
            current_version: big
        }
    );
    let kinds: Vec<_> = h
        .inv
        .recent_transitions(&ev, 100)
        .await
        .unwrap()
        .iter()
        .map(|t| t.kind)
        .collect();
    assert_eq!(kinds.first(), Some(&TransitionKind::Stock));
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == TransitionKind::Stock)
            .count(),
        4
    );
}

/// Counters stay exact up to [`crate::MAX_TOTAL`] (2^53); above is refused.
pub async fn big_numbers(h: &Harness) {
    let ev = h.event("big");
    let max = crate::MAX_TOTAL;
    let ttl = Duration::from_secs(600);
    assert_eq!(
        h.inv.set_stock(&ev, &spec(max, 4, ttl, 1)).await.unwrap(),
        SetStockOutcome::Created { available: max }
    );
    let v = held(h.inv.hold(&ev, "alice", 3, None).await.unwrap());
    assert_eq!(v.available, max - 3);
    assert_eq!(
        h.inv.confirm(&v.hold_id, "p", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    held(h.inv.hold(&ev, "bob", 1, None).await.unwrap());
    assert_eq!(h.counts(&ev).await, (max - 4, 1, 3));
    assert_eq!(
        h.inv
            .set_stock(&ev, &spec(max - 1, 4, ttl, 2))
            .await
            .unwrap(),
        SetStockOutcome::Updated { available: max - 5 }
    );
    assert_eq!(h.counts(&ev).await, (max - 5, 1, 3));
    assert!(matches!(
        h.inv
            .set_stock(&ev, &spec(max + 1, 4, ttl, 3))
            .await
            .unwrap(),
        SetStockOutcome::Invalid { .. }
    ));
    let last = h.inv.recent_transitions(&ev, 1).await.unwrap();
    assert_eq!(
        (last[0].kind, last[0].qty),
        (TransitionKind::Stock, max - 1)
    );
}

/// A hold, its view, its owner check and its stream entry.
pub async fn hold_and_get(h: &Harness) {
    let ev = h.event("hold");
    h.stock(&ev, 10, 4, Duration::from_secs(300)).await;
    let v = held(h.inv.hold(&ev, "alice", 3, None).await.unwrap());
    assert_eq!((v.qty, v.status, v.available), (3, HoldStatus::Held, 7));
    assert_eq!(v.event, ev);
    assert_eq!(v.visitor, "alice");
    assert_eq!(v.hold_id.event(), ev);
    assert_eq!(HoldId::parse(v.hold_id.as_str()), Some(v.hold_id.clone()));
    assert_eq!(v.expires_at, v.expires_at_ms / 1000);
    let got = h.inv.get_hold(&v.hold_id, "alice").await.unwrap().unwrap();
    assert_eq!(got, v);
    assert_eq!(h.inv.get_hold(&v.hold_id, "mallory").await.unwrap(), None);
    assert_eq!(h.counts(&ev).await, (7, 3, 0));
    let log = h.inv.recent_transitions(&ev, 10).await.unwrap();
    let last = log.last().unwrap();
    assert_eq!(last.kind, TransitionKind::Held);
    assert_eq!(last.hold_id, v.hold_id.as_str());
    assert_eq!(
        (last.visitor.as_str(), last.qty, last.available),
        ("alice", 3, 7)
    );
    assert_eq!(h.inv.recent_transitions(&ev, 1).await.unwrap().len(), 1);
}

/// Bad input changes nothing and answers the right outcome.
pub async fn bad_input(h: &Harness) {
    let ev = h.event("bad");
    h.stock(&ev, 10, 4, Duration::from_secs(300)).await;
    let v = held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    let before = h.inv.read(&ev).await.unwrap();
    assert_eq!(
        h.inv.hold(&ev, "bob", 0, None).await.unwrap(),
        HoldOutcome::InvalidQuantity { limit: 4 }
    );
    assert_eq!(
        h.inv.hold(&ev, "bob", 5, None).await.unwrap(),
        HoldOutcome::InvalidQuantity { limit: 4 }
    );
    assert_eq!(
        h.inv.hold(&ev, "bob", u32::MAX, Some("k")).await.unwrap(),
        HoldOutcome::InvalidQuantity { limit: 4 }
    );
    // Unknown event: not ready (the store cannot tell never-loaded from lost).
    let unknown = h.event("unknown");
    assert_eq!(
        h.inv.hold(&unknown, "bob", 1, None).await.unwrap(),
        HoldOutcome::NotReady
    );
    assert_eq!(h.inv.read(&unknown).await.unwrap(), None);
    assert_eq!(h.inv.reap(&unknown, 10).await.unwrap(), 0);
    // Another visitor's hold.
    assert_eq!(h.inv.get_hold(&v.hold_id, "bob").await.unwrap(), None);
    assert_eq!(
        h.inv.release(&v.hold_id, "bob").await.unwrap(),
        ReleaseOutcome::NotFound
    );
    // Well-formed ids of holds that do not exist, in known and unknown events.
    for id in [HoldId::generate(&ev), HoldId::generate(&unknown)] {
        assert_eq!(h.inv.get_hold(&id, "alice").await.unwrap(), None);
        assert_eq!(
            h.inv.release(&id, "alice").await.unwrap(),
            ReleaseOutcome::NotFound
        );
        assert_eq!(
            h.inv.confirm(&id, "p1", true).await.unwrap(),
            ConfirmOutcome::NotFound
        );
    }
    // Malformed ids never reach a store.
    let s = v.hold_id.suffix();
    for bad in [
        String::new(),
        "nodot".into(),
        format!("{ev}.{}", &s[..10]),
        format!("{ev}.{s}x"),
        format!("{ev}:{s}"),
        format!("{{{ev}}}.{s}"),
        format!("{ev}.{}/", &s[..21]),
    ] {
        assert_eq!(HoldId::parse(&bad), None, "{bad:?}");
    }
    assert_eq!(h.inv.read(&ev).await.unwrap(), before);
    assert_eq!(h.status(&v.hold_id, "alice").await, HoldStatus::Held);
}

/// held + confirmed + asked ≤ limit, per visitor.
pub async fn cart_limit(h: &Harness) {
    let ev = h.event("cart");
    h.stock(&ev, 100, 4, Duration::from_secs(300)).await;
    let a = held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    assert_eq!(
        h.inv.hold(&ev, "alice", 1, None).await.unwrap(),
        HoldOutcome::CartLimitExceeded { limit: 4, held: 4 }
    );
    // Others are not affected.
    held(h.inv.hold(&ev, "bob", 4, None).await.unwrap());
    // Releasing frees room; confirming keeps it counted.
    assert_eq!(
        h.inv.release(&a.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Released
    );
    let c = held(h.inv.hold(&ev, "alice", 1, None).await.unwrap());
    assert_eq!(
        h.inv.confirm(&c.hold_id, "pay-c", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        h.inv.hold(&ev, "alice", 2, None).await.unwrap(),
        HoldOutcome::CartLimitExceeded { limit: 4, held: 3 }
    );
    held(h.inv.hold(&ev, "alice", 1, None).await.unwrap());
    assert_eq!(h.counts(&ev).await, (100 - 4 - 4, 7, 1));
}

/// Stock runs out exactly; sold out reports what is left.
pub async fn sold_out(h: &Harness) {
    let ev = h.event("soldout");
    h.stock(&ev, 5, 4, Duration::from_secs(300)).await;
    held(h.inv.hold(&ev, "a", 4, None).await.unwrap());
    assert_eq!(
        h.inv.hold(&ev, "b", 2, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 1 }
    );
    let last = held(h.inv.hold(&ev, "b", 1, None).await.unwrap());
    assert_eq!(last.available, 0);
    assert_eq!(
        h.inv.hold(&ev, "c", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    );
    assert_eq!(h.counts(&ev).await, (0, 5, 0));
}

/// The same Idempotency-Key from the same visitor returns the same hold.
pub async fn idempotency(h: &Harness) {
    let ev = h.event("idem");
    h.stock(&ev, 10, 4, Duration::from_secs(300)).await;
    let first = held(h.inv.hold(&ev, "alice", 2, Some("key-1")).await.unwrap());
    for qty in [2, 1, 0] {
        match h.inv.hold(&ev, "alice", qty, Some("key-1")).await.unwrap() {
            HoldOutcome::Replayed(v) => {
                assert_eq!(v.hold_id, first.hold_id);
                assert_eq!((v.qty, v.status, v.available), (2, HoldStatus::Held, 8));
            }
            other => panic!("expected Replayed, got {other:?}"),
        }
    }
    assert_eq!(h.counts(&ev).await, (8, 2, 0));
    // Another visitor's identical key is another hold; another key too.
    let bob = held(h.inv.hold(&ev, "bob", 2, Some("key-1")).await.unwrap());
    assert_ne!(bob.hold_id, first.hold_id);
    let second = held(h.inv.hold(&ev, "alice", 1, Some("key-2")).await.unwrap());
    assert_ne!(second.hold_id, first.hold_id);
    // Keys are not confused across visitor/key boundaries.
    let x = held(h.inv.hold(&ev, "a:b", 1, Some("c")).await.unwrap());
    let y = held(h.inv.hold(&ev, "a", 1, Some("b:c")).await.unwrap());
    assert_ne!(x.hold_id, y.hold_id);
    // A replay after release shows the hold as it is now.
    assert_eq!(
        h.inv.release(&first.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Released
    );
    match h.inv.hold(&ev, "alice", 2, Some("key-1")).await.unwrap() {
        HoldOutcome::Replayed(v) => {
            assert_eq!((v.hold_id, v.status), (first.hold_id, HoldStatus::Released))
        }
        other => panic!("expected Replayed, got {other:?}"),
    }
    assert_eq!(h.counts(&ev).await, (5, 5, 0));
}

/// Concurrent requests with one Idempotency-Key make one hold.
pub async fn idempotency_concurrent(h: &Harness) {
    let ev = h.event("idemc");
    h.stock(&ev, 100, 4, Duration::from_secs(300)).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let inv = h.inv.clone();
        let ev = ev.clone();
        tasks.push(tokio::spawn(async move {
            inv.hold(&ev, "alice", 3, Some("same")).await.unwrap()
        }));
    }
    let mut ids = HashSet::new();
    let mut fresh = 0;
    for t in tasks {
        match t.await.unwrap() {
            HoldOutcome::Held(v) => {
                fresh += 1;
                ids.insert(v.hold_id);
            }
            HoldOutcome::Replayed(v) => {
                ids.insert(v.hold_id);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((fresh, ids.len()), (1, 1));
    assert_eq!(h.counts(&ev).await, (97, 3, 0));
}

/// Release: owner only, idempotent, stock back once, not after confirm.
pub async fn release(h: &Harness) {
    let ev = h.event("release");
    h.stock(&ev, 10, 4, Duration::from_secs(300)).await;
    let v = held(h.inv.hold(&ev, "alice", 3, None).await.unwrap());
    assert_eq!(
        h.inv.release(&v.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(h.counts(&ev).await, (10, 0, 0));
    for _ in 0..3 {
        assert_eq!(
            h.inv.release(&v.hold_id, "alice").await.unwrap(),
            ReleaseOutcome::AlreadyReleased
        );
    }
    assert_eq!(h.counts(&ev).await, (10, 0, 0));
    assert_eq!(h.status(&v.hold_id, "alice").await, HoldStatus::Released);
    // A payment for a released hold confirms nothing.
    assert_eq!(
        h.inv.confirm(&v.hold_id, "late", true).await.unwrap(),
        ConfirmOutcome::Released
    );
    assert_eq!(h.counts(&ev).await, (10, 0, 0));
    let log = h.inv.recent_transitions(&ev, 10).await.unwrap();
    let kinds: Vec<_> = log
        .iter()
        .filter(|t| t.hold_id == v.hold_id.as_str())
        .map(|t| (t.kind, t.qty))
        .collect();
    assert_eq!(
        kinds,
        vec![(TransitionKind::Held, 3), (TransitionKind::Released, 3)]
    );
    // Concurrent releases: exactly one wins.
    let w = held(h.inv.hold(&ev, "bob", 4, None).await.unwrap());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let inv = h.inv.clone();
        let id = w.hold_id.clone();
        tasks.push(tokio::spawn(async move {
            inv.release(&id, "bob").await.unwrap()
        }));
    }
    let mut wins = 0;
    for t in tasks {
        match t.await.unwrap() {
            ReleaseOutcome::Released => wins += 1,
            ReleaseOutcome::AlreadyReleased => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(wins, 1);
    assert_eq!(h.counts(&ev).await, (10, 0, 0));
}

/// Payment webhooks: success confirms, failure releases, repeats change
/// nothing.
pub async fn confirm(h: &Harness) {
    let ev = h.event("confirm");
    h.stock(&ev, 10, 4, Duration::from_secs(300)).await;
    let a = held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-1", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(h.counts(&ev).await, (8, 0, 2));
    for _ in 0..3 {
        assert_eq!(
            h.inv.confirm(&a.hold_id, "pay-1", true).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
    }
    // A failed payment after success leaves it confirmed; so does another
    // success.
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-2", false).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        h.inv.release(&a.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Confirmed
    );
    assert_eq!(h.counts(&ev).await, (8, 0, 2));
    // A failed payment releases a held hold; its repeat answers the same.
    let b = held(h.inv.hold(&ev, "bob", 3, None).await.unwrap());
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-3", false).await.unwrap(),
        ConfirmOutcome::Released
    );
    assert_eq!(h.counts(&ev).await, (8, 0, 2));
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-3", false).await.unwrap(),
        ConfirmOutcome::Released
    );
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-4", true).await.unwrap(),
        ConfirmOutcome::Released
    );
    assert_eq!(h.status(&b.hold_id, "bob").await, HoldStatus::Released);
    // bob's cart room is back.
    held(h.inv.hold(&ev, "bob", 4, None).await.unwrap());
    let log = h.inv.recent_transitions(&ev, 20).await.unwrap();
    let confirmed: Vec<_> = log
        .iter()
        .filter(|t| t.kind == TransitionKind::Confirmed)
        .collect();
    assert_eq!(confirmed.len(), 1);
    assert_eq!(confirmed[0].payment_event_id.as_deref(), Some("pay-1"));
    let released: Vec<_> = log
        .iter()
        .filter(|t| t.kind == TransitionKind::Released)
        .collect();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].payment_event_id.as_deref(), Some("pay-3"));
    // Concurrent deliveries of one payment event: one transition.
    let c = held(h.inv.hold(&ev, "carol", 1, None).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..16 {
        let inv = h.inv.clone();
        let id = c.hold_id.clone();
        tasks.push(tokio::spawn(async move {
            inv.confirm(&id, if i % 2 == 0 { "pay-5" } else { "pay-6" }, true)
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), ConfirmOutcome::Confirmed);
    }
    assert_eq!(h.counts(&ev).await, (3, 4, 3));
}

/// A hold past its deadline is expired for every reader at once, is never
/// confirmed, and its stock comes back exactly once.
pub async fn expiry(h: &Harness) {
    let ev = h.event("expiry");
    let ttl = h.short_ttl;
    h.stock(&ev, 10, 4, ttl).await;
    let a = held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    let b = held(h.inv.hold(&ev, "bob", 3, None).await.unwrap());
    let c = held(h.inv.hold(&ev, "carol", 4, None).await.unwrap());
    h.advance(ttl + Duration::from_millis(250)).await;
    // Before any reaper: every view says expired.
    for (v, who) in [(&a, "alice"), (&b, "bob"), (&c, "carol")] {
        assert_eq!(h.status(&v.hold_id, who).await, HoldStatus::Expired);
    }
    // Never confirmed; stock back once; the answer is recorded.
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-a", true).await.unwrap(),
        ConfirmOutcome::Expired
    );
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-a", true).await.unwrap(),
        ConfirmOutcome::Expired
    );
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-a2", true).await.unwrap(),
        ConfirmOutcome::Expired
    );
    assert_eq!(
        h.inv.release(&b.hold_id, "bob").await.unwrap(),
        ReleaseOutcome::Expired
    );
    assert_eq!(
        h.inv.release(&b.hold_id, "bob").await.unwrap(),
        ReleaseOutcome::Expired
    );
    // The reaper gets only what is left (carol's).
    assert_eq!(h.inv.reap(&ev, 100).await.unwrap(), 1);
    assert_eq!(h.inv.reap(&ev, 100).await.unwrap(), 0);
    assert_eq!(h.counts(&ev).await, (10, 0, 0));
    assert_eq!(
        h.inv.release(&c.hold_id, "carol").await.unwrap(),
        ReleaseOutcome::Expired
    );
    assert_eq!(h.counts(&ev).await, (10, 0, 0));
    let log = h.inv.recent_transitions(&ev, 100).await.unwrap();
    for v in [&a, &b, &c] {
        let kinds: Vec<_> = log
            .iter()
            .filter(|t| t.hold_id == v.hold_id.as_str())
            .map(|t| t.kind)
            .collect();
        assert_eq!(kinds, vec![TransitionKind::Held, TransitionKind::Expired]);
    }
    // Cart room came back with the stock.
    held(h.inv.hold(&ev, "carol", 4, None).await.unwrap());
}

/// A hold reaps what lapsed before deciding, so an expired hold never
/// blocks stock or a cart.
pub async fn expiry_is_seen_by_holds(h: &Harness) {
    let ev = h.event("lazy");
    let ttl = h.short_ttl;
    h.stock(&ev, 4, 4, ttl).await;
    held(h.inv.hold(&ev, "alice", 4, None).await.unwrap());
    assert_eq!(
        h.inv.hold(&ev, "bob", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    );
    h.advance(ttl + Duration::from_millis(250)).await;
    // No reaper ran: the hold itself sees the lapse.
    let v = held(h.inv.hold(&ev, "alice", 4, None).await.unwrap());
    assert_eq!(v.available, 0);
    assert_eq!(h.counts(&ev).await, (0, 4, 0));
    assert_eq!(h.inv.reap(&ev, 10).await.unwrap(), 0);
}

/// More lapsed holds than one lazy reap takes ([`crate::LAZY_REAP_MAX`]):
/// a hold past its deadline counts as expired for every answer at once.
/// A hold is never refused (cart limit, sold out) while lapsed holds would
/// free the room or the units, and a read counts every lapsed hold as
/// expired, whether a reaper came by or not.
pub async fn many_lapsed_holds(h: &Harness) {
    let ttl = h.short_ttl;
    let lazy = crate::LAZY_REAP_MAX;
    // 150 visitors hold one unit each (the oldest deadlines), then alice
    // holds 50 units in 50 holds (the newest): 200 holds, sold out.
    let ev = h.event("lapsed");
    h.stock(&ev, 200, 100, ttl).await;
    for i in 0..150 {
        held(h.inv.hold(&ev, &format!("v{i}"), 1, None).await.unwrap());
    }
    h.advance(Duration::from_millis(5)).await;
    for _ in 0..50 {
        held(h.inv.hold(&ev, "alice", 1, None).await.unwrap());
    }
    assert_eq!(h.counts(&ev).await, (0, 200, 0));
    assert_eq!(
        h.inv.hold(&ev, "bob", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    );
    h.advance(ttl + Duration::from_millis(250)).await;
    // No reaper ran. Alice's 50 lapsed holds are not among the oldest
    // LAZY_REAP_MAX: they still must not count against her cart.
    assert!(2 * lazy < 150 && lazy + 50 >= 100);
    let a = held(h.inv.hold(&ev, "alice", 100, None).await.unwrap());
    assert_eq!(a.available, lazy as u64 + 50 - 100);
    // 150 - 2 × LAZY_REAP_MAX lapsed holds are left after bob's lazy reap:
    // he gets his 100 units only if those are expired too.
    let b = held(h.inv.hold(&ev, "bob", 100, None).await.unwrap());
    assert_eq!(b.available, 0);
    assert_eq!(h.stored_counts(&ev).await, Some((0, 200, 0)));
    assert_eq!(h.counts(&ev).await, (0, 200, 0));
    let expired = h
        .inv
        .recent_transitions(&ev, 10_000)
        .await
        .unwrap()
        .iter()
        .filter(|t| t.kind == TransitionKind::Expired)
        .count();
    assert_eq!(expired, 200);
    assert_eq!(h.inv.reap(&ev, 10_000).await.unwrap(), 0);

    // A read after more than two lazy reaps' worth of lapses: every lapsed
    // hold counted as expired, and the stored counters agree afterwards.
    let ev = h.event("lapsedread");
    let n = 2 * lazy as u64 + 10;
    h.stock(&ev, n, 4, ttl).await;
    for i in 0..n {
        held(h.inv.hold(&ev, &format!("v{i}"), 1, None).await.unwrap());
    }
    assert_eq!(h.stored_counts(&ev).await, Some((0, n, 0)));
    h.advance(ttl + Duration::from_millis(250)).await;
    assert_eq!(
        h.stored_counts(&ev).await,
        Some((0, n, 0)),
        "nothing reaped yet"
    );
    assert_eq!(h.counts(&ev).await, (n, 0, 0));
    assert_eq!(h.stored_counts(&ev).await, Some((n, 0, 0)));
    assert_eq!(h.inv.reap(&ev, 10_000).await.unwrap(), 0);
}

/// A payment event id belongs to one hold: the same id for another hold is
/// refused and changes nothing; for its own hold it replays.
pub async fn payment_reused(h: &Harness) {
    let ev = h.event("payreuse");
    h.stock(&ev, 10, 4, Duration::from_secs(300)).await;
    let a = held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    let b = held(h.inv.hold(&ev, "bob", 3, None).await.unwrap());
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-1", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    for succeeded in [true, false] {
        assert_eq!(
            h.inv.confirm(&b.hold_id, "pay-1", succeeded).await.unwrap(),
            ConfirmOutcome::PaymentReused
        );
    }
    assert_eq!(h.counts(&ev).await, (5, 3, 2));
    assert_eq!(h.status(&b.hold_id, "bob").await, HoldStatus::Held);
    // Its own hold: the recorded answer.
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-1", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    // A failed payment's id is taken as well.
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-2", false).await.unwrap(),
        ConfirmOutcome::Released
    );
    let c = held(h.inv.hold(&ev, "carol", 1, None).await.unwrap());
    assert_eq!(
        h.inv.confirm(&c.hold_id, "pay-2", true).await.unwrap(),
        ConfirmOutcome::PaymentReused
    );
    assert_eq!(h.counts(&ev).await, (7, 1, 2));
    let confirmed = h
        .inv
        .recent_transitions(&ev, 100)
        .await
        .unwrap()
        .iter()
        .filter(|t| t.kind == TransitionKind::Confirmed)
        .count();
    assert_eq!(confirmed, 1);
}

/// Many reapers at once: each expired hold is returned exactly once.
pub async fn concurrent_reapers(h: &Harness) {
    let ev = h.event("reapers");
    let ttl = h.short_ttl;
    h.stock(&ev, 1000, 4, ttl).await;
    let mut qty_total = 0u64;
    for i in 0..200u32 {
        let q = i % 4 + 1;
        qty_total += u64::from(q);
        held(h.inv.hold(&ev, &format!("v{i}"), q, None).await.unwrap());
    }
    assert_eq!(h.counts(&ev).await, (1000 - qty_total, qty_total, 0));
    h.advance(ttl + Duration::from_millis(250)).await;
    let reaped = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let inv = h.inv.clone();
        let ev = ev.clone();
        let reaped = reaped.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let n = inv.reap(&ev, 7).await.unwrap();
                if n == 0 {
                    break;
                }
                reaped.fetch_add(n, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(reaped.load(Ordering::SeqCst), 200);
    assert_eq!(h.counts(&ev).await, (1000, 0, 0));
    let expired = h
        .inv
        .recent_transitions(&ev, 1000)
        .await
        .unwrap()
        .iter()
        .filter(|t| t.kind == TransitionKind::Expired)
        .count();
    assert_eq!(expired, 200);
    assert_eq!(h.inv.reap_all(100).await.unwrap(), 0);
}

/// Released and expired holds are kept for the released retention (from
/// the release, or from the deadline of a hold that lapsed), then forgotten
/// by every operation at once: the owner's view, a second release and a
/// late webhook answer "no such hold", while the counters, the cart count
/// and a confirmed hold of the same moment stay. An `Idempotency-Key`
/// whose hold was forgotten takes a new hold under a new id, never the old
/// one (a late webhook for the old id must not confirm it).
pub async fn released_and_expired_holds_are_kept_for_their_retention(h: &Harness) {
    let ttl = h.short_ttl;
    let keep = h.retention.released;
    assert!(
        h.retention.confirmed >= keep * 2,
        "the harness must keep confirmed holds longer"
    );
    let ev = h.event("retention");
    h.stock(&ev, 10, 4, ttl).await;
    // Released by its visitor, released by a failed payment, lapsed (and
    // never touched again), lapsed then released, confirmed.
    let a = held(h.inv.hold(&ev, "alice", 1, Some("key-a")).await.unwrap());
    let b = held(h.inv.hold(&ev, "bob", 1, None).await.unwrap());
    let c = held(h.inv.hold(&ev, "carol", 1, None).await.unwrap());
    let d = held(h.inv.hold(&ev, "dave", 1, None).await.unwrap());
    let e = held(h.inv.hold(&ev, "erin", 1, None).await.unwrap());
    assert_eq!(
        h.inv.release(&a.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-b", false).await.unwrap(),
        ConfirmOutcome::Released
    );
    assert_eq!(
        h.inv.confirm(&e.hold_id, "pay-e", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(h.status(&a.hold_id, "alice").await, HoldStatus::Released);
    assert_eq!(h.status(&b.hold_id, "bob").await, HoldStatus::Released);
    h.advance(ttl + Duration::from_millis(250)).await;
    // Lapsed: kept from the deadline on, whether or not a reaper came.
    assert_eq!(h.status(&c.hold_id, "carol").await, HoldStatus::Expired);
    assert_eq!(
        h.inv.release(&d.hold_id, "dave").await.unwrap(),
        ReleaseOutcome::Expired
    );
    assert_eq!(h.counts(&ev).await, (9, 0, 1));

    // Past the released retention of the last of them (d's, counted from
    // its late release): all four forgotten, for every operation.
    h.advance(keep + Duration::from_millis(250)).await;
    for (v, who) in [(&a, "alice"), (&b, "bob"), (&c, "carol"), (&d, "dave")] {
        assert_eq!(
            h.inv.get_hold(&v.hold_id, who).await.unwrap(),
            None,
            "{who}"
        );
        assert_eq!(
            h.inv.release(&v.hold_id, who).await.unwrap(),
            ReleaseOutcome::NotFound,
            "{who}"
        );
    }
    // A late webhook (a new payment event) finds nothing to confirm; the
    // answer recorded for a payment event stays (PAYMENT_TTL).
    assert_eq!(
        h.inv.confirm(&c.hold_id, "pay-c-late", true).await.unwrap(),
        ConfirmOutcome::NotFound
    );
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-b", false).await.unwrap(),
        ConfirmOutcome::Released
    );
    // The sale of the same moment is kept.
    assert_eq!(h.status(&e.hold_id, "erin").await, HoldStatus::Confirmed);
    // Forgetting changed no counter and no cart.
    assert_eq!(h.counts(&ev).await, (9, 0, 1));
    assert_eq!(
        h.inv.hold(&ev, "erin", 4, None).await.unwrap(),
        HoldOutcome::CartLimitExceeded { limit: 4, held: 1 }
    );
    // alice's key now takes a new hold, under a new id; then replays it.
    let again = held(h.inv.hold(&ev, "alice", 2, Some("key-a")).await.unwrap());
    assert_ne!(again.hold_id, a.hold_id);
    assert_eq!(h.inv.get_hold(&a.hold_id, "alice").await.unwrap(), None);
    match h.inv.hold(&ev, "alice", 2, Some("key-a")).await.unwrap() {
        HoldOutcome::Replayed(v) => assert_eq!(v.hold_id, again.hold_id),
        other => panic!("expected Replayed, got {other:?}"),
    }
    assert_eq!(
        h.inv.confirm(&a.hold_id, "pay-a-late", true).await.unwrap(),
        ConfirmOutcome::NotFound
    );
    assert_eq!(h.status(&again.hold_id, "alice").await, HoldStatus::Held);
    assert_eq!(h.counts(&ev).await, (7, 2, 1));
    // Nothing was logged by forgetting.
    let kinds: Vec<_> = h
        .inv
        .recent_transitions(&ev, 100)
        .await
        .unwrap()
        .iter()
        .map(|t| t.kind)
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k != TransitionKind::Stock && **k != TransitionKind::Held)
            .count(),
        5,
        "{kinds:?}"
    );
}

/// A confirmed hold outlives the released retention and is kept for the
/// confirmed retention (from its payment): its owner sees it, it cannot be
/// released, a payment webhook (repeated or new) answers confirmed. Then it
/// is forgotten, and its units stay sold and counted in its visitor's cart.
pub async fn confirmed_holds_are_kept_for_their_retention(h: &Harness) {
    let r = h.retention;
    assert!(
        r.confirmed >= r.released * 2,
        "the harness must keep confirmed holds longer"
    );
    let ev = h.event("keepsale");
    h.stock(&ev, 10, 4, Duration::from_secs(300)).await;
    let sold = held(h.inv.hold(&ev, "alice", 3, None).await.unwrap());
    let gone = held(h.inv.hold(&ev, "bob", 2, None).await.unwrap());
    assert_eq!(
        h.inv.confirm(&sold.hold_id, "pay-1", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        h.inv.release(&gone.hold_id, "bob").await.unwrap(),
        ReleaseOutcome::Released
    );
    h.advance(r.released + Duration::from_millis(250)).await;
    assert_eq!(h.inv.get_hold(&gone.hold_id, "bob").await.unwrap(), None);
    assert_eq!(
        h.status(&sold.hold_id, "alice").await,
        HoldStatus::Confirmed
    );
    assert_eq!(
        h.inv.release(&sold.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Confirmed
    );
    for pe in ["pay-1", "pay-2"] {
        assert_eq!(
            h.inv.confirm(&sold.hold_id, pe, true).await.unwrap(),
            ConfirmOutcome::Confirmed,
            "{pe}"
        );
    }
    // Past the confirmed retention: forgotten, still sold.
    h.advance(r.confirmed - r.released).await;
    assert_eq!(h.inv.get_hold(&sold.hold_id, "alice").await.unwrap(), None);
    assert_eq!(
        h.inv.release(&sold.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::NotFound
    );
    assert_eq!(
        h.inv.confirm(&sold.hold_id, "pay-3", true).await.unwrap(),
        ConfirmOutcome::NotFound
    );
    assert_eq!(h.counts(&ev).await, (7, 0, 3));
    assert_eq!(
        h.inv.hold(&ev, "alice", 2, None).await.unwrap(),
        HoldOutcome::CartLimitExceeded { limit: 4, held: 3 }
    );
}

/// The result of one race run.
#[derive(Debug, Default)]
pub struct RaceReport {
    /// Units held by `Held` answers.
    pub held_units: u64,
    /// `Held` answers.
    pub holds: usize,
    /// `SoldOut` answers.
    pub sold_out: usize,
    /// `CartLimitExceeded` answers.
    pub cart_limited: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// The seeds' race test, scaled up: `attempts` concurrent holds (qty 1–4,
/// `visitors` visitors, cart limit 4) at `stock` units, every attempt its
/// own task, all released at once by a barrier. Exactly `stock` units
/// held, nobody above 4, the invariant true.
///
/// An attempt the store could not answer in time (a starved machine) may
/// or may not have been applied: it is retried with the same idempotency
/// key, so each unit held is in exactly one answer.
pub async fn race(h: &Harness, stock: u64, attempts: usize, visitors: usize) -> RaceReport {
    let ev = h.event("race");
    h.stock(&ev, stock, 4, Duration::from_secs(600)).await;
    let start = Instant::now();
    let gate = Arc::new(tokio::sync::Barrier::new(attempts + 1));
    let mut tasks = Vec::with_capacity(attempts);
    for i in 0..attempts {
        let inv = h.inv.clone();
        let ev = ev.clone();
        let gate = gate.clone();
        let visitor = rand::random_range(0..visitors);
        let qty = rand::random_range(1..=4u32);
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            let name = format!("visitor-{visitor}");
            let key = format!("race-{i}");
            for _ in 0..50 {
                match inv.hold(&ev, &name, qty, Some(&key)).await {
                    Ok(HoldOutcome::Replayed(v)) => return (visitor, HoldOutcome::Held(v)),
                    Ok(out) => return (visitor, out),
                    Err(e) if e.is_unavailable() => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("hold: {e}"),
                }
            }
            panic!("the store stayed unavailable");
        }));
    }
    // Every task is spawned and waiting: release them together.
    gate.wait().await;
    let mut report = RaceReport::default();
    let mut per_visitor: HashMap<usize, u64> = HashMap::new();
    for t in tasks {
        let (visitor, out) = t.await.unwrap();
        {
            match out {
                HoldOutcome::Held(v) => {
                    report.holds += 1;
                    report.held_units += u64::from(v.qty);
                    *per_visitor.entry(visitor).or_default() += u64::from(v.qty);
                }
                HoldOutcome::SoldOut { .. } => report.sold_out += 1,
                HoldOutcome::CartLimitExceeded { limit, held } => {
                    assert_eq!(limit, 4);
                    assert!(held <= 4);
                    report.cart_limited += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    report.elapsed = start.elapsed();
    assert_eq!(report.held_units, stock, "{report:?}");
    assert!(per_visitor.values().all(|q| *q <= 4), "a visitor above 4");
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert!(s.invariant_holds, "{s:?}");
    assert_eq!((s.available, s.held, s.confirmed), (Some(0), stock, 0));
    let log = h.inv.recent_transitions(&ev, 100_000).await.unwrap();
    let logged: u64 = log
        .iter()
        .filter(|t| t.kind == TransitionKind::Held)
        .map(|t| t.qty)
        .sum();
    assert_eq!(logged, stock);
    report
}

/// Holds lapsing while webhooks (success and failure), visitor releases and
/// three reapers race for them: every hold ends in exactly one of
/// confirmed, released or expired, every answer agrees with that end, and
/// the stock comes back once.
pub async fn expiry_race(h: &Harness, holds: usize) {
    let ev = h.event("exprace");
    let ttl = h.short_ttl;
    let total = (holds as u64) * 4;
    h.stock(&ev, total, 4, ttl).await;
    let mut all = Vec::new();
    for i in 0..holds {
        let q = (i % 4) as u32 + 1;
        let v = held(h.inv.hold(&ev, &format!("v{i}"), q, None).await.unwrap());
        all.push((format!("v{i}"), v));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut reapers = Vec::new();
    for _ in 0..3 {
        let inv = h.inv.clone();
        let ev = ev.clone();
        let stop = stop.clone();
        reapers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += inv.reap(&ev, 5).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            n
        }));
    }
    // Spread the actions over [0.5, 1.5] × TTL around the deadline.
    let ttl_ms = ttl.as_millis() as u64;
    let mut actors = Vec::new();
    let manual = match &h.time {
        TimeControl::Manual(c) => Some((c.clone(), crate::Clock::now_ms(&**c))),
        TimeControl::Real => None,
    };
    for (i, (visitor, v)) in all.iter().cloned().enumerate() {
        let inv = h.inv.clone();
        let delay = ttl_ms / 2 + (i as u64 * 7919) % ttl_ms;
        let manual = manual.clone();
        actors.push(tokio::spawn(async move {
            match manual {
                None => tokio::time::sleep(Duration::from_millis(delay)).await,
                // Virtual time: act once the clock reached the delay (the
                // main task moves it through the deadline in steps).
                Some((clock, start)) => {
                    while crate::Clock::now_ms(&*clock) < start + delay {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                }
            }
            let id = v.hold_id.clone();
            let answer = match i % 4 {
                0 | 1 => format!(
                    "{:?}",
                    inv.confirm(&id, &format!("p{i}"), true).await.unwrap()
                ),
                2 => format!(
                    "{:?}",
                    inv.confirm(&id, &format!("p{i}"), false).await.unwrap()
                ),
                _ => format!("{:?}", inv.release(&id, &visitor).await.unwrap()),
            };
            (i, answer)
        }));
    }
    if let TimeControl::Manual(clock) = &h.time {
        // Move virtual time through the deadline while the actors run.
        for _ in 0..20 {
            clock.advance(ttl / 10);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut answers = HashMap::new();
    for a in actors {
        let (i, answer) = a.await.unwrap();
        answers.insert(i, answer);
    }
    h.advance(ttl + Duration::from_millis(250)).await;
    // Let the reapers finish what they can see, then stop them.
    tokio::time::sleep(Duration::from_millis(20)).await;
    stop.store(true, Ordering::SeqCst);
    for r in reapers {
        r.await.unwrap();
    }
    h.inv.reap(&ev, 10_000).await.unwrap();
    let log = h.inv.recent_transitions(&ev, 100_000).await.unwrap();
    let mut confirmed_units = 0;
    let mut ends: HashMap<HoldStatus, usize> = HashMap::new();
    for (i, (visitor, v)) in all.iter().enumerate() {
        let end = h.inv.get_hold(&v.hold_id, visitor).await.unwrap().unwrap();
        let terminal: Vec<_> = log
            .iter()
            .filter(|t| t.hold_id == v.hold_id.as_str() && t.kind != TransitionKind::Held)
            .map(|t| t.kind)
            .collect();
        let expected_kind = match end.status {
            HoldStatus::Confirmed => {
                confirmed_units += u64::from(v.qty);
                TransitionKind::Confirmed
            }
            HoldStatus::Released => TransitionKind::Released,
            HoldStatus::Expired => TransitionKind::Expired,
            HoldStatus::Held => panic!("hold {i} still held after its deadline"),
        };
        assert_eq!(terminal, vec![expected_kind], "hold {i}");
        *ends.entry(end.status).or_default() += 1;
        let answer = &answers[&i];
        let agrees = match end.status {
            HoldStatus::Confirmed => answer == "Confirmed",
            HoldStatus::Released => answer == "Released",
            HoldStatus::Expired => answer == "Expired",
            HoldStatus::Held => false,
        };
        assert!(
            agrees,
            "hold {i} ended {:?} but answered {answer}",
            end.status
        );
    }
    assert_eq!(
        h.counts(&ev).await,
        (total - confirmed_units, 0, confirmed_units)
    );
    // The race really happened: some holds lapsed before their action,
    // others were confirmed or released in time.
    let lapsed = ends.get(&HoldStatus::Expired).copied().unwrap_or(0);
    assert!(
        lapsed > 0 && lapsed < holds,
        "ends {ends:?}: expected some but not all holds to lapse"
    );
    assert!(
        ends.get(&HoldStatus::Confirmed).copied().unwrap_or(0) > 0,
        "{ends:?}"
    );
}

/// Every test that needs nothing but a harness, for the macro below. The
/// retention tests take a second harness, whose store keeps ended holds
/// briefly where time is real (the first one by default).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!($make, $make);
    };
    ($make:expr, $make_short_retention:expr) => {
        $crate::conformance_tests!(@each $make;
            set_stock_versions, big_numbers, hold_and_get, bad_input, cart_limit, sold_out,
            idempotency, idempotency_concurrent, release, confirm, expiry,
            expiry_is_seen_by_holds, many_lapsed_holds, payment_reused, concurrent_reapers,
            load_only_into_a_store_that_never_had_the_event,
            restore_refused_when_present_or_invalid, restore_then_hold_confirm_release,
            restored_lapsed_holds_return_once, restore_of_an_inconsistent_record_sells_nothing,
            restore_with_categories_puts_back_each_tier,
            restore_with_categories_refuses_inexact_records, feed_deltas_and_snapshots,
            feed_categories, feed_race, schedule_refusals_and_lazy_release,
            racing_callers_release_a_wave_once, a_due_wave_is_on_sale_for_a_bare_hold,
            sharded_routing_and_refusals,
            sharded_transfer_cut_in_half_lands_once, sharded_stock_changes,
            sharded_reshard_only_when_idle, sharded_a_buyer_who_always_loses,
            sharded_a_transfer_in_flight_lands_for_a_buyer_past_its_patience);
        $crate::conformance_tests!(@each $make_short_retention;
            released_and_expired_holds_are_kept_for_their_retention,
            confirmed_holds_are_kept_for_their_retention);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let Some(h) = $make.await else { return };
                $crate::conformance::$name(&h).await;
            }
        )*
    };
}
