//! The Redis store: every operation is one Lua script, every key of an event
//! under its hash tag, `TIME` the only clock.
//!
//! # Key schema
//!
//! For event `ev` (the braces are literal: `{ev}` is the Redis Cluster hash
//! tag, so one event lives on one shard and every script runs unchanged on
//! a cluster):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `sluice:{ev}:stock` | string | available units. Missing = not ready (never "sold out") |
//! | `sluice:{ev}:meta` | hash | `total`, `cart_limit`, `hold_ttl_ms`, `version`, `room`, `held`, `confirmed`; with waves pending `waves` (`{at}:{qty}:{category}` joined by `,`, earliest first) and `wave_next` (the first one's time, ms): whoever takes a wave off the list in its script releases it, once; with categories also `cats` (the ids, comma-separated, in load order) and per category `c:{id}:total`, `c:{id}:avail`, `c:{id}:held`, `c:{id}:confirmed`, `c:{id}:limit` (0 = none), which add up to the event's counters, and `c:{id}:version` (the last feed snapshot's source version, absent before one) |
//! | `sluice:{ev}:hold:{suffix}` | hash | one hold: `visitor`, `qty`, `status` (`held`/`confirmed`/`released`/`expired`), `deadline_ms`, `created_ms`, `ended_ms`, `member`; expires [`RedisConfig::retention`] after its end (the released retention after a release, or after its deadline for a hold that lapsed; the confirmed one after a payment) |
//! | `sluice:{ev}:deadlines` | sorted set | member `{suffix}:{qty}:{visitor}`, or `{suffix}/{cat}={qty}/…:{qty}:{visitor}` for a hold with categories, score = deadline (ms). A hold's units are out exactly while its member is here; whoever removes it books them (each category's), once |
//! | `sluice:{ev}:visitors` | hash | visitor → held + confirmed units (the cart limit's count, across categories) |
//! | `sluice:{ev}:vcats` | hash | `{category}:{visitor}` → held + confirmed units in that category (a category's cart limit) |
//! | `sluice:{ev}:vholds:{len}:{visitor}` | sorted set | the visitor's deadline-index members taken within one TTL (lapsed ones are expired and dropped by the visitor's next hold, released ones by the release), so a hold can expire the visitor's lapsed holds before its cart check; expires after its last deadline |
//! | `sluice:{ev}:idem:{len}:{visitor}:{key}` | string | hold suffix for an `Idempotency-Key` (`len` = the visitor's byte length, so visitor and key cannot run into each other); PX [`IDEMPOTENCY_TTL`]. Naming a hold whose hash is gone, it takes a new hold under a new suffix |
//! | `sluice:{ev}:feed:{len}:{key}` | string | a stock feed delta's key (`len` = its byte length): `{category}\|{delta}\|` and the first answer's counters ([`crate::feed`]); PX [`crate::FEED_KEY_TTL`]. The same key with the same category and delta replays that answer, with another one is refused |
//! | `sluice:{ev}:pay:{len}:{payment_event_id}` | string | `{suffix}:{answer}`: the hold that payment event was applied to and the answer it got (the same id for another hold answers `payment_reused`); PX [`PAYMENT_TTL`] |
//! | `sluice:{ev}:stream` | stream | transitions (`STREAM.md`), `MAXLEN ~` [`RedisConfig::stream_maxlen`] while no ledger reads it |
//! | `sluice:{ev}:ledgered` | string | exists while `sluice ledger` consumes the stream (it sets the key when it creates its consumer group `sluice-ledger`): the scripts then append without `MAXLEN` and the ledger trims with `XTRIM MINID` below what it acknowledged. Never written by this crate |
//! | `sluice:loaded:{ev}` | string | the load marker: the highest stock version ever set or restored. Not one of the event's keys (no `sluice:{ev}:` prefix, never a TTL), so it survives their eviction or deletion; same hash tag, so same slot. Tells a store that lost the event from one that never had it ([`Inventory::load_if_new`]). A `FLUSHALL` takes it too |
//! | `sluice:events` | set | every event whose stock was set (for the reaper's loop). Outside any hash tag and never touched by a script |
//!
//! A held hold is expired as soon as `TIME` passes its deadline: every script
//! and read derives that from `deadline_ms`, so it holds "everywhere at once"
//! even before a reaper removed its member. The scripts that meet expired
//! members (hold, read, reap) return their units on the way; only hold
//! hashes named in `KEYS` are ever rewritten (Cluster rule). No answer
//! depends on whether a reaper came by: a hold expires the visitor's own
//! lapsed holds before its cart check and, before answering sold out,
//! lapsed holds oldest first until enough units are back (at most the
//! quantity asked for); a read reaps in bounded batches of
//! [`LAZY_REAP_MAX`], one script call each, until none lapsed is left.
//!
//! # Scripts
//!
//! `lua/common.lua` (shared KEYS 1–7, ARGV 1–2 and helpers) is prepended to
//! `hold`, `release`, `confirm`, `reap`, `set_stock`, `restore`, `read` and
//! `feed` and `schedule_waves`;
//! `get_hold.lua` stands alone. Each file's header documents its KEYS, ARGV
//! and return values. They run through [`redis::Script`] (EVALSHA, loaded
//! again on `NOSCRIPT`), each call bounded by [`RedisConfig::timeout`].
//!
//! # Holds sent together
//!
//! The holds of one event that arrive while that event's last steps are
//! on their way to Redis (at most two, per thread) go in the next step
//! together, one call of hold.lua's mode `many` ([`crate::batch`]). The
//! script makes them one after the other at one `TIME`, each exactly as
//! its own call would, so no answer changes; what the batch saves is
//! reading the event's settings, reaping lapsed holds and checking waves
//! once per step instead of once per hold. A hold that finds fewer steps
//! on their way is sent at once, alone. Not with
//! [`RedisConfig::wait_replicas`] (each hold waits for its own `WAIT`),
//! nor with `SLUICE_HOLD_BATCH=0` in the environment.
//!
//! # Durability
//!
//! Redis replicates asynchronously: a write the primary answered may be
//! missing from the replica promoted after the primary dies. Every script
//! replicates as one unit, so a promoted replica always holds a consistent
//! prefix of the history and `available + held + confirmed = total` still
//! holds there; what can be lost is the tail: holds (a visitor told "held"
//! whose units went back to the stock) and confirmations (a paid hold that
//! would expire and be sold again — the one way a failover could oversell).
//!
//! With [`RedisConfig::wait_replicas`] = n > 0, `hold` and `confirm` send
//! their script and `WAIT n timeout` as one pipeline on one connection (on a
//! cluster, the connection to the node owning the event's slot), so `WAIT`
//! counts the replicas that have this very write. When fewer acknowledge:
//!
//! - a fresh hold is released again (and its idempotency key dropped, so a
//!   retry takes a new hold) and the call fails with
//!   [`ReservationError::NotReplicated`]: no hold is ever acknowledged that a
//!   failover could lose. A replayed hold just fails (it was acknowledged
//!   before, or is being retried);
//! - a confirmation stays applied (the payment happened) and the call fails
//!   with the same error, so the payment provider retries the webhook; the
//!   retry (same `payment_event_id`) changes nothing and waits again.
//!
//! `WAIT` blocks the connection it runs on, so while a replica lags every
//! command behind it on that connection waits up to
//! [`RedisConfig::wait_timeout`]; these writes therefore use a connection of
//! their own, apart from reads, releases and the reaper.

use std::time::Duration;

use redis::{Script, Value};
use sluice_redis::{RedisConn, RedisUrl, ThreadConns};

use crate::error::{ReservationError, Result};
use crate::feed::{FeedOutcome, StockChange, StockRow, parse_key_record};
use crate::record::{CategoryRecord, EventRecord, RestoreOutcome};
use crate::retention::Retention;
use crate::sharded::{
    LayoutOutcome, PendingTransfer, ShardLayout, ShardTotal, TransferIn, TransferOut,
};
use crate::types::{
    CategoryId, CategorySpec, CategoryState, ConfirmOutcome, EventId, EventState, HoldId,
    HoldOutcome, HoldStatus, HoldView, Item, LoadOutcome, ReleaseOutcome, ScheduleOutcome,
    SetStockOutcome, StockSpec, Transition, TransitionKind, Wave, categories_problem, items_text,
    parse_categories, parse_items, parse_waves, waves_problem,
};
use crate::{
    FEED_KEY_TTL, IDEMPOTENCY_TTL, Inventory, LAZY_REAP_MAX, MAX_TOTAL, PAYMENT_TTL,
    category_restore_problem, restore_problem, spec_problem,
};

/// The registry of events (outside any hash tag).
pub const EVENTS_KEY: &str = "sluice:events";

/// The scripts' sources, as sent to Redis (common prelude included).
pub mod source {
    /// `hold.lua` with `common.lua`.
    pub const HOLD: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/hold.lua")
    );
    /// `release.lua` with `common.lua`.
    pub const RELEASE: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/release.lua")
    );
    /// `confirm.lua` with `common.lua`.
    pub const CONFIRM: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/confirm.lua")
    );
    /// `reap.lua` with `common.lua`.
    pub const REAP: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/reap.lua")
    );
    /// `set_stock.lua` with `common.lua`.
    pub const SET_STOCK: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/set_stock.lua")
    );
    /// `restore.lua` with `common.lua`.
    pub const RESTORE: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/restore.lua")
    );
    /// `read.lua` with `common.lua`.
    pub const READ: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/read.lua")
    );
    /// `feed.lua` with `common.lua`.
    pub const FEED: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/feed.lua")
    );
    /// `schedule_waves.lua` with `common.lua`.
    pub const SCHEDULE_WAVES: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/schedule_waves.lua")
    );
    /// `shard.lua` with `common.lua`.
    pub const SHARD: &str = concat!(
        include_str!("../lua/common.lua"),
        include_str!("../lua/shard.lua")
    );
    /// `get_hold.lua` (standalone).
    pub const GET_HOLD: &str = include_str!("../lua/get_hold.lua");
}

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// `redis://…` for one server, `redis+cluster://host:port[,host:port…]`
    /// for Redis Cluster, `redis+sentinel://host:port[,host:port…]/service`
    /// for the primary Redis Sentinel names (followed across failovers);
    /// parsed by [`sluice_redis::RedisUrl`], a refusal is
    /// [`ReservationError::Config`].
    pub url: String,
    /// Bound on every call (connect included): a slow Redis becomes
    /// [`ReservationError::Timeout`], never a hang. Default 2 s.
    pub timeout: Duration,
    /// Approximate cap of each event's stream (`XADD MAXLEN ~`). Default
    /// 100,000 entries.
    pub stream_maxlen: u64,
    /// Replicas that must acknowledge a hold or a confirmation before it is
    /// answered (`WAIT`, see [`Durability`]). Default 0: answer as soon as
    /// the primary applied it (asynchronous replication).
    pub wait_replicas: u32,
    /// How long `WAIT` may block. Default 100 ms.
    pub wait_timeout: Duration,
    /// How long ended holds are kept ([`Retention`]: 10 minutes after a
    /// release or a lapse, 180 days after a payment, by default). Checked
    /// by the caller with [`Retention::validate`].
    pub retention: Retention,
    /// The CA and client certificate of a `rediss…` URL. Default: the
    /// system roots, no client certificate.
    pub tls: sluice_redis::RedisTls,
}

