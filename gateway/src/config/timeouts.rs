//! `[timeouts]`: every wait on a peer is bounded.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// Timeouts. Every wait on a peer is bounded.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Time a client has to send a request's headers (slowloris guard);
    /// also bounds an idle keep-alive connection before its next request.
    #[serde(with = "humantime_serde")]
    pub header_read: Duration,
    /// Time to open a TCP connection to the origin.
    #[serde(with = "humantime_serde")]
    pub upstream_connect: Duration,
    /// Time for the origin to answer with its response headers.
    #[serde(with = "humantime_serde")]
    pub upstream_response: Duration,
    /// How long SIGTERM waits for in-flight requests before closing.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Idle time after which a pooled upstream connection is closed.
    #[serde(with = "humantime_serde")]
    pub upstream_idle: Duration,
    /// Time a client has to send the whole body of a request to the
    /// gateway's own endpoints (read and bounded before any store permit is
    /// taken), and the longest pause between two pieces of a body forwarded
    /// to the origin. Past it: 408 `request_timeout`.
    #[serde(with = "humantime_serde")]
    pub body_read: Duration,
    /// Idle time after which a WebSocket tunnel is closed (no byte either
    /// way).
    #[serde(with = "humantime_serde")]
    pub tunnel_idle: Duration,
    /// Longest a write to a client may wait without progress (it stopped
    /// reading: a slow-read attack, a status stream nobody reads); past
    /// it the connection is closed, giving its slot back. `0s`: never.
    #[serde(with = "humantime_serde")]
    pub write_stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_secs(10),
            upstream_connect: Duration::from_secs(5),
            upstream_response: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            upstream_idle: Duration::from_secs(90),
            body_read: Duration::from_secs(10),
            tunnel_idle: Duration::from_secs(300),
            write_stall: Duration::from_secs(30),
        }
    }
}

impl Timeouts {
    /// Checks the section (no domain crate owns these waits).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, d) in [
            ("timeouts.header_read", self.header_read),
            ("timeouts.upstream_connect", self.upstream_connect),
            ("timeouts.upstream_response", self.upstream_response),
        ] {
            if d.is_zero() {
                return Err(ConfigError::invalid(name, "must be above zero"));
            }
        }
        for (name, d) in [
            ("timeouts.body_read", self.body_read),
            ("timeouts.tunnel_idle", self.tunnel_idle),
        ] {
            if d.is_zero() || d > Duration::from_secs(86_400) {
                return Err(ConfigError::invalid(name, "must be from 1 ms to 24 h"));
            }
        }
        Ok(())
    }
}
