//! Hop-by-hop headers (RFC 9110 §7.6.1): what describes one connection and
//! never the message, so no hop passes it on. Shared by the origin-side
//! codec ([`crate::h1`], which keeps none of them in a response head) and
//! the gateway's proxy (which adds its own `Sluice-*` namespace on top with
//! [`strip_where`]).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one hop, never the message (RFC 9110 §7.6.1),
/// besides every `Proxy-*` header.
#[inline]
pub fn is_hop_by_hop(name: &str) -> bool {
    // By first letter first: most names are none of these, and say so at
    // their first byte or their length.
    match name.as_bytes().first() {
        Some(b'c') => name == "connection",
        Some(b'k') => name == "keep-alive",
        Some(b't') => matches!(name, "te" | "trailer" | "transfer-encoding"),
        Some(b'u') => name == "upgrade",
        Some(b'p') => name.starts_with("proxy-"),
        // h2c's upgrade settings (RFC 9113 §3.2 of 7540): one connection's
        Some(b'h') => name == "http2-settings",
        _ => false,
    }
}

/// Removes `Connection`, every header it names, the fixed hop-by-hop set and
/// every `Proxy-*` header.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_where(headers, is_hop_by_hop);
}

/// Removes each header whose (lowercase) name `doomed` picks, and, when
/// `Connection` is among them, every header that `Connection` names. The
/// usual message has none of them and costs one look at each name.
pub fn strip_where(headers: &mut HeaderMap, doomed: impl Fn(&str) -> bool) {
    let mut gone: Vec<HeaderName> = Vec::new();
    for name in headers.keys() {
        if doomed(name.as_str()) {
            gone.push(name.clone());
        }
    }
    if gone.is_empty() {
        return;
    }
    // `Connection: keep-alive` (or `upgrade`) alone, the usual value, names
    // no header that is not going already.
    let plain = |v: &HeaderValue| {
        let v = v.as_bytes();
        v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"upgrade")
    };
    if gone.contains(&header::CONNECTION) && !headers.get_all(header::CONNECTION).iter().all(plain)
    {
        // The names `Connection` lists, but for the hop-by-hop ones already
        // going (`keep-alive` and `upgrade` are the usual ones; `close`
        // names a header too, if one came with that name).
        gone.extend(
            headers
                .get_all(header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|t| {
                    !t.eq_ignore_ascii_case("keep-alive") && !t.eq_ignore_ascii_case("upgrade")
                })
                .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
                .filter(|name| !doomed(name.as_str())),
        );
    }
    for name in gone {
        headers.remove(name);
    }
}
