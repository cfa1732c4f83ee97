//! [`RedisTls`]: how a `rediss://` connection trusts the server and proves
//! itself — a CA file (else the system roots) and an optional client
//! certificate and key — loaded and checked once, before anything connects;
//! and [`describe`], which turns a TLS failure buried in a redis error into
//! one line that says so.
//!
//! The files are read and parsed here (not handed to the redis client as
//! paths) so that a missing file, a PEM without a certificate or a key that
//! does not fit its certificate is refused by `check-config`, naming the
//! file, rather than at the first connect.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Which of the three files a [`TlsFileError`] is about; the caller names
/// it as its own setting (`redis_ca`, `--redis-client-key`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFile {
    /// The CA certificates the server's certificate must chain to.
    Ca,
    /// The client certificate (chain), for servers with `tls-auth-clients`.
    ClientCert,
    /// The client certificate's private key.
    ClientKey,
}

/// Why the TLS files are refused. The `Display` follows the setting's name
/// in a one-line configuration error.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// Which file.
        file: TlsFile,
        /// As given.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is read but is not what it should be (no PEM certificate,
    /// no PEM private key, a certificate that is not a usable CA, a key
    /// that does not fit the certificate).
    #[error("{path}: {reason}")]
    Content {
        /// Which file.
        file: TlsFile,
        /// As given.
        path: PathBuf,
        /// What is wrong, in a few words.
        reason: String,
    },
    /// A client certificate without its key, or a key without its
    /// certificate.
    #[error("a client certificate and its key go together: set both or neither")]
    Unpaired {
        /// The one that is set.
        file: TlsFile,
    },
}

impl TlsFileError {
    /// The file the error is about.
    pub fn file(&self) -> TlsFile {
        match self {
            TlsFileError::Read { file, .. }
            | TlsFileError::Content { file, .. }
            | TlsFileError::Unpaired { file } => *file,
        }
    }
}

/// TLS material of `rediss://` connections (module docs). The default
/// trusts the system roots and sends no client certificate.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM of the CA certificates; `None`: the system roots.
    ca: Option<Vec<u8>>,
    /// PEM of the client certificate chain and of its key.
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

impl RedisTls {
    /// The system roots, no client certificate.
    pub const DEFAULT: RedisTls = RedisTls {
        ca: None,
        client: None,
    };

    /// Reads and checks the files: each CA certificate must be a usable
    /// trust anchor, the client chain must hold a certificate and the key
    /// must be a private key that fits it.
    pub fn load(
        ca: Option<&Path>,
        client_cert: Option<&Path>,
        client_key: Option<&Path>,
    ) -> Result<Self, TlsFileError> {
        let ca = ca.map(load_ca).transpose()?;
        let client = match (client_cert, client_key) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(TlsFileError::Unpaired {
                    file: TlsFile::ClientCert,
                });
            }
            (None, Some(_)) => {
                return Err(TlsFileError::Unpaired {
                    file: TlsFile::ClientKey,
                });
            }
            (Some(cert), Some(key)) => Some(load_client(cert, key)?),
        };
        Ok(RedisTls { ca, client })
    }

    /// Whether anything differs from the default (a CA file or a client
    /// certificate is set).
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// The redis client's form, `None` for the default (its own default is
    /// the same: the system roots, no client certificate).
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        if !self.is_set() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        })
    }
}

fn read(file: TlsFile, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Read {
        file,
        path: path.to_owned(),
        source,
    })
}

