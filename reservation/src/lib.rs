//! Stock, holds and payment confirmation for sluice: the part that must
//! never sell a unit twice.
//!
//! Admitted visitors reserve stock through the gateway; this crate decides
//! each reservation in one atomic step (one Lua script in Redis, one
//! critical section in memory) and knows nothing of HTTP.
//!
//! # Vocabulary
//!
//! - **event**: one thing on sale with its own stock, named by an
//!   [`EventId`] (`[A-Za-z0-9_-]{1,64}`), guarded by a room.
//! - **stock**: `total` units; at every moment each unit is exactly one of
//!   *available*, *held* or *confirmed* (sold).
//! - **hold**: units taken by one visitor for a while ([`HoldId`] =
//!   `{event}.{128 random bits}`); it ends in exactly one of *confirmed*
//!   (paid), *released* (by its visitor or a failed payment) or *expired*.
//! - **cart limit**: most units one visitor may hold and buy together
//!   (held + confirmed + asked ≤ limit).
//! - **hold TTL**: how long a hold lasts; its **deadline** is the store's
//!   clock at the hold plus the TTL. A hold past its deadline *is* expired,
//!   for every reader at once, even before the reaper visits it.
//! - **idempotency key**: the `Idempotency-Key` a client sends with a hold;
//!   the same key from the same visitor returns the same hold (for 24 h,
//!   while the hold is retained; then a new hold, with a new id).
//! - **retention**: how long an ended hold's record is kept ([`Retention`]:
//!   10 minutes after a release or a lapse, 180 days after a payment, by
//!   default). Forgetting a record changes no counter.
//! - **payment event id**: the webhook's id; the same id for the same hold
//!   answers the same and changes nothing (for 7 days); the same id for
//!   another hold of the event is refused ([`ConfirmOutcome::PaymentReused`]).
//!   A provider's payment event is about one payment, so one hold.
//! - **reaper**: returns the stock of expired holds; any number of gateways
//!   may run it at once ([`Inventory::reap`]). Holds, reads and releases
//!   also reap what they meet, so the reaper is a sweeper, not a
//!   precondition: no answer depends on whether it came by (a hold expires
//!   the visitor's own lapsed holds before its cart check, and lapsed holds
//!   until enough units are back before answering sold out; a read reaps
//!   every lapsed hold, in bounded steps, before it counts).
//! - **load marker**: a key per event outside the event's own keys, with
//!   the highest version ever set, so a store that lost the event (its
//!   keys evicted or deleted) is told apart from one that never had it:
//!   configured stock is loaded only into the latter
//!   ([`Inventory::load_if_new`]).
//! - **feed row**: a stock change from an ERP or a marketplace
//!   ([`Inventory::apply_stock`]): a *delta* (`±n` units, with an
//!   idempotency key remembered [`FEED_KEY_TTL`]) or a *snapshot* (an
//!   absolute total with a source version, applied only above the last
//!   one: the event's version, or each category's own), of the event or
//!   one category ([`feed`]).
//! - **wave**: units scheduled to go on sale at a time ([`Wave`]: `at`
//!   by the store's clock, `qty`, the category for an event with
//!   categories). The event keeps a schedule of pending waves
//!   ([`Inventory::schedule_waves`] replaces it whole, in one step). A
//!   wave due by the store's clock is released lazily by whatever
//!   operation meets it first — every hold (before its sold-out
//!   decision), read, reap and stock change — so no answer depends on a
//!   timer having fired: its units are added to the total and to
//!   available (the event's and the category's), exactly once (whoever
//!   removes it from the schedule in its atomic step applies it), with a
//!   `stock` stream entry `reason=wave` carrying the new total. A wave
//!   whose category no longer exists when it comes due (a stock change
//!   removed it) is dropped without units.
//! - **stream**: the event's log of transitions (`held`, `confirmed`,
//!   `released`, `expired`, `stock`, `restored`), a Redis Stream an origin consumes with
//!   a consumer group (fields in `STREAM.md`), a bounded ring in memory.
//!
//! # Layout
//!
//! - [`types`]: ids, [`StockSpec`], outcomes and views.
//! - [`memory`]: [`MemoryInventory`], the reference semantics (embedded
//!   default: one gateway, no Redis), with an injected [`Clock`].
//! - [`redis`]: [`RedisInventory`], the key schema, and the scripts in
//!   `lua/*.lua` (one per operation, `common.lua` prepended), run on the
//!   connection every store shares (`sluice_redis::RedisConn`, opened from
//!   [`RedisConfig::url`] by `sluice_redis::RedisUrl`).
//! - [`feed`]: stock feeds, [`StockRow`] (a delta with an idempotency
//!   key, or a versioned snapshot, of the event or one category) and
//!   [`FeedOutcome`] ([`Inventory::apply_stock`]).
//! - [`record`]: [`EventRecord`], what the ledger knows of an event, to
//!   rebuild a store that lost it.
//! - [`retention`]: how long ended holds are kept, and why.
//! - [`backend`]: [`InventoryBackend`], the enum a gateway holds.
//! - [`error`]; time through `sluice-clock`'s [`Clock`] (re-exported here
//!   with [`SystemClock`] and [`ManualClock`]), the one the admission queue
//!   uses too.
//! - `conformance` (feature `test-util`): one suite run against both
//!   stores, with a plain model for property tests.
//!
//! # Invariants (checked by the conformance suite on both stores)
//!
//! 1. `available + held + confirmed = total` after every operation. (One
//!    exception, never an oversale: a [`Inventory::restore`] of a record
//!    that holds and sold more than its total starts above it, with nothing
//!    on sale; units of holds that end unsold pay the excess off before
//!    any goes back on sale, since a returning unit never lifts `available`
//!    above `total − held − confirmed`.)
//! 2. `available` never goes below zero; no visitor ever has more than the
//!    cart limit held + confirmed.
//! 3. Each hold ends in exactly one terminal state, once.
//! 4. The stock of a released or expired hold returns exactly once,
//!    whatever number of reapers, releases and webhooks race for it. (The
//!    hold's entry in the deadline index is the token: whoever removes it
//!    returns the units or books them as confirmed.)
//! 5. A hold is never confirmed after its deadline (per the store's clock).
//! 6. A missing stock counter answers "not ready", never "sold out".
//! 7. A hold id names one hold, ever: an idempotency key whose hold was
//!    forgotten (past its [`Retention`]) takes a new hold under a new id,
//!    so a late webhook for the old id can never confirm the new one.
//! 8. Configured stock goes only into a store that never had the event
//!    ([`Inventory::load_if_new`]); a lost event stays not ready until an
//!    operator loads it ([`SetStockOutcome::Recreated`]) or a record
//!    restores it ([`Inventory::restore`], which never overwrites live
//!    counters).
//! 9. Each scheduled wave is released at most once, and never before its
//!    time by the store's clock; once due, no answer is given before it
//!    is released.

