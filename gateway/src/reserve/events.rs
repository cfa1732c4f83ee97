//! The events sold through the reservation module: which room's visitors
//! may buy each, a cached view of each event's stock (refreshed every
//! second, so "sold out" is known without a store call per poll), and the
//! reaper task that returns expired holds to stock.
//!
//! Configured stock is loaded at start (with `load_stock`), and only into
//! a store that never had the event. Three things say a store had it, any
//! one is enough to refuse the load ([`LoadGuard`]):
//!
//! 1. the store's own load marker (`sluice:loaded:{event}` in Redis), which
//!    outlives the event's keys when they are evicted, deleted or missing
//!    on a replica promoted too early ([`Inventory::load_if_new`], atomic);
//! 2. this process saw the event loaded: it never loads it again, and when
//!    it finds the event gone it writes the store's marker back
//!    ([`Inventory::remember_loaded`]), so a `FLUSHALL` behind a running
//!    gateway leaves a marker within one tick ([`REAP_EVERY`]);
//! 3. the gateway's state file (`[reservation] state_file`), which outlives
//!    the process and a `FLUSHALL`.
//!
//! A lost event answers 503 `inventory_not_ready` (never sold out, never
//! sold again) until an operator loads it (`PUT
//! /_sluice/admin/events/{event}`: the answer says `"lost": true`) or a
//! ledger restores it. The one case left: a `FLUSHALL` (or an empty
//! restart, or a failover to an empty replica) with no gateway running to
//! write the marker back before the others start again, no state file and
//! no ledger looks exactly like a new store, and `load_stock` then loads
//! the configured total again. That is why `load_stock` defaults to off
//! with Redis.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use sluice_reservation::{
    EventId, EventState, Inventory, LoadOutcome, StockBackend, StockSpec, Wave,
};

use crate::config::{Config, EventConfig};

/// How often expired holds are reaped and event views refreshed.
pub const REAP_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
struct Entry {
    room: String,
    state: Option<EventState>,
    /// The cart limit and hold TTL (ms) last read from the store: what a
    /// rebuild from the ledger puts back when the store lost them (the
    /// stream records totals, not these settings).
    settings: Option<(u32, u64)>,
    /// Whether the event was last known with categories (its configuration
    /// or the store's last answer): a rebuild must then restore them.
    categorized: bool,
    /// The pending waves of the store's last answer, kept after the store
    /// lost the event: a rebuild from the ledger schedules again those
    /// still in the future (`ledger::rebuild`).
    last_waves: Vec<Wave>,
}

/// Known events (configured or created through the admin API).
#[derive(Clone, Default)]
pub struct Events {
    inner: Arc<RwLock<HashMap<String, Entry>>>,
    /// Bumped whenever an event's cached state changes (the availability
    /// streams wait on it).
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Events {
    /// The configured events.
    pub fn from_config(config: &Config) -> Events {
        let map = config
            .events
            .iter()
            .map(|e| {
                (
                    e.id.clone(),
                    Entry {
                        room: e.room.clone(),
                        state: None,
                        settings: Some((e.cart_limit, duration_ms(e.hold_ttl))),
                        categorized: !e.categories.is_empty(),
                        last_waves: Vec::new(),
                    },
                )
            })
            .collect();
        Events {
            inner: Arc::new(RwLock::new(map)),
            changed: Arc::default(),
        }
    }

    /// The room whose admitted visitors may buy `event`, if the event is
    /// known to this gateway.
    pub fn room_of(&self, event: &str) -> Option<String> {
        self.inner.read().get(event).map(|e| {
            e.state
                .as_ref()
                .map(|s| s.room.clone())
                .unwrap_or_else(|| e.room.clone())
        })
    }

    /// A receiver woken when any event's cached state changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Records an event created or changed through the admin API.
    pub fn upsert(&self, event: &str, room: &str, state: Option<EventState>) {
        self.bump();
        let mut map = self.inner.write();
        let categorized = match &state {
            Some(s) => !s.categories.is_empty(),
            None => map.get(event).is_some_and(|e| e.categorized),
        };
        let last_waves = match &state {
            Some(s) => s.waves.clone(),
            None => map
                .get(event)
                .map(|e| e.last_waves.clone())
                .unwrap_or_default(),
        };
        map.insert(
            event.to_owned(),
            Entry {
                room: room.to_owned(),
                settings: state.as_ref().map(|s| (s.cart_limit, s.hold_ttl_ms)),
                state,
                categorized,
                last_waves,
            },
        );
    }

    /// Whether the event was last known with categories (configured so,
    /// or the store's last answer had them), even after the store lost it.
    pub fn known_with_categories(&self, event: &str) -> bool {
        self.inner.read().get(event).is_some_and(|e| e.categorized)
    }

    /// Every known event id.
    pub fn ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.read().keys().cloned().collect();
        v.sort();
        v
    }

