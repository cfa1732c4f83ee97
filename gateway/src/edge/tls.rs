//! TLS termination at the edge (`[server.tls]`): rustls with the `ring`
//! provider (nothing to build beyond the compiler, no OpenSSL).
//!
//! - Certificates come from PEM files: the default one (`cert`/`key`) and
//!   any `[[server.tls.sni]]` more. The client's SNI name picks the first
//!   certificate whose DNS names cover it (`*.example.com` covers exactly
//!   one label more); no name, or no match, gets the default.
//! - TLS 1.2 and 1.3 (or 1.3 only, `min_version = "1.3"`) with rustls's
//!   default suites (AEAD only, forward secrecy only); ALPN offers `h2` and
//!   `http/1.1`, and the protocol it settles decides which HTTP server the
//!   connection gets (the server's [`super::server`] path, one for both
//!   TLS and plain connections).
//! - Reload without a restart: the files' modification time and length
//!   are checked every `reload_check`, and SIGHUP reloads at once. The new
//!   set is swapped in whole (an [`ArcSwap`] the resolver reads per
//!   handshake); a set that fails to load (unreadable, bad PEM, a key that
//!   is not its certificate's) changes nothing, is logged at ERROR once and
//!   counted in `sluice_tls_reloads_total{result="failed"}`.
//!
//! - The plain listener beside it (`http_listen`) with `redirect_to_https`
//!   answers 308 to the same host and target over https ([`to_https`]),
//!   except the probes ([`stays_plain`]).
//!
//! Our own resolver rather than rustls's `ResolvesServerCertUsingSni`:
//! that one matches exact names only (no wildcard) and cannot be swapped
//! as a whole on reload.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;

use crate::app::telemetry::Telemetry;
use crate::config::ConfigError;
use crate::config::server::{MinVersion, TlsConfig};

/// The crypto provider every TLS configuration of the gateway is built
/// with: rustls's `ring` provider, made once.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Installs `ring` as the process's default rustls provider, so that any
/// TLS client built without naming one (a dependency's) finds it. Called
/// once by `sluice serve`; a second call changes nothing.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// One certificate with the DNS names it is valid for (lowercase).
#[derive(Debug)]
struct Named {
    names: Vec<String>,
    key: Arc<CertifiedKey>,
}

/// The certificates served: the default, then the SNI ones in order.
#[derive(Debug)]
pub struct Certs {
    default: Arc<CertifiedKey>,
    named: Vec<Named>,
}

impl Certs {
    /// The certificate for SNI name `name`: the first whose DNS names
    /// cover it, else the default.
    fn pick(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name.map(str::to_ascii_lowercase) else {
            return self.default.clone();
        };
        self.named
            .iter()
            .find(|n| n.names.iter().any(|p| covers(p, &name)))
            .map_or_else(|| self.default.clone(), |n| n.key.clone())
    }
}

/// Whether a certificate's DNS name `pattern` covers `name` (both
/// lowercase): equal, or `*.rest` against a name of one label more
/// ending in `.rest` (RFC 6125 §6.4.3, the wildcard a whole left label).
fn covers(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(rest) => name
            .split_once('.')
            .is_some_and(|(label, tail)| !label.is_empty() && tail == rest),
        None => pattern == name,
    }
}

/// Loads every certificate and key of the section, as the listener serves
/// them; an error names the setting at fault (`server.tls.cert`,
/// `server.tls.sni[1].key`…).
pub fn load_all(cfg: &TlsConfig) -> Result<Certs, ConfigError> {
    let (default, _) = load_pair(&cfg.cert, &cfg.key, "server.tls")?;
    let named = cfg
        .sni
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (key, names) = load_pair(&s.cert, &s.key, &format!("server.tls.sni[{i}]"))?;
            Ok(Named { names, key })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(Certs { default, named })
}