#![forbid(unsafe_code)]

use std::future::Future;

pub mod backend;
pub mod batch;
#[cfg(feature = "test-util")]
pub mod conformance;
pub mod error;
pub mod feed;
pub mod memory;
pub mod observed;
pub mod record;
pub mod redis;
pub mod retention;
pub mod sharded;
pub mod types;

pub use backend::{InventoryBackend, StockBackend};
pub use error::{ReservationError, Result};
pub use feed::{FeedApplied, FeedOutcome, StockChange, StockRow};
pub use memory::MemoryInventory;
pub use record::{CategoryRecord, EventRecord, OpenHold, RestoreOutcome, SoldHold};
pub use redis::{RedisConfig, RedisInventory};
pub use retention::{Retention, RetentionError};
pub use sharded::{
    LayoutOutcome, PendingTransfer, ShardLayout, ShardTotal, Sharded, TransferIn, TransferOut,
};
pub use sluice_clock::{Clock, ManualClock, SystemClock};
pub use types::{
    CategoryId, CategorySpec, CategoryState, ConfirmOutcome, EventId, EventState, HoldId,
    HoldOutcome, HoldStatus, HoldView, Item, LoadOutcome, ReleaseOutcome, ScheduleOutcome,
    SetStockOutcome, ShardState, StockSpec, Transition, TransitionKind, Wave,
};

