//! Rebuilding an event with categories (`Inventory::restore_with_categories`),
//! on every store: each category's counters, the holds' breakdowns and the
//! carts per category come back exactly, no tier can be sold past what it
//! has left, and a record that cannot be restored exactly is refused with
//! nothing written.

use std::collections::HashMap;
use std::time::Duration;

use super::{Harness, held, spec};
use crate::{
    CategoryId, CategoryRecord, CategorySpec, CategoryState, ConfirmOutcome, EventId, EventRecord,
    HoldId, HoldOutcome, HoldStatus, Inventory, Item, OpenHold, ReleaseOutcome, RestoreOutcome,
    SetStockOutcome, SoldHold, TransitionKind,
};

fn cat(id: &str) -> CategoryId {
    CategoryId::parse(id).unwrap()
}

fn items(list: &[(&str, u32)]) -> Vec<Item> {
    list.iter()
        .map(|(c, q)| Item {
            category: cat(c),
            qty: *q,
        })
        .collect()
}

/// floor: 6 units, at most 2 per visitor; vip: 3 units, no own limit.
fn tiers() -> Vec<CategorySpec> {
    vec![
        CategorySpec {
            id: cat("floor"),
            total: 6,
            cart_limit: Some(2),
        },
        CategorySpec {
            id: cat("vip"),
            total: 3,
            cart_limit: None,
        },
    ]
}

/// The record of a lost sale of [`tiers`] (cart limit 4): alice holds
/// floor 1 + vip 1 and bought vip 1; bob holds floor 2.
struct Lost {
    record: EventRecord,
    cats: CategoryRecord,
    alice: OpenHold,
    bob: OpenHold,
    sold: SoldHold,
}

fn lost_sale(h: &Harness, ev: &EventId) -> Lost {
    let deadline = h.now_ms() + 300_000;
    let alice = OpenHold {
        hold_id: HoldId::generate(ev),
        visitor: "alice".into(),
        qty: 2,
        expires_at_ms: deadline,
    };
    let bob = OpenHold {
        hold_id: HoldId::generate(ev),
        visitor: "bob".into(),
        qty: 2,
        expires_at_ms: deadline,
    };
    let sold = SoldHold {
        hold_id: HoldId::generate(ev),
        visitor: "alice".into(),
        qty: 1,
    };
    let record = EventRecord {
        total: 9,
        version: 3,
        confirmed: vec![("alice".into(), 1)],
        open_holds: vec![alice.clone(), bob.clone()],
        confirmed_holds: vec![sold.clone()],
    };
    let hold_items = HashMap::from([
        (
            alice.hold_id.to_string(),
            items(&[("floor", 1), ("vip", 1)]),
        ),
        (bob.hold_id.to_string(), items(&[("floor", 2)])),
        (sold.hold_id.to_string(), items(&[("vip", 1)])),
    ]);
    let cats = CategoryRecord {
        categories: tiers(),
        hold_items,
        confirmed: vec![("alice".into(), cat("vip"), 1)],
    };
    Lost {
        record,
        cats,
        alice,
        bob,
        sold,
    }
}

async fn categories_of(h: &Harness, ev: &EventId) -> Vec<CategoryState> {
    let s = h.inv.read(ev).await.unwrap().expect("event exists");
    assert!(s.invariant_holds, "invariant broken: {s:?}");
    s.categories
}

/// `(total, available, held, confirmed)` of each category, in order.
async fn tier_counts(h: &Harness, ev: &EventId) -> Vec<(String, u64, u64, u64, u64)> {
    categories_of(h, ev)
        .await
        .into_iter()
        .map(|c| (c.id.to_string(), c.total, c.available, c.held, c.confirmed))
        .collect()
}

async fn hold_items(h: &Harness, ev: &EventId, visitor: &str, list: &[(&str, u32)]) -> HoldOutcome {
    h.inv
        .hold_items(ev, visitor, &items(list), None)
        .await
        .unwrap()
}

