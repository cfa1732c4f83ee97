//! Stock feeds over HTTP (issue 20): one row applied at once, and the
//! ingestion lane for large syncs.
//!
//! - `POST /_sluice/admin/events/{event}/stock`: one row,
//!   `{"delta": -3, "key": "erp-123", "category"?: "floor"}` or
//!   `{"total": 500, "version": 17, "category"?: "floor"}`, applied in one
//!   store step ([`sluice_reservation::Inventory::apply_stock`]): 200 with
//!   the new counters (`"replayed": true` for a replayed key), or a
//!   refusal with nothing changed (409 `stock_negative`,
//!   `feed_key_reused`, `stale_version`, `below_committed`,
//!   `category_below_committed`; 404 `event_not_found`,
//!   `category_not_found`; 422 `category_required`, `invalid_setting`; 400
//!   `malformed_request`). A stale snapshot is 409 `stale_version` with
//!   `current_version`, as a stale `PUT`.
//! - `POST /_sluice/admin/events/{event}/feed`: `{"rows": [...]}`, 1 to
//!   `feeds.max_batch` rows, each checked for shape at once (one bad row
//!   refuses the batch whole, naming it with `row`, its index; nothing is
//!   queued), then queued and answered 202 `{"accepted", "depth"}`. A
//!   batch that would pass `feeds.max_depth` waiting rows is 503
//!   `feed_full` (with `depth`, `Retry-After`), nothing queued.
//! - `GET /_sluice/admin/events/{event}/feed`: `depth` (rows waiting),
//!   `pending` (taken by a consumer, not finished), `applied`, `replayed`,
//!   `rejected` counts and the last 20 rejected rows with their `code`.
//!
//! # The lane
//!
//! On Redis each event's rows go into a stream, `sluice:feed:{event}`
//! (the event's hash tag: its shard), read by every gateway through one
//! consumer group, `sluice-feed`: each row is delivered to one consumer.
//! A consumer acknowledges and deletes a row once the store answered it;
//! a row taken by a gateway that died is taken over by another consumer
//! after `feeds.claim_after` (`XAUTOCLAIM`). A row applied twice that way
//! changes nothing: a delta's key replays, a snapshot's version is stale.
//! The counts live in `sluice:feed:{event}:stats` (a hash), the last
//! rejected rows in `sluice:feed:{event}:rejected` (a list of 20), the
//! events with a lane in `sluice:feeds` (a set). In memory (one gateway)
//! the lane is a bounded queue per event, lost with the process.
//!
//! Each gateway's consumer applies at most `feeds.rows_per_sec` rows a
//! second (a token bucket, `governor`), taking batches of a tenth of that
//! (at most 500) and sending them to the store in ordered pipelines of up
//! to `feeds.pipeline_rows` rows (default 32) on one connection
//! ([`sluice_reservation::StockBackend::apply_stock_batch`]): one round
//! trip per pipeline, each row still one atomic store step, between which
//! holds run, so a sync of millions of rows takes its time instead of
//! checkout's. A row refused by the store is counted `rejected` and
//! remembered with its code (the codes of the one-row endpoint, plus
//! `inventory_not_ready` for an event whose stock is missing). A store
//! fault leaves the failed pipeline whole, and the rest of the batch, in
//! the lane, to be retried: rows of it that were applied replay (a
//! delta's key) or are stale (a snapshot's version), so nothing is lost
//! or applied twice.
//!
//! Metrics: `sluice_feed_rows_total{result}` (`accepted`, `applied`,
//! `replayed`, `rejected`) and `sluice_feed_depth{event}`.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use redis::Value as RValue;
use serde_json::{Value, json};
use sluice_redis::RedisConn;
use sluice_reservation::{
    CategoryId, EventId, FeedApplied, FeedOutcome, Inventory, StockBackend, StockChange, StockRow,
};

use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::app::telemetry::Telemetry;
use crate::config::FeedsConfig;

/// How many rejected rows an event's lane remembers.
pub const LAST_REJECTED: usize = 20;
/// The consumer group of every lane.
const GROUP: &str = "sluice-feed";
/// The registry of events with a lane (outside any hash tag).
const LANES_KEY: &str = "sluice:feeds";
/// Bound on each Redis call of the lane.
const LANE_TIMEOUT: Duration = Duration::from_secs(5);

// === rows ===