impl RedisConfig {
    /// Defaults for the given URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout: Duration::from_secs(2),
            stream_maxlen: 100_000,
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            retention: Retention::default(),
            tls: sluice_redis::RedisTls::default(),
        }
    }
}

struct Scripts {
    hold: Script,
    release: Script,
    confirm: Script,
    reap: Script,
    set_stock: Script,
    restore: Script,
    read: Script,
    feed: Script,
    schedule_waves: Script,
    shard: Script,
    get_hold: Script,
}

/// The Redis [`Inventory`]. Cheap to clone: clones share the shared
/// multiplexed connection and the I/O threads' own ([`ThreadConns`]).
#[derive(Clone)]
pub struct RedisInventory {
    /// The shared connection and, on the gateway's I/O threads, one each
    /// ([`sluice_redis::local`]).
    conns: ThreadConns,
    /// The connection of holds and confirmations followed by `WAIT` (its own,
    /// so a lagging replica does not stall reads); `None` when
    /// [`RedisConfig::wait_replicas`] is 0.
    durable: Option<RedisConn>,
    wait_replicas: u32,
    wait_timeout: Duration,
    timeout: Duration,
    maxlen: String,
    /// The released and confirmed retentions in ms, as the scripts take them.
    released_ms: String,
    confirmed_ms: String,
    scripts: std::sync::Arc<Scripts>,
    /// The batchers of holds sent together ([`crate::batch`]); `None` with
    /// `wait_replicas` (each hold waits for its own `WAIT`) or with
    /// `SLUICE_HOLD_BATCH=0` in the environment (for a before and after
    /// with one build).
    hold_batchers: Option<std::sync::Arc<HoldBatchers>>,
}

/// A hold for [`RedisInventory::hold_raw`]: `suffix` the new hold's (22
/// base64url characters), `named` the hold a REDIRECT named.
#[cfg(feature = "test-util")]
#[derive(Clone, Debug)]
pub struct RawHold {
    pub visitor: String,
    pub qty: u32,
    pub items: Option<Vec<Item>>,
    pub idempotency_key: Option<String>,
    pub suffix: String,
    pub named: Option<String>,
}

/// One hold as hold.lua takes it: its KEYS[8..] (the new hold's hash, the
/// visitor's index, then with an idempotency key its key and the hold a
/// REDIRECT named), its quantity and its items' text.
struct HoldCall {
    keys: Vec<String>,
    qty: u32,
    items: Option<String>,
}

fn hold_keys(
    keys: &Keys,
    visitor: &str,
    idempotency_key: Option<&str>,
    suffix: &str,
    named: Option<&str>,
) -> Vec<String> {
    let mut k = Vec::with_capacity(4);
    k.push(keys.hold(suffix));
    k.push(keys.vholds(visitor));
    if let Some(key) = idempotency_key {
        k.push(keys.idem(visitor, key));
        if let Some(n) = named {
            k.push(keys.hold(n));
        }
    }
    k
}

/// How one event's batched holds reach Redis.
struct HoldStep {
    inv: RedisInventory,
    event: EventId,
    keys: Keys,
    shards: u32,
}

impl sluice_redis::batch::Step<HoldCall, Vec<Value>, ReservationError> for HoldStep {
    async fn one(&self, call: &HoldCall) -> Result<Vec<Value>> {
        let (v, _) = self
            .inv
            .hold_alone(&self.event, &self.keys, call, self.shards)
            .await?;
        Ok(v)
    }

    async fn many(&self, calls: &[&HoldCall]) -> Result<Vec<Result<Vec<Value>>>> {
        self.inv
            .hold_many(&self.event, &self.keys, calls, self.shards)
            .await
    }
}

type HoldBatcher = sluice_redis::batch::Batcher<HoldCall, Vec<Value>, ReservationError>;

/// The hold batchers: one per event, layout and thread, so a batch goes
/// out on the thread's own connection ([`ThreadConns`]).
#[derive(Default)]
struct HoldBatchers {
    map: parking_lot::Mutex<std::collections::HashMap<(std::thread::ThreadId, u32), EventBatchers>>,
    stats: std::sync::Arc<crate::batch::BatchStats>,
}

/// One thread's and layout's batchers, by event.
type EventBatchers = std::collections::HashMap<EventId, std::sync::Arc<HoldBatcher>>;

/// Batchers kept per thread and layout before idle ones are forgotten.
const HOLD_BATCHERS_KEPT: usize = 1024;

impl HoldBatchers {
    fn batcher(&self, event: &EventId, shards: u32) -> std::sync::Arc<HoldBatcher> {
        let mut map = self.map.lock();
        let events = map
            .entry((std::thread::current().id(), shards))
            .or_default();
        if let Some(b) = events.get(event) {
            return b.clone();
        }
        if events.len() >= HOLD_BATCHERS_KEPT {
            events.retain(|_, b| !b.idle());
        }
        let b = std::sync::Arc::new(HoldBatcher::new(
            self.stats.clone(),
            crate::batch::max_in_flight(),
        ));
        events.insert(event.clone(), b.clone());
        b
    }
}

/// The keys of one event. Made with `concat`, one allocation each: with
/// `format!` the keys of a hold cost some 8,000 instructions of the
/// gateway's 125,000 per hold (README, "A hold's side in the gateway").
#[derive(Clone)]
struct Keys {
    prefix: String,
}

impl Keys {
    fn new(event: &EventId) -> Self {
        Self {
            prefix: ["sluice:{", event.as_str(), "}:"].concat(),
        }
    }
    fn key(&self, name: &str) -> String {
        [self.prefix.as_str(), name].concat()
    }
    /// KEYS[1..7] of every script with common.lua.
    fn common(&self) -> [String; 7] {
        [
            self.key("stock"),
            self.key("meta"),
            self.key("deadlines"),
            self.key("visitors"),
            self.key("stream"),
            self.key("ledgered"),
            self.key("vcats"),
        ]
    }
    /// The load marker, `sluice:loaded:{ev}`: outside the event's prefix,
    /// in its slot.
    fn loaded(&self) -> String {
        let event = &self.prefix["sluice:".len()..self.prefix.len() - 1];
        ["sluice:loaded:", event].concat()
    }
    fn hold(&self, suffix: &str) -> String {
        [self.prefix.as_str(), "hold:", suffix].concat()
    }
    /// `{prefix}{kind}:{len}:{name}`: a name that carries its length, so
    /// that what follows it cannot run into it.
    fn sized(&self, kind: &str, name: &str) -> String {
        let mut len = itoa::Buffer::new();
        [
            self.prefix.as_str(),
            kind,
            len.format(name.len()),
            ":",
            name,
        ]
        .concat()
    }
    fn idem(&self, visitor: &str, key: &str) -> String {
        [self.sized("idem:", visitor).as_str(), ":", key].concat()
    }
    fn vholds(&self, visitor: &str) -> String {
        self.sized("vholds:", visitor)
    }
    /// shard.lua's KEYS[8..9]: transfers out, transfers landed.
    fn transfers(&self) -> [String; 2] {
        [self.key("xout"), self.key("xin")]
    }
    fn feed(&self, key: &str) -> String {
        self.sized("feed:", key)
    }
    fn pay(&self, payment_event_id: &str) -> String {
        self.sized("pay:", payment_event_id)
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// === reply parsing ===

fn protocol(what: &str, v: &Value) -> ReservationError {
    ReservationError::Protocol(format!("{what}: {v:?}"))
}

fn items(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(protocol("expected an array", &other)),
    }
}

/// hold.lua's answer for one hold, as fields: a table as it comes, and a
/// success (one bulk string `HELD qty deadline_ms available items`, so
/// the client parses one value instead of six) as the fields of
/// `{'HELD', qty, 'held', deadline_ms, available, items}`.
fn hold_reply(v: Value) -> Result<Vec<Value>> {
    let b = match v {
        Value::BulkString(b) => b,
        other => return items(other),
    };
    let bad = || ReservationError::Protocol(format!("hold: {}", String::from_utf8_lossy(&b)));
    let rest = b.strip_prefix(b"HELD ").ok_or_else(bad)?;
    let mut f = rest.splitn(4, |c| *c == b' ');
    let mut number = || {
        f.next()
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<i64>().ok())
            .map(Value::Int)
    };
    let (Some(qty), Some(deadline), Some(available)) = (number(), number(), number()) else {
        return Err(bad());
    };
    let items = f.next().ok_or_else(bad)?.to_vec();
    Ok(vec![
        Value::BulkString(b"HELD".to_vec()),
        qty,
        Value::BulkString(b"held".to_vec()),
        deadline,
        available,
        Value::BulkString(items),
    ])
}

