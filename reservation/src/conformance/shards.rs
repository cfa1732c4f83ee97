//! Sharded events ([`crate::sharded`]) on a store: fixed tests of the
//! routing, the refusals, a gateway dying mid-transfer, stock changes and
//! shard-count changes, a race for the last units, and a property test of
//! random interleavings (holds, releases, payments, expiries, PUTs, feed
//! deltas, transfers cut in half and sweeps) checked after every step:
//! never oversold, `available + held + confirmed + in transit = total`
//! for the event and `available + held + confirmed = total` on every
//! shard, no visitor over the cart limit, no "sold out" while the other
//! shards had the units, and every answer as the plain model says.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::{Harness, spec};
use crate::sharded::{SWEEP_AFTER_MS, Sharded, TransferOut, home_shard};
use crate::{
    ConfirmOutcome, EventId, EventState, FeedOutcome, HoldId, HoldOutcome, Inventory,
    InventoryBackend, Item, ReleaseOutcome, ScheduleOutcome, SetStockOutcome, StockChange,
    StockRow, Wave,
};

/// The harness's store with sharded events routed.
pub fn sharded(h: &Harness) -> Sharded<InventoryBackend> {
    Sharded::new(h.inv.clone())
}

async fn read(s: &Sharded<InventoryBackend>, ev: &EventId) -> EventState {
    let st = s.read(ev).await.unwrap().expect("the event exists");
    assert!(st.invariant_holds, "invariant broken: {st:#?}");
    st
}

fn held(out: HoldOutcome) -> crate::HoldView {
    match out {
        HoldOutcome::Held(v) => v,
        other => panic!("expected Held, got {other:?}"),
    }
}