/// A row's JSON checked for shape: the row, or the problem (400
/// `malformed_request` for a wrong shape, 422 `invalid_setting` naming the
/// field for a value out of range).
pub fn parse_row(v: &Value) -> Result<StockRow, Problem> {
    let obj = v.as_object().ok_or_else(|| {
        Problem::malformed("a row is a JSON object: {delta, key} or {total, version}")
    })?;
    if let Some(k) = obj.keys().find(|k| {
        !matches!(
            k.as_str(),
            "delta" | "key" | "total" | "version" | "category"
        )
    }) {
        return Err(Problem::malformed(format!("unknown field {k:?} in a row")));
    }
    let has = |k: &str| obj.contains_key(k);
    let category = match obj.get("category") {
        None | Some(Value::Null) => None,
        Some(c) => Some(c.as_str().and_then(CategoryId::parse).ok_or_else(|| {
            Problem::invalid_setting("category", "must match [A-Za-z0-9_-]{1,32}")
        })?),
    };
    let change = match (has("delta"), has("total")) {
        (true, false) => {
            if has("version") {
                return Err(Problem::malformed("a delta row has no version"));
            }
            let delta = obj
                .get("delta")
                .and_then(Value::as_i64)
                .ok_or_else(|| Problem::invalid_setting("delta", "must be a whole number"))?;
            let key = obj
                .get("key")
                .ok_or_else(|| Problem::malformed("a delta row needs its idempotency key"))?
                .as_str()
                .ok_or_else(|| Problem::invalid_setting("key", "must be a string"))?
                .to_owned();
            StockChange::Delta { delta, key }
        }
        (false, true) => {
            if has("key") {
                return Err(Problem::malformed("a snapshot row has no key"));
            }
            let int = |k: &str| {
                obj.get(k)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| Problem::invalid_setting(k, "must be a whole number ≥ 0"))
            };
            let total = int("total")?;
            if !has("version") {
                return Err(Problem::malformed("a snapshot row needs its version"));
            }
            StockChange::Snapshot {
                total,
                version: int("version")?,
            }
        }
        _ => {
            return Err(Problem::malformed(
                "a row has exactly one of delta (with key) and total (with version)",
            ));
        }
    };
    let row = StockRow { category, change };
    if let Some(reason) = row.problem() {
        let field = match &row.change {
            StockChange::Delta { key, .. } if !sluice_reservation::feed::feed_key_ok(key) => "key",
            StockChange::Delta { .. } => "delta",
            StockChange::Snapshot { .. } => "total",
        };
        return Err(Problem::invalid_setting(field, reason));
    }
    Ok(row)
}

/// A checked row as JSON (what the lane stores and `parse_row` reads).
pub fn row_json(row: &StockRow) -> Value {
    let mut v = match &row.change {
        StockChange::Delta { delta, key } => json!({"delta": delta, "key": key}),
        StockChange::Snapshot { total, version } => json!({"total": total, "version": version}),
    };
    if let Some(c) = &row.category {
        v["category"] = json!(c.as_str());
    }
    v
}

/// The answer to an applied (or replayed) row.
fn applied_json(event: &EventId, row: &StockRow, a: &FeedApplied, replayed: bool) -> Value {
    let mut v = json!({
        "event": event.as_str(),
        "outcome": if replayed { "replayed" } else { "applied" },
        "replayed": replayed,
        "total": a.total,
        "available": a.available,
    });
    if let Some(c) = &row.category {
        v["category"] = json!(c.as_str());
        v["category_total"] = json!(a.category_total);
        v["category_available"] = json!(a.category_available);
    }
    if let Some(ver) = a.version {
        v["version"] = json!(ver);
    }
    v
}

/// A store refusal as its problem; `Ok` for an applied or replayed row.
/// `NotReady` is 503 `inventory_not_ready` (the caller answers 404 first
/// for an event it does not know).
fn outcome_problem(out: FeedOutcome) -> Result<(FeedApplied, bool), Problem> {
    // Each code spelled out at `Problem::new(` (the control tests read
    // the codes the server produces from the sources).
    const CONFLICT: StatusCode = StatusCode::CONFLICT;
    Err(match out {
        FeedOutcome::Applied(a) => return Ok((a, false)),
        FeedOutcome::Replayed(a) => return Ok((a, true)),
        FeedOutcome::Stale { current_version } => Problem::new(
            CONFLICT,
            "stale_version",
            "A snapshot with this version or a newer one was already applied",
        )
        .with("current_version", current_version),
        FeedOutcome::StockNegative { available } => Problem::new(
            CONFLICT,
            "stock_negative",
            "The delta removes more units than are available (held and sold units stay)",
        )
        .with("available", available),
        FeedOutcome::KeyReused => Problem::new(
            CONFLICT,
            "feed_key_reused",
            "This key was applied before with another delta or category",
        ),
        FeedOutcome::BelowCommitted { held, confirmed } => Problem::new(
            CONFLICT,
            "below_committed",
            "The new total is below what visitors already hold or bought",
        )
        .with("held", held)
        .with("confirmed", confirmed),
        FeedOutcome::CategoryBelowCommitted {
            category,
            held,
            confirmed,
        } => Problem::new(
            CONFLICT,
            "category_below_committed",
            "A category's new total is below what visitors already hold or bought in it",
        )
        .with("category", category)
        .with("held", held)
        .with("confirmed", confirmed),
        FeedOutcome::CategoryNotFound { category } => Problem::new(
            StatusCode::NOT_FOUND,
            "category_not_found",
            "The event has no such category",
        )
        .with("category", category),
        FeedOutcome::CategoryRequired => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "category_required",
            "The event has categories: the row must name one",
        ),
        FeedOutcome::NotReady => super::not_ready(),
        FeedOutcome::Invalid { reason } => Problem::invalid_setting("total", reason),
    })
}