use std::time::Duration;

/// How many expired holds of anyone a hold reaps on the way (besides the
/// visitor's own and those needed to answer; see `lua/hold.lua`), and how
/// many one step of a read reaps. Keeps each script short; the reaper does
/// the bulk.
pub const LAZY_REAP_MAX: usize = 64;
/// How long an idempotency key is remembered.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a stock feed's delta key is remembered after it was applied
/// (at least a day, as issue 20 asks: a replay within it changes nothing).
pub const FEED_KEY_TTL: Duration = Duration::from_secs(48 * 3600);
/// How long a payment event id's answer is remembered.
pub const PAYMENT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest accepted total: counters stay exact in Lua's doubles.
pub const MAX_TOTAL: u64 = 1 << 53;

/// The atomic operations of a stock store. Every method is one atomic step
/// in the store; business answers are values inside `Ok`, `Err` is a fault.
pub trait Inventory: Send + Sync {
    /// Loads or changes an event's stock (versioned; see
    /// [`SetStockOutcome`]).
    fn set_stock(
        &self,
        event: &EventId,
        spec: &StockSpec,
    ) -> impl Future<Output = Result<SetStockOutcome>> + Send {
        self.set_stock_with_categories(event, spec, &[])
    }

    /// Loads configured stock, only into a store that never had the event:
    /// neither its settings nor its load marker exist (see
    /// [`LoadOutcome`]). One atomic step, so two gateways starting at once
    /// load it once. A gateway calls this at start for its `[[events]]`;
    /// an operator calls [`Inventory::set_stock`].
    fn load_if_new(
        &self,
        event: &EventId,
        spec: &StockSpec,
    ) -> impl Future<Output = Result<LoadOutcome>> + Send {
        self.load_if_new_with_categories(event, spec, &[])
    }

    /// The event's load marker: the highest stock version ever set (or
    /// restored) in this store, `None` when the store never had the event.
    /// The marker outlives the event's own keys (evicted, deleted, or
    /// missing on a replica promoted before they reached it), not a
    /// `FLUSHALL`.
    fn loaded_version(&self, event: &EventId) -> impl Future<Output = Result<Option<u64>>> + Send;

    /// Writes the event's load marker back when it is missing (or below
    /// `version`): a gateway that saw the event loaded calls this when it
    /// finds the event gone, so that a `FLUSHALL` behind a running gateway
    /// still leaves a marker, and gateways restarted afterwards refuse to
    /// load configured stock into it. Changes nothing else.
    fn remember_loaded(
        &self,
        event: &EventId,
        version: u64,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Rebuilds a lost event from a durable record (the ledger's), in one
    /// atomic step: counters, settings, open holds (ids, visitors, qty,
    /// deadlines), cart counts, the load marker and a `restored` stream
    /// entry. Refused ([`RestoreOutcome::Present`]) while the store has the
    /// event's stock counter or settings: a rebuild never overwrites live
    /// counters.
    ///
    /// `total` and the holds come from `record`; cart limit, hold TTL and
    /// room from `spec`; the version is the larger of `record.version` and
    /// `spec.version`, so a stock sync the store or the ledger already saw
    /// stays stale. `available = record.available()` (clamped at 0; the
    /// excess of an overcommitted record is paid off by holds that end
    /// unsold, see invariant 1). A
    /// restored hold past its deadline is expired by the reaper or the next
    /// operation that meets it, as any lapsed hold (one `expired` entry).
    fn restore(
        &self,
        event: &EventId,
        spec: &StockSpec,
        record: &EventRecord,
    ) -> impl Future<Output = Result<RestoreOutcome>> + Send {
        async move {
            self.restore_with_categories(event, spec, record, &CategoryRecord::default())
                .await
        }
    }

    /// [`Inventory::set_stock`] of an event with categories (an empty
    /// list: an event without). `spec.total` is ignored: the event's total
    /// is the sum of the categories'. One atomic step: each category's
    /// total must stay at or above what is held and sold in it (a category
    /// left out counts as total 0), else
    /// [`SetStockOutcome::CategoryBelowCommitted`]; an event changing shape
    /// (categories to none or back) with units held or sold is
    /// [`SetStockOutcome::BelowCommitted`] (those units have no place in
    /// the new shape).
    fn set_stock_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        categories: &[CategorySpec],
    ) -> impl Future<Output = Result<SetStockOutcome>> + Send;

    /// [`Inventory::load_if_new`] of an event with categories.
    fn load_if_new_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        categories: &[CategorySpec],
    ) -> impl Future<Output = Result<LoadOutcome>> + Send;

