//! The consumer: `sluice ledger`'s loop, one task per event.
//!
//! Each task owns its connections (one PostgreSQL connection, one Redis
//! connection for the blocking read, one for everything else) and loops:
//!
//! 1. claim entries another consumer left pending longer than
//!    [`ConsumerConfig::claim_idle`] (`XAUTOCLAIM`); when there are none,
//!    read new ones (`XREADGROUP … COUNT batch BLOCK flush >`);
//! 2. write the batch in one transaction ([`Ledger::apply_batch`]),
//!    retrying with backoff until it is committed (PostgreSQL down or slow:
//!    the same batch, nothing new is read meanwhile);
//! 3. acknowledge it (`XACK`), only now, and trim the stream below what
//!    every group acknowledged ([`stream::trim`]).
//!
//! A task never panics on what it reads and never exits on a fault: it
//! logs, backs off (doubling up to [`ConsumerConfig::backoff_max`]) and
//! tries again. Shutdown is looked at between batches: a batch being
//! written is finished and acknowledged first; one waiting for PostgreSQL
//! stays pending for the next ledger to claim.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_redis::{RedisConn, RedisTls, RedisUrl};
use sluice_reservation::EventId;
use tokio::sync::watch;

use crate::entry::{Parsed, RawEntry, parse};
use crate::error::{LedgerError, Result};
use crate::metrics::Metrics;
use crate::store::Ledger;
use crate::stream;

/// How often each task forgets consumers that are gone.
const FORGET_EVERY: Duration = Duration::from_secs(60);

/// Settings of a ledger process.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// The store's URL (as `sluice serve --redis`).
    pub redis_url: String,
    /// The CA and client certificate of a `rediss…` URL (as `sluice serve
    /// --redis-ca`, …). Default: the system roots, no client certificate.
    pub redis_tls: RedisTls,
    /// The ledger database, `postgres://user@host:port/db` or a
    /// `key=value` string.
    pub postgres_url: String,
    /// Most entries written per transaction. Default 500.
    pub batch: usize,
    /// Longest wait for new entries before looking around (`BLOCK`).
    /// Default 200 ms.
    pub flush: Duration,
    /// How long an entry stays pending with another consumer before this
    /// one claims it. Default 10 s.
    pub claim_idle: Duration,
    /// How often the list of events is read again. Default 2 s.
    pub rescan: Duration,
    /// This consumer's name in the group; default host, pid and random.
    pub consumer: Option<String>,
    /// Bound on each call to Redis and each connect. Default 2 s.
    pub timeout: Duration,
    /// Bound on writing one batch. Default 30 s.
    pub write_timeout: Duration,
    /// Longest pause between retries. Default 5 s.
    pub backoff_max: Duration,
}

impl ConsumerConfig {
    /// Defaults for these URLs.
    pub fn new(redis_url: impl Into<String>, postgres_url: impl Into<String>) -> Self {
        Self {
            redis_url: redis_url.into(),
            redis_tls: RedisTls::default(),
            postgres_url: postgres_url.into(),
            batch: 500,
            flush: Duration::from_millis(200),
            claim_idle: Duration::from_secs(10),
            rescan: Duration::from_secs(2),
            consumer: None,
            timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(30),
            backoff_max: Duration::from_secs(5),
        }
    }

    /// Refuses settings that cannot work; the message names the field.
    pub fn validate(&self) -> Result<()> {
        RedisUrl::parse(&self.redis_url).map_err(|e| LedgerError::Config(format!("redis: {e}")))?;
        self.postgres_url
            .parse::<tokio_postgres::Config>()
            .map_err(|e| LedgerError::Config(format!("postgres: {e}")))?;
        if self.batch == 0 || self.batch > 100_000 {
            return Err(LedgerError::Config("batch must be 1 to 100000".into()));
        }
        if self.flush.is_zero() || self.flush > Duration::from_secs(60) {
            return Err(LedgerError::Config("flush must be 1 ms to 60 s".into()));
        }
        if self.claim_idle < Duration::from_millis(100) {
            return Err(LedgerError::Config(
                "claim idle must be at least 100 ms".into(),
            ));
        }
        if let Some(c) = &self.consumer
            && (c.is_empty() || c.len() > 200)
        {
            return Err(LedgerError::Config(
                "consumer name must be 1 to 200 bytes".into(),
            ));
        }
        Ok(())
    }