fn text(v: Option<&Value>) -> Result<String> {
    match v {
        Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        Some(Value::Int(i)) => Ok(i.to_string()),
        Some(other) => Err(protocol("expected text", other)),
        None => Err(ReservationError::Protocol("reply too short".into())),
    }
}

fn int(v: Option<&Value>) -> Result<i64> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ReservationError::Protocol(format!("not an integer: {b:?}"))),
        Some(other) => Err(protocol("expected an integer", other)),
        None => Err(ReservationError::Protocol("reply too short".into())),
    }
}

fn uint(v: Option<&Value>) -> Result<u64> {
    Ok(u64::try_from(int(v)?.max(0)).unwrap_or(0))
}

fn u32_of(v: Option<&Value>) -> Result<u32> {
    Ok(u32::try_from(int(v)?.max(0)).unwrap_or(u32::MAX))
}

/// A reply's items text (absent or empty: none).
fn items_of(v: Option<&Value>) -> Result<Vec<Item>> {
    let t = match v {
        None | Some(Value::Nil) => return Ok(Vec::new()),
        v => text(v)?,
    };
    parse_items(&t).ok_or_else(|| ReservationError::Protocol(format!("bad items {t}")))
}

fn status(v: Option<&Value>) -> Result<HoldStatus> {
    let s = text(v)?;
    HoldStatus::parse(&s).ok_or_else(|| ReservationError::Protocol(format!("bad status {s}")))
}

// === impl RedisInventory ===

impl RedisInventory {
    /// Connects (within `config.timeout`) and prepares the scripts.
    pub async fn connect(config: &RedisConfig) -> Result<Self> {
        let conn = Self::open(config).await?;
        Self::refuse_an_old_server(&conn, config.timeout).await?;
        let url =
            RedisUrl::parse(&config.url).map_err(|e| ReservationError::Config(e.to_string()))?;
        let conns = ThreadConns::new(conn, &url, &config.tls, config.timeout);
        let durable = if config.wait_replicas > 0 {
            Some(Self::open(config).await?)
        } else {
            None
        };
        let durable_none = durable.is_none();
        Ok(Self {
            conns,
            durable,
            wait_replicas: config.wait_replicas,
            wait_timeout: config.wait_timeout,
            timeout: config.timeout,
            maxlen: config.stream_maxlen.max(1).to_string(),
            released_ms: config.retention.released_ms().max(1).to_string(),
            confirmed_ms: config.retention.confirmed_ms().max(1).to_string(),
            hold_batchers: (durable_none
                && std::env::var_os("SLUICE_HOLD_BATCH").is_none_or(|v| v != "0"))
            .then(Default::default),
            scripts: std::sync::Arc::new(Scripts {
                hold: Script::new(source::HOLD),
                release: Script::new(source::RELEASE),
                confirm: Script::new(source::CONFIRM),
                reap: Script::new(source::REAP),
                set_stock: Script::new(source::SET_STOCK),
                restore: Script::new(source::RESTORE),
                read: Script::new(source::READ),
                feed: Script::new(source::FEED),
                schedule_waves: Script::new(source::SCHEDULE_WAVES),
                shard: Script::new(source::SHARD),
                get_hold: Script::new(source::GET_HOLD),
            }),
        })
    }

    /// Refuses a server older than [`MIN_REDIS_MAJOR`] (by `INFO
    /// server`; on a Cluster its oldest node), at start rather than at
    /// the first hold. A server that does not answer `INFO` (renamed or
    /// denied by an ACL) is not refused: its scripts fail as they would.
    async fn refuse_an_old_server(conn: &RedisConn, timeout: Duration) -> Result<()> {
        let mut conn = conn.clone();
        let info = tokio::time::timeout(
            timeout,
            redis::cmd("INFO")
                .arg("server")
                .query_async::<Value>(&mut conn),
        )
        .await;
        if let Ok(Ok(info)) = info
            && let Some((major, version)) = lowest_version(&info)
            && major < MIN_REDIS_MAJOR
        {
            return Err(ReservationError::Config(format!(
                "Redis {version} is too old: sluice needs Redis {MIN_REDIS_MAJOR}.0 or later \
                 (hold.lua sets expiries with PEXPIRE NX and GT)"
            )));
        }
        Ok(())
    }

    /// One connection as `config.url` says ([`RedisUrl`]), within
    /// `config.timeout`.
    async fn open(config: &RedisConfig) -> Result<RedisConn> {
        let timeout = config.timeout;
        let url =
            RedisUrl::parse(&config.url).map_err(|e| ReservationError::Config(e.to_string()))?;
        tokio::time::timeout(timeout, url.connect_with(timeout, &config.tls))
            .await
            .map_err(|_| ReservationError::Timeout(timeout))?
            .map_err(ReservationError::from_redis)
    }

    /// Loads every script now (optional: `EVALSHA` falls back on its own).
    pub async fn load_scripts(&self) -> Result<()> {
        let s = &self.scripts;
        for script in [
            &s.hold,
            &s.release,
            &s.confirm,
            &s.reap,
            &s.set_stock,
            &s.restore,
            &s.read,
            &s.feed,
            &s.schedule_waves,
            &s.shard,
            &s.get_hold,
        ] {
            let mut conn = self.conns.get();
            self.bounded(script.prepare_invoke().load_async(&mut conn))
                .await?;
        }
        Ok(())
    }

    /// What the hold batchers sent (steps, holds), `None` when holds are
    /// sent one call each (module [`crate::batch`]).
    pub fn hold_batch_stats(&self) -> Option<std::sync::Arc<crate::batch::BatchStats>> {
        self.hold_batchers.as_ref().map(|b| b.stats.clone())
    }

