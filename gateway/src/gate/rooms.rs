//! The waiting rooms of this gateway: which requests each guards, and a
//! fresh snapshot of each room's queue.
//!
//! A ticker per gateway calls the store's `advance` for every room every
//! [`TICK`] and keeps the result as the room's snapshot, so status polls and
//! the gate answer from memory, never with a store round trip per poll. Many
//! gateways ticking at once split the elapsed time between them (the store
//! guarantees it), so the rate is the same with one gateway or ten.
//!
//! The ticker also watches for a store that lost its state (Redis restarted
//! empty): when the store's tail or frontier falls below the highest values
//! this gateway has seen, it calls `recover` with them, so no seq is
//! reissued and no position moves backwards.
//!
//! And it keeps each room's `sold_out` setting in step with its events'
//! stock: while every event the room sells has nothing available, the
//! store halts the room's bucket as a pause does, on every gateway.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_admission::{
    AdmissionError, Floors, JoinOutcome, PlaceMap, PrequeueDraw, QueueBackend, QueueStore,
    RateMeter, RoomPatch, RoomSettings, Snapshot,
};
use sluice_pow::{DifficultyPolicy, NetPrefix};

use crate::app::problem::Problem;
use crate::app::telemetry::Telemetry;
use crate::config::{Config, FailurePolicy, RoomConfig};
use crate::edge::client_ip::canonical_ip;
use crate::gate::fetched::{Fetched, Kind, Policy};
use sluice_admission::enqueue::JwksKeys;

/// How often each gateway advances every room's bucket and refreshes its
/// snapshot.
pub const TICK: Duration = Duration::from_millis(100);

/// How often the ticker forgets rate-limit state of networks whose budget
/// has refilled ([`Room::prune_rate_limits`]).
pub const LIMITER_PRUNE_EVERY: Duration = Duration::from_secs(10);

/// How many place maps of older draws a `random` room keeps, and how many
/// tickets they may hold together (4 bytes each): beyond either, the
/// oldest go, and a seq of theirs is placed from the store's record again.
const OLD_MAPS: usize = 64;
const OLD_MAP_TICKETS: u64 = 16 << 20;

/// Where a queue token's seq stands in its room's line ([`Room::placement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Its place (the frontier position that admits it).
    At(u64),
    /// Not known yet: the pre-queue is open, or this gateway is building
    /// the draw's place map.
    Pending,
    /// A `random` room's seq that joined after the current draw was made:
    /// its place comes with the next draw.
    NextDraw,
}

/// The position shown to a `random` room's visitor of `seq` waiting for
/// the next draw: those left in the current draw, plus the middle of
/// everyone waiting for the next (the draw puts each of them anywhere among
/// them alike, so that is the expected place).
pub fn next_draw_position(snap: &Snapshot, seq: u64) -> u64 {
    let end = snap
        .prequeue_draw
        .map_or(snap.frontier, |d| d.end().max(snap.frontier));
    let left = end - snap.frontier;
    let next = snap.tail.max(seq).saturating_sub(end);
    (left + next.div_ceil(2)).max(1)
}

/// One room: its configuration and live state in this gateway.
pub struct Room {
    /// As configured.
    pub config: RoomConfig,
    snapshot: ArcSwap<Snapshot>,
    settings: ArcSwap<RoomSettings>,
    /// The store answered the last tick.
    store_ok: AtomicBool,
    /// The store answered a tick since this gateway started (readiness:
    /// until then the room has no snapshot of its own to answer from).
    store_seen: AtomicBool,
    /// Highest tail / frontier seen from the store (for recovery).
    max_tail: AtomicU64,
    max_frontier: AtomicU64,
    /// The highest epoch of the room the ledger recorded (0: none).
    ledger_epoch: AtomicU64,
    joins: Mutex<RateMeter>,
    /// What this gateway's join batchers of the room sent (one batcher per
    /// I/O thread: [`join_once`]).
    pub join_batches: Arc<sluice_admission::batch::BatchStats>,
    /// Held strongly by the room alone: the I/O threads' batchers of the
    /// room are keyed by it and dropped once it is gone ([`join_batcher`]).
    batchers_key: Arc<()>,
    admits: Mutex<RateMeter>,
    /// Proof-of-work difficulty for this room.
    pub difficulty: DifficultyPolicy,
    join_limit_per_min: AtomicU32,
    limiter: ArcSwap<Option<DefaultKeyedRateLimiter<NetPrefix>>>,
    /// Invite codes tried per network (`invite_attempts_per_prefix_per_min`).
    invite_limiter: Option<DefaultKeyedRateLimiter<NetPrefix>>,
    /// The keys of the origin's enqueue tokens (`[rooms.enqueue]`), if any.
    pub enqueue: Option<sluice_admission::enqueue::EnqueueVerifier>,
    /// The origin's JWKS fetched from `[rooms.enqueue] jwks_url`, if set.
    pub enqueue_jwks: Option<Arc<Fetched<JwksKeys>>>,
    /// The settings this gateway creates the room with in an empty store.
    initial: RoomSettings,
    /// seq → place of the latest draw, once built.
    place_map: ArcSwap<Option<Arc<PlaceMap>>>,
    building_map: AtomicBool,
    /// A `random` room's maps of older draws, by their `from` (see
    /// [`OLD_MAPS`]).
    old_maps: Mutex<BTreeMap<u64, Arc<PlaceMap>>>,
    /// The last draw seen from the store, written back if the store loses it.
    seen_draw: ArcSwap<Option<PrequeueDraw>>,
    /// The room's waiting pages as rendered, with their compressed forms.
    pub page_cache: crate::visitor::page::PageCache,
    /// The origin's latency and errors on this room's traffic since the
    /// last adaptive decision.
    window: crate::gate::window::Window,
    /// This gateway holds the room's steering lease.
    steering: AtomicBool,
    /// Sessions ended by a revoke (through any gateway): session id → when
    /// it ended (store clock, ms). Learnt from the store within a tick
    /// ([`QueueStore::ended_since`]), kept for the session's idle lifetime
    /// (no admission token of it outlives that), so the gate refuses their
    /// tokens with a lookup in memory, never a store call per request.
    ended: Mutex<HashMap<String, u64>>,
    /// The most entries `ended` holds (`limits.ended_sessions_per_room`).
    ended_cap: usize,
    /// Until when (store clock, ms) a revoke this gateway could not keep
    /// (the set was full) may still have a valid token: till then the gate
    /// asks the store about each admitted request's session
    /// ([`Room::ended_overflowing`]). 0: never overflowed.
    ended_overflow_until: AtomicU64,
    /// How far the ended set has been read: the store's `ended_total` and
    /// the latest end time seen.
    ended_read: Mutex<(u64, u64)>,
    /// Passthroughs this gateway may still try before the next snapshot:
    /// the credit the snapshot showed, so that a crowd of cookie-less
    /// requests costs at most that many store calls a tick (the store
    /// decides each one atomically).
    passthrough_budget: std::sync::atomic::AtomicI64,
    /// Status polls per queue token (its epoch and seq).
    poll_limiter: Option<DefaultKeyedRateLimiter<(u64, u64)>>,
    /// The room's open status streams, by seq (`visitor::stream`).
    pub streams: crate::visitor::stream::StreamHub,
    /// The last settings error read from the store, so it is logged once.
    bad_settings: Mutex<Option<String>>,
    /// The store's settings version last read (good or refused): settings
    /// are read again only when it moves, so a refused version is counted
    /// once, not at every tick.
    read_settings_version: AtomicU64,
}

impl Room {
    fn new(
        config: RoomConfig,
        pow_secret: Option<&str>,
        polls_per_token_per_min: u32,
        ended_cap: usize,
    ) -> anyhow::Result<Room> {
        let mut settings = config.settings();
        let mut seeded_at = None;
        if let Some(t) = &config.opens_at {
            let ms = crate::gate::schedule::parse_rfc3339_ms(t)
                .map_err(|e| anyhow::anyhow!("room {}: opens_at {e}", config.id))?;
            settings.opens_at_ms = Some(ms);
            seeded_at = Some(ms);
        }
        if config.method == sluice_admission::QueueMethod::Random {
            seeded_at = seeded_at.or(Some(0));
        }
        if let Some(ms) = seeded_at {
            settings.prequeue_seed = Some(crate::gate::schedule::config_seed(
                pow_secret, &config.id, ms,
            ));
        }
        // Checked by `Config::validate` first (the same settings, the
        // policy's own check): with a validated config this cannot fail.
        let difficulty = DifficultyPolicy::new(config.difficulty())
            .map_err(|e| anyhow::anyhow!("room {}: difficulty: {e}", config.id))?;
        let limit = config.join_limit_per_prefix_per_min;
        let enqueue = config
            .enqueue
            .verifier()
            .map_err(|e| anyhow::anyhow!("room {}: enqueue: {e}", config.id))?;
        let enqueue_jwks = enqueue_jwks(&config)
            .map_err(|e| anyhow::anyhow!("room {}: enqueue.jwks_url: {e}", config.id))?;
        let room = Room {
            enqueue,
            enqueue_jwks,
            snapshot: ArcSwap::from_pointee(empty_snapshot(&config.id, &settings)),
            initial: settings.clone(),
            place_map: ArcSwap::from_pointee(None),
            building_map: AtomicBool::new(false),
            old_maps: Mutex::new(BTreeMap::new()),
            seen_draw: ArcSwap::from_pointee(None),
            page_cache: Default::default(),
            settings: ArcSwap::from_pointee(settings),
            store_ok: AtomicBool::new(false),
            store_seen: AtomicBool::new(false),
            max_tail: AtomicU64::new(0),
            max_frontier: AtomicU64::new(0),
            ledger_epoch: AtomicU64::new(0),
            joins: Mutex::new(RateMeter::new(5_000)),
            join_batches: Arc::default(),
            batchers_key: Arc::new(()),
            admits: Mutex::new(RateMeter::new(5_000)),
            difficulty,
            join_limit_per_min: AtomicU32::new(limit),
            limiter: ArcSwap::from_pointee(limiter(limit)),
            invite_limiter: limiter(config.invite_attempts_per_prefix_per_min),
            window: crate::gate::window::Window::default(),
            steering: AtomicBool::new(false),
            ended: Mutex::new(HashMap::new()),
            ended_cap,
            ended_overflow_until: AtomicU64::new(0),
            ended_read: Mutex::new((0, 0)),
            passthrough_budget: std::sync::atomic::AtomicI64::new(0),
            poll_limiter: std::num::NonZeroU32::new(polls_per_token_per_min).map(|n| {
                // a burst of a quarter minute's worth: two tabs, a reload
                let burst = std::num::NonZeroU32::new((n.get() / 4).max(4)).unwrap_or(n);
                RateLimiter::keyed(Quota::per_minute(n).allow_burst(burst))
            }),
            bad_settings: Mutex::new(None),
            read_settings_version: AtomicU64::new(0),
            streams: Default::default(),
            config,
        };
        Ok(room)
    }