// === handlers ===

/// `POST /_sluice/admin/events/{event}/stock`: one row, applied now.
pub async fn admin_post_stock(
    State(state): State<AppState>,
    Path(id): Path<String>,
    client: Option<axum::Extension<crate::edge::client_ip::ClientInfo>>,
    headers: HeaderMap,
    crate::app::extract::JsonBody(body): crate::app::extract::JsonBody<Value>,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let (event, room) = super::known_event(&state, &id).await?;
    let row = parse_row(&body)?;
    let out = state
        .inventory()
        .apply_stock(&event, &row)
        .await
        .map_err(super::store_err)?;
    let who = crate::admin::dashboard::audit_who(&headers, client.as_ref().map(|c| &c.0));
    let (applied, replayed) = match outcome_problem(out) {
        Ok(a) => a,
        Err(p) => {
            tracing::info!(target: "audit", who, event = %id, row = %row_json(&row), code = p.code(),
                "stock row refused");
            return Err(p);
        }
    };
    if !replayed {
        tracing::warn!(target: "audit", who, event = %id, row = %row_json(&row),
            total = applied.total, available = applied.available, "stock row applied");
        let now = state
            .inventory()
            .read(&event)
            .await
            .map_err(super::store_err)?;
        state.events().upsert(&id, &room, now);
    }
    Ok(axum::Json(applied_json(&event, &row, &applied, replayed)).into_response())
}

/// `POST /_sluice/admin/events/{event}/feed`: a batch into the lane.
pub async fn admin_post_feed(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    if let Some(ct) = headers.get(http::header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        if !(ct.starts_with("application/json") || ct.contains("+json")) {
            return Err(Problem::unsupported_media_type());
        }
    }
    let (event, _) = super::known_event(&state, &id).await?;
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| Problem::malformed(format!("invalid JSON body: {e}")))?;
    let rows = body
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("rows"))
        .and_then(Value::as_array)
        .ok_or_else(|| Problem::malformed("the body is {\"rows\": [...]}"))?;
    let max = state.config().feeds.max_batch;
    if rows.is_empty() || rows.len() > max {
        return Err(Problem::invalid_setting(
            "rows",
            format!("must hold 1 to {max} rows"),
        ));
    }
    let mut texts = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        let row = parse_row(r).map_err(|p| p.with("row", i))?;
        texts.push(row_json(&row).to_string());
    }
    let n = texts.len() as u64;
    match state
        .feed_lane()
        .push(&event, texts, state.config().feeds.max_depth)
        .await
    {
        Ok(Pushed::Accepted { depth }) => {
            state.telemetry().feed_rows("accepted", n);
            state.telemetry().feed_depth(event.as_str(), depth);
            Ok((
                StatusCode::ACCEPTED,
                axum::Json(json!({"event": id, "accepted": n, "depth": depth})),
            )
                .into_response())
        }
        Ok(Pushed::Full { depth }) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "feed_full",
            "The event's feed lane is full; retry once it drained",
        )
        .with("depth", depth)
        .with("max_depth", state.config().feeds.max_depth)
        .retry_after(5)),
        Err(e) => Err(Problem::store_unavailable().log_cause(&e)),
    }
}

