//! Prometheus metrics of one gateway, rendered at `/metrics`.
//!
//! Each gateway instance owns its own recorder (no process-global state),
//! so several gateways in one process — the tests — keep separate figures.
//! Names follow Prometheus conventions: base units, counters end in
//! `_total`. Room-wide figures that come from the shared store (joins,
//! admissions, claims, queue length) are the same on every gateway sharing
//! it: aggregate them with `max`, not `sum`. Per-gateway figures (upstream
//! requests, challenges served, rejections) add up with `sum`.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `sluice_joins_total` | counter | room | seqs handed out (store-wide) |
//! | `sluice_admissions_total` | counter | room | seqs admitted (store-wide) |
//! | `sluice_claims_total` | counter | room | admissions claimed by their visitor (store-wide) |
//! | `sluice_refunds_total` | counter | room | no-show slots given back (store-wide) |
//! | `sluice_queue_length` | gauge | room | visitors waiting |
//! | `sluice_active_sessions` | gauge | room | admitted visitors active on the site |
//! | `sluice_admission_rate_per_second` | gauge | room | configured admission rate |
//! | `sluice_admits_per_second` | gauge | room | measured admission rate |
//! | `sluice_pow_difficulty_bits` | gauge | room | current global difficulty |
//! | `sluice_store_up` | gauge | room | 1 when the store answered the last tick |
//! | `sluice_challenges_total` | counter | room | challenges issued by this gateway |
//! | `sluice_join_store_steps_total` | counter | room | store steps this gateway sent for joins paid for by a proof of work, on Redis (joins that arrive while one is on its way go together in the next step) |
//! | `sluice_join_store_step_joins_total` | counter | room | the joins those steps carried: divided by the steps, the mean batch |
//! | `sluice_pow_rejections_total` | counter | room, code | joins refused for their proof of work |
//! | `sluice_invites_total` | counter | room, result | invite codes of invite-only rooms: `redeemed`, `returned` (a failed join gave its use back), or a refusal's reason (`required`, `malformed`, `unknown`, `exhausted`, `revoked`, `expired`) |
//! | `sluice_room_full_total` | counter | room | challenges and joins a `reject` room refused with 503 `room_full` |
//! | `sluice_rate_limited_total` | counter | room, limit | requests refused by a rate limit: `network` (challenges and joins per client network, `join_limit_per_prefix_per_min`), `holds` (hold requests per admitted visitor, `limits.holds_per_visitor_per_min`; `room` is the room selling the event) |
//! | `sluice_crawler_requests_total` | counter | room, crawler, result | requests claiming to be a verified crawler (a Web Bot Auth signature, or a crawler's User-Agent with reverse DNS configured): `passed`, `rate_limited`, or why it was not verified (`malformed`, `tag`, `alg`, `params`, `components`, `signer`, `stale`, `expired`, `nonce`, `directory`, `unknown_key`, `signature`, `replayed`, `replay_full`, `replay_store`, `room`, `no_ptr`, `hostname`, `forward`, `dns`, `busy`); `crawler` is `unknown` when no configured crawler can be named |
//! | `sluice_waiting_room_served_total` | counter | room, kind | waiting answers (`page` or `json`) |
//! | `sluice_upstream_request_duration_seconds` | histogram | status_class | time to the origin's response headers |
//! | `sluice_upstream_errors_total` | counter | kind | `unreachable`, `timeout` or `tls` (a failed handshake with an https origin) |
//! | `sluice_origin_tls_insecure` | gauge | | 1 when `proxy.insecure_skip_verify` leaves the https origin's certificate unchecked |
//! | `sluice_holds_total` | counter | outcome | hold attempts by outcome |
//! | `sluice_hold_store_steps_total` | counter | | store steps this gateway sent for holds, on Redis without `replication.wait_replicas` (holds of one event that arrive while its steps are on their way go together in the next step) |
//! | `sluice_hold_store_step_holds_total` | counter | | the holds those steps carried: divided by the steps, the mean batch |
//! | `sluice_hold_replication_lagged_total` | counter | op | holds (`hold`) and payment confirmations (`confirm`) fewer Redis replicas acknowledged than `replication.wait_replicas` asks (answered 503; the hold released again) |
//! | `sluice_adaptive_rate_per_second` | gauge | room | the rate adaptive admission set (steering gateway) |
//! | `sluice_adaptive_decisions_total` | counter | room, decision | adaptive decisions: `increasing`, `decreasing`, `holding`, `overridden` (steering gateway) |
//! | `sluice_origin_p99_seconds` | gauge | room | the origin's p99 latency in the last adaptive window (steering gateway) |
//! | `sluice_origin_error_ratio` | gauge | room | share of failed upstream requests in the last adaptive window (steering gateway) |
//! | `sluice_token_cache_entries` | gauge | | verified tokens remembered (bounded by `limits.token_cache_entries`) |
//! | `sluice_open_connections` | gauge | io_thread | client connections open on each I/O thread (`server.io_threads`) |
//! | `sluice_tls_reloads_total` | counter | result | certificate reloads (`[server.tls]`, SIGHUP or a file change): `ok` or `failed` (the previous certificates kept) |
//! | `sluice_tls_handshake_failures_total` | counter | | TLS handshakes that failed or did not finish within `timeouts.header_read` |

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use metrics::{Counter, Gauge, Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use sluice_admission::Snapshot;

const META: Metadata<'static> = Metadata::new("sluice", Level::INFO, Some("sluice_gateway"));

/// Buckets of the upstream latency histogram, in seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The metrics of one gateway.
#[derive(Clone)]
pub struct Telemetry {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    /// Upstream latency by status class (1xx … 5xx): the proxy records into
    /// it on every request.
    upstream: Arc<LatencyHistogram>,
    /// What the reservation store's hold batchers sent (on Redis), read at
    /// each scrape.
    hold_batches: Arc<std::sync::OnceLock<Arc<sluice_reservation::batch::BatchStats>>>,
}

/// The upstream latency histogram, counted in atomics and rendered by
/// hand. Not the recorder's histogram: that one keeps every sample until a
/// scrape drains it, so a gateway nobody scrapes would grow by 8 bytes a
/// proxied request (about 1.4 GB an hour at 50,000 requests a second).
///
/// Counts are spread over a few shards, one per thread in turn, so two
/// threads recording at once rarely touch the same cache line.
struct LatencyHistogram {
    shards: [Shard; SHARDS],
}

const SHARDS: usize = 4;
const CLASSES: usize = 5;

/// One shard: per class, the count of each bucket (the last one past every
/// bound) and the sum of the latencies in nanoseconds.
#[repr(align(64))]
struct Shard {
    buckets: [[AtomicU64; LATENCY_BUCKETS.len() + 1]; CLASSES],
    sum_ns: [AtomicU64; CLASSES],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            shards: std::array::from_fn(|_| Shard {
                buckets: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
                sum_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        }
    }
}

impl LatencyHistogram {
    fn record(&self, class: usize, seconds: f64) {
        thread_local! {
            static SHARD: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
            };
        }
        let shard = &self.shards[SHARD.with(|s| *s)];
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&le| seconds <= le)
            .unwrap_or(LATENCY_BUCKETS.len());
        shard.buckets[class][bucket].fetch_add(1, Ordering::Relaxed);
        // Saturating float-to-int: a NaN or negative latency adds nothing.
        shard.sum_ns[class].fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }

    /// The Prometheus text of the histogram, one series per status class.
    fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        const NAME: &str = "sluice_upstream_request_duration_seconds";
        let _ = writeln!(out, "# TYPE {NAME} histogram");
        for class in 0..CLASSES {
            let label = format!("status_class=\"{}xx\"", class + 1);
            let mut counts = [0u64; LATENCY_BUCKETS.len() + 1];
            let mut sum_ns = 0u64;
            for shard in &self.shards {
                for (c, b) in counts.iter_mut().zip(&shard.buckets[class]) {
                    *c += b.load(Ordering::Relaxed);
                }
                sum_ns += shard.sum_ns[class].load(Ordering::Relaxed);
            }
            let mut cumulative = 0;
            for (le, count) in LATENCY_BUCKETS.iter().zip(counts) {
                cumulative += count;
                let _ = writeln!(out, "{NAME}_bucket{{{label},le=\"{le}\"}} {cumulative}");
            }
            cumulative += counts[LATENCY_BUCKETS.len()];
            let _ = writeln!(out, "{NAME}_bucket{{{label},le=\"+Inf\"}} {cumulative}");
            let _ = writeln!(out, "{NAME}_sum{{{label}}} {}", sum_ns as f64 / 1e9);
            let _ = writeln!(out, "{NAME}_count{{{label}}} {cumulative}");
        }
        out.push('\n');
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    /// A fresh registry.
    pub fn new() -> Telemetry {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        Telemetry {
            recorder: Arc::new(recorder),
            handle,
            upstream: Arc::new(LatencyHistogram::default()),
            hold_batches: Arc::default(),
        }
    }

    /// Exports what the reservation store's hold batchers send
    /// (`sluice_hold_store_steps_total`, `sluice_hold_store_step_holds_total`).
    pub fn watch_hold_batches(&self, stats: Arc<sluice_reservation::batch::BatchStats>) {
        let _ = self.hold_batches.set(stats);
    }

    fn counter(&self, name: &'static str, labels: &[(&'static str, String)]) -> Counter {
        let labels: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::new(*k, v.clone()))
            .collect();
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &META)
    }

    fn gauge(&self, name: &'static str, labels: &[(&'static str, String)]) -> Gauge {
        let labels: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::new(*k, v.clone()))
            .collect();
        self.recorder
            .register_gauge(&Key::from_parts(name, labels), &META)
    }

    /// What the room's join batchers sent (every tick): store steps of
    /// joins paid for by a proof of work, and the joins they carried.
    pub fn join_steps(&self, room: &str, stats: &sluice_admission::batch::BatchStats) {
        let l = [("room", room.to_owned())];
        self.counter("sluice_join_store_steps_total", &l)
            .absolute(stats.steps());
        self.counter("sluice_join_store_step_joins_total", &l)
            .absolute(stats.items());
    }

    /// Records a room's snapshot (every tick).
    pub fn room(&self, snap: &Snapshot, admits_per_sec: f64, difficulty_bits: u8, store_up: bool) {
        let l = [("room", snap.room.clone())];
        self.counter("sluice_joins_total", &l)
            .absolute(snap.joins_total);
        self.counter("sluice_admissions_total", &l)
            .absolute(snap.admitted_total);
        self.counter("sluice_claims_total", &l)
            .absolute(snap.claimed_total);
        self.counter("sluice_refunds_total", &l)
            .absolute(snap.refunded_total);
        self.gauge("sluice_queue_length", &l)
            .set(snap.queue_length() as f64);
        self.gauge("sluice_active_sessions", &l)
            .set(snap.active_sessions as f64);
        self.gauge("sluice_admission_rate_per_second", &l)
            .set(snap.rate_per_sec);
        self.gauge("sluice_admits_per_second", &l)
            .set(admits_per_sec);
        self.gauge("sluice_pow_difficulty_bits", &l)
            .set(f64::from(difficulty_bits));
        self.gauge("sluice_store_up", &l)
            .set(if store_up { 1.0 } else { 0.0 });
    }

    /// A challenge was issued.
    pub fn challenge(&self, room: &str) {
        self.counter("sluice_challenges_total", &[("room", room.to_owned())])
            .increment(1);
    }

    /// A challenge or join a `reject` room refused as full.
    pub fn room_full(&self, room: &str) {
        self.counter("sluice_room_full_total", &[("room", room.to_owned())])
            .increment(1);
    }

    /// An invite code checked, redeemed, given back or refused (`result`:
    /// `redeemed`, `returned`, or the refusal's reason).
    pub fn invite(&self, room: &str, result: &str) {
        self.counter(
            "sluice_invites_total",
            &[("room", room.to_owned()), ("result", result.to_owned())],
        )
        .increment(1);
    }

    /// A request claiming to be a crawler: `passed`, `rate_limited`, or
    /// the reason it was not verified.
    pub fn crawler(&self, room: &str, crawler: &str, result: &str) {
        self.counter(
            "sluice_crawler_requests_total",
            &[
                ("room", room.to_owned()),
                ("crawler", crawler.to_owned()),
                ("result", result.to_owned()),
            ],
        )
        .increment(1);
    }

    /// A join was refused for its proof of work.
    pub fn pow_rejected(&self, room: &str, code: &str) {
        self.counter(
            "sluice_pow_rejections_total",
            &[("room", room.to_owned()), ("code", code.to_owned())],
        )
        .increment(1);
    }

    /// Entries of the verified-token cache (`limits.token_cache_entries`
    /// bounds it), read at each scrape.
    pub fn token_cache(&self, entries: usize) {
        self.gauge("sluice_token_cache_entries", &[])
            .set(entries as f64);
    }

    /// The gauge of the client connections open on I/O thread `thread`.
    pub fn open_connections(&self, thread: usize) -> Gauge {
        self.gauge(
            "sluice_open_connections",
            &[("io_thread", thread.to_string())],
        )
    }

    /// Whether the https origin's certificate goes unchecked
    /// (`proxy.insecure_skip_verify`).
    pub fn origin_tls_insecure(&self, insecure: bool) {
        self.gauge("sluice_origin_tls_insecure", &[])
            .set(if insecure { 1.0 } else { 0.0 });
    }

    /// A request was refused by a rate limit: `network` (challenges, joins
    /// and passthroughs per client network), `holds` (hold requests per
    /// visitor) or `polls` (status polls per queue token).
    pub fn rate_limited(&self, room: &str, limit: &'static str) {
        self.counter(
            "sluice_rate_limited_total",
            &[("room", room.to_owned()), ("limit", limit.to_owned())],
        )
        .increment(1);
    }

    /// Settings read from the store were refused (unparseable, oversized,
    /// invalid); the last good ones stay in force.
    pub fn settings_rejected(&self, room: &str) {
        self.counter(
            "sluice_settings_rejected_total",
            &[("room", room.to_owned())],
        )
        .increment(1);
    }

    /// The room's revoke set (every tick): sessions remembered as ended,
    /// and 1 while a revoke it could not keep (past
    /// `limits.ended_sessions_per_room`) may still have a valid token, so
    /// admitted requests are checked with the store.
    pub fn ended_sessions(&self, room: &str, remembered: usize, overflowing: bool) {
        let l = [("room", room.to_owned())];
        self.gauge("sluice_ended_sessions", &l)
            .set(remembered as f64);
        self.gauge("sluice_ended_overflow", &l)
            .set(if overflowing { 1.0 } else { 0.0 });
    }

    /// The ledger's lag on an event's stream (every second, with Redis):
    /// entries not yet written to PostgreSQL, the age of the oldest, and 1
    /// while past `ledger.lag_alert_entries` or `ledger.lag_alert` (or no
    /// ledger has ever read the stream while one is configured).
    pub fn ledger_lag(&self, event: &str, entries: u64, seconds: f64, behind: bool) {
        let l = [("event", event.to_owned())];
        self.gauge("sluice_ledger_lag_entries", &l)
            .set(entries as f64);
        self.gauge("sluice_ledger_lag_seconds", &l).set(seconds);
        self.gauge("sluice_ledger_behind", &l)
            .set(if behind { 1.0 } else { 0.0 });
    }

    /// The ledger's last reconciliation of an event: its available units
    /// minus the store's at the same stream entry (0: they agreed).
    pub fn ledger_drift(&self, event: &str, units: i64) {
        self.gauge("sluice_ledger_drift_units", &[("event", event.to_owned())])
            .set(units as f64);
    }

    /// The same for one category of the event: reported once it has
    /// drifted, 0 again once it agrees.
    pub fn ledger_category_drift(&self, event: &str, category: &str, units: i64) {
        self.gauge(
            "sluice_ledger_category_drift_units",
            &[
                ("event", event.to_owned()),
                ("category", category.to_owned()),
            ],
        )
        .set(units as f64);
    }

    /// A rebuild of a lost event from the ledger ended with `outcome`
    /// (`restored`, `present`, `unknown`, `invalid`, `failed`).
    pub fn ledger_rebuild(&self, outcome: &'static str) {
        self.counter(
            "sluice_ledger_rebuilds_total",
            &[("outcome", outcome.to_owned())],
        )
        .increment(1);
    }

    /// A waiting answer was served (`page` or `json`).
    pub fn waiting_served(&self, room: &str, kind: &'static str) {
        self.counter(
            "sluice_waiting_room_served_total",
            &[("room", room.to_owned()), ("kind", kind.to_owned())],
        )
        .increment(1);
    }

    /// The origin answered (headers) after `seconds` with `status`.
    pub fn upstream(&self, status: u16, seconds: f64) {
        let class = usize::from(status / 100).clamp(1, CLASSES) - 1;
        self.upstream.record(class, seconds);
    }

    /// The origin could not be reached (`unreachable`) or was too slow
    /// (`timeout`).
    pub fn upstream_error(&self, kind: &'static str) {
        self.counter("sluice_upstream_errors_total", &[("kind", kind.to_owned())])
            .increment(1);
    }

    /// A connection or request was refused at once because `what`
    /// (`connection`, `store` or `origin`) was at its in-flight bound.
    pub fn shed(&self, what: &'static str) {
        self.counter("sluice_shed_total", &[("what", what.to_owned())])
            .increment(1);
    }

    /// A reload of the TLS certificates succeeded (`ok`) or failed.
    pub fn tls_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.counter("sluice_tls_reloads_total", &[("result", result.to_owned())])
            .increment(1);
    }

    /// A TLS handshake failed or timed out.
    pub fn tls_handshake_failed(&self) {
        self.counter("sluice_tls_handshake_failures_total", &[])
            .increment(1);
    }

    /// `n` stock feed rows ended with `result` (`accepted` into the lane,
    /// `applied`, `replayed`, `rejected`).
    pub fn feed_rows(&self, result: &'static str, n: u64) {
        self.counter("sluice_feed_rows_total", &[("result", result.to_owned())])
            .increment(n);
    }

    /// Rows waiting in an event's feed lane.
    pub fn feed_depth(&self, event: &str, depth: u64) {
        self.gauge("sluice_feed_depth", &[("event", event.to_owned())])
            .set(depth as f64);
    }

    /// A hold attempt ended with `outcome`.
    pub fn hold(&self, outcome: &'static str) {
        self.counter("sluice_holds_total", &[("outcome", outcome.to_owned())])
            .increment(1);
    }

    /// Fewer Redis replicas than configured acknowledged a `hold` or a
    /// `confirm` (it was answered 503).
    pub fn replication_lagged(&self, op: &'static str) {
        self.counter(
            "sluice_hold_replication_lagged_total",
            &[("op", op.to_owned())],
        )
        .increment(1);
    }

    /// An adaptive admission decision of the steering gateway.
    pub fn adaptive(
        &self,
        room: &str,
        decision: &'static str,
        rate: f64,
        p99_ms: Option<f64>,
        error_ratio: Option<f64>,
    ) {
        let l = [("room", room.to_owned())];
        self.gauge("sluice_adaptive_rate_per_second", &l).set(rate);
        self.counter(
            "sluice_adaptive_decisions_total",
            &[("room", room.to_owned()), ("decision", decision.to_owned())],
        )
        .increment(1);
        if let Some(p) = p99_ms {
            self.gauge("sluice_origin_p99_seconds", &l).set(p / 1000.0);
        }
        if let Some(e) = error_ratio {
            self.gauge("sluice_origin_error_ratio", &l).set(e);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        if let Some(stats) = self.hold_batches.get() {
            self.counter("sluice_hold_store_steps_total", &[])
                .absolute(stats.steps());
            self.counter("sluice_hold_store_step_holds_total", &[])
                .absolute(stats.items());
        }
        self.handle.run_upkeep();
        let mut out = self.handle.render();
        if !out.is_empty() && !out.ends_with("\n\n") {
            out.push('\n');
        }
        self.upstream.render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The value of the one line of `text` that starts with `series `.
    fn value(text: &str, series: &str) -> f64 {
        let prefix = format!("{series} ");
        let mut found = text.lines().filter_map(|l| l.strip_prefix(&prefix));
        let v = found
            .next()
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        assert!(found.next().is_none(), "{series} twice");
        v.parse().unwrap()
    }

    #[test]
    fn upstream_latency_is_a_cumulative_histogram_per_status_class() {
        let t = Telemetry::new();
        t.upstream(200, 0.0005);
        t.upstream(204, 0.003);
        t.upstream(201, 0.003);
        t.upstream(503, 42.0); // past every bound
        t.upstream(99, 0.0); // below 1xx: counted as 1xx, never a panic
        t.upstream(200, f64::NAN); // counted, adds nothing to the sum
        let text = t.render();
        let m = "sluice_upstream_request_duration_seconds";
        assert_eq!(text.matches(&format!("# TYPE {m} histogram")).count(), 1);
        // (series, labels, value); every class is there from the start.
        let want = [
            ("bucket", "status_class=\"2xx\",le=\"0.001\"", 1.0),
            ("bucket", "status_class=\"2xx\",le=\"0.0025\"", 1.0),
            ("bucket", "status_class=\"2xx\",le=\"0.005\"", 3.0),
            ("bucket", "status_class=\"2xx\",le=\"30\"", 3.0),
            ("bucket", "status_class=\"2xx\",le=\"+Inf\"", 4.0),
            ("count", "status_class=\"2xx\"", 4.0),
            ("bucket", "status_class=\"5xx\",le=\"30\"", 0.0),
            ("bucket", "status_class=\"5xx\",le=\"+Inf\"", 1.0),
            ("count", "status_class=\"1xx\"", 1.0),
            ("count", "status_class=\"3xx\"", 0.0),
        ];
        for (series, labels, v) in want {
            assert_eq!(
                value(&text, &format!("{m}_{series}{{{labels}}}")),
                v,
                "{series} {labels}"
            );
        }
        let sum = value(&text, &format!("{m}_sum{{status_class=\"2xx\"}}"));
        assert!((sum - 0.0065).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        let t = Telemetry::new();
        std::thread::scope(|s| {
            for _ in 0..8 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..10_000u32 {
                        t.upstream(200, f64::from(i % 7) / 1000.0);
                    }
                });
            }
        });
        let text = t.render();
        let m = "sluice_upstream_request_duration_seconds";
        assert_eq!(
            value(&text, &format!("{m}_count{{status_class=\"2xx\"}}")),
            80_000.0
        );
    }
}