    /// The room id.
    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// The latest snapshot (at most one tick old while the store answers).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The room's settings as last read from the store.
    pub fn settings(&self) -> Arc<RoomSettings> {
        self.settings.load_full()
    }

    /// How the room orders its line (from the store's settings).
    pub fn method(&self) -> sluice_admission::QueueMethod {
        self.settings.load().method
    }

    /// For a `reject` room that looks full in the latest snapshot (no
    /// whole admission in the bucket by now, someone waiting, or the active
    /// cap reached): the seconds until it may take one. `None` when the
    /// room is not `reject` or may have room: the join decides atomically,
    /// this only spares a visitor the proof of work a full room would
    /// refuse anyway.
    pub fn looks_full(&self, now_ms: u64) -> Option<u64> {
        if self.method() != sluice_admission::QueueMethod::Reject {
            return None;
        }
        let snap = self.snapshot();
        let elapsed = now_ms.saturating_sub(snap.store_now_ms) as f64 / 1000.0;
        let halted = snap.paused || snap.closed || snap.prequeue_open;
        let credit = if halted {
            snap.credit
        } else {
            (snap.credit + snap.rate_per_sec * elapsed).min(snap.burst.max(1.0))
        };
        let capped = snap
            .max_active
            .is_some_and(|m| snap.active_sessions + snap.pending_claims >= m);
        if credit >= 1.0 && !capped && snap.queue_length() == 0 && !halted {
            return None;
        }
        Some(full_retry_after(snap.rate_per_sec, credit))
    }

    /// Replaces the cached settings with ones just written to the store.
    pub fn set_settings(&self, settings: RoomSettings) {
        self.settings.store(Arc::new(settings));
    }

    /// The room's upstream window (adaptive admission).
    pub fn window(&self) -> &crate::gate::window::Window {
        &self.window
    }

    /// Records one upstream answer of this room's traffic: its latency and
    /// whether it failed (a 5xx, including the gateway's own 502/504).
    pub fn observe_upstream(&self, latency: Duration, status: http::StatusCode) {
        self.window.record(latency, status.is_server_error());
    }

    /// Whether this gateway steers the room's rate now.
    pub fn steering(&self) -> bool {
        self.steering.load(Ordering::Relaxed)
    }

    pub(crate) fn set_steering(&self, on: bool) {
        self.steering.store(on, Ordering::Relaxed);
    }

    /// Whether the store answered the last tick.
    pub fn store_ok(&self) -> bool {
        self.store_ok.load(Ordering::Relaxed)
    }

    /// Whether the store answered any tick since this gateway started.
    pub fn store_seen(&self) -> bool {
        self.store_seen.load(Ordering::Relaxed)
    }

    /// Measured joins per second.
    pub fn joins_per_sec(&self) -> f64 {
        self.joins.lock().rate().unwrap_or(0.0)
    }

    /// Measured admissions per second.
    pub fn admits_per_sec(&self) -> f64 {
        self.admits.lock().rate().unwrap_or(0.0)
    }

    /// Takes one token of the per-prefix limit on challenges and joins;
    /// `Err(seconds)` to wait when over it.
    pub fn check_rate_limit(&self, prefix: NetPrefix) -> Result<(), u64> {
        let limiter = self.limiter.load();
        check_keyed(limiter.as_ref().as_ref(), prefix)
    }

    /// Takes one invite attempt of the network `prefix`, or the seconds to
    /// wait.
    pub fn check_invite_attempt(&self, prefix: NetPrefix) -> Result<(), u64> {
        check_keyed(self.invite_limiter.as_ref(), prefix)
    }