/// Create, read, route to the home shard, the cart limit across holds,
/// release and pay by hold id, and the refusals: a plain hold on a sharded
/// event's shard 0, a hold on a shard's own id, items, waves, categories.
pub async fn sharded_routing_and_refusals(h: &Harness) {
    let s = sharded(h);
    let ev = h.event("shards");
    let ttl = Duration::from_secs(600);
    assert_eq!(
        s.set_sharded_stock(&ev, &spec(50, 3, ttl, 1), 8)
            .await
            .unwrap(),
        SetStockOutcome::Created { available: 50 }
    );
    let st = read(&s, &ev).await;
    assert_eq!((st.total, st.available, st.shards), (50, Some(50), 8));
    assert_eq!(st.shard_states.len(), 8);
    assert_eq!(
        st.shard_states.iter().map(|x| x.total).collect::<Vec<_>>(),
        vec![8, 6, 6, 6, 6, 6, 6, 6]
    );
    // Every hold of a visitor lands on its home shard.
    for v in 0..24 {
        let visitor = format!("visitor-{v}");
        let hv = held(s.hold(&ev, &visitor, 1, None).await.unwrap());
        assert_eq!(hv.event, ev.shard(home_shard(&visitor, 8)));
        assert_eq!(hv.hold_id.event(), hv.event);
    }
    // The cart limit is one, whatever shard the units came from.
    let a = held(s.hold(&ev, "alice", 2, None).await.unwrap());
    assert_eq!(
        s.hold(&ev, "alice", 2, None).await.unwrap(),
        HoldOutcome::CartLimitExceeded { limit: 3, held: 2 }
    );
    let b = held(s.hold(&ev, "alice", 1, None).await.unwrap());
    assert_eq!(a.event, b.event);
    // Release and pay by hold id.
    assert_eq!(
        s.release(&a.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        s.confirm(&b.hold_id, "pay-b", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        s.get_hold(&b.hold_id, "alice")
            .await
            .unwrap()
            .unwrap()
            .status,
        crate::HoldStatus::Confirmed
    );
    let st = read(&s, &ev).await;
    assert_eq!((st.held, st.confirmed), (24, 1));
    assert_eq!(st.available, Some(25));
    // Holds routed by a stale layout are refused, never taken.
    assert_eq!(
        h.inv.hold(&ev, "mallory", 1, None).await.unwrap(),
        HoldOutcome::Resharded { shards: 8 }
    );
    assert_eq!(
        s.hold(&ev.shard(3), "mallory", 1, None).await.unwrap(),
        HoldOutcome::Resharded { shards: 8 }
    );
    assert_eq!(
        h.inv
            .hold_in_layout(&ev.shard(3), "mallory", 1, None, 4)
            .await
            .unwrap(),
        HoldOutcome::Resharded { shards: 8 }
    );
    // A gateway that never saw the layout learns it from the refusal.
    let fresh = sharded(h);
    let hv = held(fresh.hold(&ev, "newcomer", 1, None).await.unwrap());
    assert_eq!(hv.event, ev.shard(home_shard("newcomer", 8)));
    // What a sharded event does not take.
    let item = Item {
        category: crate::CategoryId::parse("floor").unwrap(),
        qty: 1,
    };
    assert!(matches!(
        s.hold_items(&ev, "bob", &[item], None).await.unwrap(),
        HoldOutcome::CategoryNotFound { .. }
    ));
    let wave = Wave {
        at_ms: u64::MAX / 2,
        qty: 5,
        category: None,
    };
    assert!(matches!(
        s.schedule_waves(&ev, &[wave]).await.unwrap(),
        ScheduleOutcome::Invalid { .. }
    ));
    assert!(matches!(
        s.set_sharded_stock(&ev.shard(2), &spec(5, 1, ttl, 9), 2)
            .await
            .unwrap(),
        SetStockOutcome::Invalid { .. }
    ));
    for bad in [0, crate::types::MAX_SHARDS + 1] {
        assert!(matches!(
            s.set_sharded_stock(&ev, &spec(5, 1, ttl, 9), bad)
                .await
                .unwrap(),
            SetStockOutcome::Invalid { .. }
        ));
    }
    let cats = [crate::CategorySpec {
        id: crate::CategoryId::parse("floor").unwrap(),
        total: 5,
        cart_limit: None,
    }];
    assert!(matches!(
        s.set_stock_with_categories(&ev, &spec(5, 1, ttl, 9), &cats)
            .await
            .unwrap(),
        SetStockOutcome::Invalid { .. }
    ));
    // Nothing those refusals touched moved.
    let st = read(&s, &ev).await;
    assert_eq!(
        (st.total, st.held, st.confirmed, st.version),
        (50, 25, 1, 1)
    );
}

/// A gateway that dies between the two halves of a transfer: the units are
/// in transit (in the total, available to nobody), a sweep lands them once
/// they are old enough, and landing twice changes nothing.
pub async fn sharded_transfer_cut_in_half_lands_once(h: &Harness) {
    let s = sharded(h);
    let ev = h.event("xfer");
    s.set_sharded_stock(&ev, &spec(40, 4, Duration::from_secs(600), 1), 4)
        .await
        .unwrap();
    let (from, to) = (ev.shard(3), ev.shard(1));
    assert_eq!(
        h.inv.transfer_out(&from, &to, "cut-1", 7).await.unwrap(),
        TransferOut::Moved {
            qty: 7,
            available: 3
        }
    );
    let st = read(&s, &ev).await;
    assert_eq!((st.total, st.available, st.in_transit), (40, Some(33), 7));
    // Too young to sweep: the gateway that started it may still finish.
    assert_eq!(s.sweep(&from).await.unwrap(), 0);
    h.advance(Duration::from_millis(SWEEP_AFTER_MS + 300)).await;
    // Any number of sweepers: it lands once.
    let (a, b) = tokio::join!(s.sweep(&from), s.sweep(&from));
    assert!(a.unwrap() + b.unwrap() >= 1);
    let st = read(&s, &ev).await;
    assert_eq!((st.total, st.available, st.in_transit), (40, Some(40), 0));
    assert_eq!(st.shard_states[1].total, 17);
    assert_eq!(st.shard_states[3].total, 3);
    assert_eq!(
        h.inv.transfer_in(&to, &from, "cut-1", 7).await.unwrap(),
        crate::TransferIn::Replayed
    );
    // A transfer asks for what it may take: never more than is there.
    assert_eq!(
        h.inv.transfer_out(&from, &to, "cut-2", 99).await.unwrap(),
        TransferOut::Moved {
            qty: 3,
            available: 0
        }
    );
    assert_eq!(
        h.inv.transfer_out(&from, &to, "cut-3", 5).await.unwrap(),
        TransferOut::Moved {
            qty: 0,
            available: 0
        }
    );
    // The reaper sweeps as it reaps.
    h.advance(Duration::from_millis(SWEEP_AFTER_MS + 300)).await;
    s.reap(&from, 10).await.unwrap();
    let st = read(&s, &ev).await;
    assert_eq!((st.available, st.in_transit), (Some(40), 0));
}

/// PUTs and feed rows move the event's total on shard 0; a decrease pulls
/// units there first and is refused when they are held or sold; settings
/// reach every shard; a stale version changes nothing.
pub async fn sharded_stock_changes(h: &Harness) {
    let s = sharded(h);
    let ev = h.event("resize");
    let ttl = Duration::from_secs(600);
    s.set_sharded_stock(&ev, &spec(30, 4, ttl, 1), 3)
        .await
        .unwrap();
    // Hold most of shard 0 and 1 so a decrease needs units from shard 2.
    let mut holds = Vec::new();
    for v in 0..60 {
        let visitor = format!("v{v}");
        if home_shard(&visitor, 3) == 2 {
            continue;
        }
        match s.hold(&ev, &visitor, 2, None).await.unwrap() {
            HoldOutcome::Held(hv) => holds.push((visitor, hv)),
            other => panic!("{other:?}"),
        }
        if holds.len() == 8 {
            break;
        }
    }
    let st = read(&s, &ev).await;
    assert_eq!((st.held, st.available), (16, Some(14)));
    // Up: shard 0 takes the difference.
    assert!(matches!(
        s.set_stock(&ev, &spec(40, 5, ttl, 2)).await.unwrap(),
        SetStockOutcome::Updated { available: 24 }
    ));
    let st = read(&s, &ev).await;
    assert_eq!((st.total, st.cart_limit, st.version), (40, 5, 2));
    for k in 1..3 {
        let shard = s.inner().read(&ev.shard(k)).await.unwrap().unwrap();
        assert_eq!((shard.cart_limit, shard.version), (5, 2));
    }
    // Down past what shard 0 has: units are pulled to it first.
    assert!(matches!(
        s.set_stock(&ev, &spec(20, 5, ttl, 3)).await.unwrap(),
        SetStockOutcome::Updated { available: 4 }
    ));
    let st = read(&s, &ev).await;
    assert_eq!((st.total, st.available, st.held), (20, Some(4), 16));
    // Below what is held: refused, nothing changed.
    assert_eq!(
        s.set_stock(&ev, &spec(10, 5, ttl, 4)).await.unwrap(),
        SetStockOutcome::BelowCommitted {
            held: 16,
            confirmed: 0
        }
    );
    assert_eq!(
        s.set_stock(&ev, &spec(99, 5, ttl, 3)).await.unwrap(),
        SetStockOutcome::Stale { current_version: 3 }
    );
    let st = read(&s, &ev).await;
    assert_eq!((st.total, st.available, st.version), (20, Some(4), 3));
    // Feed deltas move the event's total; a removal larger than what is
    // available anywhere is refused.
    let delta = |d: i64, key: &str| StockRow {
        category: None,
        change: StockChange::Delta {
            delta: d,
            key: key.into(),
        },
    };
    assert!(matches!(
        s.apply_stock(&ev, &delta(6, "recv-1")).await.unwrap(),
        FeedOutcome::Applied(a) if a.total == 26 && a.available == 10
    ));
    assert!(matches!(
        s.apply_stock(&ev, &delta(6, "recv-1")).await.unwrap(),
        FeedOutcome::Replayed(_)
    ));
    assert!(matches!(
        s.apply_stock(&ev, &delta(-9, "dmg-1")).await.unwrap(),
        FeedOutcome::Applied(a) if a.total == 17
    ));
    assert_eq!(
        s.apply_stock(&ev, &delta(-5, "dmg-2")).await.unwrap(),
        FeedOutcome::StockNegative { available: 1 }
    );
    let st = read(&s, &ev).await;
    assert_eq!((st.total, st.available, st.held), (17, Some(1), 16));
    // The held units are still the visitors'.
    for (visitor, hv) in &holds {
        assert_eq!(
            s.get_hold(&hv.hold_id, visitor)
                .await
                .unwrap()
                .unwrap()
                .status,
            crate::HoldStatus::Held
        );
    }
}

/// The shard count changes only while nothing is held or sold: refused
/// (and everything as it was) with a hold open, done once it is released,
/// and back to a plain event.
pub async fn sharded_reshard_only_when_idle(h: &Harness) {
    let s = sharded(h);
    let ev = h.event("reshard");
    let ttl = Duration::from_secs(600);
    s.set_sharded_stock(&ev, &spec(20, 2, ttl, 1), 4)
        .await
        .unwrap();
    let hv = held(s.hold(&ev, "early", 1, None).await.unwrap());
    assert_eq!(
        s.set_sharded_stock(&ev, &spec(20, 2, ttl, 2), 8)
            .await
            .unwrap(),
        SetStockOutcome::ShardsBusy {
            held: 1,
            confirmed: 0
        }
    );
    // Unfrozen, as it was: holds still go through.
    let st = read(&s, &ev).await;
    assert_eq!((st.shards, st.version, st.held), (4, 1, 1));
    let second = held(s.hold(&ev, "second", 1, None).await.unwrap());
    // A plain event with units held cannot be sharded either.
    let plain = h.event("plain");
    s.set_stock(&plain, &spec(5, 1, ttl, 1)).await.unwrap();
    held(s.hold(&plain, "p", 1, None).await.unwrap());
    assert!(matches!(
        s.set_sharded_stock(&plain, &spec(5, 1, ttl, 2), 2)
            .await
            .unwrap(),
        SetStockOutcome::ShardsBusy { .. }
    ));
    assert_eq!(read(&s, &plain).await.shards, 1);
    // Nothing held: 4 → 8.
    s.release(&hv.hold_id, "early").await.unwrap();
    s.release(&second.hold_id, "second").await.unwrap();
    assert_eq!(
        s.set_sharded_stock(&ev, &spec(24, 2, ttl, 2), 8)
            .await
            .unwrap(),
        SetStockOutcome::Updated { available: 24 }
    );
    let st = read(&s, &ev).await;
    assert_eq!((st.shards, st.total, st.available), (8, 24, Some(24)));
    let hv = held(s.hold(&ev, "later", 2, None).await.unwrap());
    assert_eq!(hv.event, ev.shard(home_shard("later", 8)));
    s.release(&hv.hold_id, "later").await.unwrap();
    // 8 → plain.
    assert_eq!(
        s.set_sharded_stock(&ev, &spec(24, 2, ttl, 3), 1)
            .await
            .unwrap(),
        SetStockOutcome::Updated { available: 24 }
    );
    let st = read(&s, &ev).await;
    assert_eq!((st.shards, st.total, st.available), (1, 24, Some(24)));
    assert!(st.shard_states.is_empty());
    let hv = held(h.inv.hold(&ev, "plainly", 2, None).await.unwrap());
    assert_eq!(hv.event, ev);
}

/// `visitors` visitors race for the last `total` units of an event split
/// into `shards`, one unit each, at once. Exactly `total` are held, every
/// other answer is sold out, and none of those came while units were left
/// anywhere (at the end nothing is available, nothing in transit). A
/// fan told "try again" asks again (at most 100 times).
pub async fn sharded_last_units_race(h: &Harness, shards: u32, total: u64, visitors: usize) {
    let s = sharded(h);
    let ev = h.event("last");
    s.set_sharded_stock(&ev, &spec(total, 1, Duration::from_secs(600), 1), shards)
        .await
        .unwrap();
    let gate = Arc::new(tokio::sync::Barrier::new(visitors + 1));
    let mut tasks = Vec::new();
    for v in 0..visitors {
        let (s, ev, gate) = (s.clone(), ev.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            // "Try again" (`Contended`: the units this fan needs stayed in
            // transit through its rounds, which a loaded machine can
            // make of a live transfer) is honest; asked again, bounded.
            let fan = format!("fan-{v}");
            for _ in 0..100 {
                match s.hold(&ev, &fan, 1, None).await {
                    Err(crate::ReservationError::Contended { .. }) => continue,
                    answer => return answer.unwrap(),
                }
            }
            panic!("{fan} told to try again 100 times");
        }));
    }
    gate.wait().await;
    let (mut won, mut sold_out) = (0u64, 0u64);
    for t in tasks {
        match t.await.unwrap() {
            HoldOutcome::Held(_) => won += 1,
            HoldOutcome::SoldOut { .. } => sold_out += 1,
            other => panic!("{other:?}"),
        }
    }
    let st = read(&s, &ev).await;
    assert_eq!(won, total.min(visitors as u64), "{st:#?}");
    assert_eq!(won + sold_out, visitors as u64);
    assert_eq!((st.held, st.in_transit), (won, 0), "{st:#?}");
    if visitors as u64 >= total {
        assert_eq!(
            st.available,
            Some(0),
            "sold out while units were left: {st:#?}"
        );
    }
}