    /// [`Inventory::restore`] of an event with categories: the record's
    /// per-category part (`categories`) restores each category's counters,
    /// the holds' breakdowns and the carts per category.
    fn restore_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        record: &EventRecord,
        categories: &CategoryRecord,
    ) -> impl Future<Output = Result<RestoreOutcome>> + Send;

    /// Applies one row of a stock feed (a delta or a snapshot, of the
    /// event or one category) in one atomic step: see [`feed`] for the
    /// rules and [`FeedOutcome`] for the answers. An applied row appends a
    /// `stock` entry to the stream.
    fn apply_stock(
        &self,
        event: &EventId,
        row: &StockRow,
    ) -> impl Future<Output = Result<FeedOutcome>> + Send;

    /// Takes units of several categories for `visitor` in one atomic step,
    /// all or nothing: every category must exist and have the units, the
    /// event's cart limit holds across categories (held + confirmed +
    /// asked, all categories) and each category's own limit within it.
    /// Refusals name the first failing item in the order given; the
    /// checks run in the order of [`HoldOutcome`]'s docs in `hold.lua`.
    fn hold_items(
        &self,
        event: &EventId,
        visitor: &str,
        items: &[Item],
        idempotency_key: Option<&str>,
    ) -> impl Future<Output = Result<HoldOutcome>> + Send;

    /// Takes `qty` units for `visitor`, checking stock and the cart limit.
    fn hold(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
    ) -> impl Future<Output = Result<HoldOutcome>> + Send {
        self.hold_in_layout(event, visitor, qty, idempotency_key, 1)
    }

    /// [`Inventory::hold`] on an event (or shard) the caller believes is
    /// split into `shards` (1: a plain event). When the layout stored with
    /// it says otherwise the answer is [`HoldOutcome::Resharded`] and
    /// nothing is held, so a caller routing by a stale layout can never
    /// put a visitor's units on a shard that is not its home
    /// ([`sharded`]). [`Inventory::hold_items`] expects 1.
    fn hold_in_layout(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
        shards: u32,
    ) -> impl Future<Output = Result<HoldOutcome>> + Send;

    /// Sets one shard's layout and shared settings in one atomic step
    /// ([`sharded::ShardLayout`], [`sharded::LayoutOutcome`]).
    fn set_layout(
        &self,
        event: &EventId,
        layout: &sharded::ShardLayout,
    ) -> impl Future<Output = Result<sharded::LayoutOutcome>> + Send;

    /// Moves up to `max` available units off shard `from` towards `to` in
    /// one atomic step: `from`'s total and available drop by what moved
    /// and a pending record `id` remembers where they go until
    /// [`Inventory::transfer_done`] (lapsed holds are expired first, as a
    /// hold does). Refused on a frozen or missing shard.
    fn transfer_out(
        &self,
        from: &EventId,
        to: &EventId,
        id: &str,
        max: u64,
    ) -> impl Future<Output = Result<sharded::TransferOut>> + Send;

    /// Lands transfer `id` of `qty` units on shard `to`: its total and
    /// available rise by `qty`, once per `id` (a replay changes nothing;
    /// ids are remembered [`FEED_KEY_TTL`]).
    fn transfer_in(
        &self,
        to: &EventId,
        from: &EventId,
        id: &str,
        qty: u64,
    ) -> impl Future<Output = Result<sharded::TransferIn>> + Send;

    /// Forgets the pending record of transfer `id` on shard `from` (it
    /// landed, or the shards were reset).
    fn transfer_done(&self, from: &EventId, id: &str) -> impl Future<Output = Result<()>> + Send;

    /// Transfers that left shard `from` and were not marked done, with
    /// their age by the store's clock.
    fn pending_transfers(
        &self,
        from: &EventId,
    ) -> impl Future<Output = Result<Vec<sharded::PendingTransfer>>> + Send;

    /// The hold, if it exists and belongs to `visitor`.
    fn get_hold(
        &self,
        hold_id: &HoldId,
        visitor: &str,
    ) -> impl Future<Output = Result<Option<HoldView>>> + Send;

    /// Gives a hold back (its owner only; idempotent).
    fn release(
        &self,
        hold_id: &HoldId,
        visitor: &str,
    ) -> impl Future<Output = Result<ReleaseOutcome>> + Send;

    /// Applies a payment outcome (idempotent by `payment_event_id`).
    fn confirm(
        &self,
        hold_id: &HoldId,
        payment_event_id: &str,
        succeeded: bool,
    ) -> impl Future<Output = Result<ConfirmOutcome>> + Send;

    /// Expires up to `max` holds of `event` whose deadline passed, oldest
    /// first; returns how many this call expired (each exactly once across
    /// all concurrent callers).
    fn reap(&self, event: &EventId, max: usize) -> impl Future<Output = Result<usize>> + Send;

    /// The event's counters and settings; `None` when the store knows
    /// nothing of it. Reaps every lapsed hold first (in steps of
    /// [`LAZY_REAP_MAX`] on Redis, one script call each), so the counters
    /// count a hold past its deadline as expired.
    fn read(&self, event: &EventId) -> impl Future<Output = Result<Option<EventState>>> + Send;

    /// Replaces the event's pending schedule of waves with `waves` (any
    /// order; stored earliest first; empty: no more waves), in one atomic
    /// step: waves of the old schedule already due are released first,
    /// then each new wave must open after the store's clock
    /// ([`ScheduleOutcome::WaveInPast`]), name a category of the event
    /// when it has categories and none otherwise
    /// ([`ScheduleOutcome::CategoryNotFound`], [`ScheduleOutcome::Invalid`]),
    /// and the total with every wave stay within 2^53. All or nothing.
    /// Emits a `stock` entry `reason=waves` with the schedule.
    fn schedule_waves(
        &self,
        event: &EventId,
        waves: &[Wave],
    ) -> impl Future<Output = Result<ScheduleOutcome>> + Send;

    /// Events whose stock was ever set (the reaper's work list).
    fn events(&self) -> impl Future<Output = Result<Vec<EventId>>> + Send;

    /// The last `n` transitions of the event, oldest first.
    fn recent_transitions(
        &self,
        event: &EventId,
        n: usize,
    ) -> impl Future<Output = Result<Vec<Transition>>> + Send;

    /// Reaps every known event, up to `max_per_event` holds each: one pass
    /// of the gateway's reaper task. Returns the holds expired in all.
    fn reap_all(&self, max_per_event: usize) -> impl Future<Output = Result<usize>> + Send {
        async move {
            let mut n = 0;
            for event in self.events().await? {
                n += self.reap(&event, max_per_event).await?;
            }
            Ok(n)
        }
    }
}

