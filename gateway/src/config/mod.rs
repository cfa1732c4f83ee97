//! The gateway's configuration: a TOML file, overridden by flags and their
//! environment variables (API.md, "Operating contract").
//!
//! Unknown keys are rejected, durations are written like `"30s"` or `"5m"`.
//! A configuration that does not validate stops the process with one line
//! and exit code 64 (`EX_USAGE`), before anything listens: `check-config`
//! and `serve` run the same [`Config::validate`], so they refuse alike.
//!
//! # Layout
//!
//! One file per section, each with its struct, its `Default`, a doc
//! comment on every field and its own `validate`:
//!
//! - `mod.rs`: [`Config`] (the top-level settings: listen address, origin,
//!   Redis URL, secrets, keys), loading from TOML, and the checks that span
//!   sections (ids unique, events naming configured rooms);
//! - [`server`] (`[server]`), [`replication`] (`[replication]`),
//!   [`ledger`] (`[ledger]`), [`feeds`] (`[feeds]`),
//!   [`reservation`] (`[reservation]`), [`timeouts`] (`[timeouts]`),
//!   [`limits`] (`[limits]`), [`proxy`] (`[proxy]`);
//! - [`crawlers`] (`[crawlers]`, `[[crawlers.agents]]`): verified
//!   crawlers;
//! - [`room`] (`[[rooms]]`), with [`adaptive`] (`[rooms.adaptive]`; the
//!   page's `[rooms.page]` lives with its templates, `visitor::template`);
//! - [`event`] (`[[events]]`);
//! - [`error`]: the one [`ConfigError`], naming the setting by its dotted
//!   path (`rooms[0].id`, `limits.token_cache_entries`).
//!
//! # The rule
//!
//! Each section validates itself, and where a domain crate owns a rule it
//! calls that crate's own check rather than a copy of it: a Redis URL is
//! parsed by `sluice_redis::RedisUrl::parse`, the keys are loaded by
//! `sluice_admission::Keyring::load_dir`, the proof-of-work secrets are
//! built by `sluice_pow::Keyset::from_secrets`, a room's admission
//! settings are checked by `sluice_admission::RoomSettings::validate` and
//! its difficulty by `sluice_pow::DifficultyConfig::validate`, the hold
//! retention by `sluice_reservation::Retention::validate`, an event's id by
//! `sluice_reservation::EventId::parse` and its stock by
//! `sluice_reservation::StockSpec::problem`. So what `serve` would refuse
//! when it builds the stores and rooms, `check-config` refuses first, in
//! the domain's words. A section checks by itself only what no domain crate
//! owns (timeouts, limits, routing rules), or where it is stricter than the
//! domain (a room id without `.`, a hold of at least a second), saying so.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub mod adaptive;
pub mod crawlers;
pub mod error;
pub mod event;
pub mod feeds;
pub mod ledger;
pub mod limits;
pub mod proxy;
pub mod replication;
pub mod reservation;
pub mod room;
pub mod server;
pub mod timeouts;

