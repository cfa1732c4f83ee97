//! A buyer of a sharded event who loses every race for the units pulled
//! to its home: a thief wrapped around the store takes them the moment
//! they land, before the buyer's next hold there. However often it
//! loses, the router's answer is a hold, or "sold out" only when nothing
//! is left, or "try again" ([`crate::ReservationError::Contended`]); never "sold out"
//! while units are there (the CI run of a09a853 caught that after twelve
//! lost rounds).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::{Harness, spec};
use crate::sharded::{
    LayoutOutcome, PendingTransfer, ROUTER_ROUNDS, ROUTER_ROUNDS_MAX, ShardLayout, Sharded,
    TransferIn, TransferOut, home_shard,
};
use crate::{
    CategoryRecord, CategorySpec, ConfirmOutcome, EventId, EventRecord, EventState, FeedOutcome,
    HoldId, HoldOutcome, HoldView, Inventory, InventoryBackend, Item, LoadOutcome, ReleaseOutcome,
    RestoreOutcome, Result, ScheduleOutcome, SetStockOutcome, StockRow, StockSpec, Transition,
    Wave,
};

/// The store, with a thief at one shard: after each transfer lands
/// there, while `steals` lasts, a visitor of that home holds the units
/// that landed (the buyer's rivals, always one step ahead).
#[derive(Clone)]
struct Thief {
    inner: InventoryBackend,
    watched: EventId,
    home: u32,
    shards: u32,
    steals: Arc<AtomicU32>,
    stolen: Arc<AtomicU64>,
    names: Arc<AtomicU64>,
}

impl Thief {
    /// A fresh visitor whose home is the watched shard.
    fn rival(&self, home: u32) -> String {
        loop {
            let n = self.names.fetch_add(1, Ordering::Relaxed);
            let v = format!("rival-{n}");
            if home_shard(&v, self.shards) == home {
                return v;
            }
        }
    }
}

impl Inventory for Thief {
    async fn transfer_in(
        &self,
        to: &EventId,
        from: &EventId,
        id: &str,
        qty: u64,
    ) -> Result<TransferIn> {
        let landed = self.inner.transfer_in(to, from, id, qty).await?;
        let fresh = matches!(landed, TransferIn::Applied { .. });
        if fresh
            && *to == self.watched
            && self
                .steals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            let rival = self.rival(self.home);
            let q = u32::try_from(qty).expect("a cart's units");
            match self
                .inner
                .hold_in_layout(to, &rival, q, None, self.shards)
                .await?
            {
                HoldOutcome::Held(_) => {
                    self.stolen.fetch_add(qty, Ordering::SeqCst);
                }
                other => panic!("the rival's hold of {qty} landed units: {other:?}"),
            }
        }
        Ok(landed)
    }

    // The rest as they are.
    async fn hold_in_layout(
        &self,
        e: &EventId,
        v: &str,
        q: u32,
        k: Option<&str>,
        s: u32,
    ) -> Result<HoldOutcome> {
        self.inner.hold_in_layout(e, v, q, k, s).await
    }
    async fn transfer_out(
        &self,
        from: &EventId,
        to: &EventId,
        id: &str,
        max: u64,
    ) -> Result<TransferOut> {
        self.inner.transfer_out(from, to, id, max).await
    }
    async fn set_stock_with_categories(
        &self,
        e: &EventId,
        s: &StockSpec,
        c: &[CategorySpec],
    ) -> Result<SetStockOutcome> {
        self.inner.set_stock_with_categories(e, s, c).await
    }
    async fn load_if_new_with_categories(
        &self,
        e: &EventId,
        s: &StockSpec,
        c: &[CategorySpec],
    ) -> Result<LoadOutcome> {
        self.inner.load_if_new_with_categories(e, s, c).await
    }
    async fn loaded_version(&self, e: &EventId) -> Result<Option<u64>> {
        self.inner.loaded_version(e).await
    }
    async fn remember_loaded(&self, e: &EventId, v: u64) -> Result<()> {
        self.inner.remember_loaded(e, v).await
    }
    async fn restore_with_categories(
        &self,
        e: &EventId,
        s: &StockSpec,
        r: &EventRecord,
        c: &CategoryRecord,
    ) -> Result<RestoreOutcome> {
        self.inner.restore_with_categories(e, s, r, c).await
    }
    async fn apply_stock(&self, e: &EventId, r: &StockRow) -> Result<FeedOutcome> {
        self.inner.apply_stock(e, r).await
    }
    async fn hold_items(
        &self,
        e: &EventId,
        v: &str,
        i: &[Item],
        k: Option<&str>,
    ) -> Result<HoldOutcome> {
        self.inner.hold_items(e, v, i, k).await
    }
    async fn set_layout(&self, e: &EventId, l: &ShardLayout) -> Result<LayoutOutcome> {
        self.inner.set_layout(e, l).await
    }
    async fn transfer_done(&self, from: &EventId, id: &str) -> Result<()> {
        self.inner.transfer_done(from, id).await
    }
    async fn pending_transfers(&self, from: &EventId) -> Result<Vec<PendingTransfer>> {
        self.inner.pending_transfers(from).await
    }
    async fn get_hold(&self, h: &HoldId, v: &str) -> Result<Option<HoldView>> {
        self.inner.get_hold(h, v).await
    }
    async fn release(&self, h: &HoldId, v: &str) -> Result<ReleaseOutcome> {
        self.inner.release(h, v).await
    }
    async fn confirm(&self, h: &HoldId, p: &str, ok: bool) -> Result<ConfirmOutcome> {
        self.inner.confirm(h, p, ok).await
    }
    async fn reap(&self, e: &EventId, max: usize) -> Result<usize> {
        self.inner.reap(e, max).await
    }
    async fn read(&self, e: &EventId) -> Result<Option<EventState>> {
        self.inner.read(e).await
    }
    async fn schedule_waves(&self, e: &EventId, w: &[Wave]) -> Result<ScheduleOutcome> {
        self.inner.schedule_waves(e, w).await
    }
    async fn events(&self) -> Result<Vec<EventId>> {
        self.inner.events().await
    }
    async fn recent_transitions(&self, e: &EventId, n: usize) -> Result<Vec<Transition>> {
        self.inner.recent_transitions(e, n).await
    }
}