/// Validates a restore before any store sees it; `Some(reason)` when
/// refused ([`RestoreOutcome::Invalid`]).
pub(crate) fn restore_problem(
    event: &EventId,
    spec: &StockSpec,
    record: &EventRecord,
) -> Option<String> {
    if let Some(r) = spec_problem(spec) {
        return Some(format!("spec: {r}"));
    }
    if record.total > MAX_TOTAL {
        return Some("record total above 2^53".into());
    }
    let mut seen = std::collections::HashSet::new();
    let mut carts: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for h in &record.open_holds {
        if h.hold_id.event() != *event {
            return Some(format!("hold {} belongs to another event", h.hold_id));
        }
        if h.qty == 0 {
            return Some(format!("hold {} has qty 0", h.hold_id));
        }
        if h.visitor.is_empty() {
            return Some(format!("hold {} has no visitor", h.hold_id));
        }
        if !seen.insert(h.hold_id.suffix()) {
            return Some(format!("hold {} listed twice", h.hold_id));
        }
        *carts.entry(&h.visitor).or_default() += u64::from(h.qty);
    }
    for h in &record.confirmed_holds {
        if h.hold_id.event() != *event {
            return Some(format!("hold {} belongs to another event", h.hold_id));
        }
        if h.qty == 0 || h.visitor.is_empty() {
            return Some(format!("sold hold {} has qty 0 or no visitor", h.hold_id));
        }
        if !seen.insert(h.hold_id.suffix()) {
            return Some(format!("hold {} listed twice", h.hold_id));
        }
    }
    for (visitor, qty) in &record.confirmed {
        if visitor.is_empty() {
            return Some("confirmed units without a visitor".into());
        }
        *carts.entry(visitor).or_default() += qty;
    }
    if record.held().saturating_add(record.confirmed_total()) > MAX_TOTAL {
        return Some("held + confirmed above 2^53".into());
    }
    if carts.values().any(|q| *q > u64::from(u32::MAX)) {
        return Some("a visitor's cart above 2^32".into());
    }
    None
}

