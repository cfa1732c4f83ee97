//! The in-memory store: the reference semantics of [`Inventory`].
//!
//! One mutex over every event. Each operation is a short critical section
//! with no `.await` inside, so the lock is the exact counterpart of a Lua
//! script running in Redis. Contention is not a concern: the waiting room
//! caps the rate of reservations long before this lock would.
//!
//! It mirrors the Redis store closely, down to the details that decide
//! outcomes: the deadline index is ordered by `(deadline, member)` with the
//! same member encoding (`{suffix}:{qty}:{visitor}`), a hold reaps at most
//! [`LAZY_REAP_MAX`] expired holds of anyone on the way plus the visitor's
//! own lapsed holds and those needed before a sold-out answer, a read reaps
//! every lapsed hold, and a hold is "out" (its units taken) exactly while
//! its member is in the index.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::feed::{FeedApplied, FeedOutcome, StockChange, StockRow, key_record, parse_key_record};
use crate::record::{CategoryRecord, EventRecord, RestoreOutcome};
use crate::retention::Retention;
use crate::sharded::{
    LayoutOutcome, PendingTransfer, ShardLayout, ShardTotal, TransferIn, TransferOut,
};
use crate::types::{
    CategoryId, CategorySpec, CategoryState, ConfirmOutcome, EventId, EventState, HoldId,
    HoldOutcome, HoldStatus, HoldView, Item, LoadOutcome, ReleaseOutcome, ScheduleOutcome,
    SetStockOutcome, StockSpec, Transition, TransitionKind, Wave, categories_problem, items_text,
    parse_items, waves_problem,
};
use crate::{
    FEED_KEY_TTL, IDEMPOTENCY_TTL, Inventory, LAZY_REAP_MAX, MAX_TOTAL, PAYMENT_TTL,
    category_restore_problem, restore_problem, spec_problem,
};
use sluice_clock::{Clock, SystemClock};

/// Default number of transitions kept per event.
pub const DEFAULT_LOG_CAPACITY: usize = 10_000;
/// How often (store time) `reap` also drops ended holds and stale records.
const PURGE_EVERY_MS: u64 = 10_000;

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The in-memory [`Inventory`]. Cheap to clone (shared state).
#[derive(Clone)]
pub struct MemoryInventory {
    inner: Arc<Inner>,
    /// How long ended holds are kept (a copy per clone: it never changes
    /// after construction).
    retention: Retention,
}

struct Inner {
    clock: Arc<dyn Clock>,
    log_capacity: usize,
    events: Mutex<HashMap<EventId, EventData>>,
    /// `sluice:loaded:{ev}`: the highest version ever set per event. Kept
    /// apart from `events` so [`MemoryInventory::lose_event`] can drop an
    /// event's data and leave its marker, as an eviction in Redis would.
    /// Locked after `events`, never alone while writing one.
    markers: Mutex<HashMap<EventId, u64>>,
}

/// One event. Field names follow the Redis keys they stand for.
struct EventData {
    total: u64,
    cart_limit: u32,
    hold_ttl_ms: u64,
    version: u64,
    room: String,
    /// `sluice:{ev}:stock`.
    available: u64,
    held: u64,
    confirmed: u64,
    /// `sluice:{ev}:hold:{suffix}`, keyed by suffix. A record past its
    /// `purge_at_ms` is gone for every operation (as an expired Redis key
    /// is), even before `purge` drops it.
    holds: HashMap<String, HoldRec>,
    /// `sluice:{ev}:deadlines`: `(deadline_ms, member)`; a hold's units are
    /// out exactly while its member is here.
    deadlines: BTreeSet<(u64, String)>,
    /// `sluice:{ev}:visitors`: held + confirmed units per visitor.
    visitors: HashMap<String, u32>,
    /// `sluice:{ev}:idem:…`: (visitor, key) → (suffix, expires_ms).
    idem: HashMap<(String, String), (String, u64)>,
    /// `sluice:{ev}:pay:…`: payment id → (suffix, answer, expires_ms).
    payments: HashMap<String, (String, ConfirmOutcome, u64)>,
    /// `sluice:{ev}:stream`, bounded.
    log: VecDeque<Transition>,
    last_purge_ms: u64,
    /// The `c:{id}:*` fields of `sluice:{ev}:meta`, in the order loaded
    /// (empty: no categories). Their counters add up to the event's.
    cats: Vec<CatData>,
    /// `sluice:{ev}:vcats`: (category, visitor) → held + confirmed units.
    vcats: HashMap<(String, String), u32>,
    /// `sluice:{ev}:feed:{len}:{key}`: a stock feed's delta key → (its
    /// record, [`crate::feed`]'s `key_record`, and when it is forgotten).
    feed_keys: HashMap<String, (String, u64)>,
    /// The `waves` field of `sluice:{ev}:meta`: pending waves, earliest
    /// first. Whoever removes one applies it, once.
    waves: Vec<Wave>,
    /// The `shards` field of the meta ([`crate::sharded`]): 1 plain, 0
    /// frozen.
    shards: u32,
    /// The `shard_total` field: the event's total, on shard 0 of a
    /// sharded event.
    shard_total: Option<u64>,
    /// `sluice:{ev}:xout`: transfers that left, id → (to, qty, at_ms).
    xout: BTreeMap<String, (EventId, u64, u64)>,
    /// `sluice:{ev}:xin`: transfers that landed, id → at_ms (kept
    /// [`crate::FEED_KEY_TTL`]).
    xin: HashMap<String, u64>,
    /// The `moves` field: transfers out and in, counted.
    moves: u64,
}

/// One category's counters.
struct CatData {
    id: CategoryId,
    total: u64,
    available: u64,
    held: u64,
    confirmed: u64,
    limit: Option<u32>,
    /// `c:{id}:version`: the last snapshot's source version (`None`: no
    /// snapshot reached it).
    version: Option<u64>,
}

struct HoldRec {
    visitor: String,
    qty: u32,
    /// As stored: `Held` past its deadline reads as `Expired`.
    status: HoldStatus,
    deadline_ms: u64,
    member: String,
    /// Units per category (empty without categories).
    items: Vec<Item>,
    /// When the record is forgotten (the Redis hash's expiry): its deadline
    /// plus the released retention while held, then the retention of how
    /// it ended, counted from then.
    purge_at_ms: u64,
}

impl HoldRec {
    fn status_at(&self, now: u64) -> HoldStatus {
        if self.status == HoldStatus::Held && self.deadline_ms <= now {
            HoldStatus::Expired
        } else {
            self.status
        }
    }
}

/// The deadline index member of a hold: `{head}:{qty}:{visitor}`, where
/// the head is the suffix, followed by `/` and the items when the hold has
/// categories (`{suffix}/floor=2/vip=1`). The member is the token whose
/// removal returns the units, so it carries the breakdown: whoever removes
/// it returns each category's units, once.
fn member_of(suffix: &str, items: &[Item], qty: u32, visitor: &str) -> String {
    if items.is_empty() {
        format!("{suffix}:{qty}:{visitor}")
    } else {
        format!("{suffix}/{}:{qty}:{visitor}", items_text(items))
    }
}

