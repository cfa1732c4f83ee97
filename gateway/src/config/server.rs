//! `[server]`: the HTTP front's threads, and `[server.tls]`, its HTTPS
//! listener (certificates, SNI, versions, reload, the plain listener
//! beside it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// The HTTP front.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Threads that accept and serve connections, each with an event loop
    /// of its own that a connection stays on (with the upstream connections
    /// it uses), as nginx's workers do. `0` (the default): one per core.
    /// Background work (admission ticks, reaping, Redis) runs apart from
    /// them.
    pub io_threads: usize,
    /// Plain HTTP/1.1 requests (`GET` or `HEAD`, no body, no upgrade, no
    /// `Expect`) are read and answered by the gateway's own HTTP/1.1 code
    /// (`sluice_wire::front`), without hyper's dispatcher, body channel and codec
    /// (about 1,600 fewer instructions per proxied request, README
    /// "Measured"); at the first request that is not plain, hyper serves the
    /// connection. `false`: hyper serves every request.
    pub native_http1: bool,
    /// A hold (`POST /_sluice/events/{event}/holds`) or a join (`POST
    /// /_sluice/rooms/{room}/join`) is answered from the connection, past
    /// the router's generic layers (route lookup, the middlewares' boxed
    /// futures, the trace and compression layers), with what they do for
    /// it done in place: the same request id, span, catch of a panic, body
    /// bounds, store budget, `no-store` and compression
    /// (`crate::app::direct`; README "Holds and joins past the router").
    /// `false`: they take the router as every other call.
    pub direct_calls: bool,
    /// `[server.tls]`: when set, `listen` serves HTTPS (`--tls-cert`,
    /// `--tls-key`). None: plain HTTP.
    pub tls: Option<TlsConfig>,
}

/// `[server.tls]`: TLS termination at the edge (rustls).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM file of the default certificate and its chain, leaf first
    /// (`--tls-cert`, `SLUICE_TLS_CERT`): served to a client that sends no
    /// SNI name, or one no `sni` entry matches.
    pub cert: PathBuf,
    /// PEM file of the default certificate's private key (PKCS#8, PKCS#1
    /// or SEC1; `--tls-key`, `SLUICE_TLS_KEY`).
    pub key: PathBuf,
    /// More certificates, chosen by the client's SNI name against each
    /// one's DNS names (`*.example.com` covers one label), in order; the
    /// first that matches is served.
    pub sni: Vec<SniCert>,
    /// The oldest protocol accepted: `"1.2"` (default) or `"1.3"`. Older
    /// ones are never: rustls has no TLS 1.1 or 1.0.
    pub min_version: MinVersion,
    /// How often the certificate and key files are checked for a change
    /// (modification time and length); a change reloads them, as SIGHUP
    /// does at once. A reload that fails keeps the certificates served.
    #[serde(with = "humantime_serde")]
    pub reload_check: Duration,
    /// A plain-HTTP listener beside the HTTPS one (e.g. `"0.0.0.0:80"`).
    /// None: only HTTPS.
    pub http_listen: Option<SocketAddr>,
    /// On `http_listen`: answer every request with 308 to the same URL over
    /// https (the probes `/_sluice/healthz`, `/_sluice/readyz`,
    /// `/_sluice/serving` and `/metrics` excepted). `false`: serve plain HTTP
    /// there as usual.
    pub redirect_to_https: bool,
}

/// One `[[server.tls.sni]]` certificate.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SniCert {
    /// PEM file of the certificate and its chain, leaf first.
    pub cert: PathBuf,
    /// PEM file of its private key.
    pub key: PathBuf,
}

/// The oldest TLS version the listener accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MinVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: PathBuf::new(),
            key: PathBuf::new(),
            sni: Vec::new(),
            min_version: MinVersion::Tls12,
            reload_check: Duration::from_secs(5),
            http_listen: None,
            redirect_to_https: true,
        }
    }
}

impl TlsConfig {
    /// Checks the section: both files given, and every certificate and key
    /// loaded as the listener loads them (a missing file, a bad PEM, a key
    /// that is not the certificate's is refused here, naming its setting).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.reload_check < Duration::from_millis(100) {
            return Err(ConfigError::invalid(
                "server.tls.reload_check",
                "must be at least 100ms",
            ));
        }
        crate::edge::tls::load_all(self).map(|_| ())
    }
}

impl ServerConfig {
    /// The I/O threads to start: `io_threads`, or one per core for `0`.
    pub fn threads(&self) -> usize {
        match self.io_threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            io_threads: 0,
            native_http1: true,
            direct_calls: true,
            tls: None,
        }
    }
}

impl ServerConfig {
    /// Checks the section: a thread count a machine can run.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.io_threads > 1024 {
            return Err(ConfigError::invalid(
                "server.io_threads",
                "must be from 0 (one per core) to 1024",
            ));
        }
        match &self.tls {
            Some(tls) => tls.validate(),
            None => Ok(()),
        }
    }
}
