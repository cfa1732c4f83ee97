//! [`RedisConn`]: the one connection type every store runs its commands
//! and scripts on, and [`RedisUrl::connect`], the one way to open it.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::local::Outages;
use crate::sentinel::SentinelConnection;
use crate::tls::{RedisTls, describe, install_provider};
use crate::url::RedisUrl;

/// Reconnection attempts of a standalone connection before a command
/// fails (the next command starts over): a store that is down answers
/// "unavailable" within a few hundred milliseconds, not after the client's
/// default of six doublings.
const RECONNECT_RETRIES: usize = 2;

/// A connection to standalone Redis (reconnecting), to a Redis Cluster
/// (following `MOVED`/`ASK`) or to the primary Redis Sentinel names
/// (following failovers). Each multiplexes, reconnects by itself and
/// clones cheaply (clones share the connection); scripts, commands and
/// pipelines run on all three unchanged.
#[derive(Clone)]
pub enum RedisConn {
    /// One server, and the failures seen on the process's connections to
    /// it (which decide when a thread's own connection is trusted:
    /// [`crate::local`]).
    Single(ConnectionManager, Outages),
    /// Redis Cluster.
    Cluster(ClusterConnection),
    /// The primary Sentinel names.
    Sentinel(SentinelConnection),
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisConn::Single(..) => f.write_str("RedisConn::Single"),
            RedisConn::Cluster(_) => f.write_str("RedisConn::Cluster"),
            RedisConn::Sentinel(c) => f.debug_tuple("RedisConn::Sentinel").field(c).finish(),
        }
    }
}

impl RedisUrl {
    /// Opens the connection the URL names. `timeout` bounds each connect
    /// and each reply (a Sentinel lookup too); the whole first connect may
    /// take longer (several nodes, a retry), so callers that must answer
    /// in time put their own bound around it.
    ///
    /// The future is boxed: it runs once per store, and a caller's own
    /// future (the gateway's start-up, a test harness) stays shallow enough
    /// for the compiler's layout depth limit.
    pub fn connect(&self, timeout: Duration) -> RedisFuture<'_, RedisConn> {
        self.connect_with(timeout, &RedisTls::DEFAULT)
    }

    /// [`RedisUrl::connect`], a `rediss…` URL verified and authenticated
    /// with `tls` (ignored for a plain URL: configuration refuses that
    /// pair). A TLS failure says so ([`crate::tls::describe`]).
    pub fn connect_with<'a>(
        &'a self,
        timeout: Duration,
        tls: &'a RedisTls,
    ) -> RedisFuture<'a, RedisConn> {
        Box::pin(async move { self.open(timeout, tls).await.map_err(describe) })
    }

    async fn open(&self, timeout: Duration, tls: &RedisTls) -> RedisResult<RedisConn> {
        let certs = match self.is_tls() {
            true => {
                install_provider();
                tls.certificates()
            }
            false => None,
        };
        Ok(match self {
            RedisUrl::Single(url) => {
                let client = match certs {
                    Some(certs) => redis::Client::build_with_tls(url.as_str(), certs)?,
                    None => redis::Client::open(url.as_str())?,
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(RECONNECT_RETRIES);
                let outages = Outages::of(&client.get_connection_info().addr().to_string());
                RedisConn::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                    outages,
                )
            }
            RedisUrl::Cluster(nodes) => {
                let mut builder = ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout);
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                RedisConn::Cluster(builder.build()?.get_async_connection().await?)
            }
            RedisUrl::Sentinel(url) => {
                RedisConn::Sentinel(SentinelConnection::connect_with(url, timeout, certs).await?)
            }
        })
    }
}

impl From<ConnectionManager> for RedisConn {
    /// A connection whose server is not known by its address: its failures
    /// count on a counter of its own.
    fn from(c: ConnectionManager) -> Self {
        RedisConn::Single(c, Outages::default())
    }
}

impl From<ClusterConnection> for RedisConn {
    fn from(c: ClusterConnection) -> Self {
        RedisConn::Cluster(c)
    }
}

impl From<SentinelConnection> for RedisConn {
    fn from(c: SentinelConnection) -> Self {
        RedisConn::Sentinel(c)
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // A reconnect that fails its handshake says so, as the first
        // connect does.
        Box::pin(async move {
            match self {
                RedisConn::Single(c, outages) => c
                    .req_packed_command(cmd)
                    .await
                    .inspect_err(|e| outages.note(e)),
                RedisConn::Cluster(c) => c.req_packed_command(cmd).await,
                RedisConn::Sentinel(c) => c.req_packed_command(cmd).await,
            }
            .map_err(describe)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self {
                RedisConn::Single(c, outages) => c
                    .req_packed_commands(pipeline, offset, count)
                    .await
                    .inspect_err(|e| outages.note(e)),
                RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count).await,
                RedisConn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count).await,
            }
            .map_err(describe)
        })
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c, _) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
            RedisConn::Sentinel(c) => c.get_db(),
        }
    }
}