    /// Forgets the rate-limit state of networks whose budget is full again,
    /// so a spray of addresses (every /56 of an IPv6 block) cannot grow the
    /// limiter without bound. Called by the ticker every few seconds.
    pub fn prune_rate_limits(&self) {
        if let Some(l) = self.limiter.load().as_ref() {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.poll_limiter {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.invite_limiter {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    /// Takes one status poll of the queue token (`epoch`, `seq`), or
    /// `Err(seconds)` to wait.
    pub fn check_poll_limit(&self, epoch: u64, seq: u64) -> Result<(), u64> {
        let Some(l) = &self.poll_limiter else {
            return Ok(());
        };
        l.check_key(&(epoch, seq)).map_err(|not_until| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            wait.as_secs().max(1)
        })
    }

    /// Whether the session `sid` ended (was revoked) on any gateway, as far
    /// as this one has learnt (within a tick of the revoke).
    pub fn is_ended(&self, sid: &str) -> bool {
        self.ended.lock().contains_key(sid)
    }

    /// Notes a session this gateway ended itself (before the store's ended
    /// set comes back with it).
    pub fn note_ended(&self, sid: &str) {
        let at = self.snapshot().store_now_ms;
        let mut ended = self.ended.lock();
        self.remember_ended(&mut ended, sid, at);
    }

    /// Puts `sid` (ended at `at`) in the ended set; a full set keeps it out
    /// and marks the room overflowing for as long as a token of it may be
    /// valid (the session ttl and the skew after `at`).
    fn remember_ended(&self, ended: &mut HashMap<String, u64>, sid: &str, at: u64) {
        if ended.len() < self.ended_cap || ended.contains_key(sid) {
            ended.insert(sid.to_owned(), at);
            return;
        }
        let until = at
            .saturating_add(self.settings().session_ttl.as_millis() as u64)
            .saturating_add(sluice_admission::room::ENDED_SKEW_MS);
        let before = self
            .ended_overflow_until
            .fetch_max(until, Ordering::Relaxed);
        if before <= self.snapshot().store_now_ms {
            tracing::warn!(
                room = self.id(),
                cap = self.ended_cap,
                "ended sessions: more revoked than limits.ended_sessions_per_room; admitted requests are checked with the store until those revokes are stale"
            );
        }
    }

    /// Whether a revoke this gateway could not keep in memory may still
    /// have a valid token: the gate then asks the store about admitted
    /// requests' sessions ([`crate::gate::session::revoked`]).
    pub fn ended_overflowing(&self) -> bool {
        self.ended_overflow_until.load(Ordering::Relaxed) > self.snapshot().store_now_ms
    }

    /// Sessions this gateway knows as ended.
    pub fn ended_count(&self) -> usize {
        self.ended.lock().len()
    }

    /// Learns the sessions ended since the last read, when the snapshot's
    /// count moved, and forgets those whose tokens can no longer be valid.
    async fn sync_ended(
        &self,
        store: &QueueBackend,
        snap: &Snapshot,
    ) -> Result<(), AdmissionError> {
        const PAGE: usize = 10_000;
        let (read_total, cursor) = *self.ended_read.lock();
        let keep =
            self.settings().session_ttl.as_millis() as u64 + sluice_admission::room::ENDED_SKEW_MS;
        let now = snap.store_now_ms;
        if snap.ended_total != read_total {
            // a second of overlap: ends in the same millisecond as the last
            // one read are read again (a set: no harm)
            let since = cursor.saturating_sub(1_000);
            let page = store.ended_since(self.id(), since, PAGE).await?;
            let mut latest = cursor;
            {
                let mut ended = self.ended.lock();
                for (sid, at) in &page {
                    latest = latest.max(*at);
                    self.remember_ended(&mut ended, sid, *at);
                }
            }
            // a full page: read on from its end at the next tick
            let total = if page.len() >= PAGE {
                read_total
            } else {
                snap.ended_total
            };
            *self.ended_read.lock() = (total, latest);
        }
        self.ended
            .lock()
            .retain(|_, at| at.saturating_add(keep) > now);
        Ok(())
    }

    /// Takes one passthrough attempt of this tick's budget.
    pub fn take_passthrough(&self) -> bool {
        self.passthrough_budget.fetch_sub(1, Ordering::AcqRel) > 0
    }

    /// Number of networks the rate limiter currently remembers.
    pub fn rate_limited_networks(&self) -> usize {
        self.limiter.load().as_ref().as_ref().map_or(0, |l| l.len())
    }

    /// Where `seq` stands: its seq is its place, unless it holds a ticket
    /// of a draw (the pre-queue's, or one of a `random` room's rolling
    /// draws), whose place map says. A `random` room's seq after the
    /// current draw waits for the next one. A seq of an older draw is
    /// placed from the maps this gateway kept, else from the store's record
    /// of its draw ([`QueueStore::draw_of`], one call, the map built then):
    /// a gateway started after the draw places it as the others do.
    pub async fn placement(
        &self,
        store: &QueueBackend,
        snap: &Snapshot,
        seq: u64,
    ) -> Result<Placement, AdmissionError> {
        if snap.prequeue_open && seq > snap.frontier {
            return Ok(Placement::Pending);
        }
        let random = self.settings().method == sluice_admission::QueueMethod::Random;
        // read on every status poll: a lock-free load
        let draw = snap.prequeue_draw.or(**self.seen_draw.load());
        let after = |end: u64| {
            if random && seq > end && seq > snap.frontier {
                Placement::NextDraw
            } else {
                Placement::At(seq)
            }
        };
        let Some(d) = draw else {
            return Ok(after(0));
        };
        if d.contains(seq) {
            return Ok(match self.place_map.load().as_ref() {
                Some(m) if m.draw() == d => Placement::At(m.place(seq)),
                _ => Placement::Pending,
            });
        }
        if seq > d.from || d.k == 0 {
            // after the draw, or before a pre-queue's (its only draw)
            return Ok(after(d.end()));
        }
        if let Some(p) = self.old_place(seq) {
            return Ok(Placement::At(p));
        }
        let Some(old) = store.draw_of(self.id(), seq).await? else {
            return Ok(Placement::At(seq));
        };
        let Some(seed) = self.seed_of(old) else {
            return Ok(Placement::At(seq));
        };
        let map = tokio::task::spawn_blocking(move || PlaceMap::new(&seed, old))
            .await
            .map_err(|e| AdmissionError::Protocol(format!("place map: {e}")))?;
        let place = map.place(seq);
        tracing::info!(
            room = self.id(),
            draw = old.k,
            tickets = old.n,
            "place map of an older draw built from the store's record"
        );
        self.keep_old_map(Arc::new(map));
        Ok(Placement::At(place))
    }

    /// The place of `seq` from a kept map of an older draw.
    fn old_place(&self, seq: u64) -> Option<u64> {
        let maps = self.old_maps.lock();
        let (_, m) = maps.range(..seq).next_back()?;
        m.draw().contains(seq).then(|| m.place(seq))
    }

    /// Keeps the map of an older draw, the oldest going beyond [`OLD_MAPS`]
    /// maps or [`OLD_MAP_TICKETS`] tickets.
    fn keep_old_map(&self, map: Arc<PlaceMap>) {
        let mut maps = self.old_maps.lock();
        maps.insert(map.draw().from, map);
        while maps.len() > 1
            && (maps.len() > OLD_MAPS
                || maps.values().map(|m| m.draw().n).sum::<u64>() > OLD_MAP_TICKETS)
        {
            maps.pop_first();
        }
    }

    /// The seed draw `d` was ordered with: the room's seed for the
    /// pre-queue draw (index 0), else that draw's own
    /// (`sluice_admission::prequeue::draw_seed`).
    fn seed_of(&self, d: PrequeueDraw) -> Option<Vec<u8>> {
        let seed = self
            .settings()
            .prequeue_seed
            .as_deref()
            .and_then(sluice_admission::prequeue::from_hex)?;
        Some(match d.k {
            0 => seed,
            k => sluice_admission::prequeue::draw_seed(&seed, k).to_vec(),
        })
    }

    /// The pre-queue fields of the public and admin room state: before the
    /// opening `opens_at`, `prequeue_commitment` and `prequeue_tickets` (so
    /// far); after it also `prequeue_seed` and `prequeue_first_seq`, and
    /// `prequeue_tickets` is the draw's count. Nothing for a room never
    /// scheduled. A `random` room has the draw fields instead
    /// ([`Room::draw_fields`]).
    pub fn prequeue_fields(&self, snap: &Snapshot) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        let settings = self.settings();
        let Some(seed) = settings.prequeue_seed.as_deref() else {
            return m;
        };
        if settings.method == sluice_admission::QueueMethod::Random {
            return self.draw_fields(snap, seed);
        }
        if let Some(t) = snap.opens_at_ms {
            m.insert(
                "opens_at".into(),
                json!(crate::gate::schedule::format_rfc3339(t)),
            );
        }
        if snap.prequeue_open {
            m.insert("prequeue_open".into(), json!(true));
            m.insert(
                "prequeue_commitment".into(),
                json!(crate::gate::schedule::commitment_of(seed)),
            );
            m.insert("prequeue_tickets".into(), json!(snap.queue_length()));
        } else if let Some(d) = snap.prequeue_draw {
            m.insert("prequeue_open".into(), json!(false));
            m.insert(
                "prequeue_commitment".into(),
                json!(crate::gate::schedule::commitment_of(seed)),
            );
            m.insert("prequeue_seed".into(), json!(seed));
            m.insert("prequeue_tickets".into(), json!(d.n));
            m.insert("prequeue_first_seq".into(), json!(d.from + 1));
        }
        m
    }

    /// A `random` room's draw fields: `prequeue_commitment` (the hex SHA-256
    /// of the room's seed) always, and `opens_at` and `prequeue_open` when
    /// scheduled; the current draw as `draw_index`, `draw_first_seq` and
    /// `draw_tickets`; the seed itself, `prequeue_seed`, only once the room
    /// is closed: every draw's seed derives from it, so revealing it sooner
    /// would tell the order of draws not yet made.
    fn draw_fields(&self, snap: &Snapshot, seed: &str) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert(
            "prequeue_commitment".into(),
            json!(crate::gate::schedule::commitment_of(seed)),
        );
        if let Some(t) = snap.opens_at_ms {
            m.insert(
                "opens_at".into(),
                json!(crate::gate::schedule::format_rfc3339(t)),
            );
            m.insert("prequeue_open".into(), json!(snap.prequeue_open));
            if snap.prequeue_open {
                m.insert("prequeue_tickets".into(), json!(snap.queue_length()));
            }
        }
        if let Some(d) = snap.prequeue_draw.filter(|d| d.n > 0) {
            m.insert("draw_index".into(), json!(d.k));
            m.insert("draw_first_seq".into(), json!(d.from + 1));
            m.insert("draw_tickets".into(), json!(d.n));
        }
        if snap.closed {
            m.insert("prequeue_seed".into(), json!(seed));
        }
        m
    }

    /// Recovers the room in a store that lost it ([`QueueStore::recover`]
    /// with [`Room::settings_for_store`]); a `random` room's store then
    /// takes back the draws this gateway kept the maps of
    /// ([`QueueStore::keep_draws`]), so a gateway that did not see them
    /// still places their seqs. That second step is best effort: a store
    /// that fails it has its state back, and is told again at the next
    /// loss.
    async fn recover(
        &self,
        store: &QueueBackend,
        floors: Floors,
    ) -> Result<Snapshot, AdmissionError> {
        let snap = store
            .recover(self.id(), &self.settings_for_store(), floors)
            .await?;
        if self.settings().method == sluice_admission::QueueMethod::Random {
            let mut draws: Vec<PrequeueDraw> =
                self.old_maps.lock().values().map(|m| m.draw()).collect();
            draws.extend(self.place_map.load().as_ref().as_ref().map(|m| m.draw()));
            if !draws.is_empty()
                && let Err(e) = store.keep_draws(self.id(), &draws).await
            {
                tracing::warn!(room = self.id(), error = %e, "the draws this gateway kept were not handed back");
            }
        }
        Ok(snap)
    }

    /// The settings to write to a store that lost them: this gateway's, with
    /// the draw it saw (a store still in its pre-queue adopts it).
    ///
    /// The settings read back from the store may carry the hint of an
    /// earlier loss: a `random` room's later draw (a higher index) wins.
    fn settings_for_store(&self) -> RoomSettings {
        let mut s = (*self.settings()).clone();
        if s.prequeue_seed.is_some() {
            let seen = **self.seen_draw.load();
            s.prequeue_draw = match (s.prequeue_draw, seen) {
                (Some(a), Some(b)) if b.k > a.k => Some(b),
                (a, b) => a.or(b),
            };
        }
        s
    }

    /// Builds the place map of the latest draw off the async threads (a
    /// shuffle of N tickets: about 60 ns each), once per draw. The map it
    /// replaces is kept when it was a rolling draw's (its seqs may still
    /// claim their places).
    fn ensure_place_map(self: &Arc<Self>, snap: &Snapshot) {
        let Some(draw) = snap.prequeue_draw.filter(|d| d.n > 0) else {
            return;
        };
        if self
            .place_map
            .load()
            .as_ref()
            .as_ref()
            .is_some_and(|m| m.draw() == draw)
        {
            return;
        }
        let Some(seed) = self.seed_of(draw) else {
            return;
        };
        if self.building_map.swap(true, Ordering::AcqRel) {
            return;
        }
        let room = self.clone();
        tokio::task::spawn_blocking(move || {
            let map = PlaceMap::new(&seed, draw);
            tracing::debug!(
                room = room.id(),
                draw = draw.k,
                tickets = draw.n,
                "draw: place map built"
            );
            let old = room.place_map.swap(Arc::new(Some(Arc::new(map))));
            if let Some(old) = old.as_ref()
                && (draw.k > 0 || old.draw().k > 0)
            {
                room.keep_old_map(old.clone());
            }
            room.building_map.store(false, Ordering::Release);
        });
    }

    /// Records a snapshot fresh from the store.
    pub fn record(&self, snap: Snapshot) {
        // A new pre-queue forgets the last draw (all its tickets were
        // admitted: a new opening is refused before), so a store lost now
        // is not handed that draw back as this one's.
        let seen = if snap.prequeue_open {
            None
        } else {
            snap.prequeue_draw.or(**self.seen_draw.load())
        };
        if **self.seen_draw.load() != seen {
            self.seen_draw.store(Arc::new(seen));
        }
        self.max_tail.fetch_max(snap.tail, Ordering::Relaxed);
        self.max_frontier
            .fetch_max(snap.frontier, Ordering::Relaxed);
        self.joins
            .lock()
            .record(snap.store_now_ms, snap.joins_total);
        self.admits
            .lock()
            .record(snap.store_now_ms, snap.admitted_total);
        let budget = if snap.queue_length() == 0 && !snap.paused && !snap.closed {
            snap.credit.floor().max(0.0) as i64
        } else {
            0
        };
        self.passthrough_budget.store(budget, Ordering::Release);
        self.snapshot.store(Arc::new(snap));
    }

    /// The floors to recover a lost state with: the highest tail and
    /// frontier seen (by this gateway, or by the ledger), in the highest
    /// epoch seen.
    fn floors(&self) -> Floors {
        Floors {
            tail: self.max_tail.load(Ordering::Relaxed),
            frontier: self.max_frontier.load(Ordering::Relaxed),
            epoch: self
                .snapshot()
                .epoch
                .max(self.ledger_epoch.load(Ordering::Relaxed)),
        }
    }

    /// Raises the floors to a durable record's (the ledger's highest tail,
    /// frontier and epoch of this room): a store that lost the room while
    /// every gateway restarted is then recreated above them, never handing
    /// out a seq the ledger saw handed out. Only ever raises.
    pub fn raise_floors(&self, tail: u64, frontier: u64, epoch: u64) {
        self.max_tail.fetch_max(tail, Ordering::Relaxed);
        self.max_frontier.fetch_max(frontier, Ordering::Relaxed);
        self.ledger_epoch.fetch_max(epoch, Ordering::Relaxed);
    }

    /// Applies settings read from the store (or just written): the cached
    /// copy, and what this gateway keeps of them itself (difficulty bounds,
    /// the per-network limit). Settings the gateway cannot apply (a
    /// difficulty outside the work cap) are refused as a whole: the last
    /// good copy stays.
    fn adopt(&self, s: RoomSettings) -> Result<(), String> {
        let floor = s
            .difficulty_floor_bits
            .unwrap_or(self.config.difficulty_floor_bits);
        let ceiling = s
            .difficulty_ceiling_bits
            .unwrap_or(self.config.difficulty_ceiling_bits);
        let d = self.difficulty.snapshot();
        if (floor, ceiling) != (d.floor_bits, d.ceiling_bits) {
            self.difficulty
                .set_floor_ceiling(floor, ceiling)
                .map_err(|e| format!("difficulty bounds {floor}..{ceiling}: {e}"))?;
        }
        let limit = s
            .join_limit_per_prefix_per_min
            .unwrap_or(self.config.join_limit_per_prefix_per_min);
        if limit != self.join_limit_per_min.load(Ordering::Relaxed) {
            self.set_join_limit(limit);
        }
        self.settings.store(Arc::new(s));
        Ok(())
    }

    /// Settings from the store that cannot be used: the last good copy
    /// stays in force, the error is logged once and counted.
    fn refuse_settings(&self, telemetry: &Telemetry, reason: &str) {
        telemetry.settings_rejected(self.id());
        let mut last = self.bad_settings.lock();
        if last.as_deref() != Some(reason) {
            tracing::error!(
                room = self.id(),
                reason,
                "settings in the store refused; keeping the last good ones"
            );
            *last = Some(reason.to_owned());
        }
    }

    /// The state a visitor is told: `closed`, `sold_out`, `paused`, or
    /// `open`/`queueing`.
    /// A room whose pre-queue is open (before its opening) is `paused`:
    /// it takes joins and admits nobody yet, API.md's meaning of the word.
    pub fn public_state(&self, snap: &Snapshot) -> &'static str {
        if snap.closed {
            "closed"
        } else if snap.paused || snap.prequeue_open {
            "paused"
        } else if snap.queue_length() > 0 {
            "queueing"
        } else {
            "open"
        }
    }

