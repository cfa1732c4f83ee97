//! Who is the downstream client? The TCP peer, unless the peer is one of the
//! configured trusted proxies (a load balancer in front of the gateway), in
//! which case its `X-Forwarded-For` chain is read from the right, skipping
//! trusted hops, and the first address that is not a trusted proxy is the
//! client. A client that is not a trusted proxy cannot choose its own
//! address by sending forwarding headers.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

/// The resolved downstream client of one request, stored in the request's
/// extensions by the server before any handler runs.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    /// The TCP peer.
    pub peer: SocketAddr,
    /// The client address (the peer, or read from a trusted proxy's headers).
    pub ip: IpAddr,
    /// Whether the peer is a trusted proxy (its forwarding headers were used).
    pub peer_trusted: bool,
    /// `http` or `https`: what the client used to reach the edge.
    pub proto: &'static str,
    /// The TCP peer's address as header text (the `X-Forwarded-For` of a
    /// peer that is not a trusted proxy), made once per connection by the
    /// server; `None`: the proxy writes it for each request.
    pub peer_text: Option<http::HeaderValue>,
}

impl ClientInfo {
    /// Resolves the client of a request from its peer and headers.
    pub fn resolve(peer: SocketAddr, headers: &HeaderMap, trusted: &[IpNet]) -> ClientInfo {
        let is_trusted = |ip: IpAddr| {
            let ip = canonical_ip(ip);
            trusted.iter().any(|n| n.contains(&ip))
        };
        let peer_ip = canonical_ip(peer.ip());
        if !is_trusted(peer_ip) {
            return ClientInfo {
                peer,
                ip: peer_ip,
                peer_trusted: false,
                proto: "http",
                peer_text: None,
            };
        }
        let mut ip = peer_ip;
        let chain: Vec<IpAddr> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|s| parse_forwarded_ip(s.trim()))
            .collect();
        for hop in chain.iter().rev() {
            ip = canonical_ip(*hop);
            if !is_trusted(ip) {
                break;
            }
        }
        let proto = match headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_ascii_lowercase())
            .as_deref()
        {
            Some("https") => "https",
            _ => "http",
        };
        ClientInfo {
            peer,
            ip,
            peer_trusted: true,
            proto,
            peer_text: None,
        }
    }
}

/// Parses one `X-Forwarded-For` element: a bare address, `[v6]` or
/// `[v6]:port` or `v4:port`.
fn parse_forwarded_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    s.strip_prefix('[')
        .and_then(|r| r.split(']').next())
        .and_then(|v| v.parse().ok())
}

/// Maps an IPv4-mapped IPv6 address to its IPv4 form.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// The queue store's name for a bucket of client network `prefix` (`kind`
/// what it counts, `scope` e.g. a room): a digest, so the name is a valid
/// store key whatever the scope's length, and the store keeps no client
/// address.
pub fn network_bucket(kind: &str, scope: &str, prefix: sluice_pow::NetPrefix) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{scope}\n{prefix}"));
    format!(
        "{kind}.{}",
        sluice_admission::prequeue::to_hex(&digest[..16])
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn headers(xff: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", xff.parse().unwrap());
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        h
    }

    #[test]
    fn untrusted_peer_cannot_spoof() {
        let peer: SocketAddr = "198.51.100.7:5000".parse().unwrap();
        let c = ClientInfo::resolve(peer, &headers("1.2.3.4"), &[]);
        assert_eq!(c.ip, peer.ip());
        assert_eq!(c.proto, "http");
        assert!(!c.peer_trusted);
    }

    #[test]
    fn trusted_chain_is_read_from_the_right() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let peer: SocketAddr = "10.0.0.2:5000".parse().unwrap();
        // the client forged 6.6.6.6; the LB appended the real 203.0.113.9,
        // then an internal hop 10.0.0.9.
        let c = ClientInfo::resolve(peer, &headers("6.6.6.6, 203.0.113.9, 10.0.0.9"), &trusted);
        assert_eq!(c.ip, "203.0.113.9".parse::<IpAddr>().unwrap());
        assert_eq!(c.proto, "https");
        let c = ClientInfo::resolve(peer, &headers("[2001:db8::1]:443"), &trusted);
        assert_eq!(c.ip, "2001:db8::1".parse::<IpAddr>().unwrap());
        let c = ClientInfo::resolve(peer, &headers("garbage"), &trusted);
        assert_eq!(c.ip, peer.ip());
    }
}
