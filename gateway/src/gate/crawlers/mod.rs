//! Verified crawlers: a search engine's or partner's crawler passes the
//! gate of the rooms configured for it without queueing, but only when
//! its identity is verified, never on its `User-Agent` (README, "Verified
//! crawlers"; config `[crawlers]`).
//!
//! Two proofs, each tied to a configured crawler (`[[crawlers.agents]]`):
//!
//! 1. **Web Bot Auth** ([`httpsig`], [`directory`]): an RFC 9421 HTTP
//!    message signature with Ed25519, tagged `web-bot-auth`, over at least
//!    `@authority` (or `@target-uri`) and the `Signature-Agent` member
//!    naming the signer; the signer must be an allow-listed
//!    `signature_agent`, the `keyid` (a JWK thumbprint) a key of its
//!    directory, `created` within `crawlers.max_signature_age` of the
//!    gateway's clock, `expires` not passed, `alg` (when given) `ed25519`;
//!    a `nonce` verifies once across every gateway sharing the replay
//!    guard's store (the queue store's record of spent proofs of work,
//!    under the request's room: the same Redis for every gateway).
//! 2. **Forward-confirmed reverse DNS** ([`rdns`]) for a request whose
//!    User-Agent names a crawler with `hostnames`: the client address's
//!    PTR name under a configured suffix, and that name's A/AAAA holding
//!    the address.
//!
//! What a verified crawler gets ([`Crawlers::pass`], called by the gate
//! after a request showed no live admission): the origin, with
//! `Sluice-Crawler: {name}` (a client's own `Sluice-*` headers never reach
//! the origin), within its own rate limit (a token bucket per crawler in
//! the queue store, one budget for every gateway on it: `rate_per_sec`,
//! `burst`; past it 429 `rate_limited` with `Retry-After`; while the store
//! does not answer, each gateway's own bucket of that size). It never
//! takes a place in line, an admission, a session or a cookie: nothing of
//! what is metered for visitors is spent on it.
//! Its rooms' gates only: the admin API and reservations still want their
//! own credentials.
//!
//! Anything short of a proof (no signature, a signature that fails any
//! check, a signer not on the list, a directory that cannot be had, a PTR
//! that does not confirm, a DNS that does not answer) leaves the request
//! an ordinary visitor: the waiting room, never an error. Each outcome is
//! counted per room, crawler and reason (`sluice_crawler_requests_total`,
//! and the admin room view's `crawlers`, which the dashboard shows).

pub mod directory;
pub mod httpsig;
pub mod rdns;

use std::collections::HashMap;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{HeaderMap, StatusCode, header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sfv::{BareItem, Dictionary, Item, ListEntry, Parser};
use sha2::Digest as _;
use sluice_admission::{QueueBackend, QueueStore as _, Spend};

use crate::app::clock::now_s;
use crate::app::problem::Problem;
use crate::app::telemetry::Telemetry;
use crate::config::CrawlersConfig;
use crate::config::crawlers::{normalize_origin, normalize_suffix};
use crate::edge::client_ip::ClientInfo;

use directory::{Directories, Lookup};
use httpsig::{Reason, RequestView, Signed};

/// The header the origin receives with a verified crawler's request.
pub const CRAWLER_HEADER: &str = "sluice-crawler";

/// The crawler label of refusals no crawler can be named for (a signer
/// not on the allow-list, a signature that does not parse).
pub const UNKNOWN: &str = "unknown";

/// Where nonces are remembered beside this gateway's own set: the queue
/// store's record of spent proofs of work, under the request's room (the
/// same Redis for every gateway).
#[derive(Clone, Copy)]
struct Nonces<'a> {
    queue: &'a QueueBackend,
    room: &'a str,
}

/// A crawler's nonce among the spent proofs of work: 16 bytes of a
/// SHA-256 separated from the challenge ids by its prefix.
fn nonce_id(origin: &str, nonce: &str) -> [u8; 16] {
    let d = sha2::Sha256::new()
        .chain_update(b"sluice-crawler-nonce-v1\0")
        .chain_update(origin.as_bytes())
        .chain_update(b"\0")
        .chain_update(nonce.as_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&d[..16]);
    id
}

/// Longest nonce remembered (a longer one is refused).
const MAX_NONCE: usize = 256;

