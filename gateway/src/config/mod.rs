//! The gateway's configuration: a TOML file, overridden by flags and their
//! environment variables (API.md, "Operating contract").
//!
//! Every section owns its defaults and its `validate()`. Unknown keys are
//! rejected, durations are written like `"30s"` or `"5m"`. A configuration
//! that does not validate stops the process with one line and exit code 64
//! (`EX_USAGE`), before anything listens.

use std::net::{IpAddr, SocketAddr};

use crate::edge::client_ip::canonical_ip;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub mod adaptive;
pub mod error;

pub use error::{ConfigError, EXIT_CONFIG};

/// The whole configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the gateway listens on (`--listen`, `SLUICE_LISTEN`).
    pub listen: SocketAddr,
    /// The origin's base URL (`--origin`, `SLUICE_ORIGIN`). None: the
    /// built-in demo shop on a free loopback port.
    pub origin: Option<String>,
    /// Redis URL (`--redis`, `SLUICE_REDIS_URL`): `redis://host:port`,
    /// `redis+cluster://host:port[,host:port…]` or
    /// `redis+sentinel://host:port[,host:port…]/service`. None: in-memory
    /// stores.
    pub redis: Option<String>,
    /// How holds and confirmations wait for Redis replicas (`[replication]`).
    pub replication: Replication,
    /// Load each configured event's `total` into a store that does not have
    /// the event (`--load-stock`, `SLUICE_LOAD_STOCK`). Default: yes with
    /// the in-memory stores, no with Redis. A Redis that lost its data (a
    /// restart without persistence, a `FLUSHALL`) cannot be told from a new
    /// one, and reloading it would put on sale again what was already sold:
    /// without a ledger to rebuild from, a missing event stays not ready
    /// (503 `inventory_not_ready`) until an operator loads it, through the
    /// admin API or with this flag on a store known never to have sold it.
    pub load_stock: Option<bool>,
    /// How long the reservation store keeps ended holds (`[reservation]`).
    pub reservation: ReservationConfig,
    /// Bearer token of the admin API (`--admin-token`). None: every admin
    /// call answers 401.
    pub admin_token: Option<String>,
    /// Shared HMAC secret for proof-of-work challenges (`--pow-secret`).
    /// None: random at start (only fine for a single gateway).
    pub pow_secret: Option<String>,
    /// Earlier proof-of-work secrets, still accepted for challenges issued
    /// before a rotation but never used to sign (`--pow-previous-secret`,
    /// at most two). Rotating: add the new secret as `pow_secret` and the
    /// old one here on every gateway; drop it once a challenge's lifetime
    /// has passed.
    pub pow_previous_secrets: Vec<String>,
    /// HMAC secret of the payment webhook (`--webhook-secret`). None: the
    /// webhook answers 400 `signature_invalid`.
    pub webhook_secret: Option<String>,
    /// Directory of PKCS#8 Ed25519 keys (`--keys-dir`). None: an ephemeral
    /// key, with a warning.
    pub keys_dir: Option<PathBuf>,
    /// `text` (default) or `json` log lines.
    pub log_format: LogFormat,
    /// Peers whose `X-Forwarded-For` / `Forwarded` headers are believed
    /// (a load balancer in front of the gateway). Addresses or CIDR ranges.
    /// Empty: the TCP peer is the client, and any forwarding headers it sent
    /// are replaced.
    pub trusted_proxies: Vec<IpNet>,
    /// Timeouts of the HTTP front and the proxy.
    pub timeouts: Timeouts,
    /// Size limits.
    pub limits: Limits,
    /// The HTTP front's threads (`[server]`).
    pub server: ServerConfig,
    /// How requests are forwarded to the origin.
    pub proxy: ProxyConfig,
    /// Waiting rooms. Empty: one room `default` guarding every path.
    pub rooms: Vec<RoomConfig>,
    /// Events sold through the reservation module. Empty: event `demo`.
    pub events: Vec<EventConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            origin: None,
            redis: None,
            replication: Replication::default(),
            load_stock: None,
            reservation: ReservationConfig::default(),
            admin_token: None,
            pow_secret: None,
            pow_previous_secrets: Vec::new(),
            webhook_secret: None,
            keys_dir: None,
            log_format: LogFormat::Text,
            trusted_proxies: Vec::new(),
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            server: ServerConfig::default(),
            proxy: ProxyConfig::default(),
            rooms: Vec::new(),
            events: Vec::new(),
        }
    }
}

/// The HTTP front.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Threads that accept and serve connections, each with an event loop
    /// of its own that a connection stays on (with the upstream connections
    /// it uses), as nginx's workers do. `0` (the default): one per core.
    /// Background work (admission ticks, reaping, Redis) runs apart from
    /// them.
    pub io_threads: usize,
    /// Plain HTTP/1.1 requests (`GET` or `HEAD`, no body, no upgrade, no
    /// `Expect`) are read and answered by the gateway's own HTTP/1.1 code
    /// (`sluice_wire::front`), without hyper's dispatcher, body channel and codec
    /// (about 1,600 fewer instructions per proxied request, README
    /// "Measured"); at the first request that is not plain, hyper serves the
    /// connection. `false`: hyper serves every request.
    pub native_http1: bool,
}

impl ServerConfig {
    /// The I/O threads to start: `io_threads`, or one per core for `0`.
    pub fn threads(&self) -> usize {
        match self.io_threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            io_threads: 0,
            native_http1: true,
        }
    }
}

