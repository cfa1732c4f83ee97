//! The gateway's side of the ledger (`sluice-ledger`, README "Beyond one
//! machine"): its lag watched on every event's stream, a lost event rebuilt
//! from PostgreSQL, the rooms' queue floors raised from it, and the
//! consumer `serve --postgres` runs in-process.
//!
//! - **Lag** (with Redis, ledger or not): every second, per known event,
//!   the ledger's consumer group's lag on the stream
//!   ([`sluice_ledger::stream_lag`]); gauges `sluice_ledger_lag_entries`,
//!   `sluice_ledger_lag_seconds`, `sluice_ledger_behind`; the readiness
//!   detail and the admin event view carry it. A stream no ledger reads
//!   counts as behind only when this gateway is given a ledger.
//! - **Rebuild** (with `--postgres`): an event whose counters are missing
//!   from Redis gets them back from the ledger's record, in one atomic
//!   store step that refuses to overwrite live counters
//!   ([`sluice_reservation::Inventory::restore_with_categories`]: each
//!   category's counters, the holds' breakdowns and the carts per
//!   category come back too, and an event known with categories is never
//!   restored without them); by the admin API
//!   (`POST /_sluice/admin/events/{event}/rebuild`, `sluice admin event
//!   NAME rebuild`) and, with `ledger.auto_rebuild`, by a task as soon
//!   as it finds the event gone.
//! - **Floors** (with `--postgres`): every few seconds each room's highest
//!   tail, frontier and epoch the ledger recorded raise the floors this
//!   gateway recovers a lost room with, so a room lost while every gateway
//!   restarted is recreated above every seq the ledger saw handed out (a
//!   token above them is reseated, never given a seq someone else holds).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde_json::{Value, json};
use sluice_ledger::{Lag, Ledger, LedgerError};
use sluice_redis::{RedisConn, RedisTls, RedisUrl};
use sluice_reservation::{
    CategoryRecord, EventId, Inventory, RestoreOutcome, ScheduleOutcome, StockSpec, Wave,
};

use crate::app::problem::Problem;
use crate::app::state::{AppState, WeakState};
use crate::app::telemetry::Telemetry;
use crate::config::{Config, LedgerConfig};
use crate::gate::rooms::Rooms;
use crate::reserve::events::Events;

/// How long a call to PostgreSQL or Redis from the gateway may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the rooms' floors are read from the ledger.
const FLOORS_EVERY: Duration = Duration::from_secs(5);

/// What the gateway knows of the ledger: its settings, the lag last read
/// per event, and one PostgreSQL connection opened on demand.
pub struct LedgerLink {
    config: LedgerConfig,
    redis: Option<RedisUrl>,
    /// The TLS files of a `rediss…` store (validated with the config).
    redis_tls: RedisTls,
    lag: RwLock<BTreeMap<String, Lag>>,
    /// Each event's drift as the ledger last reconciled it, read with the
    /// floors.
    drift: RwLock<BTreeMap<String, Drift>>,
    pg: tokio::sync::Mutex<Option<Ledger>>,
}

/// An event's drift as the ledger last reconciled it: ledger − store
/// available units (0: they agreed), for the event and per category.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// The event's.
    pub units: i64,
    /// The categories that disagreed at the last reconciliation (empty:
    /// every category agreed, or the event has none).
    pub categories: BTreeMap<String, i64>,
}

/// Why a rebuild did not happen, as the admin API answers it.
#[derive(Debug)]
pub enum RebuildRefused {
    /// No `--postgres` on this gateway: a matter of configuration, not a
    /// fault (409 `ledger_not_configured`).
    NotConfigured,
    /// PostgreSQL cannot be reached or did not answer.
    Unavailable(String),
    /// The ledger has no record of the event.
    Unknown,
    /// The store still has the event's counters: nothing changed.
    Present,
    /// The record or the settings are unusable.
    Invalid(String),
    /// The store failed.
    Store(String),
}

