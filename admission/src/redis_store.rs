//! The Redis store: many gateways sharing one queue per room.
//!
//! Every operation is one Lua script (`admission/lua/*.lua`, each prefixed
//! with `lib.lua`, the port of [`crate::room`]), sent by SHA with `EVALSHA`
//! and reloaded on `NOSCRIPT`. The server's `TIME` is the only clock, so
//! gateways with skewed clocks agree. Every call is bounded by
//! [`RedisConfig::timeout`]: a slow Redis gives
//! [`AdmissionError::StoreTimeout`], never a hung request.
//!
//! # Key schema
//!
//! All keys of a room share the hash tag `{room}`, and every script gets the
//! first nine in `KEYS[]`, so the scripts run unchanged on Redis Cluster:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `sluice:{room}:state` | hash | tail, frontier, credit (micro-admissions), last_ms, epoch, counters (joins, admitted, claimed, refunded, late), pending, settled, the bucket parameters (rate_m, burst_u, paused, closed, max_active, claim_ms), the schedule and the pre-queue draw (opens_ms, pq_from, pq_n, pq_k, pq_at: see `lua/lib.lua`) and `settings` (JSON of [`RoomSettings`]) |
//! | `sluice:{room}:claims` | string | the claim bitmap: bit `seq` set = claimed |
//! | `sluice:{room}:batches` | list | open advance batches `from:to:at_ms`, oldest first |
//! | `sluice:{room}:sessions` | sorted set | session id → deadline (ms, `TIME`) |
//! | `sluice:{room}:ended` | sorted set | session id ended by a revoke → when (ms); kept for the session ttl + 30 s |
//! | `sluice:{room}:reseats` | hash | `epoch:seq` of an old-epoch queue token → its seq in this epoch ([`QueueStore::reseat`]) |
//! | `sluice:{room}:lanes` | sorted set | with lanes only: the lanes' segments, lane seqs → places (`crate::lanes`; member `lane:seq:place:len`, score `lane × 2⁴⁰ + seq`) |
//! | `sluice:{room}:lanemarks` | list | with lanes and [`RoomSettings::lane_keep`] only: marks `at_ms:f1,f2,…` (when, each lane's frontier then), oldest first; a mark `lane_keep` old forgets the segments it covers (`crate::lanes`, "Forgetting") |
//! | `sluice:{room}:draws` | sorted set | a `random` room's draws (`crate::prequeue`, "Rolling draws"): member `from:n:k:at_ms`, score `from`; those made within [`RoomSettings::lane_keep`], and those handed back after a loss ([`QueueStore::draw_of`], [`QueueStore::keep_draws`]) |
//! | `sluice:{room}:pow:<hex id>` | string, with a TTL | a proof-of-work solution spent on a join of the room: `seq:epoch:sub` (the place it bought) or `1`; kept until the challenge can no longer be accepted ([`QueueStore::join_once`]) |
//! | `sluice:{room}:lease` | string, with a TTL | the gateway steering the room's rate (adaptive admission), see [`QueueStore::lease`] |
//! | `sluice:rate:{key}` | string, with a TTL | a shared rate limit's theoretical arrival time (ms, `TIME`), gone once passed ([`QueueStore::take_rate`], `lua/rate.lua`); not a room's |
//!
//! The prefix `sluice` is [`RedisConfig::prefix`]. Requires Redis ≥ 7.0
//! (`BITCOUNT … BIT`).
//!
//! With [`RedisConfig::wait_replicas`] = n > 0, the scripts that hand out a
//! seq (join, passthrough, reseat) are sent with `WAIT n timeout` in one
//! pipeline on a connection of their own (as the reservation store's holds
//! are), and a join fewer replicas acknowledged fails with
//! [`AdmissionError::NotReplicated`]: a failover could lose it, and the
//! gateway never reuses a seq it saw.

use std::sync::Arc;
use std::time::Duration;

use redis::{Script, Value};
use sluice_redis::{RedisConn, RedisUrl, ThreadConns};