/// `GET /_sluice/admin/events/{event}/feed`: the lane's state.
pub async fn admin_get_feed(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    state.check_admin(&headers)?;
    let (event, _) = super::known_event(&state, &id).await?;
    let s = state
        .feed_lane()
        .status(&event)
        .await
        .map_err(|e| Problem::store_unavailable().log_cause(&e))?;
    state.telemetry().feed_depth(event.as_str(), s.depth);
    Ok(axum::Json(json!({
        "event": id,
        "depth": s.depth,
        "pending": s.pending,
        "applied": s.applied,
        "replayed": s.replayed,
        "rejected": s.rejected,
        "last_rejected": s.last_rejected,
        "rows_per_sec": state.config().feeds.rows_per_sec,
    }))
    .into_response())
}

// === the lane ===

/// Answer to [`FeedLane::push`].
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; rows waiting now.
    Accepted {
        /// Rows waiting (this batch included).
        depth: u64,
    },
    /// Refused whole: the lane would pass `max_depth`.
    Full {
        /// Rows waiting.
        depth: u64,
    },
}

/// What `GET …/feed` reports.
#[derive(Debug, Default, PartialEq)]
pub struct LaneStatus {
    /// Rows waiting (taken but unfinished ones included on Redis).
    pub depth: u64,
    /// Rows taken by a consumer and not finished.
    pub pending: u64,
    /// Rows applied.
    pub applied: u64,
    /// Rows whose key had been applied (nothing changed).
    pub replayed: u64,
    /// Rows the store refused.
    pub rejected: u64,
    /// The last rejected rows, newest first: `{row, code, at_ms}`.
    pub last_rejected: Vec<Value>,
}

/// How a row ended, for the counts.
#[derive(Clone, Debug)]
pub struct RowResult {
    /// The lane's id of the row.
    pub id: String,
    /// `applied`, `replayed` or `rejected`.
    pub result: &'static str,
    /// For a rejected row: `{row, code, at_ms}`.
    pub rejected: Option<Value>,
}

/// A lane fault (Redis down or answering oddly).
#[derive(Debug, thiserror::Error)]
#[error("feed lane: {0}")]
pub struct LaneError(String);

fn lane_err(e: impl std::fmt::Display) -> LaneError {
    LaneError(e.to_string())
}

/// The ingestion lane, in memory or on Redis.
#[derive(Clone)]
pub enum FeedLane {
    /// One gateway: a bounded queue per event.
    Memory(Arc<MemoryLane>),
    /// Every gateway: a stream per event, one consumer group.
    Redis(RedisLane),
}

impl FeedLane {
    /// Queues `rows` (checked JSON texts) unless the lane would pass
    /// `max_depth`.
    pub async fn push(
        &self,
        event: &EventId,
        rows: Vec<String>,
        max_depth: u64,
    ) -> Result<Pushed, LaneError> {
        match self {
            FeedLane::Memory(m) => Ok(m.push(event, rows, max_depth)),
            FeedLane::Redis(r) => r.push(event, rows, max_depth).await,
        }
    }

    /// Takes up to `n` rows of `event` for this consumer.
    pub async fn take(
        &self,
        event: &EventId,
        n: usize,
    ) -> Result<Vec<(String, String)>, LaneError> {
        match self {
            FeedLane::Memory(m) => Ok(m.take(event, n)),
            FeedLane::Redis(r) => r.take(event, n).await,
        }
    }

    /// Finishes rows: acknowledged, counted, rejected ones remembered.
    /// `unfinished` rows (a store fault) go back to the lane.
    pub async fn done(
        &self,
        event: &EventId,
        results: &[RowResult],
        unfinished: Vec<(String, String)>,
    ) -> Result<(), LaneError> {
        match self {
            FeedLane::Memory(m) => {
                m.done(event, results, unfinished);
                Ok(())
            }
            // Unfinished rows stay pending: `claim_after` hands them out again.
            FeedLane::Redis(r) => r.done(event, results).await,
        }
    }

    /// The lane's counts.
    pub async fn status(&self, event: &EventId) -> Result<LaneStatus, LaneError> {
        match self {
            FeedLane::Memory(m) => Ok(m.status(event)),
            FeedLane::Redis(r) => r.status(event).await,
        }
    }

    /// Events with a lane.
    pub async fn events(&self) -> Result<Vec<EventId>, LaneError> {
        match self {
            FeedLane::Memory(m) => Ok(m.events()),
            FeedLane::Redis(r) => r.events().await,
        }
    }
}

/// The in-memory lane.
#[derive(Default)]
pub struct MemoryLane {
    lanes: Mutex<HashMap<EventId, MemQueue>>,
}

#[derive(Default)]
struct MemQueue {
    rows: VecDeque<String>,
    taken: u64,
    next_id: u64,
    applied: u64,
    replayed: u64,
    rejected: u64,
    last: VecDeque<Value>,
}