impl RebuildRefused {
    fn label(&self) -> &'static str {
        match self {
            RebuildRefused::NotConfigured
            | RebuildRefused::Unavailable(_)
            | RebuildRefused::Store(_) => "failed",
            RebuildRefused::Unknown => "unknown",
            RebuildRefused::Present => "present",
            RebuildRefused::Invalid(_) => "invalid",
        }
    }
}

impl From<RebuildRefused> for Problem {
    fn from(r: RebuildRefused) -> Problem {
        use http::StatusCode;
        match r {
            RebuildRefused::NotConfigured => Problem::new(
                StatusCode::CONFLICT,
                "ledger_not_configured",
                "This gateway has no ledger (--postgres): it cannot rebuild from one",
            ),
            RebuildRefused::Unavailable(why) => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ledger_unavailable",
                "The ledger cannot be read",
            )
            .with("detail", why)
            .retry_after(5),
            RebuildRefused::Unknown => Problem::new(
                StatusCode::NOT_FOUND,
                "event_not_found",
                "The ledger has no record of this event",
            ),
            RebuildRefused::Present => Problem::new(
                StatusCode::CONFLICT,
                "event_present",
                "The store still has this event: a rebuild never overwrites live counters",
            ),
            RebuildRefused::Invalid(why) => Problem::invalid_setting("record", why),
            RebuildRefused::Store(why) => {
                Problem::store_unavailable().log_cause(&format!("rebuild: {why}"))
            }
        }
    }
}

impl LedgerLink {
    /// The link of a gateway with this configuration.
    pub fn new(config: &Config) -> Arc<LedgerLink> {
        Arc::new(LedgerLink {
            config: config.ledger.clone(),
            redis: config
                .redis
                .as_deref()
                .and_then(|u| RedisUrl::parse(u).ok()),
            redis_tls: config.redis_tls().unwrap_or_default(),
            lag: RwLock::new(BTreeMap::new()),
            drift: RwLock::new(BTreeMap::new()),
            pg: tokio::sync::Mutex::new(None),
        })
    }

    /// Whether this gateway was given a ledger database.
    pub fn has_postgres(&self) -> bool {
        self.config.postgres.is_some()
    }

    /// Whether `lag` passes the alert bounds (or, with a ledger
    /// configured, no ledger has read the stream yet).
    fn is_behind(&self, lag: &Lag) -> bool {
        if !lag.grouped {
            return self.has_postgres() && lag.entries > 0;
        }
        lag.entries > self.config.lag_alert_entries
            || lag.seconds > self.config.lag_alert.as_secs_f64()
    }

    /// The lag last read of `event`, and whether it is past the bounds.
    pub fn lag_of(&self, event: &str) -> Option<(Lag, bool)> {
        let lag = *self.lag.read().get(event)?;
        Some((lag, self.is_behind(&lag)))
    }

    /// The ledger's last reconciliation of `event`: its available units
    /// minus the store's at the same entry (0: they agreed), per category
    /// too.
    pub fn drift_of(&self, event: &str) -> Option<Drift> {
        self.drift.read().get(event).cloned()
    }

    /// The readiness detail: `None` when no stream was ever read (memory
    /// stores), else the events the ledger is behind on.
    pub fn readiness(&self) -> Option<Value> {
        let lag = self.lag.read();
        if lag.is_empty() && !self.has_postgres() {
            return None;
        }
        let behind: Vec<&String> = lag
            .iter()
            .filter(|(_, l)| self.is_behind(l))
            .map(|(e, _)| e)
            .collect();
        let worst = lag.values().map(|l| l.seconds).fold(0.0, f64::max);
        Some(json!({
            "configured": self.has_postgres(),
            "behind": behind,
            "lag_entries": lag.values().map(|l| l.entries).sum::<u64>(),
            "lag_seconds": worst,
        }))
    }

