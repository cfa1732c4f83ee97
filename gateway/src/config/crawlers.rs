//! `[crawlers]`: verified crawlers that pass a room's gate without
//! queueing (`crate::gate::crawlers`; README, "Verified crawlers").
//!
//! A crawler is named once, under `[[crawlers.agents]]`, with the ways its
//! identity is proved: a Web Bot Auth signer (`signature_agent`, the
//! origin whose key directory the gateway fetches) and/or forward-confirmed
//! reverse DNS (`hostnames`, the suffixes its PTR names end with, looked
//! up only for requests whose `User-Agent` carries one of `user_agents`).
//! A User-Agent alone never proves anything: it only says which check to
//! run.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// The verified crawlers and how they are checked.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrawlersConfig {
    /// The crawlers that may pass (`[[crawlers.agents]]`). Empty: none,
    /// and no request is ever checked.
    pub agents: Vec<CrawlerConfig>,
    /// How far a signature's `created` may be from the gateway's clock,
    /// either way: older is stale, further ahead is refused too. This is
    /// also how long a signature without a nonce can be replayed. Default
    /// `"60s"`; 1 s to 1 h.
    #[serde(with = "humantime_serde")]
    pub max_signature_age: Duration,
    /// Refuse Web Bot Auth signatures without a `nonce` parameter (with
    /// one, each nonce verifies once per gateway). Off by default.
    pub require_nonce: bool,
    /// Nonces remembered per gateway (each for `max_signature_age`); when
    /// full of live nonces, signatures carrying a new one are refused
    /// rather than a nonce forgotten. Default 100,000; 1 to 10,000,000.
    pub nonce_cache_entries: usize,
    /// PEM bundle of the CAs a key directory's certificate must chain to.
    /// Unset: the system's roots.
    pub directory_ca: Option<PathBuf>,
    /// Longest wait for a key directory (connect, TLS, answer, body). A
    /// request waits for it only when the directory was never fetched
    /// (fetched at start, refreshed in the background). Default `"2s"`;
    /// 100 ms to 30 s.
    #[serde(with = "humantime_serde")]
    pub directory_timeout: Duration,
    /// How long a fetched directory is used before it is fetched again
    /// (a shorter `Cache-Control: max-age` wins, down to a minute).
    /// Default `"1h"`; 1 min to 7 days.
    #[serde(with = "humantime_serde")]
    pub directory_ttl: Duration,
    /// After a failed fetch, how long before the next try (meanwhile the
    /// keys fetched before, if any, are still used; with none, signatures
    /// of that signer are unverified). Default `"30s"`; 1 s to 1 h.
    #[serde(with = "humantime_serde")]
    pub directory_retry: Duration,
    /// Reverse DNS (`[crawlers.dns]`).
    pub dns: CrawlerDnsConfig,
}

impl Default for CrawlersConfig {
    fn default() -> Self {
        CrawlersConfig {
            agents: Vec::new(),
            max_signature_age: Duration::from_secs(60),
            require_nonce: false,
            nonce_cache_entries: 100_000,
            directory_ca: None,
            directory_timeout: Duration::from_secs(2),
            directory_ttl: Duration::from_secs(3600),
            directory_retry: Duration::from_secs(30),
            dns: CrawlerDnsConfig::default(),
        }
    }
}

/// `[crawlers.dns]`: the forward-confirmed reverse DNS checks.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrawlerDnsConfig {
    /// Nameservers asked (`"ip:port"`, over UDP then TCP). Empty: the
    /// system's (`/etc/resolv.conf`).
    pub nameservers: Vec<SocketAddr>,
    /// Longest wait for one check (the PTR and the forward lookups
    /// together); past it the request is unverified. Default `"1s"`;
    /// 50 ms to 10 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// How long a confirmed address stays confirmed. Default `"1h"`;
    /// 1 s to 1 day.
    #[serde(with = "humantime_serde")]
    pub cache_ttl: Duration,
    /// How long an address that failed a check (or whose check failed)
    /// stays unverified before it is checked again. Default `"5m"`;
    /// 1 s to 1 day.
    #[serde(with = "humantime_serde")]
    pub negative_ttl: Duration,
    /// Addresses remembered, confirmed or not. Default 50,000; 1 to
    /// 10,000,000.
    pub cache_entries: usize,
    /// Checks in flight at once; a request past it is unverified at once
    /// (a spray of spoofed crawler User-Agents cannot queue lookups).
    /// Default 64; 1 to 10,000.
    pub max_lookups: usize,
}