impl MemoryLane {
    fn push(&self, event: &EventId, rows: Vec<String>, max_depth: u64) -> Pushed {
        let mut lanes = self.lanes.lock();
        let q = lanes.entry(event.clone()).or_default();
        let depth = q.rows.len() as u64 + q.taken;
        if depth + rows.len() as u64 > max_depth {
            return Pushed::Full { depth };
        }
        q.rows.extend(rows);
        Pushed::Accepted {
            depth: q.rows.len() as u64 + q.taken,
        }
    }

    fn take(&self, event: &EventId, n: usize) -> Vec<(String, String)> {
        let mut lanes = self.lanes.lock();
        let Some(q) = lanes.get_mut(event) else {
            return Vec::new();
        };
        let k = n.min(q.rows.len());
        let mut out = Vec::with_capacity(k);
        for row in q.rows.drain(..k) {
            q.next_id += 1;
            out.push((q.next_id.to_string(), row));
        }
        q.taken += k as u64;
        out
    }

    fn done(&self, event: &EventId, results: &[RowResult], unfinished: Vec<(String, String)>) {
        let mut lanes = self.lanes.lock();
        let Some(q) = lanes.get_mut(event) else {
            return;
        };
        q.taken = q
            .taken
            .saturating_sub((results.len() + unfinished.len()) as u64);
        for (_, row) in unfinished.into_iter().rev() {
            q.rows.push_front(row);
        }
        for r in results {
            match r.result {
                "applied" => q.applied += 1,
                "replayed" => q.replayed += 1,
                _ => q.rejected += 1,
            }
            if let Some(v) = &r.rejected {
                q.last.push_front(v.clone());
                q.last.truncate(LAST_REJECTED);
            }
        }
    }

    fn status(&self, event: &EventId) -> LaneStatus {
        let lanes = self.lanes.lock();
        let Some(q) = lanes.get(event) else {
            return LaneStatus::default();
        };
        LaneStatus {
            depth: q.rows.len() as u64 + q.taken,
            pending: q.taken,
            applied: q.applied,
            replayed: q.replayed,
            rejected: q.rejected,
            last_rejected: q.last.iter().cloned().collect(),
        }
    }

    fn events(&self) -> Vec<EventId> {
        let lanes = self.lanes.lock();
        let mut v: Vec<EventId> = lanes
            .iter()
            .filter(|(_, q)| !q.rows.is_empty())
            .map(|(e, _)| e.clone())
            .collect();
        v.sort();
        v
    }
}

/// The Redis lane: this gateway's consumer in the group.
#[derive(Clone)]
pub struct RedisLane {
    conn: RedisConn,
    consumer: String,
    claim_after_ms: u64,
}

fn stream_key(event: &EventId) -> String {
    format!("sluice:feed:{{{event}}}")
}

fn stats_key(event: &EventId) -> String {
    format!("sluice:feed:{{{event}}}:stats")
}

fn rejected_key(event: &EventId) -> String {
    format!("sluice:feed:{{{event}}}:rejected")
}

/// Stream entries (`[[id, [field, value, …]], …]`, or maps) as `(id, row)`.
fn entries(v: &RValue) -> Vec<(String, String)> {
    let list = match v {
        RValue::Array(a) => a,
        _ => return Vec::new(),
    };
    let text = |v: &RValue| match v {
        RValue::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        RValue::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    for e in list {
        let RValue::Array(parts) = e else { continue };
        let (Some(id), Some(fields)) = (parts.first().and_then(text), parts.get(1)) else {
            continue;
        };
        let pairs: Vec<(RValue, RValue)> = match fields {
            RValue::Array(f) => f
                .chunks(2)
                .filter_map(|c| Some((c.first()?.clone(), c.get(1)?.clone())))
                .collect(),
            RValue::Map(m) => m.clone(),
            _ => continue,
        };
        if let Some(row) = pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some("r"))
            .and_then(|(_, v)| text(v))
        {
            out.push((id, row));
        }
    }
    out
}

impl RedisLane {
    /// A consumer named `consumer` (unique per gateway process).
    pub fn new(conn: RedisConn, consumer: String, claim_after: Duration) -> Self {
        Self {
            conn,
            consumer,
            claim_after_ms: u64::try_from(claim_after.as_millis()).unwrap_or(u64::MAX),
        }
    }

