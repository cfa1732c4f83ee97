//! The gateway's cookies: `sluice_q_{room}` (queue token) and
//! `sluice_a_{room}` (admission token). Always `HttpOnly`, `SameSite=Lax`,
//! `Path=/`, and `Secure` when the client reached the edge over TLS.

use http::{HeaderMap, HeaderValue, header};

use crate::client_ip::ClientInfo;
use crate::rooms::Room;

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
    let mut c = format!("{name}={value}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Lax");
    if secure {
        c.push_str("; Secure");
    }
    if let Ok(v) = HeaderValue::from_str(&c) {
        headers.append(header::SET_COOKIE, v);
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
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{name}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax"
    )) {
        headers.append(header::SET_COOKIE, v);
    }
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
    }
}
