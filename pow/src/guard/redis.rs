//! Redis replay guard: one memory of redeemed challenges for every gateway.
//!
//! # Key schema
//!
//! One string key per redeemed challenge:
//!
//! `sluice:pow:{<hex of id[0..2]>}:<hex of id>` = `1`, set with
//! `SET key 1 NX PX <ttl ms>`.
//!
//! `NX` makes the insert-if-absent atomic across gateways; `PX` drops the key
//! when the challenge can no longer be accepted anywhere, so Redis holds
//! only live ids. The hash tag is the id's first two bytes: the keys are
//! independent, so they spread over Redis Cluster's slots (one round trip,
//! one key, works unchanged on a cluster).

use std::time::Duration;

use sluice_redis::RedisConn;

use super::{ReplayStore, hex};
use crate::error::GuardError;

/// The default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "sluice:pow:";

/// Challenge ids held in Redis until they expire.
#[derive(Clone)]
pub struct RedisReplayGuard {
    conn: RedisConn,
    prefix: String,
}

impl std::fmt::Debug for RedisReplayGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisReplayGuard")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisReplayGuard {
    /// A guard over `conn` (any kind: standalone, cluster, Sentinel) with
    /// keys under [`DEFAULT_PREFIX`].
    pub fn new(conn: impl Into<RedisConn>) -> Self {
        Self::with_prefix(conn, DEFAULT_PREFIX)
    }

    /// A guard whose keys start with `prefix` (for tests, or several
    /// deployments on one Redis).
    pub fn with_prefix(conn: impl Into<RedisConn>, prefix: impl Into<String>) -> Self {
        RedisReplayGuard {
            conn: conn.into(),
            prefix: prefix.into(),
        }
    }

    /// The key that records `id`.
    pub fn key(&self, id: &[u8; 16]) -> String {
        format!("{}{{{}}}:{}", self.prefix, hex(&id[..2]), hex(id))
    }
}

impl ReplayStore for RedisReplayGuard {
    async fn consume_once(&self, id: &[u8; 16], ttl: Duration) -> Result<bool, GuardError> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.key(id)).arg(1).arg("NX").arg("PX").arg(ms);
        let reply: Option<String> = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(reply.is_some())
    }

    async fn note(&self, id: &[u8; 16], note: &str) -> Result<(), GuardError> {
        if note.is_empty() || note == "1" {
            return Ok(()); // "1" is the bare mark of a consumed id
        }
        // XX: only an id still recorded; KEEPTTL: forgotten with it.
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.key(id)).arg(note).arg("XX").arg("KEEPTTL");
        let _: Option<String> = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    async fn noted(&self, id: &[u8; 16]) -> Result<Option<String>, GuardError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.key(id));
        let reply: Option<String> = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(reply.filter(|v| v != "1"))
    }

    async fn release(&self, id: &[u8; 16]) -> Result<(), GuardError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.key(id));
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }
}
