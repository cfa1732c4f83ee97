//! Stock feeds ([`crate::feed`]): deltas with keys, versioned snapshots,
//! of the event and of one category, each refusal with nothing changed.
//! The random interleavings with holds, payments and expiries are in
//! [`super::model`] (an event without categories) and
//! [`super::categories`] (with).

use std::collections::HashMap;
use std::time::Duration;

use super::{Harness, held, spec};
use crate::{
    CategoryId, CategorySpec, EventId, EventState, FeedApplied, FeedOutcome, HoldOutcome,
    Inventory, Item, SetStockOutcome, StockChange, StockRow, TransitionKind,
};

fn cat(id: &str) -> CategoryId {
    CategoryId::parse(id).unwrap()
}

fn delta(category: Option<&str>, delta: i64, key: &str) -> StockRow {
    StockRow {
        category: category.map(cat),
        change: StockChange::Delta {
            delta,
            key: key.to_owned(),
        },
    }
}

fn snapshot(category: Option<&str>, total: u64, version: u64) -> StockRow {
    StockRow {
        category: category.map(cat),
        change: StockChange::Snapshot { total, version },
    }
}

async fn state(h: &Harness, ev: &EventId) -> EventState {
    let s = h.inv.read(ev).await.unwrap().unwrap();
    assert!(s.invariant_holds, "{s:?}");
    s
}

async fn apply(h: &Harness, ev: &EventId, row: &StockRow) -> FeedOutcome {
    h.inv.apply_stock(ev, row).await.unwrap()
}

fn applied(out: FeedOutcome) -> FeedApplied {
    match out {
        FeedOutcome::Applied(a) => a,
        other => panic!("expected applied, got {other:?}"),
    }
}

/// Deltas and snapshots of an event without categories: a replay answers
/// the first answer, a reused key, a negative stock, a stale or too low
/// snapshot change nothing; lapsed holds count as available.
pub async fn feed_deltas_and_snapshots(h: &Harness) {
    let ev = h.event("feed");
    let before = apply(h, &ev, &delta(None, 5, "k")).await;
    assert_eq!(before, FeedOutcome::NotReady, "no event yet");
    h.stock(&ev, 10, 4, h.short_ttl).await;
    let hold = held(h.inv.hold(&ev, "v", 3, None).await.unwrap());
    let first = applied(apply(h, &ev, &delta(None, 5, "erp-1")).await);
    assert_eq!(
        first,
        FeedApplied {
            total: 15,
            available: 12,
            category_total: None,
            category_available: None,
            version: Some(1),
        }
    );
    // Replays: the first answer, nothing moved, even after other changes.
    applied(apply(h, &ev, &delta(None, -2, "erp-2")).await);
    for _ in 0..3 {
        assert_eq!(
            apply(h, &ev, &delta(None, 5, "erp-1")).await,
            FeedOutcome::Replayed(first.clone())
        );
    }
    let s = state(h, &ev).await;
    assert_eq!((s.total, s.available, s.held), (13, Some(10), 3));
    // The same key with another delta, or with a category: refused.
    assert_eq!(
        apply(h, &ev, &delta(None, 6, "erp-1")).await,
        FeedOutcome::KeyReused
    );
    assert_eq!(
        apply(h, &ev, &delta(Some("floor"), 5, "erp-1")).await,
        FeedOutcome::KeyReused
    );
    // Held units are not removable.
    assert_eq!(
        apply(h, &ev, &delta(None, -11, "erp-3")).await,
        FeedOutcome::StockNegative { available: 10 }
    );
    // A refused key is not remembered: it applies once units allow.
    assert_eq!(
        applied(apply(h, &ev, &delta(None, -10, "erp-3")).await).available,
        0
    );
    assert_eq!(
        h.inv.hold(&ev, "w", 1, None).await.unwrap(),
        HoldOutcome::SoldOut { available: 0 }
    );
    // A category on an event without: not found.
    assert_eq!(
        apply(h, &ev, &delta(Some("floor"), 1, "erp-4")).await,
        FeedOutcome::CategoryNotFound {
            category: "floor".into()
        }
    );
    // Snapshots: the event's version guard, shared with set_stock.
    assert_eq!(
        apply(h, &ev, &snapshot(None, 20, 1)).await,
        FeedOutcome::Stale { current_version: 1 }
    );
    assert_eq!(
        apply(h, &ev, &snapshot(None, 2, 2)).await,
        FeedOutcome::BelowCommitted {
            held: 3,
            confirmed: 0
        }
    );
    let a = applied(apply(h, &ev, &snapshot(None, 20, 5)).await);
    assert_eq!((a.total, a.available, a.version), (20, 17, Some(5)));
    assert_eq!(
        h.inv
            .set_stock(&ev, &spec(30, 4, h.short_ttl, 5))
            .await
            .unwrap(),
        SetStockOutcome::Stale { current_version: 5 }
    );
    assert_eq!(h.inv.loaded_version(&ev).await.unwrap(), Some(5));
    // Bad rows: refused before the store.
    for (row, why) in [
        (delta(None, 0, "k"), "delta must not be 0"),
        (
            delta(None, 1, ""),
            "key must be 1 to 128 visible ASCII characters",
        ),
        (
            delta(None, 1, "a b"),
            "key must be 1 to 128 visible ASCII characters",
        ),
        (delta(None, i64::MIN, "k"), "delta beyond ±2^53"),
        (snapshot(None, crate::MAX_TOTAL + 1, 9), "total above 2^53"),
    ] {
        assert_eq!(
            apply(h, &ev, &row).await,
            FeedOutcome::Invalid { reason: why }
        );
    }
    assert_eq!(
        apply(h, &ev, &delta(None, crate::MAX_TOTAL as i64, "big")).await,
        FeedOutcome::Invalid {
            reason: "total above 2^53"
        }
    );
    // Lapsed holds are not held: a negative delta expires them first.
    h.advance(h.short_ttl + Duration::from_millis(150)).await;
    let a = applied(apply(h, &ev, &delta(None, -20, "erp-5")).await);
    assert_eq!((a.total, a.available), (0, 0));
    let s = state(h, &ev).await;
    assert_eq!((s.total, s.held, s.confirmed), (0, 0, 0));
    assert_eq!(
        h.inv.release(&hold.hold_id, "v").await.unwrap(),
        crate::ReleaseOutcome::Expired
    );
    // Every applied row is one `stock` entry with the new total.
    let stock: Vec<(u64, u64)> = h
        .inv
        .recent_transitions(&ev, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.kind == TransitionKind::Stock)
        .map(|t| (t.qty, t.available))
        .collect();
    assert_eq!(
        stock,
        vec![(10, 10), (15, 12), (13, 10), (3, 0), (20, 17), (0, 0)]
    );
}

