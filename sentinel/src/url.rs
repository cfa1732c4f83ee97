//! [`RedisUrl`]: the one parser of the store URL, shared by every store and
//! by `sluice check-config`.
//!
//! Three schemes, each parsed whole before anything connects, so that a
//! URL `serve` would refuse is refused by `check-config` with the same
//! words:
//!
//! - `redis://[user:password@]host[:port][/db]` — one server, read by the
//!   redis client itself (its own words when it refuses).
//! - `redis+cluster://host:port[,host:port…]` — Redis Cluster seed nodes
//!   (any one answering is enough to learn the topology). A trailing `/`
//!   is allowed; a path, a database, a password or an empty entry is not.
//! - `redis+sentinel://host:port[,host:port…]/service` — the sentinels and
//!   the name of the monitored primary (`sentinel monitor <service> …`).
//!   Database 0, no passwords.
//!
//! Each has its TLS spelling, one more `s` after `redis`: `rediss://`,
//! `rediss+cluster://`, `rediss+sentinel://`. TLS is all or nothing: every
//! seed node, every node the cluster names, every sentinel and the primary
//! and replicas they name are spoken to over TLS, verified with the same
//! [`crate::RedisTls`] (the system roots unless a CA file is given). A node
//! is verified against the name it is reached by: the host written in the
//! URL for a seed node or a sentinel, the address the cluster or the
//! sentinels announce for the others (an IP address unless they are told
//! to announce host names), so the servers' certificates must name it.
//!
//! What this parser does not understand it refuses, rather than guessing.

use std::fmt;

/// `redis+cluster://`.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";
/// `redis+sentinel://`.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";
/// `rediss+cluster://`: Redis Cluster over TLS.
pub const TLS_CLUSTER_SCHEME: &str = "rediss+cluster://";
/// `rediss+sentinel://`: Redis Sentinel (sentinels and nodes) over TLS.
pub const TLS_SENTINEL_SCHEME: &str = "rediss+sentinel://";

/// Why a store URL is refused. The `Display` is a few words, meant to
/// follow the field name in a one-line configuration error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// The URL starts with none of the schemes above.
    #[error("must start with redis://, redis+cluster:// or redis+sentinel:// (rediss… for TLS)")]
    Scheme,
    /// A cluster node or a sentinel is not `host:port` (no host, no port,
    /// a port that is not a number up to 65535, an empty list entry).
    #[error("{role} `{given}` needs host:port")]
    HostPort {
        /// `cluster node` or `sentinel`.
        role: Role,
        /// The entry as written.
        given: String,
    },
    /// A password (`user:password@`) in a node list: neither list takes one.
    #[error("{0} passwords are not supported")]
    Password(Role),
    /// A cluster URL with something after the nodes (a database: a cluster
    /// only has database 0).
    #[error("nothing may follow the cluster nodes (a cluster has database 0 only)")]
    ClusterPath,
    /// A sentinel URL without `/service`.
    #[error("needs the service name after the sentinels: redis+sentinel://host:port/name")]
    NoService,
    /// A sentinel URL whose service is empty or has a `/` in it (a
    /// database number, say).
    #[error("needs one service name after the sentinels")]
    Service,
    /// The redis client refused a `redis://` or `rediss://` URL (a bad
    /// port or database, TLS in a build without it); its words.
    #[error("{0}")]
    Client(String),
}

/// Which list a [`UrlError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A `redis+cluster://` seed node.
    ClusterNode,
    /// A `redis+sentinel://` sentinel.
    Sentinel,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::ClusterNode => "cluster node",
            Role::Sentinel => "sentinel",
        })
    }
}

impl From<UrlError> for redis::RedisError {
    fn from(e: UrlError) -> Self {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "redis URL",
            e.to_string(),
        ))
    }
}

/// A parsed store URL (module docs); [`RedisUrl::connect`] opens it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisUrl {
    /// One server: the `redis://` URL as given, which the redis client
    /// has already accepted.
    Single(String),
    /// Redis Cluster: the seed nodes, as `redis://host:port` (or
    /// `rediss://host:port`).
    Cluster(Vec<String>),
    /// The primary Redis Sentinel names.
    Sentinel(SentinelUrl),
}

/// A parsed `redis+sentinel://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels, as `redis://host:port` URLs (`rediss://` over TLS).
    pub sentinels: Vec<String>,
    /// The primary's service name.
    pub service: String,
}