/// One certificate chain and its key, checked to belong together, with
/// the leaf's DNS names.
fn load_pair(
    cert: &Path,
    key: &Path,
    field: &str,
) -> Result<(Arc<CertifiedKey>, Vec<String>), ConfigError> {
    let cert_field = format!("{field}.cert");
    let key_field = format!("{field}.key");
    if cert.as_os_str().is_empty() {
        return Err(ConfigError::invalid(
            cert_field,
            "missing: a PEM certificate file",
        ));
    }
    if key.as_os_str().is_empty() {
        return Err(ConfigError::invalid(key_field, "missing: a PEM key file"));
    }
    let chain = read_chain(cert).map_err(|e| ConfigError::invalid(&cert_field, e))?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        ConfigError::invalid(&key_field, format!("{}: {}", key.display(), pem_error(&e)))
    })?;
    let names = dns_names(&chain[0])
        .map_err(|e| ConfigError::invalid(&cert_field, format!("{}: {e}", cert.display())))?;
    let certified = CertifiedKey::from_der(chain, private, &provider()).map_err(|e| {
        let why = match e {
            rustls::Error::InconsistentKeys(_) => "is not the key of the certificate".to_owned(),
            other => format!("cannot be used: {other}"),
        };
        ConfigError::invalid(&key_field, format!("{} {why}", key.display()))
    })?;
    Ok((Arc::new(certified), names))
}

/// The certificates of a PEM file, leaf first; at least one.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| format!("{}: {}", path.display(), pem_error(&e)))?;
    if chain.is_empty() {
        return Err(format!("{}: no CERTIFICATE in it", path.display()));
    }
    Ok(chain)
}

/// A PEM error in words (a missing file says so, not "I/O error").
fn pem_error(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match e {
        Error::Io(io) => io.to_string(),
        Error::NoItemsFound => "no PEM item of the expected kind in it".to_owned(),
        other => format!("not valid PEM ({other:?})"),
    }
}

/// The leaf's DNS names, lowercase, as rustls's own verifier reads them.
fn dns_names(leaf: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    let cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| format!("not an X.509 certificate ({e})"))?;
    Ok(cert
        .valid_dns_names()
        .map(str::to_ascii_lowercase)
        .collect())
}

/// Answers each handshake from the current [`Certs`].
#[derive(Debug)]
struct Resolver(ArcSwap<Certs>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load().pick(hello.server_name()))
    }
}

/// The protocol a TLS connection settled by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// `h2`.
    Http2,
    /// `http/1.1`, or no ALPN at all.
    Http1,
}

/// The HTTPS listener's TLS side: the acceptor, its swappable
/// certificates, and what reloading them needs.
pub struct Terminator {
    acceptor: tokio_rustls::TlsAcceptor,
    resolver: Arc<Resolver>,
    config: TlsConfig,
}