    async fn q<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, LaneError> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(LANE_TIMEOUT, cmd.query_async(&mut conn))
            .await
            .map_err(|_| LaneError("timeout".into()))?
            .map_err(lane_err)
    }

    async fn pipe<T: redis::FromRedisValue>(&self, p: &redis::Pipeline) -> Result<T, LaneError> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(LANE_TIMEOUT, p.query_async(&mut conn))
            .await
            .map_err(|_| LaneError("timeout".into()))?
            .map_err(lane_err)
    }

    /// Creates the group (from the stream's start) when missing.
    async fn ensure_group(&self, event: &EventId) -> Result<(), LaneError> {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(stream_key(event))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM");
        match self.q::<RValue>(&cmd).await {
            Ok(_) => Ok(()),
            Err(e) if e.0.contains("BUSYGROUP") => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn push(
        &self,
        event: &EventId,
        rows: Vec<String>,
        max_depth: u64,
    ) -> Result<Pushed, LaneError> {
        let key = stream_key(event);
        self.ensure_group(event).await?;
        let depth: u64 = self.q(redis::cmd("XLEN").arg(&key)).await?;
        if depth + rows.len() as u64 > max_depth {
            return Ok(Pushed::Full { depth });
        }
        let mut p = redis::pipe();
        for r in &rows {
            p.cmd("XADD").arg(&key).arg("*").arg("r").arg(r).ignore();
        }
        p.cmd("XLEN").arg(&key);
        let (depth,): (u64,) = self.pipe(&p).await?;
        self.q::<i64>(redis::cmd("SADD").arg(LANES_KEY).arg(event.as_str()))
            .await?;
        Ok(Pushed::Accepted { depth })
    }

    async fn take(&self, event: &EventId, n: usize) -> Result<Vec<(String, String)>, LaneError> {
        let key = stream_key(event);
        // Rows a consumer took and never finished (its gateway died).
        let claimed = self
            .q::<RValue>(
                redis::cmd("XAUTOCLAIM")
                    .arg(&key)
                    .arg(GROUP)
                    .arg(&self.consumer)
                    .arg(self.claim_after_ms)
                    .arg("0-0")
                    .arg("COUNT")
                    .arg(n),
            )
            .await;
        let mut out = match claimed {
            Ok(RValue::Array(parts)) => parts.get(1).map(entries).unwrap_or_default(),
            Ok(_) => Vec::new(),
            Err(e) if e.0.contains("NOGROUP") => {
                self.ensure_group(event).await?;
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        if out.len() < n {
            let v: RValue = self
                .q(redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg(&self.consumer)
                    .arg("COUNT")
                    .arg(n - out.len())
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(">"))
                .await?;
            let streams: Vec<RValue> = match v {
                RValue::Array(a) => a,
                RValue::Map(m) => m
                    .into_iter()
                    .map(|(k, v)| RValue::Array(vec![k, v]))
                    .collect(),
                _ => Vec::new(),
            };
            for s in streams {
                if let RValue::Array(kv) = s
                    && let Some(list) = kv.get(1)
                {
                    out.extend(entries(list));
                }
            }
        }
        Ok(out)
    }

    async fn done(&self, event: &EventId, results: &[RowResult]) -> Result<(), LaneError> {
        if results.is_empty() {
            return Ok(());
        }
        let key = stream_key(event);
        let ids: Vec<&str> = results.iter().map(|r| r.id.as_str()).collect();
        let mut p = redis::pipe();
        p.cmd("XACK").arg(&key).arg(GROUP).arg(&ids).ignore();
        p.cmd("XDEL").arg(&key).arg(&ids).ignore();
        let mut counts: HashMap<&str, i64> = HashMap::new();
        for r in results {
            *counts.entry(r.result).or_default() += 1;
        }
        for (result, n) in counts {
            p.cmd("HINCRBY")
                .arg(stats_key(event))
                .arg(result)
                .arg(n)
                .ignore();
        }
        let rejected: Vec<String> = results
            .iter()
            .filter_map(|r| r.rejected.as_ref().map(Value::to_string))
            .collect();
        if !rejected.is_empty() {
            p.cmd("LPUSH")
                .arg(rejected_key(event))
                .arg(&rejected)
                .ignore();
            p.cmd("LTRIM")
                .arg(rejected_key(event))
                .arg(0)
                .arg(LAST_REJECTED - 1)
                .ignore();
        }
        self.pipe::<()>(&p).await
    }

    async fn status(&self, event: &EventId) -> Result<LaneStatus, LaneError> {
        let key = stream_key(event);
        let mut p = redis::pipe();
        p.cmd("XLEN").arg(&key);
        p.cmd("HGETALL").arg(stats_key(event));
        p.cmd("LRANGE")
            .arg(rejected_key(event))
            .arg(0)
            .arg(LAST_REJECTED - 1);
        let (depth, stats, last): (u64, HashMap<String, u64>, Vec<String>) = self.pipe(&p).await?;
        // Pending: taken by a consumer, not finished (no group yet: none).
        let pending = match self
            .q::<RValue>(redis::cmd("XPENDING").arg(&key).arg(GROUP))
            .await
        {
            Ok(RValue::Array(a)) => match a.first() {
                Some(RValue::Int(n)) => u64::try_from(*n).unwrap_or(0),
                _ => 0,
            },
            _ => 0,
        };
        Ok(LaneStatus {
            depth,
            pending,
            applied: stats.get("applied").copied().unwrap_or(0),
            replayed: stats.get("replayed").copied().unwrap_or(0),
            rejected: stats.get("rejected").copied().unwrap_or(0),
            last_rejected: last
                .iter()
                .filter_map(|t| serde_json::from_str(t).ok())
                .collect(),
        })
    }

    async fn events(&self) -> Result<Vec<EventId>, LaneError> {
        let names: Vec<String> = self.q(redis::cmd("SMEMBERS").arg(LANES_KEY)).await?;
        let mut v: Vec<EventId> = names.iter().filter_map(|n| EventId::parse(n)).collect();
        v.sort();
        Ok(v)
    }
}

// === the consumer ===

/// Applies the lanes' rows, at most `config.rows_per_sec` a second, until
/// the task is aborted (one per gateway). Faults are logged and retried.
pub async fn run_consumer(
    lane: FeedLane,
    inventory: StockBackend,
    config: FeedsConfig,
    telemetry: Telemetry,
) {
    let per_sec = NonZeroU32::new(config.rows_per_sec).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new((config.rows_per_sec / 10).max(1)).unwrap_or(NonZeroU32::MIN);
    let limiter =
        governor::RateLimiter::direct(governor::Quota::per_second(per_sec).allow_burst(burst));
    let batch = usize::try_from(burst.get()).unwrap_or(1).min(500);
    let pipeline = batch.min(config.pipeline_rows).max(1);
    let mut faults = OutageLog::default();
    loop {
        let events = match lane.events().await {
            Ok(e) => {
                faults.answered();
                e
            }
            Err(e) => {
                faults.failed("cannot list the lanes", &e);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut busy = false;
        for event in events {
            let rows = match lane.take(&event, batch).await {
                Ok(r) => r,
                Err(e) => {
                    faults.failed("cannot take rows", &e);
                    continue;
                }
            };
            if rows.is_empty() {
                continue;
            }
            busy = true;
            let mut results = Vec::with_capacity(rows.len());
            let mut unfinished = Vec::new();
            let mut rest = rows.into_iter().peekable();
            while rest.peek().is_some() {
                let chunk: Vec<(String, String)> = rest.by_ref().take(pipeline).collect();
                // The bound holds per row: a chunk waits for as many
                // tokens as it has rows (never more than the burst).
                let n = u32::try_from(chunk.len())
                    .ok()
                    .and_then(NonZeroU32::new)
                    .unwrap_or(NonZeroU32::MIN);
                let _ = limiter.until_n_ready(n).await;
                let mut parsed = Vec::with_capacity(chunk.len());
                let mut chunk_results = Vec::with_capacity(chunk.len());
                for (id, text) in &chunk {
                    match serde_json::from_str::<Value>(text)
                        .ok()
                        .and_then(|v| parse_row(&v).ok())
                    {
                        Some(row) => parsed.push((id, text, row)),
                        None => chunk_results.push(rejected(id.clone(), text, "malformed_request")),
                    }
                }
                let store_rows: Vec<StockRow> = parsed.iter().map(|(_, _, r)| r.clone()).collect();
                match inventory.apply_stock_batch(&event, &store_rows).await {
                    Ok(outcomes) => {
                        for ((id, text, _), outcome) in parsed.iter().zip(outcomes) {
                            chunk_results.push(row_result((*id).clone(), text, outcome));
                        }
                        results.extend(chunk_results);
                    }
                    Err(e) => {
                        // Some rows of the chunk may have been applied:
                        // the chunk goes back whole (applied again, each
                        // replays or is stale), with everything after it.
                        faults.failed("store fault, the batch stays queued", &e);
                        unfinished.extend(chunk);
                        break;
                    }
                }
            }
            unfinished.extend(rest);
            for r in &results {
                telemetry.feed_rows(r.result, 1);
            }
            if let Err(e) = lane.done(&event, &results, unfinished).await {
                faults.failed("cannot finish rows", &e);
            }
            if let Ok(s) = lane.status(&event).await {
                telemetry.feed_depth(event.as_str(), s.depth);
            }
        }
        if !busy {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The consumer's faults, said once per outage: the first failure of an
/// outage is a warning, a retry failing the same way is not logged again
/// (the store's own connection and readiness say it is down), a new
/// cause is, and the store answering again is said once.
#[derive(Default)]
struct OutageLog {
    said: Option<String>,
}

impl OutageLog {
    fn failed(&mut self, what: &str, e: &dyn std::fmt::Display) {
        let text = format!("{what}: {e}");
        if self.said.as_deref() != Some(text.as_str()) {
            tracing::warn!(error = %e, "feed lane: {what} (said once until it changes)");
            self.said = Some(text);
        }
    }

    fn answered(&mut self) {
        if self.said.take().is_some() {
            tracing::info!("feed lane: the store answers again");
        }
    }
}

/// What the lane records of a row the store answered.
fn row_result(id: String, text: &str, outcome: FeedOutcome) -> RowResult {
    match outcome {
        FeedOutcome::Applied(_) => RowResult {
            id,
            result: "applied",
            rejected: None,
        },
        FeedOutcome::Replayed(_) => RowResult {
            id,
            result: "replayed",
            rejected: None,
        },
        other => {
            let code = outcome_problem(other).err().map(|p| p.code()).unwrap_or("");
            rejected(id, text, code)
        }
    }
}

fn rejected(id: String, text: &str, code: &str) -> RowResult {
    let row: Value = serde_json::from_str(text).unwrap_or(Value::String(text.to_owned()));
    RowResult {
        id,
        result: "rejected",
        rejected: Some(json!({
            "row": row,
            "code": code,
            "at_ms": crate::app::clock::now_ms(),
        })),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rows_parse_and_print_back() {
        for v in [
            json!({"delta": -3, "key": "erp-123", "category": "floor"}),
            json!({"delta": 5, "key": "k"}),
            json!({"total": 500, "version": 17, "category": "floor"}),
            json!({"total": 0, "version": 0}),
        ] {
            assert_eq!(row_json(&parse_row(&v).unwrap()), v);
        }
    }

    #[test]
    fn bad_rows_are_refused_with_their_code() {
        for (v, code) in [
            (json!([1]), "malformed_request"),
            (json!({"delta": 1}), "malformed_request"),
            (
                json!({"delta": 1, "key": "k", "total": 3}),
                "malformed_request",
            ),
            (json!({"total": 3}), "malformed_request"),
            (
                json!({"total": 3, "version": 1, "key": "k"}),
                "malformed_request",
            ),
            (
                json!({"delta": 1, "key": "k", "extra": 1}),
                "malformed_request",
            ),
            (json!({}), "malformed_request"),
            (json!({"delta": 0, "key": "k"}), "invalid_setting"),
            (json!({"delta": 1.5, "key": "k"}), "invalid_setting"),
            (json!({"delta": 1, "key": ""}), "invalid_setting"),
            (json!({"delta": 1, "key": "a b"}), "invalid_setting"),
            (json!({"delta": 1, "key": 7}), "invalid_setting"),
            (json!({"total": -1, "version": 1}), "invalid_setting"),
            (json!({"total": 1, "version": "2"}), "invalid_setting"),
            (
                json!({"total": 9_007_199_254_740_993u64, "version": 1}),
                "invalid_setting",
            ),
            (
                json!({"delta": 1, "key": "k", "category": "a:b"}),
                "invalid_setting",
            ),
        ] {
            assert_eq!(parse_row(&v).unwrap_err().code(), code, "{v}");
        }
    }

    #[test]
    fn memory_lane_is_bounded_and_requeues() {
        let lane = MemoryLane::default();
        let ev = EventId::parse("e").unwrap();
        let rows = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
        assert_eq!(lane.push(&ev, rows(3), 4), Pushed::Accepted { depth: 3 });
        assert_eq!(lane.push(&ev, rows(2), 4), Pushed::Full { depth: 3 });
        let taken = lane.take(&ev, 2);
        assert_eq!(taken.len(), 2);
        assert_eq!(lane.status(&ev).pending, 2);
        let results = vec![RowResult {
            id: taken[0].0.clone(),
            result: "applied",
            rejected: None,
        }];
        lane.done(&ev, &results, vec![taken[1].clone()]);
        let s = lane.status(&ev);
        assert_eq!((s.depth, s.pending, s.applied), (2, 0, 1));
        assert_eq!(
            lane.take(&ev, 5)
                .into_iter()
                .map(|(_, r)| r)
                .collect::<Vec<_>>(),
            vec!["1", "2"]
        );
    }
}
