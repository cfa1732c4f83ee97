//! `sluice swarm`: a bounded crowd of real HTTP visitors thrown at a running
//! gateway, and an honest account of what they got.
//!
//! ```text
//! sluice swarm --url http://127.0.0.1:8080 --visitors 500 --concurrency 64 \
//!     --duration 2m --rate 400 --pay-ratio 0.5 --webhook-secret $S \
//!     --admin-token $T --json
//! ```
//!
//! # Life of a visitor
//!
//! 1. **Challenge.** `POST /_sluice/rooms/{room}/challenge`; solved with the
//!    native solver ([`sluice_pow::solve`], one thread, on the blocking pool),
//!    no sooner than the challenge's `min_solve_ms`.
//! 2. **Join** with `return_to`: 201 waiting (a queue token) or 200 admitted.
//! 3. **Poll** `GET …/status` with the queue token as a bearer, sleeping
//!    `poll_after_ms` (capped by `--max-poll-ms`) between polls, until
//!    admitted; `sold_out` or `closed` ends the visit.
//! 4. **Hold** a random quantity (1..=`--max-qty`, default the event's cart
//!    limit) with an `Idempotency-Key`; some visitors replay the key (the
//!    same hold must come back) and some try a second hold, which probes the
//!    cart limit.
//! 5. **Pay or leave.** A `--pay-ratio` share of the holds is paid through
//!    the signed payment webhook; of the rest, half is released and half
//!    left to expire.
//!
//! A `429` or `503` with `Retry-After` is honoured a few times before the
//! visitor gives up. Every request first takes a slot from one global pacer
//! (`--rate`, requests/s), so the whole crowd never exceeds it. With
//! `--url` given several times (gateways sharing one store), requests go to
//! them round-robin, so one visitor's challenge, join, polls and holds land
//! on different gateways, as behind a load balancer. `--arrival-rate`
//! spaces the visitors' arrivals (open loop) instead of letting each
//! finished visitor be replaced at once.
//!
//! # Bounds
//!
//! At most `--visitors` visitors, `--concurrency` at once, `--rate` requests
//! per second, and a hard stop after `--duration` (in-flight requests are
//! dropped). Only loopback targets (`127.0.0.0/8`, `::1`, `localhost`) are
//! accepted unless `--allow-remote`; the check reads the URL's host and
//! happens before any connection. Only `http://` (the binary has no TLS
//! client).
//!
//! # The report and how "oversold" is counted
//!
//! Counted from the answers: every distinct hold granted (201) with its
//! quantity, every confirmation, release and lapse. The **peak of units
//! outstanding** — granted holds not yet released and not past their
//! `expires_at`, plus confirmed ones — is measured at each grant; more than
//! the event's `total` is overselling *seen by the visitors*. With
//! `--admin-token` the event's stock is also read from the admin API after
//! the run: `held + confirmed` above `total`, or `invariant_holds` false, is
//! overselling *seen by the store*. `oversold` is the larger of the two.
//! A visitor whose granted holds add up to more than the cart limit is
//! **above the cart limit**. Both must be 0.
//!
//! Exit status: 0; 3 when oversold, above the cart limit, an idempotent
//! replay returned a different hold, or the store's invariant is broken;
//! 1 when the gateway cannot be used (unreachable, unknown room); 64 for bad
//! flags or a refused remote target.

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal as _, Write as _};
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use serde_json::{Map, Value, json};

use crate::tools::{Failure, failure, usage};

/// Exit status when the run shows overselling or a broken limit (2 is
/// clap's for a flag it cannot parse).
const EXIT_VIOLATION: u8 = 3;
/// Longest wait for one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How often one step is retried after a 429/503 or a lost connection.
const RETRIES: u32 = 5;

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s)
        .map_err(|e| format!("not a duration: {s:?} ({e}; e.g. 30s, 5m)"))
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| (0.0..=1.0).contains(v))
        .ok_or_else(|| format!("expected a number between 0 and 1, got {s:?}"))
}

/// Flags of `sluice swarm`.
#[derive(Debug, Args)]
pub struct SwarmArgs {
    /// The gateway's base URL (http:// only); repeat for gateways sharing
    /// one store: requests are spread over them round-robin.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: Vec<String>,
    /// The room the visitors queue in.
    #[arg(long, default_value = "default")]
    pub room: String,
    /// The event they buy.
    #[arg(long, default_value = "demo")]
    pub event: String,
    /// Visitors in all.
    #[arg(long, default_value_t = 100)]
    pub visitors: u64,
    /// Visitors at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// New visitors per second at most (0: as fast as --concurrency lets
    /// them in).
    #[arg(long, default_value_t = 0.0)]
    pub arrival_rate: f64,
    /// Hard stop: in-flight visitors are abandoned after this.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Cap on requests per second of the whole crowd (0: none).
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Longest sleep between status polls, whatever `poll_after_ms` says
    /// (the gateway never asks for more than 20 s).
    #[arg(long, default_value_t = 20_000)]
    pub max_poll_ms: u64,
    /// Most units one visitor asks for [default: the event's cart limit].
    #[arg(long)]
    pub max_qty: Option<u32>,
    /// Share of the holds paid through the webhook (needs --webhook-secret).
    #[arg(long, default_value = "0", value_parser = parse_ratio)]
    pub pay_ratio: f64,
    /// The gateway's payment webhook secret.
    #[arg(long, env = "SLUICE_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,
    /// Admin token: the event's stock is read from the admin API for the
    /// report.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Seed of the visitors' choices (quantities, who pays).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Allow a target that is not a loopback address.
    #[arg(long)]
    pub allow_remote: bool,
}

/// Runs `sluice swarm`; returns the process exit code.
pub fn run(args: SwarmArgs) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(f) => f.exit("swarm"),
    }
}

