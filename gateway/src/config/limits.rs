//! `[limits]`: sizes, in-flight budgets and per-visitor rates.

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

/// Size limits.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body accepted by the gateway's own endpoints
    /// (`/_sluice/…`). Bodies forwarded to the origin are streamed and not
    /// limited here.
    pub control_body_bytes: usize,
    /// Largest number of request headers.
    pub max_headers: usize,
    /// Largest total size of a request head (request line and headers).
    pub max_header_bytes: usize,
    /// Most client connections open at once (default 10 000). A connection
    /// accepted past it is closed at once, before anything is read: the
    /// client sees a reset or an empty reply and may retry, while the
    /// connections already open keep being served.
    pub max_connections: usize,
    /// Most requests in flight at once on the endpoints that may touch the
    /// stores (challenge, join, status, events, holds, the payment webhook,
    /// admin; default 1024). One past it is answered at once with 503
    /// `store_unavailable`, `"reason": "overloaded"` and `Retry-After`,
    /// instead of queueing behind a slow store.
    pub max_store_requests: usize,
    /// Most requests forwarded to the origin at once (default 4096). One
    /// past it is answered at once with 503 `overloaded` and `Retry-After`
    /// instead of piling onto an origin that is already slow.
    pub max_origin_requests: usize,
    /// Verified tokens remembered so a status poll or a guarded request
    /// skips the Ed25519 check (default 100 000, about 0.4 KB each). A full
    /// cache drops expired entries first, then starts over: memory stays
    /// bounded, and the next polls pay one signature check each.
    pub token_cache_entries: usize,
    /// Most admin API calls in flight at once (default 16): a budget of
    /// their own, apart from `max_store_requests`, so an operator is never
    /// locked out by visitors (or by stalled requests) filling the other.
    pub max_admin_requests: usize,
    /// Status polls one queue token may make per minute (default 120; 0
    /// turns the limit off). Past it: 429 `rate_limited` with
    /// `Retry-After`. The page polls every 1 to 30 s.
    pub status_polls_per_token_per_min: u32,
    /// Hold requests (`POST /_sluice/events/{event}/holds`) one admitted
    /// visitor (the admission token's `sub`) may make per minute, with a
    /// burst of as many (default 60; 0: no limit). Past it: 429
    /// `rate_limited` with `Retry-After`, before the store is asked.
    /// Replays of an `Idempotency-Key` count too (their answer stays the
    /// same after the wait). Per gateway process, like the join limit.
    pub holds_per_visitor_per_min: u32,
    /// Revoked sessions a gateway remembers per room (default 300 000: a
    /// revoke per admission at 1,000 admissions a second for a 5-minute
    /// session ttl; about 80 bytes each). Past it a gateway forgets no
    /// revoke: until the ones it could not keep are too old for any token
    /// of theirs to be valid, it asks the store whether each admitted
    /// request's session lives (gauge `sluice_ended_overflow`).
    pub ended_sessions_per_room: usize,
    /// Server-sent event streams one client network may hold open at once
    /// (default 256; 0: no per-network cap; `network_prefix`: a /24 or a
    /// /48). Past it, or past `max_connections` streams in all, a stream is
    /// refused with 429 `rate_limited` and the page polls instead.
    pub streams_per_prefix: u32,
    /// The longest silence on a stream (default 15 s, 1 s to 60 s): a
    /// comment line is written at least this often, which also finds a
    /// client that went away (its slot comes back within two of these).
    #[serde(with = "humantime_serde")]
    pub stream_heartbeat: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            control_body_bytes: 64 * 1024,
            max_headers: 100,
            max_header_bytes: 64 * 1024,
            max_connections: 10_000,
            max_store_requests: 1024,
            max_origin_requests: 4096,
            token_cache_entries: 100_000,
            max_admin_requests: 16,
            status_polls_per_token_per_min: 120,
            holds_per_visitor_per_min: 60,
            ended_sessions_per_room: 300_000,
            streams_per_prefix: 256,
            stream_heartbeat: crate::visitor::stream::HEARTBEAT,
        }
    }
}

impl Limits {
    /// Checks the section (no domain crate owns these budgets).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.control_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "limits.control_body_bytes",
                "must be above zero",
            ));
        }
        for (name, n) in [
            ("limits.max_connections", self.max_connections),
            ("limits.max_store_requests", self.max_store_requests),
            ("limits.max_origin_requests", self.max_origin_requests),
            ("limits.max_admin_requests", self.max_admin_requests),
        ] {
            if n == 0 || n > 1_000_000 {
                return Err(ConfigError::invalid(name, "must be from 1 to 1000000"));
            }
        }
        if self.holds_per_visitor_per_min > 1_000_000 {
            return Err(ConfigError::invalid(
                "limits.holds_per_visitor_per_min",
                "must be from 0 (no limit) to 1000000",
            ));
        }
        if self.status_polls_per_token_per_min > 60_000 {
            return Err(ConfigError::invalid(
                "limits.status_polls_per_token_per_min",
                "must be from 0 (off) to 60000",
            ));
        }
        if !(16..=10_000_000).contains(&self.token_cache_entries) {
            return Err(ConfigError::invalid(
                "limits.token_cache_entries",
                "must be from 16 to 10000000",
            ));
        }
        if !(std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(60))
            .contains(&self.stream_heartbeat)
        {
            return Err(ConfigError::invalid(
                "limits.stream_heartbeat",
                "must be from 1s to 60s",
            ));
        }
        if !(1..=10_000_000).contains(&self.ended_sessions_per_room) {
            return Err(ConfigError::invalid(
                "limits.ended_sessions_per_room",
                "must be from 1 to 10000000",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_hold_limit_is_read_and_checked() {
        assert_eq!(Limits::default().holds_per_visitor_per_min, 60);
        let c = Config::from_toml("[limits]\nholds_per_visitor_per_min = 0\n").unwrap();
        c.validate().unwrap();
        assert_eq!(c.limits.holds_per_visitor_per_min, 0);
        let err = Config::from_toml("[limits]\nholds_per_visitor_per_min = 1000001\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("limits.holds_per_visitor_per_min"),
            "{err}"
        );
    }
}