impl RedisUrl {
    /// Parses a store URL (module docs); the error says what is wrong, in
    /// a few words.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        for (prefix, node) in [(CLUSTER_SCHEME, "redis"), (TLS_CLUSTER_SCHEME, "rediss")] {
            if let Some(rest) = url.strip_prefix(prefix) {
                return cluster(rest, node);
            }
        }
        for (prefix, node) in [(SENTINEL_SCHEME, "redis"), (TLS_SENTINEL_SCHEME, "rediss")] {
            if let Some(rest) = url.strip_prefix(prefix) {
                return sentinel(rest, node);
            }
        }
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            redis::Client::open(url).map_err(|e| UrlError::Client(e.to_string()))?;
            return Ok(RedisUrl::Single(url.to_owned()));
        }
        Err(UrlError::Scheme)
    }

    /// Whether the connection is over TLS (a `rediss…` scheme).
    pub fn is_tls(&self) -> bool {
        match self {
            RedisUrl::Single(url) => url.starts_with("rediss://"),
            RedisUrl::Cluster(nodes) => nodes.iter().all(|n| n.starts_with("rediss://")),
            RedisUrl::Sentinel(s) => s.is_tls(),
        }
    }
}

impl SentinelUrl {
    /// Whether the sentinels and the nodes they name are spoken to over TLS.
    pub fn is_tls(&self) -> bool {
        self.sentinels.iter().all(|n| n.starts_with("rediss://"))
    }
}

/// The rest of a cluster URL after its scheme; `node` is the nodes' scheme.
fn cluster(rest: &str, node: &str) -> Result<RedisUrl, UrlError> {
    let nodes = rest.trim_end_matches('/');
    if nodes.contains('/') {
        return Err(UrlError::ClusterPath);
    }
    host_ports(nodes, Role::ClusterNode, node).map(RedisUrl::Cluster)
}

/// The rest of a sentinel URL after its scheme; `node` is the sentinels'
/// scheme.
fn sentinel(rest: &str, node: &str) -> Result<RedisUrl, UrlError> {
    let (hosts, service) = rest.split_once('/').ok_or(UrlError::NoService)?;
    let service = service.trim_end_matches('/');
    if service.is_empty() || service.contains('/') {
        return Err(UrlError::Service);
    }
    Ok(RedisUrl::Sentinel(SentinelUrl {
        sentinels: host_ports(hosts, Role::Sentinel, node)?,
        service: service.to_owned(),
    }))
}

/// `host:port[,host:port…]` as `SCHEME://host:port` URLs, each one also
/// accepted by the redis client.
fn host_ports(list: &str, role: Role, scheme: &str) -> Result<Vec<String>, UrlError> {
    if list.contains('@') {
        return Err(UrlError::Password(role));
    }
    list.split(',')
        .map(|entry| {
            let bad = || UrlError::HostPort {
                role,
                given: entry.to_owned(),
            };
            let (host, port) = entry.rsplit_once(':').ok_or_else(bad)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad());
            }
            let url = format!("{scheme}://{entry}");
            redis::Client::open(url.as_str()).map_err(|_| bad())?;
            Ok(url)
        })
        .collect()
}

