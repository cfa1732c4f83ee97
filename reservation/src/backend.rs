//! [`InventoryBackend`]: the store a gateway holds, one concrete type, so
//! generics stop here.

use crate::Inventory;
use crate::error::Result;
use crate::feed::{FeedOutcome, StockRow};
use crate::memory::MemoryInventory;
use crate::record::{CategoryRecord, EventRecord, RestoreOutcome};
use crate::redis::RedisInventory;
use crate::sharded::{LayoutOutcome, PendingTransfer, ShardLayout, TransferIn, TransferOut};
use crate::types::*;

#[derive(Clone)]
pub enum InventoryBackend {
    /// One process, no Redis.
    Memory(MemoryInventory),
    /// Shared by every gateway through Redis.
    Redis(RedisInventory),
}

macro_rules! delegate {
    ($self:ident, $inv:ident => $call:expr) => {
        match $self {
            InventoryBackend::Memory($inv) => $call.await,
            InventoryBackend::Redis($inv) => $call.await,
        }
    };
}

impl Inventory for InventoryBackend {
    async fn set_stock_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        categories: &[CategorySpec],
    ) -> Result<SetStockOutcome> {
        delegate!(self, inv => inv.set_stock_with_categories(event, spec, categories))
    }

    async fn load_if_new_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        categories: &[CategorySpec],
    ) -> Result<LoadOutcome> {
        delegate!(self, inv => inv.load_if_new_with_categories(event, spec, categories))
    }

    async fn restore_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        record: &EventRecord,
        categories: &CategoryRecord,
    ) -> Result<RestoreOutcome> {
        delegate!(self, inv => inv.restore_with_categories(event, spec, record, categories))
    }

    async fn apply_stock(&self, event: &EventId, row: &StockRow) -> Result<FeedOutcome> {
        delegate!(self, inv => inv.apply_stock(event, row))
    }

    async fn hold_items(
        &self,
        event: &EventId,
        visitor: &str,
        items: &[Item],
        idempotency_key: Option<&str>,
    ) -> Result<HoldOutcome> {
        delegate!(self, inv => inv.hold_items(event, visitor, items, idempotency_key))
    }

    async fn loaded_version(&self, event: &EventId) -> Result<Option<u64>> {
        delegate!(self, inv => inv.loaded_version(event))
    }

    async fn remember_loaded(&self, event: &EventId, version: u64) -> Result<()> {
        delegate!(self, inv => inv.remember_loaded(event, version))
    }

    async fn hold_in_layout(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
        shards: u32,
    ) -> Result<HoldOutcome> {
        delegate!(self, inv => inv.hold_in_layout(event, visitor, qty, idempotency_key, shards))
    }

    async fn set_layout(&self, event: &EventId, layout: &ShardLayout) -> Result<LayoutOutcome> {
        delegate!(self, inv => inv.set_layout(event, layout))
    }

    async fn transfer_out(
        &self,
        from: &EventId,
        to: &EventId,
        id: &str,
        max: u64,
    ) -> Result<TransferOut> {
        delegate!(self, inv => inv.transfer_out(from, to, id, max))
    }

    async fn transfer_in(
        &self,
        to: &EventId,
        from: &EventId,
        id: &str,
        qty: u64,
    ) -> Result<TransferIn> {
        delegate!(self, inv => inv.transfer_in(to, from, id, qty))
    }

    async fn transfer_done(&self, from: &EventId, id: &str) -> Result<()> {
        delegate!(self, inv => inv.transfer_done(from, id))
    }

    async fn pending_transfers(&self, from: &EventId) -> Result<Vec<PendingTransfer>> {
        delegate!(self, inv => inv.pending_transfers(from))
    }

    async fn get_hold(&self, hold_id: &HoldId, visitor: &str) -> Result<Option<HoldView>> {
        delegate!(self, inv => inv.get_hold(hold_id, visitor))
    }

    async fn release(&self, hold_id: &HoldId, visitor: &str) -> Result<ReleaseOutcome> {
        delegate!(self, inv => inv.release(hold_id, visitor))
    }

    async fn confirm(
        &self,
        hold_id: &HoldId,
        payment_event_id: &str,
        succeeded: bool,
    ) -> Result<ConfirmOutcome> {
        delegate!(self, inv => inv.confirm(hold_id, payment_event_id, succeeded))
    }

    async fn reap(&self, event: &EventId, max: usize) -> Result<usize> {
        delegate!(self, inv => inv.reap(event, max))
    }

    async fn read(&self, event: &EventId) -> Result<Option<EventState>> {
        delegate!(self, inv => inv.read(event))
    }

    async fn schedule_waves(&self, event: &EventId, waves: &[Wave]) -> Result<ScheduleOutcome> {
        delegate!(self, inv => inv.schedule_waves(event, waves))
    }

    async fn events(&self) -> Result<Vec<EventId>> {
        delegate!(self, inv => inv.events())
    }

    async fn recent_transitions(&self, event: &EventId, n: usize) -> Result<Vec<Transition>> {
        delegate!(self, inv => inv.recent_transitions(event, n))
    }
}

/// What a gateway holds: its backend with sharded events routed
/// ([`crate::sharded::Sharded`]; plain events pass straight through).
pub type StockBackend = crate::sharded::Sharded<InventoryBackend>;

impl InventoryBackend {
    /// Applies feed rows of one event in order: in one pipeline on Redis
    /// ([`RedisInventory::apply_stock_batch`]), one at a time in memory.
    /// On an error some rows may have been applied: retry the batch whole
    /// (rows are idempotent).
    pub async fn apply_stock_batch(
        &self,
        event: &EventId,
        rows: &[StockRow],
    ) -> Result<Vec<FeedOutcome>> {
        match self {
            InventoryBackend::Redis(r) => r.apply_stock_batch(event, rows).await,
            InventoryBackend::Memory(m) => {
                let mut out = Vec::with_capacity(rows.len());
                for row in rows {
                    out.push(m.apply_stock(event, row).await?);
                }
                Ok(out)
            }
        }
    }
}