fn run_inner(args: SwarmArgs) -> Result<ExitCode, Failure> {
    let bases = args
        .url
        .iter()
        .map(|u| check_target(u, args.allow_remote))
        .collect::<Result<Vec<_>, _>>()?;
    if args.concurrency == 0 {
        return Err(usage("--concurrency must be at least 1"));
    }
    if !(args.rate.is_finite() && args.rate >= 0.0) {
        return Err(usage("--rate must be a number of requests/s (0: no cap)"));
    }
    if !(args.arrival_rate.is_finite() && args.arrival_rate >= 0.0) {
        return Err(usage(
            "--arrival-rate must be a number of visitors/s (0: no cap)",
        ));
    }
    if args.max_qty == Some(0) {
        return Err(usage("--max-qty must be at least 1"));
    }
    if args.pay_ratio > 0.0 && args.webhook_secret.is_none() {
        return Err(usage("--pay-ratio needs --webhook-secret"));
    }
    for (flag, v) in [("--room", &args.room), ("--event", &args.event)] {
        if v.is_empty()
            || v.len() > 64
            || !v
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(usage(format!("{flag} must match [A-Za-z0-9_-]{{1,64}}")));
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| failure(format!("cannot start the runtime: {e}")))?;
    let report = rt.block_on(swarm(args.clone_settings(bases)))?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        writeln!(out, "{}", report.to_json())
    } else {
        write!(out, "{}", report.table())
    };
    written.map_err(|e| failure(format!("cannot write the report: {e}")))?;
    Ok(if report.violations().is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("sluice: swarm: FAILED: {}", report.violations().join("; "));
        ExitCode::from(EXIT_VIOLATION)
    })
}

/// The validated `scheme://authority` of the target, refused (before any
/// connection) unless it is loopback or `allow_remote` is set. No name is
/// resolved: a host name other than `localhost` counts as remote.
fn check_target(url: &str, allow_remote: bool) -> Result<String, Failure> {
    let uri: Uri = url
        .parse()
        .map_err(|e| usage(format!("bad --url {url:?}: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(usage(format!(
                "{url}: https is not supported; use an http:// address (e.g. a port-forward)"
            )));
        }
        _ => return Err(usage(format!("--url {url:?}: expected an http:// URL"))),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| usage(format!("--url {url:?}: no host")))?;
    let host = authority.host();
    if !allow_remote && !is_loopback_host(host) {
        return Err(usage(format!(
            "refusing to swarm {host}: not a loopback address (127.0.0.0/8, ::1, localhost); \
             pass --allow-remote to load a remote gateway you are responsible for"
        )));
    }
    Ok(format!("http://{authority}"))
}

/// `localhost` (and `*.localhost`), `127.0.0.0/8`, `::1` and their
/// IPv4-mapped forms.
fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let lower = h.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    h.parse::<IpAddr>()
        .map(|ip| ip.to_canonical().is_loopback())
        .unwrap_or(false)
}

impl SwarmArgs {
    fn clone_settings(&self, bases: Vec<String>) -> Settings {
        Settings {
            bases,
            arrival_rate: self.arrival_rate,
            room: self.room.clone(),
            event: self.event.clone(),
            visitors: self.visitors,
            concurrency: self.concurrency,
            duration: self.duration,
            rate: self.rate,
            max_poll: Duration::from_millis(self.max_poll_ms.max(1)),
            max_qty: self.max_qty,
            pay_ratio: self.pay_ratio,
            webhook_secret: self.webhook_secret.clone(),
            admin_token: self.admin_token.clone(),
            seed: self.seed,
            progress: !self.json && std::io::stderr().is_terminal(),
        }
    }
}

/// The run's settings, validated.
#[derive(Clone, Debug)]
struct Settings {
    bases: Vec<String>,
    arrival_rate: f64,
    room: String,
    event: String,
    visitors: u64,
    concurrency: usize,
    duration: Duration,
    rate: f64,
    max_poll: Duration,
    max_qty: Option<u32>,
    pay_ratio: f64,
    webhook_secret: Option<String>,
    admin_token: Option<String>,
    seed: u64,
    progress: bool,
}

// === the HTTP side ===

/// The endpoints whose latency is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Challenge,
    Join,
    Status,
    Event,
    Hold,
    Release,
    Webhook,
    Admin,
}

impl Endpoint {
    const ALL: [Endpoint; 8] = [
        Endpoint::Challenge,
        Endpoint::Join,
        Endpoint::Status,
        Endpoint::Event,
        Endpoint::Hold,
        Endpoint::Release,
        Endpoint::Webhook,
        Endpoint::Admin,
    ];

    fn name(self) -> &'static str {
        match self {
            Endpoint::Challenge => "challenge",
            Endpoint::Join => "join",
            Endpoint::Status => "status",
            Endpoint::Event => "event",
            Endpoint::Hold => "hold",
            Endpoint::Release => "release",
            Endpoint::Webhook => "webhook",
            Endpoint::Admin => "admin",
        }
    }
}

/// One answer: status, JSON body (or null) and `Retry-After`.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Value,
    retry_after: Option<Duration>,
}

impl Answer {
    fn code(&self) -> Option<&str> {
        self.body["code"].as_str()
    }

    /// Worth retrying: overload or unavailability with a hint to come back.
    fn is_transient(&self) -> bool {
        self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
    }
}

/// A global request pacer: each request takes the next slot, `1/rate`
/// after the previous one. No burst: the crowd's rate never exceeds the cap
/// over any window longer than one interval.
struct Pacer {
    interval: Option<Duration>,
    next: Mutex<tokio::time::Instant>,
}