/// A buyer whose home is empty asks for 2 units of an event of 80 over 8
/// shards, and loses the units pulled home to a rival each time, for
/// `ROUTER_ROUNDS` + 8 steals (past where the router used to give up),
/// then for ever (until the rivals have bought everything). The first
/// sale ends in the buyer's hold; the second in "sold out" once the
/// rivals hold everything. Nothing is oversold or left in transit.
pub async fn sharded_a_buyer_who_always_loses(h: &Harness) {
    for steals in [ROUTER_ROUNDS + 8, u32::MAX] {
        let ev = h.event("loser");
        let shards = 8;
        let buyer = "the-unlucky-one";
        let home = home_shard(buyer, shards);
        let thief = Thief {
            inner: h.inv.clone(),
            watched: ev.shard(home),
            home,
            shards,
            steals: Arc::new(AtomicU32::new(0)),
            stolen: Arc::default(),
            names: Arc::default(),
        };
        let s = Sharded::new(thief.clone());
        s.set_sharded_stock(&ev, &spec(80, 4, Duration::from_secs(600), 1), shards)
            .await
            .unwrap();
        // Rivals of the same home empty it first.
        let mut emptied = 0;
        loop {
            let rival = thief.rival(home);
            match h
                .inv
                .hold_in_layout(&ev.shard(home), &rival, 1, None, shards)
                .await
                .unwrap()
            {
                HoldOutcome::Held(_) => emptied += 1,
                HoldOutcome::SoldOut { available: 0 } => break,
                other => panic!("emptying the home: {other:?}"),
            }
        }
        assert_eq!(emptied, 10);
        thief.steals.store(steals, Ordering::SeqCst);
        let answer = match s.hold(&ev, buyer, 2, None).await {
            // "Try again": nothing held, nothing told falsely.
            Err(crate::ReservationError::Contended { .. }) => HoldOutcome::NotReady,
            answer => answer.unwrap(),
        };
        let st = s.read(&ev).await.unwrap().expect("the event");
        let stolen = thief.stolen.load(Ordering::SeqCst);
        let bought = if matches!(answer, HoldOutcome::Held(_)) {
            2
        } else {
            0
        };
        let sold = 10 + stolen + bought;
        assert!(st.invariant_holds, "{st:#?}");
        assert_eq!(
            (st.held, st.in_transit, st.available),
            (sold, 0, Some(80 - sold)),
            "{answer:?} after {stolen} units stolen: {st:#?}"
        );
        if steals == u32::MAX {
            // Rivals take all they can (2 units a round: 35 rounds, within
            // the router's 48); the buyer is told the truth once they have.
            assert!(
                matches!(answer, HoldOutcome::SoldOut { available: 0 }),
                "{answer:?} after {stolen} units stolen: {st:#?}"
            );
            assert_eq!((stolen, st.available), (70, Some(0)), "{st:#?}");
        } else {
            // The rivals stop after their steals: the buyer gets its cart.
            assert!(
                stolen >= 2 * u64::from(ROUTER_ROUNDS),
                "each of the first rounds lost its units: {stolen} stolen"
            );
            const { assert!(ROUTER_ROUNDS + 8 < ROUTER_ROUNDS_MAX) };
            assert!(
                matches!(answer, HoldOutcome::Held(ref v) if v.qty == 2),
                "{answer:?} after {stolen} units stolen: {st:#?}"
            );
        }
    }
}