impl Default for CrawlerDnsConfig {
    fn default() -> Self {
        CrawlerDnsConfig {
            nameservers: Vec::new(),
            timeout: Duration::from_secs(1),
            cache_ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(300),
            cache_entries: 50_000,
            max_lookups: 64,
        }
    }
}

/// One verified crawler (`[[crawlers.agents]]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrawlerConfig {
    /// Its name (`[A-Za-z0-9_-]{1,64}`), in metrics, the dashboard and the
    /// `Sluice-Crawler` header the origin receives.
    pub name: String,
    /// The rooms it passes (ids). Empty: every room.
    pub rooms: Vec<String>,
    /// Web Bot Auth: the signer's origin (`https://host[:port]`), as its
    /// `Signature-Agent` names it; its keys are read from
    /// `/.well-known/http-message-signatures-directory` there.
    pub signature_agent: Option<String>,
    /// Forward-confirmed reverse DNS: the host name suffixes its addresses'
    /// PTR names end with (`.googlebot.com`), at least two labels each.
    pub hostnames: Vec<String>,
    /// With `hostnames`: words of the `User-Agent` (any case) that make a
    /// request worth a DNS check (`Googlebot`). They decide only whether
    /// to check; the check decides.
    pub user_agents: Vec<String>,
    /// Requests per second it may send (its own budget, apart from the
    /// visitors', kept in the queue store: one for every gateway on it);
    /// past it 429 `rate_limited`.
    /// Default 10; above 0, at most 100,000.
    pub rate_per_sec: f64,
    /// Requests it may send at once before `rate_per_sec` applies.
    /// Default 20; 1 to 100,000.
    pub burst: u32,
}

impl Default for CrawlerConfig {
    fn default() -> Self {
        CrawlerConfig {
            name: String::new(),
            rooms: Vec::new(),
            signature_agent: None,
            hostnames: Vec::new(),
            user_agents: Vec::new(),
            rate_per_sec: 10.0,
            burst: 20,
        }
    }
}

/// A `signature_agent` in the one spelling a `Signature-Agent` value is
/// compared in: `https://host[:port]`, lower case, without the default
/// port or a trailing `/`. `None`: not an https origin.
pub fn normalize_origin(raw: &str) -> Option<String> {
    let uri: http::Uri = raw.trim().parse().ok()?;
    if !uri.scheme_str()?.eq_ignore_ascii_case("https") {
        return None;
    }
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return None;
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return None;
    }
    let host = authority.host().to_ascii_lowercase();
    if host.is_empty() {
        return None;
    }
    Some(match authority.port_u16() {
        Some(443) | None => format!("https://{host}"),
        Some(port) => format!("https://{host}:{port}"),
    })
}

/// A host name suffix in its compared spelling: lower case, with a leading
/// dot, no trailing one. `None`: not at least two DNS labels.
pub fn normalize_suffix(raw: &str) -> Option<String> {
    let s = raw.trim().trim_start_matches('.').trim_end_matches('.');
    let labels: Vec<&str> = s.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if labels.len() < 2 || !labels.iter().all(label_ok) {
        return None;
    }
    Some(format!(".{}", s.to_ascii_lowercase()))
}