    /// The SHA1 of the hold script (for `redis-benchmark EVALSHA`).
    pub fn hold_script_sha(&self) -> String {
        self.scripts.hold.get_hash().to_owned()
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ReservationError::Timeout(self.timeout))?
            .map_err(|e| {
                // The client's own response timeout (same bound) fires first.
                if e.is_timeout() {
                    ReservationError::Timeout(self.timeout)
                } else {
                    ReservationError::from_redis(e)
                }
            })
    }

    /// Runs a script with common.lua's KEYS 1–5 and ARGV 1–2 first.
    async fn run_common(
        &self,
        script: &Script,
        event: &EventId,
        keys: &Keys,
        extra_keys: &[String],
        extra_args: &[String],
    ) -> Result<Value> {
        let mut inv = script.prepare_invoke();
        for k in keys.common().iter().chain(extra_keys) {
            inv.key(k);
        }
        inv.arg(&self.maxlen).arg(event.as_str());
        for a in extra_args {
            inv.arg(a);
        }
        let mut conn = self.conns.get();
        self.bounded(inv.invoke_async::<Value>(&mut conn)).await
    }

    /// Like [`Self::run_common`], then `WAIT` for the configured replicas on
    /// the same connection, in one pipeline (module docs, "Durability").
    /// Returns the script's reply and how many replicas acknowledged it;
    /// without `wait_replicas` it is `run_common` and claims them all.
    async fn run_durable(
        &self,
        script: &Script,
        event: &EventId,
        keys: &Keys,
        extra_keys: &[String],
        extra_args: &[String],
    ) -> Result<(Value, u32)> {
        let Some(durable) = &self.durable else {
            let v = self
                .run_common(script, event, keys, extra_keys, extra_args)
                .await?;
            return Ok((v, self.wait_replicas));
        };
        let all_keys: Vec<String> = keys
            .common()
            .into_iter()
            .chain(extra_keys.iter().cloned())
            .collect();
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script.get_hash())
            .arg(all_keys.len())
            .arg(&all_keys)
            .arg(&self.maxlen)
            .arg(event.as_str())
            .arg(extra_args);
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .add_command(evalsha)
            .cmd("WAIT")
            .arg(self.wait_replicas)
            .arg(ms(self.wait_timeout));
        // A NOSCRIPT (a fresh or just-promoted server) ran nothing: load the
        // script on this connection and send the pipeline once more.
        for attempt in 0..2 {
            let mut conn = durable.clone();
            let mut replies: Vec<redis::RedisResult<Value>> =
                self.bounded(pipe.query_async(&mut conn)).await?;
            let waited = replies.pop();
            let reply = replies.pop();
            match reply {
                Some(Err(e))
                    if attempt == 0
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    let mut conn = durable.clone();
                    self.bounded(script.prepare_invoke().load_async(&mut conn))
                        .await?;
                }
                Some(Err(e)) => return Err(ReservationError::from_redis(e)),
                Some(Ok(v)) => {
                    let acked = match waited {
                        Some(Ok(w)) => u32::try_from(int(Some(&w))?.max(0)).unwrap_or(u32::MAX),
                        Some(Err(e)) => return Err(ReservationError::from_redis(e)),
                        None => return Err(ReservationError::Protocol("WAIT: no reply".into())),
                    };
                    return Ok((v, acked));
                }
                None => break,
            }
        }
        Err(ReservationError::Protocol(
            "script and WAIT: no reply".into(),
        ))
    }

    /// The error of a write `acked` replicas acknowledged, if too few did.
    fn lagged(&self, acked: u32) -> Option<ReservationError> {
        (acked < self.wait_replicas).then_some(ReservationError::NotReplicated {
            wanted: self.wait_replicas,
            acked,
        })
    }

    /// One hold of hold.lua: a new hold under `suffix`, or the replay of
    /// `named` (the hold the idempotency key named in a REDIRECT). Sent
    /// with the holds of the same event arriving meanwhile when batching
    /// is on ([`crate::batch`]), alone otherwise.
    #[allow(clippy::too_many_arguments)]
    async fn hold_once(
        &self,
        event: &EventId,
        keys: &Keys,
        visitor: &str,
        qty: u32,
        lines: Option<&[Item]>,
        idempotency_key: Option<&str>,
        suffix: &str,
        named: Option<&str>,
        shards: u32,
    ) -> Result<(Vec<Value>, u32)> {
        let call = HoldCall {
            keys: hold_keys(keys, visitor, idempotency_key, suffix, named),
            qty,
            items: lines.map(items_text),
        };
        match &self.hold_batchers {
            Some(b) => {
                let v = b
                    .batcher(event, shards)
                    .submit(call, || HoldStep {
                        inv: self.clone(),
                        event: event.clone(),
                        keys: keys.clone(),
                        shards,
                    })
                    .await?;
                Ok((v, self.wait_replicas))
            }
            None => self.hold_alone(event, keys, &call, shards).await,
        }
    }

    /// hold.lua's call for one hold, its reply and the replicas that
    /// acknowledged it.
    async fn hold_alone(
        &self,
        event: &EventId,
        keys: &Keys,
        call: &HoldCall,
        shards: u32,
    ) -> Result<(Vec<Value>, u32)> {
        // The suffixes and the visitor travel in KEYS only.
        let args = [
            itoa::Buffer::new().format(call.qty).to_owned(),
            itoa::Buffer::new().format(LAZY_REAP_MAX).to_owned(),
            itoa::Buffer::new().format(ms(IDEMPOTENCY_TTL)).to_owned(),
            self.released_ms.clone(),
            if call.items.is_some() { "i" } else { "q" }.to_owned(),
            call.items.clone().unwrap_or_default(),
            itoa::Buffer::new().format(shards).to_owned(),
        ];
        let (v, acked) = self
            .run_durable(&self.scripts.hold, event, keys, &call.keys, &args)
            .await?;
        Ok((hold_reply(v)?, acked))
    }

    /// hold.lua's mode `many`: the holds of `calls` one after the other in
    /// one call, one reply each.
    async fn hold_many(
        &self,
        event: &EventId,
        keys: &Keys,
        calls: &[&HoldCall],
        shards: u32,
    ) -> Result<Vec<Result<Vec<Value>>>> {
        let mut extra = Vec::with_capacity(calls.len() * 2);
        let mut args = Vec::with_capacity(7 + calls.len() * 4);
        args.extend([
            "many".to_owned(),
            itoa::Buffer::new().format(LAZY_REAP_MAX).to_owned(),
            itoa::Buffer::new().format(ms(IDEMPOTENCY_TTL)).to_owned(),
            self.released_ms.clone(),
            itoa::Buffer::new().format(calls.len()).to_owned(),
            String::new(),
            itoa::Buffer::new().format(shards).to_owned(),
        ]);
        for c in calls {
            extra.extend(c.keys.iter().cloned());
            args.push(itoa::Buffer::new().format(c.qty).to_owned());
            args.push(if c.items.is_some() { "i" } else { "q" }.to_owned());
            args.push(c.items.clone().unwrap_or_default());
            args.push(itoa::Buffer::new().format(c.keys.len()).to_owned());
        }
        let replies = items(
            self.run_common(&self.scripts.hold, event, keys, &extra, &args)
                .await?,
        )?;
        Ok(replies
            .into_iter()
            .map(|r| {
                let r = hold_reply(r)?;
                if matches!(r.first(), Some(Value::BulkString(b)) if b == b"ERROR") {
                    return Err(ReservationError::Protocol(format!(
                        "hold: {}",
                        text(r.get(1)).unwrap_or_default()
                    )));
                }
                Ok(r)
            })
            .collect())
    }

    /// One call of set_stock.lua; `only_new` for [`Inventory::load_if_new`].
    async fn run_set_stock(
        &self,
        event: &EventId,
        spec: &StockSpec,
        cats: &[CategorySpec],
        only_new: bool,
    ) -> Result<Vec<Value>> {
        let keys = Keys::new(event);
        // An event in the registry from before load markers existed was
        // had by this store: a missing marker then still means "lost".
        // (Checked before the script: membership only ever appears, so a
        // stale "no" can only be a new event.)
        let known = if only_new {
            let mut conn = self.conns.get();
            self.bounded(
                redis::cmd("SISMEMBER")
                    .arg(EVENTS_KEY)
                    .arg(event.as_str())
                    .query_async::<i64>(&mut conn),
            )
            .await?
                == 1
        } else {
            false
        };
        let mut args = vec![
            spec.total.to_string(),
            spec.cart_limit.to_string(),
            spec.hold_ttl_ms().to_string(),
            spec.version.to_string(),
            spec.room.clone(),
            if only_new { "1" } else { "0" }.to_owned(),
            if known { "1" } else { "0" }.to_owned(),
            cats.len().to_string(),
        ];
        for c in cats {
            args.push(c.id.to_string());
            args.push(c.total.to_string());
            args.push(c.cart_limit.unwrap_or(0).to_string());
        }
        items(
            self.run_common(
                &self.scripts.set_stock,
                event,
                &keys,
                &[keys.loaded()],
                &args,
            )
            .await?,
        )
    }

    /// Adds `event` to the registry the reapers walk ([`EVENTS_KEY`]).
    async fn register(&self, event: &EventId) -> Result<()> {
        let mut conn = self.conns.get();
        self.bounded(
            redis::cmd("SADD")
                .arg(EVENTS_KEY)
                .arg(event.as_str())
                .query_async::<i64>(&mut conn),
        )
        .await?;
        Ok(())
    }

    /// Deletes every key of `event` (`sluice:{ev}:*`), leaving its load
    /// marker: what an eviction or a partial failover does (for the
    /// store-loss tests). `what` narrows it: `"counters"` deletes only the
    /// stock counter and the settings, `"stream"` only the stream.
    #[cfg(feature = "test-util")]
    pub async fn lose_event(&self, event: &EventId, what: &str) -> Result<usize> {
        let keys = Keys::new(event);
        let mut conn = self.conns.get();
        let victims: Vec<String> = match what {
            "counters" => vec![keys.key("stock"), keys.key("meta")],
            "stream" => vec![keys.key("stream")],
            _ => {
                let pattern = format!("sluice:{{{event}}}:*");
                self.bounded(
                    redis::cmd("KEYS")
                        .arg(pattern)
                        .query_async::<Vec<String>>(&mut conn),
                )
                .await?
            }
        };
        if victims.is_empty() {
            return Ok(0);
        }
        let n: i64 = self
            .bounded(redis::cmd("DEL").arg(&victims).query_async(&mut conn))
            .await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// `(available, held, confirmed)` as stored (one `MULTI`), without
    /// reaping anything: lapsed holds no script has met still count as
    /// held (for tests comparing a store with a model step by step).
    /// `None` when the stock counter or the settings are missing.
    pub async fn stored_counters(&self, event: &EventId) -> Result<Option<(u64, u64, u64)>> {
        let keys = Keys::new(event);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("GET")
            .arg(keys.key("stock"))
            .cmd("HMGET")
            .arg(keys.key("meta"))
            .arg("held")
            .arg("confirmed");
        let mut conn = self.conns.get();
        let (stock, meta): (Option<u64>, (Option<u64>, Option<u64>)) =
            self.bounded(pipe.query_async(&mut conn)).await?;
        Ok(match (stock, meta) {
            (Some(a), (Some(h), Some(c))) => Some((a, h, c)),
            _ => None,
        })
    }

    /// hold.lua's answers to `holds`, sent in one call of its mode `many`
    /// (`together`) or one call each, in order, on a plain event: each as
    /// text, the deadline left out (it differs with the time of the call).
    /// For the check that a batch answers what its holds one after the
    /// other would (`tests/redis.rs`).
    #[cfg(feature = "test-util")]
    pub async fn hold_raw(
        &self,
        event: &EventId,
        holds: &[RawHold],
        together: bool,
    ) -> Result<Vec<Result<Vec<String>>>> {
        let keys = Keys::new(event);
        let calls: Vec<HoldCall> = holds
            .iter()
            .map(|h| HoldCall {
                keys: hold_keys(
                    &keys,
                    &h.visitor,
                    h.idempotency_key.as_deref(),
                    &h.suffix,
                    h.named.as_deref(),
                ),
                qty: h.qty,
                items: h.items.as_deref().map(items_text),
            })
            .collect();
        let replies = if together {
            let refs: Vec<&HoldCall> = calls.iter().collect();
            self.hold_many(event, &keys, &refs, 1).await?
        } else {
            let mut out = Vec::new();
            for c in &calls {
                out.push(self.hold_alone(event, &keys, c, 1).await.map(|(v, _)| v));
            }
            out
        };
        Ok(replies
            .into_iter()
            .map(|r| {
                r.map(|r| {
                    let held = matches!(r.first(), Some(Value::BulkString(b)) if b == b"HELD" || b == b"REPLAYED");
                    r.iter()
                        .enumerate()
                        .filter(|(i, _)| !(held && *i == 3))
                        .map(|(_, v)| text(Some(v)).unwrap_or_else(|_| format!("{v:?}")))
                        .collect()
                })
            })
            .collect())
    }

    /// Takes back a hold `WAIT` could not vouch for, and its idempotency key
    /// (a retry then takes a new hold instead of replaying this one).
    async fn unwind_hold(
        &self,
        event: &EventId,
        keys: &Keys,
        visitor: &str,
        idempotency_key: Option<&str>,
        suffix: &str,
    ) -> Result<()> {
        self.run_common(
            &self.scripts.release,
            event,
            keys,
            &[keys.hold(suffix), keys.vholds(visitor)],
            &[visitor.to_owned(), self.released_ms.clone()],
        )
        .await?;
        if let Some(k) = idempotency_key {
            let mut conn = self.conns.get();
            self.bounded(
                redis::cmd("DEL")
                    .arg(keys.idem(visitor, k))
                    .query_async::<i64>(&mut conn),
            )
            .await?;
        }
        Ok(())
    }
}