impl Pacer {
    fn new(rate: f64) -> Self {
        Self {
            interval: (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate)),
            next: Mutex::new(tokio::time::Instant::now()),
        }
    }

    async fn acquire(&self) {
        let Some(interval) = self.interval else {
            return;
        };
        let slot = {
            let mut next = self.next.lock();
            let now = tokio::time::Instant::now();
            let slot = (*next).max(now);
            *next = slot + interval;
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

/// Latencies and failures, per endpoint.
#[derive(Default)]
struct Stats {
    latency_ms: HashMap<&'static str, Vec<f64>>,
    /// Problem answers by `code`.
    errors: BTreeMap<String, u64>,
    /// Error answers without a problem `code`, by status.
    http_errors: BTreeMap<u16, u64>,
    transport_errors: u64,
    requests: u64,
}

/// The pooled client, the gateways, the pacer and the stats.
struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    bases: Vec<String>,
    /// Round-robin over `bases`: one visitor's requests land on different
    /// gateways, as behind a load balancer.
    turn: AtomicUsize,
    pacer: Pacer,
    stats: Mutex<Stats>,
}

impl Http {
    fn new(bases: Vec<String>, rate: f64, concurrency: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(concurrency.max(1))
            .build(connector);
        Self {
            client,
            bases,
            turn: AtomicUsize::new(0),
            pacer: Pacer::new(rate),
            stats: Mutex::new(Stats::default()),
        }
    }

    /// Sends one request (after taking a pacer slot) and records its
    /// latency and, for an error answer, its code. `Err` is a transport
    /// failure or a timeout (recorded too).
    async fn call(
        &self,
        ep: Endpoint,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        headers: &[(&str, String)],
        body: Option<Bytes>,
    ) -> Result<Answer, String> {
        self.pacer.acquire().await;
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.next_base()))
            .header(header::ACCEPT, "application/json");
        if let Some(t) = bearer {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| format!("bad request {path}: {e}"))?;
        let started = Instant::now();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((parts, bytes))
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")));
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut stats = self.stats.lock();
        stats.requests += 1;
        let (parts, bytes) = match result {
            Ok(r) => r,
            Err(e) => {
                stats.transport_errors += 1;
                return Err(format!("{} {path}: {e}", ep.name()));
            }
        };
        stats
            .latency_ms
            .entry(ep.name())
            .or_default()
            .push(elapsed_ms);
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let retry_after = parts
            .headers
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let answer = Answer {
            status: parts.status,
            body,
            retry_after,
        };
        if answer.status.is_client_error() || answer.status.is_server_error() {
            match answer.code() {
                Some(code) => *stats.errors.entry(code.to_owned()).or_default() += 1,
                None => *stats.http_errors.entry(answer.status.as_u16()).or_default() += 1,
            }
        }
        Ok(answer)
    }

    fn next_base(&self) -> &str {
        let n = self.turn.fetch_add(1, Ordering::Relaxed);
        self.bases
            .get(n % self.bases.len().max(1))
            .map_or("", String::as_str)
    }

    async fn post_json(
        &self,
        ep: Endpoint,
        path: &str,
        bearer: Option<&str>,
        headers: &[(&str, String)],
        body: &Value,
    ) -> Result<Answer, String> {
        let bytes = Bytes::from(body.to_string());
        self.call(ep, Method::POST, path, bearer, headers, Some(bytes))
            .await
    }

    async fn get(&self, ep: Endpoint, path: &str, bearer: Option<&str>) -> Result<Answer, String> {
        self.call(ep, Method::GET, path, bearer, &[], None).await
    }
}

// === the ledger of holds ===

/// A hold granted to one of our visitors.
#[derive(Debug)]
struct LiveHold {
    qty: u64,
    expires_at: u64,
    confirmed: bool,
    /// A release was sent: the server may already have put the stock back.
    releasing: bool,
    /// Counted in [`Ledger::outstanding`] (and, unless confirmed, listed in
    /// [`Ledger::expiring`]).
    counted: bool,
}

impl LiveHold {
    /// What the store must be backing at `now`: a confirmed hold, or a held
    /// one not (possibly) back in stock. A hold within a second of its
    /// expiry may already be reclaimed, so it is not counted.
    fn counts(&self, now: u64) -> bool {
        self.confirmed || (!self.releasing && self.expires_at > now + 1)
    }
}