/// Replica acknowledgement of reservation writes (README, "Failover").
///
/// Redis replicates asynchronously: without waiting, a hold or a payment
/// confirmation the primary answered can be missing from the replica
/// promoted when the primary dies. With `wait_replicas = n`, every hold and
/// confirmation is followed by `WAIT n wait_timeout` on the same connection;
/// when fewer replicas acknowledge, a fresh hold is released again and
/// answered 503 `store_unavailable`, a confirmation stays applied and is
/// answered 503 so the payment provider retries the webhook. No effect with
/// the in-memory stores.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Replication {
    /// Replicas that must acknowledge a hold or confirmation before it is
    /// answered (`--redis-wait-replicas`, `SLUICE_REDIS_WAIT_REPLICAS`).
    /// 0 (default): answer at once (asynchronous replication).
    pub wait_replicas: u32,
    /// How long to wait for them (`--redis-wait-timeout`,
    /// `SLUICE_REDIS_WAIT_TIMEOUT`). Default `"100ms"`; at most `"1s"`.
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
}

impl Default for Replication {
    fn default() -> Self {
        Replication {
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
        }
    }
}

/// How long the reservation store keeps a hold's record once the hold has
/// ended (`[reservation]`), on both stores. The record answers
/// `GET /_sluice/holds/{id}`, a repeated release and a payment webhook;
/// forgetting it changes no counter (the stock, the cart count and the
/// sale stay). Why these defaults: `sluice_reservation::retention`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationConfig {
    /// A hold released (by its visitor or a failed payment) is kept this
    /// long after its release; one that lapsed, this long after its
    /// deadline. Nothing was sold: minutes are enough for the visitor's
    /// page, a retried `DELETE` and a webhook arriving just late (409
    /// `hold_expired`; later than this, 404 `hold_not_found`, and the
    /// provider refunds either way). An `Idempotency-Key` whose hold is
    /// forgotten takes a new hold. Default `"10m"`; at least `"1s"`.
    #[serde(with = "humantime_serde")]
    pub released_hold_retention: Duration,
    /// A confirmed (paid) hold is kept this long after its payment, for as
    /// long as a payment dispute may ask about it: card chargeback windows
    /// run up to 120 days. Default `"180d"` (120 days plus slack); at least
    /// `released_hold_retention`, at most `"3650d"`.
    #[serde(with = "humantime_serde")]
    pub confirmed_hold_retention: Duration,
}

impl Default for ReservationConfig {
    fn default() -> Self {
        let r = sluice_reservation::Retention::default();
        ReservationConfig {
            released_hold_retention: r.released,
            confirmed_hold_retention: r.confirmed,
        }
    }
}

impl ReservationConfig {
    /// The stores' retention.
    pub fn retention(&self) -> sluice_reservation::Retention {
        sluice_reservation::Retention {
            released: self.released_hold_retention,
            confirmed: self.confirmed_hold_retention,
        }
    }

    /// The reservation crate's own check, naming the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use sluice_reservation::RetentionError as E;
        self.retention().validate().map_err(|e| {
            let field = match e {
                E::ReleasedTooShort | E::TooLong("released") => {
                    "reservation.released_hold_retention"
                }
                _ => "reservation.confirmed_hold_retention",
            };
            ConfigError::invalid(field, e.to_string())
        })
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Timeouts. Every wait on a peer is bounded.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Time a client has to send a request's headers (slowloris guard);
    /// also bounds an idle keep-alive connection before its next request.
    #[serde(with = "humantime_serde")]
    pub header_read: Duration,
    /// Time to open a TCP connection to the origin.
    #[serde(with = "humantime_serde")]
    pub upstream_connect: Duration,
    /// Time for the origin to answer with its response headers.
    #[serde(with = "humantime_serde")]
    pub upstream_response: Duration,
    /// How long SIGTERM waits for in-flight requests before closing.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Idle time after which a pooled upstream connection is closed.
    #[serde(with = "humantime_serde")]
    pub upstream_idle: Duration,
    /// Time a client has to send the whole body of a request to the
    /// gateway's own endpoints (read and bounded before any store permit is
    /// taken), and the longest pause between two pieces of a body forwarded
    /// to the origin. Past it: 408 `request_timeout`.
    #[serde(with = "humantime_serde")]
    pub body_read: Duration,
    /// Idle time after which a WebSocket tunnel is closed (no byte either
    /// way).
    #[serde(with = "humantime_serde")]
    pub tunnel_idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_secs(10),
            upstream_connect: Duration::from_secs(5),
            upstream_response: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            upstream_idle: Duration::from_secs(90),
            body_read: Duration::from_secs(10),
            tunnel_idle: Duration::from_secs(300),
        }
    }
}