impl RedisInventory {
    /// `hold` (`items` = `None`) and `hold_items` (`qty` = their sum).
    async fn hold_any(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        items: Option<&[Item]>,
        idempotency_key: Option<&str>,
        shards: u32,
    ) -> Result<HoldOutcome> {
        let keys = Keys::new(event);
        // A new hold always gets a fresh suffix; a REDIRECT names the hold
        // an idempotency key already points to, replayed on the next call
        // (or, when that hold is gone, replaced by a new one under the
        // fresh suffix). It can only repeat if the key is rewritten in
        // between (another request took it), so a few rounds are plenty.
        let suffix = HoldId::generate(event).suffix().to_owned();
        let mut named: Option<String> = None;
        let mut r = Vec::new();
        let mut acked = 0;
        for _ in 0..4 {
            (r, acked) = self
                .hold_once(
                    event,
                    &keys,
                    visitor,
                    qty,
                    items,
                    idempotency_key,
                    &suffix,
                    named.as_deref(),
                    shards,
                )
                .await?;
            if text(r.first())? == "REDIRECT" {
                named = Some(text(r.get(1))?);
                continue;
            }
            break;
        }
        let view = |r: &[Value], suffix: &str| -> Result<HoldView> {
            let deadline = uint(r.get(3))?;
            Ok(HoldView {
                hold_id: HoldId::from_parts(event, suffix),
                event: event.clone(),
                qty: u32_of(r.get(1))?,
                status: status(r.get(2))?,
                expires_at: deadline / 1000,
                expires_at_ms: deadline,
                available: uint(r.get(4))?,
                visitor: visitor.to_owned(),
                items: items_of(r.get(5))?,
            })
        };
        let answer = text(r.first())?;
        if let Some(lag) = self.lagged(acked) {
            match answer.as_str() {
                "HELD" => {
                    self.unwind_hold(event, &keys, visitor, idempotency_key, &suffix)
                        .await?;
                    return Err(lag);
                }
                "REPLAYED" => return Err(lag),
                // Nothing was written: the answer stands.
                _ => {}
            }
        }
        Ok(match answer.as_str() {
            "HELD" => HoldOutcome::Held(view(&r, &suffix)?),
            "REPLAYED" => HoldOutcome::Replayed(view(&r, named.as_deref().unwrap_or(&suffix))?),
            "NOT_READY" => HoldOutcome::NotReady,
            "RESHARDED" => HoldOutcome::Resharded {
                shards: text(r.get(1))?.parse().unwrap_or(0),
            },
            "INVALID_QTY" => HoldOutcome::InvalidQuantity {
                limit: u32_of(r.get(1))?,
            },
            "CART_LIMIT" => HoldOutcome::CartLimitExceeded {
                limit: u32_of(r.get(1))?,
                held: u32_of(r.get(2))?,
            },
            "SOLD_OUT" => HoldOutcome::SoldOut {
                available: uint(r.get(1))?,
            },
            "ITEMS_REQUIRED" => HoldOutcome::ItemsRequired,
            "CATEGORY_NOT_FOUND" => HoldOutcome::CategoryNotFound {
                category: text(r.get(1))?,
            },
            "CATEGORY_CART_LIMIT" => HoldOutcome::CategoryCartLimitExceeded {
                category: text(r.get(1))?,
                limit: u32_of(r.get(2))?,
                held: u32_of(r.get(3))?,
            },
            "CATEGORY_SOLD_OUT" => HoldOutcome::CategorySoldOut {
                category: text(r.get(1))?,
                available: uint(r.get(2))?,
            },
            other => return Err(ReservationError::Protocol(format!("hold: {other}"))),
        })
    }
}

/// The per-category tail of restore.lua's ARGV: the categories with their
/// counters, then the category carts.
fn restore_category_args(record: &EventRecord, cats: &CategoryRecord, args: &mut Vec<String>) {
    args.push(cats.categories.len().to_string());
    for c in &cats.categories {
        let (held, confirmed) = cats.committed(record, &c.id);
        args.push(c.id.to_string());
        args.push(c.total.to_string());
        args.push(c.cart_limit.unwrap_or(0).to_string());
        args.push(c.total.saturating_sub(held + confirmed).to_string());
        args.push(held.to_string());
        args.push(confirmed.to_string());
    }
    let mut carts: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for h in &record.open_holds {
        for i in cats
            .hold_items
            .get(h.hold_id.as_str())
            .into_iter()
            .flatten()
        {
            *carts
                .entry(format!("{}:{}", i.category, h.visitor))
                .or_default() += u64::from(i.qty);
        }
    }
    for (visitor, category, qty) in &cats.confirmed {
        *carts.entry(format!("{category}:{visitor}")).or_default() += qty;
    }
    carts.retain(|_, q| *q > 0);
    args.push(carts.len().to_string());
    for (field, qty) in carts {
        args.push(field);
        args.push(qty.to_string());
    }
}

/// feed.lua's extra KEYS and its ARGV for `row` (already checked with
/// [`StockRow::problem`]).
fn feed_call(keys: &Keys, row: &StockRow) -> (Vec<String>, [String; 7]) {
    let mut extra = vec![keys.loaded()];
    let category = row
        .category
        .as_ref()
        .map(|c| c.to_string())
        .unwrap_or_default();
    let args = match &row.change {
        StockChange::Delta { delta, key } => {
            extra.push(keys.feed(key));
            [
                "d".to_owned(),
                category,
                delta.to_string(),
                String::new(),
                ms(FEED_KEY_TTL).to_string(),
                key.clone(),
                MAX_TOTAL.to_string(),
            ]
        }
        StockChange::Snapshot { total, version } => [
            "s".to_owned(),
            category,
            total.to_string(),
            version.to_string(),
            String::new(),
            String::new(),
            MAX_TOTAL.to_string(),
        ],
    };
    (extra, args)
}

/// feed.lua's reply as a [`FeedOutcome`].
fn feed_outcome(reply: Value) -> Result<FeedOutcome> {
    let r = items(reply)?;
    let applied = |v: Option<&Value>| -> Result<crate::FeedApplied> {
        let t = text(v)?;
        parse_key_record(&t)
            .map(|(_, _, a)| a)
            .ok_or_else(|| ReservationError::Protocol(format!("feed record {t}")))
    };
    Ok(match text(r.first())?.as_str() {
        "APPLIED" => FeedOutcome::Applied(applied(r.get(1))?),
        "REPLAYED" => FeedOutcome::Replayed(applied(r.get(1))?),
        "NOT_READY" => FeedOutcome::NotReady,
        "KEY_REUSED" => FeedOutcome::KeyReused,
        "CATEGORY_REQUIRED" => FeedOutcome::CategoryRequired,
        "CATEGORY_NOT_FOUND" => FeedOutcome::CategoryNotFound {
            category: text(r.get(1))?,
        },
        "STOCK_NEGATIVE" => FeedOutcome::StockNegative {
            available: uint(r.get(1))?,
        },
        "STALE" => FeedOutcome::Stale {
            current_version: text(r.get(1))?.parse().unwrap_or(0),
        },
        "BELOW" => FeedOutcome::BelowCommitted {
            held: uint(r.get(1))?,
            confirmed: uint(r.get(2))?,
        },
        "CAT_BELOW" => FeedOutcome::CategoryBelowCommitted {
            category: text(r.get(1))?,
            held: uint(r.get(2))?,
            confirmed: uint(r.get(3))?,
        },
        "INVALID" => FeedOutcome::Invalid {
            reason: "total above 2^53",
        },
        other => return Err(ReservationError::Protocol(format!("feed: {other}"))),
    })
}

impl RedisInventory {
    /// Applies feed rows of one event in order, each its own call of
    /// feed.lua (each atomic, as [`Inventory::apply_stock`]), sent as one
    /// pipeline on one connection: one round trip for the lot instead of
    /// one per row, and Redis still runs other clients' commands between
    /// the rows' scripts. The answers are in the rows' order. An error
    /// (the connection lost, a timeout) may come after some rows were
    /// applied: rows are idempotent (a delta's key replays, a snapshot's
    /// version is stale), so the caller retries the batch whole.
    pub async fn apply_stock_batch(
        &self,
        event: &EventId,
        rows: &[StockRow],
    ) -> Result<Vec<FeedOutcome>> {
        let mut out: Vec<Option<FeedOutcome>> = rows
            .iter()
            .map(|r| r.problem().map(|reason| FeedOutcome::Invalid { reason }))
            .collect();
        let keys = Keys::new(event);
        let common = keys.common();
        // Rows still to send; after a NOSCRIPT (a fresh or just-promoted
        // server ran none of them from there on), the rest once more.
        let mut todo: Vec<usize> = (0..rows.len()).filter(|i| out[*i].is_none()).collect();
        for attempt in 0..2 {
            if todo.is_empty() {
                break;
            }
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in &todo {
                let (extra, args) = feed_call(&keys, &rows[i]);
                pipe.cmd("EVALSHA")
                    .arg(self.scripts.feed.get_hash())
                    .arg(common.len() + extra.len())
                    .arg(&common)
                    .arg(&extra)
                    .arg(&self.maxlen)
                    .arg(event.as_str())
                    .arg(&args[..]);
            }
            let mut conn = self.conns.get();
            let replies: Vec<redis::RedisResult<Value>> =
                self.bounded(pipe.query_async(&mut conn)).await?;
            if replies.len() != todo.len() {
                return Err(ReservationError::Protocol(format!(
                    "feed batch: {} replies to {} rows",
                    replies.len(),
                    todo.len()
                )));
            }
            let mut rest = Vec::new();
            for (&i, reply) in todo.iter().zip(replies) {
                match reply {
                    Ok(v) if rest.is_empty() => out[i] = Some(feed_outcome(v)?),
                    // After a NOSCRIPT, later rows are sent again even if
                    // they ran (another client loaded the script meanwhile):
                    // they replay, and keep their order.
                    Ok(_) => rest.push(i),
                    Err(e)
                        if attempt == 0
                            && e.kind()
                                == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        rest.push(i);
                    }
                    Err(e) => return Err(ReservationError::from_redis(e)),
                }
            }
            if !rest.is_empty() {
                let mut conn = self.conns.get();
                self.bounded(self.scripts.feed.prepare_invoke().load_async(&mut conn))
                    .await?;
            }
            todo = rest;
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| ReservationError::Protocol("feed batch: no answer".into())))
            .collect()
    }
}