    /// The consumer name: the configured one, or host, pid and 32 random
    /// bits (two processes never share a name by accident).
    pub fn consumer_name(&self) -> String {
        if let Some(c) = &self.consumer {
            return c.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "host".into());
        format!(
            "{host}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )
    }
}

/// Runs the ledger until `shutdown` resolves: migrates the schema, then
/// follows every event's stream. Returns when every task has finished its
/// batch. Faults are retried, never returned, except a bad config.
pub async fn run(
    config: ConsumerConfig,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    config.validate()?;
    let consumer = config.consumer_name();
    let (stop_tx, stop) = watch::channel(false);
    let url = RedisUrl::parse(&config.redis_url)
        .map_err(|e| LedgerError::Config(format!("redis: {e}")))?;

    let main = async {
        let mut backoff = Backoff::new(config.backoff_max);
        // The schema first: nothing is read before it is in place.
        loop {
            match migrate(&config).await {
                Ok(v) => {
                    if !v.is_empty() {
                        tracing::info!(versions = ?v, "ledger: schema migrated");
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ledger: cannot prepare the database, retrying");
                    if backoff.sleep(&stop).await {
                        return;
                    }
                }
            }
        }
        tracing::info!(consumer = %consumer, "ledger: running");
        let mut tasks: HashMap<EventId, tokio::task::JoinHandle<()>> = HashMap::new();
        let mut conn: Option<RedisConn> = None;
        let mut rooms = RoomFeed::default();
        // Said once per outage, not at every retry.
        let mut unreachable = false;
        loop {
            if conn.is_none() {
                match connect(&url, &config.redis_tls, config.timeout).await {
                    Ok(c) => {
                        if std::mem::take(&mut unreachable) {
                            tracing::info!("ledger: Redis reachable again");
                        }
                        conn = Some(c);
                    }
                    Err(e) if !unreachable => {
                        unreachable = true;
                        tracing::warn!(error = %e, "ledger: cannot connect to Redis, retrying");
                    }
                    Err(_) => {}
                }
            }
            if let Some(c) = conn.as_mut() {
                match list_events(c, config.timeout).await {
                    Ok(events) => {
                        if let Err(e) = rooms.feed(c, &events, &config).await {
                            tracing::debug!(error = %e, "ledger: room floors not recorded this time");
                            rooms = RoomFeed::default();
                        }
                        for event in events {
                            tasks.entry(event.clone()).or_insert_with(|| {
                                tracing::info!(event = %event, "ledger: following the stream");
                                tokio::spawn(event_task(
                                    event,
                                    config.clone(),
                                    consumer.clone(),
                                    stop.clone(),
                                    metrics.clone(),
                                ))
                            });
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "ledger: cannot list events"),
                }
            }
            let mut s = stop.clone();
            tokio::select! {
                _ = s.wait_for(|v| *v) => break,
                () = tokio::time::sleep(config.rescan) => {}
            }
        }
        for (_, t) in tasks {
            let _ = t.await;
        }
    };
    let stopper = async {
        shutdown.await;
        tracing::info!("ledger: stopping after the batches in hand");
        let _ = stop_tx.send(true);
    };
    tokio::join!(main, stopper);
    Ok(())
}

/// Records each room's queue high-water mark (tail, frontier, epoch) from
/// the admission store's snapshot, for the rooms the events name (their
/// `room` setting), once per rescan. The ledger keeps the highest values
/// ever seen ([`Ledger::record_room_floors`]), so a store that lost its
/// rooms can be given back floors no seq was handed out below.
#[derive(Default)]
struct RoomFeed {
    store: Option<sluice_admission::RedisQueueStore>,
    pg: Option<Ledger>,
}

impl RoomFeed {
    async fn feed(
        &mut self,
        conn: &mut RedisConn,
        events: &[EventId],
        config: &ConsumerConfig,
    ) -> Result<()> {
        use sluice_admission::QueueStore;
        let mut names = std::collections::BTreeSet::new();
        for event in events {
            let room: Option<String> = bounded(
                config.timeout,
                redis::cmd("HGET")
                    .arg(format!("sluice:{{{event}}}:meta"))
                    .arg("room")
                    .query_async(conn),
            )
            .await?;
            if let Some(r) = room.filter(|r| sluice_admission::validate_room_id(r).is_ok()) {
                names.insert(r);
            }
        }
        if names.is_empty() {
            return Ok(());
        }
        if self.store.is_none() {
            let cfg = sluice_admission::RedisConfig {
                timeout: config.timeout,
                tls: config.redis_tls.clone(),
                ..Default::default()
            };
            self.store = Some(
                sluice_admission::RedisQueueStore::connect(&config.redis_url, cfg)
                    .await
                    .map_err(|e| LedgerError::Protocol(format!("admission store: {e}")))?,
            );
        }
        if self.pg.as_ref().is_none_or(Ledger::is_closed) {
            self.pg = Some(Ledger::connect(&config.postgres_url, config.timeout).await?);
        }
        let (Some(store), Some(pg)) = (self.store.as_ref(), self.pg.as_ref()) else {
            return Ok(());
        };
        for room in names {
            // A room the store does not have (yet, or any more) has no
            // floors to record; the next rescan looks again.
            let snap = match store.snapshot(&room).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(room = %room, error = %e, "ledger: no snapshot of the room");
                    continue;
                }
            };
            within(
                config.timeout,
                pg.record_room_floors(&room, snap.tail, snap.frontier, snap.epoch),
            )
            .await?;
        }
        Ok(())
    }
}

async fn migrate(config: &ConsumerConfig) -> Result<Vec<i32>> {
    let mut pg = Ledger::connect(&config.postgres_url, config.timeout).await?;
    pg.migrate().await
}

async fn connect(url: &RedisUrl, tls: &RedisTls, timeout: Duration) -> Result<RedisConn> {
    tokio::time::timeout(timeout * 2, url.connect_with(timeout, tls))
        .await
        .map_err(|_| LedgerError::Timeout(timeout))?
        .map_err(LedgerError::from)
}

async fn list_events(conn: &mut RedisConn, timeout: Duration) -> Result<Vec<EventId>> {
    let names: Vec<String> = bounded(
        timeout,
        redis::cmd("SMEMBERS")
            .arg(sluice_reservation::redis::EVENTS_KEY)
            .query_async(conn),
    )
    .await?;
    Ok(names.iter().filter_map(|n| EventId::parse(n)).collect())
}

async fn bounded<T>(
    timeout: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| LedgerError::Timeout(timeout))?
        .map_err(LedgerError::from)
}