    /// The cached state of an event.
    pub fn cached(&self, event: &str) -> Option<EventState> {
        self.inner.read().get(event).and_then(|e| e.state.clone())
    }

    /// A room is sold out when it sells at least one event and every one
    /// of them is loaded with nothing available and no wave pending (a
    /// scheduled wave will put more on sale). Stock held in carts may
    /// still come back (see [`Events::room_stock_may_return`]): the room
    /// stops admitting meanwhile and resumes when it does.
    pub fn room_sold_out(&self, room: &str) -> bool {
        self.room_stock(room) == Some(true)
    }

    /// Whether `room` is sold out (see [`Events::room_sold_out`]); `None`
    /// while any of its events has not been read from the store yet (or it
    /// sells none), so a gateway just started does not decide from nothing.
    pub fn room_stock(&self, room: &str) -> Option<bool> {
        let map = self.inner.read();
        let mut any = false;
        let mut sold_out = true;
        for e in map.values() {
            let r = e.state.as_ref().map(|s| s.room.as_str()).unwrap_or(&e.room);
            if r != room {
                continue;
            }
            any = true;
            match &e.state {
                Some(s) => {
                    if !(s.available == Some(0) && s.total > 0 && s.waves.is_empty()) {
                        sold_out = false;
                    }
                }
                None => return None,
            }
        }
        any.then_some(sold_out)
    }

    /// Whether some of `room`'s stock is held in carts (and so may come back
    /// when holds expire or are released).
    pub fn room_stock_may_return(&self, room: &str) -> bool {
        self.inner.read().values().any(|e| {
            e.state
                .as_ref()
                .is_some_and(|s| s.room == room && s.held > 0)
        })
    }

    /// When the next scheduled wave of any of `room`'s events opens (Unix
    /// ms, the store's clock), as last read from the store.
    pub fn room_next_wave_ms(&self, room: &str) -> Option<u64> {
        self.inner
            .read()
            .values()
            .filter_map(|e| e.state.as_ref())
            .filter(|s| s.room == room)
            .filter_map(EventState::next_wave_at_ms)
            .min()
    }

    fn set_state(&self, event: &str, state: Option<EventState>) {
        let mut map = self.inner.write();
        if let Some(e) = map.get_mut(event) {
            if e.state != state {
                self.bump();
            }
            if let Some(s) = &state {
                e.room = s.room.clone();
                e.settings = Some((s.cart_limit, s.hold_ttl_ms));
                e.categorized = !s.categories.is_empty();
                e.last_waves = s.waves.clone();
            }
            e.state = state;
        }
    }

    /// The waves this gateway last saw pending for the event (kept after
    /// the store lost it).
    pub fn last_waves(&self, event: &str) -> Vec<Wave> {
        self.inner
            .read()
            .get(event)
            .map(|e| e.last_waves.clone())
            .unwrap_or_default()
    }