/// Size limits.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body accepted by the gateway's own endpoints
    /// (`/_sluice/…`). Bodies forwarded to the origin are streamed and not
    /// limited here.
    pub control_body_bytes: usize,
    /// Largest number of request headers.
    pub max_headers: usize,
    /// Largest total size of a request head (request line and headers).
    pub max_header_bytes: usize,
    /// Most client connections open at once (default 10 000). A connection
    /// accepted past it is closed at once, before anything is read: the
    /// client sees a reset or an empty reply and may retry, while the
    /// connections already open keep being served.
    pub max_connections: usize,
    /// Most requests in flight at once on the endpoints that may touch the
    /// stores (challenge, join, status, events, holds, the payment webhook,
    /// admin; default 1024). One past it is answered at once with 503
    /// `store_unavailable`, `"reason": "overloaded"` and `Retry-After`,
    /// instead of queueing behind a slow store.
    pub max_store_requests: usize,
    /// Most requests forwarded to the origin at once (default 4096). One
    /// past it is answered at once with 503 `overloaded` and `Retry-After`
    /// instead of piling onto an origin that is already slow.
    pub max_origin_requests: usize,
    /// Verified tokens remembered so a status poll or a guarded request
    /// skips the Ed25519 check (default 100 000, about 0.4 KB each). A full
    /// cache drops expired entries first, then starts over: memory stays
    /// bounded, and the next polls pay one signature check each.
    pub token_cache_entries: usize,
    /// Most admin API calls in flight at once (default 16): a budget of
    /// their own, apart from `max_store_requests`, so an operator is never
    /// locked out by visitors (or by stalled requests) filling the other.
    pub max_admin_requests: usize,
    /// Status polls one queue token may make per minute (default 120; 0
    /// turns the limit off). Past it: 429 `rate_limited` with
    /// `Retry-After`. The page polls every 1 to 30 s.
    pub status_polls_per_token_per_min: u32,
    /// Hold requests (`POST /_sluice/events/{event}/holds`) one admitted
    /// visitor (the admission token's `sub`) may make per minute, with a
    /// burst of as many (default 60; 0: no limit). Past it: 429
    /// `rate_limited` with `Retry-After`, before the store is asked.
    /// Replays of an `Idempotency-Key` count too (their answer stays the
    /// same after the wait). Per gateway process, like the join limit.
    pub holds_per_visitor_per_min: u32,
    /// Revoked sessions a gateway remembers per room (default 300 000: a
    /// revoke per admission at 1,000 admissions a second for a 5-minute
    /// session ttl; about 80 bytes each). Past it a gateway forgets no
    /// revoke: until the ones it could not keep are too old for any token
    /// of theirs to be valid, it asks the store whether each admitted
    /// request's session lives (gauge `sluice_ended_overflow`).
    pub ended_sessions_per_room: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            control_body_bytes: 64 * 1024,
            max_headers: 100,
            max_header_bytes: 64 * 1024,
            max_connections: 10_000,
            max_store_requests: 1024,
            max_origin_requests: 4096,
            token_cache_entries: 100_000,
            max_admin_requests: 16,
            status_polls_per_token_per_min: 120,
            holds_per_visitor_per_min: 60,
            ended_sessions_per_room: 300_000,
        }
    }
}

/// Forwarding to the origin.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Send the client's `Host` header to the origin (true), or the origin
    /// URL's authority (false). `X-Forwarded-Host` always carries the
    /// client's.
    pub preserve_host: bool,
    /// Most idle pooled connections kept per origin host.
    pub pool_max_idle_per_host: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            preserve_host: true,
            pool_max_idle_per_host: 256,
        }
    }
}

/// One waiting room and the requests it guards.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoomConfig {
    /// Room id (`[A-Za-z0-9_-]{1,64}`), used in URLs, cookies and keys.
    pub id: String,
    /// Host names this room guards (empty: any host).
    pub hosts: Vec<String>,
    /// Path prefixes this room guards (empty: every path). The most
    /// specific match among all rooms wins.
    pub paths: Vec<String>,
    /// Path prefixes under the room's hosts that are never queued
    /// (`/robots.txt`, static assets, feeds).
    pub bypass_paths: Vec<String>,
    /// Client address ranges that are never queued (monitoring, partners).
    pub bypass_ips: Vec<IpNet>,
    /// Match `paths` and `bypass_paths` ignoring ASCII case, for an origin
    /// that serves `/Tickets` as `/tickets` (IIS, a case-insensitive file
    /// system). Off by default.
    pub case_insensitive_paths: bool,
    /// Pass an encoded slash (`%2F`) in a path this room guards through to
    /// the origin, for an origin that really uses them (routing decides on
    /// the decoded form, where `%2F` is `/`). Off by default: such a
    /// request is answered 400 `malformed_request`, since origins disagree
    /// on whether `%2F` separates segments.
    pub allow_encoded_slashes: bool,
    /// Admissions per second (0 with `capacity_rps` set: derived from it).
    pub rate_per_sec: f64,
    /// Admissions saved up while nobody waits (at least 1).
    pub burst: f64,
    /// The origin's capacity in requests/s; when set, the rate is derived:
    /// `capacity_rps × (1 − safety_margin) / requests_per_visitor_per_sec`.
    pub capacity_rps: Option<f64>,
    /// Share of the capacity kept in reserve, in [0, 1).
    pub safety_margin: f64,
    /// Requests per second one admitted visitor sends to the origin.
    pub requests_per_visitor_per_sec: f64,
    /// Most admitted visitors at once (sessions plus unclaimed admissions).
    pub max_active: Option<u64>,
    /// How long an admitted visitor stays; with it and no `max_active`, the
    /// cap is Little's law: `rate × session_length`.
    #[serde(with = "humantime_serde")]
    pub session_length: Option<Duration>,
    /// Time an admitted visitor has to claim its place before the slot is
    /// given back (no-show).
    #[serde(with = "humantime_serde")]
    pub claim_window: Duration,
    /// Idle lifetime of an admission (session): the admission token lasts
    /// this long and is renewed while the visitor is active.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// Hard cap on a session however active it is (none: sliding forever).
    #[serde(with = "humantime_serde")]
    pub session_hard_cap: Option<Duration>,
    /// Bind admission tokens to the client's network prefix (/24, /56).
    pub bind_ip_prefix: bool,
    /// When the store cannot be reached: `closed` holds new visitors (the
    /// default), `open` lets them through. Admitted visitors always pass.
    pub failure_policy: FailurePolicy,
    /// Status of the waiting-room page for browsers: 200, 202, 429 or 503.
    pub waiting_status: u16,
    /// Challenges and joins allowed per client network prefix per minute
    /// (0: no limit).
    pub join_limit_per_prefix_per_min: u32,
    /// Puzzles per challenge (k).
    pub puzzles: u8,
    /// Lowest proof-of-work difficulty (leading zero bits per puzzle).
    pub difficulty_floor_bits: u8,
    /// Highest proof-of-work difficulty.
    pub difficulty_ceiling_bits: u8,
    /// Under attack (the work a flooding network would need is past the
    /// ceiling), challenges carry this minimum solve age instead of more
    /// work: a wall-clock floor no GPU compresses. `"0s"` turns it off.
    #[serde(with = "humantime_serde")]
    pub attack_min_solve: Duration,
    /// How long a challenge may be solved and redeemed.
    #[serde(with = "humantime_serde")]
    pub challenge_ttl: Duration,
    /// Lifetime of a queue token (a place in line).
    #[serde(with = "humantime_serde")]
    pub queue_token_ttl: Duration,
    /// When the room opens (RFC 3339, e.g. `"2026-12-01T10:00:00Z"`). Until
    /// then visitors join a pre-queue and nobody is admitted; at the opening
    /// they are ordered by a verifiable random draw (README, "Scheduled
    /// opening and the pre-queue draw"). Applied when the room is first
    /// created in the store; later changes go through the admin API.
    pub opens_at: Option<String>,
    /// The waiting page's look (`[rooms.page]`): brand name, accent
    /// colour, an operator's template directory (see `docs/waiting-page.md`).
    pub page: crate::visitor::template::PageConfig,
    /// Adaptive admission (`[rooms.adaptive]`): the rate steered by the
    /// origin's latency and errors. Off by default.
    pub adaptive: crate::config::adaptive::AdaptiveConfig,
}