    /// Whether the ledger has a record of `event` (it was sold from some
    /// store: never to be loaded afresh from the configuration).
    pub async fn knows(&self, event: &EventId) -> Result<bool, RebuildRefused> {
        self.with_ledger(async |l: &mut Ledger| l.event_summary(event).await)
            .await
            .map(|s| s.is_some())
    }

    /// Runs `f` on the ledger's connection, opened (and the schema
    /// checked) on first use and again after it broke.
    async fn with_ledger<T>(
        &self,
        f: impl AsyncFnOnce(&mut Ledger) -> Result<T, LedgerError>,
    ) -> Result<T, RebuildRefused> {
        let Some(url) = &self.config.postgres else {
            return Err(RebuildRefused::NotConfigured);
        };
        let mut slot = self.pg.lock().await;
        if slot.as_ref().is_none_or(Ledger::is_closed) {
            let mut ledger = Ledger::connect(url, CALL_TIMEOUT)
                .await
                .map_err(|e| RebuildRefused::Unavailable(e.to_string()))?;
            ledger
                .migrate()
                .await
                .map_err(|e| RebuildRefused::Unavailable(e.to_string()))?;
            *slot = Some(ledger);
        }
        let Some(ledger) = slot.as_mut() else {
            return Err(RebuildRefused::Unavailable("no connection".into()));
        };
        match tokio::time::timeout(CALL_TIMEOUT * 5, f(ledger)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                *slot = None;
                Err(RebuildRefused::Unavailable(e.to_string()))
            }
            Err(_) => {
                *slot = None;
                Err(RebuildRefused::Unavailable(
                    "the ledger did not answer".into(),
                ))
            }
        }
    }
}

/// Rebuilds a lost event from the ledger: its record (total, version,
/// sales per visitor, open holds with their deadlines) put into the store
/// in one step that refuses to overwrite live counters, with the cart
/// limit and hold TTL this gateway knows the event by (its configuration,
/// or the store's last answer), and the room's floors raised from the
/// ledger first.
pub async fn rebuild(state: &AppState, event: &EventId) -> Result<Value, RebuildRefused> {
    let link = state.ledger();
    let telemetry = state.telemetry();
    let result = rebuild_inner(state, link, event).await;
    telemetry.ledger_rebuild(match &result {
        Ok(_) => "restored",
        Err(r) => r.label(),
    });
    result
}