    /// Seconds a new visitor would wait, from the measured (or configured)
    /// admission rate.
    pub fn eta_for_position(&self, snap: &Snapshot, position: u64) -> u64 {
        let measured = self.admits_per_sec();
        let rate = if measured > 0.0 {
            measured
        } else {
            snap.rate_per_sec
        };
        sluice_admission::eta_seconds(position, rate).unwrap_or(0)
    }

    fn set_join_limit(&self, per_min: u32) {
        self.join_limit_per_min.store(per_min, Ordering::Relaxed);
        self.limiter.store(Arc::new(limiter(per_min)));
    }
}

/// The snapshot a room shows before the store first answered: nobody in
/// line, nothing admitted.
pub(crate) fn empty_snapshot(room: &str, settings: &RoomSettings) -> Snapshot {
    Snapshot {
        room: room.to_owned(),
        tail: 0,
        frontier: 0,
        credit: 0.0,
        rate_per_sec: settings.rate_per_sec,
        burst: settings.burst,
        paused: settings.paused,
        closed: settings.closed,
        epoch: 0,
        active_sessions: 0,
        pending_claims: 0,
        max_active: settings.effective_max_active(),
        admitted_total: 0,
        claimed_total: 0,
        joins_total: 0,
        refunded_total: 0,
        late_claims_total: 0,
        store_now_ms: 0,
        opens_at_ms: settings.opens_at_ms,
        prequeue_open: settings.opens_at_ms.is_some(),
        prequeue_draw: None,
        ended_total: 0,
        carried_epoch: 0,
        carried_tail: 0,
        settings_version: 0,
        lanes: Vec::new(),
    }
}

/// One cell of `limiter` for `prefix` (always granted without a limiter),
/// or the whole seconds to wait (at least 1).
fn check_keyed(
    limiter: Option<&DefaultKeyedRateLimiter<NetPrefix>>,
    prefix: NetPrefix,
) -> Result<(), u64> {
    match limiter {
        None => Ok(()),
        Some(l) => l.check_key(&prefix).map_err(|not_until| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            wait.as_secs().max(1)
        }),
    }
}

/// The fetched JWKS of a room's `[rooms.enqueue] jwks_url`.
fn enqueue_jwks(config: &RoomConfig) -> anyhow::Result<Option<Arc<Fetched<JwksKeys>>>> {
    let e = &config.enqueue;
    let Some(url) = &e.jwks_url else {
        return Ok(None);
    };
    let policy = Policy::new(
        e.jwks_ca.as_deref(),
        true,
        ENQUEUE_JWKS_TIMEOUT,
        e.jwks_ttl,
        e.jwks_retry,
    )?;
    let kind = Kind {
        name: "enqueue JWKS",
        accept: "application/jwk-set+json, application/json",
        content_types: &["application/jwk-set+json", "application/json"],
        parse: |body| {
            let text = std::str::from_utf8(body).map_err(|_| "JWKS: not UTF-8".to_owned())?;
            sluice_admission::enqueue::jwks_keys(text, false)
        },
    };
    Ok(Some(Fetched::new(url, kind, policy)?))
}

/// Longest a join waits for the origin's JWKS (none fetched yet, or a
/// token naming a key it lacks).
pub const ENQUEUE_JWKS_TIMEOUT: Duration = Duration::from_secs(2);

fn limiter(per_min: u32) -> Option<DefaultKeyedRateLimiter<NetPrefix>> {
    let n = std::num::NonZeroU32::new(per_min)?;
    Some(RateLimiter::keyed(Quota::per_minute(n)))
}

/// The rooms of this gateway.
pub struct Rooms {
    rooms: Vec<Arc<Room>>,
    by_id: HashMap<String, Arc<Room>>,
}

impl Rooms {
    /// Rooms as configured.
    pub fn from_config(config: &Config) -> anyhow::Result<Rooms> {
        let mut rooms = Vec::new();
        let mut by_id = HashMap::new();
        for rc in &config.rooms {
            let room = Arc::new(Room::new(
                canonical_rules(rc.clone()),
                config.pow_secret.as_deref(),
                config.limits.status_polls_per_token_per_min,
                config.limits.ended_sessions_per_room,
            )?);
            by_id.insert(rc.id.clone(), room.clone());
            rooms.push(room);
        }
        Ok(Rooms { rooms, by_id })
    }

    /// Starts the first fetch of every room's enqueue JWKS (call within
    /// the runtime).
    pub fn warm_keys(&self) {
        for room in &self.rooms {
            if let Some(jwks) = &room.enqueue_jwks {
                jwks.warm();
            }
        }
    }

    /// A room by id.
    pub fn get(&self, id: &str) -> Option<&Arc<Room>> {
        self.by_id.get(id)
    }

    /// Every room.
    pub fn all(&self) -> &[Arc<Room>] {
        &self.rooms
    }

