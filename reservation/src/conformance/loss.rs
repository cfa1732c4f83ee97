//! Store loss and rebuilds (issue 18), on every store: configured stock
//! only ever goes into a store that never had the event, an operator's
//! load of a lost event says so, and [`Inventory::restore`] puts back a
//! record's counters, holds and carts so that every later operation
//! behaves as if the store had never lost them.
//!
//! Loss is simulated with [`Harness::lose`]: the event's own keys go, its
//! load marker stays (an eviction, a `DEL`, a replica promoted before the
//! keys reached it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;

use super::{Harness, TimeControl, held, spec};
use crate::{
    ConfirmOutcome, EventId, EventRecord, HoldId, HoldOutcome, HoldStatus, Inventory,
    InventoryBackend, LoadOutcome, OpenHold, ReleaseOutcome, RestoreOutcome, SetStockOutcome,
    SoldHold, TransitionKind,
};

impl Harness {
    /// Deletes everything the store holds of `event` but its load marker.
    pub async fn lose(&self, event: &EventId) {
        match &self.inv {
            InventoryBackend::Memory(m) => m.lose_event(event),
            InventoryBackend::Redis(r) => {
                r.lose_event(event, "all").await.unwrap();
            }
        }
    }

    /// The store's clock now, in Unix ms (the manual clock, or the system
    /// clock where the store's `TIME` runs on this machine).
    pub fn now_ms(&self) -> u64 {
        match &self.time {
            TimeControl::Manual(c) => crate::Clock::now_ms(&**c),
            TimeControl::Real => u64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis(),
            )
            .unwrap_or(0),
        }
    }
}

fn open_hold(event: &EventId, visitor: &str, qty: u32, expires_at_ms: u64) -> OpenHold {
    OpenHold {
        hold_id: HoldId::generate(event),
        visitor: visitor.to_owned(),
        qty,
        expires_at_ms,
    }
}