async fn within<T>(timeout: Duration, fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| LedgerError::Timeout(timeout))?
}

/// Doubling pauses, from 50 ms up to a bound; `sleep` answers whether
/// shutdown came first.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    fn new(max: Duration) -> Self {
        Self {
            next: Duration::from_millis(50),
            max,
        }
    }

    fn reset(&mut self) {
        self.next = Duration::from_millis(50);
    }

    async fn sleep(&mut self, stop: &watch::Receiver<bool>) -> bool {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let mut s = stop.clone();
        tokio::select! {
            _ = s.wait_for(|v| *v) => true,
            () = tokio::time::sleep(d) => false,
        }
    }
}

/// The connections of one event's task, opened on demand.
struct Conns {
    url: RedisUrl,
    tls: RedisTls,
    timeout: Duration,
    read_timeout: Duration,
    cmd: Option<RedisConn>,
    read: Option<RedisConn>,
}

impl Conns {
    async fn cmd(&mut self) -> Result<&mut RedisConn> {
        if self.cmd.is_none() {
            self.cmd = Some(connect(&self.url, &self.tls, self.timeout).await?);
        }
        self.cmd
            .as_mut()
            .ok_or_else(|| LedgerError::Protocol("no connection".into()))
    }

    async fn read(&mut self) -> Result<&mut RedisConn> {
        if self.read.is_none() {
            self.read = Some(connect(&self.url, &self.tls, self.read_timeout).await?);
        }
        self.read
            .as_mut()
            .ok_or_else(|| LedgerError::Protocol("no connection".into()))
    }
}

