//! Certificates made in the test, and TLS clients that trust them.
//!
//! [`TestCa::new`] makes a CA (a fresh key, a temp directory); its
//! [`TestCa::leaf`] issues a server certificate for some names (DNS names,
//! or IP addresses, told apart by parsing), [`TestCa::expired_leaf`] one
//! that expired yesterday, [`TestCa::client_leaf`] a client certificate
//! (mutual TLS), and [`self_signed`] one no CA vouches for. Each is written
//! as PEM files (`cert`, `key`) into the CA's directory, for a server's
//! `--tls-cert`/`--tls-key`, nginx's `ssl_certificate` or
//! `redis-server --tls-cert-file`. [`TestCa::client_config`] is a rustls
//! client trusting the CA; [`TestCa::https_client`] a pooled HTTP client
//! over it.
//!
//! Everything uses rustls's `ring` provider, named explicitly: no process
//! default is needed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};

use crate::client::TestClient;

/// A test certificate authority, its files in a temp directory of its own.
pub struct TestCa {
    /// The directory every file of this CA (and its leaves) is written to.
    pub dir: PathBuf,
    /// The CA certificate, PEM (`--origin-ca`, `--cacert`, `-CAfile`).
    pub cert: PathBuf,
    /// The CA certificate, DER.
    pub der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    issued: AtomicU32,
}

/// A certificate and its key, as files and as PEM text.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The certificate (leaf only), PEM file.
    pub cert: PathBuf,
    /// Its private key (PKCS#8), PEM file.
    pub key: PathBuf,
    /// The certificate, PEM text.
    pub cert_pem: String,
    /// The key, PEM text.
    pub key_pem: String,
    /// The certificate, DER (to compare with what a server presented).
    pub der: CertificateDer<'static>,
}

/// The rustls crypto provider of the tests: `ring`.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A fresh temp directory.
fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-{what}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

impl Drop for TestCa {
    /// The CA's files and its leaves' go with it.
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// A new CA with a fresh key.
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let dir = temp_dir("ca");
        let path = dir.join("ca.pem");
        std::fs::write(&path, cert.pem()).expect("write CA");
        TestCa {
            dir,
            cert: path,
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            issued: AtomicU32::new(0),
        }
    }

    /// A server certificate for `names`, valid from yesterday for a week.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        let now = time_now();
        self.issue(
            names,
            now - days(1),
            now + days(7),
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )
    }

    /// A certificate for `names` usable as a server's and as a client's: a
    /// server that also connects to its peers with it (a Redis replica to
    /// its primary, a Cluster node on the bus).
    pub fn peer_leaf(&self, names: &[&str]) -> Leaf {
        let now = time_now();
        self.issue(
            names,
            now - days(1),
            now + days(7),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A server certificate for `names` that expired yesterday.
    pub fn expired_leaf(&self, names: &[&str]) -> Leaf {
        let now = time_now();
        self.issue(
            names,
            now - days(30),
            now - days(1),
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )
    }

    /// A client certificate (mutual TLS) naming `name`.
    pub fn client_leaf(&self, name: &str) -> Leaf {
        let now = time_now();
        self.issue(
            &[name],
            now - days(1),
            now + days(7),
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )
    }

    fn issue(
        &self,
        names: &[&str],
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Leaf {
        let mut params = leaf_params(names);
        params.not_before = not_before;
        params.not_after = not_after;
        params.extended_key_usages = usages.to_vec();
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        write_leaf(&self.dir, &format!("leaf{n}"), &cert, &key)
    }

    /// A rustls client trusting this CA only, offering `alpn`, speaking
    /// the versions given (all that rustls has when empty).
    pub fn client_config(
        &self,
        alpn: &[&str],
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der.clone()).expect("CA into the root store");
        let versions = if versions.is_empty() {
            rustls::ALL_VERSIONS
        } else {
            versions
        };
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        config
    }

    /// A pooled HTTP client (HTTP/1.1 and h2 by ALPN) trusting this CA;
    /// plain `http://` URLs work too.
    pub fn https_client(&self) -> TestClient {
        TestClient::with_tls(self.client_config(&[], &[]))
    }
}

/// A certificate no CA vouches for, for `names`.
pub fn self_signed(names: &[&str]) -> Leaf {
    let mut params = leaf_params(names);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    write_leaf(&temp_dir("self-signed"), "self-signed", &cert, &key)
}

fn leaf_params(names: &[&str]) -> CertificateParams {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names.clone()).expect("names");
    if let Some(first) = names.first() {
        params.distinguished_name.push(DnType::CommonName, first);
    }
    params
}

fn write_leaf(dir: &Path, stem: &str, cert: &rcgen::Certificate, key: &KeyPair) -> Leaf {
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    let cert_path = dir.join(format!("{stem}.crt"));
    let key_path = dir.join(format!("{stem}.key"));
    std::fs::write(&cert_path, &cert_pem).expect("write certificate");
    std::fs::write(&key_path, &key_pem).expect("write key");
    Leaf {
        cert: cert_path,
        key: key_path,
        cert_pem,
        key_pem,
        der: cert.der().clone(),
    }
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn days(n: i64) -> time::Duration {
    time::Duration::days(n)
}

/// A TLS connection to `addr` with `config`, naming `server_name` (SNI and
/// the name checked); the handshake's error when it fails.
pub async fn connect(
    addr: std::net::SocketAddr,
    server_name: &str,
    config: rustls::ClientConfig,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        connector.connect(name, tcp),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake timed out"))?
}

/// The certificate a server at `addr` presents for `server_name` (checked
/// against `ca`).
pub async fn presented(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca: &TestCa,
) -> std::io::Result<CertificateDer<'static>> {
    let tls = connect(addr, server_name, ca.client_config(&[], &[])).await?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned())
        .ok_or_else(|| std::io::Error::other("no certificate presented"))
}

/// The certificate a server at `addr` presents for SNI `server_name`,
/// whoever signed it and whatever names it carries (to see which one a
/// server picked, not whether it is good).
pub async fn presented_unchecked(
    addr: std::net::SocketAddr,
    server_name: &str,
) -> std::io::Result<CertificateDer<'static>> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnything(provider())))
        .with_no_client_auth();
    let tls = connect(addr, server_name, config).await?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned())
        .ok_or_else(|| std::io::Error::other("no certificate presented"))
}

/// A verifier that accepts any certificate (its signatures still
/// checked): only for [`presented_unchecked`].
#[derive(Debug)]
struct AcceptAnything(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnything {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
