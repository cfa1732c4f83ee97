//! Server-sent events (issue 21): a waiting visitor's status pushed to it
//! instead of polled, and an event's availability pushed to admitted
//! visitors. Our own framing (a few lines of text per event) rather than
//! axum's `Sse`, so that an idle stream is a watch receiver and a little
//! state, with no timer of its own.
//!
//! # Status streams
//!
//! `GET /_sluice/rooms/{room}/status` with `Accept: text/event-stream`
//! (the queue token as for a poll) answers `text/event-stream`: `event:
//! status` objects with exactly the poll's JSON ([`super::status_of`]),
//! each with an `id` (`w{epoch}.{seq}.{position}` while waiting, the
//! room's state, `admitted`) and the first with a `retry` (the visitor's
//! poll interval: a reconnecting crowd spreads like polls do). Sent when
//! the visitor's state or position changed, no more often than the poll
//! would have been answered; a comment line (`:`) every
//! [`HEARTBEAT`] otherwise. The stream ends after `admitted` (the token,
//! as the poll gives it; the cookie comes with the page's next poll, the
//! same session), `sold_out` or `closed`, and with an end event
//! (`event: end`, `{"code": "token_invalid", "reason": "expired" | "spent"}`) when its token expires
//! or its place is spent. `Last-Event-ID` resumes: an id equal to what
//! would be sent now sends nothing until it changes, `admitted` answers
//! 204 (the EventSource stops: its admission was delivered).
//!
//! # Fan-out
//!
//! A room's streams are grouped by seq into buckets of [`BUCKET`]
//! ([`StreamHub`]), per lane in a room with lanes (each lane's seqs are its
//! own, and so is its frontier); each bucket is one `watch` channel. Every
//! tick of the room ([`crate::gate::rooms::run_ticker`]) wakes a bucket when
//! its frontier crossed into it (admissions: at once), when the room's state
//! changed (all at once), and otherwise at the poll cadence of the
//! bucket's nearest place (far back hears less often), at least every
//! [`HEARTBEAT`]. A stream woken computes its own answer from the
//! snapshot (no store call while it waits) and writes only what changed.
//!
//! The ticker runs on the main runtime, the streams on the I/O threads.
//! Buckets are kept per I/O thread too, and the ticker wakes each thread's
//! **relay** once (a task on that thread), which wakes the thread's due
//! buckets: the streams' wakes are then the thread's own, queued in order
//! before the connections they write to, so an HTTP/2 connection writes
//! the frames of all its woken streams at once instead of one write per
//! frame (each stream woken from another thread used to run between two
//! runs of its connection). Streams subscribed outside an I/O thread
//! (tests) are woken by the ticker itself.
//!
//! # Limits
//!
//! Each stream takes a slot of `limits.max_connections` (over HTTP/1.1 it
//! is also a connection) and of `limits.streams_per_prefix` for its client
//! network; past either: 429 `rate_limited` (`"reason": "streams"`), and
//! the page polls instead. A draining gateway (SIGTERM) ends every stream
//! with a short random `retry`, so clients reconnect to another gateway.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_admission::{QueueClaims, Snapshot};
use sluice_pow::NetPrefix;
use tokio::sync::watch;

use crate::app::clock::now_ms;
use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;
use crate::gate::rooms::Room;

/// Seqs per fan-out bucket.
pub const BUCKET: u64 = 1024;
/// How often an availability stream looks whether its session was
/// revoked (admitted visitors are few: `max_active`).
const REVOKE_CHECK: Duration = Duration::from_secs(1);
/// Longest silence on a stream by default (`limits.stream_heartbeat`): a
/// comment line at least this often keeps proxies and the client's own
/// timers from calling it dead, and finds a client that went away (a write
/// to its closed connection fails at the second heartbeat at the latest,
/// giving its slot back).
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Whether a request asks for a stream.
pub fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

// === the hub ===

struct Bucket {
    tx: Arc<watch::Sender<u64>>,
    woken_ms: u64,
    /// Woken by the ticker, for its thread's relay to send.
    due: bool,
}

/// The thread of a bucket subscribed outside the I/O threads: the ticker
/// wakes it itself.
const NO_RELAY: usize = usize::MAX;

