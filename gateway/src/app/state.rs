//! The state every handler shares ([`AppState`]): configuration, stores,
//! keys, rooms and the proxy, built once at start with its background
//! tasks. Below every handler (they take it), above the rooms, the proxy
//! and the stores (it holds them).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::header;
use subtle::ConstantTimeEq;

use crate::admin::lockout::AdminFailures;
use crate::app::clock::now_s;
use crate::app::problem::Problem;
use crate::app::telemetry::Telemetry;
use crate::config::Config;
use crate::edge::client_ip::ClientInfo;
use crate::gate::rooms::{Room, Rooms};
use crate::proxy::Proxy;
use sluice_admission::{
    AdmitClaims, Keyring, QueueBackend, QueueClaims, QueueStore, TokenError, VerifyCache,
};
use sluice_pow::Keyset;
use sluice_reservation::StockBackend;

/// An [`AppState`] that does not keep it alive.
#[derive(Clone)]
pub struct WeakState(std::sync::Weak<Inner>);

impl WeakState {
    /// The state, while something else keeps it.
    pub fn upgrade(&self) -> Option<AppState> {
        self.0.upgrade().map(|inner| AppState { inner })
    }
}

/// Everything a handler may need, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    proxy: Proxy,
    rooms: Arc<Rooms>,
    queue: QueueBackend,
    keyring: Keyring,
    verify_cache: VerifyCache,
    pow: Keyset,
    inventory: StockBackend,
    /// Invite codes of invite-only rooms.
    invites: sluice_admission::invites::InviteStore,
    /// The place bound to each account (enqueue tokens).
    accounts: sluice_admission::enqueue::AccountPlaces,
    /// The stock feeds' ingestion lane (`reserve::feeds`).
    feed_lane: crate::reserve::feeds::FeedLane,
    events: crate::reserve::events::Events,
    /// The ledger's lag, its database, rebuilds (`reserve::ledger`).
    ledger: Arc<crate::reserve::ledger::LedgerLink>,
    /// The per-visitor limit on hold requests
    /// (`limits.holds_per_visitor_per_min`).
    hold_limiter: Arc<crate::reserve::hold_limit::HoldLimiter>,
    telemetry: Telemetry,
    shutting_down: AtomicBool,
    admin_failures: AdminFailures,
    /// Permits of the requests that may touch the stores
    /// (`limits.max_store_requests`, see [`store_bound`]).
    store_slots: Arc<tokio::sync::Semaphore>,
    /// Permits of the admin API's calls (`limits.max_admin_requests`).
    admin_slots: Arc<tokio::sync::Semaphore>,
    /// Open server-sent event streams (`visitor::stream`).
    stream_slots: Arc<crate::visitor::stream::StreamSlots>,
    /// Verified crawlers (`gate::crawlers`).
    crawlers: Arc<crate::gate::crawlers::Crawlers>,
    background: Vec<tokio::task::AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for h in &self.background {
            h.abort();
        }
    }
}

