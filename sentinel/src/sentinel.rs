//! [`SentinelConnection`]: a connection to the Redis primary that Redis
//! Sentinel names, followed across failovers.
//!
//! The redis crate's [`SentinelClient`] finds the current primary (asking
//! each sentinel in turn, then checking with `ROLE` that the node it names
//! really is a primary) and opens a connection to it, but the connection
//! does not move when Sentinel promotes a replica. [`SentinelConnection`]
//! adds that: it keeps one multiplexed connection, and when a command
//! fails in a way that says "this is not the primary any more" — the
//! connection dropped or was refused, a timeout, `READONLY` (the old
//! primary came back as a replica), `MASTERDOWN` — it forgets the
//! connection; the next command asks the sentinels again. The failed
//! command is *not* retried here: the stores' callers decide (a hold's
//! `Idempotency-Key`, a webhook's `payment_event_id`), exactly as with a
//! standalone server that restarts.
//!
//! It implements [`ConnectionLike`], so scripts, commands and pipelines run
//! on it unchanged, and it clones cheaply (clones share the connection).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};

use crate::url::SentinelUrl;

/// A connection to the current primary (module docs).
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    /// Asks the sentinels; one lookup at a time (concurrent callers that
    /// find the connection gone wait for the first one's answer).
    client: tokio::sync::Mutex<SentinelClient>,
    /// The connection in use, with the generation that opened it, so a
    /// caller that failed on an old one does not forget a newer one.
    current: parking_lot::Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    timeout: Duration,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("generation", &self.inner.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// Finds the primary and connects to it, within `timeout` (which also
    /// bounds each later lookup, connect and reply).
    pub async fn connect(url: &SentinelUrl, timeout: Duration) -> RedisResult<Self> {
        Self::connect_with(url, timeout, None).await
    }

    /// [`SentinelConnection::connect`]; over TLS (a `rediss+sentinel://`
    /// URL) to the sentinels and to the nodes they name alike, verified
    /// with `certs` (the system roots when `None`).
    pub async fn connect_with(
        url: &SentinelUrl,
        timeout: Duration,
        certs: Option<TlsCertificates>,
    ) -> RedisResult<Self> {
        let client = match url.is_tls() {
            false => SentinelClient::build(
                url.sentinels.clone(),
                url.service.clone(),
                None,
                SentinelServerType::Master,
            )?,
            true => tls_client(url, certs)?,
        };
        let conn = SentinelConnection {
            inner: Arc::new(Inner {
                client: tokio::sync::Mutex::new(client),
                current: parking_lot::Mutex::new(None),
                generation: AtomicU64::new(0),
                timeout,
            }),
        };
        conn.current().await?;
        Ok(conn)
    }

    /// The connection in use, or a new one to whichever node the sentinels
    /// name now.
    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.inner.current.lock().clone() {
            return Ok(c);
        }
        let mut client = self.inner.client.lock().await;
        if let Some(c) = self.inner.current.lock().clone() {
            return Ok(c);
        }
        let t = self.inner.timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(t))
            .set_response_timeout(Some(t));
        // Whatever stops the lookup — no sentinel answers, none names a
        // primary (mid-failover they name none), the named node refuses —
        // is the store being unreachable for now, as callers classify it.
        let conn = tokio::time::timeout(t, client.get_async_connection_with_config(&config))
            .await
            .map_err(|_| {
                RedisError::from((
                    ErrorKind::Io,
                    "no primary from the sentinels in time",
                    format!("{t:?}"),
                ))
            })?
            .map_err(|e| {
                RedisError::from((
                    ErrorKind::Io,
                    "no primary from the sentinels",
                    e.to_string(),
                ))
            })?;
        let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.inner.current.lock() = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// Drops the connection of `generation` (if still in use), so the next
    /// command asks the sentinels again.
    fn forget(&self, generation: u64) {
        let mut current = self.inner.current.lock();
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }
}

/// A client speaking TLS to the sentinels and to the primary they name.
fn tls_client(url: &SentinelUrl, certs: Option<TlsCertificates>) -> RedisResult<SentinelClient> {
    let sentinels = url
        .sentinels
        .iter()
        .map(|s| Ok(s.as_str().into_connection_info()?.addr().clone()))
        .collect::<RedisResult<Vec<_>>>()?;
    let mut builder =
        SentinelClientBuilder::new(sentinels, url.service.clone(), SentinelServerType::Master)?
            .set_client_to_sentinel_tls_mode(TlsMode::Secure)
            .set_client_to_redis_tls_mode(TlsMode::Secure);
    if let Some(certs) = certs {
        builder = builder
            .set_client_to_sentinel_certificates(certs.clone())
            .set_client_to_redis_certificates(certs);
    }
    builder.build()
}

/// Whether an error means the node may no longer be the primary.
fn points_elsewhere(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

/// The same for one reply of a pipeline sent with `ignore_errors`.
fn value_points_elsewhere(v: &Value) -> bool {
    matches!(
        v,
        Value::ServerError(e)
            if matches!(e.kind(), Some(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown))
    )
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let reply = conn.req_packed_command(cmd).await;
            match &reply {
                Err(e) if points_elsewhere(e) => self.forget(generation),
                Ok(v) if value_points_elsewhere(v) => self.forget(generation),
                _ => {}
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            match &reply {
                Err(e) if points_elsewhere(e) => self.forget(generation),
                Ok(values) if values.iter().any(value_points_elsewhere) => {
                    self.forget(generation);
                }
                _ => {}
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
