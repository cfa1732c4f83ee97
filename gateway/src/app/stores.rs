//! The concrete stores, picked once at start-up: in memory (one gateway,
//! the embedded default) or Redis (`redis://`, `redis+cluster://` or
//! `redis+sentinel://`, shared by every gateway). Generics stop here: the rest of the gateway
//! holds the backend enums of the domain crates.

use std::time::Duration;

use sluice_admission::{MemoryQueueStore, QueueBackend, RedisConfig, RedisQueueStore, SystemClock};
use sluice_pow::{RedisReplayGuard, ReplayGuard};
use sluice_reservation::{InventoryBackend, MemoryInventory, RedisInventory};

use crate::config::Config;

/// The three stores of a gateway.
pub struct Stores {
    /// Admission queue.
    pub queue: QueueBackend,
    /// Proof-of-work replay guard.
    pub replay_guard: ReplayGuard,
    /// Reservation inventory.
    pub inventory: InventoryBackend,
}

/// Bound on every admission-store call: a slow Redis answers 503 quickly
/// instead of piling up requests.
const STORE_TIMEOUT: Duration = Duration::from_millis(1000);

/// Connects the stores the configuration asks for.
pub async fn connect(config: &Config) -> anyhow::Result<Stores> {
    let Some(url) = &config.redis else {
        return Ok(Stores {
            queue: QueueBackend::Memory(MemoryQueueStore::new(std::sync::Arc::new(SystemClock))),
            replay_guard: ReplayGuard::memory(),
            inventory: InventoryBackend::Memory(
                MemoryInventory::new().with_retention(config.reservation.retention()),
            ),
        });
    };
    let queue = RedisQueueStore::connect(
        url,
        RedisConfig {
            timeout: STORE_TIMEOUT,
            // joins wait for replicas as holds do: a place a failover
            // could lose is never handed out
            wait_replicas: config.replication.wait_replicas,
            wait_timeout: config.replication.wait_timeout,
            ..RedisConfig::default()
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("admission store at {url}: {e}"))?;
    let mut inventory_config = sluice_reservation::RedisConfig::new(url.clone());
    inventory_config.wait_replicas = config.replication.wait_replicas;
    inventory_config.wait_timeout = config.replication.wait_timeout;
    inventory_config.retention = config.reservation.retention();
    let inventory = RedisInventory::connect(&inventory_config)
        .await
        .map_err(|e| anyhow::anyhow!("reservation store at {url}: {e}"))?;
    let replay_guard = if url.starts_with(sluice_sentinel::SCHEME) {
        let conn = sluice_sentinel::SentinelConnection::connect(url, STORE_TIMEOUT).await?;
        ReplayGuard::Redis(RedisReplayGuard::sentinel(conn))
    } else if let Some(rest) = url.strip_prefix("redis+cluster://") {
        let nodes: Vec<String> = rest
            .trim_end_matches('/')
            .split(',')
            .map(|n| format!("redis://{n}"))
            .collect();
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(STORE_TIMEOUT)
            .response_timeout(STORE_TIMEOUT)
            .build()?;
        let conn = client.get_async_connection().await?;
        ReplayGuard::Redis(RedisReplayGuard::cluster(conn))
    } else {
        let client = redis::Client::open(url.as_str())?;
        let cfg = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(STORE_TIMEOUT))
            .set_connection_timeout(Some(STORE_TIMEOUT));
        let cm = redis::aio::ConnectionManager::new_with_config(client, cfg).await?;
        ReplayGuard::Redis(RedisReplayGuard::new(cm))
    };
    Ok(Stores {
        queue: QueueBackend::Redis(queue),
        replay_guard,
        inventory: InventoryBackend::Redis(inventory),
    })
}