/// Every hold granted by a successful answer, and what became of it.
#[derive(Debug, Default)]
struct Ledger {
    live: HashMap<String, LiveHold>,
    /// Units of the live holds that count (see [`LiveHold::counts`]), kept
    /// as a running total: a grant costs O(log n), not a pass over every
    /// hold.
    outstanding: u64,
    /// Counted, unconfirmed holds by expiry, to drop them from
    /// `outstanding` when they lapse.
    expiring: std::collections::BTreeSet<(u64, String)>,
    holds: u64,
    units_held: u64,
    units_confirmed: u64,
    units_released: u64,
    units_lapsed_before_payment: u64,
    peak_outstanding: u64,
    above_cart_limit: u64,
    idempotency_mismatches: u64,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Ledger {
    /// Records a 201; returns whether the hold is new (not an idempotent
    /// repeat).
    fn grant(&mut self, id: &str, qty: u64, expires_at: u64) -> bool {
        self.grant_at(id, qty, expires_at, now_unix())
    }

    fn grant_at(&mut self, id: &str, qty: u64, expires_at: u64, now: u64) -> bool {
        if self.live.contains_key(id) {
            return false;
        }
        self.live.insert(
            id.to_owned(),
            LiveHold {
                qty,
                expires_at,
                confirmed: false,
                releasing: false,
                counted: false,
            },
        );
        self.holds += 1;
        self.units_held += qty;
        self.recount(id, now);
        // holds that lapsed since the last grant no longer count
        while let Some((at, _)) = self.expiring.first() {
            if *at > now + 1 {
                break;
            }
            if let Some((_, lapsed)) = self.expiring.pop_first() {
                self.recount(&lapsed, now);
            }
        }
        self.peak_outstanding = self.peak_outstanding.max(self.outstanding);
        true
    }

    /// Brings one hold's share of `outstanding` (and its place in
    /// `expiring`) in line with its state at `now`.
    fn recount(&mut self, id: &str, now: u64) {
        let Some(h) = self.live.get_mut(id) else {
            return;
        };
        let counts = h.counts(now);
        if counts != h.counted {
            if counts {
                self.outstanding += h.qty;
            } else {
                self.outstanding = self.outstanding.saturating_sub(h.qty);
            }
            h.counted = counts;
        }
        let key = (h.expires_at, id.to_owned());
        if h.counted && !h.confirmed {
            self.expiring.insert(key);
        } else {
            self.expiring.remove(&key);
        }
    }

    /// Forgets a hold (released or lapsed); returns its quantity.
    fn remove(&mut self, id: &str) -> Option<u64> {
        let h = self.live.remove(id)?;
        if h.counted {
            self.outstanding = self.outstanding.saturating_sub(h.qty);
        }
        self.expiring.remove(&(h.expires_at, id.to_owned()));
        Some(h.qty)
    }

    fn set_releasing(&mut self, id: &str, on: bool) {
        if let Some(h) = self.live.get_mut(id) {
            h.releasing = on;
            self.recount(id, now_unix());
        }
    }

    fn confirm(&mut self, id: &str) {
        if let Some(h) = self.live.get_mut(id)
            && !h.confirmed
        {
            h.confirmed = true;
            self.units_confirmed += h.qty;
            self.recount(id, now_unix());
        }
    }

    fn released(&mut self, id: &str) {
        if let Some(qty) = self.remove(id) {
            self.units_released += qty;
        }
    }

    fn lapsed(&mut self, id: &str) {
        if let Some(qty) = self.remove(id) {
            self.units_lapsed_before_payment += qty;
        }
    }
}

// === the visitors ===

/// The event as an admitted visitor sees it.
#[derive(Clone, Copy, Debug)]
struct EventInfo {
    total: u64,
    cart_limit: u64,
}

#[derive(Default)]
struct Counters {
    started: AtomicU64,
    finished: AtomicU64,
    joined: AtomicU64,
    admitted: AtomicU64,
    sold_out: AtomicU64,
    failed: AtomicU64,
}

/// Everything the visitors share.
struct Shared {
    s: Settings,
    http: Http,
    ledger: Mutex<Ledger>,
    counters: Counters,
    next_visitor: AtomicUsize,
    event: tokio::sync::OnceCell<EventInfo>,
    /// Keeps idempotency keys and payment ids of two runs apart (the seed
    /// only fixes the visitors' choices).
    run_id: u64,
    bar: ProgressBar,
    /// When the crowd started (arrivals are paced from it).
    t0: tokio::time::Instant,
}

/// How a visit ended.
enum Outcome {
    /// Held (and perhaps paid for) something.
    Bought,
    /// Admitted but nothing was held, or the room said sold out.
    SoldOut,
    /// Gave up: an unexpected answer or too many failures.
    Failed,
}

/// A visit that could not go on, with the reason.
struct Stop(Outcome);

async fn worker(sh: Arc<Shared>) {
    loop {
        let i = sh.next_visitor.fetch_add(1, Ordering::Relaxed) as u64;
        if i >= sh.s.visitors {
            return;
        }
        if sh.s.arrival_rate > 0.0 {
            // open-loop arrivals: visitor i comes at i / rate
            let at = sh.t0 + Duration::from_secs_f64(i as f64 / sh.s.arrival_rate);
            tokio::time::sleep_until(at).await;
        }
        sh.counters.started.fetch_add(1, Ordering::Relaxed);
        let outcome = match visit(&sh, i).await {
            Ok(o) | Err(Stop(o)) => o,
        };
        let c = &sh.counters;
        match outcome {
            Outcome::Bought => {}
            Outcome::SoldOut => {
                c.sold_out.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Failed => {
                c.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        c.finished.fetch_add(1, Ordering::Relaxed);
        sh.bar.inc(1);
        let l = sh.ledger.lock();
        sh.bar.set_message(format!(
            "admitted {} · holds {} · failed {}",
            c.admitted.load(Ordering::Relaxed),
            l.holds,
            c.failed.load(Ordering::Relaxed)
        ));
    }
}

/// Sleeps as a 429/503 asks (at least 100 ms, at most the poll cap).
async fn back_off(sh: &Shared, a: Option<&Answer>) {
    let wait = a
        .and_then(|a| a.retry_after)
        .unwrap_or(Duration::from_millis(500))
        .clamp(Duration::from_millis(100), sh.s.max_poll);
    tokio::time::sleep(wait).await;
}

fn failed<T>() -> Result<T, Stop> {
    Err(Stop(Outcome::Failed))
}

/// One visitor, from challenge to payment.
async fn visit(sh: &Shared, i: u64) -> Result<Outcome, Stop> {
    let mut rng = StdRng::seed_from_u64(
        sh.s.seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i),
    );
    let admission = match join(sh, i).await? {
        Joined::Admitted(t) => t,
        Joined::Waiting {
            queue_token,
            poll_after_ms,
        } => poll(sh, &queue_token, poll_after_ms).await?,
    };
    sh.counters.admitted.fetch_add(1, Ordering::Relaxed);
    let info = event_info(sh, &admission).await?;
    let max_qty = sh.s.max_qty.map_or(info.cart_limit, u64::from).max(1);

    let mut cart = Cart::default();
    let qty = rng.random_range(1..=max_qty);
    let key = format!("swarm-{:x}-{i}-1", sh.run_id);
    let Some((id, granted)) = hold(sh, &admission, qty, &key).await? else {
        return Ok(Outcome::SoldOut);
    };
    cart.add(&id, granted);
    if rng.random_bool(0.25) {
        // the same key again must name the same hold; another one is a
        // second hold after all, and its units count toward the cart
        if let Some((again, granted_again)) = hold(sh, &admission, qty, &key).await?
            && cart.add(&again, granted_again)
        {
            sh.ledger.lock().idempotency_mismatches += 1;
        }
    }
    if rng.random_bool(0.5) {
        // a second hold: refused with cart_limit_exceeded when over the
        // limit, which is what this probes
        let qty2 = rng.random_range(1..=max_qty);
        let key2 = format!("swarm-{:x}-{i}-2", sh.run_id);
        if let Some((id2, granted2)) = hold(sh, &admission, qty2, &key2).await? {
            cart.add(&id2, granted2);
        }
    }
    if cart.units > info.cart_limit {
        sh.ledger.lock().above_cart_limit += 1;
    }
    let mine = cart.ids;

    for (n, id) in mine.iter().enumerate() {
        let pay = sh.s.webhook_secret.is_some() && rng.random_bool(sh.s.pay_ratio);
        if pay {
            pay_for(sh, i, n, id).await;
        } else if rng.random_bool(0.5) {
            release(sh, &admission, id).await;
        }
        // else: left to expire
    }
    Ok(Outcome::Bought)
}

/// The distinct holds one visitor was granted, and their units.
#[derive(Debug, Default)]
struct Cart {
    ids: Vec<String>,
    units: u64,
}

impl Cart {
    /// Adds a granted hold; returns whether it is new to this visitor (a
    /// hold named again, e.g. by an idempotent replay, is counted once).
    fn add(&mut self, id: &str, units: u64) -> bool {
        if self.ids.iter().any(|x| x == id) {
            return false;
        }
        self.ids.push(id.to_owned());
        self.units += units;
        true
    }
}

enum Joined {
    Admitted(String),
    Waiting {
        queue_token: String,
        poll_after_ms: u64,
    },
}

/// Challenge, solve, join; a 429/503 (or a consumed challenge) starts over.
async fn join(sh: &Shared, i: u64) -> Result<Joined, Stop> {
    let room = &sh.s.room;
    for _ in 0..RETRIES {
        let Ok(a) = sh
            .http
            .post_json(
                Endpoint::Challenge,
                &format!("/_sluice/rooms/{room}/challenge"),
                None,
                &[],
                &json!({}),
            )
            .await
        else {
            back_off(sh, None).await;
            continue;
        };
        if a.is_transient() {
            back_off(sh, Some(&a)).await;
            continue;
        }
        if a.status != StatusCode::OK {
            return failed();
        }
        let fetched = Instant::now();
        let (Some(challenge), Some(puzzles), Some(bits)) = (
            a.body["challenge"].as_str().map(str::to_owned),
            a.body["puzzles"]
                .as_u64()
                .and_then(|v| u8::try_from(v).ok()),
            a.body["difficulty_bits"]
                .as_u64()
                .and_then(|v| u8::try_from(v).ok()),
        ) else {
            return failed();
        };
        let min_solve = Duration::from_millis(a.body["min_solve_ms"].as_u64().unwrap_or(0));
        let c = challenge.clone();
        let Ok(solutions) =
            tokio::task::spawn_blocking(move || sluice_pow::solve(&c, puzzles, bits, 1)).await
        else {
            return failed();
        };
        if let Some(rest) = min_solve.checked_sub(fetched.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        let body = json!({
            "challenge": challenge,
            "solutions": solutions,
            "return_to": format!("/swarm/{i}"),
        });
        let Ok(a) = sh
            .http
            .post_json(
                Endpoint::Join,
                &format!("/_sluice/rooms/{room}/join"),
                None,
                &[],
                &body,
            )
            .await
        else {
            back_off(sh, None).await;
            continue;
        };
        if a.is_transient() || a.code() == Some("pow_replayed") {
            back_off(sh, Some(&a)).await;
            continue;
        }
        let token = |k: &str| a.body[k].as_str().map(str::to_owned);
        match (a.status.as_u16(), a.body["state"].as_str()) {
            (200, Some("admitted")) => {
                sh.counters.joined.fetch_add(1, Ordering::Relaxed);
                return token("admission_token")
                    .map(Joined::Admitted)
                    .ok_or(Stop(Outcome::Failed));
            }
            (201, Some("waiting")) => {
                sh.counters.joined.fetch_add(1, Ordering::Relaxed);
                return token("queue_token")
                    .map(|queue_token| Joined::Waiting {
                        queue_token,
                        poll_after_ms: a.body["poll_after_ms"].as_u64().unwrap_or(1000),
                    })
                    .ok_or(Stop(Outcome::Failed));
            }
            _ => return failed(),
        }
    }
    failed()
}

/// Polls the status until admitted; the admission token.
async fn poll(sh: &Shared, queue_token: &str, first_wait_ms: u64) -> Result<String, Stop> {
    let path = format!("/_sluice/rooms/{}/status", sh.s.room);
    let mut wait = Duration::from_millis(first_wait_ms);
    let mut failures = 0;
    loop {
        tokio::time::sleep(wait.min(sh.s.max_poll)).await;
        let a = match sh
            .http
            .get(Endpoint::Status, &path, Some(queue_token))
            .await
        {
            Ok(a) if !a.is_transient() => a,
            other => {
                failures += 1;
                if failures > RETRIES {
                    return failed();
                }
                wait = other
                    .ok()
                    .and_then(|a| a.retry_after)
                    .unwrap_or(Duration::from_millis(500));
                continue;
            }
        };
        if a.status != StatusCode::OK {
            return failed();
        }
        match a.body["state"].as_str() {
            Some("admitted") => {
                return a.body["admission_token"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or(Stop(Outcome::Failed));
            }
            Some("waiting" | "paused") => {}
            Some("sold_out" | "closed") => return Err(Stop(Outcome::SoldOut)),
            _ => return failed(),
        }
        wait = Duration::from_millis(a.body["poll_after_ms"].as_u64().unwrap_or(1000));
    }
}

/// The event's total and cart limit, read once by the first admitted
/// visitor (the endpoint wants an admitted visitor).
async fn event_info(sh: &Shared, admission: &str) -> Result<EventInfo, Stop> {
    let path = format!("/_sluice/events/{}", sh.s.event);
    sh.event
        .get_or_try_init(|| async {
            for _ in 0..RETRIES {
                match sh.http.get(Endpoint::Event, &path, Some(admission)).await {
                    Ok(a) if a.status == StatusCode::OK => {
                        if let (Some(total), Some(cart_limit)) =
                            (a.body["total"].as_u64(), a.body["cart_limit"].as_u64())
                        {
                            return Ok(EventInfo { total, cart_limit });
                        }
                        return Err(Stop(Outcome::Failed));
                    }
                    Ok(a) if a.is_transient() => back_off(sh, Some(&a)).await,
                    Ok(_) => return Err(Stop(Outcome::Failed)),
                    Err(_) => back_off(sh, None).await,
                }
            }
            Err(Stop(Outcome::Failed))
        })
        .await
        .copied()
}

/// Asks for `qty` units with `key`; `Some((hold_id, qty))` when granted,
/// `None` when refused as sold out or over the cart limit.
async fn hold(
    sh: &Shared,
    admission: &str,
    qty: u64,
    key: &str,
) -> Result<Option<(String, u64)>, Stop> {
    let path = format!("/_sluice/events/{}/holds", sh.s.event);
    let headers = [("idempotency-key", key.to_owned())];
    for _ in 0..RETRIES {
        // a lost answer is retried with the same key: at most one hold
        let a = match sh
            .http
            .post_json(
                Endpoint::Hold,
                &path,
                Some(admission),
                &headers,
                &json!({ "qty": qty }),
            )
            .await
        {
            Ok(a) if a.is_transient() && a.code() != Some("inventory_not_ready") => {
                back_off(sh, Some(&a)).await;
                continue;
            }
            Ok(a) => a,
            Err(_) => {
                back_off(sh, None).await;
                continue;
            }
        };
        if a.status == StatusCode::CREATED {
            let (Some(id), Some(granted)) = (a.body["hold_id"].as_str(), a.body["qty"].as_u64())
            else {
                return failed();
            };
            let expires_at = a.body["expires_at"].as_u64().unwrap_or(u64::MAX);
            sh.ledger.lock().grant(id, granted, expires_at);
            return Ok(Some((id.to_owned(), granted)));
        }
        return match a.code() {
            Some("sold_out" | "cart_limit_exceeded") => Ok(None),
            _ => failed(),
        };
    }
    failed()
}

/// `DELETE /_sluice/holds/{id}`.
async fn release(sh: &Shared, admission: &str, id: &str) {
    sh.ledger.lock().set_releasing(id, true);
    let path = format!("/_sluice/holds/{id}");
    for _ in 0..RETRIES {
        match sh
            .http
            .call(
                Endpoint::Release,
                Method::DELETE,
                &path,
                Some(admission),
                &[],
                None,
            )
            .await
        {
            Ok(a) if a.status == StatusCode::OK => {
                sh.ledger.lock().released(id);
                return;
            }
            Ok(a) if a.is_transient() => back_off(sh, Some(&a)).await,
            Ok(_) => break,
            Err(_) => back_off(sh, None).await,
        }
    }
    // not released after all: it still counts until it expires
    sh.ledger.lock().set_releasing(id, false);
}

/// Pays through the signed webhook, as a payment provider would.
async fn pay_for(sh: &Shared, i: u64, n: usize, id: &str) {
    let Some(secret) = &sh.s.webhook_secret else {
        return;
    };
    let body = json!({
        "payment_event_id": format!("swarm-{:x}-{i}-{n}", sh.run_id),
        "hold_id": id,
        "outcome": "succeeded",
    })
    .to_string();
    for _ in 0..RETRIES {
        // signed afresh each time: the timestamp must be recent
        let sig = crate::reserve::sign_webhook(secret.as_bytes(), now_unix(), body.as_bytes());
        match sh
            .http
            .call(
                Endpoint::Webhook,
                Method::POST,
                "/_sluice/webhooks/payment",
                None,
                &[("sluice-signature", sig)],
                Some(Bytes::from(body.clone())),
            )
            .await
        {
            Ok(a) if a.status == StatusCode::OK => {
                let mut l = sh.ledger.lock();
                match a.body["status"].as_str() {
                    Some("confirmed") => l.confirm(id),
                    Some("released") => l.released(id),
                    _ => {}
                }
                return;
            }
            Ok(a) if a.code() == Some("hold_expired") => {
                sh.ledger.lock().lapsed(id);
                return;
            }
            Ok(a) if a.is_transient() => back_off(sh, Some(&a)).await,
            Ok(_) => return,
            Err(_) => back_off(sh, None).await,
        }
    }
}

// === the run ===

/// The admin view of the event.
async fn admin_event(http: &Http, s: &Settings) -> Result<Value, String> {
    let Some(token) = &s.admin_token else {
        return Err("no admin token".into());
    };
    let path = format!("/_sluice/admin/events/{}", s.event);
    let a = http.get(Endpoint::Admin, &path, Some(token)).await?;
    if a.status != StatusCode::OK {
        return Err(format!(
            "GET {path}: HTTP {} {}",
            a.status,
            a.code().unwrap_or("")
        ));
    }
    Ok(a.body)
}

async fn swarm(s: Settings) -> Result<Report, Failure> {
    let http = Http::new(s.bases.clone(), s.rate, s.concurrency);
    // Fail fast on a wrong address, room or token, before the crowd: one
    // probe per gateway (the round-robin starts at the first).
    let room_path = format!("/_sluice/rooms/{}", s.room);
    for base in &s.bases {
        match http.get(Endpoint::Status, &room_path, None).await {
            Ok(a) if a.status == StatusCode::OK => {}
            Ok(a) => {
                return Err(failure(format!(
                    "{base}{room_path}: HTTP {} {}",
                    a.status,
                    a.code().unwrap_or("")
                )));
            }
            Err(e) => return Err(failure(format!("{base}: {e}"))),
        }
    }
    let stock_before = match &s.admin_token {
        Some(_) => Some(
            admin_event(&http, &s)
                .await
                .map_err(|e| failure(format!("admin API: {e}")))?,
        ),
        None => None,
    };
    // the fail-fast probes are not part of the measurements
    *http.stats.lock() = Stats::default();

    let bar = if s.progress {
        let b = ProgressBar::new(s.visitors);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} swarm [{bar:30}] {pos}/{len} visitors {elapsed} {msg}",
        ) {
            b.set_style(style.progress_chars("=> "));
        }
        b.enable_steady_tick(Duration::from_millis(200));
        b
    } else {
        ProgressBar::hidden()
    };
    let sh = Arc::new(Shared {
        s: s.clone(),
        http,
        ledger: Mutex::new(Ledger::default()),
        counters: Counters::default(),
        next_visitor: AtomicUsize::new(0),
        event: tokio::sync::OnceCell::new(),
        run_id: rand::random(),
        bar: bar.clone(),
        t0: tokio::time::Instant::now(),
    });
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let workers = s
        .concurrency
        .min(usize::try_from(s.visitors).unwrap_or(usize::MAX));
    for _ in 0..workers {
        set.spawn(worker(sh.clone()));
    }
    let all_done = async { while set.join_next().await.is_some() {} };
    let stopped_by = match tokio::time::timeout(s.duration, all_done).await {
        Ok(()) => "done",
        Err(_) => "duration",
    };
    set.abort_all();
    while set.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let stock = match &s.admin_token {
        Some(_) => Some(
            admin_event(&sh.http, &s)
                .await
                .unwrap_or_else(|e| json!({ "error": e })),
        ),
        None => None,
    };
    let event = sh.event.get().copied();
    let stats = std::mem::take(&mut *sh.http.stats.lock());
    let ledger = std::mem::take(&mut *sh.ledger.lock());
    let c = &sh.counters;
    Ok(Report {
        s,
        stopped_by,
        elapsed,
        started: c.started.load(Ordering::Relaxed),
        finished: c.finished.load(Ordering::Relaxed),
        joined: c.joined.load(Ordering::Relaxed),
        admitted: c.admitted.load(Ordering::Relaxed),
        sold_out: c.sold_out.load(Ordering::Relaxed),
        failed: c.failed.load(Ordering::Relaxed),
        event,
        stock_before,
        stock,
        ledger,
        stats,
    })
}

// === the report ===

struct Report {
    s: Settings,
    stopped_by: &'static str,
    elapsed: Duration,
    started: u64,
    finished: u64,
    joined: u64,
    admitted: u64,
    sold_out: u64,
    failed: u64,
    event: Option<EventInfo>,
    stock_before: Option<Value>,
    stock: Option<Value>,
    ledger: Ledger,
    stats: Stats,
}

/// The `q`-quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

impl Report {
    fn total(&self) -> Option<u64> {
        self.event
            .map(|e| e.total)
            .or_else(|| self.stock.as_ref().and_then(|s| s["total"].as_u64()))
    }

    /// Units held at one moment beyond the stock, as the answers show.
    fn oversold_by_answers(&self) -> u64 {
        self.total()
            .map_or(0, |t| self.ledger.peak_outstanding.saturating_sub(t))
    }

    /// `held + confirmed` beyond `total` in the store's own view.
    fn oversold_by_stock(&self) -> u64 {
        let Some(s) = &self.stock else { return 0 };
        let (Some(t), Some(h), Some(c)) = (
            s["total"].as_u64(),
            s["held"].as_u64(),
            s["confirmed"].as_u64(),
        ) else {
            return 0;
        };
        (h + c).saturating_sub(t)
    }

    fn oversold(&self) -> u64 {
        self.oversold_by_answers().max(self.oversold_by_stock())
    }

    fn invariant_holds(&self) -> Option<bool> {
        self.stock
            .as_ref()
            .and_then(|s| s["invariant_holds"].as_bool())
    }

    /// What makes the run a failure (exit status 3).
    fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.oversold() > 0 {
            v.push(format!("oversold {} unit(s)", self.oversold()));
        }
        if self.ledger.above_cart_limit > 0 {
            v.push(format!(
                "{} visitor(s) above the cart limit",
                self.ledger.above_cart_limit
            ));
        }
        if self.ledger.idempotency_mismatches > 0 {
            v.push(format!(
                "{} idempotent replay(s) returned another hold",
                self.ledger.idempotency_mismatches
            ));
        }
        if self.invariant_holds() == Some(false) {
            v.push("the store's stock invariant does not hold".into());
        }
        v
    }

    fn latency(&self) -> Value {
        let mut m = Map::new();
        for ep in Endpoint::ALL {
            let Some(v) = self.stats.latency_ms.get(ep.name()) else {
                continue;
            };
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            let r = |x: f64| (x * 100.0).round() / 100.0;
            m.insert(
                ep.name().into(),
                json!({
                    "count": v.len(),
                    "p50_ms": r(quantile(&v, 0.5)),
                    "p99_ms": r(quantile(&v, 0.99)),
                    "max_ms": r(quantile(&v, 1.0)),
                }),
            );
        }
        Value::Object(m)
    }

    fn units_left_to_expire(&self) -> u64 {
        let l = &self.ledger;
        l.units_held
            .saturating_sub(l.units_confirmed + l.units_released + l.units_lapsed_before_payment)
    }

    fn to_json(&self) -> Value {
        let l = &self.ledger;
        let st = &self.stats;
        let stock = |s: &Option<Value>| {
            s.as_ref().map(|s| {
                json!({
                    "total": s["total"],
                    "available": s["available"],
                    "held": s["held"],
                    "confirmed": s["confirmed"],
                    "invariant_holds": s["invariant_holds"],
                })
            })
        };
        json!({
            "urls": self.s.bases,
            "room": self.s.room,
            "event": self.s.event,
            "seed": self.s.seed,
            "stopped_by": self.stopped_by,
            "elapsed_seconds": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "visitors": self.s.visitors,
            "started": self.started,
            "finished": self.finished,
            "unfinished": self.started - self.finished,
            "joined": self.joined,
            "admitted": self.admitted,
            "sold_out_visitors": self.sold_out,
            "failed_visitors": self.failed,
            "total": self.total(),
            "cart_limit": self.event.map(|e| e.cart_limit),
            "holds": l.holds,
            "units_held": l.units_held,
            "units_confirmed": l.units_confirmed,
            "units_released": l.units_released,
            "units_lapsed_before_payment": l.units_lapsed_before_payment,
            "units_left_to_expire": self.units_left_to_expire(),
            "peak_units_outstanding": l.peak_outstanding,
            "stock_before": stock(&self.stock_before),
            "stock": stock(&self.stock),
            "oversold": self.oversold(),
            "oversold_by_answers": self.oversold_by_answers(),
            "oversold_by_stock": self.oversold_by_stock(),
            "above_cart_limit": l.above_cart_limit,
            "idempotency_mismatches": l.idempotency_mismatches,
            "errors": st.errors,
            "http_errors": st.http_errors.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
            "transport_errors": st.transport_errors,
            "requests": st.requests,
            "requests_per_sec": (st.requests as f64 / self.elapsed.as_secs_f64().max(1e-3) * 10.0).round() / 10.0,
            "latency_ms": self.latency(),
            "ok": self.violations().is_empty(),
        })
    }

    fn table(&self) -> String {
        let v = self.to_json();
        let mut s = String::new();
        let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("  {k:<24}{v}\n"));
        s.push_str(&format!(
            "sluice swarm: {} room {} event {} — {} after {:.1}s, {} requests ({}/s)\n",
            self.s.bases.join(" "),
            self.s.room,
            self.s.event,
            if self.stopped_by == "done" {
                "all visitors done"
            } else {
                "stopped by --duration"
            },
            self.elapsed.as_secs_f64(),
            v["requests"],
            v["requests_per_sec"],
        ));
        line(
            &mut s,
            "visitors",
            format!(
                "{} ({} started, {} unfinished, {} sold out, {} failed)",
                self.s.visitors, self.started, v["unfinished"], self.sold_out, self.failed
            ),
        );
        line(
            &mut s,
            "joined / admitted",
            format!("{} / {}", self.joined, self.admitted),
        );
        let l = &self.ledger;
        line(
            &mut s,
            "holds (201)",
            format!("{} for {} unit(s)", l.holds, l.units_held),
        );
        line(
            &mut s,
            "units",
            format!(
                "{} confirmed, {} released, {} lapsed before payment, {} left to expire",
                l.units_confirmed,
                l.units_released,
                l.units_lapsed_before_payment,
                self.units_left_to_expire()
            ),
        );
        line(
            &mut s,
            "event",
            match self.event {
                Some(e) => format!("total {}, cart limit {}", e.total, e.cart_limit),
                None => "not seen (nobody admitted)".into(),
            },
        );
        if let Some(st) = &v["stock"].as_object() {
            line(
                &mut s,
                "stock (admin)",
                format!(
                    "total {}, available {}, held {}, confirmed {}, invariant {}",
                    st["total"],
                    st["available"],
                    st["held"],
                    st["confirmed"],
                    st["invariant_holds"]
                ),
            );
        }
        line(
            &mut s,
            "oversold",
            format!(
                "{} (answers: peak {} outstanding; store: {})",
                self.oversold(),
                l.peak_outstanding,
                if self.stock.is_some() {
                    self.oversold_by_stock().to_string()
                } else {
                    "not read, no --admin-token".into()
                }
            ),
        );
        line(&mut s, "above cart limit", l.above_cart_limit.to_string());
        if l.idempotency_mismatches > 0 {
            line(
                &mut s,
                "idempotency mismatches",
                l.idempotency_mismatches.to_string(),
            );
        }
        let st = &self.stats;
        let mut errs: Vec<String> = st.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
        errs.extend(st.http_errors.iter().map(|(k, n)| format!("HTTP {k} {n}")));
        if st.transport_errors > 0 {
            errs.push(format!("transport {}", st.transport_errors));
        }
        line(
            &mut s,
            "errors",
            if errs.is_empty() {
                "none".into()
            } else {
                errs.join(", ")
            },
        );
        s.push_str("  latency (ms)            count      p50      p99\n");
        if let Value::Object(m) = &v["latency_ms"] {
            for (ep, x) in m {
                s.push_str(&format!(
                    "    {ep:<22}{:>7} {:>8.1} {:>8.1}\n",
                    x["count"],
                    x["p50_ms"].as_f64().unwrap_or(0.0),
                    x["p99_ms"].as_f64().unwrap_or(0.0)
                ));
            }
        }
        s.push_str(&format!(
            "  verdict                 {}\n",
            match self.violations() {
                v if v.is_empty() => "ok".to_owned(),
                v => format!("FAILED: {}", v.join("; ")),
            }
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1",
            "127.9.8.7",
            "[::1]",
            "localhost",
            "LocalHost",
            "a.localhost",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "192.0.2.1",
            "10.0.0.1",
            "[2001:db8::1]",
            "example.com",
            "localhost.example.com",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn targets() {
        assert_eq!(
            check_target("http://127.0.0.1:8080/", false).unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            check_target("http://[::1]:9", false).unwrap(),
            "http://[::1]:9"
        );
        let e = check_target("http://192.0.2.1:8080", false).unwrap_err();
        assert_eq!(e.code, crate::tools::failure::EXIT_USAGE);
        assert!(e.message.contains("--allow-remote"), "{}", e.message);
        assert!(check_target("http://192.0.2.1:8080", true).is_ok());
        assert!(check_target("https://127.0.0.1", false).is_err());
        assert!(check_target("127.0.0.1:8080", false).is_err());
    }

    #[test]
    fn ledger_counts_outstanding_at_each_grant() {
        let far = now_unix() + 600;
        let mut l = Ledger::default();
        assert!(l.grant("a", 3, far));
        assert!(!l.grant("a", 3, far), "an idempotent repeat is no new hold");
        assert!(l.grant("b", 2, far));
        assert_eq!(l.peak_outstanding, 5);
        l.set_releasing("a", true);
        l.released("a");
        l.confirm("b");
        assert!(l.grant("c", 1, far));
        assert_eq!(l.peak_outstanding, 5);
        assert_eq!(
            (l.units_held, l.units_released, l.units_confirmed),
            (6, 3, 2)
        );
        // a lapsed hold no longer counts
        assert!(l.grant("d", 4, 0));
        assert_eq!(l.peak_outstanding, 5);
        assert_eq!(l.outstanding, 3, "b (confirmed) and c");
    }

    /// The running total against a recount of every hold, through grants,
    /// expiries, releases (also ones that fail) and confirmations.
    #[test]
    fn ledger_running_total_matches_a_recount() {
        let recount = |l: &Ledger, now: u64| -> u64 {
            l.live
                .values()
                .filter(|h| h.counts(now))
                .map(|h| h.qty)
                .sum()
        };
        // confirm and set_releasing read the wall clock: the grants' clock
        // starts there and only moves ahead of it
        let base = now_unix();
        let mut l = Ledger::default();
        let mut peak = 0;
        for i in 0..5_000u64 {
            let now = base + i / 10; // time moves on
            let id = format!("h{i}");
            assert!(l.grant_at(&id, 1 + i % 4, now + 5 + i % 30, now));
            assert_eq!(l.outstanding, recount(&l, now), "after grant {i}");
            peak = peak.max(l.outstanding);
            match i % 7 {
                0 => l.confirm(&format!("h{}", i / 2)),
                1 => {
                    let old = format!("h{}", i - 1);
                    l.set_releasing(&old, true);
                    l.released(&old);
                }
                2 => {
                    // a release that failed: counts again
                    l.set_releasing(&id, true);
                    l.set_releasing(&id, false);
                }
                3 => l.lapsed(&format!("h{}", i / 3)),
                _ => {}
            }
        }
        assert_eq!(l.peak_outstanding, peak);
        // a confirmed hold outlives its expiry; the others lapse
        let mut l = Ledger::default();
        l.grant_at("x", 2, base + 110, base + 100);
        l.grant_at("y", 3, base + 110, base + 100);
        l.confirm("x");
        l.grant_at("z", 1, base + 500, base + 200);
        assert_eq!(l.outstanding, 3, "x (confirmed) and z; y lapsed");
        assert!(l.expiring.iter().all(|(_, id)| id == "z"));
    }

    #[test]
    fn a_replay_naming_another_hold_counts_toward_the_cart() {
        let mut c = Cart::default();
        assert!(c.add("h1", 3));
        assert!(!c.add("h1", 3), "the same hold again is not counted twice");
        assert_eq!(c.units, 3);
        // an idempotent replay that came back with a different hold
        assert!(c.add("h2", 3));
        assert_eq!(c.units, 6, "both holds are the visitor's");
        assert_eq!(c.ids, ["h1", "h2"]);
    }

    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