/// By (I/O thread or [`NO_RELAY`], lane, seq / [`BUCKET`]); lane 0 in a
/// room without lanes.
type Buckets = Mutex<HashMap<(usize, usize, u64), Bucket>>;

/// One I/O thread's relay of a room's wakes (module docs, "Fan-out").
#[derive(Default)]
struct Relay {
    notify: tokio::sync::Notify,
    closed: AtomicBool,
}

/// The streams of one room, grouped by I/O thread, lane and seq (module
/// docs, "Fan-out").
#[derive(Default)]
pub struct StreamHub {
    buckets: Arc<Buckets>,
    /// Each I/O thread's relay, started by the thread's first stream.
    relays: Mutex<HashMap<usize, Arc<Relay>>>,
    /// The frontiers (one per lane; the room's without lanes) and the
    /// room's state at the last tick.
    last: Mutex<Option<(Vec<u64>, Signature)>>,
}

impl Drop for StreamHub {
    fn drop(&mut self) {
        for relay in self.relays.lock().values() {
            relay.closed.store(true, Ordering::Release);
            relay.notify.notify_one();
        }
    }
}

/// I/O thread `thread`'s relay: wakes the thread's buckets the ticker
/// marked due, from the thread itself. Ends with the hub.
async fn relay(buckets: Weak<Buckets>, thread: usize, relay: Arc<Relay>) {
    loop {
        relay.notify.notified().await;
        if relay.closed.load(Ordering::Acquire) {
            return;
        }
        let Some(buckets) = buckets.upgrade() else {
            return;
        };
        let due: Vec<Arc<watch::Sender<u64>>> = buckets
            .lock()
            .iter_mut()
            .filter(|((t, _, _), b)| *t == thread && b.due)
            .map(|(_, b)| {
                b.due = false;
                b.tx.clone()
            })
            .collect();
        for tx in due {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }
}

/// The frontier each lane's seqs are measured against: the room's without
/// lanes (lane 0), else each lane's own.
fn frontiers(snap: &Snapshot) -> Vec<u64> {
    if snap.lanes.is_empty() {
        vec![snap.frontier]
    } else {
        snap.lanes.iter().map(|l| l.frontier).collect()
    }
}

/// The lane a queue token's stream is grouped under: its lane's index in
/// a room with lanes (the default lane, the last, for a token without one
/// or naming a lane the room no longer has), 0 without lanes.
pub fn stream_lane(room: &Room, claims: &QueueClaims) -> usize {
    let settings = room.settings();
    let Some(last) = settings.lanes.len().checked_sub(1) else {
        return 0;
    };
    sluice_admission::lanes::lane_index(&settings.lanes, claims.lane.as_deref())
        .ok()
        .flatten()
        .unwrap_or(last)
        .min(last)
}

/// What, changing, every stream of a room must hear at once.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Signature {
    epoch: u64,
    paused: bool,
    closed: bool,
    sold_out: bool,
    prequeue_open: bool,
    drawn: bool,
}

impl StreamHub {
    /// A receiver woken when the bucket of `seq` in `lane` has news (lane
    /// 0 in a room without lanes: [`stream_lane`]), through the relay of
    /// the I/O thread it is subscribed on (started here on the thread's
    /// first stream).
    pub fn subscribe(&self, lane: usize, seq: u64) -> watch::Receiver<u64> {
        let thread = crate::proxy::upstream::io_thread()
            .filter(|_| tokio::runtime::Handle::try_current().is_ok())
            .unwrap_or(NO_RELAY);
        if thread != NO_RELAY
            && let std::collections::hash_map::Entry::Vacant(v) = self.relays.lock().entry(thread)
        {
            let r = v.insert(Arc::default()).clone();
            tokio::spawn(relay(Arc::downgrade(&self.buckets), thread, r));
        }
        let mut buckets = self.buckets.lock();
        buckets
            .entry((thread, lane, seq / BUCKET))
            .or_insert_with(|| Bucket {
                tx: Arc::new(watch::Sender::new(0)),
                woken_ms: now_ms(),
                due: false,
            })
            .tx
            .subscribe()
    }

    /// Streams open on this room.
    pub fn open(&self) -> usize {
        self.buckets
            .lock()
            .values()
            .map(|b| b.tx.receiver_count())
            .sum()
    }