/// Configured stock (`load_if_new`) goes into a store that never had the
/// event, once; after a loss it is refused (`Lost`, with the last version)
/// and the event stays not ready; the operator's `set_stock` loads it again
/// and says it had been lost (`Recreated`).
pub async fn load_only_into_a_store_that_never_had_the_event(h: &Harness) {
    let ev = h.event("loadnew");
    let ttl = Duration::from_secs(600);
    assert_eq!(h.inv.loaded_version(&ev).await.unwrap(), None);
    assert_eq!(
        h.inv.load_if_new(&ev, &spec(5, 4, ttl, 1)).await.unwrap(),
        LoadOutcome::Loaded { available: 5 }
    );
    // A second gateway starting: present, nothing changed.
    assert_eq!(
        h.inv.load_if_new(&ev, &spec(9, 4, ttl, 1)).await.unwrap(),
        LoadOutcome::Present
    );
    assert_eq!(h.inv.loaded_version(&ev).await.unwrap(), Some(1));
    assert!(matches!(
        h.inv.set_stock(&ev, &spec(5, 4, ttl, 3)).await.unwrap(),
        SetStockOutcome::Updated { available: 5 }
    ));
    assert_eq!(h.inv.loaded_version(&ev).await.unwrap(), Some(3));
    // Sell 4 of 5.
    let a = held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    let b = held(h.inv.hold(&ev, "bob", 2, None).await.unwrap());
    for (v, p) in [(&a, "pa"), (&b, "pb")] {
        assert_eq!(
            h.inv.confirm(&v.hold_id, p, true).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
    }
    h.lose(&ev).await;
    assert_eq!(h.inv.read(&ev).await.unwrap(), None);
    assert_eq!(
        h.inv.hold(&ev, "carol", 1, None).await.unwrap(),
        HoldOutcome::NotReady
    );
    // Configured stock again, from any number of gateways: refused.
    for _ in 0..3 {
        assert_eq!(
            h.inv.load_if_new(&ev, &spec(5, 4, ttl, 1)).await.unwrap(),
            LoadOutcome::Lost { last_version: 3 }
        );
    }
    assert_eq!(
        h.inv.hold(&ev, "carol", 1, None).await.unwrap(),
        HoldOutcome::NotReady
    );
    assert_eq!(h.inv.read(&ev).await.unwrap(), None);
    // The operator loads what is left (1), any version: said to be a reload.
    assert_eq!(
        h.inv.set_stock(&ev, &spec(1, 4, ttl, 1)).await.unwrap(),
        SetStockOutcome::Recreated {
            available: 1,
            lost_version: 3
        }
    );
    assert_eq!(h.inv.loaded_version(&ev).await.unwrap(), Some(3));
    held(h.inv.hold(&ev, "carol", 1, None).await.unwrap());
    assert!(matches!(
        h.inv.hold(&ev, "dave", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    ));
    // A gateway that saw an event loaded puts a flushed marker back: from
    // then on configured stock is refused as for a lost event.
    let flushed = h.event("flushed");
    h.inv.remember_loaded(&flushed, 7).await.unwrap();
    h.inv.remember_loaded(&flushed, 2).await.unwrap();
    assert_eq!(h.inv.loaded_version(&flushed).await.unwrap(), Some(7));
    assert_eq!(
        h.inv
            .load_if_new(&flushed, &spec(5, 4, ttl, 1))
            .await
            .unwrap(),
        LoadOutcome::Lost { last_version: 7 }
    );
    // Bad specs stay refused, before anything.
    assert!(matches!(
        h.inv
            .load_if_new(&h.event("bad"), &spec(5, 0, ttl, 1))
            .await
            .unwrap(),
        LoadOutcome::Invalid { .. }
    ));
}

/// `restore` never overwrites an event the store has, and refuses an
/// unusable record without writing anything.
pub async fn restore_refused_when_present_or_invalid(h: &Harness) {
    let ttl = Duration::from_secs(600);
    let now = h.now_ms();
    let ev = h.event("present");
    h.stock(&ev, 10, 4, ttl).await;
    held(h.inv.hold(&ev, "alice", 1, None).await.unwrap());
    let record = EventRecord {
        confirmed_holds: Vec::new(),
        total: 3,
        version: 9,
        confirmed: vec![],
        open_holds: vec![open_hold(&ev, "bob", 1, now + 60_000)],
    };
    assert_eq!(
        h.inv
            .restore(&ev, &spec(3, 4, ttl, 9), &record)
            .await
            .unwrap(),
        RestoreOutcome::Present
    );
    assert_eq!(h.counts(&ev).await, (9, 1, 0));

    let ev = h.event("invalid");
    let other = h.event("other");
    let good = open_hold(&ev, "bob", 1, now + 60_000);
    let with = |holds: Vec<OpenHold>| EventRecord {
        confirmed_holds: Vec::new(),
        total: 5,
        version: 1,
        confirmed: vec![("alice".into(), 1)],
        open_holds: holds,
    };
    let cases = [
        (
            with(vec![open_hold(&other, "bob", 1, now + 60_000)]),
            spec(5, 4, ttl, 1),
        ),
        (
            with(vec![open_hold(&ev, "bob", 0, now + 60_000)]),
            spec(5, 4, ttl, 1),
        ),
        (
            with(vec![open_hold(&ev, "", 1, now + 60_000)]),
            spec(5, 4, ttl, 1),
        ),
        (with(vec![good.clone(), good.clone()]), spec(5, 4, ttl, 1)),
        (with(vec![good.clone()]), spec(5, 0, ttl, 1)),
        (with(vec![good.clone()]), spec(5, 4, Duration::ZERO, 1)),
        (
            EventRecord {
                confirmed_holds: Vec::new(),
                total: crate::MAX_TOTAL + 1,
                ..with(vec![])
            },
            spec(5, 4, ttl, 1),
        ),
        (
            EventRecord {
                confirmed_holds: Vec::new(),
                confirmed: vec![(String::new(), 1)],
                ..with(vec![])
            },
            spec(5, 4, ttl, 1),
        ),
    ];
    for (record, sp) in cases {
        let out = h.inv.restore(&ev, &sp, &record).await.unwrap();
        assert!(
            matches!(out, RestoreOutcome::Invalid { .. }),
            "{record:?}: {out:?}"
        );
        assert_eq!(h.inv.read(&ev).await.unwrap(), None);
        assert_eq!(h.inv.loaded_version(&ev).await.unwrap(), None);
    }
}

/// After a rebuild the event behaves as if never lost: the cart limit counts
/// restored holds and confirmed units, a webhook confirms a restored hold,
/// its owner releases another, versions stay monotonic, and the stream says
/// `restored`.
pub async fn restore_then_hold_confirm_release(h: &Harness) {
    let ttl = Duration::from_secs(600);
    let ev = h.event("restore");
    // Sold in the lost generation: alice 1 confirmed, bob 2 confirmed.
    let now = h.now_ms();
    let a = open_hold(&ev, "alice", 2, now + 300_000);
    let b = open_hold(&ev, "bob", 1, now + 300_000);
    // alice's confirmed unit was one paid hold: restored as a record.
    let sold = SoldHold {
        hold_id: HoldId::generate(&ev),
        visitor: "alice".into(),
        qty: 1,
    };
    let record = EventRecord {
        confirmed_holds: vec![sold.clone()],
        total: 10,
        version: 4,
        confirmed: vec![("alice".into(), 1), ("bob".into(), 2)],
        open_holds: vec![a.clone(), b.clone()],
    };
    h.stock(&ev, 10, 4, ttl).await;
    h.lose(&ev).await;
    assert_eq!(
        h.inv
            .restore(&ev, &spec(10, 4, ttl, 2), &record)
            .await
            .unwrap(),
        RestoreOutcome::Restored {
            available: 4,
            held: 3,
            confirmed: 3
        }
    );
    // Present now: a second rebuild (another ledger) changes nothing.
    assert_eq!(
        h.inv
            .restore(&ev, &spec(10, 4, ttl, 2), &record)
            .await
            .unwrap(),
        RestoreOutcome::Present
    );
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert_eq!((s.total, s.version, s.cart_limit), (10, 4, 4));
    assert_eq!(h.counts(&ev).await, (4, 3, 3));
    assert!(h.inv.loaded_version(&ev).await.unwrap() >= Some(4));
    let last = h.inv.recent_transitions(&ev, 1).await.unwrap();
    assert_eq!(
        (last[0].kind, last[0].qty, last[0].available),
        (TransitionKind::Restored, 10, 4)
    );
    // The owner sees the restored hold with its deadline.
    let view = h.inv.get_hold(&a.hold_id, "alice").await.unwrap().unwrap();
    assert_eq!(
        (view.status, view.qty, view.expires_at_ms),
        (HoldStatus::Held, 2, a.expires_at_ms)
    );
    assert_eq!(h.inv.get_hold(&a.hold_id, "bob").await.unwrap(), None);
    // The paid hold is still its owner's, confirmed; the provider's retried
    // webhook for it answers confirmed (not "not found", which it would
    // take for a refund) and counts nothing twice.
    let view = h
        .inv
        .get_hold(&sold.hold_id, "alice")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((view.status, view.qty), (HoldStatus::Confirmed, 1));
    assert_eq!(
        h.inv
            .confirm(&sold.hold_id, "pay-a-retried", true)
            .await
            .unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(h.counts(&ev).await, (4, 3, 3));
    // alice: 2 held + 1 confirmed = 3 of 4.
    assert_eq!(
        h.inv.hold(&ev, "alice", 2, None).await.unwrap(),
        HoldOutcome::CartLimitExceeded { limit: 4, held: 3 }
    );
    held(h.inv.hold(&ev, "alice", 1, None).await.unwrap());
    // bob: 1 held + 2 confirmed = 3.
    assert_eq!(
        h.inv.hold(&ev, "bob", 2, None).await.unwrap(),
        HoldOutcome::CartLimitExceeded { limit: 4, held: 3 }
    );
    // The payment of bob's restored hold arrives.
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-b", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        h.inv.confirm(&b.hold_id, "pay-b", true).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(h.counts(&ev).await, (3, 3, 4));
    // alice gives her restored hold back: its units return once.
    assert_eq!(
        h.inv.release(&a.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        h.inv.release(&a.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(h.counts(&ev).await, (5, 1, 4));
    held(h.inv.hold(&ev, "alice", 2, None).await.unwrap());
    // Versions stay monotonic across the rebuild.
    assert_eq!(
        h.inv.set_stock(&ev, &spec(10, 4, ttl, 4)).await.unwrap(),
        SetStockOutcome::Stale { current_version: 4 }
    );
    assert!(matches!(
        h.inv.set_stock(&ev, &spec(12, 4, ttl, 5)).await.unwrap(),
        SetStockOutcome::Updated { available: 5 }
    ));
    assert_eq!(h.counts(&ev).await, (5, 3, 4));
}

/// A restored hold past its deadline (or that lapses later) returns its
/// units exactly once, whatever number of reapers race, with one `expired`
/// entry; a webhook for it answers expired.
pub async fn restored_lapsed_holds_return_once(h: &Harness) {
    let ttl = h.short_ttl;
    let ev = h.event("restlapse");
    let now = h.now_ms();
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(1000);
    let mut holds = Vec::new();
    for i in 0..40u32 {
        // Half lapsed already, half lapse within one TTL.
        let deadline = if i % 2 == 0 {
            now.saturating_sub(5_000 + u64::from(i))
        } else {
            now + ttl_ms
        };
        holds.push(open_hold(&ev, &format!("v{i}"), i % 3 + 1, deadline));
    }
    let record = EventRecord {
        confirmed_holds: Vec::new(),
        total: 200,
        version: 1,
        confirmed: vec![("v0".into(), 1)],
        open_holds: holds.clone(),
    };
    let held_units = record.held();
    assert!(matches!(
        h.inv
            .restore(&ev, &spec(200, 4, ttl, 1), &record)
            .await
            .unwrap(),
        RestoreOutcome::Restored { .. }
    ));
    let race = |h: &Harness| {
        let reaped = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let inv = h.inv.clone();
            let ev = ev.clone();
            let reaped = reaped.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let n = inv.reap(&ev, 3).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    reaped.fetch_add(n, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                }
            }));
        }
        (tasks, reaped)
    };
    let (tasks, reaped) = race(h);
    // A webhook for a lapsed restored hold races the reapers.
    assert_eq!(
        h.inv
            .confirm(&holds[2].hold_id, "late", true)
            .await
            .unwrap(),
        ConfirmOutcome::Expired
    );
    for t in tasks {
        t.await.unwrap();
    }
    let early = reaped.load(Ordering::SeqCst);
    assert!(early <= 20, "{early}");
    let (available, held_now, confirmed) = h.counts(&ev).await;
    let lapsed_units: u64 = holds.iter().step_by(2).map(|o| u64::from(o.qty)).sum();
    assert_eq!(
        (available, held_now, confirmed),
        (
            200 - 1 - held_units + lapsed_units,
            held_units - lapsed_units,
            1
        )
    );
    h.advance(ttl + Duration::from_millis(250)).await;
    let (tasks, _) = race(h);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(h.counts(&ev).await, (199, 0, 1));
    let log = h.inv.recent_transitions(&ev, 10_000).await.unwrap();
    for o in &holds {
        let ends = log
            .iter()
            .filter(|t| t.hold_id == o.hold_id.as_str())
            .map(|t| t.kind)
            .collect::<Vec<_>>();
        assert_eq!(ends, vec![TransitionKind::Expired], "{}", o.hold_id);
    }
}

/// A record that holds and sold more than its total (a ledger bug, a
/// total lowered by hand) puts nothing on sale: available is 0, and the
/// units of its holds that end unsold pay the excess off before any goes
/// back on sale, so `available + held + confirmed` comes back down to the
/// total and never a unit beyond it is sold.
pub async fn restore_of_an_inconsistent_record_sells_nothing(h: &Harness) {
    let ttl = Duration::from_secs(600);
    let ev = h.event("inconsistent");
    let now = h.now_ms();
    let record = EventRecord {
        confirmed_holds: Vec::new(),
        total: 3,
        version: 2,
        confirmed: vec![("alice".into(), 2)],
        open_holds: vec![open_hold(&ev, "bob", 2, now + 300_000)],
    };
    assert_eq!(
        h.inv
            .restore(&ev, &spec(3, 4, ttl, 1), &record)
            .await
            .unwrap(),
        RestoreOutcome::Restored {
            available: 0,
            held: 2,
            confirmed: 2
        }
    );
    let s = h.inv.read(&ev).await.unwrap().unwrap();
    assert_eq!(s.available, Some(0));
    assert!(!s.invariant_holds, "the overcommit is visible: {s:?}");
    assert!(matches!(
        h.inv.hold(&ev, "carol", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    ));
    // Total 3 with 2 sold: one unit may ever be sold again, not two.
    let bob = &record.open_holds[0];
    assert_eq!(
        h.inv.release(&bob.hold_id, "bob").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(h.counts(&ev).await, (1, 0, 2));
    held(h.inv.hold(&ev, "carol", 1, None).await.unwrap());
    assert!(matches!(
        h.inv.hold(&ev, "dave", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    ));
    // The same through a lapse and a failed payment.
    let ev = h.event("inconsistent2");
    let now = h.now_ms();
    let record = EventRecord {
        confirmed_holds: Vec::new(),
        total: 4,
        version: 1,
        confirmed: vec![("alice".into(), 3)],
        open_holds: vec![
            open_hold(&ev, "bob", 2, now.saturating_sub(1_000)),
            open_hold(&ev, "carol", 1, now + 300_000),
        ],
    };
    assert!(matches!(
        h.inv
            .restore(&ev, &spec(4, 4, ttl, 1), &record)
            .await
            .unwrap(),
        RestoreOutcome::Restored { available: 0, .. }
    ));
    // bob's lapsed 2 units pay off the excess of 2 (3 + 3 held vs 4).
    assert_eq!(h.counts(&ev).await, (0, 1, 3));
    assert_eq!(
        h.inv
            .confirm(&record.open_holds[1].hold_id, "fail", false)
            .await
            .unwrap(),
        ConfirmOutcome::Released
    );
    assert_eq!(h.counts(&ev).await, (1, 0, 3));
}

// === property ===

/// One generated record: visitors 0..4, confirmed units per visitor, open
/// holds (visitor, qty, lapsed or not).
#[derive(Clone, Debug)]
pub struct RecordCase {
    /// The record's total.
    pub total: u64,
    /// Cart limit of the spec.
    pub cart_limit: u32,
    /// Confirmed units per visitor index.
    pub confirmed: Vec<(u8, u64)>,
    /// Open holds: visitor index, qty, already past its deadline.
    pub holds: Vec<(u8, u32, bool)>,
}

/// Records of every shape, consistent or not.
pub fn record_case() -> impl Strategy<Value = RecordCase> {
    (
        0u64..24,
        1u32..6,
        proptest::collection::vec((0u8..4, 0u64..4), 0..5),
        proptest::collection::vec((0u8..4, 1u32..4, proptest::bool::weighted(0.3)), 0..8),
    )
        .prop_map(|(total, cart_limit, confirmed, holds)| RecordCase {
            total,
            cart_limit,
            confirmed,
            holds,
        })
}

/// Restores a generated record into a fresh event, then checks the
/// counters (lapsed holds expired, consistent records exact, inconsistent
/// ones selling nothing beyond the total) and one hold per visitor against
/// the cart counts the record implies.
pub async fn restore_property_case(h: &Harness, case: &RecordCase) -> Result<(), String> {
    let ttl = Duration::from_secs(600);
    let ev = h.event("proprestore");
    let now = h.now_ms();
    let visitor = |i: u8| format!("v{i}");
    let record = EventRecord {
        confirmed_holds: Vec::new(),
        total: case.total,
        version: 1,
        confirmed: case
            .confirmed
            .iter()
            .map(|(v, q)| (visitor(*v), *q))
            .collect(),
        open_holds: case
            .holds
            .iter()
            .map(|(v, q, lapsed)| {
                let deadline = if *lapsed {
                    now.saturating_sub(10_000)
                } else {
                    now + 300_000
                };
                open_hold(&ev, &visitor(*v), *q, deadline)
            })
            .collect(),
    };
    let out = h
        .inv
        .restore(&ev, &spec(case.total, case.cart_limit, ttl, 1), &record)
        .await
        .map_err(|e| e.to_string())?;
    let (held, confirmed) = (record.held(), record.confirmed_total());
    if out
        != (RestoreOutcome::Restored {
            available: record.available(),
            held,
            confirmed,
        })
    {
        return Err(format!("restore answered {out:?}"));
    }
    let lapsed: u64 = case
        .holds
        .iter()
        .filter(|h| h.2)
        .map(|h| u64::from(h.1))
        .sum();
    let s = h
        .inv
        .read(&ev)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("event missing after restore")?;
    // Lapsed units go back on sale up to total − held − confirmed.
    let room = case
        .total
        .saturating_sub(held - lapsed)
        .saturating_sub(confirmed);
    let mut available = (record.available() + lapsed).min(room);
    let want = (Some(available), held - lapsed, confirmed);
    if (s.available, s.held, s.confirmed) != want {
        return Err(format!("after restore {s:?}, want {want:?}"));
    }
    // Consistent once what is still out fits in the total.
    let consistent = held - lapsed + confirmed <= case.total;
    if consistent != s.invariant_holds {
        return Err(format!(
            "invariant_holds {} for {case:?}",
            s.invariant_holds
        ));
    }
    if available + s.held + s.confirmed > case.total.max(held + confirmed) {
        return Err(format!("more on sale than the record allows: {s:?}"));
    }
    // Cart counts: confirmed + live held per visitor.
    let mut carts: BTreeMap<String, u64> = BTreeMap::new();
    for (v, q) in &record.confirmed {
        *carts.entry(v.clone()).or_default() += q;
    }
    for (o, (_, _, lapsed)) in record.open_holds.iter().zip(&case.holds) {
        if !lapsed {
            *carts.entry(o.visitor.clone()).or_default() += u64::from(o.qty);
        }
    }
    for i in 0..4u8 {
        let v = visitor(i);
        let have = carts.get(&v).copied().unwrap_or(0);
        let out = h
            .inv
            .hold(&ev, &v, 1, None)
            .await
            .map_err(|e| e.to_string())?;
        let ok = if have + 1 > u64::from(case.cart_limit) {
            matches!(out, HoldOutcome::CartLimitExceeded { held, .. } if u64::from(held) == have)
        } else if available >= 1 {
            available -= 1;
            matches!(out, HoldOutcome::Held(_))
        } else {
            matches!(out, HoldOutcome::SoldOut { available: 0 })
        };
        if !ok {
            return Err(format!("{v} (cart {have}, available {available}): {out:?}"));
        }
    }
    Ok(())
}
