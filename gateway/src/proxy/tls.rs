//! TLS to an `https://` origin: the client configuration (which roots are
//! trusted, ALPN), the handshake, and what a failed handshake is called.
//!
//! - **Trust**: the system's roots (`rustls-native-certs`), or, when
//!   `proxy.origin_ca` is set, that PEM bundle only. With
//!   `proxy.insecure_skip_verify` the certificate is not checked at all
//!   (signatures of the handshake still are): an explicit choice, warned
//!   about at startup.
//! - **SNI** is the origin URL's host, unless it is an IP address (rustls
//!   then sends none and checks the certificate's IP address names).
//! - **ALPN** offers `h2` and `http/1.1`; the origin's pick is used. A
//!   WebSocket handshake takes a connection that offers `http/1.1` only.
//! - **Failures** are named by a stable key (the kind of fault, without the
//!   times or names a message carries), and [`CauseLog`] logs each cause
//!   once: the first failure, then again only when the cause changes, or
//!   when the same cause goes on after [`QUIET`] since it was last logged
//!   (with the count of failures not logged in between).
//!
//! Our own connector (not hyper-rustls): the pool is the gateway's own
//! ([`crate::proxy::upstream`]), and a TCP failure must stay apart from a
//! TLS one (502 `origin_unreachable` and 502 `origin_tls_failed`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// How long the same handshake failure goes unlogged after it was logged.
pub const QUIET: Duration = Duration::from_secs(300);

/// How an `https://` origin is reached: its name and the two connectors
/// (ALPN `h2` + `http/1.1`, and `http/1.1` alone for upgrades).
pub struct OriginTls {
    name: ServerName<'static>,
    any: TlsConnector,
    h1_only: TlsConnector,
}

/// A handshake that failed: a stable key of its cause and the full text.
#[derive(Debug)]
pub struct TlsFailure {
    /// The kind of fault (for counting and logging once), e.g.
    /// `certificate expired`.
    pub cause: String,
    /// What rustls or the socket said.
    pub detail: String,
}

impl OriginTls {
    /// The TLS side of a connection to `host`, trusting `ca` (a PEM
    /// bundle) or, without one, the system's roots; with `insecure` no
    /// certificate is checked.
    pub fn new(host: &str, ca: Option<&Path>, insecure: bool) -> anyhow::Result<OriginTls> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| anyhow::anyhow!("origin host {host:?} is no TLS server name: {e}"))?;
        let base = client_config(ca, insecure)?;
        let mut any = base.clone();
        any.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let mut h1_only = base;
        h1_only.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(OriginTls {
            name,
            any: TlsConnector::from(Arc::new(any)),
            h1_only: TlsConnector::from(Arc::new(h1_only)),
        })
    }

    /// The handshake on `tcp`, within `limit`; `h1_only` offers
    /// `http/1.1` alone.
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        h1_only: bool,
        limit: Duration,
    ) -> Result<TlsStream<TcpStream>, TlsFailure> {
        let connector = if h1_only { &self.h1_only } else { &self.any };
        match tokio::time::timeout(limit, connector.connect(self.name.clone(), tcp)).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(TlsFailure {
                cause: "handshake timed out".into(),
                detail: format!("no TLS handshake within {limit:?}"),
            }),
        }
    }
}

/// Whether the origin picked HTTP/2.
pub fn is_h2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// The crypto provider: ring, whatever else the build links.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client configuration (no ALPN yet).
fn client_config(ca: Option<&Path>, insecure: bool) -> anyhow::Result<ClientConfig> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    if insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth());
    }
    let roots = match ca {
        Some(path) => load_ca_bundle(path).map_err(|e| anyhow::anyhow!("proxy.origin_ca: {e}"))?,
        None => system_roots(),
    };
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// The certificates of a PEM bundle, refused when it cannot be read, holds
/// something that is not PEM, or holds no usable certificate.
pub fn load_ca_bundle(path: &Path) -> Result<RootCertStore, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut roots = RootCertStore::empty();
    for (i, cert) in CertificateDer::pem_slice_iter(&bytes).enumerate() {
        let cert = cert.map_err(|e| format!("{}: not a PEM bundle: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: certificate {}: {e}", path.display(), i + 1))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(roots)
}

/// The system's trusted roots; a loud warning when none load (every
/// handshake will then fail `unknown issuer`).
pub(crate) fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "reading the system's trusted roots");
    }
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            ignored,
            "no system root certificate loaded: every https origin will fail verification; \
             install the system's CA certificates or set proxy.origin_ca / --origin-ca"
        );
    } else {
        tracing::debug!(added, ignored, "system roots loaded for the https origin");
    }
    roots
}