/// Rows of an event with categories: each names one; each category keeps
/// its own snapshot version; totals move in the category and the event
/// together; the stream carries every category's new total.
pub async fn feed_categories(h: &Harness) {
    let ev = h.event("feedcat");
    let cats = vec![
        CategorySpec {
            id: cat("floor"),
            total: 10,
            cart_limit: None,
        },
        CategorySpec {
            id: cat("vip"),
            total: 4,
            cart_limit: Some(2),
        },
    ];
    let out = h
        .inv
        .set_stock_with_categories(&ev, &spec(0, 6, h.short_ttl, 1), &cats)
        .await
        .unwrap();
    assert!(matches!(out, SetStockOutcome::Created { .. }), "{out:?}");
    let items = vec![
        Item {
            category: cat("floor"),
            qty: 2,
        },
        Item {
            category: cat("vip"),
            qty: 2,
        },
    ];
    let hold = held(h.inv.hold_items(&ev, "v", &items, None).await.unwrap());
    assert_eq!(
        apply(h, &ev, &delta(None, 1, "k")).await,
        FeedOutcome::CategoryRequired
    );
    assert_eq!(
        apply(h, &ev, &snapshot(None, 1, 9)).await,
        FeedOutcome::CategoryRequired
    );
    assert_eq!(
        apply(h, &ev, &delta(Some("balcony"), 1, "k")).await,
        FeedOutcome::CategoryNotFound {
            category: "balcony".into()
        }
    );
    assert_eq!(
        apply(h, &ev, &delta(Some("vip"), -3, "k")).await,
        FeedOutcome::StockNegative { available: 2 }
    );
    let a = applied(apply(h, &ev, &delta(Some("vip"), 3, "k")).await);
    assert_eq!(
        a,
        FeedApplied {
            total: 17,
            available: 13,
            category_total: Some(7),
            category_available: Some(5),
            version: None,
        }
    );
    assert_eq!(
        apply(h, &ev, &delta(Some("floor"), 3, "k")).await,
        FeedOutcome::KeyReused
    );
    // Versions per category: vip's does not guard floor.
    let a = applied(apply(h, &ev, &snapshot(Some("vip"), 6, 100)).await);
    assert_eq!(
        (a.category_total, a.category_available, a.version, a.total),
        (Some(6), Some(4), Some(100), 16)
    );
    assert_eq!(
        apply(h, &ev, &snapshot(Some("vip"), 9, 100)).await,
        FeedOutcome::Stale {
            current_version: 100
        }
    );
    assert_eq!(
        apply(h, &ev, &snapshot(Some("vip"), 1, 101)).await,
        FeedOutcome::CategoryBelowCommitted {
            category: "vip".into(),
            held: 2,
            confirmed: 0
        }
    );
    let a = applied(apply(h, &ev, &snapshot(Some("floor"), 30, 7)).await);
    assert_eq!(
        (a.total, a.category_total, a.version),
        (36, Some(30), Some(7))
    );
    // A set_stock keeps the categories' versions; dropping a category
    // forgets its version.
    let mut again = cats.clone();
    again[0].total = 30;
    again[1].total = 6;
    h.inv
        .set_stock_with_categories(&ev, &spec(0, 6, h.short_ttl, 2), &again)
        .await
        .unwrap();
    assert_eq!(
        apply(h, &ev, &snapshot(Some("floor"), 31, 7)).await,
        FeedOutcome::Stale { current_version: 7 }
    );
    let s = state(h, &ev).await;
    let counts: HashMap<String, (u64, u64, u64)> = s
        .categories
        .iter()
        .map(|c| (c.id.to_string(), (c.total, c.available, c.held)))
        .collect();
    assert_eq!(counts["floor"], (30, 28, 2));
    assert_eq!(counts["vip"], (6, 4, 2));
    assert_eq!((s.total, s.available), (36, Some(32)));
    // Lapsed holds give their units back before a negative delta.
    h.advance(h.short_ttl + Duration::from_millis(150)).await;
    let a = applied(apply(h, &ev, &delta(Some("vip"), -6, "k2")).await);
    assert_eq!((a.category_total, a.category_available), (Some(0), Some(0)));
    assert_eq!(
        h.inv.release(&hold.hold_id, "v").await.unwrap(),
        crate::ReleaseOutcome::Expired
    );
    let s = state(h, &ev).await;
    assert_eq!((s.total, s.available, s.held), (30, Some(30), 0));
    // The stream: every category's total on each feed entry.
    let last = h
        .inv
        .recent_transitions(&ev, 1)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(last.kind, TransitionKind::Stock);
    assert_eq!(last.qty, 30);
    let totals: Vec<(String, u64)> = last
        .categories
        .iter()
        .map(|c| (c.id.to_string(), c.total))
        .collect();
    assert_eq!(totals, vec![("floor".into(), 30), ("vip".into(), 0)]);
}

