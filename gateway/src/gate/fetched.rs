//! Key sets fetched over HTTPS and cached: the verified crawlers' signer
//! directories and a room's enqueue-token JWKS published by the origin.
//!
//! Own code, not an HTTP client crate: one GET over the gateway's own
//! hyper and rustls, with the caching policy below, is all either needs.
//!
//! Caching:
//! - a set is fetched when the gateway starts ([`Fetched::warm`]), then
//!   again after its `ttl` (or a shorter `Cache-Control: max-age`, at
//!   least a minute), in the background: a request is answered with the
//!   keys at hand meanwhile;
//! - a request waits for a fetch only when there are no keys yet, for at
//!   most `timeout`, and concurrent requests share that one fetch;
//! - a failed fetch (refused connection, TLS, a status other than 200, a
//!   redirect, which is never followed, a body past 64 KiB, another
//!   content type, or a body the parser refuses) keeps the keys fetched
//!   before: an outage of the publisher is no revocation. With none, the
//!   next try waits `retry`;
//! - a fetch that succeeds replaces the keys whole: a key removed from
//!   the set stops verifying;
//! - a key the cached set lacks may ask for an early refetch (a rotated
//!   key), at most once per `retry` ([`Fetched::refetch`]), so requests
//!   naming made-up keys cannot make the gateway fetch more often.
//!
//! Only URLs from the configuration are ever fetched.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use parking_lot::Mutex;
use rustls_pki_types::ServerName;

/// Largest body read.
pub const MAX_BODY: usize = 64 * 1024;

/// Shortest cache lifetime a `Cache-Control: max-age` can ask for.
const MIN_TTL: Duration = Duration::from_secs(60);

/// How the sets of one kind are fetched and kept.
pub struct Policy {
    tls: tokio_rustls::TlsConnector,
    /// Longest a fetch may take.
    pub timeout: Duration,
    /// How long a fetched set is fresh.
    pub ttl: Duration,
    /// How long after a failure (or an early refetch) before the next try.
    pub retry: Duration,
}

impl Policy {
    /// Trusts the certificates of `ca` (a PEM bundle), else the system's
    /// roots (none when `needs_roots` is false: nothing will be fetched).
    pub fn new(
        ca: Option<&Path>,
        needs_roots: bool,
        timeout: Duration,
        ttl: Duration,
        retry: Duration,
    ) -> anyhow::Result<Arc<Policy>> {
        let roots = match ca {
            Some(path) => crate::proxy::tls::load_ca_bundle(path).map_err(anyhow::Error::msg)?,
            None if !needs_roots => rustls::RootCertStore::empty(),
            None => crate::proxy::tls::system_roots(),
        };
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(Policy {
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            timeout,
            ttl,
            retry,
        }))
    }
}

/// What a set is and how its body reads.
pub struct Kind<K> {
    /// For logs: "key directory", "enqueue JWKS".
    pub name: &'static str,
    /// The `Accept` of the request.
    pub accept: &'static str,
    /// Media types taken (lower case, no parameters).
    pub content_types: &'static [&'static str],
    /// The body's keys, or why it is not a set.
    pub parse: fn(&[u8]) -> Result<K, String>,
}

/// The cached state of one set.
struct State<K> {
    keys: Option<Arc<K>>,
    /// Until then the keys are fresh.
    fresh_until: Option<Instant>,
    /// No fetch before then (after a failure, or an early refetch).
    next_try: Option<Instant>,
}

/// One key set at one HTTPS URL, and its cache.
pub struct Fetched<K> {
    /// The URL, for logs and status.
    pub url: String,
    host: String,
    port: u16,
    path: String,
    kind: Kind<K>,
    policy: Arc<Policy>,
    state: Mutex<State<K>>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
    /// A background refresh is under way.
    refreshing: AtomicBool,
    /// Fetches tried (for tests and the dashboard).
    fetches: std::sync::atomic::AtomicU64,
}