/// What a failed handshake is called: a key naming the kind of fault, the
/// same for every failure of that kind.
fn classify(e: &std::io::Error) -> TlsFailure {
    let detail = e.to_string();
    let cause = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => certificate_cause(c),
        Some(rustls::Error::InvalidMessage(_)) => {
            "protocol error (the origin does not speak TLS here?)".into()
        }
        Some(rustls::Error::AlertReceived(a)) => format!("alert from the origin: {a:?}"),
        Some(rustls::Error::NoApplicationProtocol) => "no common ALPN protocol".into(),
        Some(rustls::Error::PeerIncompatible(_)) => "the origin's TLS is incompatible".into(),
        Some(rustls::Error::PeerMisbehaved(_)) => "the origin misbehaved in the handshake".into(),
        Some(other) => variant_name(&format!("{other:?}")),
        None => format!("connection failed during the handshake ({:?})", e.kind()),
    };
    TlsFailure { cause, detail }
}

/// The cause of a certificate refused.
fn certificate_cause(c: &rustls::CertificateError) -> String {
    use rustls::CertificateError as C;
    match c {
        C::Expired | C::ExpiredContext { .. } => "certificate expired".into(),
        C::NotValidYet | C::NotValidYetContext { .. } => "certificate not valid yet".into(),
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            "certificate not valid for the origin's host name".into()
        }
        C::UnknownIssuer => "certificate from an unknown issuer (not a trusted CA)".into(),
        C::BadSignature => "certificate with a bad signature".into(),
        other => format!(
            "certificate refused: {}",
            variant_name(&format!("{other:?}"))
        ),
    }
}

/// `Name { .. }` or `Name(..)` → `Name`: a variant without its details.
fn variant_name(debug: &str) -> String {
    debug
        .split(['(', '{', ' '])
        .next()
        .unwrap_or(debug)
        .to_owned()
}

/// Logs each cause of handshake failure once (see the module doc).
#[derive(Default)]
pub struct CauseLog {
    last: Mutex<Option<Logged>>,
}

struct Logged {
    cause: String,
    at: Instant,
    /// Failures of this cause since it was last logged.
    unlogged: u64,
}

impl CauseLog {
    /// Notes a failure; logs it (WARN) when its cause is new, or when the
    /// same cause was last logged [`QUIET`] ago.
    pub fn failed(&self, origin: &str, f: &TlsFailure) {
        let now = Instant::now();
        let unlogged = {
            let mut last = self.last.lock();
            match last.as_mut() {
                Some(l) if l.cause == f.cause && now.duration_since(l.at) < QUIET => {
                    l.unlogged += 1;
                    return;
                }
                Some(l) if l.cause == f.cause => {
                    let n = l.unlogged;
                    l.unlogged = 0;
                    l.at = now;
                    n
                }
                _ => {
                    *last = Some(Logged {
                        cause: f.cause.clone(),
                        at: now,
                        unlogged: 0,
                    });
                    0
                }
            }
        };
        tracing::warn!(
            code = "origin_tls_failed",
            origin,
            cause = %f.cause,
            detail = %f.detail,
            unlogged_since_last = unlogged,
            "TLS handshake with the origin failed (answered 502; logged once per cause, again after {}s if it goes on)",
            QUIET.as_secs()
        );
    }
}

/// The verifier of `proxy.insecure_skip_verify`: any certificate, for any
/// name, is taken; the handshake's signatures are still checked.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn variant_names_drop_their_details() {
        assert_eq!(variant_name("ExpiredContext { time: 1 }"), "ExpiredContext");
        assert_eq!(variant_name("General(\"x\")"), "General");
        assert_eq!(variant_name("HandshakeNotComplete"), "HandshakeNotComplete");
    }

    #[test]
    fn a_bundle_that_is_missing_empty_or_garbage_is_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        assert!(
            load_ca_bundle(&missing)
                .unwrap_err()
                .contains("cannot read")
        );
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "hello, not a certificate\n").unwrap();
        assert!(
            load_ca_bundle(&garbage)
                .unwrap_err()
                .contains("no PEM certificate")
        );
        let bad = dir.join("bad.pem");
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(load_ca_bundle(&bad).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_ip_origin_is_a_server_name_too() {
        assert!(OriginTls::new("127.0.0.1", None, true).is_ok());
        assert!(OriginTls::new("[::1]", None, true).is_ok());
        assert!(OriginTls::new("shop.example", None, true).is_ok());
    }
}