fn content(file: TlsFile, path: &Path, reason: impl Into<String>) -> TlsFileError {
    TlsFileError::Content {
        file,
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Every certificate of a PEM file, at least one.
fn certificates(
    file: TlsFile,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(file, path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(content(file, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn load_ca(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let pem = read(TlsFile::Ca, path)?;
    let mut roots = RootCertStore::empty();
    for cert in certificates(TlsFile::Ca, path, &pem)? {
        roots.add(cert).map_err(|e| {
            content(
                TlsFile::Ca,
                path,
                format!("not a usable CA certificate: {e}"),
            )
        })?;
    }
    Ok(pem)
}

fn load_client(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsFileError> {
    let cert_pem = read(TlsFile::ClientCert, cert)?;
    let chain = certificates(TlsFile::ClientCert, cert, &cert_pem)?;
    let key_pem = read(TlsFile::ClientKey, key)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| content(TlsFile::ClientKey, key, format!("no PEM private key: {e}")))?;
    // Built as a connection would build it: a key of a kind the provider
    // cannot use, or one that is not the certificate's, is refused now.
    install_provider();
    rustls::ClientConfig::builder()
        .with_root_certificates(RootCertStore::empty())
        .with_client_auth_cert(chain, private)
        .map_err(|e| {
            content(
                TlsFile::ClientKey,
                key,
                format!("does not fit {}: {e}", cert.display()),
            )
        })?;
    Ok((cert_pem, key_pem))
}

/// Makes ring the process's rustls provider unless one is installed
/// already: the redis client builds its TLS settings with the process
/// default, which rustls cannot choose by itself once two providers are
/// compiled in (another crate may enable aws-lc-rs).
pub fn install_provider() {
    // An error only says a provider is installed already: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// When `e` is (or wraps) a TLS failure, the same error as one line that
/// says so — `TLS verification failed: …` for a server certificate this
/// side refuses, `TLS refused by the server: …` for an alert from the
/// server (a client certificate missing or unknown to it) — keeping the
/// kind callers classify by (an I/O error: the store is unreachable).
/// Other errors are returned unchanged.
///
/// The failure is also logged (a warning), once per outage rather than at
/// every retry of every connection: a reconnect loop failing its handshake
/// says why a single time, and again only when the reason changes or
/// [`REPEAT_AFTER`] has passed.
pub fn describe(e: redis::RedisError) -> redis::RedisError {
    let Some((head, detail)) = tls_failure(&e) else {
        return e;
    };
    report(head, &detail);
    redis::RedisError::from((redis::ErrorKind::Io, head, detail))
}

/// How long the same TLS failure stays unsaid after it was logged.
pub const REPEAT_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// The TLS failure last logged, and when.
static LAST_REPORTED: parking_lot::Mutex<Option<(String, std::time::Instant)>> =
    parking_lot::Mutex::new(None);

fn report(head: &str, detail: &str) {
    let mut last = LAST_REPORTED.lock();
    let fresh = last
        .as_ref()
        .is_none_or(|(said, at)| said != detail || at.elapsed() >= REPEAT_AFTER);
    if fresh {
        *last = Some((detail.to_owned(), std::time::Instant::now()));
        drop(last);
        tracing::warn!(error = %detail, "Redis {head}; the store stays unreachable until it passes");
    }
}

/// The first rustls error in the chain of `e`, as (headline, detail).
fn tls_failure(e: &redis::RedisError) -> Option<(&'static str, String)> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(tls) = as_rustls(err) {
            return Some(headline(tls));
        }
        next = err.source();
    }
    // Some paths (cluster's initial connections) keep only the words.
    let text = e.to_string();
    ["invalid peer certificate", "received fatal alert"]
        .iter()
        .any(|w| text.contains(w))
        .then(|| {
            let head = if text.contains("invalid peer certificate") {
                "TLS verification failed"
            } else {
                "TLS refused by the server"
            };
            (head, text)
        })
}

fn as_rustls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = err.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    err.downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

fn headline(e: &rustls::Error) -> (&'static str, String) {
    let head = match e {
        rustls::Error::InvalidCertificate(_) => "TLS verification failed",
        rustls::Error::AlertReceived(_) => "TLS refused by the server",
        _ => "TLS failed",
    };
    (head, e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{RedisTls, TlsFile, TlsFileError, describe};

    fn temp(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-redis-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn nothing_set_is_the_default() {
        let tls = RedisTls::load(None, None, None).unwrap();
        assert!(!tls.is_set());
        assert!(tls.certificates().is_none());
    }

    #[test]
    fn bad_files_name_the_file() {
        let missing = std::path::Path::new("/nonexistent/ca.pem");
        let e = RedisTls::load(Some(missing), None, None).unwrap_err();
        assert!(matches!(e, TlsFileError::Read { .. }), "{e}");
        assert_eq!(e.file(), TlsFile::Ca);

        let garbage = temp("garbage.pem", "not a certificate\n");
        let e = RedisTls::load(Some(&garbage), None, None).unwrap_err();
        assert_eq!(e.file(), TlsFile::Ca);
        assert!(e.to_string().contains("no PEM certificate"), "{e}");

        let e = RedisTls::load(None, Some(&garbage), None).unwrap_err();
        assert!(matches!(e, TlsFileError::Unpaired { .. }), "{e}");
        let e = RedisTls::load(None, None, Some(&garbage)).unwrap_err();
        assert_eq!(e.file(), TlsFile::ClientKey);

        let e = RedisTls::load(None, Some(&garbage), Some(&garbage)).unwrap_err();
        assert_eq!(e.file(), TlsFile::ClientCert);
    }

    #[test]
    fn other_errors_pass_unchanged() {
        let e = || redis::RedisError::from((redis::ErrorKind::Io, "connection refused"));
        assert_eq!(describe(e()).to_string(), e().to_string());
    }
}