impl Inventory for RedisInventory {
    async fn apply_stock(&self, event: &EventId, row: &StockRow) -> Result<FeedOutcome> {
        if let Some(reason) = row.problem() {
            return Ok(FeedOutcome::Invalid { reason });
        }
        let keys = Keys::new(event);
        let (extra, args) = feed_call(&keys, row);
        feed_outcome(
            self.run_common(&self.scripts.feed, event, &keys, &extra, &args)
                .await?,
        )
    }

    async fn hold_in_layout(
        &self,
        event: &EventId,
        visitor: &str,
        qty: u32,
        idempotency_key: Option<&str>,
        shards: u32,
    ) -> Result<HoldOutcome> {
        self.hold_any(event, visitor, qty, None, idempotency_key, shards)
            .await
    }

    async fn set_layout(&self, event: &EventId, layout: &ShardLayout) -> Result<LayoutOutcome> {
        let keys = Keys::new(event);
        let args = [
            "layout".to_owned(),
            layout.shards.to_string(),
            match layout.shard_total {
                ShardTotal::Keep => String::new(),
                ShardTotal::Clear => "-".to_owned(),
                ShardTotal::Set(t) => t.to_string(),
            },
            layout.cart_limit.to_string(),
            layout.hold_ttl_ms.to_string(),
            layout.room.clone(),
            layout.version.map(|v| v.to_string()).unwrap_or_default(),
            if layout.require_idle { "1" } else { "0" }.to_owned(),
        ];
        let r = items(
            self.run_common(&self.scripts.shard, event, &keys, &keys.transfers(), &args)
                .await?,
        )?;
        Ok(match text(r.first())?.as_str() {
            "SET" => LayoutOutcome::Set,
            "NOT_READY" => LayoutOutcome::NotReady,
            "STALE" => LayoutOutcome::Stale {
                current_version: text(r.get(1))?.parse().unwrap_or(0),
            },
            "BUSY" => LayoutOutcome::Busy {
                held: uint(r.get(1))?,
                confirmed: uint(r.get(2))?,
            },
            other => return Err(ReservationError::Protocol(format!("layout: {other}"))),
        })
    }

    async fn transfer_out(
        &self,
        from: &EventId,
        to: &EventId,
        id: &str,
        max: u64,
    ) -> Result<TransferOut> {
        let keys = Keys::new(from);
        let args = [
            "out".to_owned(),
            id.to_owned(),
            to.to_string(),
            max.to_string(),
        ];
        let r = items(
            self.run_common(&self.scripts.shard, from, &keys, &keys.transfers(), &args)
                .await?,
        )?;
        Ok(match text(r.first())?.as_str() {
            "MOVED" => TransferOut::Moved {
                qty: uint(r.get(1))?,
                available: uint(r.get(2))?,
            },
            "NOT_READY" => TransferOut::NotReady,
            "FROZEN" => TransferOut::Frozen,
            other => return Err(ReservationError::Protocol(format!("transfer out: {other}"))),
        })
    }

    async fn transfer_in(
        &self,
        to: &EventId,
        _from: &EventId,
        id: &str,
        qty: u64,
    ) -> Result<TransferIn> {
        let keys = Keys::new(to);
        let args = [
            "in".to_owned(),
            id.to_owned(),
            qty.to_string(),
            ms(FEED_KEY_TTL).to_string(),
        ];
        let r = items(
            self.run_common(&self.scripts.shard, to, &keys, &keys.transfers(), &args)
                .await?,
        )?;
        Ok(match text(r.first())?.as_str() {
            "APPLIED" => TransferIn::Applied {
                available: uint(r.get(1))?,
            },
            "REPLAYED" => TransferIn::Replayed,
            "NOT_READY" => TransferIn::NotReady,
            "FROZEN" => TransferIn::Frozen,
            other => return Err(ReservationError::Protocol(format!("transfer in: {other}"))),
        })
    }

    async fn transfer_done(&self, from: &EventId, id: &str) -> Result<()> {
        let keys = Keys::new(from);
        self.run_common(
            &self.scripts.shard,
            from,
            &keys,
            &keys.transfers(),
            &["done".to_owned(), id.to_owned()],
        )
        .await?;
        Ok(())
    }

    async fn pending_transfers(&self, from: &EventId) -> Result<Vec<PendingTransfer>> {
        let keys = Keys::new(from);
        let r = items(
            self.run_common(
                &self.scripts.shard,
                from,
                &keys,
                &keys.transfers(),
                &["list".to_owned()],
            )
            .await?,
        )?;
        let now = uint(r.first())?;
        let mut out = Vec::new();
        for pair in r.get(1..).unwrap_or_default().chunks(2) {
            let id = text(pair.first())?;
            let rec = text(pair.get(1))?;
            let mut f = rec.split('|');
            let (Some(to), Some(qty), Some(at)) = (f.next(), f.next(), f.next()) else {
                return Err(ReservationError::Protocol(format!("transfer {id}: {rec}")));
            };
            let (Some(to), Ok(qty), Ok(at)) = (EventId::parse(to), qty.parse(), at.parse::<u64>())
            else {
                return Err(ReservationError::Protocol(format!("transfer {id}: {rec}")));
            };
            out.push(PendingTransfer {
                id,
                to,
                qty,
                age_ms: now.saturating_sub(at),
            });
        }
        Ok(out)
    }

    async fn hold_items(
        &self,
        event: &EventId,
        visitor: &str,
        items: &[Item],
        idempotency_key: Option<&str>,
    ) -> Result<HoldOutcome> {
        match crate::items_precheck(items) {
            Err(refused) => Ok(*refused),
            Ok(qty) => {
                self.hold_any(event, visitor, qty, Some(items), idempotency_key, 1)
                    .await
            }
        }
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
        let r = self.run_set_stock(event, spec, cats, false).await?;
        let outcome = match text(r.first())?.as_str() {
            "CAT_BELOW" => SetStockOutcome::CategoryBelowCommitted {
                category: text(r.get(1))?,
                held: uint(r.get(2))?,
                confirmed: uint(r.get(3))?,
            },
            "STALE" => SetStockOutcome::Stale {
                current_version: text(r.get(1))?.parse().unwrap_or(0),
            },
            "BELOW" => SetStockOutcome::BelowCommitted {
                held: uint(r.get(1))?,
                confirmed: uint(r.get(2))?,
            },
            "CREATED" => SetStockOutcome::Created {
                available: uint(r.get(1))?,
            },
            "RECREATED" => SetStockOutcome::Recreated {
                available: uint(r.get(1))?,
                lost_version: text(r.get(2))?.parse().unwrap_or(0),
            },
            "UPDATED" => SetStockOutcome::Updated {
                available: uint(r.get(1))?,
            },
            other => return Err(ReservationError::Protocol(format!("set_stock: {other}"))),
        };
        if matches!(
            outcome,
            SetStockOutcome::Created { .. }
                | SetStockOutcome::Recreated { .. }
                | SetStockOutcome::Updated { .. }
        ) {
            self.register(event).await?;
        }
        Ok(outcome)
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
        let r = self.run_set_stock(event, spec, cats, true).await?;
        let outcome = match text(r.first())?.as_str() {
            "PRESENT" => LoadOutcome::Present,
            "LOST" => LoadOutcome::Lost {
                last_version: text(r.get(1))?.parse().unwrap_or(0),
            },
            "CREATED" => LoadOutcome::Loaded {
                available: uint(r.get(1))?,
            },
            other => return Err(ReservationError::Protocol(format!("load_if_new: {other}"))),
        };
        if matches!(outcome, LoadOutcome::Loaded { .. }) {
            self.register(event).await?;
        }
        Ok(outcome)
    }

    async fn loaded_version(&self, event: &EventId) -> Result<Option<u64>> {
        let keys = Keys::new(event);
        let mut conn = self.conns.get();
        let v: Option<String> = self
            .bounded(redis::cmd("GET").arg(keys.loaded()).query_async(&mut conn))
            .await?;
        Ok(v.map(|v| v.parse().unwrap_or(0)))
    }

    async fn remember_loaded(&self, event: &EventId, version: u64) -> Result<()> {
        let keys = Keys::new(event);
        let mut conn = self.conns.get();
        // Raise only: a marker never goes down (versions compared as
        // numbers; they are canonical u64 text).
        let script = redis::Script::new(
            "local m = redis.call('GET', KEYS[1]) \
             if not m or #m < #ARGV[1] or (#m == #ARGV[1] and m < ARGV[1]) then \
               redis.call('SET', KEYS[1], ARGV[1]) end return 1",
        );
        let mut inv = script.prepare_invoke();
        inv.key(keys.loaded()).arg(version.to_string());
        self.bounded(inv.invoke_async::<i64>(&mut conn)).await?;
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
        let items_of = |id: &HoldId| {
            cats.hold_items
                .get(id.as_str())
                .map(|i| items_text(i))
                .unwrap_or_default()
        };
        let keys = Keys::new(event);
        let (available, held, confirmed) =
            (record.available(), record.held(), record.confirmed_total());
        let mut extra = vec![keys.loaded()];
        let mut args = vec![
            record.total.to_string(),
            spec.cart_limit.to_string(),
            spec.hold_ttl_ms().to_string(),
            record.version.max(spec.version).to_string(),
            spec.room.clone(),
            available.to_string(),
            held.to_string(),
            confirmed.to_string(),
            self.released_ms.clone(),
            record.open_holds.len().to_string(),
        ];
        let mut carts: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
        for h in &record.open_holds {
            extra.push(keys.hold(h.hold_id.suffix()));
            extra.push(keys.vholds(&h.visitor));
            args.push(h.visitor.clone());
            args.push(h.qty.to_string());
            args.push(h.expires_at_ms.to_string());
            args.push(items_of(&h.hold_id));
            *carts.entry(&h.visitor).or_default() += u64::from(h.qty);
        }
        for (visitor, qty) in &record.confirmed {
            *carts.entry(visitor).or_default() += qty;
        }
        carts.retain(|_, q| *q > 0);
        args.push(carts.len().to_string());
        for (visitor, qty) in carts {
            args.push(visitor.to_owned());
            args.push(qty.to_string());
        }
        args.push(self.confirmed_ms.clone());
        args.push(record.confirmed_holds.len().to_string());
        for h in &record.confirmed_holds {
            extra.push(keys.hold(h.hold_id.suffix()));
            args.push(h.visitor.clone());
            args.push(h.qty.to_string());
            args.push(items_of(&h.hold_id));
        }
        restore_category_args(record, cats, &mut args);
        let r = items(
            self.run_common(&self.scripts.restore, event, &keys, &extra, &args)
                .await?,
        )?;
        let outcome = match text(r.first())?.as_str() {
            "PRESENT" => RestoreOutcome::Present,
            "RESTORED" => RestoreOutcome::Restored {
                available: uint(r.get(1))?,
                held: uint(r.get(2))?,
                confirmed: uint(r.get(3))?,
            },
            other => return Err(ReservationError::Protocol(format!("restore: {other}"))),
        };
        if matches!(outcome, RestoreOutcome::Restored { .. }) {
            self.register(event).await?;
        }
        Ok(outcome)
    }