async fn event_task(
    event: EventId,
    config: ConsumerConfig,
    consumer: String,
    stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) {
    let Ok(url) = RedisUrl::parse(&config.redis_url) else {
        return;
    };
    let flush_ms = u64::try_from(config.flush.as_millis()).unwrap_or(200);
    let mut conns = Conns {
        url,
        tls: config.redis_tls.clone(),
        timeout: config.timeout,
        // The blocking read's reply comes up to `flush` late.
        read_timeout: config.timeout + config.flush,
        cmd: None,
        read: None,
    };
    let mut pg: Option<Ledger> = None;
    let mut backoff = Backoff::new(config.backoff_max);
    let mut grouped = false;
    let mut cursor = "0-0".to_owned();
    let mut last_lag = Instant::now() - Duration::from_secs(60);
    let claim_ms = u64::try_from(config.claim_idle.as_millis()).unwrap_or(10_000);
    // A consumer silent this long with nothing pending is a process that
    // is gone (a live one reads every `flush`).
    let forget_ms = claim_ms.saturating_mul(60).max(600_000);
    let mut last_forget = Instant::now();

    while !*stop.borrow() {
        if !grouped {
            let r = async {
                let c = conns.cmd().await?;
                within(config.timeout, stream::ensure_group(c, &event)).await
            }
            .await;
            match r {
                Ok(()) => grouped = true,
                Err(e) => {
                    tracing::warn!(event = %event, error = %e, "ledger: cannot create the group");
                    conns.cmd = None;
                    if backoff.sleep(&stop).await {
                        break;
                    }
                    continue;
                }
            }
        }

        // 1. A batch: claimed from a consumer that went away, or new.
        let batch = next_batch(
            &mut conns,
            &event,
            &consumer,
            &config,
            claim_ms,
            flush_ms,
            &mut cursor,
        )
        .await;
        let raw = match batch {
            Ok(raw) => raw,
            Err(LedgerError::NoGroup(_)) => {
                tracing::warn!(event = %event, "ledger: the group is gone (store lost its data?); creating it again");
                grouped = false;
                cursor = "0-0".into();
                continue;
            }
            Err(e) => {
                tracing::warn!(event = %event, error = %e, "ledger: cannot read the stream");
                conns.cmd = None;
                conns.read = None;
                if backoff.sleep(&stop).await {
                    break;
                }
                continue;
            }
        };
        backoff.reset();
        if raw.is_empty() {
            if last_lag.elapsed() >= Duration::from_secs(1) {
                last_lag = Instant::now();
                refresh_lag(&mut conns, &event, &metrics, config.timeout).await;
            }
            continue;
        }

        // 2. Written and committed, however long PostgreSQL takes.
        let parsed: Vec<Parsed> = raw.iter().map(|r| parse(&event, r)).collect();
        let ids: Vec<String> = raw.iter().map(|r| r.id.clone()).collect();
        let Some(applied) = write_batch(
            &mut pg, &mut conns, &event, &parsed, &config, &stop, &metrics,
        )
        .await
        else {
            // Shutdown while PostgreSQL was away: the batch stays pending.
            break;
        };

        // 3. Acknowledged, then trimmed.
        let acked = async {
            let c = conns.cmd().await?;
            within(config.timeout, stream::ack(c, &event, &ids)).await
        }
        .await;
        if let Err(e) = acked {
            // Recorded but not acknowledged: it comes back (claimed) and
            // changes nothing the second time.
            tracing::warn!(event = %event, error = %e, "ledger: cannot acknowledge a written batch");
            conns.cmd = None;
        } else {
            let trimmed = async {
                let c = conns.cmd().await?;
                within(config.timeout, stream::trim(c, &event)).await
            }
            .await;
            if let Err(e) = trimmed {
                tracing::debug!(event = %event, error = %e, "ledger: trim failed");
            }
            if last_forget.elapsed() >= FORGET_EVERY {
                last_forget = Instant::now();
                let forgot = async {
                    let c = conns.cmd().await?;
                    within(
                        config.timeout,
                        stream::forget_idle_consumers(c, &event, forget_ms),
                    )
                    .await
                }
                .await;
                match forgot {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(event = %event, consumers = n, "ledger: forgot consumers idle with nothing pending")
                    }
                    Err(e) => {
                        tracing::debug!(event = %event, error = %e, "ledger: cannot forget idle consumers")
                    }
                }
            }
        }
        metrics.update(&event, |s| {
            s.entries += applied.new_entries as u64;
            s.duplicates += applied.duplicates as u64;
            s.dead_letters += applied.dead_letters as u64;
            s.batches += 1;
            if let Some(c) = &applied.check {
                s.checks += 1;
                s.drift_units = c.drift_units;
                s.category_drift = c
                    .categories
                    .iter()
                    .map(|c| (c.category.clone(), c.drift_units))
                    .collect();
            }
        });
        if last_lag.elapsed() >= Duration::from_secs(1) {
            last_lag = Instant::now();
            refresh_lag(&mut conns, &event, &metrics, config.timeout).await;
        }
    }
    tracing::debug!(event = %event, "ledger: task stopped");
}

