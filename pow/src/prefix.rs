//! Network prefixes: the unit the difficulty policy and the rate limits
//! count by.
//!
//! One visitor rarely controls one address but often a whole block: a /24
//! of IPv4 or a /56 of IPv6 (a typical home or small-office delegation).
//! IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, as a dual-stack socket
//! reports them) count as the IPv4 address they carry.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A /24 IPv4 or /56 IPv6 network, holding only the prefix bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NetPrefix {
    /// The first three octets of an IPv4 address.
    V4([u8; 3]),
    /// The first seven bytes of an IPv6 address.
    V6([u8; 7]),
}

/// The network prefix `ip` belongs to: /24 for IPv4, /56 for IPv6.
pub fn network_prefix(ip: IpAddr) -> NetPrefix {
    let v4 = match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    match (v4, ip) {
        (Some(v4), _) => {
            let [a, b, c, _] = v4.octets();
            NetPrefix::V4([a, b, c])
        }
        (None, IpAddr::V6(v6)) => {
            let o = v6.octets();
            NetPrefix::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6]])
        }
        // A V4 address always took the first arm.
        (None, IpAddr::V4(_)) => NetPrefix::V4([0; 3]),
    }
}

impl NetPrefix {
    /// The network's first address.
    pub fn network(&self) -> IpAddr {
        match *self {
            NetPrefix::V4([a, b, c]) => IpAddr::V4(Ipv4Addr::new(a, b, c, 0)),
            NetPrefix::V6(p) => {
                let mut o = [0u8; 16];
                o[..7].copy_from_slice(&p);
                IpAddr::V6(Ipv6Addr::from(o))
            }
        }
    }

    /// Prefix length in bits: 24 or 56.
    pub fn prefix_len(&self) -> u8 {
        match self {
            NetPrefix::V4(_) => 24,
            NetPrefix::V6(_) => 56,
        }
    }
}

impl From<IpAddr> for NetPrefix {
    fn from(ip: IpAddr) -> Self {
        network_prefix(ip)
    }
}

impl fmt::Display for NetPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix_len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn p(s: &str) -> NetPrefix {
        network_prefix(s.parse().unwrap())
    }

    #[test]
    fn v4() {
        assert_eq!(p("203.0.113.77").to_string(), "203.0.113.0/24");
        assert_eq!(p("203.0.113.1"), p("203.0.113.254"));
        assert_ne!(p("203.0.113.1"), p("203.0.114.1"));
    }

    #[test]
    fn v6() {
        assert_eq!(p("2001:db8:1:2ff:1::1").to_string(), "2001:db8:1:200::/56");
        assert_eq!(p("2001:db8:1:2ff::1"), p("2001:db8:1:200::9"));
        assert_ne!(p("2001:db8:1:2ff::1"), p("2001:db8:1:300::1"));
    }

    #[test]
    fn mapped_v4_is_v4() {
        assert_eq!(p("::ffff:203.0.113.9"), p("203.0.113.200"));
    }
}