    /// One tick of the room: wakes the buckets with news (module docs).
    /// `cadence` is the poll interval (ms) of a place at a position.
    pub fn tick(&self, snap: &Snapshot, sold_out: bool, now: u64, cadence: impl Fn(u64) -> u64) {
        let sig = Signature {
            epoch: snap.epoch,
            paused: snap.paused,
            closed: snap.closed,
            sold_out,
            prequeue_open: snap.prequeue_open,
            drawn: snap.prequeue_draw.is_some(),
        };
        let now_frontiers = frontiers(snap);
        let (before, all) = match self.last.lock().take() {
            Some((f, s)) => (f, s != sig),
            None => (now_frontiers.clone(), true),
        };
        let heartbeat = HEARTBEAT.as_millis() as u64;
        let mut relayed = Vec::new();
        let mut buckets = self.buckets.lock();
        buckets.retain(|&(thread, lane, b), bucket| {
            if bucket.tx.receiver_count() == 0 {
                return false;
            }
            // A lane the room no longer has: its streams hear the cadence.
            let frontier = now_frontiers.get(lane).copied().unwrap_or(0);
            let before = before.get(lane).copied().unwrap_or(frontier);
            let lo = b * BUCKET;
            let hi = lo + BUCKET - 1;
            // Admissions in this bucket since the last tick.
            let crossed = frontier > before && hi > before && lo <= frontier;
            let nearest = lo.saturating_sub(frontier).max(1);
            let due = now.saturating_sub(bucket.woken_ms) >= cadence(nearest).min(heartbeat);
            if all || crossed || due {
                bucket.woken_ms = now;
                if thread == NO_RELAY {
                    bucket.tx.send_modify(|g| *g = g.wrapping_add(1));
                } else {
                    bucket.due = true;
                    if !relayed.contains(&thread) {
                        relayed.push(thread);
                    }
                }
            }
            true
        });
        drop(buckets);
        let relays = self.relays.lock();
        for thread in relayed {
            if let Some(r) = relays.get(&thread) {
                r.notify.notify_one();
            }
        }
        drop(relays);
        *self.last.lock() = Some((now_frontiers, sig));
    }
}

// === slots ===

/// The gateway's open streams: at most `limits.max_connections` in all and
/// `limits.streams_per_prefix` per client network.
pub struct StreamSlots {
    max: usize,
    per_prefix: u32,
    /// The longest silence on a stream (`limits.stream_heartbeat`).
    heartbeat: Duration,
    open: AtomicUsize,
    by_prefix: Mutex<HashMap<NetPrefix, u32>>,
    /// Flips to true when the gateway starts draining.
    shutdown: watch::Sender<bool>,
}

/// One open stream's slot, given back when the stream ends.
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    prefix: NetPrefix,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.slots.open.fetch_sub(1, Ordering::AcqRel);
        let mut map = self.slots.by_prefix.lock();
        if let Some(n) = map.get_mut(&self.prefix) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.prefix);
            }
        }
    }
}

impl StreamSlots {
    /// Slots for `max` streams, `per_prefix` per network (0: no per-network
    /// cap).
    pub fn new(max: usize, per_prefix: u32, heartbeat: Duration) -> StreamSlots {
        StreamSlots {
            max,
            per_prefix,
            heartbeat,
            open: AtomicUsize::new(0),
            by_prefix: Mutex::new(HashMap::new()),
            shutdown: watch::Sender::new(false),
        }
    }

    /// A slot for a stream of `prefix`, if both bounds allow one.
    pub fn take(self: &Arc<Self>, prefix: NetPrefix) -> Option<StreamSlot> {
        let mut map = self.by_prefix.lock();
        let n = map.entry(prefix).or_insert(0);
        if self.per_prefix > 0 && *n >= self.per_prefix {
            if *n == 0 {
                map.remove(&prefix);
            }
            return None;
        }
        if self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                (o < self.max).then_some(o + 1)
            })
            .is_err()
        {
            if *n == 0 {
                map.remove(&prefix);
            }
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            slots: self.clone(),
            prefix,
        })
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Ends every stream (the gateway drains).
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}

// === framing ===