async fn rebuild_inner(
    state: &AppState,
    link: &LedgerLink,
    event: &EventId,
) -> Result<Value, RebuildRefused> {
    let shards = state
        .config()
        .events
        .iter()
        .find(|e| e.id == event.as_str())
        .map(|e| e.shards)
        .unwrap_or(1)
        .max(state.inventory().cached_shards(event));
    if shards > 1 {
        return rebuild_sharded(state, link, event, shards).await;
    }
    let (record, categories) = link
        .with_ledger(async |l: &mut Ledger| l.event_record_with_categories(event).await)
        .await?
        .ok_or(RebuildRefused::Unknown)?;
    if let Some(why) = category_record_problem(state, event, &categories) {
        return Err(RebuildRefused::Invalid(why));
    }
    let configured = state
        .config()
        .events
        .iter()
        .find(|e| e.id == event.as_str());
    let room = match configured {
        Some(c) => Some(c.room.clone()),
        None => state.events().room_of(event.as_str()),
    }
    .ok_or_else(|| RebuildRefused::Invalid("this gateway does not know the event's room".into()))?;
    let (cart_limit, hold_ttl_ms) =
        state
            .events()
            .last_settings(event.as_str())
            .ok_or_else(|| {
                RebuildRefused::Invalid(
            "this gateway does not know the event's cart limit and hold TTL: PUT the event instead"
                .into(),
        )
            })?;
    if let Some(r) = state.rooms().get(&room) {
        let floors = link
            .with_ledger(async |l: &mut Ledger| l.room_floors(&room).await)
            .await?;
        if let Some(f) = floors {
            r.raise_floors(f.tail, f.frontier, f.epoch);
        }
    }
    let spec = StockSpec {
        total: record.total,
        cart_limit,
        hold_ttl: Duration::from_millis(hold_ttl_ms),
        version: record.version,
        room: room.clone(),
    };
    let outcome = state
        .inventory()
        .restore_with_categories(event, &spec, &record, &categories)
        .await
        .map_err(|e| RebuildRefused::Store(e.to_string()))?;
    match outcome {
        RestoreOutcome::Restored {
            available,
            held,
            confirmed,
        } => {
            tracing::warn!(
                event = %event,
                available, held, confirmed,
                open_holds = record.open_holds.len(),
                version = record.version,
                "event rebuilt from the ledger"
            );
            let (rescheduled, skipped) = reschedule_waves(state, event).await;
            if let Ok(s) = state.inventory().read(event).await {
                state.events().upsert(event.as_str(), &room, s);
            }
            Ok(json!({
                "waves_rescheduled": rescheduled,
                "waves_skipped": skipped.iter().map(super::waves::wave_json).collect::<Vec<_>>(),
                "event": event.as_str(),
                "outcome": "restored",
                "total": record.total,
                "available": available,
                "held": held,
                "confirmed": confirmed,
                "version": record.version.max(spec.version),
                "open_holds": record.open_holds.len(),
                "categories": categories.categories.len(),
            }))
        }
        RestoreOutcome::Present => Err(RebuildRefused::Present),
        RestoreOutcome::Invalid { reason } => Err(RebuildRefused::Invalid(reason)),
    }
}