impl CrawlersConfig {
    /// Checks every setting; `rooms` are the configured room ids (the
    /// embedded default's `default` when none are).
    pub fn validate(&self, rooms: &[&str]) -> Result<(), ConfigError> {
        let secs = |d: Duration| d.as_secs_f64();
        let range = |field: &str, d: Duration, lo: f64, hi: f64, words: &str| {
            if secs(d) < lo || secs(d) > hi {
                Err(ConfigError::invalid(
                    format!("crawlers.{field}"),
                    format!("must be between {words}"),
                ))
            } else {
                Ok(())
            }
        };
        range(
            "max_signature_age",
            self.max_signature_age,
            1.0,
            3600.0,
            "1s and 1h",
        )?;
        range(
            "directory_timeout",
            self.directory_timeout,
            0.1,
            30.0,
            "100ms and 30s",
        )?;
        range(
            "directory_ttl",
            self.directory_ttl,
            60.0,
            7.0 * 86_400.0,
            "1m and 7 days",
        )?;
        range(
            "directory_retry",
            self.directory_retry,
            1.0,
            3600.0,
            "1s and 1h",
        )?;
        range("dns.timeout", self.dns.timeout, 0.05, 10.0, "50ms and 10s")?;
        range(
            "dns.cache_ttl",
            self.dns.cache_ttl,
            1.0,
            86_400.0,
            "1s and 1 day",
        )?;
        range(
            "dns.negative_ttl",
            self.dns.negative_ttl,
            1.0,
            86_400.0,
            "1s and 1 day",
        )?;
        if !(1..=10_000_000).contains(&self.nonce_cache_entries) {
            return Err(ConfigError::invalid(
                "crawlers.nonce_cache_entries",
                "must be between 1 and 10000000",
            ));
        }
        if !(1..=10_000_000).contains(&self.dns.cache_entries) {
            return Err(ConfigError::invalid(
                "crawlers.dns.cache_entries",
                "must be between 1 and 10000000",
            ));
        }
        if !(1..=10_000).contains(&self.dns.max_lookups) {
            return Err(ConfigError::invalid(
                "crawlers.dns.max_lookups",
                "must be between 1 and 10000",
            ));
        }
        if let Some(ca) = &self.directory_ca {
            crate::proxy::tls::load_ca_bundle(ca)
                .map_err(|e| ConfigError::invalid("crawlers.directory_ca", e))?;
        }
        let mut names = std::collections::HashSet::new();
        let mut signers = std::collections::HashMap::new();
        for (i, agent) in self.agents.iter().enumerate() {
            let field = format!("crawlers.agents[{i}]");
            agent.validate(&field, rooms)?;
            if !names.insert(agent.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{field}.name"),
                    format!("crawler `{}` is defined twice", agent.name),
                ));
            }
            if let Some(origin) = agent.signature_agent.as_deref().and_then(normalize_origin)
                && let Some(other) = signers.insert(origin, agent.name.as_str())
            {
                return Err(ConfigError::invalid(
                    format!("{field}.signature_agent"),
                    format!("is crawler `{other}`'s already: one signer, one crawler"),
                ));
            }
        }
        Ok(())
    }
}