/// The parts of a request the checks read (borrowed apart from its body,
/// which is not `Sync`).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// The method.
    pub method: &'a http::Method,
    /// The target, in its canonical form.
    pub uri: &'a http::Uri,
    /// The header fields.
    pub headers: &'a HeaderMap,
}

impl<'a> Target<'a> {
    /// The parts of `req`.
    pub fn of<B>(req: &'a http::Request<B>) -> Target<'a> {
        Target {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
        }
    }
}

/// One configured crawler.
struct Agent {
    name: Arc<str>,
    /// The rooms it passes; `None`: every room.
    rooms: Option<Vec<String>>,
    /// Its signer's origin, normalized.
    origin: Option<String>,
    /// Host name suffixes, normalized (leading dot).
    suffixes: Vec<String>,
    /// User-Agent words, lower case.
    user_agents: Vec<String>,
    /// Its budget in the queue store (`crawler.{name}`), shared by every
    /// gateway, and its size.
    rate_key: String,
    rate_per_sec: f64,
    burst: u32,
    /// Its budget at this gateway alone, while the store does not answer.
    limiter: DefaultDirectRateLimiter,
}

impl Agent {
    fn covers(&self, room: &str) -> bool {
        self.rooms
            .as_ref()
            .is_none_or(|r| r.iter().any(|x| x == room))
    }

    /// One request from its budget: `None` taken, `Some(ms)` over it. The
    /// budget is the queue store's, one for every gateway on it
    /// ([`sluice_admission::rate`]); while the store does not answer, this
    /// gateway's own bucket of the same size decides (a crawler is then
    /// held to the rate at each gateway, never let through unmetered).
    async fn take(&self, queue: &QueueBackend) -> Option<u64> {
        match queue
            .take_rate(&self.rate_key, self.rate_per_sec, self.burst)
            .await
        {
            Ok(wait) => wait,
            Err(e) => {
                tracing::debug!(crawler = %self.name, error = %e, "shared crawler budget unavailable: this gateway's own");
                self.limiter.check().err().map(|not_until| {
                    let wait = not_until.wait_time_from(governor::clock::Clock::now(
                        &governor::clock::DefaultClock::default(),
                    ));
                    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1)
                })
            }
        }
    }
}

/// Outcomes per room and crawler, for the dashboard.
#[derive(Clone, Copy, Default)]
struct Counts {
    passed: u64,
    rate_limited: u64,
    refused: u64,
}

/// What the checks concluded about a request.
enum Verdict {
    /// Crawler `i`.
    Verified(usize),
    /// Claimed, not proved (`crawler`: the one claimed, when known).
    Refused {
        crawler: Option<usize>,
        reason: Reason,
    },
}

/// The verified crawlers of a gateway.
pub struct Crawlers {
    agents: Vec<Agent>,
    by_origin: HashMap<String, usize>,
    directories: Arc<Directories>,
    dns: Option<rdns::ReverseDns>,
    max_age: i64,
    require_nonce: bool,
    /// Nonces seen → until when (seconds) they are remembered.
    nonces: Mutex<HashMap<String, i64>>,
    nonce_capacity: usize,
    counts: Mutex<HashMap<(String, usize), Counts>>,
}

