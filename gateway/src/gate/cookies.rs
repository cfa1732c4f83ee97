//! The gateway's cookies: `sluice_q_{room}` (queue token) and
//! `sluice_a_{room}` (admission token). Always `HttpOnly`, `SameSite=Lax`,
//! `Path=/`, and `Secure` when the client reached the edge over TLS.
//!
//! `Set-Cookie` values are written by the `cookie` crate. Reading stays a
//! few lines of our own: one pass over the `Cookie` header on every guarded
//! request, borrowing, where the first non-empty value of the name wins.

use cookie::{Cookie, SameSite};
use http::{HeaderMap, HeaderValue, header};

use crate::edge::client_ip::ClientInfo;
use crate::gate::rooms::Room;

/// The queue-token cookie of a room.
pub fn queue_name(room: &str) -> String {
    format!("sluice_q_{room}")
}

/// The admission-token cookie of a room.
pub fn admit_name(room: &str) -> String {
    format!("sluice_a_{room}")
}

/// The value of cookie `name`, if sent.
pub fn token(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then(|| v.trim_matches('"').to_owned())
        })
        .find(|v| !v.is_empty())
}

/// A bearer token from `Authorization`, if sent.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

/// Adds a `Set-Cookie` for `name=value`.
pub fn set(headers: &mut HeaderMap, name: &str, value: &str, max_age_s: u64, secure: bool) {
    let max_age = cookie::time::Duration::seconds(i64::try_from(max_age_s).unwrap_or(i64::MAX));
    append(
        headers,
        Cookie::build((name, value))
            .path("/")
            .max_age(max_age)
            .http_only(true)
            .same_site(SameSite::Lax)
            .secure(secure),
    );
}

/// Appends `cookie` as a `Set-Cookie` field, and keeps the answer out of
/// shared caches.
fn append<'c>(headers: &mut HeaderMap, cookie: impl Into<Cookie<'c>>) {
    let cookie: Cookie<'c> = cookie.into();
    if let Ok(v) = HeaderValue::from_str(&cookie.to_string()) {
        headers.append(header::SET_COOKIE, v);
    }
    never_shared(headers);
}

/// Makes a response that sets one of the gateway's cookies unstorable by a
/// shared cache (RFC 9111 §5.2.2.7): `public` and `s-maxage` go, `private`
/// is added (the browser may still cache it for itself), and `Vary:
/// Cookie`, so a CDN in front never hands one visitor's admission to the
/// next (an origin's `Cache-Control: public` on an asset would otherwise
/// carry the visitor's cookie into the cache with it).
pub fn never_shared(headers: &mut HeaderMap) {
    let kept: Vec<String> = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|d| {
            let name = d.split('=').next().unwrap_or("").trim();
            !d.is_empty()
                && !name.eq_ignore_ascii_case("public")
                && !name.eq_ignore_ascii_case("s-maxage")
                && !name.eq_ignore_ascii_case("private")
        })
        .map(str::to_owned)
        .collect();
    let value = std::iter::once("private".to_owned())
        .chain(kept)
        .collect::<Vec<_>>()
        .join(", ");
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(header::CACHE_CONTROL, v);
    }
    let varies_on_cookie = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("cookie") || t.trim() == "*");
    if !varies_on_cookie {
        headers.append(header::VARY, HeaderValue::from_static("Cookie"));
    }
}

/// Sets a room's admission cookie, living as long as its sessions.
pub fn set_admission(headers: &mut HeaderMap, room: &Room, token: &str, client: &ClientInfo) {
    set(
        headers,
        &admit_name(room.id()),
        token,
        room.settings().session_ttl.as_secs(),
        client.proto == "https",
    );
}

/// Sets a room's queue cookie, living as long as a place in line.
pub fn set_queue(headers: &mut HeaderMap, room: &Room, token: &str, client: &ClientInfo) {
    set(
        headers,
        &queue_name(room.id()),
        token,
        room.config.queue_token_ttl.as_secs(),
        client.proto == "https",
    );
}

/// Adds a `Set-Cookie` that deletes `name`.
pub fn clear(headers: &mut HeaderMap, name: &str) {
    append(
        headers,
        Cookie::build((name, ""))
            .path("/")
            .max_age(cookie::time::Duration::ZERO)
            .http_only(true)
            .same_site(SameSite::Lax),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_and_writes() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; sluice_q_default=tok; b=2".parse().unwrap(),
        );
        assert_eq!(token(&h, "sluice_q_default").as_deref(), Some("tok"));
        assert_eq!(token(&h, "sluice_q_other"), None);
        let mut out = HeaderMap::new();
        set(&mut out, "sluice_a_x", "v", 60, true);
        let c = out[header::SET_COOKIE].to_str().unwrap();
        for flag in ["HttpOnly", "SameSite=Lax", "Path=/", "Secure", "Max-Age=60"] {
            assert!(c.contains(flag), "{c}");
        }
        assert_eq!(out[header::CACHE_CONTROL], "private");
        assert_eq!(out[header::VARY], "Cookie");
    }

    #[test]
    fn a_cookie_makes_any_cache_policy_private() {
        for (given, want) in [
            ("public, max-age=600", "private, max-age=600"),
            ("public,s-maxage=60,max-age=10", "private, max-age=10"),
            ("no-store", "private, no-store"),
            ("PUBLIC, immutable", "private, immutable"),
            ("private", "private"),
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::CACHE_CONTROL, given.parse().unwrap());
            h.insert(header::VARY, "Accept-Encoding".parse().unwrap());
            set(&mut h, "sluice_a_x", "v", 60, false);
            assert_eq!(h[header::CACHE_CONTROL], want, "{given}");
            let vary: Vec<_> = h.get_all(header::VARY).iter().collect();
            assert_eq!(vary, ["Accept-Encoding", "Cookie"]);
        }
    }
}
