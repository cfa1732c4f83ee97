//! Forward-auth: `GET /_sluice/auth`, the sub-request of a proxy that
//! stands in front of the origin instead of sluice (nginx `auth_request`,
//! Envoy `ext_authz` over HTTP, Traefik `forwardAuth`).
//!
//! The sub-request describes the visitor's request: its target in
//! `X-Original-URI` (nginx) or `X-Forwarded-Uri` (Envoy, Traefik), its
//! method in `X-Original-Method` or `X-Forwarded-Method`, its host in
//! `X-Forwarded-Host` (else the sub-request's own `Host`); the visitor's
//! other headers (cookies, `Authorization`, `Accept`) come as sent. From
//! them the *original* request is rebuilt, put in the canonical form the
//! edge gives every request ([`crate::edge::server`]; a target that cannot be
//! normalised is 400 `malformed_request`), and handed to the same
//! [`super::authorize`] as the in-path gate: one code path, the same rooms,
//! rules, canonical path and tokens. The client is the one the edge
//! resolved for the sub-request (the fronting proxy is the peer: when it is
//! a trusted proxy, its `X-Forwarded-For` names the visitor).
//!
//! Envoy's `ext_authz` (HTTP) sends the original method and target behind
//! its `path_prefix` instead: any method on `/_sluice/auth/{target}` is
//! that form, and there the describing headers are not read.
//!
//! Answers:
//! - may pass: 200, empty, with `Sluice-Admission` (the token the origin
//!   should see) and the `Set-Cookie` the in-path gate would have set (a
//!   passthrough's new admission, a renewed one), for the proxy to copy;
//!   a path no room guards, a bypass and the gateway's own paths: 200;
//! - may not: with `?mode=nginx`, 401 (`auth_request` understands only
//!   2xx, 401 and 403), and the proxy's `error_page 401` asks again without
//!   the mode to show the page; otherwise the gate's own answer (the
//!   waiting page for browsers, 503 `waiting_room_active` for other
//!   clients), never with a 2xx status, which Envoy and Traefik read as
//!   "pass": a page whose room says `waiting_status = 200` or 202 is a 503
//!   here.
//!
//! Not in this mode: the origin's `Sluice-Command: revoke` never reaches
//! sluice (the origin answers the proxy, not the sub-request), so a revoke
//! must go through the admin API; and no origin latency is observed for
//! adaptive admission.

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, header};

use crate::app::problem::Problem;
use crate::app::state::AppState;
use crate::edge::client_ip::ClientInfo;

use super::Admission;

/// The headers that describe the original request; none of them is part of
/// it.
const DESCRIBING: [&str; 6] = [
    "x-original-uri",
    "x-original-method",
    "x-forwarded-uri",
    "x-forwarded-method",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// `GET /_sluice/auth`, and Envoy's form of it: any method on
/// `/_sluice/auth/{original path}` (ext_authz over HTTP sends the original
/// method and target behind its `path_prefix`).
pub(crate) async fn forward_auth(State(state): State<AppState>, req: Request) -> Response {
    let suffixed = envoy_target(&req).is_some();
    let nginx = if suffixed {
        false
    } else {
        match mode(req.uri().query()) {
            Ok(nginx) => nginx,
            Err(p) => return p.into_response(),
        }
    };
    let original = match original_request(&state, &req) {
        Ok(r) => r,
        Err(p) => return p.into_response(),
    };
    let Some(original) = original else {
        // The gateway's own paths are no room's.
        return StatusCode::OK.into_response();
    };
    match super::authorize(&state, original).await {
        Ok(mut passed) => {
            let (Some(admission), Some(client)) = (
                passed.extensions_mut().remove::<Admission>(),
                passed.extensions().get::<ClientInfo>(),
            ) else {
                return Problem::internal()
                    .log_cause(&"forward-auth: an admission without its client")
                    .into_response();
            };
            let mut res = StatusCode::OK.into_response();
            // `Sluice-Admission` (or a verified crawler's `Sluice-Crawler`)
            // for the proxy in front to copy to the origin.
            if let Some((name, value)) = admission.origin_header() {
                res.headers_mut().insert(name, value);
            }
            super::admission_cookies(&admission, client, res.headers_mut());
            res
        }
        Err(res) if nginx => {
            // nginx's auth_request takes 2xx, 401 and 403 only; its
            // `error_page 401` asks again, without the mode, for the page.
            let mut out = Problem::new(
                StatusCode::UNAUTHORIZED,
                "waiting_room_active",
                "A waiting room is active: ask again without mode=nginx for the page",
            )
            .into_response();
            // Cookies the gate cleared (a revoked session's) stay said.
            for v in res.headers().get_all(header::SET_COOKIE) {
                out.headers_mut().append(header::SET_COOKIE, v.clone());
            }
            out
        }
        Err(mut res) => {
            // A 2xx lets the request by, for Envoy and Traefik: a waiting
            // page served with a 2xx `waiting_status` is a 503 here.
            if res.status().is_success() {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            res
        }
    }
}

/// Envoy's form: the original target (path and query) behind
/// `/_sluice/auth`, or `None` for `GET /_sluice/auth` itself.
fn envoy_target(req: &Request) -> Option<String> {
    let rest = req.uri().path().strip_prefix("/_sluice/auth")?;
    if !rest.starts_with('/') {
        return None;
    }
    Some(match req.uri().query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_owned(),
    })
}

/// `?mode=nginx` or no mode; anything else is malformed.
fn mode(query: Option<&str>) -> Result<bool, Problem> {
    let mut nginx = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("mode", "nginx")) => nginx = true,
            Some(("mode", _)) => return Err(Problem::malformed("mode: only `nginx` is known")),
            None if pair == "mode" => {
                return Err(Problem::malformed("mode: only `nginx` is known"));
            }
            _ => {}
        }
    }
    Ok(nginx)
}