impl Terminator {
    /// Loads the certificates and builds the server configuration.
    pub fn new(cfg: &TlsConfig) -> Result<Terminator, ConfigError> {
        let resolver = Arc::new(Resolver(ArcSwap::from_pointee(load_all(cfg)?)));
        let versions: &[&'static rustls::SupportedProtocolVersion] = match cfg.min_version {
            MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            MinVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let mut server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(|e| ConfigError::invalid("server.tls.min_version", e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // Returning visitors resume instead of a full handshake: tickets
        // (TLS 1.2 and 1.3) and a bounded session cache.
        server.session_storage = rustls::server::ServerSessionMemoryCache::new(16 * 1024);
        if let Ok(ticketer) = rustls::crypto::ring::Ticketer::new() {
            server.ticketer = ticketer;
        }
        Ok(Terminator {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            resolver,
            config: cfg.clone(),
        })
    }

    /// The TLS handshake of one connection, within `limit`; `None` (logged
    /// at DEBUG and counted) when it fails or takes longer.
    pub async fn accept(
        &self,
        stream: TcpStream,
        limit: Duration,
        telemetry: &Telemetry,
        peer: std::net::SocketAddr,
    ) -> Option<(tokio_rustls::server::TlsStream<TcpStream>, Alpn)> {
        let failed = |why: &dyn std::fmt::Display| {
            telemetry.tls_handshake_failed();
            tracing::debug!(%peer, error = %why, "closed: TLS handshake failed");
        };
        let tls = match tokio::time::timeout(limit, self.acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                failed(&e);
                return None;
            }
            Err(_) => {
                failed(&"not finished within the header timeout");
                return None;
            }
        };
        let alpn = match tls.get_ref().1.alpn_protocol() {
            Some(b"h2") => Alpn::Http2,
            _ => Alpn::Http1,
        };
        Some((tls, alpn))
    }

    /// Loads the files again and swaps the new set in; on failure the
    /// served set stays.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let certs = load_all(&self.config)?;
        self.resolver.0.store(Arc::new(certs));
        Ok(())
    }

    /// Every file the certificates come from.
    fn files(&self) -> Vec<PathBuf> {
        let c = &self.config;
        [c.cert.clone(), c.key.clone()]
            .into_iter()
            .chain(c.sni.iter().flat_map(|s| [s.cert.clone(), s.key.clone()]))
            .collect()
    }
}

/// The paths the redirecting plain listener still serves: the health
/// probes and the metrics (a probe or a scraper speaks plain HTTP to a
/// pod's port).
pub fn stays_plain(path: &str) -> bool {
    matches!(
        path,
        "/_sluice/healthz" | "/_sluice/readyz" | "/_sluice/serving" | "/metrics"
    )
}

/// 308 to the request's URL over https on `port` (left out when 443): the
/// host from `Host` (its own port dropped), the target as canonicalised.
/// Without a `Host` there is nowhere to point: 400 `malformed_request`.
pub fn to_https<B>(req: &http::Request<B>, port: u16) -> http::Response<axum::body::Body> {
    use axum::response::IntoResponse;
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(crate::gate::host_name)
        .filter(|h| !h.is_empty());
    let Some(host) = host else {
        return crate::app::problem::Problem::malformed(
            "a Host header is needed to redirect to https",
        )
        .into_response();
    };
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let location = match port {
        443 => format!("https://{host}{target}"),
        p => format!("https://{host}:{p}{target}"),
    };
    let Ok(location) = http::HeaderValue::from_str(&location) else {
        return crate::app::problem::Problem::malformed("the target cannot be redirected")
            .into_response();
    };
    let mut res = http::Response::new(axum::body::Body::empty());
    *res.status_mut() = http::StatusCode::PERMANENT_REDIRECT;
    res.headers_mut().insert(http::header::LOCATION, location);
    res.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    res
}

/// What the files look like now: modification time and length of each
/// (`None` for one that cannot be read).
fn fingerprint(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// Reloads the certificates on SIGHUP and whenever the files change
/// (checked every `reload_check`), until dropped. A set of files that
/// fails is tried again at their next change (or SIGHUP), not at every
/// check: one ERROR line per failure.
pub async fn keep_fresh(tls: Arc<Terminator>, telemetry: Telemetry) {
    let files = tls.files();
    let mut seen = fingerprint(&files);
    let mut tick = tokio::time::interval(tls.config.reload_check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hup = hangups();
    loop {
        let why = tokio::select! {
            _ = tick.tick() => {
                let now = fingerprint(&files);
                if now == seen {
                    continue;
                }
                // A writer may be halfway (the certificate written, not
                // yet the key): let it settle before reading.
                tokio::time::sleep(Duration::from_millis(200)).await;
                seen = fingerprint(&files);
                "files changed"
            }
            Some(()) = next_hangup(&mut hup) => {
                seen = fingerprint(&files);
                "SIGHUP"
            }
        };
        reload_once(&tls, &telemetry, why);
    }
}

/// One reload, logged and counted.
fn reload_once(tls: &Terminator, telemetry: &Telemetry, why: &str) {
    match tls.reload() {
        Ok(()) => {
            telemetry.tls_reload(true);
            tracing::info!(reason = why, "TLS certificates reloaded");
        }
        Err(e) => {
            telemetry.tls_reload(false);
            tracing::error!(reason = why, error = %e, "TLS reload failed: still serving the previous certificates");
        }
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

#[cfg(unix)]
fn hangups() -> Hangups {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP handler: TLS reloads on file change only");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangups() -> Hangups {}

/// The next SIGHUP; never, without a handler.
#[cfg(unix)]
async fn next_hangup(h: &mut Hangups) -> Option<()> {
    match h {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn next_hangup(_: &mut Hangups) -> Option<()> {
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn wildcards_cover_one_label() {
        assert!(covers("a.test", "a.test"));
        assert!(!covers("a.test", "b.test"));
        assert!(covers("*.shop.test", "www.shop.test"));
        assert!(!covers("*.shop.test", "shop.test"));
        assert!(!covers("*.shop.test", "a.b.shop.test"));
        assert!(!covers("*.shop.test", ".shop.test"));
    }
}