use crate::bucket::{BucketParams, MICRO};
use crate::error::{AdmissionError, validate_room_id};
use crate::memory::validate_session_id;
use crate::prequeue::PrequeueDraw;
use crate::settings::RoomSettings;
use crate::store::{
    AdmitOutcome, ClaimOutcome, Floors, JoinOnce, JoinOutcome, QueueStore, Result, Snapshot,
    Solution, Spend,
};

const LIB: &str = include_str!("../lua/lib.lua");
const JOIN: &str = include_str!("../lua/join.lua");
const ADVANCE: &str = include_str!("../lua/advance.lua");
const SNAPSHOT: &str = include_str!("../lua/snapshot.lua");
const CLAIM: &str = include_str!("../lua/claim.lua");
const CONFIGURE: &str = include_str!("../lua/configure.lua");
const DRAW: &str = include_str!("../lua/draw.lua");
const KEEP: &str = include_str!("../lua/keep.lua");
const SESSION: &str = include_str!("../lua/session.lua");
const LEASE: &str = include_str!("../lua/lease.lua");
const ADMIT: &str = include_str!("../lua/admit.lua");
const RESEAT: &str = include_str!("../lua/reseat.lua");
const ENDED: &str = include_str!("../lua/ended.lua");
const LANE: &str = include_str!("../lua/lane.lua");
const RATE: &str = include_str!("../lua/rate.lua");

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// Bound on every call (connect, script, reply). Default 1 s.
    pub timeout: Duration,
    /// Key prefix. Default `sluice`.
    pub prefix: String,
    /// Replicas that must acknowledge a join (`WAIT`) before it is
    /// answered. Default 0: as soon as the primary applied it.
    pub wait_replicas: u32,
    /// How long `WAIT` may block. Default 100 ms.
    pub wait_timeout: Duration,
    /// The CA and client certificate of a `rediss…` URL. Default: the
    /// system roots, no client certificate.
    pub tls: sluice_redis::RedisTls,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(1),
            prefix: "sluice".into(),
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            tls: sluice_redis::RedisTls::default(),
        }
    }
}

struct Scripts {
    join: Script,
    advance: Script,
    snapshot: Script,
    claim: Script,
    configure: Script,
    session: Script,
    lease: Script,
    admit: Script,
    reseat: Script,
    ended: Script,
    lane: Script,
    draw: Script,
    keep: Script,
    rate: Script,
}

impl Scripts {
    fn new() -> Self {
        let s = |body: &str| Script::new(&format!("{LIB}\n{body}"));
        Self {
            join: s(JOIN),
            advance: s(ADVANCE),
            snapshot: s(SNAPSHOT),
            claim: s(CLAIM),
            configure: s(CONFIGURE),
            session: s(SESSION),
            lease: Script::new(LEASE),
            rate: Script::new(RATE),
            admit: s(ADMIT),
            reseat: s(RESEAT),
            ended: s(ENDED),
            lane: s(LANE),
            draw: s(DRAW),
            keep: s(KEEP),
        }
    }
}

/// The Redis store; cheap to clone.
#[derive(Clone)]
pub struct RedisQueueStore {
    /// The shared connection and, on the gateway's I/O threads, one each
    /// ([`sluice_redis::local`]).
    conns: ThreadConns,
    /// The connection joins and their `WAIT` run on, when
    /// [`RedisConfig::wait_replicas`] asks for one (`WAIT` blocks the
    /// connection it runs on).
    durable: Option<RedisConn>,
    scripts: Arc<Scripts>,
    cfg: RedisConfig,
}

