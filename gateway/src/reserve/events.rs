//! The events sold through the reservation module: which room's visitors
//! may buy each, a cached view of each event's stock (refreshed every
//! second, so "sold out" is known without a store call per poll), and the
//! reaper task that returns expired holds to stock.
//!
//! Configured stock is loaded once, at start, and only into a store that
//! does not know the event. A store that later loses it (Redis restarted
//! empty) answers 503 `inventory_not_ready` until an operator loads the
//! stock again: reloading a stale total behind their back could oversell.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use sluice_reservation::{
    EventId, EventState, Inventory, InventoryBackend, SetStockOutcome, StockSpec,
};

use crate::config::{Config, EventConfig};

/// How often expired holds are reaped and event views refreshed.
pub const REAP_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
struct Entry {
    room: String,
    state: Option<EventState>,
}

/// Known events (configured or created through the admin API).
#[derive(Clone, Default)]
pub struct Events {
    inner: Arc<RwLock<HashMap<String, Entry>>>,
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
                    },
                )
            })
            .collect();
        Events {
            inner: Arc::new(RwLock::new(map)),
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

    /// Records an event created or changed through the admin API.
    pub fn upsert(&self, event: &str, room: &str, state: Option<EventState>) {
        self.inner.write().insert(
            event.to_owned(),
            Entry {
                room: room.to_owned(),
                state,
            },
        );
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
    /// of them is loaded with nothing available. Stock held in carts may
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
                    if !(s.available == Some(0) && s.total > 0) {
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

    fn set_state(&self, event: &str, state: Option<EventState>) {
        let mut map = self.inner.write();
        if let Some(e) = map.get_mut(event) {
            if let Some(s) = &state {
                e.room = s.room.clone();
            }
            e.state = state;
        }
    }
}

/// Loads configured stock into a store that lacks it, then reaps expired
/// holds and refreshes the cached views every [`REAP_EVERY`]. Every gateway
/// runs it; reaping is idempotent and returns each hold's stock once.
pub async fn run_reaper(
    events: Events,
    inventory: InventoryBackend,
    configured: Vec<EventConfig>,
    load_stock: bool,
) {
    let mut loaded = false;
    let mut interval = tokio::time::interval(REAP_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    loop {
        interval.tick().await;
        if !loaded {
            loaded = load_configured(&inventory, &configured, load_stock).await;
        }
        // Every 10 s, adopt events another gateway created in the shared
        // store, so this gateway reaps them too.
        if ticks.is_multiple_of(10)
            && let Ok(ids) = inventory.events().await
        {
            for id in ids {
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
            match inventory.read(&event).await {
                Ok(state) => events.set_state(&id, state),
                Err(e) => tracing::debug!(event = %id, error = %e, "read failed"),
            }
        }
    }
}

/// Loads each configured event's stock into a store without the event,
/// when `load` (see `Config::load_stock`); otherwise says, once, that the
/// event stays not ready until an operator loads it.
async fn load_configured(
    inventory: &InventoryBackend,
    configured: &[EventConfig],
    load: bool,
) -> bool {
    for ec in configured {
        if ec.total == 0 {
            continue;
        }
        let Some(event) = EventId::parse(&ec.id) else {
            continue;
        };
        match inventory.read(&event).await {
            Ok(Some(_)) => {}
            Ok(None) if !load => {
                tracing::error!(
                    event = %ec.id,
                    "the store has no stock for this event: it stays not ready (503 inventory_not_ready) until it is loaded \
                     (PUT /_sluice/admin/events/{{event}}, `sluice admin event {} set`, or --load-stock on a store that never sold it); \
                     configured stock is not reloaded into a store that may have lost a sale",
                    ec.id
                );
            }
            Ok(None) => {
                let spec = StockSpec {
                    total: ec.total,
                    cart_limit: ec.cart_limit,
                    hold_ttl: ec.hold_ttl,
                    version: 1,
                    room: ec.room.clone(),
                };
                match inventory.set_stock(&event, &spec).await {
                    Ok(SetStockOutcome::Created { .. }) => {
                        tracing::info!(event = %ec.id, total = ec.total, "stock loaded from the configuration");
                    }
                    Ok(other) => {
                        tracing::info!(event = %ec.id, outcome = ?other, "configured stock not loaded")
                    }
                    Err(e) => {
                        tracing::warn!(event = %ec.id, error = %e, "cannot load configured stock yet");
                        return false;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(event = %ec.id, error = %e, "cannot read the inventory yet");
                return false;
            }
        }
    }
    true
}