/// The rebuild of a sharded event: each shard the store lost is restored
/// from the ledger's record of it (each shard is an event of its own in
/// the stream and the ledger), given the layout back, and shard 0 the
/// event's total: what its shards now have plus what is in transit
/// between them (never more than the total shard 0 still kept, when it
/// was not lost: units the ledger's lag lost are not put on sale).
/// Shards the store still has are left as they are; none lost is
/// [`RebuildRefused::Present`].
async fn rebuild_sharded(
    state: &AppState,
    link: &LedgerLink,
    event: &EventId,
    shards: u32,
) -> Result<Value, RebuildRefused> {
    use sluice_reservation::{Inventory as _, ShardLayout, ShardTotal};
    let store = |e: sluice_reservation::ReservationError| RebuildRefused::Store(e.to_string());
    let inner = state.inventory().inner();
    let configured = state
        .config()
        .events
        .iter()
        .find(|e| e.id == event.as_str());
    let room = match configured {
        Some(c) => Some(c.room.clone()),
        None => state.events().room_of(event.as_str()),
    }
    .ok_or_else(|| RebuildRefused::Invalid("this gateway does not know the event's room".into()))?;
    let (cart_limit, hold_ttl_ms) =
        state
            .events()
            .last_settings(event.as_str())
            .ok_or_else(|| {
                RebuildRefused::Invalid(
            "this gateway does not know the event's cart limit and hold TTL: PUT the event instead"
                .into(),
        )
            })?;
    if let Some(r) = state.rooms().get(&room)
        && let Some(f) = link
            .with_ledger(async |l: &mut Ledger| l.room_floors(&room).await)
            .await?
    {
        r.raise_floors(f.tail, f.frontier, f.epoch);
    }
    let kept_total = inner
        .read(event)
        .await
        .map_err(store)?
        .and_then(|s| s.shard_total);
    let mut restored = Vec::new();
    let (mut held, mut confirmed, mut open_holds) = (0, 0, 0);
    for k in 0..shards {
        let shard = event.shard(k);
        if inner.read(&shard).await.map_err(store)?.is_some() {
            continue;
        }
        let Some((record, _)) = link
            .with_ledger(async |l: &mut Ledger| l.event_record_with_categories(&shard).await)
            .await?
        else {
            return Err(RebuildRefused::Invalid(format!(
                "the ledger has no record of shard {shard}"
            )));
        };
        let spec = StockSpec {
            total: record.total,
            cart_limit,
            hold_ttl: Duration::from_millis(hold_ttl_ms),
            version: record.version,
            room: room.clone(),
        };
        match inner.restore(&shard, &spec, &record).await.map_err(store)? {
            RestoreOutcome::Restored {
                held: h,
                confirmed: c,
                ..
            } => {
                held += h;
                confirmed += c;
                open_holds += record.open_holds.len();
                restored.push(shard);
            }
            // Put back meanwhile by another gateway.
            RestoreOutcome::Present => {}
            RestoreOutcome::Invalid { reason } => return Err(RebuildRefused::Invalid(reason)),
        }
    }
    if restored.is_empty() {
        return Err(RebuildRefused::Present);
    }
    let mut total = 0;
    for k in 0..shards {
        if let Some(s) = inner.read(&event.shard(k)).await.map_err(store)? {
            total += s.total + s.in_transit;
        }
    }
    let total = kept_total.map_or(total, |t| t.min(total));
    // The layout back on every restored shard, and shard 0 (restored or
    // not) the event's total, last: it is what routers read.
    let mut layouts: Vec<&EventId> = restored.iter().filter(|s| s.is_shard()).collect();
    layouts.push(event);
    for shard in layouts {
        let layout = ShardLayout {
            shards,
            shard_total: if shard.is_shard() {
                ShardTotal::Keep
            } else {
                ShardTotal::Set(total)
            },
            cart_limit,
            hold_ttl_ms,
            room: room.clone(),
            version: None,
            require_idle: false,
        };
        inner.set_layout(shard, &layout).await.map_err(store)?;
    }
    tracing::warn!(event = %event, shards = restored.len(), total, held, confirmed,
        "sharded event: lost shards rebuilt from the ledger");
    let now = state.inventory().read(event).await.map_err(store)?;
    let available = now.as_ref().and_then(|s| s.available);
    state.events().upsert(event.as_str(), &room, now);
    Ok(json!({
        "event": event.as_str(),
        "outcome": "restored",
        "shards_restored": restored.iter().map(EventId::as_str).collect::<Vec<_>>(),
        "total": total,
        "available": available,
        "held": held,
        "confirmed": confirmed,
        "open_holds": open_holds,
        "waves_rescheduled": 0,
        "waves_skipped": [],
        "categories": 0,
    }))
}

/// Pending waves after a rebuild. The ledger records the totals every
/// released wave reached (its `stock` entries), not the schedule; this
/// gateway schedules again the waves it last saw pending whose time is
/// still ahead (by a second's margin over its clock): such a wave was
/// never released, so it cannot be applied twice. Waves due since are
/// skipped and reported (one may have been released just before the loss
/// and be in the ledger's total already): the operator decides. A
/// gateway that never saw the event (a restart) knows no waves: the
/// operator puts the schedule back (`PUT .../waves`). Returns how many
/// were scheduled and the skipped ones.
async fn reschedule_waves(state: &AppState, event: &EventId) -> (usize, Vec<Wave>) {
    let last = state.events().last_waves(event.as_str());
    if last.is_empty() {
        return (0, Vec::new());
    }
    let horizon = crate::app::clock::now_ms() + 1_000;
    let (ahead, skipped): (Vec<Wave>, Vec<Wave>) =
        last.into_iter().partition(|w| w.at_ms > horizon);
    let n = ahead.len();
    let done = match state.inventory().schedule_waves(event, &ahead).await {
        Ok(ScheduleOutcome::Scheduled { .. }) => n,
        other => {
            tracing::error!(event = %event, outcome = ?other,
                "rebuild: the waves pending before the loss could not be scheduled again; put the schedule back (PUT /_sluice/admin/events/{{event}}/waves)");
            0
        }
    };
    for w in &skipped {
        tracing::warn!(event = %event, at_ms = w.at_ms, qty = w.qty,
            "rebuild: a wave pending before the loss came due meanwhile and is not scheduled again (it may be in the ledger's total already)");
    }
    (done, skipped)
}

