//! `[proxy]`: how requests are forwarded to the origin.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// Forwarding to the origin.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Send the client's `Host` header to the origin (true), or the origin
    /// URL's authority (false). `X-Forwarded-Host` always carries the
    /// client's.
    pub preserve_host: bool,
    /// Most idle pooled connections kept per origin host.
    pub pool_max_idle_per_host: usize,
    /// PEM bundle of the CAs an `https://` origin's certificate must chain
    /// to (`--origin-ca`, `SLUICE_ORIGIN_CA`); unset: the system's roots.
    pub origin_ca: Option<PathBuf>,
    /// Accept any certificate from an `https://` origin (no chain, no
    /// name, no date checked). For tests only: warned about at startup.
    pub insecure_skip_verify: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            preserve_host: true,
            pool_max_idle_per_host: 256,
            origin_ca: None,
            insecure_skip_verify: false,
        }
    }
}

impl ProxyConfig {
    /// Checks the section (an idle pool of 0 only means no connection is
    /// kept): `origin_ca` is read as `serve` reads it, a missing,
    /// unreadable or garbage bundle refused; `origin_ca` beside
    /// `insecure_skip_verify` is refused (which one was meant?).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(ca) = &self.origin_ca {
            if self.insecure_skip_verify {
                return Err(ConfigError::invalid(
                    "proxy.insecure_skip_verify",
                    "set beside proxy.origin_ca: verify against that CA, or verify nothing, not both",
                ));
            }
            crate::proxy::tls::load_ca_bundle(ca).map_err(|e| {
                ConfigError::invalid("proxy.origin_ca", format!("(--origin-ca) {e}"))
            })?;
        }
        Ok(())
    }
}