impl AppState {
    /// Builds the state from a validated configuration whose `origin` is
    /// set: connects the stores (Redis when configured, else memory), loads
    /// or makes the keys, stores the static files, and starts the
    /// background tasks (the admission ticker and the reservation reaper).
    pub async fn new(config: Config) -> anyhow::Result<AppState> {
        let origin = config
            .origin
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no origin configured"))?;
        let telemetry = Telemetry::new();
        let proxy = Proxy::new(
            &origin,
            &config.proxy,
            &config.timeouts,
            config.limits.max_origin_requests,
            config.server.threads(),
            telemetry.clone(),
        )?;
        let rooms = Arc::new(Rooms::from_config(&config)?);
        rooms.warm_keys();
        // The page's files hashed and compressed now, not on a visitor's
        // request (once per process).
        crate::visitor::assets::warm();
        let stores = crate::app::stores::connect(&config).await?;
        if let sluice_reservation::InventoryBackend::Redis(r) = stores.inventory.inner()
            && let Some(stats) = r.hold_batch_stats()
        {
            telemetry.watch_hold_batches(stats);
        }
        let keyring = match &config.keys_dir {
            Some(dir) => Keyring::load_dir(dir)
                .map_err(|e| anyhow::anyhow!("keys in {}: {e}", dir.display()))?,
            None => {
                tracing::warn!(
                    "no --keys-dir: tokens are signed with an ephemeral key (lost at restart, not shared between gateways)"
                );
                Keyring::ephemeral()
            }
        };
        let pow = match &config.pow_secret {
            Some(s) => {
                let older: Vec<&[u8]> = config
                    .pow_previous_secrets
                    .iter()
                    .map(|p| p.as_bytes())
                    .collect();
                Keyset::from_secrets(s.as_bytes(), &older)
                    .map_err(|e| anyhow::anyhow!("pow secret: {e}"))?
            }
            None => Keyset::random(),
        };
        let events = crate::reserve::events::Events::from_config(&config);
        // This gateway's id for the steering leases of adaptive admission.
        let gateway_id = format!("gw-{:016x}", rand::random::<u64>());
        let ledger = crate::reserve::ledger::LedgerLink::new(&config);
        // The rooms' floors from the ledger before the ticker's first look:
        // a room lost with every gateway is then recreated above them.
        ledger.raise_floors(&rooms).await;
        let mut background = vec![
            tokio::spawn(crate::gate::rooms::run_ticker(
                rooms.clone(),
                stores.queue.clone(),
                telemetry.clone(),
                events.clone(),
            ))
            .abort_handle(),
            tokio::spawn(crate::reserve::events::run_reaper(
                events.clone(),
                stores.inventory.clone(),
                config.events.clone(),
                config.loads_stock(),
                config.reservation.state_file.clone(),
                ledger.clone(),
            ))
            .abort_handle(),
        ];
        for room in rooms.all() {
            background.push(
                tokio::spawn(crate::gate::adaptive::run_steering(
                    room.clone(),
                    stores.queue.clone(),
                    telemetry.clone(),
                    gateway_id.clone(),
                ))
                .abort_handle(),
            );
        }
        background.push(
            tokio::spawn(crate::reserve::ledger::run_lag_watch(
                ledger.clone(),
                events.clone(),
                telemetry.clone(),
            ))
            .abort_handle(),
        );
        background.push(
            tokio::spawn(crate::reserve::ledger::run_floors(
                ledger.clone(),
                rooms.clone(),
                events.clone(),
                telemetry.clone(),
            ))
            .abort_handle(),
        );
        if ledger.has_postgres() {
            let config = config.clone();
            background.push(
                tokio::spawn(async move { crate::reserve::ledger::run_consumer(&config).await })
                    .abort_handle(),
            );
        }
        background.push(
            tokio::spawn(crate::reserve::feeds::run_consumer(
                stores.feed_lane.clone(),
                stores.inventory.clone(),
                config.feeds.clone(),
                telemetry.clone(),
            ))
            .abort_handle(),
        );
        let hold_limiter = Arc::new(crate::reserve::hold_limit::HoldLimiter::new(
            config.limits.holds_per_visitor_per_min,
        ));
        background.push(
            tokio::spawn(crate::reserve::hold_limit::run_pruner(hold_limiter.clone()))
                .abort_handle(),
        );
        let store_slots = Arc::new(tokio::sync::Semaphore::new(
            config.limits.max_store_requests,
        ));
        let admin_slots = Arc::new(tokio::sync::Semaphore::new(
            config.limits.max_admin_requests,
        ));
        let verify_cache = VerifyCache::new(config.limits.token_cache_entries);
        let stream_slots = Arc::new(crate::visitor::stream::StreamSlots::new(
            config.limits.max_connections,
            config.limits.streams_per_prefix,
            config.limits.stream_heartbeat,
        ));
        let crawlers = crate::gate::crawlers::Crawlers::new(&config.crawlers)?;
        let state = AppState {
            inner: Arc::new(Inner {
                config,
                proxy,
                rooms,
                queue: stores.queue,
                keyring,
                verify_cache,
                pow,
                inventory: stores.inventory,
                invites: stores.invites,
                accounts: stores.accounts,
                feed_lane: stores.feed_lane,
                events,
                ledger,
                hold_limiter,
                telemetry,
                shutting_down: AtomicBool::new(false),
                admin_failures: AdminFailures::default(),
                store_slots,
                admin_slots,
                stream_slots,
                crawlers,
                background,
            }),
        };
        // Holds only a weak handle, and ends once the state is dropped.
        tokio::spawn(crate::reserve::ledger::run_auto_rebuild(state.downgrade()));
        Ok(state)
    }