    /// The cart limit and hold TTL (ms) this gateway last knew the event
    /// by (its configuration, or the store's last answer), even after the
    /// store lost it.
    pub fn last_settings(&self, event: &str) -> Option<(u32, u64)> {
        self.inner.read().get(event).and_then(|e| e.settings)
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why a gateway must not load configured stock into the store: the
/// events it has seen loaded, in this process and (with a state file) in
/// earlier ones, with the highest stock version seen.
#[derive(Debug, Default)]
pub struct LoadGuard {
    seen: BTreeMap<String, u64>,
    file: Option<PathBuf>,
    /// The file could not be read: load nothing (bias to not selling).
    broken: bool,
    /// Events whose loss this gateway has already logged.
    reported: HashSet<String>,
}

/// What a state file holds.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    /// Event id → highest stock version seen loaded.
    events: BTreeMap<String, u64>,
}

impl LoadGuard {
    /// A guard remembering in `file` (read now) when given.
    pub fn open(file: Option<PathBuf>) -> LoadGuard {
        let mut guard = LoadGuard {
            seen: BTreeMap::new(),
            file: file.clone(),
            broken: false,
            reported: HashSet::new(),
        };
        let Some(path) = file else {
            return guard;
        };
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<StateFile>(&bytes) {
                Ok(state) => guard.seen = state.events,
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e,
                        "reservation state file is malformed: no configured stock will be loaded");
                    guard.broken = true;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e,
                    "reservation state file cannot be read: no configured stock will be loaded");
                guard.broken = true;
            }
        }
        guard
    }

    /// Whether configured stock may be loaded for `event` (the store's own
    /// marker is checked by the store, atomically).
    pub fn may_load(&self, event: &str) -> bool {
        !self.broken && !self.seen.contains_key(event)
    }

    /// The version this gateway saw `event` loaded with, if it did.
    pub fn seen(&self, event: &str) -> Option<u64> {
        self.seen.get(event).copied()
    }

    /// Records that `event` is loaded in the store with `version`; writes
    /// the state file when this is news.
    pub fn saw(&mut self, event: &str, version: u64) {
        self.reported.remove(event);
        if self.seen.get(event).is_some_and(|v| *v >= version) {
            return;
        }
        self.seen.insert(event.to_owned(), version);
        if let Some(path) = &self.file
            && !self.broken
            && let Err(e) = write_state(path, &self.seen)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the reservation state file");
        }
    }
}

impl LoadGuard {
    /// True the first time `event` is found lost since it was last seen
    /// loaded (so the loss is logged once, not every tick).
    pub fn first_loss(&mut self, event: &str) -> bool {
        self.reported.insert(event.to_owned())
    }
}

