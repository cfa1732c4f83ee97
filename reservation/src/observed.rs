//! Any [`Inventory`] with hooks on the calls the sharded router makes, for
//! benches and tests that count them or act between them
//! (`tests/examples/shard_bench.rs` counts a hold's calls; the conformance
//! test of a buyer who always loses has a rival take units as they land):
//! one pass-through of the whole trait instead of one per use.

use std::future::Future;

use crate::feed::{FeedOutcome, StockRow};
use crate::record::{CategoryRecord, EventRecord, RestoreOutcome};
use crate::sharded::{LayoutOutcome, PendingTransfer, ShardLayout, TransferIn, TransferOut};
use crate::types::*;
use crate::{Inventory, Result};

/// A call the router makes, as [`Observer::before`] hears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// [`Inventory::hold_in_layout`].
    Hold,
    /// [`Inventory::transfer_out`].
    TransferOut,
    /// [`Inventory::transfer_in`].
    TransferIn,
    /// [`Inventory::read`].
    Read,
}

/// What an [`Observed`] store does around the router's calls.
pub trait Observer: Send + Sync {
    /// Before each of the router's calls.
    fn before(&self, _call: Call) {}

    /// After a transfer's units landed on `to` (or were found there
    /// already), with the store underneath, before the caller hears it.
    fn landed<I: Inventory>(
        &self,
        _inner: &I,
        _to: &EventId,
        _qty: u64,
        _landed: &TransferIn,
    ) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
}

/// `inner`, with `observer` told of the router's calls.
#[derive(Clone)]
pub struct Observed<I, O> {
    /// The store.
    pub inner: I,
    /// What hears its calls.
    pub observer: O,
}

impl<I: Inventory, O: Observer> Inventory for Observed<I, O> {
    async fn hold_in_layout(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        key: Option<&str>,
        shards: u32,
    ) -> Result<HoldOutcome> {
        self.observer.before(Call::Hold);
        self.inner
            .hold_in_layout(event, visitor, qty, key, shards)
            .await
    }
    async fn transfer_out(
        &self,
        from: &EventId,
        to: &EventId,
        id: &str,
        max: u64,
    ) -> Result<TransferOut> {
        self.observer.before(Call::TransferOut);
        self.inner.transfer_out(from, to, id, max).await
    }
    async fn transfer_in(
        &self,
        to: &EventId,
        from: &EventId,
        id: &str,
        qty: u64,
    ) -> Result<TransferIn> {
        self.observer.before(Call::TransferIn);
        let landed = self.inner.transfer_in(to, from, id, qty).await?;
        self.observer.landed(&self.inner, to, qty, &landed).await?;
        Ok(landed)
    }
    async fn read(&self, e: &EventId) -> Result<Option<EventState>> {
        self.observer.before(Call::Read);
        self.inner.read(e).await
    }
    // The rest as they are.
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