/// Splits a member's head into the hold's suffix and its items.
fn split_head(head: &str) -> (String, Vec<Item>) {
    match head.split_once('/') {
        Some((suffix, items)) => (suffix.to_owned(), parse_items(items).unwrap_or_default()),
        None => (head.to_owned(), Vec::new()),
    }
}

impl MemoryInventory {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// A store on the given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::with_clock_and_log(clock, DEFAULT_LOG_CAPACITY)
    }

    /// A store keeping at most `log_capacity` transitions per event.
    pub fn with_clock_and_log(clock: Arc<dyn Clock>, log_capacity: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock,
                log_capacity: log_capacity.max(1),
                events: Mutex::new(HashMap::new()),
                markers: Mutex::new(HashMap::new()),
            }),
            retention: Retention::default(),
        }
    }

    /// The same store keeping ended holds as `retention` says (checked by
    /// the caller with [`Retention::validate`]).
    pub fn with_retention(self, retention: Retention) -> Self {
        Self { retention, ..self }
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Drops everything the store knows of `event` except its load marker:
    /// what Redis looks like after the event's keys were evicted or deleted,
    /// or a replica promoted before they reached it (for the store-loss
    /// tests). A `FLUSHALL` is a new store.
    #[cfg(feature = "test-util")]
    pub fn lose_event(&self, event: &EventId) {
        self.inner.events.lock().remove(event);
    }

    /// Sets, updates or (`only_new`) loads an event's stock with both maps
    /// locked: the one critical section of `set_stock` and `load_if_new`.
    fn set_stock_locked(
        &self,
        event: &EventId,
        spec: &StockSpec,
        cats: &[CategorySpec],
        only_new: bool,
    ) -> std::result::Result<SetStockOutcome, LoadOutcome> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let mut markers = self.inner.markers.lock();
        let lost = match (events.contains_key(event), markers.get(event)) {
            (false, Some(v)) => Some(*v),
            _ => None,
        };
        if only_new {
            if events.contains_key(event) {
                return Err(LoadOutcome::Present);
            }
            if let Some(last_version) = lost {
                return Err(LoadOutcome::Lost { last_version });
            }
        }
        let (outcome, e) = match events.get_mut(event) {
            Some(e) => {
                e.release_waves(cap, now);
                if spec.version <= e.version {
                    return Ok(SetStockOutcome::Stale {
                        current_version: e.version,
                    });
                }
                if let Some(refused) = e.refuse_categories(cats) {
                    return Ok(refused);
                }
                if spec.total < e.held + e.confirmed {
                    return Ok(SetStockOutcome::BelowCommitted {
                        held: e.held,
                        confirmed: e.confirmed,
                    });
                }
                e.available = spec.total - e.held - e.confirmed;
                (
                    SetStockOutcome::Updated {
                        available: e.available,
                    },
                    e,
                )
            }
            None => {
                let e = events
                    .entry(event.clone())
                    .or_insert(EventData::empty(spec, now));
                let outcome = match lost {
                    Some(lost_version) => SetStockOutcome::Recreated {
                        available: spec.total,
                        lost_version,
                    },
                    None => SetStockOutcome::Created {
                        available: spec.total,
                    },
                };
                (outcome, e)
            }
        };
        e.total = spec.total;
        e.cart_limit = spec.cart_limit;
        e.hold_ttl_ms = spec.hold_ttl_ms();
        e.version = spec.version;
        e.room = spec.room.clone();
        e.set_categories(cats);
        let available = e.available;
        e.log(
            cap,
            Transition {
                kind: TransitionKind::Stock,
                hold_id: String::new(),
                visitor: String::new(),
                qty: spec.total,
                available,
                ts_ms: now,
                payment_event_id: None,
                items: Vec::new(),
                categories: cats.to_vec(),
                reason: None,
                waves: Vec::new(),
            },
        );
        let marker = markers.entry(event.clone()).or_insert(0);
        *marker = (*marker).max(spec.version);
        Ok(outcome)
    }

    /// `(available, held, confirmed)` as stored, without reaping anything:
    /// lapsed holds a reaper has not met still count as held (for tests
    /// comparing a store with a model step by step).
    pub fn stored_counters(&self, event: &EventId) -> Option<(u64, u64, u64)> {
        let events = self.inner.events.lock();
        events
            .get(event)
            .map(|e| (e.available, e.held, e.confirmed))
    }

    /// The one critical section of `hold` (`items` = `None`) and
    /// `hold_items` (`qty` = the items' sum): hold.lua's steps, in its
    /// order.
    fn hold_locked(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        items: Option<&[Item]>,
        idempotency_key: Option<&str>,
        shards: u32,
    ) -> HoldOutcome {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(event) else {
            return HoldOutcome::NotReady;
        };
        if e.shards != shards {
            return HoldOutcome::Resharded { shards: e.shards };
        }
        e.reap(event, cap, now, LAZY_REAP_MAX);
        e.release_waves(cap, now);
        e.reap_visitor(event, cap, now, visitor);
        let idem_key = idempotency_key.map(|k| (visitor.to_owned(), k.to_owned()));
        // A key whose hold was forgotten takes a new hold under a new id
        // (below), as on Redis.
        if let Some(k) = &idem_key
            && let Some((suffix, exp)) = e.idem.get(k)
            && *exp > now
            && let Some(h) = e.live_hold(suffix, now)
            && h.visitor == visitor
        {
            return HoldOutcome::Replayed(e.view(event, suffix, h, now));
        }
        if let Some(refused) = e.check_hold(visitor, qty, items) {
            return refused;
        }
        let q = u64::from(qty);
        let items = items.unwrap_or_default();
        if items.is_empty() {
            e.reap_until_available(event, cap, now, q);
            if e.available < q {
                return HoldOutcome::SoldOut {
                    available: e.available,
                };
            }
        } else {
            e.reap_until_items(event, cap, now, items);
            if let Some(short) = e.short_category(items) {
                return short;
            }
        }
        let hold_id = HoldId::generate(event);
        let suffix = hold_id.suffix().to_owned();
        e.available -= q;
        e.held += q;
        *e.visitors.entry(visitor.to_owned()).or_insert(0) += qty;
        for i in items {
            if let Some(c) = e.cat_mut(&i.category) {
                c.available -= u64::from(i.qty);
                c.held += u64::from(i.qty);
            }
            *e.vcats
                .entry((i.category.to_string(), visitor.to_owned()))
                .or_insert(0) += i.qty;
        }
        let deadline = now.saturating_add(e.hold_ttl_ms);
        let member = member_of(&suffix, items, qty, visitor);
        e.deadlines.insert((deadline, member.clone()));
        e.holds.insert(
            suffix.clone(),
            HoldRec {
                visitor: visitor.to_owned(),
                qty,
                status: HoldStatus::Held,
                deadline_ms: deadline,
                member,
                items: items.to_vec(),
                purge_at_ms: deadline.saturating_add(self.retention.released_ms()),
            },
        );
        if let Some(k) = idem_key {
            e.idem
                .insert(k, (suffix.clone(), now.saturating_add(ms(IDEMPOTENCY_TTL))));
        }
        let available = e.available;
        e.log(
            cap,
            Transition {
                kind: TransitionKind::Held,
                hold_id: hold_id.to_string(),
                visitor: visitor.to_owned(),
                qty: q,
                available,
                ts_ms: now,
                payment_event_id: None,
                items: items.to_vec(),
                categories: Vec::new(),
                reason: None,
                waves: Vec::new(),
            },
        );
        HoldOutcome::Held(HoldView {
            hold_id,
            event: event.clone(),
            qty,
            status: HoldStatus::Held,
            expires_at: deadline / 1000,
            expires_at_ms: deadline,
            available,
            visitor: visitor.to_owned(),
            items: items.to_vec(),
        })
    }
}

