//! The concrete stores, picked once at start-up: in memory (one gateway,
//! the embedded default) or Redis (`redis://`, `redis+cluster://` or
//! `redis+sentinel://`, each also over TLS as `rediss…`, shared by every
//! gateway; one parser and one
//! connection type for the three stores, `sluice_redis`). Generics stop
//! here: the rest of the gateway holds the backend enums of the domain
//! crates.

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
    // `validate` read the TLS files already; read again here, the same way.
    let tls = config.redis_tls()?;
    let queue = RedisQueueStore::connect(
        url,
        RedisConfig {
            timeout: STORE_TIMEOUT,
            // joins wait for replicas as holds do: a place a failover
            // could lose is never handed out
            wait_replicas: config.replication.wait_replicas,
            wait_timeout: config.replication.wait_timeout,
            tls: tls.clone(),
            ..RedisConfig::default()
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("admission store at {url}: {e}"))?;
    let mut inventory_config = sluice_reservation::RedisConfig::new(url.clone());
    inventory_config.wait_replicas = config.replication.wait_replicas;
    inventory_config.wait_timeout = config.replication.wait_timeout;
    inventory_config.retention = config.reservation.retention();
    inventory_config.tls = tls.clone();
    let inventory = RedisInventory::connect(&inventory_config)
        .await
        .map_err(|e| anyhow::anyhow!("reservation store at {url}: {e}"))?;
    // `validate` parsed the URL already; parsed again here, the same way.
    let replay_guard = sluice_redis::RedisUrl::parse(url)?
        .connect_with(STORE_TIMEOUT, &tls)
        .await
        .map_err(|e| anyhow::anyhow!("replay guard at {url}: {e}"))?;
    let replay_guard = ReplayGuard::Redis(RedisReplayGuard::new(replay_guard));
    Ok(Stores {
        queue: QueueBackend::Redis(queue),
        replay_guard,
        inventory: InventoryBackend::Redis(inventory),
    })
}
