//! The swarm's HTTP side: one pooled client for the whole crowd, spread
//! round-robin over the gateways, every request paced by one global
//! [`Pacer`], and each answer's latency and error code counted per
//! [`Endpoint`] for the report.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde_json::Value;

/// The start of a transport error whose request never left (no
/// connection could be made).
pub(super) const NOT_SENT: &str = "not sent: ";
/// Longest wait for one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoints whose latency is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Endpoint {
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
    pub(super) const ALL: [Endpoint; 8] = [
        Endpoint::Challenge,
        Endpoint::Join,
        Endpoint::Status,
        Endpoint::Event,
        Endpoint::Hold,
        Endpoint::Release,
        Endpoint::Webhook,
        Endpoint::Admin,
    ];

    pub(super) fn name(self) -> &'static str {
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
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) body: Value,
    pub(super) retry_after: Option<Duration>,
}

impl Answer {
    pub(super) fn code(&self) -> Option<&str> {
        self.body["code"].as_str()
    }

    /// Worth retrying: overload or unavailability with a hint to come back.
    pub(super) fn is_transient(&self) -> bool {
        self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
    }
}

/// A global request pacer: each request takes the next slot, `1/rate`
/// after the previous one. No burst: the crowd's rate never exceeds the cap
/// over any window longer than one interval.
pub(super) struct Pacer {
    pub(super) interval: Option<Duration>,
    pub(super) next: Mutex<tokio::time::Instant>,
}

impl Pacer {
    pub(super) fn new(rate: f64) -> Self {
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
pub(super) struct Stats {
    /// Latencies in microseconds (3 significant digits, bounded memory
    /// however long the run).
    pub(super) latency_us: HashMap<&'static str, hdrhistogram::Histogram<u64>>,
    /// Problem answers by `code`.
    pub(super) errors: BTreeMap<String, u64>,
    /// Error answers without a problem `code`, by status.
    pub(super) http_errors: BTreeMap<u16, u64>,
    pub(super) transport_errors: u64,
    pub(super) requests: u64,
}

/// The latency histogram of endpoint `name`, made on first use (`None`
/// only if hdrhistogram refused its own bounds, which it does not for 3
/// digits).
fn latency_histogram<'a>(
    all: &'a mut HashMap<&'static str, hdrhistogram::Histogram<u64>>,
    name: &'static str,
) -> Option<&'a mut hdrhistogram::Histogram<u64>> {
    if !all.contains_key(name) {
        all.insert(name, hdrhistogram::Histogram::new(3).ok()?);
    }
    all.get_mut(name)
}

/// The pooled client, the gateways, the pacer and the stats.
pub(super) struct Http {
    pub(super) client: Client<HttpConnector, Full<Bytes>>,
    pub(super) bases: Vec<String>,
    /// Round-robin over `bases`: one visitor's requests land on different
    /// gateways, as behind a load balancer.
    pub(super) turn: AtomicUsize,
    pub(super) pacer: Pacer,
    pub(super) stats: Mutex<Stats>,
}

impl Http {
    pub(super) fn new(bases: Vec<String>, rate: f64, concurrency: usize) -> Self {
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
    /// failure or a timeout (recorded too); it starts with [`NOT_SENT`]
    /// when no connection could be made (the request surely never reached
    /// the gateway).
    pub(super) async fn call(
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
            let resp = self.client.request(req).await.map_err(|e| {
                if e.is_connect() {
                    format!("{NOT_SENT}{e}")
                } else {
                    e.to_string()
                }
            })?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((parts, bytes))
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")));
        let elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut stats = self.stats.lock();
        stats.requests += 1;
        let (parts, bytes) = match result {
            Ok(r) => r,
            Err(e) => {
                stats.transport_errors += 1;
                return Err(match e.strip_prefix(NOT_SENT) {
                    Some(rest) => format!("{NOT_SENT}{} {path}: {rest}", ep.name()),
                    None => format!("{} {path}: {e}", ep.name()),
                });
            }
        };
        if let Some(h) = latency_histogram(&mut stats.latency_us, ep.name()) {
            h.saturating_record(elapsed_us);
        }
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

    pub(super) async fn post_json(
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

    pub(super) async fn get(
        &self,
        ep: Endpoint,
        path: &str,
        bearer: Option<&str>,
    ) -> Result<Answer, String> {
        self.call(ep, Method::GET, path, bearer, &[], None).await
    }
}