/// Why the record's per-category part cannot rebuild `event` exactly, if
/// it cannot: holds broken down by category in an event the ledger knows
/// without categories, or an event this gateway knows with categories (its
/// configuration or the store's last answer) that the ledger recorded
/// without (entries written before the ledger knew categories, or by an
/// older ledger). Restoring either as a plain event would sell each tier's
/// units as the event's, so the rebuild refuses instead.
fn category_record_problem(
    state: &AppState,
    event: &EventId,
    categories: &CategoryRecord,
) -> Option<String> {
    if !categories.categories.is_empty() {
        return None;
    }
    if !categories.hold_items.is_empty() {
        return Some(
            "the ledger has holds broken down by category but no categories for the event: \
             refusing to restore it as an event without categories"
                .into(),
        );
    }
    if state.events().known_with_categories(event.as_str()) {
        return Some(
            "this gateway knows the event with categories but the ledger recorded none: \
             refusing to restore it as an event without categories (PUT the event instead)"
                .into(),
        );
    }
    None
}

/// With a ledger and `ledger.auto_rebuild`: every second, each known event
/// whose counters the store no longer has is rebuilt from the ledger (the
/// reaper found it gone; a rebuild refuses to overwrite counters another
/// gateway put back first). Ends when the gateway's state is dropped.
pub async fn run_auto_rebuild(weak: WeakState) {
    let mut interval = tokio::time::interval(crate::reserve::events::REAP_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(state) = weak.upgrade() else {
            return;
        };
        let link = state.ledger();
        if !link.has_postgres() || !link.config.auto_rebuild {
            return;
        }
        for id in state.events().ids() {
            let Some(event) = EventId::parse(&id) else {
                continue;
            };
            // Lost: known by its settings, absent from the store; or a
            // sharded event one of whose shards the store lost.
            let lost = match state.inventory().read(&event).await {
                Ok(None) => {
                    state.events().cached(&id).is_none()
                        && state.events().last_settings(&id).is_some()
                }
                Ok(Some(s)) => {
                    s.shards > 1
                        && s.shard_states.iter().any(|x| x.available.is_none())
                        && state.events().last_settings(&id).is_some()
                }
                Err(_) => false,
            };
            if !lost {
                continue;
            }
            match rebuild(&state, &event).await {
                Ok(v) => {
                    tracing::warn!(event = %id, result = %v, "lost event rebuilt from the ledger")
                }
                Err(RebuildRefused::Present | RebuildRefused::Unknown) => {}
                Err(e) => tracing::warn!(event = %id, error = ?e, "automatic rebuild failed"),
            }
        }
    }
}