#[allow(clippy::too_many_arguments)]
async fn next_batch(
    conns: &mut Conns,
    event: &EventId,
    consumer: &str,
    config: &ConsumerConfig,
    claim_ms: u64,
    flush_ms: u64,
    cursor: &mut String,
) -> Result<Vec<RawEntry>> {
    let c = conns.cmd().await?;
    let (next, claimed) = within(
        config.timeout,
        stream::autoclaim(c, event, consumer, claim_ms, cursor, config.batch),
    )
    .await?;
    *cursor = next;
    if !claimed.is_empty() {
        tracing::info!(event = %event, entries = claimed.len(), "ledger: claimed entries another consumer left pending");
        return Ok(claimed);
    }
    let r = conns.read().await?;
    within(
        config.timeout + config.flush,
        stream::read_new(r, event, consumer, config.batch, flush_ms),
    )
    .await
}

/// Writes the batch, retrying until it is committed; `None` when shutdown
/// came while PostgreSQL could not take it.
async fn write_batch(
    pg: &mut Option<Ledger>,
    conns: &mut Conns,
    event: &EventId,
    parsed: &[Parsed],
    config: &ConsumerConfig,
    stop: &watch::Receiver<bool>,
    metrics: &Metrics,
) -> Option<crate::store::Applied> {
    let mut backoff = Backoff::new(config.backoff_max);
    let mut failures = 0u64;
    loop {
        let attempt = async {
            if pg.as_ref().is_none_or(Ledger::is_closed) {
                *pg = Some(Ledger::connect(&config.postgres_url, config.timeout).await?);
            }
            let Some(ledger) = pg.as_mut() else {
                return Err(LedgerError::Protocol("no database connection".into()));
            };
            // The exact check asks Redis, inside the transaction, whether
            // this batch is all the group has pending.
            let mut check_conn = conns.cmd().await.ok().cloned();
            let n = parsed.len() as u64;
            let timeout = config.timeout;
            let exact = move || async move {
                match check_conn.as_mut() {
                    Some(c) => matches!(
                        within(timeout, stream::pending_count(c, event)).await,
                        Ok(p) if p == n
                    ),
                    None => false,
                }
            };
            within(
                config.write_timeout,
                ledger.apply_batch(event, parsed, exact),
            )
            .await
        }
        .await;
        match attempt {
            Ok(applied) => {
                if failures > 0 {
                    tracing::info!(event = %event, failures, "ledger: database back, batch written");
                }
                return Some(applied);
            }
            Err(e) => {
                failures += 1;
                metrics.update(event, |s| s.write_failures += 1);
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(event = %event, error = %e, failures,
                        "ledger: cannot write a batch; keeping it pending and retrying");
                }
                // A failed or timed-out transaction leaves the connection
                // in doubt: start over on a new one.
                *pg = None;
                if backoff.sleep(stop).await {
                    return None;
                }
            }
        }
    }
}

async fn refresh_lag(conns: &mut Conns, event: &EventId, metrics: &Metrics, timeout: Duration) {
    let lag = async {
        let c = conns.cmd().await?;
        within(timeout, stream::stream_lag(c, event)).await
    }
    .await;
    if let Ok(lag) = lag {
        metrics.update(event, |s| {
            s.lag_entries = lag.entries;
            s.lag_seconds = lag.seconds;
        });
    }
}