    /// Permits of the store-bound requests (`limits.max_store_requests`).
    pub(crate) fn store_slots(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.inner.store_slots
    }

    /// Permits of the admin API's calls (`limits.max_admin_requests`).
    pub(crate) fn admin_slots(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.inner.admin_slots
    }

    /// The admin API's failed authentications per network.
    pub(crate) fn admin_failures(&self) -> &AdminFailures {
        &self.inner.admin_failures
    }

    /// Tokens in the verified-token cache.
    pub fn verify_cache_len(&self) -> usize {
        self.inner.verify_cache.len()
    }

    /// The configuration the gateway runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The verified crawlers.
    pub fn crawlers(&self) -> &crate::gate::crawlers::Crawlers {
        &self.inner.crawlers
    }

    /// The rooms.
    pub fn rooms(&self) -> &Rooms {
        &self.inner.rooms
    }

    /// A room by id, or 404 `room_not_found`.
    pub fn room(&self, id: &str) -> Result<&Arc<Room>, Problem> {
        self.inner.rooms.get(id).ok_or_else(Problem::room_not_found)
    }

    /// The proxy to the origin.
    pub fn proxy(&self) -> &Proxy {
        &self.inner.proxy
    }

    /// The admission store.
    pub fn queue(&self) -> &QueueBackend {
        &self.inner.queue
    }

    /// Takes one from client network `net`'s budget of `per_min` a minute
    /// (`kind` what it counts, `scope` e.g. a room) in the queue store, one
    /// budget for every gateway on it ([`sluice_admission::rate`], named by
    /// [`crate::edge::client_ip::network_bucket`]): `Some(ms)` to wait when
    /// it is spent; `None` when taken, or when the store does not answer
    /// (the caller's own per-gateway count then decides alone).
    pub async fn take_network_budget(
        &self,
        kind: &str,
        scope: &str,
        net: sluice_pow::NetPrefix,
        per_min: u32,
    ) -> Option<u64> {
        use sluice_admission::QueueStore as _;
        let key = crate::edge::client_ip::network_bucket(kind, scope, net);
        match self
            .queue()
            .take_rate(&key, f64::from(per_min) / 60.0, per_min)
            .await
        {
            Ok(wait) => wait,
            Err(e) => {
                tracing::debug!(kind, error = %e, "shared network budget unavailable: this gateway's own");
                None
            }
        }
    }

    /// The token keys.
    pub fn keyring(&self) -> &Keyring {
        &self.inner.keyring
    }

    /// The proof-of-work keys.
    pub fn pow(&self) -> &Keyset {
        &self.inner.pow
    }

    /// The invite codes of invite-only rooms.
    pub fn invites(&self) -> &sluice_admission::invites::InviteStore {
        &self.inner.invites
    }

    /// The place bound to each account (enqueue tokens).
    pub fn accounts(&self) -> &sluice_admission::enqueue::AccountPlaces {
        &self.inner.accounts
    }

    /// The reservation store.
    pub fn inventory(&self) -> &StockBackend {
        &self.inner.inventory
    }

    /// The stock feeds' ingestion lane.
    pub fn feed_lane(&self) -> &crate::reserve::feeds::FeedLane {
        &self.inner.feed_lane
    }

    /// This gateway's metrics.
    pub fn telemetry(&self) -> &Telemetry {
        &self.inner.telemetry
    }

    /// The ledger: its lag, its database, rebuilds.
    pub fn ledger(&self) -> &crate::reserve::ledger::LedgerLink {
        &self.inner.ledger
    }

    /// A handle that does not keep the state alive (for tasks the state's
    /// own drop must be able to stop).
    pub fn downgrade(&self) -> WeakState {
        WeakState(Arc::downgrade(&self.inner))
    }