/// Writes the state file whole (a temporary file renamed over it, so a
/// crash leaves the old file or the new one, never half of one).
fn write_state(path: &Path, seen: &BTreeMap<String, u64>) -> std::io::Result<()> {
    let state = StateFile {
        events: seen.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&state).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Loads configured stock into a store that never had the event (see the
/// module docs), then reaps expired holds and refreshes the cached views
/// every [`REAP_EVERY`]. Every gateway runs it; reaping is idempotent and
/// returns each hold's stock once.
pub async fn run_reaper(
    events: Events,
    inventory: StockBackend,
    configured: Vec<EventConfig>,
    load_stock: bool,
    state_file: Option<PathBuf>,
    ledger: Arc<crate::reserve::ledger::LedgerLink>,
) {
    let mut guard = LoadGuard::open(state_file);
    let mut loaded = false;
    let mut interval = tokio::time::interval(REAP_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    loop {
        interval.tick().await;
        if !loaded {
            loaded =
                load_configured(&inventory, &configured, load_stock, &mut guard, &ledger).await;
        }
        // Every 10 s, adopt events another gateway created in the shared
        // store, so this gateway reaps them too.
        if ticks.is_multiple_of(10)
            && let Ok(ids) = inventory.events().await
        {
            // A shard (`hot~3`) is part of its event, reaped with it.
            for id in ids.into_iter().filter(|id| !id.is_shard()) {
                if events.room_of(id.as_str()).is_none()
                    && let Ok(Some(state)) = inventory.read(&id).await
                {
                    let room = state.room.clone();
                    events.upsert(id.as_str(), &room, Some(state));
                }
            }
        }
        ticks += 1;
        for id in events.ids() {
            let Some(event) = EventId::parse(&id) else {
                continue;
            };
            if let Err(e) = inventory.reap(&event, 10_000).await {
                tracing::debug!(event = %id, error = %e, "reap failed");
                continue;
            }
            // The other shards of a sharded event: reaped, and their
            // transfers cut in half by a gateway that stopped landed.
            for k in 1..inventory.cached_shards(&event) {
                if let Err(e) = inventory.reap(&event.shard(k), 10_000).await {
                    tracing::debug!(event = %id, shard = k, error = %e, "reap failed");
                }
            }
            match inventory.read(&event).await {
                Ok(state) => {
                    match &state {
                        Some(s) if s.ready() => guard.saw(&id, s.version),
                        None => {
                            if let Some(version) = guard.seen(&id) {
                                lost_behind_us(&inventory, &event, version, &mut guard).await;
                            }
                        }
                        Some(_) => {}
                    }
                    events.set_state(&id, state)
                }
                Err(e) => tracing::debug!(event = %id, error = %e, "read failed"),
            }
        }
    }
}

/// An event this gateway saw loaded is gone from the store (a `FLUSHALL`,
/// an eviction, a failover to an empty replica): put its load marker back,
/// so gateways (re)started from now on refuse to load configured stock into
/// it even when the flush took the marker, and say so once.
async fn lost_behind_us(
    inventory: &StockBackend,
    event: &EventId,
    version: u64,
    guard: &mut LoadGuard,
) {
    if let Err(e) = inventory.remember_loaded(event, version).await {
        tracing::debug!(event = %event, error = %e, "cannot write the load marker back");
        return;
    }
    if guard.first_loss(event.as_str()) {
        tracing::error!(
            event = %event,
            last_version = version,
            "event lost: the store no longer has this event's stock (flushed, evicted or failed over); \
             it stays not ready (503 inventory_not_ready) and is never reloaded from the configuration; \
             an operator loads it (PUT /_sluice/admin/events/{{event}}) or a ledger rebuilds it"
        );
    }
}

/// Loads each configured event's stock into a store that never had the
/// event, when `load` (see `Config::load_stock`) and `guard` allow; says
/// once, for every configured event the store lacks, that it stays not
/// ready until an operator loads it. False when the store could not be
/// asked (try again on the next tick).
async fn load_configured(
    inventory: &StockBackend,
    configured: &[EventConfig],
    load: bool,
    guard: &mut LoadGuard,
    ledger: &crate::reserve::ledger::LedgerLink,
) -> bool {
    for ec in configured {
        if ec.effective_total() == 0 {
            continue;
        }
        let Some(event) = EventId::parse(&ec.id) else {
            continue;
        };
        let state = match inventory.read(&event).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(event = %ec.id, error = %e, "cannot read the inventory yet");
                return false;
            }
        };
        if let Some(s) = state {
            // Present (even with a lost counter: an operator's matter).
            guard.saw(&ec.id, s.version);
            continue;
        }
        if !load {
            tracing::error!(
                event = %ec.id,
                "the store has no stock for this event: it stays not ready (503 inventory_not_ready) until it is loaded \
                 (PUT /_sluice/admin/events/{{event}}, `sluice admin event {} set`, or --load-stock on a store that never had it); \
                 configured stock is not reloaded into a store that may have lost a sale",
                ec.id
            );
            continue;
        }
        if !guard.may_load(&ec.id) {
            tracing::error!(
                event = %ec.id,
                seen_version = guard.seen(&ec.id),
                "event lost: this gateway saw it loaded (in this process or its state file) and the store no longer has it; \
                 configured stock is not loaded again: it stays not ready (503 inventory_not_ready) until an operator loads it \
                 (PUT /_sluice/admin/events/{{event}}) or a ledger rebuilds it"
            );
            continue;
        }
        // The ledger is the record: an event it knows was sold from a store
        // that has lost it (even a flush that took the load marker, with no
        // gateway up to write it back), so it is rebuilt, never loaded
        // afresh. A ledger that cannot be asked loads nothing yet.
        if ledger.has_postgres() {
            match ledger.knows(&event).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::error!(
                        event = %ec.id,
                        "event lost: the ledger has its record and the store does not; configured stock is not loaded: \
                         it is rebuilt from the ledger (automatically with ledger.auto_rebuild, else \
                         `sluice admin event {} rebuild`)",
                        ec.id
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!(event = %ec.id, error = ?e, "cannot ask the ledger yet: nothing loaded");
                    return false;
                }
            }
        }
        let spec = StockSpec {
            total: ec.effective_total(),
            cart_limit: ec.cart_limit,
            hold_ttl: ec.hold_ttl,
            version: 1,
            room: ec.room.clone(),
        };
        let loaded = if ec.shards > 1 {
            inventory
                .load_sharded_if_new(&event, &spec, ec.shards)
                .await
        } else {
            inventory
                .load_if_new_with_categories(&event, &spec, &ec.category_specs())
                .await
        };
        match loaded {
            Ok(LoadOutcome::Loaded { .. }) => {
                tracing::info!(event = %ec.id, total = ec.effective_total(), "stock loaded from the configuration");
                guard.saw(&ec.id, spec.version);
                schedule_configured(inventory, &event, ec).await;
            }
            Ok(LoadOutcome::Present) => guard.saw(&ec.id, spec.version),
            Ok(LoadOutcome::Lost { last_version }) => {
                tracing::error!(
                    event = %ec.id,
                    last_version,
                    "event lost: the store had it (its load marker survives) and no longer has its stock; \
                     configured stock is not loaded again: it stays not ready (503 inventory_not_ready) until an operator loads it \
                     (PUT /_sluice/admin/events/{{event}}) or a ledger rebuilds it"
                );
            }
            Ok(LoadOutcome::Invalid { reason }) => {
                tracing::error!(event = %ec.id, reason, "configured stock refused by the store");
            }
            Err(e) => {
                tracing::warn!(event = %ec.id, error = %e, "cannot load configured stock yet");
                return false;
            }
        }
    }
    true
}