impl std::fmt::Debug for RedisQueueStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueueStore")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl RedisQueueStore {
    /// Connects to `url`: `redis://…` (one server),
    /// `redis+cluster://host:port[,host:port…]` (Redis Cluster) or
    /// `redis+sentinel://host:port[,host:port…]/service` (the primary Redis
    /// Sentinel names, followed across failovers), as
    /// [`sluice_redis::RedisUrl`] reads them. Each connect is bounded by
    /// twice [`RedisConfig::timeout`].
    pub async fn connect(url: &str, cfg: RedisConfig) -> Result<Self> {
        let url = RedisUrl::parse(url).map_err(redis::RedisError::from)?;
        let conn = Self::open(&url, &cfg).await?;
        let durable = match cfg.wait_replicas {
            0 => None,
            _ => Some(Self::open(&url, &cfg).await?),
        };
        let conns = ThreadConns::new(conn, &url, &cfg.tls, cfg.timeout);
        Ok(Self::with(conns, durable, cfg))
    }

    fn with(conns: ThreadConns, durable: Option<RedisConn>, cfg: RedisConfig) -> Self {
        Self {
            conns,
            durable,
            scripts: Arc::new(Scripts::new()),
            cfg,
        }
    }

    async fn open(url: &RedisUrl, cfg: &RedisConfig) -> Result<RedisConn> {
        let bound = cfg.timeout * 2;
        Ok(
            tokio::time::timeout(bound, url.connect_with(cfg.timeout, &cfg.tls))
                .await
                .map_err(|_| AdmissionError::StoreTimeout(bound))??,
        )
    }

    /// The nine keys of `room`, in the scripts' `KEYS[]` order.
    pub fn keys(&self, room: &str) -> [String; 9] {
        // `concat`, one allocation each: `format!` costs several times as
        // much, measured on the hold path's keys (README, "A hold's side
        // in the gateway").
        let p = self.cfg.prefix.as_str();
        let key = |name: &str| [p, ":{", room, "}:", name].concat();
        [
            key("state"),
            key("claims"),
            key("batches"),
            key("sessions"),
            key("ended"),
            key("reseats"),
            key("lanes"),
            key("lanemarks"),
            key("draws"),
        ]
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.cfg.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_timeout() => Err(AdmissionError::StoreTimeout(self.cfg.timeout)),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(AdmissionError::StoreTimeout(self.cfg.timeout)),
        }
    }

    /// Runs `script` for `room`; maps status 0 (no state) and 2 (closed).
    async fn run(&self, script: &Script, room: &str, args: &[String]) -> Result<Vec<i64>> {
        let reply = self.run_raw(script, room, &[], args).await?;
        Self::ints(room, reply)
    }

    /// [`Self::run`]'s call with the reply as it came, and `extra` (keys
    /// under the room's hash tag) after the room's nine keys.
    async fn run_raw(
        &self,
        script: &Script,
        room: &str,
        extra: &[String],
        args: &[String],
    ) -> Result<Value> {
        validate_room_id(room)?;
        let mut inv = script.prepare_invoke();
        for k in self.keys(room) {
            inv.key(k);
        }
        for k in extra {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let mut conn = self.conns.get();
        self.bounded(inv.invoke_async(&mut conn)).await
    }

    /// A script's reply as integers, its status mapped.
    fn ints(room: &str, reply: Value) -> Result<Vec<i64>> {
        let parsed =
            redis::from_redis_value(reply).map_err(|e| AdmissionError::Protocol(e.to_string()))?;
        Self::status(room, parsed)
    }

    /// [`Self::run`] for a script that hands out a seq: with
    /// `wait_replicas`, sent with `WAIT` in one pipeline on the durable
    /// connection, and refused ([`AdmissionError::NotReplicated`]) when fewer
    /// replicas acknowledged it.
    async fn run_waited(&self, script: &Script, room: &str, args: &[String]) -> Result<Vec<i64>> {
        let reply = self.run_waited_raw(script, room, &[], args).await?;
        Self::ints(room, reply)
    }

    /// [`Self::run_waited`] with the reply as it came (see [`Self::run_raw`]).
    async fn run_waited_raw(
        &self,
        script: &Script,
        room: &str,
        extra: &[String],
        args: &[String],
    ) -> Result<Value> {
        let Some(durable) = &self.durable else {
            return self.run_raw(script, room, extra, args).await;
        };
        validate_room_id(room)?;
        let keys = self.keys(room);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script.get_hash())
            .arg(keys.len() + extra.len())
            .arg(&keys[..])
            .arg(extra);
        evalsha.arg(args);
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .add_command(evalsha)
            .cmd("WAIT")
            .arg(self.cfg.wait_replicas)
            .arg(self.cfg.wait_timeout.as_millis() as u64);
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
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(reply)) => {
                    // a refusal (no state, closed, full) is told before the
                    // replicas are: nothing was handed out to lose
                    if let Value::Array(items) = &reply
                        && let Some(Value::Int(0 | 2 | 4 | 6)) = items.first()
                    {
                        return Ok(reply);
                    }
                    let acked = match waited {
                        Some(Ok(w)) => redis::from_redis_value::<i64>(w)
                            .map_err(|e| AdmissionError::Protocol(e.to_string()))?,
                        Some(Err(e)) => return Err(e.into()),
                        None => 0,
                    };
                    let acked = u32::try_from(acked.max(0)).unwrap_or(u32::MAX);
                    if acked < self.cfg.wait_replicas {
                        return Err(AdmissionError::NotReplicated {
                            wanted: self.cfg.wait_replicas,
                            acked,
                        });
                    }
                    return Ok(reply);
                }
                None => break,
            }
        }
        Err(AdmissionError::Protocol("script and WAIT: no reply".into()))
    }

    /// The key recording a solution `id` spent on a join of `room`.
    pub fn solution_key(&self, room: &str, id: &[u8; 16]) -> String {
        use std::fmt::Write as _;
        let mut k = format!("{}:{{{room}}}:pow:", self.cfg.prefix);
        for b in id {
            let _ = write!(k, "{b:02x}");
        }
        k
    }

    fn status(room: &str, reply: Vec<i64>) -> Result<Vec<i64>> {
        match reply.first() {
            Some(1) => Ok(reply),
            Some(0) => Err(AdmissionError::RoomNotFound(room.to_owned())),
            Some(2) => Err(AdmissionError::Closed(room.to_owned())),
            Some(3) => Ok(reply),
            Some(4) => Err(AdmissionError::Full(room.to_owned())),
            Some(6) => Err(AdmissionError::LaneNotFound(room.to_owned())),
            _ => Err(AdmissionError::Protocol(format!("script reply {reply:?}"))),
        }
    }

    fn snapshot_from(room: &str, r: &[i64]) -> Result<Snapshot> {
        if r.len() < 27 {
            return Err(AdmissionError::Protocol(format!("snapshot reply {r:?}")));
        }
        let u = |i: usize| r[i].max(0) as u64;
        Ok(Snapshot {
            room: room.to_owned(),
            tail: u(1),
            frontier: u(2),
            credit: r[3] as f64 / MICRO as f64,
            rate_per_sec: r[4] as f64 / 1000.0,
            burst: r[5] as f64 / MICRO as f64,
            paused: r[6] == 1,
            closed: r[7] == 1,
            epoch: u(8),
            active_sessions: u(9),
            pending_claims: u(10),
            max_active: if r[11] < 0 { None } else { Some(r[11] as u64) },
            admitted_total: u(12),
            claimed_total: u(13),
            joins_total: u(14),
            refunded_total: u(15),
            late_claims_total: u(16),
            store_now_ms: u(17),
            opens_at_ms: (r[18] > 0).then_some(u(18)),
            prequeue_open: r[20] < 0,
            prequeue_draw: (r[20] >= 0 && (r[18] > 0 || r[20] > 0 || r[19] > 0)).then_some(
                PrequeueDraw {
                    from: u(19),
                    n: u(20),
                    k: u(25),
                },
            ),
            ended_total: u(21),
            carried_epoch: u(22),
            carried_tail: u(23),
            settings_version: u(24),
            lanes: Self::lanes_from(r),
        })
    }

    /// The lanes of a snapshot reply (after `settings_v` and `pq_k`: the
    /// count, then weight, tail, frontier, admitted per lane).
    fn lanes_from(r: &[i64]) -> Vec<crate::store::LaneSnapshot> {
        let n = r.get(26).copied().unwrap_or(0).max(0) as usize;
        r.get(27..27 + 4 * n)
            .map(|x| {
                x.chunks_exact(4)
                    .map(|l| crate::store::LaneSnapshot {
                        weight: l[0].clamp(0, i64::from(u32::MAX)) as u32,
                        tail: l[1].max(0) as u64,
                        frontier: l[2].max(0) as u64,
                        admitted_total: l[3].max(0) as u64,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn join_from(r: &[i64]) -> Result<JoinOutcome> {
        if r.len() < 6 {
            return Err(AdmissionError::Protocol(format!("join reply {r:?}")));
        }
        Ok(JoinOutcome {
            seq: r[1].max(0) as u64,
            epoch: r[2].max(0) as u64,
            admitted: r[3] == 1,
            frontier: r[4].max(0) as u64,
            prequeue: r[5] == 1,
            lane: r.get(6).and_then(|&l| u8::try_from(l).ok()),
            place: r
                .get(7)
                .map_or(if r[3] == 1 { r[1].max(0) as u64 } else { 0 }, |&p| {
                    p.max(0) as u64
                }),
        })
    }

    /// A reply of `join.lua` in mode 'once' (or one of 'many''s).
    fn join_once_from(room: &str, reply: Value) -> Result<JoinOnce> {
        if let Value::Array(items) = &reply
            && let [Value::Int(5), note] = &items[..]
        {
            let note: String = redis::from_redis_value(note.clone())
                .map_err(|e| AdmissionError::Protocol(e.to_string()))?;
            return Ok(JoinOnce::Replayed { note: noted(note) });
        }
        Self::join_from(&Self::ints(room, reply)?).map(JoinOnce::Joined)
    }

    async fn configure_script(
        &self,
        mode: &str,
        room: &str,
        settings: Option<&RoomSettings>,
        floors: Floors,
        expected: Option<u64>,
    ) -> Result<Snapshot> {
        let mut args = vec![mode.to_owned()];
        match settings {
            Some(s) => {
                s.to_stored()?;
                let mut s = s.clone();
                s.recalibrate();
                let p = BucketParams::from_settings(&s);
                let json = s.to_stored()?;
                args.extend([
                    p.rate_milli.to_string(),
                    p.burst_micro.to_string(),
                    u8::from(p.paused).to_string(),
                    u8::from(p.closed).to_string(),
                    s.effective_max_active()
                        .map(|m| m as i64)
                        .unwrap_or(-1)
                        .to_string(),
                    (s.claim_window.as_millis() as u64).to_string(),
                    json,
                ]);
            }
            None => args.extend(std::iter::repeat_n(String::from("0"), 7)),
        }
        args.push(floors.tail.to_string());
        args.push(floors.frontier.to_string());
        let hint = settings.and_then(|s| s.prequeue_draw);
        args.extend([
            settings
                .and_then(|s| s.opens_at_ms)
                .unwrap_or(0)
                .to_string(),
            hint.map_or(0, |d| d.from).to_string(),
            hint.map_or(-1, |d| d.n as i64).to_string(),
            expected.map_or(-1, |v| v as i64).to_string(),
            floors.epoch.to_string(),
            settings
                .map_or(0, |s| s.session_ttl.as_millis() as u64)
                .to_string(),
            settings.map_or(0, |s| s.method.code()).to_string(),
            settings.map_or(String::new(), lanes_arg),
            settings
                .and_then(|s| s.lane_keep)
                .map_or(0, |k| k.as_millis() as u64)
                .to_string(),
            hint.map_or(0, |d| d.k).to_string(),
        ]);
        let r = self.run(&self.scripts.configure, room, &args).await?;
        if r.first() == Some(&3) {
            return Err(AdmissionError::SettingsConflict {
                current: r.get(1).copied().unwrap_or(0).max(0) as u64,
            });
        }
        Self::snapshot_from(room, &r)
    }

    async fn session(&self, room: &str, op: &str, id: &str, ttl: Duration) -> Result<i64> {
        validate_session_id(id)?;
        let args = [
            op.to_owned(),
            id.to_owned(),
            (ttl.as_millis() as u64).to_string(),
        ];
        let r = self.run(&self.scripts.session, room, &args).await?;
        r.get(1)
            .copied()
            .ok_or_else(|| AdmissionError::Protocol(format!("session reply {r:?}")))
    }
}

/// A ttl as the scripts take it: whole ms, at least 1 (`PX 0` is an error).
fn ttl_ms(ttl: Duration) -> String {
    u64::try_from(ttl.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
        .to_string()
}

/// A solution key's value as a note: `1` is the bare mark (no place).
fn noted(value: String) -> Option<String> {
    (value != "1" && !value.is_empty()).then_some(value)
}

impl QueueStore for RedisQueueStore {
    async fn configure(&self, room: &str, settings: &RoomSettings) -> Result<Snapshot> {
        self.configure_script("configure", room, Some(settings), Floors::default(), None)
            .await
    }

    async fn recover(
        &self,
        room: &str,
        settings: &RoomSettings,
        floors: Floors,
    ) -> Result<Snapshot> {
        self.configure_script("recover", room, Some(settings), floors, None)
            .await
    }

    async fn settings(&self, room: &str) -> Result<Option<RoomSettings>> {
        validate_room_id(room)?;
        let [state, ..] = self.keys(room);
        let mut conn = self.conns.get();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(state).arg("settings").arg("settings_v");
        let (json, version): (Option<String>, Option<u64>) =
            self.bounded(cmd.query_async(&mut conn)).await?;
        let Some(json) = json else {
            return Ok(None);
        };
        let mut s =
            RoomSettings::from_stored(&json).map_err(|e| AdmissionError::StoredSettings {
                room: room.to_owned(),
                reason: e.to_string(),
            })?;
        s.version = version.unwrap_or(0);
        Ok(Some(s))
    }

    async fn update_settings(&self, room: &str, settings: &RoomSettings) -> Result<Snapshot> {
        self.configure_script(
            "configure",
            room,
            Some(settings),
            Floors::default(),
            Some(settings.version),
        )
        .await
    }

    async fn passthrough(&self, room: &str) -> Result<Option<JoinOutcome>> {
        let r = match self
            .run_waited(&self.scripts.join, room, &["passthrough".to_owned()])
            .await
        {
            Err(AdmissionError::Closed(_)) => return Ok(None),
            r => r?,
        };
        if r.first() == Some(&3) {
            return Ok(None);
        }
        Self::join_from(&r).map(Some)
    }

    async fn reseat(
        &self,
        room: &str,
        old_epoch: u64,
        old_seq: u64,
        ttl: Duration,
    ) -> Result<JoinOutcome> {
        let args = [
            old_epoch.to_string(),
            old_seq.to_string(),
            (ttl.as_millis() as u64).max(1).to_string(),
        ];
        let r = self.run_waited(&self.scripts.reseat, room, &args).await?;
        Self::join_from(&r)
    }

    async fn admit(
        &self,
        room: &str,
        place: u64,
        session_id: &str,
        ttl: Duration,
    ) -> Result<AdmitOutcome> {
        validate_session_id(session_id)?;
        let args = [
            place.to_string(),
            session_id.to_owned(),
            (ttl.as_millis() as u64).to_string(),
        ];
        let r = self.run(&self.scripts.admit, room, &args).await?;
        match r.get(1) {
            Some(0) => Ok(AdmitOutcome::Started { late: false }),
            Some(1) => Ok(AdmitOutcome::Resumed),
            Some(2) => Ok(AdmitOutcome::NotAdmitted),
            Some(3) => Ok(AdmitOutcome::Started { late: true }),
            Some(4) => Ok(AdmitOutcome::Spent),
            _ => Err(AdmissionError::Protocol(format!("admit reply {r:?}"))),
        }
    }

    async fn ended_since(
        &self,
        room: &str,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>> {
        validate_room_id(room)?;
        let mut inv = self.scripts.ended.prepare_invoke();
        for k in self.keys(room) {
            inv.key(k);
        }
        inv.arg(since_ms).arg(limit.max(1));
        let mut conn = self.conns.get();
        let flat: Vec<String> = self.bounded(inv.invoke_async(&mut conn)).await?;
        let mut out = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks_exact(2) {
            let at = pair[1]
                .parse::<f64>()
                .map_err(|_| AdmissionError::Protocol(format!("ended score {:?}", pair[1])))?;
            out.push((pair[0].clone(), at as u64));
        }
        Ok(out)
    }

    async fn join(&self, room: &str) -> Result<JoinOutcome> {
        let r = self.run_waited(&self.scripts.join, room, &[]).await?;
        Self::join_from(&r)
    }

    async fn join_lane(&self, room: &str, lane: Option<u8>) -> Result<JoinOutcome> {
        let args = [
            "join".to_owned(),
            String::new(),
            String::new(),
            String::new(),
            lane_arg(lane),
        ];
        let r = self.run_waited(&self.scripts.join, room, &args).await?;
        Self::join_from(&r)
    }

    async fn lane_place(&self, room: &str, lane: u8, seq: u64) -> Result<Option<u64>> {
        let r = self
            .run(
                &self.scripts.lane,
                room,
                &[lane.to_string(), seq.to_string()],
            )
            .await?;
        Ok(r.get(1).copied().filter(|&p| p > 0).map(|p| p as u64))
    }

    async fn draw_of(&self, room: &str, seq: u64) -> Result<Option<PrequeueDraw>> {
        let r = self
            .run(&self.scripts.draw, room, &[seq.to_string()])
            .await?;
        match r[..] {
            [_, from, n, k] if from >= 0 && n >= 0 && k >= 0 => Ok(Some(PrequeueDraw {
                from: from as u64,
                n: n as u64,
                k: k as u64,
            })),
            [_, -1] => Ok(None),
            _ => Err(AdmissionError::Protocol(format!("draw reply {r:?}"))),
        }
    }

    async fn keep_draws(&self, room: &str, draws: &[PrequeueDraw]) -> Result<()> {
        let args: Vec<String> = draws
            .iter()
            .filter(|d| d.n > 0)
            .map(|d| format!("{}:{}:{}", d.from, d.n, d.k))
            .collect();
        self.run(&self.scripts.keep, room, &args).await?;
        Ok(())
    }

    async fn join_once(&self, room: &str, solution: Solution<'_>) -> Result<JoinOnce> {
        validate_room_id(room)?;
        let key = self.solution_key(room, solution.id);
        let args = [
            "once".to_owned(),
            ttl_ms(solution.ttl),
            solution.sub.to_owned(),
            if solution.spent { "own" } else { "new" }.to_owned(),
            lane_arg(solution.lane),
        ];
        let reply = self
            .run_waited_raw(&self.scripts.join, room, &[key], &args)
            .await?;
        Self::join_once_from(room, reply)
    }

    async fn join_once_many(
        &self,
        room: &str,
        solutions: &[Solution<'_>],
    ) -> Result<Vec<Result<JoinOnce>>> {
        validate_room_id(room)?;
        if solutions.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = solutions
            .iter()
            .map(|s| self.solution_key(room, s.id))
            .collect();
        let mut args = Vec::with_capacity(1 + 4 * solutions.len());
        args.push("many".to_owned());
        for s in solutions {
            args.push(ttl_ms(s.ttl));
            args.push(s.sub.to_owned());
            args.push(if s.spent { "own" } else { "new" }.to_owned());
            args.push(lane_arg(s.lane));
        }
        let reply = self
            .run_waited_raw(&self.scripts.join, room, &keys, &args)
            .await?;
        let Value::Array(items) = reply else {
            return Err(AdmissionError::Protocol(format!(
                "join_once_many reply {reply:?}"
            )));
        };
        if let [Value::Int(0)] = &items[..] {
            return Err(AdmissionError::RoomNotFound(room.to_owned()));
        }
        if items.len() != solutions.len() {
            return Err(AdmissionError::Protocol(format!(
                "join_once_many: {} replies for {} joins",
                items.len(),
                solutions.len()
            )));
        }
        Ok(items
            .into_iter()
            .map(|r| Self::join_once_from(room, r))
            .collect())
    }

    async fn spend_solution(&self, room: &str, id: &[u8; 16], ttl: Duration) -> Result<Spend> {
        validate_room_id(room)?;
        // NX with GET (Redis >= 7.0): the old value when it was recorded,
        // nil when this call recorded it
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.solution_key(room, id))
            .arg("1")
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(ttl_ms(ttl));
        let mut conn = self.conns.get();
        let before: Option<String> = self.bounded(cmd.query_async(&mut conn)).await?;
        Ok(match before {
            None => Spend::First,
            Some(note) => Spend::Replayed { note: noted(note) },
        })
    }

    async fn release_solution(&self, room: &str, id: &[u8; 16]) -> Result<()> {
        validate_room_id(room)?;
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.solution_key(room, id));
        let mut conn = self.conns.get();
        let _: i64 = self.bounded(cmd.query_async(&mut conn)).await?;
        Ok(())
    }

    async fn advance(&self, room: &str) -> Result<Snapshot> {
        let r = self.run(&self.scripts.advance, room, &[]).await?;
        Self::snapshot_from(room, &r)
    }

    async fn snapshot(&self, room: &str) -> Result<Snapshot> {
        let r = self.run(&self.scripts.snapshot, room, &[]).await?;
        Self::snapshot_from(room, &r)
    }

    async fn claim(&self, room: &str, seq: u64) -> Result<ClaimOutcome> {
        let r = self
            .run(&self.scripts.claim, room, &[seq.to_string()])
            .await?;
        match r.get(1) {
            Some(0) => Ok(ClaimOutcome::Claimed),
            Some(1) => Ok(ClaimOutcome::AlreadyClaimed),
            Some(2) => Ok(ClaimOutcome::NotAdmitted),
            Some(3) => Ok(ClaimOutcome::Late),
            _ => Err(AdmissionError::Protocol(format!("claim reply {r:?}"))),
        }
    }

    async fn session_start(&self, room: &str, session_id: &str, ttl: Duration) -> Result<u64> {
        Ok(self.session(room, "start", session_id, ttl).await?.max(0) as u64)
    }

    async fn session_touch(&self, room: &str, session_id: &str, ttl: Duration) -> Result<bool> {
        Ok(self.session(room, "touch", session_id, ttl).await? == 1)
    }

    async fn session_end(&self, room: &str, session_id: &str) -> Result<bool> {
        Ok(self
            .session(room, "end", session_id, Duration::ZERO)
            .await?
            == 1)
    }

    async fn reseed(&self, room: &str, min_tail: u64, min_frontier: u64) -> Result<Snapshot> {
        let floors = Floors {
            tail: min_tail,
            frontier: min_frontier,
            epoch: 0,
        };
        self.configure_script("reseed", room, None, floors, None)
            .await
    }

    async fn lease(&self, room: &str, holder: &str, ttl: Duration) -> Result<bool> {
        validate_room_id(room)?;
        validate_session_id(holder)?;
        let mut inv = self.scripts.lease.prepare_invoke();
        inv.key(format!("{}:{{{room}}}:lease", self.cfg.prefix));
        inv.arg(holder)
            .arg((ttl.as_millis() as u64).max(1).to_string());
        let mut conn = self.conns.get();
        let r: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(r == 1)
    }

    async fn take_rate(&self, key: &str, per_sec: f64, burst: u32) -> Result<Option<u64>> {
        crate::rate::check(key, per_sec, burst)?;
        let mut inv = self.scripts.rate.prepare_invoke();
        inv.key(format!("{}:rate:{{{key}}}", self.cfg.prefix));
        inv.arg(per_sec.to_string()).arg(burst.to_string());
        let mut conn = self.conns.get();
        let r: Vec<i64> = self.bounded(inv.invoke_async(&mut conn)).await?;
        match r[..] {
            [1, _] => Ok(None),
            [0, wait] => Ok(Some(u64::try_from(wait).unwrap_or(1).max(1))),
            _ => Err(AdmissionError::Protocol(format!("rate.lua: {r:?}"))),
        }
    }
}

/// join.lua's ARGV[5]: the lane, or -1 for the room's default.
fn lane_arg(lane: Option<u8>) -> String {
    lane.map_or(-1, i64::from).to_string()
}

/// configure.lua's ARGV[18]: '' without lanes, else `mode,w1,w2,...`.
fn lanes_arg(s: &RoomSettings) -> String {
    if s.lanes.is_empty() {
        return String::new();
    }
    let mut out = s.lane_mode.code().to_string();
    for l in &s.lanes {
        out.push(',');
        out.push_str(&l.weight.to_string());
    }
    out
}