/// Validates the per-category part of a restore; `Some(reason)` when
/// refused. Every hold of a categorized record has a breakdown adding up
/// to its qty, over known categories.
pub(crate) fn category_restore_problem(
    record: &EventRecord,
    cats: &CategoryRecord,
) -> Option<String> {
    if let Some(r) = types::categories_problem(&cats.categories) {
        return Some(format!("categories: {r}"));
    }
    if cats.categories.is_empty() {
        return None;
    }
    let sum: u64 = cats.categories.iter().map(|c| c.total).sum();
    if sum != record.total {
        return Some("categories' totals do not add up to the total".into());
    }
    let known: std::collections::HashSet<&str> =
        cats.categories.iter().map(|c| c.id.as_str()).collect();
    let holds = record
        .open_holds
        .iter()
        .map(|h| (&h.hold_id, h.qty))
        .chain(record.confirmed_holds.iter().map(|h| (&h.hold_id, h.qty)));
    for (id, qty) in holds {
        let Some(items) = cats.hold_items.get(id.as_str()) else {
            return Some(format!("hold {id} has no category breakdown"));
        };
        let sum: u64 = items.iter().map(|i| u64::from(i.qty)).sum();
        if sum != u64::from(qty) || items.iter().any(|i| !known.contains(i.category.as_str())) {
            return Some(format!("hold {id}: breakdown does not match"));
        }
    }
    for (_, c, _) in &cats.confirmed {
        if !known.contains(c.as_str()) {
            return Some(format!("confirmed units in unknown category {c}"));
        }
    }
    None
}

/// The spec a store applies: with categories, the total is theirs.
pub(crate) fn with_category_total(spec: &StockSpec, cats: &[CategorySpec]) -> StockSpec {
    let mut spec = spec.clone();
    if !cats.is_empty() {
        spec.total = cats.iter().fold(0u64, |a, c| a.saturating_add(c.total));
    }
    spec
}

/// Checks of an item list every store makes before its atomic step: the
/// refusal, if any, and otherwise the units asked in all.
pub(crate) fn items_precheck(items: &[Item]) -> std::result::Result<u32, Box<HoldOutcome>> {
    if let Some(c) = types::duplicate_category(items) {
        return Err(Box::new(HoldOutcome::DuplicateCategory {
            category: c.to_string(),
        }));
    }
    let sum: u64 = items.iter().map(|i| u64::from(i.qty)).sum();
    // Above u32 is above any cart limit: the store answers InvalidQuantity.
    Ok(u32::try_from(sum).unwrap_or(u32::MAX))
}

/// Validates a spec before any store sees it; `Some(reason)` when refused.
pub(crate) fn spec_problem(spec: &StockSpec) -> Option<&'static str> {
    if spec.total > MAX_TOTAL {
        Some("total above 2^53")
    } else if spec.cart_limit == 0 {
        Some("cart_limit must be at least 1")
    } else if spec.hold_ttl.is_zero() {
        Some("hold_ttl must be positive")
    } else {
        None
    }
}
