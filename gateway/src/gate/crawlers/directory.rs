//! The signers' key directories: each allow-listed `signature_agent`'s
//! `/.well-known/http-message-signatures-directory` (a JWKS of Ed25519
//! keys), fetched over HTTPS and cached.
//!
//! Only the configured signers' directories are ever fetched: a
//! `Signature-Agent` naming anything else is unverified without a request
//! leaving the gateway, so a client cannot make the gateway fetch a URL of
//! its choosing.
//!
//! Caching (the protocol draft's "Cache Behaviour" and "Discovery
//! Failure"):
//! - each directory is fetched when the gateway starts, then again after
//!   `crawlers.directory_ttl` (or a shorter `Cache-Control: max-age`,
//!   at least a minute), in the background: a request is answered with
//!   the keys at hand meanwhile;
//! - a request waits for a fetch only when its directory has no keys yet,
//!   for at most `crawlers.directory_timeout`, and concurrent requests
//!   share that one fetch;
//! - a failed fetch (refused connection, TLS, a status other than 200, a
//!   redirect, which is never followed, a body past 64 KiB or not a
//!   directory) keeps the keys fetched before: an outage of the signer is
//!   no revocation. With none, the signer's requests are unverified, and
//!   the next try waits `crawlers.directory_retry`;
//! - a fetch that succeeds replaces the keys whole: a key removed from the
//!   directory stops verifying;
//! - a `keyid` the cached keys lack asks for an early refetch (a rotated
//!   key), at most once per `crawlers.directory_retry`.
//!
//! A key is taken when it is `kty: OKP`, `crv: Ed25519`, with a 32-byte
//! `x`; its id is its JWK SHA-256 thumbprint (RFC 7638, RFC 8037 §A.3),
//! and a `kid` that differs from it drops the key (the draft requires
//! them equal). `nbf` and `exp`, when present, bound when it verifies.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use parking_lot::Mutex;
use rustls_pki_types::ServerName;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::CrawlersConfig;

/// The well-known path of a signer's key directory.
pub const WELL_KNOWN: &str = "/.well-known/http-message-signatures-directory";

/// Largest directory body read.
pub const MAX_BODY: usize = 64 * 1024;

/// Most keys taken from one directory.
pub const MAX_KEYS: usize = 64;

/// Shortest cache lifetime a `Cache-Control: max-age` can ask for.
const MIN_TTL: Duration = Duration::from_secs(60);

/// One verification key of a directory.
#[derive(Clone, Debug)]
pub struct DirectoryKey {
    /// The Ed25519 public key.
    pub key: ed25519_dalek::VerifyingKey,
    /// Not before (seconds since the epoch).
    pub nbf: Option<i64>,
    /// Not after.
    pub exp: Option<i64>,
}

/// The keys of a directory by thumbprint.
pub type Keys = HashMap<String, DirectoryKey>;

/// The JWK SHA-256 thumbprint of an Ed25519 public key (RFC 7638 over the
/// members `crv`, `kty`, `x` in that order, RFC 8037 §A.3), base64url.
pub fn thumbprint(x: &[u8; 32]) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let json = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, b64.encode(x));
    b64.encode(Sha256::digest(json.as_bytes()))
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<serde_json::Value>,
}

/// The usable keys of a directory body; `Err` when it is not a JWKS.
pub fn parse_directory(body: &[u8]) -> Result<Keys, String> {
    let jwks: Jwks =
        serde_json::from_slice(body).map_err(|e| format!("not a key directory: {e}"))?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut keys = Keys::new();
    for jwk in jwks.keys.iter().take(MAX_KEYS) {
        let field = |k: &str| jwk.get(k).and_then(|v| v.as_str());
        if field("kty") != Some("OKP") || field("crv") != Some("Ed25519") {
            continue;
        }
        let Some(x) = field("x")
            .and_then(|x| b64.decode(x).ok())
            .and_then(|x| <[u8; 32]>::try_from(x).ok())
        else {
            continue;
        };
        let Ok(key) = ed25519_dalek::VerifyingKey::from_bytes(&x) else {
            continue;
        };
        let id = thumbprint(&x);
        if field("kid").is_some_and(|kid| kid != id) {
            continue;
        }
        let time = |k: &str| jwk.get(k).and_then(|v| v.as_i64());
        keys.insert(
            id,
            DirectoryKey {
                key,
                nbf: time("nbf"),
                exp: time("exp"),
            },
        );
    }
    Ok(keys)
}

/// What a lookup of a key found.
#[derive(Debug)]
pub enum Lookup {
    /// The key.
    Found(ed25519_dalek::VerifyingKey),
    /// The directory has no such key (or not now: `nbf`/`exp`).
    Unknown,
    /// The directory could not be had (never fetched, or every fetch
    /// failed).
    Unavailable,
}

/// The cached state of one directory.
#[derive(Default)]
struct State {
    keys: Option<Arc<Keys>>,
    /// Until then the keys are fresh.
    fresh_until: Option<Instant>,
    /// No fetch before then (after a failure, or an early refetch).
    next_try: Option<Instant>,
}