/// One event: `id`, optional `retry`, `event`, one `data` line (JSON has
/// no raw newlines).
fn frame(id: &str, retry_ms: Option<u64>, event: &str, data: &Value) -> Bytes {
    let mut s = String::with_capacity(160);
    s.push_str("id: ");
    s.push_str(id);
    s.push('\n');
    if let Some(r) = retry_ms {
        s.push_str(&format!("retry: {r}\n"));
    }
    s.push_str("event: ");
    s.push_str(event);
    s.push_str("\ndata: ");
    s.push_str(&data.to_string());
    s.push_str("\n\n");
    Bytes::from(s)
}

/// Marks a response as one of the gateway's own event streams (status or
/// availability), for the edge: such a connection closes after the stream
/// and keeps no deadline task meanwhile (`edge::server`,
/// `release_for_a_stream`).
#[derive(Clone, Copy, Debug)]
pub struct OwnEventStream;

fn stream_response(body: Body) -> Response {
    let mut res = Response::new(body);
    res.extensions_mut().insert(OwnEventStream);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // nginx and others: pass each event on as it comes.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}

fn streams_full(state: &AppState, room: &str) -> Problem {
    state.telemetry().rate_limited(room, "streams");
    Problem::rate_limited(5).with("reason", "streams")
}

/// A reconnect delay spreading a crowd: 1 to 5 s.
fn drain_retry_ms() -> u64 {
    1_000 + rand::random_range(0..4_000)
}

// === the status stream ===

/// `GET /_sluice/rooms/{room}/status` as a stream (module docs).
pub async fn status_stream(
    state: AppState,
    room: Arc<Room>,
    claims: QueueClaims,
    client: ClientInfo,
    last_event_id: Option<String>,
) -> Result<Response, Problem> {
    if last_event_id.as_deref() == Some("admitted") {
        // Delivered before: the EventSource stops on a 204.
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    room.check_poll_limit(claims.epoch, super::poll_key(&room, &claims))
        .map_err(|wait| {
            state.telemetry().rate_limited(room.id(), "polls");
            Problem::rate_limited(wait)
        })?;
    let slot = state
        .stream_slots()
        .take(sluice_pow::network_prefix(client.ip))
        .ok_or_else(|| streams_full(&state, room.id()))?;
    let lane = stream_lane(&room, &claims);
    let rx = room.streams.subscribe(lane, claims.seq);
    let shutdown = state.stream_slots().shutdown_signal();
    let heartbeat = state.stream_slots().heartbeat;
    let ctx = StatusStream {
        heartbeat,
        state,
        room,
        claims,
        client,
        lane,
        rx,
        shutdown,
        sent: last_event_id,
        first: true,
        quiet_since: tokio::time::Instant::now(),
        done: false,
        _slot: slot,
    };
    let body = futures_util::stream::unfold(ctx, |mut ctx| async move {
        let frame = ctx.next().await?;
        Some((Ok::<_, Infallible>(frame), ctx))
    });
    Ok(stream_response(Body::from_stream(body)))
}

struct StatusStream {
    heartbeat: Duration,
    state: AppState,
    room: Arc<Room>,
    claims: QueueClaims,
    client: ClientInfo,
    /// Its fan-out lane ([`stream_lane`]).
    lane: usize,
    rx: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
    /// The id of the last event the client has.
    sent: Option<String>,
    first: bool,
    quiet_since: tokio::time::Instant,
    done: bool,
    _slot: StreamSlot,
}

/// What one look at the visitor's status gave.
enum Look {
    /// Something to send; `end` after it.
    Send(Bytes, bool),
    /// Nothing new.
    Same,
}

impl StatusStream {
    /// The next bytes to write, `None` when the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if std::mem::take(&mut self.first)
            && let Look::Send(b, end) = Box::pin(self.look()).await
        {
            self.done = end;
            return Some(self.mark(b));
        }
        let expires = tokio::time::Instant::now()
            + Duration::from_secs(self.claims.exp.saturating_sub(crate::app::clock::now_s()));
        loop {
            tokio::select! {
                r = self.rx.changed() => {
                    if r.is_err() {
                        // The room's hub dropped the bucket: subscribe again.
                        self.rx = self.room.streams.subscribe(self.lane, self.claims.seq);
                    }
                }
                _ = self.shutdown.changed() => {
                    self.done = true;
                    return Some(Bytes::from(format!("retry: {}\n\n", drain_retry_ms())));
                }
                // The token's expiry, or the heartbeat: the room's ticks
                // wake buckets at least every HEARTBEAT, this at the
                // configured one (and when the ticker stopped with the
                // store). One timer for both.
                () = tokio::time::sleep_until(expires.min(self.quiet_since + self.heartbeat)) => {
                    if tokio::time::Instant::now() >= expires {
                        self.done = true;
                        let e = json!({"code": "token_invalid", "reason": "expired"});
                        return Some(frame("end", None, "end", &e));
                    }
                }
            }
            // Boxed: the look's state (a store call for a claim or a
            // reseat) exists only while it runs, not in every idle
            // stream's memory.
            match Box::pin(self.look()).await {
                Look::Send(b, end) => {
                    self.done = end;
                    return Some(self.mark(b));
                }
                Look::Same if self.quiet_since.elapsed() >= self.heartbeat => {
                    return Some(self.mark(Bytes::from_static(b":\n\n")));
                }
                Look::Same => {}
            }
        }
    }

    fn mark(&mut self, b: Bytes) -> Bytes {
        self.quiet_since = tokio::time::Instant::now();
        b
    }

    /// The visitor's status now, as an event when it is news.
    async fn look(&mut self) -> Look {
        let answer = match super::status_of(
            &self.state,
            &self.room,
            &self.claims,
            &self.client,
            StatusCode::OK,
            None,
        )
        .await
        {
            Ok(Some(a)) => a,
            Ok(None) => {
                let e = json!({"code": "token_invalid", "reason": "spent"});
                return Look::Send(frame("end", None, "end", &e), true);
            }
            // A store fault on the way (a claim, a reseat): try again at
            // the next wake, the place is kept.
            Err(_) => return Look::Same,
        };
        if let Some(t) = &answer.reissued
            && let Ok(c) = self.state.verify_queue(t, self.room.id())
        {
            // Given a place again after a store loss: follow it.
            self.lane = stream_lane(&self.room, &c);
            self.rx = self.room.streams.subscribe(self.lane, c.seq);
            self.claims = c;
        }
        let id = match answer.state {
            "waiting" => format!(
                "w{}.{}.{}",
                self.claims.epoch, self.claims.seq, answer.position
            ),
            other => other.to_owned(),
        };
        if self.sent.as_deref() == Some(id.as_str()) {
            return Look::Same;
        }
        let retry = self
            .sent
            .is_none()
            .then(|| answer.body["poll_after_ms"].as_u64())
            .flatten()
            .map(|r| r.clamp(1_000, 30_000));
        let end = matches!(answer.state, "admitted" | "sold_out" | "closed");
        let b = frame(&id, retry, "status", &answer.body);
        self.sent = Some(id);
        Look::Send(b, end)
    }
}

// === the availability stream ===

/// `GET /_sluice/events/{event}` as a stream: `event: availability` with
/// the JSON answer's fields, when they change (the gateway's view of the
/// event, refreshed every second and by its own stock changes), a comment
/// every [`HEARTBEAT`] otherwise; ends when the visitor's admission
/// expires or is revoked, or the gateway drains.
pub async fn availability_stream(
    state: AppState,
    room: Arc<Room>,
    admission: sluice_admission::AdmitClaims,
    client: ClientInfo,
    view: impl Fn(&AppState) -> Option<Value> + Send + 'static,
) -> Result<Response, Problem> {
    let slot = state
        .stream_slots()
        .take(sluice_pow::network_prefix(client.ip))
        .ok_or_else(|| streams_full(&state, room.id()))?;
    let ctx = Availability {
        heartbeat: state.stream_slots().heartbeat,
        rx: state.events().subscribe(),
        shutdown: state.stream_slots().shutdown_signal(),
        state,
        room,
        admission,
        view: Box::new(view),
        sent: None,
        quiet_since: tokio::time::Instant::now(),
        done: false,
        first: true,
        _slot: slot,
    };
    let body = futures_util::stream::unfold(ctx, |mut ctx| async move {
        let frame = ctx.next().await?;
        Some((Ok::<_, Infallible>(frame), ctx))
    });
    Ok(stream_response(Body::from_stream(body)))
}

type View = Box<dyn Fn(&AppState) -> Option<Value> + Send>;

struct Availability {
    heartbeat: Duration,
    state: AppState,
    room: Arc<Room>,
    admission: sluice_admission::AdmitClaims,
    view: View,
    rx: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
    sent: Option<Value>,
    quiet_since: tokio::time::Instant,
    done: bool,
    first: bool,
    _slot: StreamSlot,
}

impl Availability {
    async fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let expires = tokio::time::Instant::now()
            + Duration::from_secs(
                self.admission
                    .exp
                    .saturating_sub(crate::app::clock::now_s()),
            );
        loop {
            if !std::mem::take(&mut self.first) {
                tokio::select! {
                    _ = self.rx.changed() => {}
                    _ = self.shutdown.changed() => {
                        self.done = true;
                        return Some(Bytes::from(format!("retry: {}\n\n", drain_retry_ms())));
                    }
                    () = tokio::time::sleep_until(expires) => {
                        self.done = true;
                        let e = json!({"code": "not_admitted", "reason": "expired"});
                        return Some(frame("end", None, "end", &e));
                    }
                    // A revoke wakes nothing: looked for every second.
                    () = tokio::time::sleep(REVOKE_CHECK) => {}
                }
            }
            let sid = self.admission.sid.clone().unwrap_or_default();
            if self.room.is_ended(&sid) {
                self.done = true;
                let e = json!({"code": "not_admitted", "reason": "revoked"});
                return Some(frame("end", None, "end", &e));
            }
            match (self.view)(&self.state) {
                Some(v) if self.sent.as_ref() != Some(&v) => {
                    let id = format!("a{}", now_ms());
                    let b = frame(&id, None, "availability", &v);
                    self.sent = Some(v);
                    self.quiet_since = tokio::time::Instant::now();
                    return Some(b);
                }
                _ if self.quiet_since.elapsed() >= self.heartbeat => {
                    self.quiet_since = tokio::time::Instant::now();
                    return Some(Bytes::from_static(b":\n\n"));
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn snap(frontier: u64, tail: u64) -> Snapshot {
        Snapshot {
            frontier,
            tail,
            ..crate::gate::rooms::empty_snapshot("r", &Default::default())
        }
    }

    #[test]
    fn buckets_wake_on_admissions_state_changes_and_their_cadence() {
        let hub = StreamHub::default();
        let near = hub.subscribe(0, 10);
        let far = hub.subscribe(0, 10 * BUCKET + 5);
        let slow = |_pos: u64| 60_000;
        let now = now_ms();
        hub.tick(&snap(0, 20_000), false, now, slow);
        // The first tick is a state change: everyone hears it.
        assert!(near.has_changed().unwrap() && far.has_changed().unwrap());
        let (mut near, mut far) = (near, far);
        near.mark_unchanged();
        far.mark_unchanged();
        // The frontier crosses into the near bucket only.
        hub.tick(&snap(5, 20_000), false, now + 100, slow);
        assert!(near.has_changed().unwrap());
        assert!(!far.has_changed().unwrap());
        near.mark_unchanged();
        // A pause reaches both at once.
        let mut paused = snap(5, 20_000);
        paused.paused = true;
        hub.tick(&paused, false, now + 200, slow);
        assert!(near.has_changed().unwrap() && far.has_changed().unwrap());
        near.mark_unchanged();
        far.mark_unchanged();
        // Nothing new: the heartbeat cadence, then both.
        hub.tick(&paused, false, now + 300, slow);
        assert!(!near.has_changed().unwrap() && !far.has_changed().unwrap());
        hub.tick(&paused, false, now + 200 + 15_000, slow);
        assert!(near.has_changed().unwrap() && far.has_changed().unwrap());
        assert_eq!(hub.open(), 2);
        drop((near, far));
        hub.tick(&paused, false, now + 40_000, slow);
        assert_eq!(hub.buckets.lock().len(), 0);
    }

    /// On an I/O thread a stream is woken by the thread's relay, not by
    /// the ticker's thread: nothing has changed for it until the relay
    /// has run on its own thread; then it has, once per tick; the relay
    /// ends with the hub.
    #[test]
    fn io_threads_hear_the_ticker_through_their_relay() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        crate::proxy::upstream::set_io_thread(3);
        rt.block_on(async {
            let hub = Arc::new(StreamHub::default());
            let mut rx = hub.subscribe(0, 10);
            let mut other = hub.subscribe(0, 5 * BUCKET);
            assert_eq!(hub.relays.lock().len(), 1);
            let ticker = hub.clone();
            let now = now_ms();
            std::thread::spawn(move || ticker.tick(&snap(0, 20_000), false, now, |_| 60_000))
                .join()
                .unwrap();
            // Marked due, not sent: the ticker only woke the relay.
            assert!(!rx.has_changed().unwrap() && !other.has_changed().unwrap());
            assert!(hub.buckets.lock().values().all(|b| b.due));
            tokio::time::timeout(Duration::from_secs(5), rx.changed())
                .await
                .unwrap()
                .unwrap();
            assert!(other.has_changed().unwrap());
            other.mark_unchanged();
            assert!(hub.buckets.lock().values().all(|b| !b.due));
            // The next tick wakes only the bucket the frontier crossed.
            let ticker = hub.clone();
            std::thread::spawn(move || {
                ticker.tick(&snap(20, 20_000), false, now + 100, |_| 60_000)
            })
            .join()
            .unwrap();
            tokio::time::timeout(Duration::from_secs(5), rx.changed())
                .await
                .unwrap()
                .unwrap();
            tokio::task::yield_now().await;
            assert!(!other.has_changed().unwrap());
            let relay = hub.relays.lock()[&3].clone();
            drop(hub);
            assert!(relay.closed.load(Ordering::Acquire));
            // Its task saw it and let go of its relay.
            for _ in 0..100 {
                if Arc::strong_count(&relay) == 1 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(Arc::strong_count(&relay), 1);
            drop((rx, other));
        });
    }

    /// In a room with lanes each lane's seqs are its own: a stream at lane
    /// 1's seq 5 is woken when lane 1's frontier reaches it, not when the
    /// room's (or lane 0's) passes 5.
    #[test]
    fn lanes_wake_on_their_own_frontier() {
        use sluice_admission::store::LaneSnapshot;
        let lanes = |f0: u64, f1: u64| {
            let mut s = snap(f0 + f1, 20_000);
            s.lanes = [f0, f1]
                .iter()
                .map(|&frontier| LaneSnapshot {
                    weight: 1,
                    tail: 10_000,
                    frontier,
                    admitted_total: frontier,
                })
                .collect();
            s
        };
        let hub = StreamHub::default();
        let mut in_one = hub.subscribe(1, 5);
        let mut in_zero = hub.subscribe(0, 5);
        let slow = |_pos: u64| 60_000;
        let now = now_ms();
        hub.tick(&lanes(0, 0), false, now, slow);
        in_one.mark_unchanged();
        in_zero.mark_unchanged();
        // Lane 0 admits up to 50 (the room's frontier passes 5): only lane
        // 0's stream hears of its admission.
        hub.tick(&lanes(50, 0), false, now + 100, slow);
        assert!(in_zero.has_changed().unwrap());
        assert!(!in_one.has_changed().unwrap(), "lane 1 did not move");
        in_zero.mark_unchanged();
        // Lane 1 reaches 5: its stream hears it at once.
        hub.tick(&lanes(50, 5), false, now + 200, slow);
        assert!(in_one.has_changed().unwrap());
        assert!(!in_zero.has_changed().unwrap());
    }

    #[test]
    fn slots_bound_the_gateway_and_each_network() {
        let slots = Arc::new(StreamSlots::new(3, 2, HEARTBEAT));
        let a = sluice_pow::network_prefix("10.0.0.1".parse().unwrap());
        let b = sluice_pow::network_prefix("10.9.0.1".parse().unwrap());
        let a1 = slots.take(a).unwrap();
        let _a2 = slots.take(a).unwrap();
        assert!(slots.take(a).is_none(), "per network");
        let _b1 = slots.take(b).unwrap();
        assert!(slots.take(b).is_none(), "in all");
        drop(a1);
        let b2 = slots.take(b);
        assert!(b2.is_some());
        assert_eq!(slots.open(), 3);
        drop(b2);
        assert_eq!(slots.open(), 2);
    }

    #[test]
    fn frames_are_event_stream_text() {
        let f = frame("w1.2.3", Some(2000), "status", &json!({"state": "waiting"}));
        assert_eq!(
            std::str::from_utf8(&f).unwrap(),
            "id: w1.2.3\nretry: 2000\nevent: status\ndata: {\"state\":\"waiting\"}\n\n"
        );
    }
}