    async fn get_hold(&self, hold_id: &HoldId, visitor: &str) -> Result<Option<HoldView>> {
        let event = hold_id.event();
        let keys = Keys::new(&event);
        let mut inv = self.scripts.get_hold.prepare_invoke();
        inv.key(keys.key("stock"))
            .key(keys.hold(hold_id.suffix()))
            .arg(visitor);
        let mut conn = self.conns.get();
        let r = items(self.bounded(inv.invoke_async::<Value>(&mut conn)).await?)?;
        if text(r.first())? != "FOUND" {
            return Ok(None);
        }
        let deadline = uint(r.get(3))?;
        Ok(Some(HoldView {
            hold_id: hold_id.clone(),
            event,
            qty: u32_of(r.get(1))?,
            status: status(r.get(2))?,
            expires_at: deadline / 1000,
            expires_at_ms: deadline,
            available: uint(r.get(4))?,
            visitor: visitor.to_owned(),
            items: items_of(r.get(5))?,
        }))
    }

    async fn release(&self, hold_id: &HoldId, visitor: &str) -> Result<ReleaseOutcome> {
        let event = hold_id.event();
        let keys = Keys::new(&event);
        let r = items(
            self.run_common(
                &self.scripts.release,
                &event,
                &keys,
                &[keys.hold(hold_id.suffix()), keys.vholds(visitor)],
                &[visitor.to_owned(), self.released_ms.clone()],
            )
            .await?,
        )?;
        Ok(match text(r.first())?.as_str() {
            "RELEASED" => ReleaseOutcome::Released,
            "ALREADY_RELEASED" => ReleaseOutcome::AlreadyReleased,
            "EXPIRED" => ReleaseOutcome::Expired,
            "CONFIRMED" => ReleaseOutcome::Confirmed,
            "NOT_FOUND" => ReleaseOutcome::NotFound,
            "NOT_READY" => ReleaseOutcome::NotReady,
            other => return Err(ReservationError::Protocol(format!("release: {other}"))),
        })
    }

    async fn confirm(
        &self,
        hold_id: &HoldId,
        payment_event_id: &str,
        succeeded: bool,
    ) -> Result<ConfirmOutcome> {
        let event = hold_id.event();
        let keys = Keys::new(&event);
        let suffix = hold_id.suffix();
        let (v, acked) = self
            .run_durable(
                &self.scripts.confirm,
                &event,
                &keys,
                &[keys.hold(suffix), keys.pay(payment_event_id)],
                &[
                    payment_event_id.to_owned(),
                    if succeeded { "1" } else { "0" }.to_owned(),
                    self.released_ms.clone(),
                    ms(PAYMENT_TTL).to_string(),
                    self.confirmed_ms.clone(),
                ],
            )
            .await?;
        let r = items(v)?;
        let answer = text(r.first())?;
        let outcome = ConfirmOutcome::parse(&answer)
            .ok_or_else(|| ReservationError::Protocol(format!("confirm: {answer}")))?;
        // Only a confirmation is worth waiting for: losing any other answer
        // cannot sell a unit twice (module docs, "Durability").
        if outcome == ConfirmOutcome::Confirmed
            && let Some(lag) = self.lagged(acked)
        {
            return Err(lag);
        }
        Ok(outcome)
    }

    async fn reap(&self, event: &EventId, max: usize) -> Result<usize> {
        let keys = Keys::new(event);
        let v = self
            .run_common(&self.scripts.reap, event, &keys, &[], &[max.to_string()])
            .await?;
        Ok(usize::try_from(int(Some(&v))?.max(0)).unwrap_or(0))
    }

    async fn read(&self, event: &EventId) -> Result<Option<EventState>> {
        let keys = Keys::new(event);
        // Each call reaps at most LAZY_REAP_MAX lapsed holds and answers
        // MORE while any is left; the state finally answered counts every
        // lapsed hold as expired. Every call makes progress, so the loop
        // ends once the lapsed holds are gone (a cap guards the impossible).
        let mut r = Vec::new();
        for _ in 0..1_000_000 {
            r = items(
                self.run_common(
                    &self.scripts.read,
                    event,
                    &keys,
                    &keys.transfers()[..1],
                    &[LAZY_REAP_MAX.to_string()],
                )
                .await?,
            )?;
            if text(r.first())? != "MORE" {
                break;
            }
        }
        if text(r.first())? != "STATE" {
            return Ok(None);
        }
        let total = uint(r.get(1))?;
        let hold_ttl_ms = uint(r.get(3))?;
        let held = uint(r.get(6))?;
        let confirmed = uint(r.get(7))?;
        let available = match r.get(8) {
            None | Some(Value::Nil) => None,
            v => Some(uint(v)?),
        };
        let waves_field = text(r.get(9))?;
        let waves = parse_waves(&waves_field)
            .ok_or_else(|| ReservationError::Protocol(format!("bad waves {waves_field}")))?;
        let shards = text(r.get(10))?.parse().unwrap_or(1);
        let shard_total = text(r.get(11))?.parse().ok();
        let in_transit = uint(r.get(12))?;
        let moves = uint(r.get(13))?;
        let categories = category_states(r.get(14..).unwrap_or_default())?;
        Ok(Some(EventState {
            event: event.clone(),
            total,
            available,
            held,
            confirmed,
            version: text(r.get(4))?.parse().unwrap_or(0),
            cart_limit: u32_of(r.get(2))?,
            hold_ttl_secs: hold_ttl_ms.div_ceil(1000),
            hold_ttl_ms,
            room: text(r.get(5))?,
            invariant_holds: available.is_some_and(|a| a + held + confirmed == total)
                && categories_add_up(&categories, total, available, held, confirmed),
            categories,
            waves,
            shards,
            shard_total,
            in_transit,
            moves,
            shard_states: Vec::new(),
        }))
    }

    async fn schedule_waves(&self, event: &EventId, waves: &[Wave]) -> Result<ScheduleOutcome> {
        if let Some(reason) = waves_problem(waves) {
            return Ok(ScheduleOutcome::Invalid { reason });
        }
        let mut waves = waves.to_vec();
        waves.sort();
        let keys = Keys::new(event);
        let mut args = vec![waves.len().to_string()];
        for w in &waves {
            args.push(w.at_ms.to_string());
            args.push(w.qty.to_string());
            args.push(
                w.category
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
            );
        }
        let r = items(
            self.run_common(&self.scripts.schedule_waves, event, &keys, &[], &args)
                .await?,
        )?;
        Ok(match text(r.first())?.as_str() {
            "NOT_READY" => ScheduleOutcome::NotReady,
            "IN_PAST" => ScheduleOutcome::WaveInPast {
                at_ms: uint(r.get(1))?,
                now_ms: uint(r.get(2))?,
            },
            "CATEGORY_REQUIRED" => ScheduleOutcome::Invalid {
                reason: "a wave of an event with categories names its category",
            },
            "CATEGORY_NOT_FOUND" => ScheduleOutcome::CategoryNotFound {
                category: text(r.get(1))?,
            },
            "TOO_BIG" => ScheduleOutcome::Invalid {
                reason: "the total with every wave above 2^53",
            },
            "SCHEDULED" => {
                let t = text(r.get(1))?;
                ScheduleOutcome::Scheduled {
                    waves: parse_waves(&t)
                        .ok_or_else(|| ReservationError::Protocol(format!("bad waves {t}")))?,
                }
            }
            other => {
                return Err(ReservationError::Protocol(format!(
                    "schedule_waves: {other}"
                )));
            }
        })
    }

    async fn events(&self) -> Result<Vec<EventId>> {
        let mut conn = self.conns.get();
        let names: Vec<String> = self
            .bounded(
                redis::cmd("SMEMBERS")
                    .arg(EVENTS_KEY)
                    .query_async(&mut conn),
            )
            .await?;
        let mut v: Vec<EventId> = names.iter().filter_map(|n| EventId::parse(n)).collect();
        v.sort();
        Ok(v)
    }

    async fn recent_transitions(&self, event: &EventId, n: usize) -> Result<Vec<Transition>> {
        let keys = Keys::new(event);
        let mut conn = self.conns.get();
        let v: Value = self
            .bounded(
                redis::cmd("XREVRANGE")
                    .arg(keys.key("stream"))
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(n)
                    .query_async(&mut conn),
            )
            .await?;
        let mut out = Vec::new();
        for entry in items(v)? {
            let parts = items(entry)?;
            let fields = match parts.into_iter().nth(1) {
                Some(Value::Array(f)) => f,
                Some(Value::Map(m)) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                other => return Err(ReservationError::Protocol(format!("stream: {other:?}"))),
            };
            let mut t = Transition {
                kind: TransitionKind::Stock,
                hold_id: String::new(),
                visitor: String::new(),
                qty: 0,
                available: 0,
                ts_ms: 0,
                payment_event_id: None,
                items: Vec::new(),
                categories: Vec::new(),
                reason: None,
                waves: Vec::new(),
            };
            for pair in fields.chunks(2) {
                let name = text(pair.first())?;
                let value = text(pair.get(1))?;
                match name.as_str() {
                    "type" => {
                        t.kind = TransitionKind::parse(&value).ok_or_else(|| {
                            ReservationError::Protocol(format!("stream type {value}"))
                        })?;
                    }
                    "hold_id" => t.hold_id = value,
                    "visitor" => t.visitor = value,
                    "qty" => t.qty = value.parse().unwrap_or(0),
                    "available" => t.available = value.parse().unwrap_or(0),
                    "ts_ms" => t.ts_ms = value.parse().unwrap_or(0),
                    "payment_event_id" => t.payment_event_id = Some(value),
                    "items" => t.items = parse_items(&value).unwrap_or_default(),
                    "categories" => t.categories = parse_categories(&value).unwrap_or_default(),
                    "reason" => t.reason = Some(value),
                    "waves" => t.waves = parse_waves(&value).unwrap_or_default(),
                    _ => {}
                }
            }
            // Only a stock entry's reason is part of a Transition (a
            // hold's `reason` field says why it ended: STREAM.md).
            if t.kind != TransitionKind::Stock {
                t.reason = None;
            }
            out.push(t);
        }
        out.reverse();
        Ok(out)
    }
}

