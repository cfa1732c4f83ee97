//! The gateway's cookies: `sluice_q_{room}` (queue token) and
//! `sluice_a_{room}` (admission token). Always `HttpOnly`, `SameSite=Lax`,
//! `Path=/`, no `Domain`.
//!
//! Over https (TLS at the edge, or a trusted proxy saying
//! `X-Forwarded-Proto: https`) they are `Secure` and named with the
//! `__Host-` prefix (`__Host-sluice_q_{room}`), which a browser keeps only
//! from a secure origin, for this host alone: a sibling subdomain or a
//! plain-HTTP page cannot plant or overwrite one. Reading over https
//! prefers the `__Host-` name and falls back to the plain one, so turning
//! TLS on mid-sale costs nobody their place; over plain HTTP only the plain
//! name is read (a `__Host-` cookie is never sent there anyway). Clearing
//! clears both names.
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

/// The `__Host-`-prefixed name of cookie `name`.
fn host_only(name: &str) -> String {
    format!("__Host-{name}")
}

/// The token of the gateway's cookie `name` (e.g. [`queue_name`]) for this
/// client: over https the `__Host-` name first, then the plain one; over
/// plain HTTP the plain one only.
pub fn read(headers: &HeaderMap, name: &str, client: &ClientInfo) -> Option<String> {
    if client.proto == "https"
        && let Some(t) = token(headers, &host_only(name))
    {
        return Some(t);
    }
    token(headers, name)
}

/// The token of room `room`'s admission cookie for this client, as
/// [`read`] with [`admit_name`], borrowed from the request and without
/// making the names (it is read on every guarded request).
pub fn read_admit<'h>(headers: &'h HeaderMap, room: &str, client: &ClientInfo) -> Option<&'h str> {
    let admit = |k: &str| k.strip_prefix("sluice_a_") == Some(room);
    if client.proto == "https"
        && let Some(t) = value_where(headers, |k| k.strip_prefix("__Host-").is_some_and(admit))
    {
        return Some(t);
    }
    value_where(headers, admit)
}

/// The value of cookie `name`, if sent.
pub fn token(headers: &HeaderMap, name: &str) -> Option<String> {
    value_where(headers, |k| k == name).map(str::to_owned)
}

/// The first non-empty value of a cookie whose name `named` says yes to,
/// borrowed from the `Cookie` fields.
fn value_where(headers: &HeaderMap, named: impl Fn(&str) -> bool) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            named(k).then(|| v.trim_matches('"'))
        })
        .find(|v| !v.is_empty())
}

/// A bearer token from `Authorization`, if sent.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    bearer_str(headers).map(str::to_owned)
}

/// [`bearer`], borrowed from the request.
pub fn bearer_str(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Adds a `Set-Cookie` for `name=value`; a `secure` one (https) is
/// `Secure` and named `__Host-{name}`.
pub fn set(headers: &mut HeaderMap, name: &str, value: &str, max_age_s: u64, secure: bool) {
    let max_age = cookie::time::Duration::seconds(i64::try_from(max_age_s).unwrap_or(i64::MAX));
    let name = if secure {
        host_only(name)
    } else {
        name.to_owned()
    };
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

/// Adds the `Set-Cookie`s that delete `name` under both its names: the
/// plain one, and the `__Host-` one (`Secure`, or a browser ignores it).
pub fn clear(headers: &mut HeaderMap, name: &str) {
    for (name, secure) in [(name.to_owned(), false), (host_only(name), true)] {
        append(
            headers,
            Cookie::build((name, ""))
                .path("/")
                .max_age(cookie::time::Duration::ZERO)
                .http_only(true)
                .same_site(SameSite::Lax)
                .secure(secure),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_admission_cookie_is_read_as_by_its_name() {
        let rooms = ["default", "x", "sluice_a_x", ""];
        let fields = [
            "sluice_a_default=A",
            "__Host-sluice_a_default=H; sluice_a_default=A",
            "sluice_a_default=; sluice_a_default=\"B\"",
            "sluice_a_defaultx=C; sluice_a_x=D",
            "__Host-sluice_a_x=E",
            "__host-sluice_a_x=F; Sluice_a_x=G",
            "sluice_a_sluice_a_x=I; sluice_a_=J",
            "a=1;  sluice_a_x = K ; __Host-sluice_a_default=L",
        ];
        for room in rooms {
            for field in fields {
                let mut h = HeaderMap::new();
                h.append(header::COOKIE, field.parse().unwrap());
                h.append(header::COOKIE, "sluice_a_x=second".parse().unwrap());
                for proto in ["http", "https"] {
                    let client = ClientInfo {
                        peer: "192.0.2.1:1".parse().unwrap(),
                        ip: "192.0.2.1".parse().unwrap(),
                        peer_trusted: false,
                        proto,
                        peer_text: None,
                    };
                    assert_eq!(
                        read_admit(&h, room, &client),
                        read(&h, &admit_name(room), &client).as_deref(),
                        "{room} {field} {proto}"
                    );
                }
            }
        }
    }

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
        assert!(c.starts_with("__Host-sluice_a_x=v;"), "{c}");
        for flag in ["HttpOnly", "SameSite=Lax", "Path=/", "Secure", "Max-Age=60"] {
            assert!(c.contains(flag), "{c}");
        }
        assert!(!c.contains("Domain"), "{c}");
        let mut plain = HeaderMap::new();
        set(&mut plain, "sluice_a_x", "v", 60, false);
        let c = plain[header::SET_COOKIE].to_str().unwrap();
        assert!(
            c.starts_with("sluice_a_x=v;") && !c.contains("Secure"),
            "{c}"
        );
        assert_eq!(out[header::CACHE_CONTROL], "private");
        assert_eq!(out[header::VARY], "Cookie");
    }

    fn client(proto: &'static str) -> ClientInfo {
        ClientInfo {
            peer: "127.0.0.1:1".parse().unwrap(),
            ip: "127.0.0.1".parse().unwrap(),
            peer_trusted: false,
            proto,
            peer_text: None,
        }
    }

    #[test]
    fn https_prefers_the_host_name_and_falls_back() {
        let (https, http) = (client("https"), client("http"));
        let mut both = HeaderMap::new();
        both.insert(
            header::COOKIE,
            "sluice_q_r=plain; __Host-sluice_q_r=host".parse().unwrap(),
        );
        assert_eq!(read(&both, "sluice_q_r", &https).as_deref(), Some("host"));
        assert_eq!(read(&both, "sluice_q_r", &http).as_deref(), Some("plain"));
        let mut old = HeaderMap::new();
        old.insert(header::COOKIE, "sluice_q_r=plain".parse().unwrap());
        assert_eq!(read(&old, "sluice_q_r", &https).as_deref(), Some("plain"));
        let mut host = HeaderMap::new();
        host.insert(header::COOKIE, "__Host-sluice_q_r=host".parse().unwrap());
        assert_eq!(read(&host, "sluice_q_r", &http), None);
    }

    #[test]
    fn clearing_clears_both_names() {
        let mut h = HeaderMap::new();
        clear(&mut h, "sluice_a_r");
        let set: Vec<_> = h
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(set.len(), 2, "{set:?}");
        assert!(set[0].starts_with("sluice_a_r=;") && set[0].contains("Max-Age=0"));
        assert!(set[1].starts_with("__Host-sluice_a_r=;") && set[1].contains("Secure"));
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