    /// The room guarding a request, if any, decided on its canonical host
    /// name (no port) and route path ([`crate::edge::canonical`]): among rooms
    /// whose hosts match (or that name none), the most specific rule wins
    /// (rules cover whole segments); a room naming the host beats one that
    /// does not at equal length.
    pub fn route(&self, host: Option<&str>, path: &str) -> Option<&Arc<Room>> {
        let mut best: Option<(&Arc<Room>, (usize, bool))> = None;
        for room in &self.rooms {
            let c = &room.config;
            let host_specific = !c.hosts.is_empty();
            if host_specific && !host.is_some_and(|h| c.hosts.iter().any(|x| x == h)) {
                continue;
            }
            let len = if c.paths.is_empty() {
                Some(0)
            } else {
                c.paths
                    .iter()
                    .filter_map(|p| {
                        crate::edge::canonical::rule_covers(path, p, c.case_insensitive_paths)
                    })
                    .max()
            };
            if let Some(len) = len {
                let score = (len, host_specific);
                if best.as_ref().is_none_or(|(_, s)| score > *s) {
                    best = Some((room, score));
                }
            }
        }
        best.map(|(r, _)| r)
    }
}

/// A room's configuration with its rules in canonical form (the form
/// requests are matched in): paths and bypass paths normalised as request
/// paths are, hosts as `Host` headers are (lowercase, no trailing dot, no
/// port). `Config::validate` refused any that cannot be.
fn canonical_rules(mut c: RoomConfig) -> RoomConfig {
    let rule = |p: &String| crate::edge::canonical::normalize_rule(p).unwrap_or_else(|_| p.clone());
    c.paths = c.paths.iter().map(rule).collect();
    c.bypass_paths = c.bypass_paths.iter().map(rule).collect();
    c.hosts = c
        .hosts
        .iter()
        .map(|h| {
            crate::edge::canonical::normalize_host(h)
                .map_or_else(|_| h.to_ascii_lowercase(), |h| h.name)
        })
        .collect();
    c
}

/// Whether a request to `room` bypasses the queue (configured paths such as
/// `/robots.txt`, or allow-listed client ranges). `path` is the canonical
/// route path.
pub fn bypasses(room: &Room, path: &str, ip: IpAddr) -> bool {
    let ip = canonical_ip(ip);
    let c = &room.config;
    c.bypass_paths
        .iter()
        .any(|p| crate::edge::canonical::rule_covers(path, p, c.case_insensitive_paths).is_some())
        || c.bypass_ips.iter().any(|n| n.contains(&ip))
}

// === the ticker ===

/// Loads or creates each room in the store, then advances every room every
/// tick until the process ends, and keeps each room's `sold_out` setting in
/// step with its events' stock.
pub async fn run_ticker(
    rooms: Arc<Rooms>,
    store: QueueBackend,
    telemetry: Telemetry,
    events: crate::reserve::events::Events,
) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut initialised = vec![false; rooms.all().len()];
    let mut stock_seen: Vec<Option<bool>> = vec![None; rooms.all().len()];
    let mut last_prune = tokio::time::Instant::now();
    loop {
        interval.tick().await;
        if last_prune.elapsed() >= LIMITER_PRUNE_EVERY {
            last_prune = tokio::time::Instant::now();
            for room in rooms.all() {
                room.prune_rate_limits();
            }
        }
        for (i, room) in rooms.all().iter().enumerate() {
            if !initialised[i] {
                match init_room(room, &store, &telemetry).await {
                    Ok(()) => initialised[i] = true,
                    Err(e) => {
                        mark_down(room, &e);
                        continue;
                    }
                }
            }
            match tick_room(room, &store, &telemetry).await {
                Ok(()) => {
                    if !room.store_ok.swap(true, Ordering::Relaxed) {
                        room.store_seen.store(true, Ordering::Relaxed);
                        tracing::info!(room = room.id(), "store answers");
                    }
                    let view = events.room_stock(room.id());
                    if let Err(e) = sync_sold_out(room, &store, view, &mut stock_seen[i]).await {
                        mark_down(room, &e);
                    }
                }
                Err(e) => mark_down(room, &e),
            }
            // The streams hear what changed (at once for admissions and
            // state changes, at their poll cadence otherwise).
            let snap = room.snapshot();
            let sold_out = events.room_sold_out(room.id()) || room.settings().sold_out;
            let rate = room.admits_per_sec().max(snap.rate_per_sec);
            room.streams
                .tick(&snap, sold_out, crate::app::clock::now_ms(), |pos| {
                    sluice_admission::poll_after_ms_eta(pos, rate, &mut rand::rng())
                });
            telemetry.room(
                &room.snapshot(),
                room.admits_per_sec(),
                room.difficulty.current_level().difficulty_bits,
                room.store_ok(),
            );
            telemetry.ended_sessions(room.id(), room.ended_count(), room.ended_overflowing());
            telemetry.join_steps(room.id(), &room.join_batches);
        }
    }
}

/// Sold out stops admission in every gateway: the store's `sold_out`
/// setting halts the bucket like a pause (so neither the tickers' `advance`
/// nor a join's passthrough moves the frontier), and lifting it resumes.
/// Each gateway writes it when *its* view of the stock changes (edge
/// triggered, so gateways whose views differ for the second between two
/// inventory refreshes do not flap it), and only when the store disagrees;
/// the write is a compare and set on the settings' version, so it never
/// reverts a PATCH made meanwhile.
async fn sync_sold_out(
    room: &Room,
    store: &QueueBackend,
    view: Option<bool>,
    seen: &mut Option<bool>,
) -> Result<(), AdmissionError> {
    let Some(sold_out) = view else {
        return Ok(());
    };
    if *seen == Some(sold_out) {
        return Ok(());
    }
    if room.settings().sold_out != sold_out {
        let changed = modify_settings(room, store, |s| {
            s.sold_out = sold_out;
            Ok::<_, AdmissionError>(())
        })
        .await?;
        if changed {
            if sold_out {
                tracing::info!(room = room.id(), "sold out: admission stopped");
            } else {
                tracing::info!(room = room.id(), "stock is back: admission resumes");
            }
        }
    }
    *seen = Some(sold_out);
    Ok(())
}

/// How often a settings write is tried again when another write came
/// first, before giving up.
const SETTINGS_RETRIES: usize = 16;

