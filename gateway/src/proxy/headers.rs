//! What neither direction of the proxy passes on: the hop-by-hop headers
//! (RFC 9110 §7.6.1, kept in [`sluice_wire::headers`] with the wire code
//! that reads them) and the gateway's own `Sluice-*` namespace.

use http::header::HeaderMap;
pub use sluice_wire::headers::{is_hop_by_hop, strip_hop_by_hop};

/// Removes every `Sluice-*` header (a client may not speak for the gateway).
pub fn strip_sluice(headers: &mut HeaderMap) {
    sluice_wire::headers::strip_where(headers, |name| name.starts_with("sluice-"));
}

/// [`strip_hop_by_hop`], and with `sluice` [`strip_sluice`] too, in one
/// look at each name: the usual message has none of them and costs no more
/// than that look.
pub(crate) fn strip_headers(headers: &mut HeaderMap, sluice: bool) {
    sluice_wire::headers::strip_where(headers, |name| {
        is_hop_by_hop(name)
            || (sluice && name.as_bytes().first() == Some(&b's') && name.starts_with("sluice-"))
    });
}