impl Default for MemoryInventory {
    fn default() -> Self {
        Self::new()
    }
}

// === impl EventData ===

impl EventData {
    /// A new event with `available = total`, nothing held or sold.
    fn empty(spec: &StockSpec, now: u64) -> Self {
        EventData {
            total: spec.total,
            cart_limit: spec.cart_limit,
            hold_ttl_ms: spec.hold_ttl_ms(),
            version: spec.version,
            room: spec.room.clone(),
            available: spec.total,
            held: 0,
            confirmed: 0,
            holds: HashMap::new(),
            deadlines: BTreeSet::new(),
            visitors: HashMap::new(),
            idem: HashMap::new(),
            payments: HashMap::new(),
            log: VecDeque::new(),
            last_purge_ms: now,
            cats: Vec::new(),
            vcats: HashMap::new(),
            feed_keys: HashMap::new(),
            waves: Vec::new(),
            shards: 1,
            shard_total: None,
            xout: BTreeMap::new(),
            xin: HashMap::new(),
            moves: 0,
        }
    }

    /// The categories as a stock entry describes them.
    fn category_specs(&self) -> Vec<CategorySpec> {
        self.cats
            .iter()
            .map(|c| CategorySpec {
                id: c.id.clone(),
                total: c.total,
                cart_limit: c.limit,
            })
            .collect()
    }

    /// Releases every wave due by `now`, earliest first, each once
    /// (common.lua's `release_waves`): its units join the total and
    /// available (capped as `give_back` caps them), and its category's;
    /// a `stock` entry `reason=wave` with the new total and the schedule
    /// left. A wave that no longer fits the event (its category gone, a
    /// category-less wave on an event with categories or the reverse,
    /// the total past 2^53) is dropped without units or entry.
    fn release_waves(&mut self, cap: usize, now: u64) {
        while self.waves.first().is_some_and(|w| w.at_ms <= now) {
            let w = self.waves.remove(0);
            let fits = match &w.category {
                None => self.cats.is_empty(),
                Some(c) => self.cat(c).is_some(),
            };
            if !fits || self.total.saturating_add(w.qty) > MAX_TOTAL {
                continue;
            }
            self.total += w.qty;
            let room = self
                .total
                .saturating_sub(self.held)
                .saturating_sub(self.confirmed);
            self.available = self.available.saturating_add(w.qty).min(room);
            if let Some(c) = w.category.as_ref().and_then(|c| self.cat_mut(c)) {
                c.total += w.qty;
                let room = c.total.saturating_sub(c.held).saturating_sub(c.confirmed);
                c.available = c.available.saturating_add(w.qty).min(room);
            }
            let t = Transition {
                kind: TransitionKind::Stock,
                hold_id: String::new(),
                visitor: String::new(),
                qty: self.total,
                available: self.available,
                ts_ms: now,
                payment_event_id: None,
                items: Vec::new(),
                categories: self.category_specs(),
                reason: Some("wave".to_owned()),
                waves: self.waves.clone(),
            };
            self.log(cap, t);
        }
    }

    /// Why `waves` (sorted) cannot replace the schedule now, in
    /// schedule_waves.lua's order: per wave its time, then its category;
    /// then the total with every wave.
    fn schedule_problem(&self, waves: &[Wave], now: u64) -> Option<ScheduleOutcome> {
        for w in waves {
            if w.at_ms <= now {
                return Some(ScheduleOutcome::WaveInPast {
                    at_ms: w.at_ms,
                    now_ms: now,
                });
            }
            match &w.category {
                None if !self.cats.is_empty() => {
                    return Some(ScheduleOutcome::Invalid {
                        reason: "a wave of an event with categories names its category",
                    });
                }
                Some(c) if self.cat(c).is_none() => {
                    return Some(ScheduleOutcome::CategoryNotFound {
                        category: c.to_string(),
                    });
                }
                _ => {}
            }
        }
        let sum = waves
            .iter()
            .fold(self.total, |a, w| a.saturating_add(w.qty));
        (sum > MAX_TOTAL).then_some(ScheduleOutcome::Invalid {
            reason: "the total with every wave above 2^53",
        })
    }

    fn cat_mut(&mut self, id: &CategoryId) -> Option<&mut CatData> {
        self.cats.iter_mut().find(|c| &c.id == id)
    }

    fn cat(&self, id: &CategoryId) -> Option<&CatData> {
        self.cats.iter().find(|c| &c.id == id)
    }

    /// The refusal of a stock change to `cats` (set_stock.lua's order): a
    /// change of shape with units out, then each new category below what
    /// is committed in it, then each dropped category with units in it.
    fn refuse_categories(&self, cats: &[CategorySpec]) -> Option<SetStockOutcome> {
        if self.cats.is_empty() != cats.is_empty() && self.held + self.confirmed > 0 {
            return Some(SetStockOutcome::BelowCommitted {
                held: self.held,
                confirmed: self.confirmed,
            });
        }
        let below = |c: &CatData| SetStockOutcome::CategoryBelowCommitted {
            category: c.id.to_string(),
            held: c.held,
            confirmed: c.confirmed,
        };
        for spec in cats {
            if let Some(c) = self.cat(&spec.id)
                && spec.total < c.held + c.confirmed
            {
                return Some(below(c));
            }
        }
        self.cats
            .iter()
            .find(|c| c.held + c.confirmed > 0 && !cats.iter().any(|s| s.id == c.id))
            .map(below)
    }

    /// Replaces the categories (already checked by `refuse_categories`),
    /// keeping what is held and sold in each.
    fn set_categories(&mut self, cats: &[CategorySpec]) {
        let next = cats
            .iter()
            .map(|spec| {
                let (held, confirmed, version) = self
                    .cat(&spec.id)
                    .map(|c| (c.held, c.confirmed, c.version))
                    .unwrap_or((0, 0, None));
                CatData {
                    id: spec.id.clone(),
                    total: spec.total,
                    available: spec.total.saturating_sub(held + confirmed),
                    held,
                    confirmed,
                    limit: spec.cart_limit,
                    version,
                }
            })
            .collect();
        self.cats = next;
    }

    /// A hold's per-category units go back on sale (each capped as
    /// `give_back` caps the event), and leave the visitor's category carts.
    fn give_back_items(&mut self, items: &[Item], visitor: &str) {
        for i in items {
            let q = u64::from(i.qty);
            if let Some(c) = self.cat_mut(&i.category) {
                c.held = c.held.saturating_sub(q);
                let room = c.total.saturating_sub(c.held).saturating_sub(c.confirmed);
                c.available = c.available.saturating_add(q).min(room);
            }
            self.vcat_sub(&i.category, visitor, i.qty);
        }
    }