    /// The events and their cached state.
    pub fn events(&self) -> &crate::reserve::events::Events {
        &self.inner.events
    }

    /// The per-visitor limit on hold requests.
    pub fn hold_limiter(&self) -> &crate::reserve::hold_limit::HoldLimiter {
        &self.inner.hold_limiter
    }

    /// Verifies a queue token of `room` (through the verified-token cache).
    pub fn verify_queue(&self, token: &str, room: &str) -> Result<QueueClaims, TokenError> {
        self.inner
            .verify_cache
            .verify_queue(&self.inner.keyring, token, room, now_s())
    }

    /// Verifies an admission token of `room` (through the cache).
    pub fn verify_admit(&self, token: &str, room: &str) -> Result<AdmitClaims, TokenError> {
        self.inner
            .verify_cache
            .verify_admit(&self.inner.keyring, token, room, now_s())
    }

    /// Whether every event sold through `room` has nothing available (the
    /// room then stops admitting; stock held in carts may still come back).
    /// Either this gateway's view of the stock says so, or another gateway
    /// already set the room's `sold_out` flag in the store.
    pub fn sold_out(&self, room: &str) -> bool {
        self.inner.events.room_sold_out(room)
            || self
                .inner
                .rooms
                .get(room)
                .is_some_and(|r| r.settings().sold_out)
    }

    /// Signs an admission token for visitor `sub`. Its session is the
    /// place's own (`epoch.seq`, [`sluice_admission::session_of`]): however
    /// often a place is claimed, its tokens name one session. A token with
    /// no place (failing open) has a session of its own.
    pub fn issue_admission(
        &self,
        room: &Room,
        sub: &str,
        seq: Option<u64>,
        epoch: u64,
        client: &ClientInfo,
    ) -> Result<(String, AdmitClaims), Problem> {
        let settings = room.settings();
        let now = now_s();
        let mut claims = AdmitClaims::new(room.id(), sub, epoch, now, settings.session_ttl);
        claims.seq = seq;
        claims.sid = Some(match seq {
            Some(seq) => sluice_admission::session_of(epoch, seq),
            None => claims.jti.clone(),
        });
        if let Some(cap) = room.config.session_hard_cap {
            claims.hcap = Some(now + cap.as_secs());
        }
        if room.config.bind_ip_prefix {
            claims.ipp = Some(sluice_pow::network_prefix(client.ip).to_string());
        }
        let token = self
            .inner
            .keyring
            .sign_admit(&claims)
            .map_err(|e| Problem::internal().log_cause(&e))?;
        Ok((token, claims))
    }

    /// Starts session `sid` of a place admitted on the spot (counted
    /// against `max_active`). A session the store did not record only
    /// loosens the cap until the store is back: the token verifies locally.
    pub async fn start_session(&self, room: &Room, sid: &str) {
        let ttl = room.settings().session_ttl;
        if let Err(e) = self.inner.queue.session_start(room.id(), sid, ttl).await {
            tracing::warn!(room = room.id(), error = %e, "session not recorded");
        }
    }

    /// Marks the gateway as draining: readiness fails from now on.
    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        // Streams end with a short `retry`: their clients reconnect to
        // another gateway (`visitor::stream`).
        self.inner.stream_slots.shut_down();
    }

    /// The open server-sent event streams and their bounds.
    pub fn stream_slots(&self) -> &Arc<crate::visitor::stream::StreamSlots> {
        &self.inner.stream_slots
    }

    /// Whether the gateway is draining.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// Checks the admin bearer token in constant time. No token configured:
    /// nobody is admin, and the answer says so.
    pub fn check_admin(&self, headers: &http::HeaderMap) -> Result<(), Problem> {
        let Some(expected) = self.inner.config.admin_token.as_deref() else {
            return Err(Problem::no_admin_token());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Compare digests so the comparison time does not depend on the
        // length of the common prefix or of the given token.
        use sha2::{Digest, Sha256};
        let a = Sha256::digest(given.as_bytes());
        let b = Sha256::digest(expected.as_bytes());
        if bool::from(a.as_slice().ct_eq(b.as_slice())) {
            Ok(())
        } else {
            Err(Problem::unauthorized())
        }
    }
}