impl<K: Send + Sync + 'static> Fetched<K> {
    /// The set at `url` (`https://host[:port]/path`).
    pub fn new(url: &str, kind: Kind<K>, policy: Arc<Policy>) -> anyhow::Result<Arc<Self>> {
        let uri: http::Uri = url.parse()?;
        if uri.scheme_str() != Some("https") {
            anyhow::bail!("{url}: only https URLs are fetched");
        }
        let authority = uri
            .authority()
            .ok_or_else(|| anyhow::anyhow!("{url}: no host"))?;
        if authority.as_str().contains('@') {
            anyhow::bail!("{url}: user info is not allowed");
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Ok(Arc::new(Fetched {
            url: url.to_owned(),
            host,
            port: uri.port_u16().unwrap_or(443),
            path: uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            kind,
            policy,
            state: Mutex::new(State {
                keys: None,
                fresh_until: None,
                next_try: None,
            }),
            fetching: tokio::sync::Mutex::new(()),
            refreshing: AtomicBool::new(false),
            fetches: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// Fetches the set once, in the background (at start).
    pub fn warm(self: &Arc<Self>) {
        self.spawn_refresh();
    }

    /// The keys as last fetched, if any, without waiting.
    pub fn current(&self) -> Option<Arc<K>> {
        self.state.lock().keys.clone()
    }

    /// How many fetches were tried.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// The keys: from the cache (a stale set is refreshed in the
    /// background meanwhile), or, when none was ever fetched, after a
    /// fetch (shared, at most `timeout`); `None` when none can be had.
    pub async fn keys(self: &Arc<Self>) -> Option<Arc<K>> {
        let now = Instant::now();
        let (keys, stale, may_try) = {
            let st = self.state.lock();
            (
                st.keys.clone(),
                st.fresh_until.is_none_or(|t| now >= t),
                st.next_try.is_none_or(|t| now >= t),
            )
        };
        match keys {
            Some(keys) => {
                if stale && may_try {
                    self.spawn_refresh();
                }
                Some(keys)
            }
            None if !may_try => None,
            None => self.fetch_now(false).await,
        }
    }

    /// A key was not in the set: fetch it again early, at most once per
    /// `retry` (else `None` at once). `wait`: the caller waits for the
    /// fetch (shared, bounded) and gets the new set; otherwise it runs in
    /// the background and this answers `None`.
    pub async fn refetch(self: &Arc<Self>, wait: bool) -> Option<Arc<K>> {
        let now = Instant::now();
        {
            let mut st = self.state.lock();
            if st.next_try.is_some_and(|t| now < t) {
                return None;
            }
            st.next_try = Some(now + self.policy.retry);
        }
        if wait {
            self.fetch_now(true).await
        } else {
            self.spawn_refresh();
            None
        }
    }

    /// A fetch in the request path: shared with any under way, bounded.
    /// `again`: fetch even when keys are at hand (an early refetch).
    async fn fetch_now(self: &Arc<Self>, again: bool) -> Option<Arc<K>> {
        let deadline = tokio::time::Instant::now() + self.policy.timeout;
        let before = self.fetches();
        let _one = tokio::time::timeout_at(deadline, self.fetching.lock())
            .await
            .ok()?;
        {
            let st = self.state.lock();
            // a fetch that ran while this one waited for the lock will do
            if st.keys.is_some() && (!again || self.fetches() != before) {
                return st.keys.clone();
            }
            if !again && st.next_try.is_some_and(|t| Instant::now() < t) {
                return None;
            }
        }
        self.refresh_locked().await;
        self.state.lock().keys.clone()
    }

    /// Refreshes the set in the background, unless a refresh is under way.
    fn spawn_refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            {
                let _one = this.fetching.lock().await;
                this.refresh_locked().await;
            }
            this.refreshing.store(false, Ordering::Release);
        });
    }

    /// One fetch (the fetch lock held), its outcome cached.
    async fn refresh_locked(&self) {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let timeout = self.policy.timeout;
        let result = tokio::time::timeout(timeout, self.fetch())
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")));
        let now = Instant::now();
        let mut st = self.state.lock();
        match result {
            Ok((keys, max_age)) => {
                let ttl = max_age.map_or(self.policy.ttl, |m| m.clamp(MIN_TTL, self.policy.ttl));
                tracing::debug!(url = %self.url, kind = self.kind.name, "key set fetched");
                st.keys = Some(Arc::new(keys));
                st.fresh_until = Some(now + ttl);
                st.next_try = Some(now + ttl.min(self.policy.retry));
            }
            Err(e) => {
                tracing::warn!(url = %self.url, kind = self.kind.name, error = %e, kept = st.keys.is_some(), "key set fetch failed");
                st.next_try = Some(now + self.policy.retry);
            }
        }
    }

    /// `GET` the URL over TLS, HTTP/1.1, one connection: the keys and
    /// the answer's `max-age`.
    async fn fetch(&self) -> Result<(K, Option<Duration>), String> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from(self.host.clone()).map_err(|e| format!("host: {e}"))?;
        let tls = self
            .policy
            .tls
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| format!("HTTP: {e}"))?;
        let conn = tokio::spawn(conn);
        let authority = match self.port {
            443 => self.host.clone(),
            p if self.host.contains(':') => format!("[{}]:{p}", self.host),
            p => format!("{}:{p}", self.host),
        };
        let req = http::Request::get(self.path.as_str())
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, self.kind.accept)
            .header(
                http::header::USER_AGENT,
                format!("sluice ({})", self.kind.name),
            )
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
            if !self.kind.content_types.contains(&ctype.as_str()) {
                return Err(format!(
                    "content type `{ctype}` is not a {}",
                    self.kind.name
                ));
            }
            let max_age = max_age(res.headers());
            let body = Limited::new(res.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            Ok(((self.kind.parse)(&body)?, max_age))
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

    fn kind() -> Kind<usize> {
        Kind {
            name: "test set",
            accept: "application/json",
            content_types: &["application/json"],
            parse: |b| Ok(b.len()),
        }
    }

    #[tokio::test]
    async fn only_https_urls_without_user_info() {
        let policy = Policy::new(
            None,
            false,
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(Fetched::new("http://origin.example/jwks", kind(), policy.clone()).is_err());
        assert!(Fetched::new("https://u:p@origin.example/jwks", kind(), policy.clone()).is_err());
        let f = Fetched::new("https://origin.example:8443/k?v=1", kind(), policy).unwrap();
        assert_eq!((f.port, f.path.as_str()), (8443, "/k?v=1"));
    }

    /// An early refetch is allowed once per `retry`, whatever asks.
    #[tokio::test]
    async fn early_refetches_are_rationed() {
        let policy = Policy::new(
            None,
            false,
            Duration::from_millis(200),
            Duration::from_secs(60),
            Duration::from_secs(30),
        )
        .unwrap();
        // a closed port: every fetch fails fast
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let f = Fetched::new(&format!("https://127.0.0.1:{port}/k"), kind(), policy).unwrap();
        assert!(f.refetch(true).await.is_none());
        assert_eq!(f.fetches(), 1);
        for _ in 0..50 {
            assert!(f.refetch(true).await.is_none());
            assert!(f.keys().await.is_none());
        }
        assert_eq!(f.fetches(), 1, "made-up keys must not make it fetch again");
    }
}