/// One signer's directory and its cache.
pub struct Directory {
    /// The signer's origin (`https://host[:port]`).
    pub origin: String,
    host: String,
    port: u16,
    state: Mutex<State>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
    /// A background refresh is under way.
    refreshing: AtomicBool,
}

/// The directories of the configured signers, and how they are fetched.
pub struct Directories {
    by_origin: HashMap<String, Arc<Directory>>,
    tls: tokio_rustls::TlsConnector,
    timeout: Duration,
    ttl: Duration,
    retry: Duration,
}

impl Directories {
    /// The directories of `origins` (normalized `https://host[:port]`).
    pub fn new(config: &CrawlersConfig, origins: &[String]) -> anyhow::Result<Arc<Directories>> {
        let roots = match &config.directory_ca {
            Some(path) => crate::proxy::tls::load_ca_bundle(path)
                .map_err(|e| anyhow::anyhow!("crawlers.directory_ca: {e}"))?,
            None if origins.is_empty() => rustls::RootCertStore::empty(),
            None => crate::proxy::tls::system_roots(),
        };
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut by_origin = HashMap::new();
        for origin in origins {
            let uri: http::Uri = origin.parse()?;
            let host = uri
                .host()
                .ok_or_else(|| anyhow::anyhow!("{origin}: no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            by_origin.insert(
                origin.clone(),
                Arc::new(Directory {
                    origin: origin.clone(),
                    host,
                    port: uri.port_u16().unwrap_or(443),
                    state: Mutex::new(State::default()),
                    fetching: tokio::sync::Mutex::new(()),
                    refreshing: AtomicBool::new(false),
                }),
            );
        }
        Ok(Arc::new(Directories {
            by_origin,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            timeout: config.directory_timeout,
            ttl: config.directory_ttl,
            retry: config.directory_retry,
        }))
    }

    /// Fetches every directory once, in the background (at start).
    pub fn warm(self: &Arc<Self>) {
        for dir in self.by_origin.values() {
            self.spawn_refresh(dir);
        }
    }

    /// The key `keyid` of the signer at `origin`, valid at `now_s`:
    /// from the cache, or, when the directory has no keys yet, after a
    /// fetch (shared, at most `directory_timeout`).
    pub async fn key(self: &Arc<Self>, origin: &str, keyid: &str, now_s: i64) -> Lookup {
        let Some(dir) = self.by_origin.get(origin) else {
            return Lookup::Unavailable;
        };
        let now = Instant::now();
        let (keys, stale, may_try) = {
            let st = dir.state.lock();
            (
                st.keys.clone(),
                st.fresh_until.is_none_or(|t| now >= t),
                st.next_try.is_none_or(|t| now >= t),
            )
        };
        let keys = match keys {
            Some(keys) => {
                if stale && may_try {
                    self.spawn_refresh(dir);
                }
                keys
            }
            None if !may_try => return Lookup::Unavailable,
            None => match self.fetch_now(dir).await {
                Some(keys) => keys,
                None => return Lookup::Unavailable,
            },
        };
        match keys.get(keyid) {
            Some(k) if k.nbf.is_none_or(|t| t <= now_s) && k.exp.is_none_or(|t| now_s < t) => {
                Lookup::Found(k.key)
            }
            Some(_) => Lookup::Unknown,
            None => {
                // perhaps a key rotated in since the last fetch
                if may_try {
                    dir.state.lock().next_try = Some(now + self.retry);
                    self.spawn_refresh(dir);
                }
                Lookup::Unknown
            }
        }
    }

    /// How many keys each directory holds now (`None`: none fetched).
    pub fn status(&self) -> Vec<(String, Option<usize>)> {
        let mut out: Vec<_> = self
            .by_origin
            .values()
            .map(|d| {
                (
                    d.origin.clone(),
                    d.state.lock().keys.as_ref().map(|k| k.len()),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// A fetch in the request path: shared with any under way, bounded.
    async fn fetch_now(&self, dir: &Arc<Directory>) -> Option<Arc<Keys>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let _one = tokio::time::timeout_at(deadline, dir.fetching.lock())
            .await
            .ok()?;
        {
            let st = dir.state.lock();
            if st.keys.is_some() {
                return st.keys.clone();
            }
            if st.next_try.is_some_and(|t| Instant::now() < t) {
                return None;
            }
        }
        self.refresh_locked(dir).await;
        dir.state.lock().keys.clone()
    }

    /// Refreshes `dir` in the background, unless a refresh is under way.
    fn spawn_refresh(self: &Arc<Self>, dir: &Arc<Directory>) {
        if dir.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (this, dir) = (self.clone(), dir.clone());
        tokio::spawn(async move {
            {
                let _one = dir.fetching.lock().await;
                this.refresh_locked(&dir).await;
            }
            dir.refreshing.store(false, Ordering::Release);
        });
    }

    /// One fetch of `dir` (its fetch lock held), its outcome cached.
    async fn refresh_locked(&self, dir: &Directory) {
        let result = tokio::time::timeout(self.timeout, self.fetch(dir))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.timeout)));
        let now = Instant::now();
        let mut st = dir.state.lock();
        match result {
            Ok((keys, max_age)) => {
                let ttl = max_age.map_or(self.ttl, |m| m.clamp(MIN_TTL, self.ttl));
                tracing::debug!(signer = %dir.origin, keys = keys.len(), "key directory fetched");
                st.keys = Some(Arc::new(keys));
                st.fresh_until = Some(now + ttl);
                st.next_try = Some(now + ttl.min(self.retry));
            }
            Err(e) => {
                tracing::warn!(signer = %dir.origin, error = %e, kept = st.keys.is_some(), "key directory fetch failed");
                st.next_try = Some(now + self.retry);
            }
        }
    }

    /// `GET /.well-known/http-message-signatures-directory` at the signer,
    /// over TLS, HTTP/1.1, one connection; the keys and the answer's
    /// `max-age`.
    async fn fetch(&self, dir: &Directory) -> Result<(Keys, Option<Duration>), String> {
        let tcp = tokio::net::TcpStream::connect((dir.host.as_str(), dir.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from(dir.host.clone()).map_err(|e| format!("host: {e}"))?;
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| format!("HTTP: {e}"))?;
        let conn = tokio::spawn(conn);
        let authority = match dir.port {
            443 => dir.host.clone(),
            p if dir.host.contains(':') => format!("[{}]:{p}", dir.host),
            p => format!("{}:{p}", dir.host),
        };
        let req = http::Request::get(WELL_KNOWN)
            .header(http::header::HOST, authority)
            .header(
                http::header::ACCEPT,
                "application/http-message-signatures-directory+json",
            )
            .header(http::header::USER_AGENT, "sluice (key directory)")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let res = sender
            .send_request(req)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let result = async {
            if res.status() != http::StatusCode::OK {
                return Err(format!(
                    "answered {} (redirects are not followed)",
                    res.status()
                ));
            }
            let ctype = res
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            if !matches!(
                ctype.as_str(),
                "application/http-message-signatures-directory+json" | "application/json"
            ) {
                return Err(format!("content type `{ctype}` is not a key directory"));
            }
            let max_age = max_age(res.headers());
            let body = Limited::new(res.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            Ok((parse_directory(&body)?, max_age))
        }
        .await;
        conn.abort();
        result
    }
}

/// The `max-age` of a `Cache-Control` (`no-store`/`no-cache`: zero).
fn max_age(headers: &http::HeaderMap) -> Option<Duration> {
    let cc = headers.get(http::header::CACHE_CONTROL)?.to_str().ok()?;
    let mut out = None;
    for part in cc.split(',').map(str::trim) {
        let lower = part.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(v) = lower.strip_prefix("max-age=") {
            out = v.trim_matches('"').parse().ok().map(Duration::from_secs);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn x(b64: &str) -> [u8; 32] {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(b64)
            .unwrap()
            .try_into()
            .unwrap()
    }

    /// RFC 8037 §A.3's thumbprint, and the Web Bot Auth draft's keyid of
    /// RFC 9421's test key.
    #[test]
    fn thumbprints_match_the_rfcs() {
        assert_eq!(
            thumbprint(&x("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
        assert_eq!(
            thumbprint(&x("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs")),
            "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"
        );
    }

    #[test]
    fn a_directory_keeps_only_usable_ed25519_keys() {
        let body = br#"{"keys":[
            {"kty":"OKP","crv":"Ed25519","kid":"poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U","x":"JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs","use":"sig","nbf":1712793600,"exp":1715385600},
            {"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"OKP","crv":"Ed25519","kid":"other","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"OKP","crv":"X25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"RSA","n":"AQAB","e":"AQAB"},
            {"kty":"OKP","crv":"Ed25519","x":"short"}
        ]}"#;
        let keys = parse_directory(body).unwrap();
        assert_eq!(keys.len(), 2);
        let k = &keys["poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"];
        assert_eq!((k.nbf, k.exp), (Some(1_712_793_600), Some(1_715_385_600)));
        assert!(keys.contains_key("kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"));
        assert!(parse_directory(b"<html>").is_err());
        assert!(parse_directory(b"{\"keys\":{}}").is_err());
    }

    #[test]
    fn max_age_is_read() {
        let mut h = http::HeaderMap::new();
        assert_eq!(max_age(&h), None);
        h.insert(
            http::header::CACHE_CONTROL,
            http::HeaderValue::from_static("public, Max-Age=600"),
        );
        assert_eq!(max_age(&h), Some(Duration::from_secs(600)));
        h.insert(
            http::header::CACHE_CONTROL,
            http::HeaderValue::from_static("no-store"),
        );
        assert_eq!(max_age(&h), Some(Duration::ZERO));
    }
}