/// `buyers` buyers storm the last `total` units of an event split into
/// `shards`: each buys carts of 1 to 4 units for fresh visitors, again and
/// again; told "sold out" for a cart it asks once more for one unit, and
/// told "sold out" for one unit it stops (the shard bench's retrying
/// buyers, seed 003's last units). Units drain unevenly from the homes, so
/// they keep moving while buyers walk. No "sold out" may come while the
/// cart's units were provably unsold: `total` minus the units of every
/// successful hold that had started before the answer came (a logical
/// clock orders starts and answers). Every unit is sold, nothing is left
/// in transit.
pub async fn sharded_last_units_storm(h: &Harness, shards: u32, total: u64, buyers: usize) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let s = sharded(h);
    let ev = h.event("storm");
    s.set_sharded_stock(&ev, &spec(total, 4, Duration::from_secs(600), 1), shards)
        .await
        .unwrap();
    let clock = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(tokio::sync::Barrier::new(buyers + 1));
    let mut tasks = Vec::new();
    for b in 0..buyers {
        let (s, ev, gate, clock) = (s.clone(), ev.clone(), gate.clone(), clock.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            // (start, qty) of holds won; (answer, qty, available) of "sold out"
            let (mut won, mut sold_out) = (Vec::new(), Vec::new());
            let mut qty = 1 + (b % 4) as u32;
            // "Try again" (the router neither held nor proved sold out
            // within its rounds, `Contended`): honest, but bounded here.
            let mut retries = 0;
            for n in 0.. {
                let start = clock.fetch_add(1, Ordering::SeqCst);
                let visitor = format!("buyer-{b}-{n}");
                let answer = match s.hold(&ev, &visitor, qty, None).await {
                    Err(crate::ReservationError::Contended { .. }) if retries < 100 => {
                        retries += 1;
                        continue;
                    }
                    answer => answer.unwrap(),
                };
                let end = clock.fetch_add(1, Ordering::SeqCst);
                match answer {
                    HoldOutcome::Held(v) => {
                        assert_eq!(v.qty, qty);
                        won.push((start, u64::from(qty)));
                        qty = 1 + (b + n) as u32 % 4;
                    }
                    HoldOutcome::SoldOut { available } => {
                        sold_out.push((end, u64::from(qty), available));
                        if qty == 1 {
                            break;
                        }
                        qty = 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            (won, sold_out)
        }));
    }
    gate.wait().await;
    let (mut won, mut sold_out) = (Vec::new(), Vec::new());
    for t in tasks {
        let (w, so) = t.await.unwrap();
        won.extend(w);
        sold_out.extend(so);
    }
    won.sort_unstable();
    let mut taken = vec![0u64];
    for (_, q) in &won {
        taken.push(taken.last().unwrap() + q);
    }
    let false_sold_out: Vec<_> = sold_out
        .iter()
        .filter_map(|&(end, qty, available)| {
            let left = total.saturating_sub(taken[won.partition_point(|w| w.0 < end)]);
            (left >= qty).then_some((qty, left, available))
        })
        .collect();
    let st = read(&s, &ev).await;
    assert!(
        false_sold_out.is_empty(),
        "{} of {} sold-out answers while the cart's units were provably left \
         (cart, units provably left, available answered): {false_sold_out:?}; {st:#?}",
        false_sold_out.len(),
        sold_out.len()
    );
    assert_eq!(*taken.last().unwrap(), total, "{st:#?}");
    assert_eq!(
        (st.held, st.in_transit, st.available),
        (total, 0, Some(0)),
        "{st:#?}"
    );
}