/// Schedules an event's configured waves, right after its configured
/// stock was loaded. Waves whose time has passed (by this gateway's
/// clock; the store checks its own too) are skipped with a warning: a
/// configuration written for a sale keeps starting after it. Anything
/// the store refuses is logged; the stock stays loaded.
async fn schedule_configured(inventory: &StockBackend, event: &EventId, ec: &EventConfig) {
    if ec.waves.is_empty() {
        return;
    }
    let now = crate::app::clock::now_ms();
    let (future, past): (Vec<_>, Vec<_>) = ec.wave_specs().into_iter().partition(|w| w.at_ms > now);
    for w in &past {
        tracing::warn!(event = %ec.id, at_ms = w.at_ms, qty = w.qty,
            "configured wave already past at start: skipped (never released)");
    }
    match inventory.schedule_waves(event, &future).await {
        Ok(sluice_reservation::ScheduleOutcome::Scheduled { waves }) => {
            tracing::info!(event = %ec.id, waves = waves.len(), "waves scheduled from the configuration");
        }
        Ok(refused) => {
            tracing::error!(event = %ec.id, outcome = ?refused, "configured waves refused by the store");
        }
        Err(e) => {
            tracing::error!(event = %ec.id, error = %e, "configured waves could not be scheduled");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn state_file_round_trips_and_refuses_garbage() {
        let dir = std::env::temp_dir().join(format!("sluice-state-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let mut g = LoadGuard::open(Some(path.clone()));
        assert!(g.may_load("demo"));
        g.saw("demo", 3);
        g.saw("demo", 2);
        assert!(!g.may_load("demo") && g.may_load("other"));
        let again = LoadGuard::open(Some(path.clone()));
        assert_eq!(again.seen("demo"), Some(3));
        assert!(!again.may_load("demo") && again.may_load("other"));
        // A file that says something else than expected: load nothing.
        for garbage in ["", "{", "[]", "{\"events\":{\"demo\":-1}}", "{\"x\":1}"] {
            std::fs::write(&path, garbage).unwrap();
            let g = LoadGuard::open(Some(path.clone()));
            assert!(!g.may_load("other"), "{garbage:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