/// Racing rows and holds: 60 holds of one unit, 60 deltas of −1 (each its
/// own key) and 20 copies of one +5 delta (one key), all at once on 100
/// units. The +5 is applied once (every copy answers the same), no unit is
/// both removed and held, and the counters add up to exactly what the
/// answers say.
pub async fn feed_race(h: &Harness) {
    let ev = h.event("feedrace");
    h.stock(&ev, 100, 1, Duration::from_secs(600)).await;
    let mut tasks = Vec::new();
    for i in 0..60 {
        let inv = h.inv.clone();
        let e = ev.clone();
        tasks.push(tokio::spawn(async move {
            let ev = e;
            let out = inv.hold(&ev, &format!("v{i}"), 1, None).await.unwrap();
            (0, matches!(out, HoldOutcome::Held(_)) as u64, None)
        }));
        let inv = h.inv.clone();
        let e = ev.clone();
        tasks.push(tokio::spawn(async move {
            let ev = e;
            let out = inv
                .apply_stock(&ev, &delta(None, -1, &format!("dmg-{i}")))
                .await
                .unwrap();
            match out {
                FeedOutcome::Applied(_) => (1, 0, None),
                FeedOutcome::StockNegative { .. } => (0, 0, None),
                other => panic!("{other:?}"),
            }
        }));
        if i % 3 == 0 {
            let inv = h.inv.clone();
            let ev = ev.clone();
            tasks.push(tokio::spawn(async move {
                let out = inv.apply_stock(&ev, &delta(None, 5, "po-1")).await.unwrap();
                (0, 0, Some(out))
            }));
        }
    }
    let (mut removed, mut held_n, mut plus) = (0u64, 0u64, Vec::new());
    for t in tasks {
        let (r, hd, p) = t.await.unwrap();
        removed += r;
        held_n += hd;
        plus.extend(p);
    }
    let firsts: Vec<&FeedApplied> = plus
        .iter()
        .filter_map(|o| match o {
            FeedOutcome::Applied(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(firsts.len(), 1, "{plus:?}");
    for o in &plus {
        if let FeedOutcome::Replayed(a) = o {
            assert_eq!(a, firsts[0]);
        }
    }
    let s = state(h, &ev).await;
    assert_eq!(s.total, 105 - removed, "{s:?}");
    assert_eq!(s.held, held_n, "{s:?}");
    assert_eq!(s.available, Some(s.total - held_n), "{s:?}");
    // 120 one-unit demands on at most 105 units: some were refused, each
    // at a moment nothing was available; only the +5 can come after.
    assert!(removed + held_n <= 105, "{removed} + {held_n}");
    assert!(s.available.unwrap() <= 5, "{s:?}");
}