    /// A hold's per-category units are sold.
    fn confirm_items(&mut self, items: &[Item]) {
        for i in items {
            let q = u64::from(i.qty);
            if let Some(c) = self.cat_mut(&i.category) {
                c.held = c.held.saturating_sub(q);
                c.confirmed += q;
            }
        }
    }

    fn vcat_sub(&mut self, category: &CategoryId, visitor: &str, qty: u32) {
        let key = (category.to_string(), visitor.to_owned());
        if let Some(c) = self.vcats.get_mut(&key) {
            *c = c.saturating_sub(qty);
            if *c == 0 {
                self.vcats.remove(&key);
            }
        }
    }

    fn vcat(&self, category: &CategoryId, visitor: &str) -> u32 {
        self.vcats
            .get(&(category.to_string(), visitor.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Expires lapsed holds oldest first until every item's category has
    /// its units or none lapsed is left (an expiry may free units of
    /// another category, so this may expire every lapsed hold: the reaper
    /// keeps them few).
    fn reap_until_items(&mut self, event: &EventId, cap: usize, now: u64, items: &[Item]) {
        let short = |e: &Self| {
            items.iter().any(|i| {
                e.cat(&i.category)
                    .is_some_and(|c| c.available < u64::from(i.qty))
            })
        };
        while short(self) {
            let Some((deadline, member)) =
                self.deadlines.first().filter(|(d, _)| *d <= now).cloned()
            else {
                break;
            };
            self.expire_member(event, cap, deadline, &member, now);
        }
    }

    /// The refusals before stock is looked at, in hold.lua's order: the
    /// event's shape, unknown categories, the quantity, the event's cart,
    /// each category's cart.
    fn check_hold(&self, visitor: &str, qty: u32, items: Option<&[Item]>) -> Option<HoldOutcome> {
        match items {
            None if !self.cats.is_empty() => return Some(HoldOutcome::ItemsRequired),
            Some(items) => {
                if let Some(i) = items.iter().find(|i| self.cat(&i.category).is_none()) {
                    return Some(HoldOutcome::CategoryNotFound {
                        category: i.category.to_string(),
                    });
                }
            }
            None => {}
        }
        let limit = self.cart_limit;
        let items = items.unwrap_or_default();
        if qty == 0 || qty > limit || items.iter().any(|i| i.qty == 0) {
            return Some(HoldOutcome::InvalidQuantity { limit });
        }
        let have = self.visitors.get(visitor).copied().unwrap_or(0);
        if u64::from(have) + u64::from(qty) > u64::from(limit) {
            return Some(HoldOutcome::CartLimitExceeded { limit, held: have });
        }
        for i in items {
            let Some(climit) = self.cat(&i.category).and_then(|c| c.limit) else {
                continue;
            };
            let have = self.vcat(&i.category, visitor);
            if u64::from(have) + u64::from(i.qty) > u64::from(climit) {
                return Some(HoldOutcome::CategoryCartLimitExceeded {
                    category: i.category.to_string(),
                    limit: climit,
                    held: have,
                });
            }
        }
        None
    }

    /// The first item whose category lacks its units, as a refusal.
    fn short_category(&self, items: &[Item]) -> Option<HoldOutcome> {
        items.iter().find_map(|i| {
            let c = self.cat(&i.category)?;
            (c.available < u64::from(i.qty)).then(|| HoldOutcome::CategorySoldOut {
                category: i.category.to_string(),
                available: c.available,
            })
        })
    }

    /// Each category's counters add up to its total, and theirs to the
    /// event's (true without categories).
    fn categories_add_up(&self) -> bool {
        if self.cats.is_empty() {
            return true;
        }
        let sum = |f: fn(&CatData) -> u64| self.cats.iter().map(f).sum::<u64>();
        self.cats
            .iter()
            .all(|c| c.available + c.held + c.confirmed == c.total)
            && sum(|c| c.total) == self.total
            && sum(|c| c.available) == self.available
            && sum(|c| c.held) == self.held
            && sum(|c| c.confirmed) == self.confirmed
    }

    fn category_states(&self) -> Vec<CategoryState> {
        self.cats
            .iter()
            .map(|c| CategoryState {
                id: c.id.clone(),
                total: c.total,
                available: c.available,
                held: c.held,
                confirmed: c.confirmed,
                cart_limit: c.limit,
            })
            .collect()
    }

    fn log(&mut self, cap: usize, t: Transition) {
        while self.log.len() >= cap {
            self.log.pop_front();
        }
        self.log.push_back(t);
    }

    /// A hold's units leave `held` and go back on sale, never above
    /// `total − held − confirmed` (common.lua's `give_back`): exact in a
    /// consistent event; after a rebuild from an overcommitted record the
    /// returning units pay the excess off instead of being sold twice.
    fn give_back(&mut self, qty: u64) {
        self.held = self.held.saturating_sub(qty);
        let room = self
            .total
            .saturating_sub(self.held)
            .saturating_sub(self.confirmed);
        self.available = self.available.saturating_add(qty).min(room);
    }

    fn visitor_sub(&mut self, visitor: &str, qty: u32) {
        if let Some(c) = self.visitors.get_mut(visitor) {
            *c = c.saturating_sub(qty);
            if *c == 0 {
                self.visitors.remove(visitor);
            }
        }
    }

    /// Returns the units of the hold behind `member` if they are still out
    /// (the member is in the index); true when this call returned them.
    fn expire_member(
        &mut self,
        event: &EventId,
        cap: usize,
        deadline: u64,
        member: &str,
        now: u64,
    ) -> bool {
        if !self.deadlines.remove(&(deadline, member.to_owned())) {
            return false;
        }
        let mut parts = member.splitn(3, ':');
        let (suffix, items) = split_head(parts.next().unwrap_or_default());
        let qty: u32 = parts.next().and_then(|q| q.parse().ok()).unwrap_or(0);
        let visitor = parts.next().unwrap_or_default().to_owned();
        self.give_back(u64::from(qty));
        self.give_back_items(&items, &visitor);
        self.visitor_sub(&visitor, qty);
        if let Some(h) = self.holds.get_mut(&suffix) {
            h.status = HoldStatus::Expired;
        }
        let available = self.available;
        self.log(
            cap,
            Transition {
                kind: TransitionKind::Expired,
                hold_id: format!("{event}.{suffix}"),
                visitor,
                qty: u64::from(qty),
                available,
                ts_ms: now,
                payment_event_id: None,
                items,
                categories: Vec::new(),
                reason: None,
                waves: Vec::new(),
            },
        );
        true
    }

    /// Expires up to `max` holds whose deadline passed, oldest first.
    fn reap(&mut self, event: &EventId, cap: usize, now: u64, max: usize) -> usize {
        let due: Vec<(u64, String)> = self
            .deadlines
            .iter()
            .take_while(|(d, _)| *d <= now)
            .take(max)
            .cloned()
            .collect();
        let mut n = 0;
        for (deadline, member) in due {
            if self.expire_member(event, cap, deadline, &member, now) {
                n += 1;
            }
        }
        n
    }

    /// Expires every lapsed hold of `visitor` (hold.lua's visitor index).
    fn reap_visitor(&mut self, event: &EventId, cap: usize, now: u64, visitor: &str) {
        let due: Vec<(u64, String)> = self
            .deadlines
            .iter()
            .take_while(|(d, _)| *d <= now)
            .filter(|(_, m)| m.splitn(3, ':').nth(2) == Some(visitor))
            .cloned()
            .collect();
        for (deadline, member) in due {
            self.expire_member(event, cap, deadline, &member, now);
        }
    }

    /// Expires lapsed holds oldest first until `need` units are available
    /// or none lapsed is left.
    fn reap_until_available(&mut self, event: &EventId, cap: usize, now: u64, need: u64) {
        while self.available < need {
            let Some((deadline, member)) =
                self.deadlines.first().filter(|(d, _)| *d <= now).cloned()
            else {
                break;
            };
            self.expire_member(event, cap, deadline, &member, now);
        }
    }

    /// Expires lapsed holds oldest first while `short` says units are
    /// missing, or until none lapsed is left.
    fn reap_while(&mut self, event: &EventId, cap: usize, now: u64, short: impl Fn(&Self) -> bool) {
        while short(self) {
            let Some((deadline, member)) =
                self.deadlines.first().filter(|(d, _)| *d <= now).cloned()
            else {
                break;
            };
            self.expire_member(event, cap, deadline, &member, now);
        }
    }

    /// One row of a stock feed: feed.lua's steps, in its order. `marker`
    /// is the event's load marker (an event snapshot raises it).
    fn apply_stock(
        &mut self,
        event: &EventId,
        cap: usize,
        now: u64,
        row: &StockRow,
        marker: &mut u64,
    ) -> FeedOutcome {
        let cat_name = row.category.as_ref().map(CategoryId::as_str).unwrap_or("");
        if let StockChange::Delta { delta, key } = &row.change
            && let Some((text, exp)) = self.feed_keys.get(key)
            && *exp > now
        {
            return match parse_key_record(text) {
                Some((c, d, first)) if c == cat_name && d == *delta => FeedOutcome::Replayed(first),
                _ => FeedOutcome::KeyReused,
            };
        }
        let cat = match (&row.category, self.cats.is_empty()) {
            (None, true) => None,
            (None, false) => return FeedOutcome::CategoryRequired,
            // A category the event does not have (any, on an event
            // without categories).
            (Some(c), _) if self.cat(c).is_none() => {
                return FeedOutcome::CategoryNotFound {
                    category: c.to_string(),
                };
            }
            (Some(c), _) => Some(c.clone()),
        };
        match &row.change {
            StockChange::Delta { delta, key } => {
                let n = delta.unsigned_abs();
                let avail_of = |e: &Self| match &cat {
                    Some(c) => e.cat(c).map(|c| c.available).unwrap_or(0),
                    None => e.available,
                };
                if *delta < 0 {
                    self.reap_while(event, cap, now, |e| avail_of(e) < n);
                    let available = avail_of(self);
                    if available < n {
                        return FeedOutcome::StockNegative { available };
                    }
                } else {
                    let ctotal = cat.as_ref().and_then(|c| self.cat(c)).map(|c| c.total);
                    if self.total.saturating_add(n) > MAX_TOTAL
                        || ctotal.is_some_and(|t| t.saturating_add(n) > MAX_TOTAL)
                    {
                        return FeedOutcome::Invalid {
                            reason: "total above 2^53",
                        };
                    }
                }
                let shift = |total: &mut u64, avail: &mut u64, held: u64, confirmed: u64| {
                    if *delta < 0 {
                        *total = total.saturating_sub(n);
                        *avail = avail.saturating_sub(n);
                    } else {
                        *total += n;
                        let room = total.saturating_sub(held).saturating_sub(confirmed);
                        *avail = avail.saturating_add(n).min(room);
                    }
                };
                if let Some(c) = cat.as_ref().and_then(|c| self.cat_mut(c)) {
                    shift(&mut c.total, &mut c.available, c.held, c.confirmed);
                }
                shift(
                    &mut self.total,
                    &mut self.available,
                    self.held,
                    self.confirmed,
                );
                if cat.is_none()
                    && let Some(t) = self.shard_total.as_mut()
                {
                    *t = if *delta < 0 {
                        t.saturating_sub(n)
                    } else {
                        t.saturating_add(n)
                    };
                }
                let applied = self.applied(cat.as_ref());
                self.feed_keys.insert(
                    key.clone(),
                    (
                        key_record(cat.as_ref(), *delta, &applied),
                        now.saturating_add(ms(FEED_KEY_TTL)),
                    ),
                );
                self.log_stock(cap, now, "delta");
                FeedOutcome::Applied(applied)
            }
            StockChange::Snapshot { total, version } => {
                match &cat {
                    None if self.shard_total.is_some() => {
                        // Shard 0 of a sharded event: the event's total
                        // moves to `total`, shard 0's own by the difference.
                        if *version <= self.version {
                            return FeedOutcome::Stale {
                                current_version: self.version,
                            };
                        }
                        let before = self.shard_total.unwrap_or(0);
                        if *total < before {
                            let drop = before - total;
                            self.reap_while(event, cap, now, |e| e.available < drop);
                            if self.available < drop {
                                return FeedOutcome::StockNegative {
                                    available: self.available,
                                };
                            }
                            self.total -= drop;
                            self.available -= drop;
                        } else {
                            let add = total - before;
                            self.total = self.total.saturating_add(add);
                            let room = self
                                .total
                                .saturating_sub(self.held)
                                .saturating_sub(self.confirmed);
                            self.available = self.available.saturating_add(add).min(room);
                        }
                        self.shard_total = Some(*total);
                        self.version = *version;
                        *marker = (*marker).max(*version);
                    }
                    None => {
                        if *version <= self.version {
                            return FeedOutcome::Stale {
                                current_version: self.version,
                            };
                        }
                        if *total < self.held + self.confirmed {
                            return FeedOutcome::BelowCommitted {
                                held: self.held,
                                confirmed: self.confirmed,
                            };
                        }
                        self.total = *total;
                        self.available = total - self.held - self.confirmed;
                        self.version = *version;
                        *marker = (*marker).max(*version);
                    }
                    Some(id) => {
                        let Some(c) = self.cat(id) else {
                            return FeedOutcome::CategoryNotFound {
                                category: id.to_string(),
                            };
                        };
                        if let Some(v) = c.version
                            && *version <= v
                        {
                            return FeedOutcome::Stale { current_version: v };
                        }
                        if *total < c.held + c.confirmed {
                            return FeedOutcome::CategoryBelowCommitted {
                                category: id.to_string(),
                                held: c.held,
                                confirmed: c.confirmed,
                            };
                        }
                        let event_total = (self.total - c.total).saturating_add(*total);
                        if event_total > MAX_TOTAL {
                            return FeedOutcome::Invalid {
                                reason: "total above 2^53",
                            };
                        }
                        let old_avail = c.available;
                        let new_avail = total - c.held - c.confirmed;
                        if let Some(c) = self.cat_mut(id) {
                            c.total = *total;
                            c.available = new_avail;
                            c.version = Some(*version);
                        }
                        self.total = event_total;
                        self.available = (self.available - old_avail.min(self.available))
                            .saturating_add(new_avail);
                    }
                }
                self.log_stock(cap, now, "snapshot");
                FeedOutcome::Applied(self.applied(cat.as_ref()))
            }
        }
    }

    /// The counters an applied row answers.
    fn applied(&self, cat: Option<&CategoryId>) -> FeedApplied {
        let c = cat.and_then(|c| self.cat(c));
        FeedApplied {
            total: self.total,
            available: self.available,
            category_total: c.map(|c| c.total),
            category_available: c.map(|c| c.available),
            version: match cat {
                Some(_) => c.and_then(|c| c.version),
                None => Some(self.version),
            },
        }
    }

    /// A `stock` entry (`reason`): an applied feed row, or a shard's layout
    /// change or transfer (a sharded event has no categories, so its entry
    /// lists none).
    fn log_stock(&mut self, cap: usize, now: u64, reason: &str) {
        let t = Transition {
            kind: TransitionKind::Stock,
            hold_id: String::new(),
            visitor: String::new(),
            qty: self.total,
            available: self.available,
            ts_ms: now,
            payment_event_id: None,
            items: Vec::new(),
            categories: self.category_specs(),
            reason: Some(reason.to_owned()),
            waves: self.waves.clone(),
        };
        self.log(cap, t);
    }

    fn purge(&mut self, now: u64) {
        if now.saturating_sub(self.last_purge_ms) < PURGE_EVERY_MS {
            return;
        }
        self.last_purge_ms = now;
        self.holds.retain(|_, h| h.purge_at_ms > now);
        self.idem.retain(|_, (_, exp)| *exp > now);
        self.payments.retain(|_, (_, _, exp)| *exp > now);
        self.feed_keys.retain(|_, (_, exp)| *exp > now);
    }

    /// The hold's record, unless it is gone (past its retention).
    fn live_hold(&self, suffix: &str, now: u64) -> Option<&HoldRec> {
        self.holds.get(suffix).filter(|h| h.purge_at_ms > now)
    }

    fn view(&self, event: &EventId, suffix: &str, h: &HoldRec, now: u64) -> HoldView {
        HoldView {
            hold_id: HoldId::from_parts(event, suffix),
            event: event.clone(),
            qty: h.qty,
            status: h.status_at(now),
            expires_at: h.deadline_ms / 1000,
            expires_at_ms: h.deadline_ms,
            available: self.available,
            visitor: h.visitor.clone(),
            items: h.items.clone(),
        }
    }

    /// Ends a held hold whose deadline has not passed: confirmed (units
    /// booked as sold) or released (units back).
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        event: &EventId,
        cap: usize,
        retention: &Retention,
        suffix: &str,
        to: HoldStatus,
        now: u64,
        payment_event_id: Option<&str>,
    ) {
        let Some(h) = self.holds.get(suffix) else {
            return;
        };
        let (qty, deadline, member, visitor, items) = (
            h.qty,
            h.deadline_ms,
            h.member.clone(),
            h.visitor.clone(),
            h.items.clone(),
        );
        self.deadlines.remove(&(deadline, member));
        let q = u64::from(qty);
        let kind = if to == HoldStatus::Confirmed {
            self.held = self.held.saturating_sub(q);
            self.confirmed += q;
            self.confirm_items(&items);
            TransitionKind::Confirmed
        } else {
            self.give_back(q);
            self.give_back_items(&items, &visitor);
            self.visitor_sub(&visitor, qty);
            TransitionKind::Released
        };
        let keep = if to == HoldStatus::Confirmed {
            retention.confirmed_ms()
        } else {
            retention.released_ms()
        };
        if let Some(h) = self.holds.get_mut(suffix) {
            h.status = to;
            h.purge_at_ms = now.saturating_add(keep);
        }
        let available = self.available;
        self.log(
            cap,
            Transition {
                kind,
                hold_id: format!("{event}.{suffix}"),
                visitor,
                qty: q,
                available,
                ts_ms: now,
                payment_event_id: payment_event_id.map(str::to_owned),
                items,
                categories: Vec::new(),
                reason: None,
                waves: Vec::new(),
            },
        );
    }

    /// Expires a held hold past its deadline (returning its units if still
    /// out) and marks it expired.
    fn expire_hold(
        &mut self,
        event: &EventId,
        cap: usize,
        retention: &Retention,
        suffix: &str,
        now: u64,
    ) {
        let Some(h) = self.holds.get(suffix) else {
            return;
        };
        let (deadline, member) = (h.deadline_ms, h.member.clone());
        self.expire_member(event, cap, deadline, &member, now);
        if let Some(h) = self.holds.get_mut(suffix) {
            h.status = HoldStatus::Expired;
            h.purge_at_ms = now.saturating_add(retention.released_ms());
        }
    }
}

// === impl Inventory ===

impl Inventory for MemoryInventory {
    async fn apply_stock(&self, event: &EventId, row: &StockRow) -> Result<FeedOutcome> {
        if let Some(reason) = row.problem() {
            return Ok(FeedOutcome::Invalid { reason });
        }
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let mut markers = self.inner.markers.lock();
        let Some(e) = events.get_mut(event) else {
            return Ok(FeedOutcome::NotReady);
        };
        let marker = markers.entry(event.clone()).or_insert(e.version);
        // waves due first, as every stock change (feed.lua)
        e.release_waves(cap, now);
        Ok(e.apply_stock(event, cap, now, row, marker))
    }

    async fn hold_in_layout(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
        shards: u32,
    ) -> Result<HoldOutcome> {
        Ok(self.hold_locked(event, visitor, qty, None, idempotency_key, shards))
    }

    async fn set_layout(&self, event: &EventId, layout: &ShardLayout) -> Result<LayoutOutcome> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(event) else {
            return Ok(LayoutOutcome::NotReady);
        };
        if let Some(v) = layout.version
            && v < e.version
        {
            return Ok(LayoutOutcome::Stale {
                current_version: e.version,
            });
        }
        if layout.require_idle {
            e.reap(event, cap, now, usize::MAX);
            if e.held > 0 || e.confirmed > 0 {
                return Ok(LayoutOutcome::Busy {
                    held: e.held,
                    confirmed: e.confirmed,
                });
            }
        }
        e.shards = layout.shards;
        match layout.shard_total {
            ShardTotal::Keep => {}
            ShardTotal::Set(t) => e.shard_total = Some(t),
            ShardTotal::Clear => e.shard_total = None,
        }
        e.cart_limit = layout.cart_limit;
        e.hold_ttl_ms = layout.hold_ttl_ms;
        e.room = layout.room.clone();
        if let Some(v) = layout.version {
            e.version = v;
        }
        e.log_stock(cap, now, "layout");
        Ok(LayoutOutcome::Set)
    }

    async fn transfer_out(
        &self,
        from: &EventId,
        to: &EventId,
        id: &str,
        max: u64,
    ) -> Result<TransferOut> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(from) else {
            return Ok(TransferOut::NotReady);
        };
        if e.shards == 0 {
            return Ok(TransferOut::Frozen);
        }
        e.reap_until_available(from, cap, now, max);
        let qty = max.min(e.available);
        if qty > 0 {
            e.available -= qty;
            e.total -= qty;
            e.xout.insert(id.to_owned(), (to.clone(), qty, now));
            e.moves += 1;
            e.log_stock(cap, now, "transfer_out");
        }
        Ok(TransferOut::Moved {
            qty,
            available: e.available,
        })
    }