/// One value of a header sent at most once; two values are malformed.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, Problem> {
    let mut all = headers.get_all(name).iter();
    let Some(first) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(Problem::malformed(format!("{name}: sent more than once")));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| Problem::malformed(format!("{name}: not ASCII")))
}

/// The request the proxy asks about, in its canonical form with the
/// client's info in its extensions; `None` for the gateway's own paths.
fn original_request(state: &AppState, req: &Request) -> Result<Option<Request>, Problem> {
    let headers = req.headers();
    let Some(client) = req.extensions().get::<ClientInfo>().cloned() else {
        return Err(Problem::internal().log_cause(&"forward-auth without client info"));
    };
    // Envoy's form says the target and method itself; no header of the
    // client's may describe them (nor the host: its own Host is Envoy's).
    let envoy = envoy_target(req);
    let from_headers = envoy.is_none();
    let described = |name: &'static str| {
        if from_headers {
            single(headers, name)
        } else {
            Ok(None)
        }
    };
    let target = match (&envoy, described("x-original-uri")?) {
        (Some(t), _) => t.as_str(),
        (None, Some(t)) => t,
        (None, None) => described("x-forwarded-uri")?.ok_or_else(|| {
            Problem::malformed("the original request: no X-Original-URI or X-Forwarded-Uri")
        })?,
    };
    if !target.starts_with('/') {
        return Err(Problem::malformed(
            "the original request: its target is not in origin form",
        ));
    }
    let uri = http::Uri::try_from(target)
        .map_err(|_| Problem::malformed("the original request: its target cannot be read"))?;
    let method = match described("x-original-method")? {
        Some(m) => Some(m),
        None => described("x-forwarded-method")?,
    };
    let method = match method {
        None if envoy.is_some() => req.method().clone(),
        None => Method::GET,
        Some(m) => Method::from_bytes(m.trim().as_bytes())
            .map_err(|_| Problem::malformed("the original request: its method"))?,
    };
    if method == Method::CONNECT {
        return Err(Problem::malformed(
            "the original request: CONNECT is not forwarded",
        ));
    }
    let mut out_headers = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !DESCRIBING.contains(&name.as_str()) && name != header::HOST {
            out_headers.append(name.clone(), value.clone());
        }
    }
    let host = match described("x-forwarded-host")? {
        Some(h) => Some(h),
        None => single(headers, header::HOST.as_str())?,
    };
    if let Some(h) = host {
        let v = http::HeaderValue::from_str(h.trim())
            .map_err(|_| Problem::malformed("the original request: its host"))?;
        out_headers.insert(header::HOST, v);
    }
    let mut original = http::Request::new(axum::body::Body::empty());
    *original.method_mut() = method;
    *original.uri_mut() = uri;
    *original.headers_mut() = out_headers;
    // `X-Forwarded-Proto` was read with the client (from a trusted peer
    // only), as for any request.
    crate::edge::server::canonicalise(state, &mut original, &client)?;
    let path = original.uri().path();
    if path == "/_sluice" || path.starts_with("/_sluice/") || path == "/metrics" {
        return Ok(None);
    }
    original.extensions_mut().insert(client);
    Ok(Some(original))
}

/// Whether a header name is one of those describing the original request
/// (for tests).
#[cfg(test)]
fn describes(name: &http::HeaderName) -> bool {
    DESCRIBING.contains(&name.as_str())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn modes() {
        assert!(!mode(None).unwrap());
        assert!(!mode(Some("x=1")).unwrap());
        assert!(mode(Some("mode=nginx")).unwrap());
        assert!(mode(Some("a=b&mode=nginx")).unwrap());
        assert!(mode(Some("mode=envoy")).is_err());
        assert!(mode(Some("mode")).is_err());
        assert!(!mode(Some("modes=1")).unwrap());
    }

    #[test]
    fn single_refuses_two_values() {
        let mut h = HeaderMap::new();
        assert!(single(&h, "x-original-uri").unwrap().is_none());
        h.append("x-original-uri", "/a".parse().unwrap());
        assert_eq!(single(&h, "x-original-uri").unwrap(), Some("/a"));
        h.append("x-original-uri", "/b".parse().unwrap());
        assert!(single(&h, "x-original-uri").is_err());
        assert!(describes(&http::HeaderName::from_static(
            "x-forwarded-host"
        )));
        assert!(!describes(&header::COOKIE));
    }
}