// === the property test ===

/// One step of a random sale of a sharded event.
#[derive(Clone, Debug)]
pub enum ShardOp {
    /// A hold of `qty` by visitor `visitor`.
    Hold {
        /// Visitor index.
        visitor: u8,
        /// Units.
        qty: u32,
    },
    /// The owner releases hold `n` (modulo the holds taken).
    Release(u8),
    /// A payment for hold `n`.
    Pay(u8, bool),
    /// Every hold taken so far lapses.
    Expire,
    /// A PUT of a new total (the next version).
    Put(u64),
    /// A feed delta.
    Delta(i64),
    /// A transfer between two shards cut after its first half.
    Cut {
        /// Source shard index (modulo the shards).
        from: u8,
        /// Destination.
        to: u8,
        /// Units asked.
        qty: u64,
    },
    /// Time passes the sweep delay; every shard is reaped (and swept).
    Sweep,
}

/// A case: shards, the starting total, the cart limit, and the steps.
pub fn shard_case(max_ops: usize) -> impl Strategy<Value = (u32, u64, u32, Vec<ShardOp>)> {
    let op = prop_oneof![
        6 => (0u8..12, 1u32..=3).prop_map(|(visitor, qty)| ShardOp::Hold { visitor, qty }),
        2 => any::<u8>().prop_map(ShardOp::Release),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(h, ok)| ShardOp::Pay(h, ok)),
        1 => Just(ShardOp::Expire),
        1 => (0u64..40).prop_map(ShardOp::Put),
        1 => (-8i64..=8).prop_filter("not 0", |d| *d != 0).prop_map(ShardOp::Delta),
        1 => (any::<u8>(), any::<u8>(), 1u64..6).prop_map(|(from, to, qty)| ShardOp::Cut { from, to, qty }),
        1 => Just(ShardOp::Sweep),
    ];
    (
        2u32..=5,
        0u64..30,
        1u32..=4,
        proptest::collection::vec(op, 1..max_ops),
    )
}