impl std::str::FromStr for RedisUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        RedisUrl::parse(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{RedisUrl, Role, SentinelUrl, UrlError};

    fn nodes(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| format!("redis://{n}")).collect()
    }

    #[test]
    fn good_urls() {
        let sentinel = |list: &[&str], service: &str| {
            RedisUrl::Sentinel(SentinelUrl {
                sentinels: nodes(list),
                service: service.into(),
            })
        };
        for (url, want) in [
            (
                "redis://127.0.0.1:6379/",
                RedisUrl::Single("redis://127.0.0.1:6379/".into()),
            ),
            ("redis://h", RedisUrl::Single("redis://h".into())),
            (
                "redis://:pw@10.0.0.1:6380/2",
                RedisUrl::Single("redis://:pw@10.0.0.1:6380/2".into()),
            ),
            (
                "redis+cluster://a:7000,b:7001",
                RedisUrl::Cluster(nodes(&["a:7000", "b:7001"])),
            ),
            // trailing slashes were trimmed by every old parser
            (
                "redis+cluster://a:7000//",
                RedisUrl::Cluster(nodes(&["a:7000"])),
            ),
            (
                "redis+cluster://[::1]:7000",
                RedisUrl::Cluster(nodes(&["[::1]:7000"])),
            ),
            (
                "redis+sentinel://10.0.0.1:26379,s2:26380/shop",
                sentinel(&["10.0.0.1:26379", "s2:26380"], "shop"),
            ),
            ("redis+sentinel://h:1/shop/", sentinel(&["h:1"], "shop")),
            (
                "rediss://cache.example:6380/1",
                RedisUrl::Single("rediss://cache.example:6380/1".into()),
            ),
            (
                "rediss+cluster://a:7000,b:7001",
                RedisUrl::Cluster(vec!["rediss://a:7000".into(), "rediss://b:7001".into()]),
            ),
            (
                "rediss+sentinel://s1:26379/shop",
                RedisUrl::Sentinel(SentinelUrl {
                    sentinels: vec!["rediss://s1:26379".into()],
                    service: "shop".into(),
                }),
            ),
        ] {
            assert_eq!(RedisUrl::parse(url).unwrap(), want, "{url}");
        }
    }

    #[test]
    fn bad_urls() {
        let host_port = |role, given: &str| UrlError::HostPort {
            role,
            given: given.into(),
        };
        let node = |given| host_port(Role::ClusterNode, given);
        let sentinel = |given| host_port(Role::Sentinel, given);
        for (url, want) in [
            ("mysql://nope", UrlError::Scheme),
            ("sentinel://h:1/shop", UrlError::Scheme),
            ("", UrlError::Scheme),
            // The old parsers disagreed on the cluster rows: the
            // reservation store dropped empty entries (`redis+cluster://`
            // failed only at connect, `a:1,,b:2` was two nodes), the
            // admission store and the gateway's replay guard made
            // `redis://` of them; none required a port (6379 was
            // assumed) and none refused a database or a password, which
            // the cluster client then used or ignored per node. None of
            // them was checked by check-config.
            ("redis+cluster://", node("")),
            ("redis+cluster://a:1,,b:2", node("")),
            ("redis+cluster://a:1,", node("")),
            ("redis+cluster://a", node("a")),
            ("redis+cluster://:7000", node(":7000")),
            ("redis+cluster://a:port", node("a:port")),
            ("redis+cluster://a:70000", node("a:70000")),
            ("redis+cluster://a:7000/0", UrlError::ClusterPath),
            ("rediss+cluster://a", node("a")),
            ("rediss+cluster://a:7000/0", UrlError::ClusterPath),
            ("rediss+sentinel://h:1", UrlError::NoService),
            ("rediss+sentinel://h/shop", sentinel("h")),
            ("redisss://h:1", UrlError::Scheme),
            (
                "redis+cluster://:pw@a:7000",
                UrlError::Password(Role::ClusterNode),
            ),
            ("redis+sentinel://h:1", UrlError::NoService),
            ("redis+sentinel://h:1/", UrlError::Service),
            ("redis+sentinel://h:1/shop/0", UrlError::Service),
            ("redis+sentinel://h/shop", sentinel("h")),
            ("redis+sentinel://h:x/shop", sentinel("h:x")),
            ("redis+sentinel://:1/shop", sentinel(":1")),
            ("redis+sentinel://h:1,/shop", sentinel("")),
            (
                "redis+sentinel://u:p@h:1/shop",
                UrlError::Password(Role::Sentinel),
            ),
        ] {
            assert_eq!(RedisUrl::parse(url).unwrap_err(), want, "{url}");
        }
    }

    /// One server: the redis client's own rules, its own words.
    #[test]
    fn single_server_urls_are_the_clients() {
        for url in [
            "redis://127.0.0.1:99999/",
            "redis://127.0.0.1:6379/notadb",
            "rediss://127.0.0.1:99999/",
        ] {
            assert!(
                matches!(RedisUrl::parse(url), Err(UrlError::Client(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn tls_is_the_scheme() {
        for (url, tls) in [
            ("redis://h:1", false),
            ("rediss://h:1", true),
            ("redis+cluster://a:1,b:2", false),
            ("rediss+cluster://a:1,b:2", true),
            ("redis+sentinel://s:1/shop", false),
            ("rediss+sentinel://s:1/shop", true),
        ] {
            assert_eq!(RedisUrl::parse(url).unwrap().is_tls(), tls, "{url}");
        }
    }

    #[test]
    fn errors_read_as_one_short_line() {
        let e = RedisUrl::parse("redis+cluster://a:1,b").unwrap_err();
        assert_eq!(e.to_string(), "cluster node `b` needs host:port");
        let e = RedisUrl::parse("redis+sentinel://u:p@h:1/shop").unwrap_err();
        assert_eq!(e.to_string(), "sentinel passwords are not supported");
    }
}