/// Reads the ledger's lag on every known event's stream, every second,
/// while the gateway runs on Redis.
pub async fn run_lag_watch(link: Arc<LedgerLink>, events: Events, telemetry: Telemetry) {
    let Some(url) = link.redis.clone() else {
        return;
    };
    let mut conn: Option<RedisConn> = None;
    let mut interval = tokio::time::interval(crate::reserve::events::REAP_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if conn.is_none() {
            match tokio::time::timeout(
                CALL_TIMEOUT,
                url.connect_with(CALL_TIMEOUT, &link.redis_tls),
            )
            .await
            {
                Ok(Ok(c)) => conn = Some(c),
                _ => continue,
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        for id in events.ids() {
            let Some(event) = EventId::parse(&id) else {
                continue;
            };
            match tokio::time::timeout(CALL_TIMEOUT, sluice_ledger::stream_lag(c, &event)).await {
                Ok(Ok(lag)) => {
                    let behind = link.is_behind(&lag);
                    telemetry.ledger_lag(&id, lag.entries, lag.seconds, behind);
                    link.lag.write().insert(id, lag);
                }
                Ok(Err(e)) => tracing::debug!(event = %id, error = %e, "ledger lag unread"),
                Err(_) => {
                    conn = None;
                    break;
                }
            }
        }
    }
}

/// Raises every room's recovery floors from the ledger's record, every
/// few seconds, while the gateway has a ledger.
pub async fn run_floors(
    link: Arc<LedgerLink>,
    rooms: Arc<Rooms>,
    events: Events,
    telemetry: Telemetry,
) {
    if !link.has_postgres() {
        return;
    }
    let mut interval = tokio::time::interval(FLOORS_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        link.raise_floors(&rooms).await;
        link.read_drift(&events, &telemetry).await;
    }
}

impl LedgerLink {
    /// Each known event's drift as the ledger last reconciled it, per
    /// category too: kept for the admin view, `sluice_ledger_drift_units`
    /// and `sluice_ledger_category_drift_units`, and logged when not 0.
    async fn read_drift(&self, events: &Events, telemetry: &Telemetry) {
        for id in events.ids() {
            let Some(event) = EventId::parse(&id) else {
                continue;
            };
            match self
                .with_ledger(async |l: &mut Ledger| l.event_summary(&event).await)
                .await
            {
                Ok(Some(summary)) => {
                    let now = Drift {
                        units: summary.drift_units,
                        categories: summary.category_drift,
                    };
                    let before = self.drift_of(&id).unwrap_or_default();
                    if now != before && (now.units != 0 || !now.categories.is_empty()) {
                        tracing::warn!(event = %id, drift_units = now.units, category_drift = ?now.categories, "the ledger and the store disagree (ledger − store available units); nothing is corrected upward");
                    }
                    telemetry.ledger_drift(&id, now.units);
                    // A category that drifted before and agrees now goes
                    // back to 0 (one that never drifted has no series).
                    for category in before.categories.keys() {
                        if !now.categories.contains_key(category) {
                            telemetry.ledger_category_drift(&id, category, 0);
                        }
                    }
                    for (category, units) in &now.categories {
                        telemetry.ledger_category_drift(&id, category, *units);
                    }
                    self.drift.write().insert(id, now);
                }
                Ok(None) => {}
                Err(_) => return,
            }
        }
    }

    /// One pass of [`run_floors`]: each room's floors raised to the
    /// ledger's (nothing without a ledger; a ledger away is logged and
    /// tried again on the next pass).
    pub async fn raise_floors(&self, rooms: &Rooms) {
        if !self.has_postgres() {
            return;
        }
        for room in rooms.all() {
            let id = room.id().to_owned();
            match self
                .with_ledger(async |l: &mut Ledger| l.room_floors(&id).await)
                .await
            {
                Ok(Some(f)) => room.raise_floors(f.tail, f.frontier, f.epoch),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(room = %id, error = ?e, "the ledger's room floors cannot be read");
                    break;
                }
            }
        }
    }
}

/// Runs a ledger consumer in this process (`serve --postgres`): one more
/// member of the consumer group, beside any `sluice ledger` processes.
pub async fn run_consumer(config: &Config) {
    let (Some(redis), Some(pg)) = (&config.redis, &config.ledger.postgres) else {
        return;
    };
    let mut c = sluice_ledger::ConsumerConfig::new(redis.clone(), pg.clone());
    c.redis_tls = config.redis_tls().unwrap_or_default();
    c.batch = config.ledger.batch;
    c.flush = config.ledger.flush_interval;
    let metrics = Arc::new(sluice_ledger::Metrics::default());
    if let Err(e) = sluice_ledger::run(c, metrics, std::future::pending()).await {
        tracing::error!(error = %e, "the in-process ledger stopped");
    }
}