impl Crawlers {
    /// The crawlers of a validated configuration, their directories'
    /// first fetch started (call within the runtime).
    pub fn new(config: &CrawlersConfig) -> anyhow::Result<Arc<Crawlers>> {
        let mut agents = Vec::new();
        let mut by_origin = HashMap::new();
        let mut origins = Vec::new();
        for (i, a) in config.agents.iter().enumerate() {
            let origin = a.signature_agent.as_deref().and_then(normalize_origin);
            if let Some(o) = &origin {
                by_origin.insert(o.clone(), i);
                origins.push(o.clone());
            }
            let per_sec = a.rate_per_sec.max(1e-6);
            let quota = Quota::with_period(std::time::Duration::from_secs_f64(1.0 / per_sec))
                .ok_or_else(|| anyhow::anyhow!("crawler {}: rate_per_sec", a.name))?
                .allow_burst(
                    std::num::NonZeroU32::new(a.burst.max(1))
                        .ok_or_else(|| anyhow::anyhow!("crawler {}: burst", a.name))?,
                );
            agents.push(Agent {
                name: Arc::from(a.name.as_str()),
                rooms: (!a.rooms.is_empty()).then(|| a.rooms.clone()),
                origin,
                suffixes: a
                    .hostnames
                    .iter()
                    .filter_map(|s| normalize_suffix(s))
                    .collect(),
                user_agents: a
                    .user_agents
                    .iter()
                    .map(|u| u.trim().to_ascii_lowercase())
                    .collect(),
                rate_key: format!("crawler.{}", a.name),
                rate_per_sec: per_sec,
                burst: a.burst.max(1),
                limiter: RateLimiter::direct(quota),
            });
        }
        let dns = if agents.iter().any(|a| !a.suffixes.is_empty()) {
            Some(rdns::ReverseDns::new(&config.dns)?)
        } else {
            None
        };
        let directories = Directories::new(config, &origins)?;
        directories.warm();
        Ok(Arc::new(Crawlers {
            agents,
            by_origin,
            directories,
            dns,
            max_age: i64::try_from(config.max_signature_age.as_secs()).unwrap_or(i64::MAX),
            require_nonce: config.require_nonce,
            nonces: Mutex::new(HashMap::new()),
            nonce_capacity: config.nonce_cache_entries,
            counts: Mutex::new(HashMap::new()),
        }))
    }