impl RoomConfig {
    /// The settings of the room's proof-of-work difficulty policy: what
    /// `Room::new` builds it from and what [`Config::validate`] checks
    /// with the policy's own `validate`, so a room `serve` would refuse is
    /// refused by `check-config` with the same words.
    pub fn difficulty(&self) -> sluice_pow::DifficultyConfig {
        sluice_pow::DifficultyConfig {
            floor_bits: self.difficulty_floor_bits,
            ceiling_bits: self.difficulty_ceiling_bits,
            default_bits: self.difficulty_floor_bits,
            puzzles: self.puzzles,
            min_solve_under_attack: self.attack_min_solve,
            ..sluice_pow::DifficultyConfig::default()
        }
    }
}

/// What a room does for new visitors when its store cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Hold new visitors (503 `store_unavailable`) until the store is back.
    #[default]
    Closed,
    /// Let new visitors through unmetered.
    Open,
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            id: "default".to_owned(),
            hosts: Vec::new(),
            case_insensitive_paths: false,
            allow_encoded_slashes: false,
            paths: Vec::new(),
            bypass_paths: vec!["/robots.txt".to_owned(), "/favicon.ico".to_owned()],
            bypass_ips: Vec::new(),
            rate_per_sec: 50.0,
            burst: 50.0,
            capacity_rps: None,
            safety_margin: 0.2,
            requests_per_visitor_per_sec: 1.0,
            max_active: None,
            session_length: None,
            claim_window: Duration::from_secs(60),
            session_ttl: Duration::from_secs(600),
            session_hard_cap: None,
            bind_ip_prefix: false,
            failure_policy: FailurePolicy::Closed,
            waiting_status: 200,
            join_limit_per_prefix_per_min: 60,
            puzzles: 16,
            difficulty_floor_bits: 18,
            difficulty_ceiling_bits: 20,
            attack_min_solve: Duration::from_secs(3),
            challenge_ttl: Duration::from_secs(300),
            queue_token_ttl: Duration::from_secs(86_400),
            opens_at: None,
            page: crate::visitor::template::PageConfig::default(),
            adaptive: crate::config::adaptive::AdaptiveConfig::default(),
        }
    }
}

/// One event sold through the reservation module.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventConfig {
    /// Event id (`[A-Za-z0-9_-]{1,64}`).
    pub id: String,
    /// The room whose admitted visitors may buy.
    pub room: String,
    /// Units loaded at start when the store has none (0: load nothing;
    /// stock then comes from the admin API).
    pub total: u64,
    /// Most units one visitor may hold and buy.
    pub cart_limit: u32,
    /// How long a hold lasts before its stock goes back.
    #[serde(with = "humantime_serde")]
    pub hold_ttl: Duration,
}

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig {
            id: "demo".to_owned(),
            room: "default".to_owned(),
            total: 100,
            cart_limit: 4,
            hold_ttl: Duration::from_secs(300),
        }
    }
}

impl Config {
    /// Whether configured stock is loaded at start (see [`Config::load_stock`]).
    pub fn loads_stock(&self) -> bool {
        self.load_stock.unwrap_or(self.redis.is_none())
    }
}