/// [`shard_case`] without [`ShardOp::Expire`]: for a store on real time
/// whose every step waits on something slow (a ledger catching up), where
/// the holds' TTL must outlast the whole case instead.
pub fn shard_case_without_expiry(
    max_ops: usize,
) -> impl Strategy<Value = (u32, u64, u32, Vec<ShardOp>)> {
    shard_case(max_ops).prop_map(|(shards, total, limit, ops)| {
        let ops = ops
            .into_iter()
            .filter(|op| !matches!(op, ShardOp::Expire))
            .collect();
        (shards, total, limit, ops)
    })
}

/// What the model keeps of one hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Held,
    Sold,
    Over,
}

/// Runs one case against `h`'s store, checking after every step.
pub async fn run_shard_case(h: &Harness, case: &(u32, u64, u32, Vec<ShardOp>)) {
    let (shards, total, limit, ops) = case;
    let (shards, limit) = (*shards, *limit);
    // Sweeps land a cut transfer at once (the delay has its own test).
    let s = sharded(h).with_sweep_after(Duration::ZERO);
    let ev = h.event("prop");
    let ttl = if h.virtual_time() {
        Duration::from_secs(60)
    } else {
        h.short_ttl.max(Duration::from_secs(2))
    };
    let mut version = 1;
    assert!(matches!(
        s.set_sharded_stock(&ev, &spec(*total, limit, ttl, version), shards)
            .await
            .unwrap(),
        SetStockOutcome::Created { .. }
    ));
    let mut model_total = *total;
    let mut holds: Vec<(HoldId, String, u32, Status)> = Vec::new();
    let mut delta_seq = 0;
    for op in ops {
        let before = read(&s, &ev).await;
        match op {
            ShardOp::Hold { visitor, qty } => {
                let name = format!("v{visitor}");
                let have: u32 = holds
                    .iter()
                    .filter(|(_, v, _, st)| *v == name && *st != Status::Over)
                    .map(|(_, _, q, _)| *q)
                    .sum();
                let answer = s.hold(&ev, &name, *qty, None).await;
                let contended = matches!(answer, Err(crate::ReservationError::Contended { .. }));
                match answer.unwrap_or(HoldOutcome::NotReady) {
                    HoldOutcome::NotReady if contended => {
                        // "Try again": only while units are in transit and
                        // the shards' available ones fall short.
                        let available = before.available.unwrap();
                        assert!(
                            available < u64::from(*qty) && before.in_transit > 0,
                            "try again with {available} available: {before:#?}"
                        );
                    }
                    HoldOutcome::Held(hv) => {
                        assert!(have + qty <= limit, "{name} over the limit");
                        assert_eq!(hv.event, ev.shard(home_shard(&name, shards)));
                        holds.push((hv.hold_id, name, *qty, Status::Held));
                    }
                    HoldOutcome::CartLimitExceeded { .. } => {
                        assert!(have + qty > limit, "a false cart refusal");
                    }
                    HoldOutcome::InvalidQuantity { .. } => assert!(*qty > limit),
                    HoldOutcome::SoldOut { .. } => {
                        // Only when the shards together lacked the units.
                        let available = before.available.unwrap();
                        assert!(
                            available < u64::from(*qty),
                            "sold out with {available} available: {before:#?}"
                        );
                        assert!(have + qty <= limit);
                    }
                    other => panic!("hold: {other:?}"),
                }
            }
            ShardOp::Release(i) if !holds.is_empty() => {
                let n = usize::from(*i) % holds.len();
                let (id, name, _, st) = holds[n].clone();
                let r = s.release(&id, &name).await.unwrap();
                match st {
                    Status::Held => assert_eq!(r, ReleaseOutcome::Released),
                    Status::Sold => assert_eq!(r, ReleaseOutcome::Confirmed),
                    Status::Over => assert!(matches!(
                        r,
                        ReleaseOutcome::AlreadyReleased | ReleaseOutcome::Expired
                    )),
                }
                if st == Status::Held {
                    holds[n].3 = Status::Over;
                }
            }
            ShardOp::Pay(i, ok) if !holds.is_empty() => {
                let n = usize::from(*i) % holds.len();
                let (id, _, _, st) = holds[n].clone();
                let r = s.confirm(&id, &format!("pay-{n}"), *ok).await.unwrap();
                match (st, ok) {
                    (Status::Held, true) => {
                        assert_eq!(r, ConfirmOutcome::Confirmed);
                        holds[n].3 = Status::Sold;
                    }
                    (Status::Held, false) => {
                        assert_eq!(r, ConfirmOutcome::Released);
                        holds[n].3 = Status::Over;
                    }
                    _ => {}
                }
            }
            ShardOp::Release(_) | ShardOp::Pay(..) => {}
            ShardOp::Expire => {
                h.advance(ttl + Duration::from_millis(200)).await;
                for hold in &mut holds {
                    if hold.3 == Status::Held {
                        hold.3 = Status::Over;
                    }
                }
            }
            ShardOp::Put(t) => {
                version += 1;
                let committed = before.held + before.confirmed;
                match s
                    .set_stock(&ev, &spec(*t, limit, ttl, version))
                    .await
                    .unwrap()
                {
                    SetStockOutcome::Updated { .. } => {
                        assert!(*t >= committed);
                        // Allowed exactly when the drop fits in what is
                        // available (units in transit cannot be pulled).
                        assert!(model_total.saturating_sub(*t) <= before.available.unwrap());
                        model_total = *t;
                    }
                    SetStockOutcome::BelowCommitted { .. } => {
                        let available = before.available.unwrap();
                        assert!(
                            model_total.saturating_sub(*t) > available,
                            "{t}: {before:#?}"
                        );
                    }
                    other => panic!("put: {other:?}"),
                }
            }
            ShardOp::Delta(d) => {
                delta_seq += 1;
                let row = StockRow {
                    category: None,
                    change: StockChange::Delta {
                        delta: *d,
                        key: format!("d{delta_seq}"),
                    },
                };
                match s.apply_stock(&ev, &row).await.unwrap() {
                    FeedOutcome::Applied(a) => {
                        model_total = model_total.checked_add_signed(*d).unwrap();
                        assert_eq!(a.total, model_total);
                    }
                    FeedOutcome::StockNegative { .. } => {
                        assert!(d.unsigned_abs() > before.available.unwrap());
                    }
                    other => panic!("delta: {other:?}"),
                }
            }
            ShardOp::Cut { from, to, qty } => {
                let from = ev.shard(u32::from(*from) % shards);
                let to = ev.shard(u32::from(*to) % shards);
                if from != to {
                    let id = format!("cut-{}", rand::random::<u64>());
                    h.inv.transfer_out(&from, &to, &id, *qty).await.unwrap();
                }
            }
            ShardOp::Sweep => {
                for k in 0..shards {
                    s.reap(&ev.shard(k), 1000).await.unwrap();
                }
            }
        }
        let after = read(&s, &ev).await;
        assert_eq!(after.total, model_total, "{op:?}: {after:#?}");
        let sold: u64 = holds
            .iter()
            .filter(|h| h.3 == Status::Sold)
            .map(|h| u64::from(h.2))
            .sum();
        let out: u64 = holds
            .iter()
            .filter(|h| h.3 == Status::Held)
            .map(|h| u64::from(h.2))
            .sum();
        assert_eq!(
            (after.held, after.confirmed),
            (out, sold),
            "{op:?}: {after:#?}"
        );
        assert!(sold <= after.total, "oversold: {after:#?}");
        let mut per: HashMap<&str, u32> = HashMap::new();
        for (_, v, q, st) in &holds {
            if *st != Status::Over {
                *per.entry(v).or_default() += q;
            }
        }
        assert!(per.values().all(|q| *q <= limit));
        // Every shard is an event of its own to the harness's step check
        // (e.g. the ledger's record of it).
        for k in 0..shards {
            if let Err(e) = h.step_check(&ev.shard(k)).await {
                panic!("{op:?}: shard {k}: {e}");
            }
        }
    }
}