fn cat_sold_out(category: &str, available: u64) -> HoldOutcome {
    HoldOutcome::CategorySoldOut {
        category: category.into(),
        available,
    }
}

/// A lost event with categories comes back with each category's counters,
/// the holds' breakdowns, the carts per category and across them, and its
/// categories in the `restored` entry; afterwards no tier sells past what
/// it has left, and restored holds end (release, payment) per category.
pub async fn restore_with_categories_puts_back_each_tier(h: &Harness) {
    let ttl = Duration::from_secs(600);
    let ev = h.event("tiers-restore");
    let lost = lost_sale(h, &ev);
    assert!(matches!(
        h.inv
            .set_stock_with_categories(&ev, &spec(0, 4, ttl, 3), &tiers())
            .await
            .unwrap(),
        SetStockOutcome::Created { .. }
    ));
    h.lose(&ev).await;
    assert_eq!(h.inv.read(&ev).await.unwrap(), None);
    let restored_spec = spec(9, 4, ttl, 1);
    let restore = || {
        h.inv
            .restore_with_categories(&ev, &restored_spec, &lost.record, &lost.cats)
    };
    assert_eq!(
        restore().await.unwrap(),
        RestoreOutcome::Restored {
            available: 4,
            held: 4,
            confirmed: 1
        }
    );
    assert_eq!(restore().await.unwrap(), RestoreOutcome::Present);
    assert_eq!(h.counts(&ev).await, (4, 4, 1));
    assert_eq!(
        tier_counts(h, &ev).await,
        vec![("floor".into(), 6, 3, 3, 0), ("vip".into(), 3, 1, 1, 1)]
    );
    let limits: Vec<Option<u32>> = categories_of(h, &ev)
        .await
        .iter()
        .map(|c| c.cart_limit)
        .collect();
    assert_eq!(limits, vec![Some(2), None]);
    let last = h.inv.recent_transitions(&ev, 1).await.unwrap();
    assert_eq!(
        (last[0].kind, last[0].qty, &last[0].categories),
        (TransitionKind::Restored, 9, &tiers())
    );
    // Each restored hold keeps its breakdown; the sold one too.
    let view = h
        .inv
        .get_hold(&lost.alice.hold_id, "alice")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (view.status, view.items.clone()),
        (HoldStatus::Held, items(&[("floor", 1), ("vip", 1)]))
    );
    let view = h
        .inv
        .get_hold(&lost.sold.hold_id, "alice")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (view.status, view.items),
        (HoldStatus::Confirmed, items(&[("vip", 1)]))
    );

    // Carts: bob has floor 2 of 2; alice 3 of 4 across categories.
    assert_eq!(
        hold_items(h, &ev, "bob", &[("floor", 1)]).await,
        HoldOutcome::CategoryCartLimitExceeded {
            category: "floor".into(),
            limit: 2,
            held: 2
        }
    );
    assert_eq!(
        hold_items(h, &ev, "alice", &[("vip", 2)]).await,
        HoldOutcome::CartLimitExceeded { limit: 4, held: 3 }
    );
    // No tier sells past what it has left: vip 1, floor 3.
    assert_eq!(
        hold_items(h, &ev, "carol", &[("vip", 2)]).await,
        cat_sold_out("vip", 1)
    );
    held(hold_items(h, &ev, "carol", &[("vip", 1), ("floor", 2)]).await);
    assert_eq!(
        hold_items(h, &ev, "dave", &[("vip", 1)]).await,
        cat_sold_out("vip", 0)
    );
    assert_eq!(
        hold_items(h, &ev, "dave", &[("floor", 2)]).await,
        cat_sold_out("floor", 1)
    );
    held(hold_items(h, &ev, "dave", &[("floor", 1)]).await);
    assert_eq!(
        hold_items(h, &ev, "erin", &[("floor", 1)]).await,
        cat_sold_out("floor", 0)
    );
    assert_eq!(h.counts(&ev).await, (0, 8, 1));

    // Restored holds end per category: alice's release gives floor 1 and
    // vip 1 back (once); bob's payment sells floor 2.
    assert_eq!(
        h.inv.release(&lost.alice.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        h.inv.release(&lost.alice.hold_id, "alice").await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(
        h.inv
            .confirm(&lost.bob.hold_id, "pay-bob", true)
            .await
            .unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        tier_counts(h, &ev).await,
        vec![("floor".into(), 6, 1, 3, 2), ("vip".into(), 3, 1, 1, 1)]
    );
    let last = h.inv.recent_transitions(&ev, 2).await.unwrap();
    assert_eq!(
        last.iter()
            .map(|t| (t.kind, t.items.clone()))
            .collect::<Vec<_>>(),
        vec![
            (TransitionKind::Released, items(&[("floor", 1), ("vip", 1)])),
            (TransitionKind::Confirmed, items(&[("floor", 2)])),
        ]
    );
    // A category cannot be set below what the rebuild says is committed.
    let mut smaller = tiers();
    smaller[0].total = 4;
    assert_eq!(
        h.inv
            .set_stock_with_categories(&ev, &spec(0, 4, ttl, 4), &smaller)
            .await
            .unwrap(),
        SetStockOutcome::CategoryBelowCommitted {
            category: "floor".into(),
            held: 3,
            confirmed: 2
        }
    );
}

/// A record whose categories cannot be restored exactly (a hold without
/// its breakdown, a breakdown that does not add up or names an unknown
/// category, totals that do not add up, units sold in an unknown category)
/// is refused, and the store is left without the event: never restored as
/// an event without categories, never partly.
pub async fn restore_with_categories_refuses_inexact_records(h: &Harness) {
    let ttl = Duration::from_secs(600);
    let ev = h.event("tiers-inexact");
    let lost = lost_sale(h, &ev);
    let mut cases: Vec<(&str, CategoryRecord)> = Vec::new();
    let mut c = lost.cats.clone();
    c.hold_items.remove(lost.bob.hold_id.as_str());
    cases.push(("an open hold without breakdown", c));
    let mut c = lost.cats.clone();
    c.hold_items.remove(lost.sold.hold_id.as_str());
    cases.push(("a sold hold without breakdown", c));
    let mut c = lost.cats.clone();
    c.hold_items
        .insert(lost.bob.hold_id.to_string(), items(&[("floor", 1)]));
    cases.push(("a breakdown short of the qty", c));
    let mut c = lost.cats.clone();
    c.hold_items
        .insert(lost.bob.hold_id.to_string(), items(&[("balcony", 2)]));
    cases.push(("an unknown category in a hold", c));
    let mut c = lost.cats.clone();
    c.categories[1].total = 4;
    cases.push(("totals not adding up", c));
    let mut c = lost.cats.clone();
    c.confirmed.push(("bob".into(), cat("balcony"), 1));
    cases.push(("units sold in an unknown category", c));
    let mut c = lost.cats.clone();
    c.categories[0].cart_limit = Some(0);
    cases.push(("a category cart limit of 0", c));
    for (why, c) in cases {
        let out = h
            .inv
            .restore_with_categories(&ev, &spec(9, 4, ttl, 1), &lost.record, &c)
            .await
            .unwrap();
        assert!(
            matches!(out, RestoreOutcome::Invalid { .. }),
            "{why}: {out:?}"
        );
        assert_eq!(h.inv.read(&ev).await.unwrap(), None, "{why}: written");
    }
    // The same record, whole, restores.
    assert!(matches!(
        h.inv
            .restore_with_categories(&ev, &spec(9, 4, ttl, 1), &lost.record, &lost.cats)
            .await
            .unwrap(),
        RestoreOutcome::Restored { .. }
    ));
}
