//! `[proxy]`: how requests are forwarded to the origin.

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
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            preserve_host: true,
            pool_max_idle_per_host: 256,
        }
    }
}

impl ProxyConfig {
    /// Checks the section: every value is usable (an idle pool of 0 only
    /// means no connection is kept), so nothing is refused.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}