pub use crawlers::CrawlersConfig;
pub use error::{ConfigError, EXIT_CONFIG};
pub use event::EventConfig;
pub use feeds::FeedsConfig;
pub use ledger::LedgerConfig;
pub use limits::Limits;
pub use proxy::ProxyConfig;
pub use replication::Replication;
pub use reservation::ReservationConfig;
pub use room::{FailurePolicy, RoomConfig};
pub use server::ServerConfig;
pub use timeouts::Timeouts;

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
    /// PEM CA certificates a `rediss…` server's certificate must chain to
    /// (`--redis-ca`, `SLUICE_REDIS_CA`). None: the system roots. Refused
    /// with a plain `redis…` URL (it would not be used).
    pub redis_ca: Option<PathBuf>,
    /// PEM client certificate (chain) for a server that asks for one
    /// (`tls-auth-clients yes`; `--redis-client-cert`,
    /// `SLUICE_REDIS_CLIENT_CERT`), with [`Config::redis_client_key`].
    pub redis_client_cert: Option<PathBuf>,
    /// PEM private key of [`Config::redis_client_cert`]
    /// (`--redis-client-key`, `SLUICE_REDIS_CLIENT_KEY`).
    pub redis_client_key: Option<PathBuf>,
    /// How holds and confirmations wait for Redis replicas (`[replication]`).
    pub replication: Replication,
    /// Load each configured event's `total` into a store that never had the
    /// event (`--load-stock`, `SLUICE_LOAD_STOCK`). Default: yes with the
    /// in-memory stores, no with Redis. Never into a store that lost it: the
    /// store's load marker (`sluice:loaded:{event}`, which outlives the
    /// event's keys), this process having seen it, or
    /// [`ReservationConfig::state_file`] say so, and a lost event stays not
    /// ready (503 `inventory_not_ready`) until an operator loads it through
    /// the admin API or a ledger rebuilds it (`crate::reserve::events`).
    /// What no gateway can tell from a new store: a Redis that lost all
    /// its data (a `FLUSHALL`, a restart without persistence) while no
    /// gateway ran to write the marker back, with no state file.
    /// The PostgreSQL ledger (`[ledger]`, `--postgres`).
    pub ledger: LedgerConfig,
    pub load_stock: Option<bool>,
    /// How long the reservation store keeps ended holds (`[reservation]`).
    pub reservation: ReservationConfig,
    /// The stock feeds' ingestion lane (`[feeds]`).
    pub feeds: FeedsConfig,
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
    /// Verified crawlers that pass without queueing (`[crawlers]`).
    pub crawlers: CrawlersConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            origin: None,
            redis: None,
            redis_ca: None,
            redis_client_cert: None,
            redis_client_key: None,
            replication: Replication::default(),
            ledger: LedgerConfig::default(),
            load_stock: None,
            reservation: ReservationConfig::default(),
            feeds: FeedsConfig::default(),
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
            crawlers: CrawlersConfig::default(),
        }
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

    /// Checks every setting; the first problem found is returned. Each
    /// section checks itself (calling its domain crate's check); what spans
    /// sections is checked here.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_origin()?;
        // The store URL, parsed by the parser every store opens it with
        // (no connection is made): a bad port or database, a cluster node
        // without a port, a sentinel URL without its service, a TLS URL
        // this build cannot serve is refused here, not after `serve` has
        // bound its listener.
        if let Some(redis) = &self.redis {
            sluice_redis::RedisUrl::parse(redis)
                .map_err(|e| ConfigError::invalid("redis", e.to_string()))?;
        }
        self.redis_tls()?;
        // The keys `serve` signs with, loaded as it loads them: a missing
        // directory, an empty one or a key that does not parse is refused
        // here too.
        if let Some(dir) = &self.keys_dir {
            sluice_admission::Keyring::load_dir(dir)
                .map_err(|e| ConfigError::invalid("keys_dir", format!("{}: {e}", dir.display())))?;
        }
        self.validate_pow_secrets()?;
        self.replication.validate()?;
        self.ledger.validate()?;
        if self.ledger.postgres.is_some() && self.redis.is_none() {
            return Err(ConfigError::invalid(
                "ledger.postgres",
                "the ledger reads Redis's reservation streams: set redis too",
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
        self.timeouts.validate()?;
        self.limits.validate()?;
        self.reservation.validate()?;
        self.feeds.validate()?;
        self.server.validate()?;
        self.proxy.validate()?;
        self.validate_rooms()?;
        self.validate_events()?;
        let rooms: Vec<&str> = if self.rooms.is_empty() {
            vec!["default"]
        } else {
            self.rooms.iter().map(|r| r.id.as_str()).collect()
        };
        self.crawlers.validate(&rooms)
    }

    /// The TLS files of `rediss…` connections, read and checked as the
    /// stores will use them (a missing file, a PEM without a certificate, a
    /// key that does not fit its certificate names its setting). Set beside
    /// a plain `redis…` URL they are refused rather than ignored: whoever
    /// set a CA expects the connection verified, and a plain URL would send
    /// everything (passwords included) in the clear.
    pub fn redis_tls(&self) -> Result<sluice_redis::RedisTls, ConfigError> {
        let tls = sluice_redis::RedisTls::load(
            self.redis_ca.as_deref(),
            self.redis_client_cert.as_deref(),
            self.redis_client_key.as_deref(),
        )
        .map_err(|e| {
            let field = match e.file() {
                sluice_redis::TlsFile::Ca => "redis_ca",
                sluice_redis::TlsFile::ClientCert => "redis_client_cert",
                sluice_redis::TlsFile::ClientKey => "redis_client_key",
            };
            ConfigError::invalid(field, e.to_string())
        })?;
        let plain = match &self.redis {
            Some(url) => sluice_redis::RedisUrl::parse(url).is_ok_and(|u| !u.is_tls()),
            None => true,
        };
        if tls.is_set() && plain {
            let field = match self.redis_ca {
                Some(_) => "redis_ca",
                None => "redis_client_cert",
            };
            return Err(ConfigError::invalid(
                field,
                "is for TLS: set redis to a rediss://, rediss+cluster:// or rediss+sentinel:// URL",
            ));
        }
        Ok(tls)
    }

    /// `origin`: an `http://` or `https://` URL with a host.
    fn validate_origin(&self) -> Result<(), ConfigError> {
        let Some(origin) = &self.origin else {
            return Ok(());
        };
        let uri: http::Uri = origin
            .parse()
            .map_err(|e| ConfigError::invalid("origin", format!("{e}")))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            Some(other) => {
                return Err(ConfigError::invalid(
                    "origin",
                    format!("scheme `{other}` is not supported (use http:// or https://)"),
                ));
            }
            None => {
                return Err(ConfigError::invalid(
                    "origin",
                    "needs http://host:port or https://host[:port]",
                ));
            }
        }
        if uri.host().is_none() {
            return Err(ConfigError::invalid("origin", "has no host"));
        }
        Ok(())
    }

    /// `pow_secret` and `pow_previous_secrets`, built into the keyset the
    /// gateway will sign and verify with.
    fn validate_pow_secrets(&self) -> Result<(), ConfigError> {
        if let Some(current) = &self.pow_secret {
            // Built here as the gateway will build it, so a short (or empty)
            // secret, more than two earlier ones, or two secrets sharing a
            // key id (the same secret twice) exit 64 with one clear line.
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
        if !self.pow_previous_secrets.is_empty() && self.pow_secret.is_none() {
            return Err(ConfigError::invalid(
                "pow_previous_secrets",
                "needs pow_secret (the secret that signs now)",
            ));
        }
        Ok(())
    }

    /// Each room, then what spans rooms: ids unique.
    fn validate_rooms(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for (i, room) in self.rooms.iter().enumerate() {
            let field = format!("rooms[{i}]");
            room.validate(&field)?;
            if !seen.insert(room.id.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{field}.id"),
                    format!("room `{}` is defined twice", room.id),
                ));
            }
        }
        Ok(())
    }

    /// Each event, then what spans sections: ids unique, rooms configured.
    fn validate_events(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for (i, ev) in self.events.iter().enumerate() {
            let field = format!("events[{i}]");
            ev.validate(&field)?;
            if !seen.insert(ev.id.as_str()) {
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
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    #[test]
    fn empty_file_is_the_default() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
        c.validate().unwrap();
    }

    #[test]
    fn a_rooms_queueing_method() {
        let room = |extra: &str| format!("[[rooms]]\nid = \"r\"\n{extra}\n");
        let c = Config::from_toml(&room("method = \"queue_all\"")).unwrap();
        assert_eq!(
            c.rooms[0].settings().method,
            sluice_admission::QueueMethod::QueueAll
        );
        c.validate().unwrap();
        assert_eq!(
            Config::from_toml(&room("")).unwrap().rooms[0].method,
            sluice_admission::QueueMethod::Fifo
        );
        for bad in ["method = \"lottery\"", "method = 2", "method = \"FIFO\""] {
            assert!(Config::from_toml(&room(bad)).is_err(), "{bad}");
        }
        let scheduled = room("method = \"reject\"\nopens_at = \"2999-01-01T00:00:00Z\"");
        let err = Config::from_toml(&scheduled)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("rooms[0].method"), "{err}");
        let random = Config::from_toml(&room("method = \"random\"")).unwrap();
        random.validate().unwrap();
        // a random draw across lanes would break each lane's FIFO order
        let laned = room("method = \"random\"\nlanes = [{ id = \"a\" }, { id = \"b\" }]");
        let err = Config::from_toml(&laned)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("rooms[0].method"), "{err}");
        assert!(err.contains("lanes"), "{err}");
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

    /// What `serve` would refuse at start without the network: a Redis URL
    /// the client cannot parse, a keys directory it cannot load, a stock
    /// the store would refuse.
    #[test]
    fn urls_keys_and_stock_are_checked_as_serve_uses_them() {
        for url in [
            "redis://127.0.0.1:99999/",
            "redis://127.0.0.1:6379/notadb",
            "rediss://127.0.0.1:99999/",
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
            "rediss://cache.example:6380/",
            "rediss+cluster://10.0.0.1:7000,10.0.0.2:7000",
            "rediss+sentinel://10.0.0.1:26379/shop",
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
        // the proxies as configured, decided where the gateway decides it
        let c = Config::from_toml("trusted_proxies = [\"10.0.0.0/8\", \"::1/128\"]").unwrap();
        let trusted = |peer: &str| {
            let peer = SocketAddr::new(peer.parse().unwrap(), 4000);
            crate::edge::client_ip::ClientInfo::resolve(
                peer,
                &http::HeaderMap::new(),
                &c.trusted_proxies,
            )
            .peer_trusted
        };
        assert!(trusted("10.1.2.3"));
        assert!(trusted("::ffff:10.1.2.3"));
        assert!(trusted("::1"));
        assert!(!trusted("11.0.0.1"));
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
