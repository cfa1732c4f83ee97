//! Hop-by-hop headers (RFC 9110 §7.6.1) and the gateway's own `Sluice-*`
//! namespace: what neither direction passes on. Shared by the proxy's two
//! paths and the HTTP/1.1 codec toward the origin.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one hop, never the message (RFC 9110 §7.6.1),
/// besides every `Proxy-*` header.
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
    strip_headers(headers, false);
}

/// Removes every `Sluice-*` header (a client may not speak for the gateway).
pub fn strip_sluice(headers: &mut HeaderMap) {
    strip(headers, |name| name.starts_with("sluice-"));
}

/// [`strip_hop_by_hop`], and with `sluice` [`strip_sluice`] too, in one
/// look at each name: the usual message has none of them and costs no more
/// than that look.
pub(crate) fn strip_headers(headers: &mut HeaderMap, sluice: bool) {
    strip(headers, |name| {
        is_hop_by_hop(name)
            || (sluice && name.as_bytes().first() == Some(&b's') && name.starts_with("sluice-"))
    });
}

/// Removes each header whose (lowercase) name `doomed` picks, and, when
/// `Connection` is among them, every header that `Connection` names.
fn strip(headers: &mut HeaderMap, doomed: impl Fn(&str) -> bool) {
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
