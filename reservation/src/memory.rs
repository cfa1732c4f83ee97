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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::record::{EventRecord, RestoreOutcome};
use crate::retention::Retention;
use crate::types::{
    ConfirmOutcome, EventId, EventState, HoldId, HoldOutcome, HoldStatus, HoldView, LoadOutcome,
    ReleaseOutcome, SetStockOutcome, StockSpec, Transition, TransitionKind,
};
use crate::{
    IDEMPOTENCY_TTL, Inventory, LAZY_REAP_MAX, PAYMENT_TTL, restore_problem, spec_problem,
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
}

struct HoldRec {
    visitor: String,
    qty: u32,
    /// As stored: `Held` past its deadline reads as `Expired`.
    status: HoldStatus,
    deadline_ms: u64,
    member: String,
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

fn member_of(suffix: &str, qty: u32, visitor: &str) -> String {
    format!("{suffix}:{qty}:{visitor}")
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
                if spec.version <= e.version {
                    return Ok(SetStockOutcome::Stale {
                        current_version: e.version,
                    });
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
        }
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
        let suffix = parts.next().unwrap_or_default().to_owned();
        let qty: u32 = parts.next().and_then(|q| q.parse().ok()).unwrap_or(0);
        let visitor = parts.next().unwrap_or_default().to_owned();
        self.give_back(u64::from(qty));
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

    fn purge(&mut self, now: u64) {
        if now.saturating_sub(self.last_purge_ms) < PURGE_EVERY_MS {
            return;
        }
        self.last_purge_ms = now;
        self.holds.retain(|_, h| h.purge_at_ms > now);
        self.idem.retain(|_, (_, exp)| *exp > now);
        self.payments.retain(|_, (_, _, exp)| *exp > now);
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
        let (qty, deadline, member, visitor) =
            (h.qty, h.deadline_ms, h.member.clone(), h.visitor.clone());
        self.deadlines.remove(&(deadline, member));
        let q = u64::from(qty);
        let kind = if to == HoldStatus::Confirmed {
            self.held = self.held.saturating_sub(q);
            self.confirmed += q;
            TransitionKind::Confirmed
        } else {
            self.give_back(q);
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
    async fn set_stock(&self, event: &EventId, spec: &StockSpec) -> Result<SetStockOutcome> {
        if let Some(reason) = spec_problem(spec) {
            return Ok(SetStockOutcome::Invalid { reason });
        }
        Ok(self
            .set_stock_locked(event, spec, false)
            .unwrap_or(SetStockOutcome::Invalid {
                reason: "refused to load",
            }))
    }

    async fn load_if_new(&self, event: &EventId, spec: &StockSpec) -> Result<LoadOutcome> {
        if let Some(reason) = spec_problem(spec) {
            return Ok(LoadOutcome::Invalid { reason });
        }
        Ok(match self.set_stock_locked(event, spec, true) {
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

    async fn restore(
        &self,
        event: &EventId,
        spec: &StockSpec,
        record: &EventRecord,
    ) -> Result<RestoreOutcome> {
        if let Some(reason) = restore_problem(event, spec, record) {
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
        for h in &record.open_holds {
            let suffix = h.hold_id.suffix().to_owned();
            let member = member_of(&suffix, h.qty, &h.visitor);
            e.deadlines.insert((h.expires_at_ms, member.clone()));
            *e.visitors.entry(h.visitor.clone()).or_insert(0) += h.qty;
            e.holds.insert(
                suffix,
                HoldRec {
                    visitor: h.visitor.clone(),
                    qty: h.qty,
                    status: HoldStatus::Held,
                    deadline_ms: h.expires_at_ms,
                    member,
                    purge_at_ms: h.expires_at_ms.max(now).saturating_add(released_ms),
                },
            );
        }
        let confirmed_ms = self.retention.confirmed_ms();
        for h in &record.confirmed_holds {
            let suffix = h.hold_id.suffix().to_owned();
            let member = member_of(&suffix, h.qty, &h.visitor);
            e.holds.insert(
                suffix,
                HoldRec {
                    visitor: h.visitor.clone(),
                    qty: h.qty,
                    status: HoldStatus::Confirmed,
                    deadline_ms: now,
                    member,
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

    async fn hold(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
    ) -> Result<HoldOutcome> {
        let now = self.now();
        let cap = self.inner.log_capacity;
        let mut events = self.inner.events.lock();
        let Some(e) = events.get_mut(event) else {
            return Ok(HoldOutcome::NotReady);
        };
        e.reap(event, cap, now, LAZY_REAP_MAX);
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
            return Ok(HoldOutcome::Replayed(e.view(event, suffix, h, now)));
        }
        let limit = e.cart_limit;
        if qty == 0 || qty > limit {
            return Ok(HoldOutcome::InvalidQuantity { limit });
        }
        let have = e.visitors.get(visitor).copied().unwrap_or(0);
        if u64::from(have) + u64::from(qty) > u64::from(limit) {
            return Ok(HoldOutcome::CartLimitExceeded { limit, held: have });
        }
        let q = u64::from(qty);
        e.reap_until_available(event, cap, now, q);
        if e.available < q {
            return Ok(HoldOutcome::SoldOut {
                available: e.available,
            });
        }
        let hold_id = HoldId::generate(event);
        let suffix = hold_id.suffix().to_owned();
        e.available -= q;
        e.held += q;
        *e.visitors.entry(visitor.to_owned()).or_insert(0) += qty;
        let deadline = now.saturating_add(e.hold_ttl_ms);
        let member = member_of(&suffix, qty, visitor);
        e.deadlines.insert((deadline, member.clone()));
        e.holds.insert(
            suffix.clone(),
            HoldRec {
                visitor: visitor.to_owned(),
                qty,
                status: HoldStatus::Held,
                deadline_ms: deadline,
                member,
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
            },
        );
        Ok(HoldOutcome::Held(HoldView {
            hold_id,
            event: event.clone(),
            qty,
            status: HoldStatus::Held,
            expires_at: deadline / 1000,
            expires_at_ms: deadline,
            available,
            visitor: visitor.to_owned(),
        }))
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
            invariant_holds: e.available + e.held + e.confirmed == e.total,
        }))
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