/// Changes a room's settings in the store by `change`, never reverting a
/// write another gateway made meanwhile: reads the store's settings, applies
/// `change` to them, writes them compare-and-set on their version, and on a
/// conflict starts again from the store's newer copy. The local copy follows
/// only a write that succeeded, so a failed change leaves everything as it
/// was. `Ok(false)` when `change` left the settings as they were (nothing
/// written).
pub async fn modify_settings<E>(
    room: &Room,
    store: &QueueBackend,
    mut change: impl FnMut(&mut RoomSettings) -> Result<(), E>,
) -> Result<bool, E>
where
    E: From<AdmissionError>,
{
    for _ in 0..SETTINGS_RETRIES {
        let current = match store.settings(room.id()).await {
            Ok(Some(s)) => s,
            Ok(None) => return Err(AdmissionError::RoomNotFound(room.id().to_owned()).into()),
            // What the store holds is refused: the change applies to the
            // last good copy, written over the bad one (compare and set on
            // the store's version, as the snapshot saw it), so an operator
            // can always repair a room.
            Err(AdmissionError::StoredSettings { .. }) => {
                let mut s = (*room.settings()).clone();
                s.version = room.snapshot().settings_version;
                s
            }
            Err(e) => return Err(e.into()),
        };
        let mut next = current.clone();
        change(&mut next)?;
        next.version = current.version;
        if next == current {
            return Ok(false);
        }
        match store.update_settings(room.id(), &next).await {
            Ok(snap) => {
                next.version += 1;
                if let Err(reason) = room.adopt(next) {
                    // checked by the caller before writing; a config this
                    // gateway cannot apply is still the store's now
                    tracing::error!(
                        room = room.id(),
                        reason,
                        "settings written but not applicable here"
                    );
                }
                room.record(snap);
                return Ok(true);
            }
            Err(AdmissionError::SettingsConflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AdmissionError::Store(format!(
        "settings of room {} changed {SETTINGS_RETRIES} times while being written",
        room.id()
    ))
    .into())
}

fn mark_down(room: &Room, e: &dyn std::fmt::Display) {
    if room.store_ok.swap(false, Ordering::Relaxed) {
        tracing::warn!(room = room.id(), error = %e, "store unavailable; answering from the last snapshot");
    }
}

async fn init_room(
    room: &Room,
    store: &QueueBackend,
    telemetry: &Telemetry,
) -> Result<(), AdmissionError> {
    match store.settings(room.id()).await {
        Ok(Some(s)) => {
            if let Err(reason) = room.adopt(s) {
                room.refuse_settings(telemetry, &reason);
            }
        }
        Ok(None) => {
            let s = room.initial.clone();
            let snap = store.configure(room.id(), &s).await?;
            room.settings.store(Arc::new(s));
            room.record(snap);
        }
        Err(AdmissionError::StoredSettings { reason, .. }) => {
            // the configuration's settings stand until the store's are good
            room.refuse_settings(telemetry, &reason);
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Joins `room`'s queue, never handing out a seq twice.
///
/// Every seq this gateway has seen (its own joins, the store's tails) lies
/// below any seq the store can hand out next — unless the store went back
/// in time: a replica promoted before it had the last joins (replication is
/// asynchronous), or a restart from an older file. A join answering at or
/// below what was seen is exactly that: the room is recovered above
/// everything seen (as the ticker does when it notices) and the visitor
/// joins again. The floor is read *before* the join is sent, so a
/// concurrent join's seq cannot be mistaken for a reissued one.
pub async fn join(room: &Room, store: &QueueBackend) -> Result<JoinOutcome, AdmissionError> {
    let seen = room.max_tail.load(Ordering::Relaxed);
    let mut outcome = store.join(room.id()).await?;
    if outcome.seq <= seen {
        recover_above_seen(room, store, outcome.seq, seen, "handed out").await?;
        outcome = store.join(room.id()).await?;
    }
    room.max_tail.fetch_max(outcome.seq, Ordering::Relaxed);
    Ok(outcome)
}

/// [`join`] paid for by a proof-of-work solution: the replay guard and the
/// join in one store step ([`QueueStore::join_once`]), with the same guard
/// against a store that went back. A seq seen before is not the visitor's:
/// the room is recovered and the join made again as the solution's own,
/// its note written over with the new place.
pub async fn join_once(
    room: &Room,
    store: &QueueBackend,
    solution: sluice_admission::Solution<'_>,
) -> Result<sluice_admission::JoinOnce, AdmissionError> {
    use sluice_admission::JoinOnce;
    let seen = room.max_tail.load(Ordering::Relaxed);
    let mut once = match store {
        // joins that arrive while one is on its way go together
        // (sluice_admission::batch), from this thread's batcher of the
        // room: a batch stays on the thread, and its Redis connection
        QueueBackend::Redis(_) => {
            join_batcher(room)
                .join_once(store, room.id(), solution)
                .await?
        }
        QueueBackend::Memory(_) => store.join_once(room.id(), solution).await?,
    };
    // a lane's seqs are its own: the room-wide floor does not apply (a
    // store that went back is told by the ticker's snapshots)
    if let JoinOnce::Joined(outcome) = &once
        && outcome.lane.is_none()
        && outcome.seq <= seen
    {
        recover_above_seen(room, store, outcome.seq, seen, "handed out").await?;
        let own = sluice_admission::Solution {
            spent: true,
            ..solution
        };
        once = store.join_once(room.id(), own).await?;
    }
    if let JoinOnce::Joined(outcome) = &once
        && outcome.lane.is_none()
    {
        room.max_tail.fetch_max(outcome.seq, Ordering::Relaxed);
    }
    Ok(once)
}

thread_local! {
    /// This thread's join batcher of each room, by the address of the
    /// room's `batchers_key`, with a weak reference to it (which keeps the
    /// address from being reused while the entry lives). Not by room id:
    /// two gateways in one process (tests) may each have a room of one id
    /// on another store, and a batch must never carry joins of both.
    static JOIN_BATCHERS: std::cell::RefCell<JoinBatchers> = std::cell::RefCell::default();
}

type JoinBatchers = std::collections::HashMap<
    usize,
    (
        std::sync::Weak<()>,
        Arc<sluice_admission::batch::JoinBatcher>,
    ),
>;

/// This thread's join batcher of `room`. One per thread, not per room:
/// each I/O thread has a Redis connection of its own, and a batch sent
/// from another thread would wake this one to answer (README, "A hold
/// stays on its I/O thread"). A thread's first join of a room drops the
/// thread's batchers of deleted rooms.
fn join_batcher(room: &Room) -> Arc<sluice_admission::batch::JoinBatcher> {
    let key = Arc::as_ptr(&room.batchers_key) as usize;
    JOIN_BATCHERS.with(|b| {
        let mut map = b.borrow_mut();
        if let Some((_, batcher)) = map.get(&key) {
            return batcher.clone();
        }
        map.retain(|_, (alive, _)| alive.strong_count() > 0);
        let batcher = Arc::new(sluice_admission::batch::JoinBatcher::new(
            room.join_batches.clone(),
        ));
        map.insert(key, (Arc::downgrade(&room.batchers_key), batcher.clone()));
        batcher
    })
}

/// The store `did` (handed out, passed through) seq `store_seq`, at or
/// below `seen`: it went back in time. Logged, and the room recovered
/// above everything seen.
async fn recover_above_seen(
    room: &Room,
    store: &QueueBackend,
    store_seq: u64,
    seen: u64,
    did: &str,
) -> Result<(), AdmissionError> {
    tracing::warn!(
        room = room.id(),
        store_seq,
        seen_tail = seen,
        "store {did} a seq already seen: recovering from the highest values seen"
    );
    let snap = room.recover(store, room.floors()).await?;
    room.record(snap);
    Ok(())
}

/// A passthrough (admit on the spot or nothing, [`QueueStore::passthrough`])
/// with the same guard against a store that went back as [`join`].
pub async fn passthrough(
    room: &Room,
    store: &QueueBackend,
) -> Result<Option<JoinOutcome>, AdmissionError> {
    let seen = room.max_tail.load(Ordering::Relaxed);
    let Some(outcome) = store.passthrough(room.id()).await? else {
        return Ok(None);
    };
    // the place is the room's tail (its seq without lanes; with lanes the
    // seq is the lane's own)
    if outcome.place <= seen {
        // a seq handed out before: not this visitor's to take. Recover
        // above everything seen; the visitor gets the waiting room.
        recover_above_seen(room, store, outcome.place, seen, "passed through").await?;
        return Ok(None);
    }
    room.max_tail.fetch_max(outcome.place, Ordering::Relaxed);
    Ok(Some(outcome))
}

async fn tick_room(
    room: &Arc<Room>,
    store: &QueueBackend,
    telemetry: &Telemetry,
) -> Result<(), AdmissionError> {
    // The highest values seen, read *before* the store is asked: joins
    // answered while `advance` runs raise `max_tail` above the tail the
    // store had then, and must not be mistaken for a store that lost state.
    let seen_tail = room.max_tail.load(Ordering::Relaxed);
    let seen_frontier = room.max_frontier.load(Ordering::Relaxed);
    let snap = match store.advance(room.id()).await {
        Ok(s) => s,
        Err(AdmissionError::RoomNotFound(_)) => {
            // The store lost the room (Redis restarted empty): recreate it
            // above every seq this gateway has seen, with a new epoch.
            let floors = room.floors();
            tracing::warn!(
                room = room.id(),
                seen_tail = floors.tail,
                seen_frontier = floors.frontier,
                seen_epoch = floors.epoch,
                "store has no state for the room: recovering from the highest values seen"
            );
            let snap = room.recover(store, floors).await?;
            room.record(snap);
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let lost = snap.tail < seen_tail || snap.frontier < seen_frontier;
    let snap = if lost {
        tracing::warn!(
            room = room.id(),
            store_tail = snap.tail,
            seen_tail,
            "store lost the room's state: recovering from the highest values seen"
        );
        room.recover(store, room.floors()).await?
    } else {
        snap
    };
    // Settings are read when their version moved (a PATCH, a sold-out flag,
    // adaptive steering on any gateway), not every tick.
    let read = room.read_settings_version.load(Ordering::Relaxed);
    if snap.settings_version != read || snap.settings_version == 0 {
        let seen = |room: &Room| {
            room.read_settings_version
                .store(snap.settings_version, Ordering::Relaxed);
        };
        match store.settings(room.id()).await {
            Ok(Some(s)) => {
                seen(room);
                if let Err(reason) = room.adopt(s) {
                    room.refuse_settings(telemetry, &reason);
                } else {
                    *room.bad_settings.lock() = None;
                }
            }
            Ok(None) => {
                // The store has the room's queue but not its settings
                // (lost): write back what this gateway knows.
                let s = room.settings_for_store();
                store.configure(room.id(), &s).await?;
            }
            Err(AdmissionError::StoredSettings { reason, .. }) => {
                seen(room);
                room.refuse_settings(telemetry, &reason);
            }
            Err(e) => return Err(e),
        }
    }
    room.sync_ended(store, &snap).await?;
    let now_ms = snap.store_now_ms;
    room.difficulty.set_pressure(
        room.joins_per_sec(),
        room.admits_per_sec().max(snap.rate_per_sec),
        now_ms,
    );
    room.ensure_place_map(&snap);
    room.record(snap);
    Ok(())
}

// === admin ===

/// The admin view of a room (API.md `GET /_sluice/admin/rooms/{room}`),
/// from this gateway's last snapshot (at most one tick old).
pub fn admin_view(room: &Room) -> Value {
    admin_view_of(room, &room.snapshot())
}

/// The admin view of a room read fresh from the store, so that an operator
/// (or a script) sees every join acknowledged before the request; the last
/// snapshot when the store does not answer (`store_ok` then says so).
pub async fn admin_view_fresh(room: &Room, store: &QueueBackend) -> Value {
    match store.snapshot(room.id()).await {
        Ok(snap) => admin_view_of(room, &snap),
        Err(_) => admin_view(room),
    }
}

fn admin_view_of(room: &Room, snap: &Snapshot) -> Value {
    let settings = room.settings();
    let diff = room.difficulty.snapshot();
    // `snap.paused` is the halt in force (a pause or sold out); say which.
    let state = if snap.closed {
        "closed"
    } else if settings.sold_out {
        "sold_out"
    } else if settings.paused {
        "paused"
    } else {
        room.public_state(snap)
    };
    let mut view = json!({
        "opens_at": snap.opens_at_ms.map(crate::gate::schedule::format_rfc3339),
        "room": room.id(),
        "state": state,
        "rate_per_sec": snap.rate_per_sec,
        "burst": snap.burst,
        "paused": settings.paused,
        "sold_out": settings.sold_out,
        "closed": snap.closed,
        // extension: the room takes invite codes only (README, "Invite codes")
        "invite_only": room.config.invite_only,
        "tail": snap.tail,
        "frontier": snap.frontier,
        "queue_length": snap.queue_length(),
        "active_sessions": snap.active_sessions,
        "pending_claims": snap.pending_claims,
        "max_active": snap.max_active,
        // extension: whether that cap is Little's, derived from the rate
        // and session_length_secs (it follows the rate), or set explicitly
        "max_active_derived": settings.max_active.is_none() && snap.max_active.is_some(),
        "session_length_secs": settings.session_length.map(|d| d.as_secs_f64()),
        "difficulty_bits": diff.level.difficulty_bits,
        "puzzles": diff.level.puzzles,
        "difficulty_floor_bits": diff.floor_bits,
        "difficulty_ceiling_bits": diff.ceiling_bits,
        "under_attack": diff.level.under_attack,
        "joins_per_sec": room.joins_per_sec(),
        "admits_per_sec": room.admits_per_sec(),
        "capacity_rps": settings.capacity_rps,
        "safety_margin": settings.safety_margin,
        "requests_per_visitor_per_sec": settings.requests_per_visitor_per_sec,
        "claim_window_secs": settings.claim_window.as_secs_f64(),
        "session_ttl_secs": settings.session_ttl.as_secs_f64(),
        "join_limit_per_prefix_per_min": room.join_limit_per_min.load(Ordering::Relaxed),
        "method": settings.method.as_str(),
        // extension: per lane (README, "Priority lanes"); absent without
        "lanes": lanes_view(&settings, snap),
        "lane_mode": (!settings.lanes.is_empty()).then(|| match settings.lane_mode {
            sluice_admission::lanes::LaneMode::Weighted => "weighted",
            sluice_admission::lanes::LaneMode::Strict => "strict",
        }),
        "epoch": snap.epoch,
        "admitted_total": snap.admitted_total,
        "claimed_total": snap.claimed_total,
        "joins_total": snap.joins_total,
        "refunded_total": snap.refunded_total,
        "store_ok": room.store_ok(),
        "adaptive": adaptive_view(room, &settings, snap.store_now_ms),
    });
    if let Some(obj) = view.as_object_mut() {
        obj.extend(room.prequeue_fields(snap));
    }
    view
}

/// The `lanes` of the admin view: id, weight, tail, frontier, waiting and
/// admitted per lane, in config order; `null` without lanes.
fn lanes_view(settings: &RoomSettings, snap: &Snapshot) -> Value {
    if settings.lanes.is_empty() {
        return Value::Null;
    }
    Value::Array(
        settings
            .lanes
            .iter()
            .zip(&snap.lanes)
            .map(|(l, s)| {
                json!({
                    "id": l.id,
                    "weight": l.weight,
                    "tail": s.tail,
                    "frontier": s.frontier,
                    "waiting": s.waiting(),
                    "admitted_total": s.admitted_total,
                })
            })
            .collect(),
    )
}

/// The `adaptive` object of the admin view: on or off, the last decision
/// and why, the bounds in force, an operator's override.
fn adaptive_view(room: &Room, settings: &RoomSettings, now_ms: u64) -> Value {
    let cfg = &room.config.adaptive;
    let a = &settings.adaptive;
    let (floor, ceiling) = crate::config::adaptive::bounds(cfg, settings.capacity_rate());
    let overridden = a.enabled && a.override_until_ms > now_ms;
    let mode = if !a.enabled {
        "off"
    } else if overridden {
        "overridden"
    } else if a.mode.is_empty() {
        "holding"
    } else {
        a.mode.as_str()
    };
    json!({
        "enabled": a.enabled,
        "mode": mode,
        "reason": if a.enabled { a.reason.as_str() } else { "" },
        "p99_ms": a.p99_ms,
        "error_ratio": a.error_ratio,
        "latency_p99_objective_ms": cfg.latency_p99_ms,
        "max_error_ratio": cfg.max_error_ratio,
        "floor": floor,
        "ceiling": ceiling,
        "interval_secs": cfg.interval.as_secs_f64(),
        "override_until_ms": if overridden { Some(a.override_until_ms) } else { None },
        "override_remaining_secs": if overridden { Some((a.override_until_ms - now_ms).div_ceil(1000)) } else { None },
        "decided_at_ms": (a.decided_at_ms > 0).then_some(a.decided_at_ms),
        "steering_here": room.steering(),
    })
}

/// Applies an admin PATCH: store settings through the store (every gateway
/// sees them within a tick), difficulty and rate limits in this gateway.
/// All or nothing: a bad field changes nothing.
pub async fn admin_patch(
    room: &Room,
    store: &QueueBackend,
    patch: &Value,
) -> Result<Value, Problem> {
    let p = AdminPatch::parse(patch)?;
    // The difficulty bounds as they will be, checked against the work cap
    // before anything is written.
    if p.floor.is_some() || p.ceiling.is_some() {
        let d = room.difficulty.snapshot();
        let f = p.floor.map_or(d.floor_bits, |f| f as u8);
        let c = p.ceiling.map_or(d.ceiling_bits, |c| c as u8);
        room.difficulty.config().check_bits(f, c).map_err(|e| {
            let field = if p.floor.is_some() {
                "difficulty_floor_bits"
            } else {
                "difficulty_ceiling_bits"
            };
            Problem::invalid_setting(field, e.to_string())
        })?;
    }
    // Bad values are refused before the store is asked: the change on this
    // gateway's copy first, as a dry run.
    p.store
        .apply(&mut (*room.settings()).clone())
        .map_err(|e| Problem::invalid_setting(e.field, e.reason))?;
    // Applied to the store's copy as it is when written (compare and set,
    // retried on a conflict): a PATCH through another gateway, the sold-out
    // flag or adaptive steering written meanwhile are kept, and nothing
    // changes anywhere unless the write succeeds.
    modify_settings(room, store, |settings| p.change(room, settings)).await?;
    Ok(admin_view(room))
}

/// An admin PATCH read and checked field by field: the fields the store's
/// settings take as they are ([`RoomPatch`]) and the ones this gateway
/// turns into settings itself.
struct AdminPatch {
    store: RoomPatch,
    floor: Option<u64>,
    ceiling: Option<u64>,
    join_limit: Option<u32>,
    /// `Some(None)`: the schedule removed.
    opens_at: Option<Option<u64>>,
    adaptive_enabled: Option<bool>,
    override_secs: Option<u64>,
    method: Option<sluice_admission::QueueMethod>,
}

impl AdminPatch {
    /// Reads a PATCH body: an object of known settings, each of its type
    /// and range; anything else is 422 `invalid_setting` naming the field.
    fn parse(patch: &Value) -> Result<AdminPatch, Problem> {
        let obj = patch
            .as_object()
            .ok_or_else(|| Problem::invalid_setting("body", "must be a JSON object"))?;
        let mut store_patch = serde_json::Map::new();
        let mut p = AdminPatch {
            store: RoomPatch::default(),
            floor: None,
            ceiling: None,
            join_limit: None,
            opens_at: None,
            adaptive_enabled: None,
            override_secs: None,
            method: None,
        };
        for (k, v) in obj {
            if k == "opens_at" {
                p.opens_at = Some(match v {
                    Value::Null => None,
                    Value::String(t) => {
                        let ms = crate::gate::schedule::parse_rfc3339_ms(t)
                            .map_err(|e| Problem::invalid_setting(k, e))?;
                        if ms <= crate::app::clock::now_ms() {
                            return Err(Problem::invalid_setting(k, "must be in the future"));
                        }
                        Some(ms)
                    }
                    _ => {
                        return Err(Problem::invalid_setting(
                            k,
                            "must be an RFC 3339 time (string) or null",
                        ));
                    }
                });
                continue;
            }
            if v.is_null() {
                if k == "max_active" {
                    // null: no cap (the store's patch says it with 0)
                    store_patch.insert(k.clone(), json!(0));
                    continue;
                }
                return Err(Problem::invalid_setting(k, "must not be null"));
            }
            match k.as_str() {
                "rate_per_sec"
                | "burst"
                | "paused"
                | "closed"
                | "max_active"
                | "capacity_rps"
                | "safety_margin"
                | "requests_per_visitor_per_sec"
                | "session_length_secs"
                | "claim_window_secs"
                | "session_ttl_secs" => {
                    store_patch.insert(k.clone(), v.clone());
                }
                "difficulty_floor_bits" => p.floor = Some(small_int(k, v, 0, 32)?),
                "difficulty_ceiling_bits" => p.ceiling = Some(small_int(k, v, 0, 32)?),
                "join_limit_per_prefix_per_min" => {
                    p.join_limit = Some(small_int(k, v, 0, 1_000_000)? as u32);
                }
                "adaptive_enabled" => {
                    p.adaptive_enabled = Some(
                        v.as_bool()
                            .ok_or_else(|| Problem::invalid_setting(k, "must be true or false"))?,
                    );
                }
                "method" => {
                    let name = v.as_str().ok_or_else(|| {
                        Problem::invalid_setting(
                            k,
                            "must be one of fifo, random, queue_all, reject",
                        )
                    })?;
                    p.method = Some(
                        sluice_admission::QueueMethod::parse(name)
                            .map_err(|e| Problem::invalid_setting(e.field, e.reason))?,
                    );
                }
                "adaptive_override_secs" => {
                    p.override_secs = Some(small_int(k, v, 0, 7 * 86_400)?);
                }
                other => return Err(Problem::invalid_setting(other, "unknown setting")),
            }
        }
        p.store = serde_json::from_value(Value::Object(store_patch))
            .map_err(|e| Problem::invalid_setting("body", e.to_string()))?;
        Ok(p)
    }

    /// Applies the PATCH to `settings` (the store's copy as it is when
    /// written; called again on a compare-and-set conflict).
    fn change(&self, room: &Room, settings: &mut RoomSettings) -> Result<(), Problem> {
        if let Some(opens) = self.opens_at {
            schedule(room, settings, opens)?;
        }
        if let Some(on) = self.adaptive_enabled {
            settings.adaptive.enabled = on;
            if !on {
                settings.adaptive.override_until_ms = 0;
            }
        }
        self.store
            .apply(settings)
            .map_err(|e| Problem::invalid_setting(e.field, e.reason))?;
        // An operator's manual rate overrides adaptive admission for a
        // while: the PATCH's adaptive_override_secs, else the room's
        // configured time.
        let manual_rate = self.store.rate_per_sec.is_some();
        if settings.adaptive.enabled && (manual_rate || self.override_secs.is_some()) {
            let secs = self
                .override_secs
                .unwrap_or(room.config.adaptive.override_for.as_secs());
            // the store's clock (one tick old), which the steering gateway reads
            let now = match room.snapshot().store_now_ms {
                0 => crate::app::clock::now_ms(),
                t => t,
            };
            settings.adaptive.override_until_ms = if secs == 0 { 0 } else { now + secs * 1000 };
        }
        if let Some(f) = self.floor {
            settings.difficulty_floor_bits = Some(f as u8);
        }
        if let Some(c) = self.ceiling {
            settings.difficulty_ceiling_bits = Some(c as u8);
        }
        if self.floor.is_some() != self.ceiling.is_some() {
            // one bound given: the other as in force now, so the pair in the
            // store is always one the work cap was checked against
            let d = room.difficulty.snapshot();
            settings.difficulty_floor_bits.get_or_insert(d.floor_bits);
            settings
                .difficulty_ceiling_bits
                .get_or_insert(d.ceiling_bits);
        }
        if let Some(l) = self.join_limit {
            settings.join_limit_per_prefix_per_min = Some(l);
        }
        if let Some(m) = self.method {
            settings.method = m;
            if m == sluice_admission::QueueMethod::Random {
                // the draws' seeds derive from the room's; its draws are
                // kept as long as a token of theirs may come back
                settings
                    .prequeue_seed
                    .get_or_insert_with(sluice_admission::prequeue::new_seed_hex);
                if settings.lane_keep.is_none() {
                    settings.lane_keep = Some(room.config.token_keep());
                }
            }
        }
        settings
            .to_stored()
            .map_err(|e| Problem::invalid_setting(e.field, e.reason))?;
        Ok(())
    }
}

/// Applies a PATCH of `opens_at` to `settings`. While the pre-queue is open
/// the seed (and so the published commitment) stays: the opening moves, or
/// with `null` happens at once. Otherwise a new opening starts a new
/// pre-queue with a new random seed, refused while tickets of the previous
/// draw still wait (their places come from it).
fn schedule(room: &Room, settings: &mut RoomSettings, opens: Option<u64>) -> Result<(), Problem> {
    let snap = room.snapshot();
    if snap.prequeue_open {
        settings.opens_at_ms = opens;
        return Ok(());
    }
    let Some(ms) = opens else {
        settings.opens_at_ms = None;
        return Ok(());
    };
    if let Some(d) = snap.prequeue_draw
        && snap.frontier < d.from.saturating_add(d.n)
    {
        return Err(Problem::invalid_setting(
            "opens_at",
            "the previous pre-queue draw is still being admitted",
        ));
    }
    settings.opens_at_ms = Some(ms);
    // a random room keeps its seed, and so does one that made rolling
    // draws: they were ordered with it (and it is revealed only when the
    // room closes)
    let rolled = snap.prequeue_draw.is_some_and(|d| d.k > 0);
    if settings.method != sluice_admission::QueueMethod::Random && !rolled {
        settings.prequeue_seed = Some(sluice_admission::prequeue::new_seed_hex());
    }
    settings.prequeue_draw = None;
    Ok(())
}

fn small_int(field: &str, v: &Value, lo: u64, hi: u64) -> Result<u64, Problem> {
    match v.as_u64() {
        Some(x) if (lo..=hi).contains(&x) => Ok(x),
        _ => Err(Problem::invalid_setting(
            field,
            format!("must be an integer from {lo} to {hi}"),
        )),
    }
}

/// Seconds until a bucket at `rate` holding `credit` has a whole
/// admission (at least 1, at most 60: the cap or a pause may hold longer).
pub fn full_retry_after(rate: f64, credit: f64) -> u64 {
    if rate <= 0.0 || !rate.is_finite() {
        return 60;
    }
    let need = (1.0 - credit).max(0.0) / rate;
    (need.ceil() as u64).clamp(1, 60)
}

/// What a room's store failure means for a new visitor.
pub fn fail_open(room: &Room) -> bool {
    room.config.failure_policy == FailurePolicy::Open
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A deleted room's batcher does not stay on the thread: the next
    /// room's first join there drops it; a live room keeps its own, and
    /// two rooms of one id (two gateways in a process) have one each.
    #[test]
    fn deleted_rooms_leave_no_join_batcher_behind() {
        let room = |id: &str| {
            let config = RoomConfig {
                id: id.into(),
                ..RoomConfig::default()
            };
            Room::new(config, None, 0, 16).unwrap()
        };
        let on_thread = || JOIN_BATCHERS.with(|b| b.borrow().len());
        let before = on_thread();
        let (a, twin) = (room("a"), room("a"));
        let first = join_batcher(&a);
        assert!(Arc::ptr_eq(&first, &join_batcher(&a)));
        assert!(!Arc::ptr_eq(&first, &join_batcher(&twin)));
        assert_eq!(on_thread(), before + 2);
        for n in 0..100 {
            let deleted = room(&format!("deleted-{n}"));
            join_batcher(&deleted);
        }
        // The last deleted room's batcher waits for the next new room.
        assert_eq!(on_thread(), before + 3);
        drop(twin);
        join_batcher(&room("b"));
        assert_eq!(on_thread(), before + 2, "a and b");
        assert!(Arc::ptr_eq(&first, &join_batcher(&a)));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, failure_persistence: None, ..Default::default() })]

        /// A failover to a replica that missed the last `lag` joins never
        /// makes [`join`] hand out a seq twice, however few joins follow.
        #[test]
        fn joins_never_reissue_a_seq_after_the_store_goes_back(
            n in 0usize..40,
            lag in 0usize..40,
            after in 1usize..10,
        ) {
            let m = n.saturating_sub(lag);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let room = Room::new(RoomConfig { id: "r".into(), ..RoomConfig::default() }, None, 0, 16).unwrap();
                let clock = Arc::new(sluice_admission::SystemClock);
                let primary = QueueBackend::Memory(sluice_admission::MemoryQueueStore::new(clock.clone()));
                let replica = QueueBackend::Memory(sluice_admission::MemoryQueueStore::new(clock));
                primary.configure("r", &room.settings()).await.unwrap();
                replica.configure("r", &room.settings()).await.unwrap();
                let mut seqs = Vec::new();
                for i in 0..n {
                    seqs.push(join(&room, &primary).await.unwrap().seq);
                    if i < m {
                        replica.join("r").await.unwrap();
                    }
                }
                for _ in 0..after {
                    seqs.push(join(&room, &replica).await.unwrap().seq);
                }
                assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs must strictly increase: {seqs:?}");
            });
        }
    }

    #[test]
    fn prefixes_respect_segments() {
        let covers = |p, r| crate::edge::canonical::rule_covers(p, r, false).is_some();
        assert!(covers("/tickets", "/tickets"));
        assert!(covers("/tickets/1", "/tickets"));
        assert!(!covers("/ticketsx", "/tickets"));
        assert!(covers("/static/x.css", "/static/"));
        assert!(covers("/anything", "/"));
    }

    #[test]
    fn most_specific_room_wins() {
        let config = Config {
            rooms: vec![
                RoomConfig {
                    id: "all".into(),
                    ..RoomConfig::default()
                },
                RoomConfig {
                    id: "tickets".into(),
                    paths: vec!["/tickets".into()],
                    ..RoomConfig::default()
                },
                RoomConfig {
                    id: "vip".into(),
                    paths: vec!["/tickets/vip".into()],
                    ..RoomConfig::default()
                },
                RoomConfig {
                    id: "other-host".into(),
                    hosts: vec!["b.example".into()],
                    paths: vec!["/tickets".into()],
                    ..RoomConfig::default()
                },
            ],
            ..Config::default()
        };
        let rooms = Rooms::from_config(&config).unwrap();
        let id = |h: Option<&str>, p: &str| rooms.route(h, p).map(|r| r.id().to_owned());
        assert_eq!(id(None, "/"), Some("all".into()));
        assert_eq!(id(Some("a.example"), "/tickets/1"), Some("tickets".into()));
        assert_eq!(id(None, "/tickets/vip/2"), Some("vip".into()));
        // the host is the canonical name: lowercase, no port
        assert_eq!(id(Some("b.example"), "/tickets"), Some("other-host".into()));
        assert_eq!(id(Some("b.example"), "/other"), Some("all".into()));
    }
}