    async fn transfer_in(
        &self,
        to: &EventId,
        _from: &EventId,
        id: &str,
        qty: u64,
    ) -> Result<TransferIn> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(to) else {
            return Ok(TransferIn::NotReady);
        };
        let keep = ms(FEED_KEY_TTL);
        e.xin.retain(|_, at| now.saturating_sub(*at) < keep);
        if e.xin.contains_key(id) {
            return Ok(TransferIn::Replayed);
        }
        if e.shards == 0 {
            return Ok(TransferIn::Frozen);
        }
        e.total = e.total.saturating_add(qty);
        let room = e.total.saturating_sub(e.held).saturating_sub(e.confirmed);
        e.available = e.available.saturating_add(qty).min(room);
        e.xin.insert(id.to_owned(), now);
        e.moves += 1;
        e.log_stock(cap, now, "transfer_in");
        Ok(TransferIn::Applied {
            available: e.available,
        })
    }

    async fn transfer_done(&self, from: &EventId, id: &str) -> Result<()> {
        if let Some(e) = self.inner.events.lock().get_mut(from) {
            e.xout.remove(id);
        }
        Ok(())
    }

    async fn pending_transfers(&self, from: &EventId) -> Result<Vec<PendingTransfer>> {
        let now = self.now();
        let events = self.inner.events.lock();
        Ok(events
            .get(from)
            .map(|e| {
                e.xout
                    .iter()
                    .map(|(id, (to, qty, at))| PendingTransfer {
                        id: id.clone(),
                        to: to.clone(),
                        qty: *qty,
                        age_ms: now.saturating_sub(*at),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn hold_items(
        &self,
        event: &EventId,
        visitor: &str,
        items: &[Item],
        idempotency_key: Option<&str>,
    ) -> Result<HoldOutcome> {
        Ok(match crate::items_precheck(items) {
            Err(refused) => *refused,
            Ok(qty) => self.hold_locked(event, visitor, qty, Some(items), idempotency_key, 1),
        })
    }

    async fn set_stock_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        cats: &[CategorySpec],
    ) -> Result<SetStockOutcome> {
        let spec = &crate::with_category_total(spec, cats);
        if let Some(reason) = spec_problem(spec).or_else(|| categories_problem(cats)) {
            return Ok(SetStockOutcome::Invalid { reason });
        }
        Ok(self
            .set_stock_locked(event, spec, cats, false)
            .unwrap_or(SetStockOutcome::Invalid {
                reason: "refused to load",
            }))
    }

    async fn load_if_new_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        cats: &[CategorySpec],
    ) -> Result<LoadOutcome> {
        let spec = &crate::with_category_total(spec, cats);
        if let Some(reason) = spec_problem(spec).or_else(|| categories_problem(cats)) {
            return Ok(LoadOutcome::Invalid { reason });
        }
        Ok(match self.set_stock_locked(event, spec, cats, true) {
            Err(refused) => refused,
            Ok(SetStockOutcome::Created { available }) => LoadOutcome::Loaded { available },
            // Not reached: `only_new` refuses before anything but a
            // creation can happen.
            Ok(_) => LoadOutcome::Present,
        })
    }

    async fn loaded_version(&self, event: &EventId) -> Result<Option<u64>> {
        Ok(self.inner.markers.lock().get(event).copied())
    }

    async fn remember_loaded(&self, event: &EventId, version: u64) -> Result<()> {
        let mut markers = self.inner.markers.lock();
        let m = markers.entry(event.clone()).or_insert(version);
        *m = (*m).max(version);
        Ok(())
    }

    async fn restore_with_categories(
        &self,
        event: &EventId,
        spec: &StockSpec,
        record: &EventRecord,
        cats: &CategoryRecord,
    ) -> Result<RestoreOutcome> {
        if let Some(reason) =
            restore_problem(event, spec, record).or_else(|| category_restore_problem(record, cats))
        {
            return Ok(RestoreOutcome::Invalid { reason });
        }
        let now = self.now();
        let cap = self.inner.log_capacity;
        let released_ms = self.retention.released_ms();
        let mut events = self.inner.events.lock();
        let mut markers = self.inner.markers.lock();
        if events.contains_key(event) {
            return Ok(RestoreOutcome::Present);
        }
        let version = record.version.max(spec.version);
        let mut e = EventData::empty(spec, now);
        e.total = record.total;
        e.version = version;
        e.available = record.available();
        e.held = record.held();
        e.confirmed = record.confirmed_total();
        e.set_categories(&cats.categories);
        for c in &mut e.cats {
            (c.held, c.confirmed) = cats.committed(record, &c.id);
            c.available = c.total.saturating_sub(c.held + c.confirmed);
        }
        for (visitor, category, qty) in &cats.confirmed {
            let q = u32::try_from(*qty).unwrap_or(u32::MAX);
            let c = e
                .vcats
                .entry((category.to_string(), visitor.clone()))
                .or_insert(0);
            *c = c.saturating_add(q);
        }
        let items_of = |id: &HoldId| {
            cats.hold_items
                .get(id.as_str())
                .cloned()
                .unwrap_or_default()
        };
        for h in &record.open_holds {
            let suffix = h.hold_id.suffix().to_owned();
            let items = items_of(&h.hold_id);
            let member = member_of(&suffix, &items, h.qty, &h.visitor);
            e.deadlines.insert((h.expires_at_ms, member.clone()));
            *e.visitors.entry(h.visitor.clone()).or_insert(0) += h.qty;
            for i in &items {
                *e.vcats
                    .entry((i.category.to_string(), h.visitor.clone()))
                    .or_insert(0) += i.qty;
            }
            e.holds.insert(
                suffix,
                HoldRec {
                    visitor: h.visitor.clone(),
                    qty: h.qty,
                    status: HoldStatus::Held,
                    deadline_ms: h.expires_at_ms,
                    member,
                    items,
                    purge_at_ms: h.expires_at_ms.max(now).saturating_add(released_ms),
                },
            );
        }
        let confirmed_ms = self.retention.confirmed_ms();
        for h in &record.confirmed_holds {
            let suffix = h.hold_id.suffix().to_owned();
            let items = items_of(&h.hold_id);
            let member = member_of(&suffix, &items, h.qty, &h.visitor);
            e.holds.insert(
                suffix,
                HoldRec {
                    visitor: h.visitor.clone(),
                    qty: h.qty,
                    status: HoldStatus::Confirmed,
                    deadline_ms: now,
                    member,
                    items,
                    purge_at_ms: now.saturating_add(confirmed_ms),
                },
            );
        }
        for (visitor, qty) in &record.confirmed {
            if *qty > 0 {
                // Checked below 2^32 by `restore_problem`.
                let q = u32::try_from(*qty).unwrap_or(u32::MAX);
                let c = e.visitors.entry(visitor.clone()).or_insert(0);
                *c = c.saturating_add(q);
            }
        }
        let (available, held, confirmed) = (e.available, e.held, e.confirmed);
        e.log(
            cap,
            Transition {
                kind: TransitionKind::Restored,
                hold_id: String::new(),
                visitor: String::new(),
                qty: record.total,
                available,
                ts_ms: now,
                payment_event_id: None,
                items: Vec::new(),
                categories: cats.categories.clone(),
                reason: None,
                waves: Vec::new(),
            },
        );
        events.insert(event.clone(), e);
        let marker = markers.entry(event.clone()).or_insert(0);
        *marker = (*marker).max(version);
        Ok(RestoreOutcome::Restored {
            available,
            held,
            confirmed,
        })
    }

    async fn get_hold(&self, hold_id: &HoldId, visitor: &str) -> Result<Option<HoldView>> {
        let now = self.now();
        let event = hold_id.event();
        let events = self.inner.events.lock();
        let Some(e) = events.get(&event) else {
            return Ok(None);
        };
        Ok(e.live_hold(hold_id.suffix(), now)
            .filter(|h| h.visitor == visitor)
            .map(|h| e.view(&event, hold_id.suffix(), h, now)))
    }

    async fn release(&self, hold_id: &HoldId, visitor: &str) -> Result<ReleaseOutcome> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let retention = &self.retention;
        let event = hold_id.event();
        let suffix = hold_id.suffix();
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(&event) else {
            return Ok(ReleaseOutcome::NotFound);
        };
        let Some(h) = e.live_hold(suffix, now).filter(|h| h.visitor == visitor) else {
            return Ok(ReleaseOutcome::NotFound);
        };
        Ok(match h.status {
            HoldStatus::Confirmed => ReleaseOutcome::Confirmed,
            HoldStatus::Released => ReleaseOutcome::AlreadyReleased,
            HoldStatus::Expired => ReleaseOutcome::Expired,
            HoldStatus::Held if h.deadline_ms <= now => {
                e.expire_hold(&event, cap, retention, suffix, now);
                ReleaseOutcome::Expired
            }
            HoldStatus::Held => {
                e.finish(
                    &event,
                    cap,
                    retention,
                    suffix,
                    HoldStatus::Released,
                    now,
                    None,
                );
                ReleaseOutcome::Released
            }
        })
    }

    async fn confirm(
        &self,
        hold_id: &HoldId,
        payment_event_id: &str,
        succeeded: bool,
    ) -> Result<ConfirmOutcome> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let retention = &self.retention;
        let event = hold_id.event();
        let suffix = hold_id.suffix();
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(&event) else {
            return Ok(ConfirmOutcome::NotFound);
        };
        if let Some((for_hold, answer, exp)) = e.payments.get(payment_event_id)
            && *exp > now
        {
            if for_hold != suffix {
                return Ok(ConfirmOutcome::PaymentReused);
            }
            return Ok(*answer);
        }
        let Some(h) = e.live_hold(suffix, now) else {
            return Ok(ConfirmOutcome::NotFound);
        };
        let answer = match h.status {
            HoldStatus::Confirmed => ConfirmOutcome::Confirmed,
            HoldStatus::Released => ConfirmOutcome::Released,
            HoldStatus::Expired => ConfirmOutcome::Expired,
            HoldStatus::Held if h.deadline_ms <= now => {
                e.expire_hold(&event, cap, retention, suffix, now);
                ConfirmOutcome::Expired
            }
            HoldStatus::Held if succeeded => {
                e.finish(
                    &event,
                    cap,
                    retention,
                    suffix,
                    HoldStatus::Confirmed,
                    now,
                    Some(payment_event_id),
                );
                ConfirmOutcome::Confirmed
            }
            HoldStatus::Held => {
                e.finish(
                    &event,
                    cap,
                    retention,
                    suffix,
                    HoldStatus::Released,
                    now,
                    Some(payment_event_id),
                );
                ConfirmOutcome::Released
            }
        };
        e.payments.insert(
            payment_event_id.to_owned(),
            (
                suffix.to_owned(),
                answer,
                now.saturating_add(ms(PAYMENT_TTL)),
            ),
        );
        Ok(answer)
    }

    async fn reap(&self, event: &EventId, max: usize) -> Result<usize> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(event) else {
            return Ok(0);
        };
        e.release_waves(cap, now);
        let n = e.reap(event, cap, now, max);
        e.purge(now);
        Ok(n)
    }

    async fn read(&self, event: &EventId) -> Result<Option<EventState>> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(event) else {
            return Ok(None);
        };
        e.reap(event, cap, now, usize::MAX);
        e.release_waves(cap, now);
        Ok(Some(EventState {
            event: event.clone(),
            total: e.total,
            available: Some(e.available),
            held: e.held,
            confirmed: e.confirmed,
            version: e.version,
            cart_limit: e.cart_limit,
            hold_ttl_secs: e.hold_ttl_ms.div_ceil(1000),
            hold_ttl_ms: e.hold_ttl_ms,
            room: e.room.clone(),
            invariant_holds: e.available + e.held + e.confirmed == e.total && e.categories_add_up(),
            categories: e.category_states(),
            waves: e.waves.clone(),
            shards: e.shards,
            shard_total: e.shard_total,
            in_transit: e.xout.values().map(|(_, q, _)| q).sum(),
            moves: e.moves,
            shard_states: Vec::new(),
        }))
    }

    async fn schedule_waves(&self, event: &EventId, waves: &[Wave]) -> Result<ScheduleOutcome> {
        if let Some(reason) = waves_problem(waves) {
            return Ok(ScheduleOutcome::Invalid { reason });
        }
        let mut waves = waves.to_vec();
        waves.sort();
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(event) else {
            return Ok(ScheduleOutcome::NotReady);
        };
        e.release_waves(cap, now);
        if let Some(refused) = e.schedule_problem(&waves, now) {
            return Ok(refused);
        }
        e.waves = waves.clone();
        let t = Transition {
            kind: TransitionKind::Stock,
            hold_id: String::new(),
            visitor: String::new(),
            qty: e.total,
            available: e.available,
            ts_ms: now,
            payment_event_id: None,
            items: Vec::new(),
            categories: e.category_specs(),
            reason: Some("waves".to_owned()),
            waves: waves.clone(),
        };
        e.log(cap, t);
        Ok(ScheduleOutcome::Scheduled { waves })
    }

    async fn events(&self) -> Result<Vec<EventId>> {
        let mut v: Vec<EventId> = self.inner.events.lock().keys().cloned().collect();
        v.sort();
        Ok(v)
    }

    async fn recent_transitions(&self, event: &EventId, n: usize) -> Result<Vec<Transition>> {
        let events = self.inner.events.lock();
        let Some(e) = events.get(event) else {
            return Ok(Vec::new());
        };
        let skip = e.log.len().saturating_sub(n);
        Ok(e.log.iter().skip(skip).cloned().collect())
    }
}