    /// Whether any crawler is configured.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// The gate's question for a request with no live admission at `room`:
    /// `None`, it is no verified crawler of this room (it goes on as a
    /// visitor); `Some(Ok(name))`, it passes as crawler `name`;
    /// `Some(Err(answer))`, a verified crawler past its rate limit (429).
    pub async fn pass(
        &self,
        telemetry: &Telemetry,
        queue: &QueueBackend,
        room: &str,
        req: Target<'_>,
        client: &ClientInfo,
    ) -> Option<Result<Arc<str>, Response>> {
        if self.agents.is_empty() {
            return None;
        }
        let headers = req.headers;
        let signed = headers.contains_key("signature-input");
        let ua = match &self.dns {
            Some(_) => headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_ascii_lowercase)
                .filter(|ua| {
                    self.agents
                        .iter()
                        .any(|a| a.user_agents.iter().any(|t| ua.contains(t.as_str())))
                }),
            None => None,
        };
        if !signed && ua.is_none() {
            return None;
        }
        let mut verified = None;
        if signed {
            match self.web_bot_auth(Nonces { queue, room }, req, client).await {
                Verdict::Verified(i) if self.agents[i].covers(room) => verified = Some(i),
                Verdict::Verified(i) => self.count(telemetry, room, Some(i), "room"),
                Verdict::Refused { crawler, reason } => {
                    self.count(telemetry, room, crawler, reason);
                }
            }
        }
        if verified.is_none()
            && let (Some(ua), Some(dns)) = (&ua, &self.dns)
        {
            for (i, a) in self.agents.iter().enumerate() {
                let named = a.user_agents.iter().any(|t| ua.contains(t.as_str()));
                if a.suffixes.is_empty() || !named || !a.covers(room) {
                    continue;
                }
                match dns.check(i, &a.suffixes, client.ip).await {
                    Ok(_) => {
                        verified = Some(i);
                        break;
                    }
                    Err(reason) => self.count(telemetry, room, Some(i), reason),
                }
            }
        }
        let i = verified?;
        let agent = &self.agents[i];
        if let Some(wait_ms) = agent.take(queue).await {
            let wait = wait_ms.div_ceil(1000).max(1);
            self.count(telemetry, room, Some(i), "rate_limited");
            let answer = Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "This crawler is over its rate limit: slow down",
            )
            .with("crawler", agent.name.to_string())
            .retry_after(wait)
            .into_response();
            return Some(Err(answer));
        }
        self.count(telemetry, room, Some(i), "passed");
        Some(Ok(agent.name.clone()))
    }

    /// The Web Bot Auth check of a request carrying `Signature-Input`:
    /// the first of its `web-bot-auth` signatures that verifies, or the
    /// first one's refusal.
    async fn web_bot_auth(
        &self,
        guard: Nonces<'_>,
        req: Target<'_>,
        client: &ClientInfo,
    ) -> Verdict {
        let headers = req.headers;
        let sigs = match httpsig::signatures(headers) {
            Ok(s) => s,
            Err(reason) => {
                return Verdict::Refused {
                    crawler: None,
                    reason,
                };
            }
        };
        let tagged: Vec<&Signed> = sigs
            .iter()
            .filter(|s| s.string_param("tag") == Ok(Some("web-bot-auth")))
            .collect();
        if tagged.is_empty() {
            return Verdict::Refused {
                crawler: None,
                reason: "tag",
            };
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri.authority().map(|a| a.as_str()))
            .unwrap_or("");
        let view = RequestView::new(req.method.as_str(), client.proto, host, req.uri, headers);
        let mut first = None;
        for sig in tagged {
            match self.check_signature(guard, &view, headers, sig).await {
                Ok(i) => return Verdict::Verified(i),
                Err(refusal) => {
                    first.get_or_insert(refusal);
                }
            }
        }
        let (crawler, reason) = first.unwrap_or((None, "tag"));
        Verdict::Refused { crawler, reason }
    }

    /// One `web-bot-auth` signature, every check of the module docs, in
    /// the order that spends the least on a forgery: what it says, who
    /// signed, when, the key, the base, the signature, its nonce.
    async fn check_signature(
        &self,
        guard: Nonces<'_>,
        view: &RequestView<'_>,
        headers: &HeaderMap,
        sig: &Signed,
    ) -> Result<usize, (Option<usize>, Reason)> {
        let none = |r: Reason| (None, r);
        let created = sig.int_param("created").map_err(none)?;
        let expires = sig.int_param("expires").map_err(none)?;
        let keyid = sig.string_param("keyid").map_err(none)?;
        let nonce = sig.string_param("nonce").map_err(none)?;
        let alg = sig.string_param("alg").map_err(none)?;
        let (Some(created), Some(expires), Some(keyid)) = (created, expires, keyid) else {
            return Err(none("params"));
        };
        if nonce.is_some_and(|n| n.len() > MAX_NONCE) {
            return Err(none("params"));
        }
        // The signer: the Signature-Agent member this signature covers
        // (one it does not cover names nobody).
        let components: Vec<(&str, Option<&str>)> = sig.components().collect();
        let Some(&(_, member)) = components.iter().find(|(n, _)| *n == "signature-agent") else {
            return Err(none("components"));
        };
        let url = signature_agent(headers, member).ok_or((None, "signer"))?;
        let i = normalize_origin(&url)
            .and_then(|o| self.by_origin.get(&o).copied())
            .ok_or((None, "signer"))?;
        let mine = |r: Reason| (Some(i), r);
        if alg.is_some_and(|a| a != "ed25519") {
            return Err(mine("alg"));
        }
        if !components
            .iter()
            .any(|(n, _)| matches!(*n, "@authority" | "@target-uri"))
        {
            return Err(mine("components"));
        }
        let now = i64::try_from(now_s()).unwrap_or(i64::MAX);
        if created > now.saturating_add(self.max_age) || now.saturating_sub(created) > self.max_age
        {
            return Err(mine("stale"));
        }
        if expires <= now {
            return Err(mine("expired"));
        }
        if nonce.is_none() && self.require_nonce {
            return Err(mine("nonce"));
        }
        let Some(origin) = self.agents[i].origin.as_deref() else {
            return Err(mine("signer"));
        };
        let key = match self.directories.key(origin, keyid, now).await {
            Lookup::Found(k) => k,
            Lookup::Unknown => return Err(mine("unknown_key")),
            Lookup::Unavailable => return Err(mine("directory")),
        };
        let base = httpsig::signature_base(view, sig).map_err(mine)?;
        if !httpsig::verify_ed25519(&key, &base, &sig.signature) {
            return Err(mine("signature"));
        }
        if let Some(nonce) = nonce {
            self.remember_nonce(guard, origin, nonce, created, now)
                .await
                .map_err(mine)?;
        }
        Ok(i)
    }

    /// A nonce verifies once: remembered until its signature is stale
    /// anyway, here (a replay to this gateway costs no store round trip)
    /// and among the queue store's spent proofs of work, shared by every
    /// gateway on it (a
    /// replay to another gateway is refused too). `Err("replayed")` when
    /// seen; `Err("replay_full")` when this gateway's set is full of live
    /// nonces, `Err("replay_store")` when the store cannot say (refused
    /// rather than a nonce forgotten).
    async fn remember_nonce(
        &self,
        guard: Nonces<'_>,
        origin: &str,
        nonce: &str,
        created: i64,
        now: i64,
    ) -> Result<(), Reason> {
        let until = created.saturating_add(self.max_age).saturating_add(1);
        {
            let key = format!("{origin} {nonce}");
            let mut seen = self.nonces.lock();
            if seen.get(&key).is_some_and(|u| *u >= now) {
                return Err("replayed");
            }
            if seen.len() >= self.nonce_capacity {
                seen.retain(|_, u| *u >= now);
                if seen.len() >= self.nonce_capacity {
                    return Err("replay_full");
                }
            }
            seen.insert(key, until);
        }
        let ttl = std::time::Duration::from_secs(u64::try_from(until - now).unwrap_or(1).max(1));
        match guard
            .queue
            .spend_solution(guard.room, &nonce_id(origin, nonce), ttl)
            .await
        {
            Ok(Spend::First) => Ok(()),
            Ok(Spend::Replayed { .. }) => Err("replayed"),
            Err(e) => {
                tracing::warn!(error = %e, "crawler nonce not checked: the queue store failed");
                Err("replay_store")
            }
        }
    }

    /// Counts an outcome (`passed`, `rate_limited` or a refusal's reason).
    fn count(&self, telemetry: &Telemetry, room: &str, crawler: Option<usize>, result: &str) {
        let name = crawler.map_or(UNKNOWN, |i| &self.agents[i].name);
        telemetry.crawler(room, name, result);
        let slot = crawler.unwrap_or(usize::MAX);
        let mut counts = self.counts.lock();
        let c = counts.entry((room.to_owned(), slot)).or_default();
        match result {
            "passed" => c.passed += 1,
            "rate_limited" => c.rate_limited += 1,
            _ => c.refused += 1,
        }
    }

    /// The room's crawlers for the admin view (`crawlers`): totals, and
    /// per crawler of the room its passes, rate-limited requests and
    /// refusals on this gateway, with its directory's key count (`keys`,
    /// `null` until fetched) for a Web Bot Auth signer.
    pub fn view(&self, room: &str) -> Value {
        let counts = self.counts.lock();
        let get = |slot: usize| {
            counts
                .get(&(room.to_owned(), slot))
                .copied()
                .unwrap_or_default()
        };
        let status: HashMap<String, Option<usize>> =
            self.directories.status().into_iter().collect();
        let mut total = Counts::default();
        let mut agents = Vec::new();
        for (i, a) in self.agents.iter().enumerate() {
            if !a.covers(room) {
                continue;
            }
            let c = get(i);
            total.passed += c.passed;
            total.rate_limited += c.rate_limited;
            total.refused += c.refused;
            let mut v = json!({
                "name": &*a.name,
                "passed": c.passed,
                "rate_limited": c.rate_limited,
                "refused": c.refused,
                "web_bot_auth": a.origin.is_some(),
                "reverse_dns": !a.suffixes.is_empty(),
            });
            if let Some(o) = &a.origin {
                v["keys"] = json!(status.get(o).copied().flatten());
            }
            agents.push(v);
        }
        let unknown = get(usize::MAX);
        total.refused += unknown.refused;
        json!({
            "passed": total.passed,
            "rate_limited": total.rate_limited,
            "refused": total.refused,
            "refused_unknown": unknown.refused,
            "agents": agents,
        })
    }
}

/// The URL of the `Signature-Agent` member a signature covers: with
/// `key`, that member of the dictionary (a string, of type `directory`
/// or untyped); without, the whole field as one string (the drafts'
/// earlier form). `None` for anything else.
fn signature_agent(headers: &HeaderMap, key: Option<&str>) -> Option<String> {
    let value = httpsig::field_value(headers, "signature-agent")?;
    let item = match key {
        Some(key) => match Parser::new(&value).parse::<Dictionary>().ok()?.get(key)? {
            ListEntry::Item(item) => item.clone(),
            ListEntry::InnerList(_) => return None,
        },
        None => Parser::new(&value).parse::<Item>().ok()?,
    };
    match item.params.get("type") {
        None => {}
        Some(BareItem::Token(t)) if t.as_str() == "directory" => {}
        Some(_) => return None,
    }
    item.bare_item.as_string().map(|s| s.as_str().to_owned())
}