/// Whether `id` is a valid room or event id.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Config {
    /// Reads and parses a TOML file (no validation; see [`Config::validate`]).
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses TOML text; the error is folded to one line.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| {
            e.to_string()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('|'))
                .collect::<Vec<_>>()
                .join(" ")
        })
    }

    /// Fills in the embedded default's room and event when none are
    /// configured.
    pub fn with_defaults(mut self) -> Config {
        if self.rooms.is_empty() {
            self.rooms.push(RoomConfig::default());
        }
        if self.events.is_empty() {
            let room = self.rooms[0].id.clone();
            self.events.push(EventConfig {
                room,
                ..EventConfig::default()
            });
        }
        self
    }

    /// Checks every setting; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(origin) = &self.origin {
            let uri: http::Uri = origin
                .parse()
                .map_err(|e| ConfigError::invalid("origin", format!("{e}")))?;
            match uri.scheme_str() {
                Some("http") => {}
                Some(other) => {
                    return Err(ConfigError::invalid(
                        "origin",
                        format!("scheme `{other}` is not supported (use http://)"),
                    ));
                }
                None => return Err(ConfigError::invalid("origin", "needs http://host:port")),
            }
            if uri.host().is_none() {
                return Err(ConfigError::invalid("origin", "has no host"));
            }
        }
        // The store URL, parsed by the parser every store opens it with
        // (no connection is made): a bad port or database, a cluster node
        // without a port, a sentinel URL without its service, a TLS URL
        // this build cannot serve is refused here, not after `serve` has
        // bound its listener.
        if let Some(redis) = &self.redis {
            sluice_redis::RedisUrl::parse(redis)
                .map_err(|e| ConfigError::invalid("redis", e.to_string()))?;
        }
        // The keys `serve` signs with, loaded as it loads them: a missing
        // directory, an empty one or a key that does not parse is refused
        // here too.
        if let Some(dir) = &self.keys_dir {
            sluice_admission::Keyring::load_dir(dir)
                .map_err(|e| ConfigError::invalid("keys_dir", format!("{}: {e}", dir.display())))?;
        }
        if let Some(current) = &self.pow_secret {
            // Built here as the gateway will build it, so a short secret or
            // two secrets sharing a key id exit 64 with one clear line.
            let older: Vec<&[u8]> = self
                .pow_previous_secrets
                .iter()
                .map(|p| p.as_bytes())
                .collect();
            sluice_pow::Keyset::from_secrets(current.as_bytes(), &older).map_err(|e| {
                ConfigError::invalid(
                    "pow_secret",
                    match e {
                        sluice_pow::KeysetError::DuplicateKid(_) => format!(
                            "{e}: two secrets map to one key id (the first byte of their SHA-256); choose another new secret"
                        ),
                        _ => e.to_string(),
                    },
                )
            })?;
        }
        if !self.pow_previous_secrets.is_empty() {
            let Some(current) = &self.pow_secret else {
                return Err(ConfigError::invalid(
                    "pow_previous_secrets",
                    "needs pow_secret (the secret that signs now)",
                ));
            };
            if self.pow_previous_secrets.len() > 2 {
                return Err(ConfigError::invalid(
                    "pow_previous_secrets",
                    "at most two earlier secrets",
                ));
            }
            let mut all: Vec<&str> = vec![current];
            for s in &self.pow_previous_secrets {
                if s.is_empty() || all.contains(&s.as_str()) {
                    return Err(ConfigError::invalid(
                        "pow_previous_secrets",
                        "each earlier secret must be non-empty and differ from the others",
                    ));
                }
                all.push(s);
            }
        }
        if self.replication.wait_replicas > 16 {
            return Err(ConfigError::invalid(
                "replication.wait_replicas",
                "must be 16 or fewer",
            ));
        }
        if self.replication.wait_timeout.is_zero()
            || self.replication.wait_timeout > Duration::from_secs(1)
        {
            return Err(ConfigError::invalid(
                "replication.wait_timeout",
                "must be above zero and at most 1s",
            ));
        }
        if let Some(t) = &self.admin_token
            && t.len() < 16
        {
            return Err(ConfigError::invalid(
                "admin_token",
                "must be at least 16 characters",
            ));
        }
        for (name, d) in [
            ("timeouts.header_read", self.timeouts.header_read),
            ("timeouts.upstream_connect", self.timeouts.upstream_connect),
            (
                "timeouts.upstream_response",
                self.timeouts.upstream_response,
            ),
        ] {
            if d.is_zero() {
                return Err(ConfigError::invalid(name, "must be above zero"));
            }
        }
        if self.limits.control_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "limits.control_body_bytes",
                "must be above zero",
            ));
        }
        for (name, n) in [
            ("limits.max_connections", self.limits.max_connections),
            ("limits.max_store_requests", self.limits.max_store_requests),
            (
                "limits.max_origin_requests",
                self.limits.max_origin_requests,
            ),
            ("limits.max_admin_requests", self.limits.max_admin_requests),
        ] {
            if n == 0 || n > 1_000_000 {
                return Err(ConfigError::invalid(name, "must be from 1 to 1000000"));
            }
        }
        if self.limits.holds_per_visitor_per_min > 1_000_000 {
            return Err(ConfigError::invalid(
                "limits.holds_per_visitor_per_min",
                "must be from 0 (no limit) to 1000000",
            ));
        }
        self.reservation.validate()?;
        if self.server.io_threads > 1024 {
            return Err(ConfigError::invalid(
                "server.io_threads",
                "must be from 0 (one per core) to 1024",
            ));
        }
        if self.limits.status_polls_per_token_per_min > 60_000 {
            return Err(ConfigError::invalid(
                "limits.status_polls_per_token_per_min",
                "must be from 0 (off) to 60000",
            ));
        }
        for (name, d) in [
            ("timeouts.body_read", self.timeouts.body_read),
            ("timeouts.tunnel_idle", self.timeouts.tunnel_idle),
        ] {
            if d.is_zero() || d > Duration::from_secs(86_400) {
                return Err(ConfigError::invalid(name, "must be from 1 ms to 24 h"));
            }
        }
        if !(16..=10_000_000).contains(&self.limits.token_cache_entries) {
            return Err(ConfigError::invalid(
                "limits.token_cache_entries",
                "must be from 16 to 10000000",
            ));
        }
        if !(1..=10_000_000).contains(&self.limits.ended_sessions_per_room) {
            return Err(ConfigError::invalid(
                "limits.ended_sessions_per_room",
                "must be from 1 to 10000000",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, room) in self.rooms.iter().enumerate() {
            let field = format!("rooms[{i}]");
            if !valid_id(&room.id) {
                return Err(ConfigError::invalid(
                    format!("{field}.id"),
                    "must match [A-Za-z0-9_-]{1,64}",
                ));
            }
            if !seen.insert(room.id.clone()) {
                return Err(ConfigError::invalid(
                    format!("{field}.id"),
                    format!("room `{}` is defined twice", room.id),
                ));
            }
            for (name, list) in [("paths", &room.paths), ("bypass_paths", &room.bypass_paths)] {
                for p in list {
                    if !p.starts_with('/') {
                        return Err(ConfigError::invalid(
                            format!("{field}.{name}"),
                            format!("`{p}` must start with /"),
                        ));
                    }
                    // A rule is matched in its canonical form, so one that
                    // cannot be normalised could never match as written.
                    let canonical = crate::edge::canonical::normalize_rule(p).map_err(|e| {
                        ConfigError::invalid(format!("{field}.{name}"), format!("`{p}`: {e}"))
                    })?;
                    if canonical == "/_sluice" || canonical.starts_with("/_sluice/") {
                        return Err(ConfigError::invalid(
                            format!("{field}.{name}"),
                            "/_sluice/ is reserved for the gateway",
                        ));
                    }
                }
            }
            for h in &room.hosts {
                crate::edge::canonical::normalize_host(h).map_err(|e| {
                    ConfigError::invalid(format!("{field}.hosts"), format!("`{h}`: {e}"))
                })?;
            }
            if !(room.rate_per_sec.is_finite() && room.rate_per_sec >= 0.0) {
                return Err(ConfigError::invalid(
                    format!("{field}.rate_per_sec"),
                    "must be a number ≥ 0",
                ));
            }
            if !(room.burst.is_finite() && room.burst >= 1.0) {
                return Err(ConfigError::invalid(
                    format!("{field}.burst"),
                    "must be a number ≥ 1",
                ));
            }
            if let Some(t) = &room.opens_at
                && let Err(e) = crate::gate::schedule::parse_rfc3339_ms(t)
            {
                return Err(ConfigError::invalid(format!("{field}.opens_at"), e));
            }
            if !matches!(room.waiting_status, 200 | 202 | 429 | 503) {
                return Err(ConfigError::invalid(
                    format!("{field}.waiting_status"),
                    "must be 200, 202, 429 or 503",
                ));
            }
            // The difficulty policy's own check, on the settings the room
            // will build it from (`Room::new`): puzzles, floor ≤ ceiling,
            // and the work cap (`puzzles × 2^ceiling ≤ 2^24`).
            room.difficulty().validate().map_err(|e| {
                use sluice_pow::DifficultyConfigError as E;
                let name = match e {
                    E::Puzzles(_) => format!("{field}.puzzles"),
                    E::Order { .. } | E::OverCap { .. } => {
                        format!("{field}.difficulty_ceiling_bits")
                    }
                    // Settings a room does not expose (their defaults pass).
                    _ => field.clone(),
                };
                ConfigError::invalid(name, e.to_string())
            })?;
            if room.session_ttl < Duration::from_secs(1)
                || room.claim_window < Duration::from_secs(1)
            {
                return Err(ConfigError::invalid(
                    format!("{field}.session_ttl"),
                    "session_ttl and claim_window must be at least 1s",
                ));
            }
            if let Some(c) = room.capacity_rps
                && !(c.is_finite() && c > 0.0)
            {
                return Err(ConfigError::invalid(
                    format!("{field}.capacity_rps"),
                    "must be a number > 0",
                ));
            }
            if !(0.0..1.0).contains(&room.safety_margin) {
                return Err(ConfigError::invalid(
                    format!("{field}.safety_margin"),
                    "must be in [0, 1)",
                ));
            }
            room.page.validate(&format!("{field}.page"))?;
            room.adaptive.validate(&format!("{field}.adaptive"))?;
        }
        let mut seen = std::collections::HashSet::new();
        for (i, ev) in self.events.iter().enumerate() {
            let field = format!("events[{i}]");
            if !valid_id(&ev.id) {
                return Err(ConfigError::invalid(
                    format!("{field}.id"),
                    "must match [A-Za-z0-9_-]{1,64}",
                ));
            }
            if !seen.insert(ev.id.clone()) {
                return Err(ConfigError::invalid(
                    format!("{field}.id"),
                    format!("event `{}` is defined twice", ev.id),
                ));
            }
            if !self.rooms.is_empty() && !self.rooms.iter().any(|r| r.id == ev.room) {
                return Err(ConfigError::invalid(
                    format!("{field}.room"),
                    format!("no room `{}` is configured", ev.room),
                ));
            }
            if ev.cart_limit == 0 {
                return Err(ConfigError::invalid(
                    format!("{field}.cart_limit"),
                    "must be at least 1",
                ));
            }
            if ev.hold_ttl < Duration::from_secs(1) {
                return Err(ConfigError::invalid(
                    format!("{field}.hold_ttl"),
                    "must be at least 1s",
                ));
            }
            // The stores' own check of the stock this event is loaded with
            // (a total above 2^53 would otherwise be skipped at start with
            // a log line, the event never ready).
            let spec = sluice_reservation::StockSpec {
                total: ev.total,
                cart_limit: ev.cart_limit,
                hold_ttl: ev.hold_ttl,
                version: 1,
                room: ev.room.clone(),
            };
            if let Some(reason) = spec.problem() {
                return Err(ConfigError::invalid(field, reason));
            }
        }
        Ok(())
    }

    /// Whether `peer` is one of the trusted proxies.
    pub fn is_trusted_proxy(&self, peer: IpAddr) -> bool {
        let peer = canonical_ip(peer);
        self.trusted_proxies.iter().any(|net| net.contains(&peer))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn empty_file_is_the_default() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
        c.validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_rejected_on_one_line() {
        let err = Config::from_toml("listen = \"127.0.0.1:1\"\nbogus = 1\n").unwrap_err();
        assert!(err.contains("bogus"), "{err}");
        assert!(!err.contains('\n'));
        let err = Config::from_toml("[timeouts]\nheader_reed = \"1s\"\n").unwrap_err();
        assert!(err.contains("header_reed"), "{err}");
    }

    #[test]
    fn durations_are_human() {
        let c = Config::from_toml(
            "[timeouts]\nheader_read = \"2s\"\nupstream_response = \"1m 30s\"\n[[events]]\nid = \"x\"\nhold_ttl = \"5m\"\n",
        )
        .unwrap();
        assert_eq!(c.timeouts.header_read, Duration::from_secs(2));
        assert_eq!(c.timeouts.upstream_response, Duration::from_secs(90));
        assert_eq!(c.events[0].hold_ttl, Duration::from_secs(300));
        assert!(Config::from_toml("[timeouts]\nheader_read = \"soon\"\n").is_err());
    }

    #[test]
    fn replication_and_sentinel_urls_are_checked() {
        let c = Config::from_toml(
            "redis = \"redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/shop\"\n\
             [replication]\nwait_replicas = 1\nwait_timeout = \"50ms\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.replication.wait_replicas, 1);
        assert_eq!(c.replication.wait_timeout, Duration::from_millis(50));
        for (toml, field) in [
            ("redis = \"redis+sentinel://h:1\"\n", "redis"),
            ("redis = \"redis+sentinel://h/shop\"\n", "redis"),
            ("redis = \"redis+cluster://a:7000,\"\n", "redis"),
            ("redis = \"redis+cluster://a:7000/1\"\n", "redis"),
            ("redis = \"sentinel://h:1/shop\"\n", "redis"),
            (
                "[replication]\nwait_timeout = \"0s\"\n",
                "replication.wait_timeout",
            ),
            (
                "[replication]\nwait_timeout = \"2s\"\n",
                "replication.wait_timeout",
            ),
            (
                "[replication]\nwait_replicas = 17\n",
                "replication.wait_replicas",
            ),
        ] {
            let err = Config::from_toml(toml).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains(field), "{toml}: {err}");
        }
    }

    #[test]
    fn validation_names_the_setting() {
        let mut c = Config {
            origin: Some("ftp://x".into()),
            ..Config::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("origin"), "{e}");
        c.origin = None;
        c.rooms = vec![RoomConfig {
            id: "bad room".into(),
            ..RoomConfig::default()
        }];
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("rooms[0].id")
        );
        c.rooms = vec![RoomConfig {
            paths: vec!["/_sluice/x".into()],
            ..RoomConfig::default()
        }];
        assert!(c.validate().unwrap_err().to_string().contains("reserved"));
        c.rooms = vec![RoomConfig::default()];
        c.events = vec![EventConfig {
            room: "nope".into(),
            ..EventConfig::default()
        }];
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("events[0].room")
        );
        c.events.clear();
        c.admin_token = Some("short".into());
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("admin_token")
        );
    }

    #[test]
    fn in_flight_limits_are_read_and_checked() {
        let c = Config::from_toml(
            "[limits]\nmax_connections = 50\nmax_store_requests = 8\nmax_origin_requests = 9\ntoken_cache_entries = 64\n[server]\nio_threads = 3\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.limits.max_connections, 50);
        assert_eq!(c.server.io_threads, 3);
        let mut bad = c.clone();
        bad.server.io_threads = 5000;
        assert!(bad.validate().is_err());
        assert!(
            Config::from_toml("[server]\nthreads = 2\n").is_err(),
            "unknown key"
        );
        assert_eq!(c.limits.max_store_requests, 8);
        assert_eq!(c.limits.max_origin_requests, 9);
        assert_eq!(c.limits.token_cache_entries, 64);
        for bad in ["0", "15", "10000001"] {
            let toml = format!("[limits]\ntoken_cache_entries = {bad}\n");
            let err = Config::from_toml(&toml).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains("token_cache_entries"), "{err}");
        }
        for bad in ["0", "10000001"] {
            let toml = format!("[limits]\nended_sessions_per_room = {bad}\n");
            let err = Config::from_toml(&toml).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains("ended_sessions_per_room"), "{err}");
        }
        let c = Config::from_toml("[limits]\nended_sessions_per_room = 1\n").unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(Limits::default().ended_sessions_per_room, 300_000);
        let d = Limits::default();
        assert_eq!(
            (
                d.max_connections,
                d.max_store_requests,
                d.max_origin_requests
            ),
            (10_000, 1024, 4096)
        );
        for key in [
            "max_connections",
            "max_store_requests",
            "max_origin_requests",
        ] {
            for n in ["0", "1000001"] {
                let toml = format!("[limits]\n{key} = {n}\n");
                let err = Config::from_toml(&toml).unwrap().validate().unwrap_err();
                assert!(err.to_string().contains(&format!("limits.{key}")), "{err}");
            }
        }
        assert!(Config::from_toml("[limits]\nmax_conections = 5\n").is_err());
    }

    #[test]
    fn hold_retention_is_read_and_checked() {
        let d = Config::default();
        assert_eq!(
            d.reservation.released_hold_retention,
            Duration::from_secs(600)
        );
        assert_eq!(
            d.reservation.confirmed_hold_retention,
            Duration::from_secs(180 * 86_400)
        );
        let c = Config::from_toml(
            "[reservation]\nreleased_hold_retention = \"2m\"\nconfirmed_hold_retention = \"200d\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.reservation.retention().released, Duration::from_secs(120));
        assert_eq!(
            c.reservation.retention().confirmed,
            Duration::from_secs(200 * 86_400)
        );
        for (toml, field) in [
            (
                "released_hold_retention = \"0s\"",
                "reservation.released_hold_retention",
            ),
            (
                "released_hold_retention = \"1h\"\nconfirmed_hold_retention = \"30m\"",
                "reservation.confirmed_hold_retention",
            ),
            (
                "confirmed_hold_retention = \"0s\"",
                "reservation.confirmed_hold_retention",
            ),
            (
                "confirmed_hold_retention = \"3651d\"",
                "reservation.confirmed_hold_retention",
            ),
        ] {
            let text = format!("[reservation]\n{toml}\n");
            let err = Config::from_toml(&text).unwrap().validate().unwrap_err();
            assert!(err.to_string().contains(field), "{toml}: {err}");
        }
        assert!(Config::from_toml("[reservation]\nretention = \"1m\"\n").is_err());
    }

    #[test]
    fn the_hold_limit_is_read_and_checked() {
        assert_eq!(Limits::default().holds_per_visitor_per_min, 60);
        let c = Config::from_toml("[limits]\nholds_per_visitor_per_min = 0\n").unwrap();
        c.validate().unwrap();
        assert_eq!(c.limits.holds_per_visitor_per_min, 0);
        let err = Config::from_toml("[limits]\nholds_per_visitor_per_min = 1000001\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("limits.holds_per_visitor_per_min"),
            "{err}"
        );
    }

    /// The difficulty policy's own check: what `Room::new` (so `serve`)
    /// refuses, `validate` (so `check-config`) refuses with its words.
    #[test]
    fn room_difficulty_is_checked_by_the_policy_itself() {
        let room = |puzzles: u8, floor: u8, ceiling: u8| RoomConfig {
            puzzles,
            difficulty_floor_bits: floor,
            difficulty_ceiling_bits: ceiling,
            ..RoomConfig::default()
        };
        for (r, field, words) in [
            // 16 × 2^21 = 2^25 hashes, past the 2^24 cap.
            (
                room(16, 18, 21),
                "rooms[0].difficulty_ceiling_bits",
                "max ceiling 20",
            ),
            (
                room(1, 18, 25),
                "rooms[0].difficulty_ceiling_bits",
                "max ceiling 24",
            ),
            (
                room(16, 19, 18),
                "rooms[0].difficulty_ceiling_bits",
                "floor_bits",
            ),
            (room(0, 18, 20), "rooms[0].puzzles", "puzzles"),
            (room(65, 1, 2), "rooms[0].puzzles", "puzzles"),
        ] {
            let policy = sluice_pow::DifficultyPolicy::new(r.difficulty()).unwrap_err();
            let c = Config {
                rooms: vec![r],
                ..Config::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(field) && err.contains(words), "{err}");
            assert!(err.ends_with(&policy.to_string()), "{err} / {policy}");
        }
        for ok in [room(16, 18, 20), room(1, 24, 24), room(64, 1, 18)] {
            sluice_pow::DifficultyPolicy::new(ok.difficulty()).unwrap();
            Config {
                rooms: vec![ok],
                ..Config::default()
            }
            .validate()
            .unwrap();
        }
    }

    /// What `serve` would refuse at start without the network: a Redis URL
    /// the client cannot parse, a keys directory it cannot load, a stock
    /// the store would refuse.
    #[test]
    fn urls_keys_and_stock_are_checked_as_serve_uses_them() {
        for url in [
            "redis://127.0.0.1:99999/",
            "redis://127.0.0.1:6379/notadb",
            "rediss://127.0.0.1:6379/",
        ] {
            let c = Config {
                redis: Some(url.into()),
                ..Config::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("`redis`"), "{url}: {err}");
        }
        for url in [
            "redis://127.0.0.1:6379/",
            "redis://:pw@10.0.0.1:6380/2",
            "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
        ] {
            let c = Config {
                redis: Some(url.into()),
                ..Config::default()
            };
            c.validate().unwrap();
        }

        let dir = std::env::temp_dir().join(format!("sluice-cfg-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let with_keys = |d: &Path| Config {
            keys_dir: Some(d.to_owned()),
            ..Config::default()
        };
        let missing = with_keys(&dir).validate().unwrap_err().to_string();
        assert!(missing.contains("`keys_dir`"), "{missing}");
        std::fs::create_dir_all(&dir).unwrap();
        let empty = with_keys(&dir).validate().unwrap_err().to_string();
        assert!(empty.contains("`keys_dir`"), "{empty}");
        std::fs::write(dir.join("bad.pk8"), b"not a key").unwrap();
        let bad = with_keys(&dir).validate().unwrap_err().to_string();
        assert!(
            bad.contains("`keys_dir`") && bad.contains("bad.pk8"),
            "{bad}"
        );
        std::fs::remove_file(dir.join("bad.pk8")).unwrap();
        sluice_admission::keygen(&dir).unwrap();
        with_keys(&dir).validate().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        let c = Config {
            events: vec![EventConfig {
                total: sluice_reservation::MAX_TOTAL + 1,
                ..EventConfig::default()
            }],
            ..Config::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`events[0]`") && err.contains("2^53"), "{err}");
        let c = Config {
            events: vec![EventConfig {
                total: sluice_reservation::MAX_TOTAL,
                ..EventConfig::default()
            }],
            ..Config::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn trusted_proxies_match_mapped_addresses() {
        let c = Config::from_toml("trusted_proxies = [\"10.0.0.0/8\", \"::1/128\"]").unwrap();
        assert!(c.is_trusted_proxy("10.1.2.3".parse().unwrap()));
        assert!(c.is_trusted_proxy("::ffff:10.1.2.3".parse().unwrap()));
        assert!(c.is_trusted_proxy("::1".parse().unwrap()));
        assert!(!c.is_trusted_proxy("11.0.0.1".parse().unwrap()));
    }

    #[test]
    fn defaults_add_room_and_event() {
        let c = Config::default().with_defaults();
        assert_eq!(c.rooms[0].id, "default");
        assert_eq!(c.events[0].id, "demo");
        assert_eq!(c.events[0].room, "default");
        c.validate().unwrap();
    }

    #[test]
    fn configured_stock_is_loaded_by_default_only_into_memory() {
        let mut c = Config::default();
        assert!(c.loads_stock(), "the embedded default loads its demo stock");
        c.redis = Some("redis://127.0.0.1:6379".into());
        assert!(
            !c.loads_stock(),
            "a Redis that lost a sale is never reloaded by default"
        );
        c.load_stock = Some(true);
        assert!(c.loads_stock());
        let c = Config::from_toml("load_stock = false\n").unwrap();
        assert!(!c.loads_stock());
    }
}