/// read.lua's per-category tail: sextuples id, total, avail, held,
/// confirmed, limit.
fn category_states(tail: &[Value]) -> Result<Vec<CategoryState>> {
    tail.chunks(6)
        .map(|c| {
            let id = text(c.first())?;
            let limit = u32_of(c.get(5))?;
            Ok(CategoryState {
                id: CategoryId::parse(&id)
                    .ok_or_else(|| ReservationError::Protocol(format!("category {id}")))?,
                total: uint(c.get(1))?,
                available: uint(c.get(2))?,
                held: uint(c.get(3))?,
                confirmed: uint(c.get(4))?,
                cart_limit: (limit > 0).then_some(limit),
            })
        })
        .collect()
}

/// Each category's counters add up, and theirs to the event's.
fn categories_add_up(
    cats: &[CategoryState],
    total: u64,
    available: Option<u64>,
    held: u64,
    confirmed: u64,
) -> bool {
    if cats.is_empty() {
        return true;
    }
    let sum = |f: fn(&CategoryState) -> u64| cats.iter().map(f).sum::<u64>();
    cats.iter()
        .all(|c| c.available + c.held + c.confirmed == c.total)
        && sum(|c| c.total) == total
        && Some(sum(|c| c.available)) == available
        && sum(|c| c.held) == held
        && sum(|c| c.confirmed) == confirmed
}

/// The oldest Redis the scripts run on: hold.lua sets a visitor index's
/// expiry with `PEXPIRE … NX` and `… GT`, which came in Redis 7.0.
pub const MIN_REDIS_MAJOR: u32 = 7;

/// The lowest `redis_version` in an `INFO server` answer (a Cluster
/// answers with one text per node), as its major number and its text;
/// `None` when no version can be read.
fn lowest_version(info: &Value) -> Option<(u32, String)> {
    let mut lowest: Option<(u32, String)> = None;
    let mut texts = vec![info];
    while let Some(v) = texts.pop() {
        let text = match v {
            Value::BulkString(b) => String::from_utf8_lossy(b),
            Value::SimpleString(t) => t.as_str().into(),
            Value::VerbatimString { text, .. } => text.as_str().into(),
            Value::Array(items) | Value::Set(items) => {
                texts.extend(items);
                continue;
            }
            Value::Map(pairs) => {
                texts.extend(pairs.iter().map(|(_, v)| v));
                continue;
            }
            _ => continue,
        };
        for line in text.lines() {
            let Some(version) = line.trim().strip_prefix("redis_version:") else {
                continue;
            };
            let Some(major) = version
                .split('.')
                .next()
                .and_then(|m| m.parse::<u32>().ok())
            else {
                continue;
            };
            if lowest.as_ref().is_none_or(|(m, _)| major < *m) {
                lowest = Some((major, version.to_owned()));
            }
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_old_server_is_told_by_its_lowest_version() {
        let info = |v: &str| {
            Value::BulkString(
                format!("# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n").into_bytes(),
            )
        };
        assert_eq!(lowest_version(&info("7.0.15")), Some((7, "7.0.15".into())));
        assert_eq!(lowest_version(&info("6.2.14")), Some((6, "6.2.14".into())));
        assert_eq!(lowest_version(&info("10.0.1")), Some((10, "10.0.1".into())));
        // A Cluster's answer: one text per node; the oldest counts.
        let nodes = Value::Map(vec![
            (Value::SimpleString("a:1".into()), info("7.2.4")),
            (Value::SimpleString("b:2".into()), info("6.0.9")),
        ]);
        assert_eq!(lowest_version(&nodes), Some((6, "6.0.9".into())));
        // Nothing readable: not refused.
        assert_eq!(lowest_version(&Value::Nil), None);
        assert_eq!(lowest_version(&info("x.y")), None);
        assert_eq!(lowest_version(&Value::SimpleString("OK".into())), None);
    }

    /// The key names the module docs' table gives, byte for byte (a
    /// store written by an older build must be read by this one).
    #[test]
    fn key_names_are_the_documented_layout() {
        let keys = Keys::new(&EventId::parse("show-1").unwrap());
        assert_eq!(
            keys.common(),
            [
                "sluice:{show-1}:stock",
                "sluice:{show-1}:meta",
                "sluice:{show-1}:deadlines",
                "sluice:{show-1}:visitors",
                "sluice:{show-1}:stream",
                "sluice:{show-1}:ledgered",
                "sluice:{show-1}:vcats",
            ]
        );
        assert_eq!(keys.loaded(), "sluice:loaded:{show-1}");
        assert_eq!(keys.hold("abc"), "sluice:{show-1}:hold:abc");
        assert_eq!(keys.idem("v:1", "k"), "sluice:{show-1}:idem:3:v:1:k");
        assert_eq!(keys.vholds("visitor"), "sluice:{show-1}:vholds:7:visitor");
        assert_eq!(keys.feed("f"), "sluice:{show-1}:feed:1:f");
        assert_eq!(keys.pay("evt_123"), "sluice:{show-1}:pay:7:evt_123");
        assert_eq!(
            keys.transfers(),
            ["sluice:{show-1}:xout", "sluice:{show-1}:xin"]
        );
        let id = HoldId::generate(&EventId::parse("show-1").unwrap());
        assert!(id.as_str().starts_with("show-1."));
        assert_eq!(HoldId::parse(id.as_str()), Some(id));
    }

    /// A success's one string comes back as the fields of the table it
    /// stands for; a table passes as it is; anything else is a protocol
    /// error, never a hold taken for another.
    #[test]
    fn a_held_string_reads_as_the_table_it_stands_for() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let r = hold_reply(bulk("HELD 3 1765000000123 41 ")).unwrap();
        assert_eq!(
            r,
            vec![
                bulk("HELD"),
                Value::Int(3),
                bulk("held"),
                Value::Int(1_765_000_000_123),
                Value::Int(41),
                bulk(""),
            ]
        );
        let r = hold_reply(bulk("HELD 3 1765000000123 9007199254740991 a=1/b-2=2")).unwrap();
        assert_eq!(r[4], Value::Int(9_007_199_254_740_991));
        assert_eq!(items_of(r.get(5)).unwrap().len(), 2);
        let table = Value::Array(vec![bulk("SOLD_OUT"), Value::Int(0)]);
        assert_eq!(
            hold_reply(table).unwrap(),
            vec![bulk("SOLD_OUT"), Value::Int(0)]
        );
        for bad in [
            "HELD",
            "HELD ",
            "HELD 3",
            "HELD 3 17",
            "HELD 3 17 4",
            "HELD x 17 4 ",
            "HELD 3 17 4.5 ",
            "HELD 3  17 4 ",
            "held 3 17 4 ",
            "REPLAYED 3 17 4 ",
            "",
        ] {
            assert!(
                matches!(hold_reply(bulk(bad)), Err(ReservationError::Protocol(_))),
                "{bad:?}"
            );
        }
        assert!(hold_reply(Value::Int(1)).is_err());
        assert!(hold_reply(Value::Nil).is_err());
    }

    proptest::proptest! {
        /// What hold.lua writes for any hold (its `'HELD ' .. s_qty .. ' '
        /// .. s_deadline .. ' ' .. int(available) .. ' ' .. items`) reads
        /// back as exactly those fields.
        #[test]
        fn any_held_string_reads_back_its_fields(
            qty in 1u32..=u32::MAX,
            deadline in 0i64..=9_007_199_254_740_991,
            available in 0i64..=9_007_199_254_740_991,
            items in proptest::collection::vec(("[a-z0-9_-]{1,20}", 1u32..1000), 0..5),
        ) {
            let items: Vec<Item> = items
                .into_iter()
                .filter_map(|(c, qty)| Some(Item { category: CategoryId::parse(&c)?, qty }))
                .collect();
            let text = crate::types::items_text(&items);
            let line = format!("HELD {qty} {deadline} {available} {text}");
            let r = hold_reply(Value::BulkString(line.into_bytes())).unwrap();
            proptest::prop_assert_eq!(u32_of(r.get(1)).unwrap(), qty);
            proptest::prop_assert_eq!(status(r.get(2)).unwrap(), HoldStatus::Held);
            proptest::prop_assert_eq!(int(r.get(3)).unwrap(), deadline);
            proptest::prop_assert_eq!(int(r.get(4)).unwrap(), available);
            proptest::prop_assert_eq!(items_of(r.get(5)).unwrap(), items);
        }

        /// Any bytes at all: an answer or a protocol error, never a panic,
        /// and an answer only for a string that says HELD.
        #[test]
        fn any_bytes_are_a_hold_or_a_protocol_error(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let says_held = bytes.starts_with(b"HELD ");
            match hold_reply(Value::BulkString(bytes)) {
                Ok(r) => {
                    proptest::prop_assert!(says_held);
                    proptest::prop_assert_eq!(r.len(), 6);
                }
                Err(e) => proptest::prop_assert!(matches!(e, ReservationError::Protocol(_))),
            }
        }
    }
}