impl CrawlerConfig {
    /// Checks one crawler (`field`: `crawlers.agents[i]`).
    fn validate(&self, field: &str, rooms: &[&str]) -> Result<(), ConfigError> {
        if !crate::config::valid_id(&self.name) {
            return Err(ConfigError::invalid(
                format!("{field}.name"),
                "must be 1 to 64 characters of A-Z, a-z, 0-9, - and _",
            ));
        }
        if self.name == "unknown" {
            return Err(ConfigError::invalid(
                format!("{field}.name"),
                "`unknown` is reserved: it labels the requests no configured crawler can be named for",
            ));
        }
        for (j, room) in self.rooms.iter().enumerate() {
            if !rooms.contains(&room.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{field}.rooms[{j}]"),
                    format!("no room `{room}` is configured"),
                ));
            }
        }
        if self.signature_agent.is_none() && self.hostnames.is_empty() {
            return Err(ConfigError::invalid(
                field,
                "says no way to verify it: set signature_agent (Web Bot Auth) and/or hostnames (reverse DNS)",
            ));
        }
        if let Some(sa) = &self.signature_agent
            && normalize_origin(sa).is_none()
        {
            return Err(ConfigError::invalid(
                format!("{field}.signature_agent"),
                format!(
                    "`{sa}` is not an https origin (https://host[:port], no path: its keys are read from /.well-known/http-message-signatures-directory there)"
                ),
            ));
        }
        for (j, suffix) in self.hostnames.iter().enumerate() {
            if normalize_suffix(suffix).is_none() {
                return Err(ConfigError::invalid(
                    format!("{field}.hostnames[{j}]"),
                    format!(
                        "`{suffix}` is not a host name suffix of at least two labels (e.g. .googlebot.com)"
                    ),
                ));
            }
        }
        if !self.hostnames.is_empty() && self.user_agents.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.user_agents"),
                "is needed with hostnames: the User-Agent words that make a request worth a DNS check (the check alone decides)",
            ));
        }
        if self.hostnames.is_empty() && !self.user_agents.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.user_agents"),
                "only choose requests for the reverse DNS check: set hostnames too (a User-Agent proves nothing)",
            ));
        }
        for (j, ua) in self.user_agents.iter().enumerate() {
            if ua.trim().len() < 3 {
                return Err(ConfigError::invalid(
                    format!("{field}.user_agents[{j}]"),
                    "must be at least 3 characters",
                ));
            }
        }
        if !self.rate_per_sec.is_finite() || self.rate_per_sec <= 0.0 || self.rate_per_sec > 1e5 {
            return Err(ConfigError::invalid(
                format!("{field}.rate_per_sec"),
                "must be above 0 and at most 100000",
            ));
        }
        if !(1..=100_000).contains(&self.burst) {
            return Err(ConfigError::invalid(
                format!("{field}.burst"),
                "must be between 1 and 100000",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::Config;

    fn check(toml: &str) -> Result<(), String> {
        let c = Config::from_toml(toml)?;
        c.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn origins_and_suffixes_have_one_spelling() {
        assert_eq!(
            normalize_origin("HTTPS://Crawler.Example:443/").as_deref(),
            Some("https://crawler.example")
        );
        assert_eq!(
            normalize_origin("https://127.0.0.1:8443").as_deref(),
            Some("https://127.0.0.1:8443")
        );
        for bad in [
            "http://crawler.example",
            "https://crawler.example/keys.json",
            "https://u@crawler.example",
            "https://crawler.example/?a=1",
            "crawler.example",
        ] {
            assert!(normalize_origin(bad).is_none(), "{bad}");
        }
        assert_eq!(
            normalize_suffix("GoogleBot.com.").as_deref(),
            Some(".googlebot.com")
        );
        for bad in [".com", "com", "", "a..b", "bad_label.example"] {
            assert!(normalize_suffix(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_crawlers_section_is_read_and_checked_naming_the_key() {
        let good = r#"
[crawlers]
max_signature_age = "30s"
[crawlers.dns]
nameservers = ["127.0.0.1:5353"]
[[crawlers.agents]]
name = "signed"
signature_agent = "https://crawler.example"
rate_per_sec = 5
[[crawlers.agents]]
name = "googlebot"
hostnames = [".googlebot.com", "google.com"]
user_agents = ["Googlebot"]
rooms = ["default"]
"#;
        check(good).unwrap();
        let c = Config::from_toml(good).unwrap();
        assert_eq!(c.crawlers.agents.len(), 2);
        assert_eq!(c.crawlers.max_signature_age, Duration::from_secs(30));
        for (extra, field) in [
            ("[[crawlers.agents]]\nname = \"x\"\n", "crawlers.agents[0]"),
            (
                "[[crawlers.agents]]\nname = \"bad name\"\nsignature_agent = \"https://a.example\"\n",
                "crawlers.agents[0].name",
            ),
            (
                "[[crawlers.agents]]\nname = \"unknown\"\nsignature_agent = \"https://a.example\"\n",
                "crawlers.agents[0].name",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nsignature_agent = \"http://a.example\"\n",
                "crawlers.agents[0].signature_agent",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nhostnames = [\".com\"]\nuser_agents = [\"Bot\"]\n",
                "crawlers.agents[0].hostnames[0]",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nhostnames = [\".googlebot.com\"]\n",
                "crawlers.agents[0].user_agents",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nsignature_agent = \"https://a.example\"\nuser_agents = [\"Bot\"]\n",
                "crawlers.agents[0].user_agents",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nsignature_agent = \"https://a.example\"\nrooms = [\"nope\"]\n",
                "crawlers.agents[0].rooms[0]",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nsignature_agent = \"https://a.example\"\nrate_per_sec = 0\n",
                "crawlers.agents[0].rate_per_sec",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nsignature_agent = \"https://a.example\"\n[[crawlers.agents]]\nname = \"x\"\nsignature_agent = \"https://b.example\"\n",
                "crawlers.agents[1].name",
            ),
            (
                "[[crawlers.agents]]\nname = \"x\"\nsignature_agent = \"https://a.example\"\n[[crawlers.agents]]\nname = \"y\"\nsignature_agent = \"https://A.example:443/\"\n",
                "crawlers.agents[1].signature_agent",
            ),
            (
                "[crawlers]\nmax_signature_age = \"0s\"\n",
                "crawlers.max_signature_age",
            ),
            (
                "[crawlers]\ndirectory_ca = \"/nonexistent/ca.pem\"\n",
                "crawlers.directory_ca",
            ),
            (
                "[crawlers.dns]\ntimeout = \"20s\"\n",
                "crawlers.dns.timeout",
            ),
            (
                "[crawlers.dns]\nmax_lookups = 0\n",
                "crawlers.dns.max_lookups",
            ),
        ] {
            let err = check(extra).unwrap_err();
            assert!(err.contains(&format!("`{field}`")), "{extra}: {err}");
        }
        assert!(
            Config::from_toml("[crawlers]\nagent = []\n").is_err(),
            "unknown key"
        );
    }
}
