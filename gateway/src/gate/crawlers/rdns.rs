//! Forward-confirmed reverse DNS: an address belongs to a crawler when
//! one of its PTR names ends with one of the crawler's host name suffixes
//! AND the forward lookup of that name (A for an IPv4 address, AAAA for
//! IPv6) contains the address. The PTR alone proves nothing: whoever holds
//! an address's reverse zone writes what they like there; the forward
//! lookup is in the crawler operator's zone.
//!
//! Bounds, so that a spray of requests with a crawler's User-Agent from
//! many addresses costs little:
//! - a check runs only for a request whose User-Agent names a crawler
//!   (`user_agents`), and at most `crawlers.dns.max_lookups` run at once:
//!   past that a request is unverified at once (it waits as a visitor);
//! - one check (PTR, then at most [`MAX_NAMES`] forward lookups) takes at
//!   most `crawlers.dns.timeout`; past it, or with the nameserver down or
//!   refusing, the request is unverified (fail closed) and the address is
//!   checked again after a few seconds ([`FAILURE_TTL`]);
//! - outcomes are cached per crawler and address: confirmed for
//!   `crawlers.dns.cache_ttl`, refused for `crawlers.dns.negative_ttl`, at
//!   most `crawlers.dns.cache_entries` of them (when full of live entries
//!   the cache starts over: it is a cache, losing it costs lookups only).
//!
//! The resolver is hickory's, asking the configured `crawlers.dns.
//! nameservers` (the tests' own DNS server on a loopback port) or, with
//! none, the system's. It answers a PTR for any 127.0.0.0/8 address with
//! `localhost` itself (RFC 6761), so loopback clients never verify.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use parking_lot::Mutex;

use crate::config::crawlers::CrawlerDnsConfig;

/// Most PTR names of one address whose forward lookup is tried.
pub const MAX_NAMES: usize = 4;

/// How long an address whose check failed (timeout, nameserver down) is
/// left unverified before it is checked again.
pub const FAILURE_TTL: Duration = Duration::from_secs(5);

/// The outcome of a check: `Ok` with the confirmed name, or the refusal's
/// reason (`no_ptr`, `hostname`, `forward`, `dns`, `busy`).
pub type Outcome = Result<String, &'static str>;

/// The reverse DNS checker.
pub struct ReverseDns {
    resolver: TokioResolver,
    timeout: Duration,
    cache_ttl: Duration,
    negative_ttl: Duration,
    capacity: usize,
    /// (crawler, address) → outcome, until.
    cache: Mutex<HashMap<(usize, IpAddr), (Outcome, Instant)>>,
    lookups: Arc<tokio::sync::Semaphore>,
}

impl ReverseDns {
    /// A checker asking `config.nameservers` (none: the system's).
    pub fn new(config: &CrawlerDnsConfig) -> anyhow::Result<ReverseDns> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if config.nameservers.is_empty() {
            TokioResolver::builder(provider)
                .map_err(|e| anyhow::anyhow!("crawlers.dns: the system's resolver: {e}"))?
        } else {
            let mut rc = ResolverConfig::from_name_servers(Vec::new());
            for addr in &config.nameservers {
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for conn in &mut ns.connections {
                    conn.port = addr.port();
                }
                rc.add_name_server(ns);
            }
            TokioResolver::builder_with_config(rc, provider)
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = config.timeout;
        opts.attempts = 1;
        opts.use_hosts_file = ResolveHosts::Never;
        opts.cache_size = 1024;
        let resolver = builder
            .build()
            .map_err(|e| anyhow::anyhow!("crawlers.dns: {e}"))?;
        Ok(ReverseDns {
            resolver,
            timeout: config.timeout,
            cache_ttl: config.cache_ttl,
            negative_ttl: config.negative_ttl,
            capacity: config.cache_entries,
            cache: Mutex::new(HashMap::new()),
            lookups: Arc::new(tokio::sync::Semaphore::new(config.max_lookups)),
        })
    }

    /// Whether `ip` is crawler `crawler`'s by its `suffixes` (each with its
    /// leading dot, lower case): from the cache, or checked now.
    pub async fn check(&self, crawler: usize, suffixes: &[String], ip: IpAddr) -> Outcome {
        let now = Instant::now();
        if let Some((outcome, until)) = self.cache.lock().get(&(crawler, ip))
            && now < *until
        {
            return outcome.clone();
        }
        let Ok(_permit) = self.lookups.clone().try_acquire_owned() else {
            return Err("busy");
        };
        let outcome = tokio::time::timeout(self.timeout, self.confirm(suffixes, ip))
            .await
            .unwrap_or(Err("dns"));
        let ttl = match &outcome {
            Ok(_) => self.cache_ttl,
            Err("dns") => FAILURE_TTL.min(self.negative_ttl),
            Err(_) => self.negative_ttl,
        };
        let mut cache = self.cache.lock();
        if cache.len() >= self.capacity {
            cache.retain(|_, (_, until)| now < *until);
            if cache.len() >= self.capacity {
                cache.clear();
            }
        }
        cache.insert((crawler, ip), (outcome.clone(), Instant::now() + ttl));
        outcome
    }

    /// PTR of `ip`, then the forward lookup of each name under a suffix.
    async fn confirm(&self, suffixes: &[String], ip: IpAddr) -> Outcome {
        let ptr = match self.resolver.reverse_lookup(ip).await {
            Ok(l) => l,
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => return Err("no_ptr"),
            Err(e) => {
                tracing::debug!(%ip, error = %e, "crawler check: PTR lookup failed");
                return Err("dns");
            }
        };
        let names: Vec<_> = ptr
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::PTR(p) => Some(p.0.clone()),
                _ => None,
            })
            .take(MAX_NAMES)
            .collect();
        if names.is_empty() {
            return Err("no_ptr");
        }
        let mut outcome = Err("hostname");
        for name in names {
            let text = name.to_ascii().to_ascii_lowercase();
            let text = text.trim_end_matches('.');
            if !suffixes
                .iter()
                .any(|s| text.ends_with(s.as_str()) && text.len() > s.len())
            {
                continue;
            }
            let rtype = if ip.is_ipv4() {
                RecordType::A
            } else {
                RecordType::AAAA
            };
            let mut fqdn = name.clone();
            fqdn.set_fqdn(true);
            match self.resolver.lookup(fqdn, rtype).await {
                Ok(l) => {
                    let found = l.answers().iter().any(|r| match &r.data {
                        RData::A(a) => IpAddr::V4(a.0) == ip,
                        RData::AAAA(a) => IpAddr::V6(a.0) == ip,
                        _ => false,
                    });
                    if found {
                        return Ok(text.to_owned());
                    }
                    outcome = Err("forward");
                }
                Err(e) if e.is_no_records_found() || e.is_nx_domain() => outcome = Err("forward"),
                Err(e) => {
                    tracing::debug!(%ip, name = %text, error = %e, "crawler check: forward lookup failed");
                    return Err("dns");
                }
            }
        }
        outcome
    }
}
