//! The concrete stores, picked once at start-up: in memory (one gateway,
//! the embedded default) or Redis (`redis://`, `redis+cluster://` or
//! `redis+sentinel://`, each also over TLS as `rediss…`, shared by every
//! gateway; one parser and one
//! connection type for the three stores, `sluice_redis`). Generics stop
//! here: the rest of the gateway holds the backend enums of the domain
//! crates.

use std::time::Duration;

use sluice_admission::{MemoryQueueStore, QueueBackend, RedisConfig, RedisQueueStore, SystemClock};
use sluice_reservation::{
    InventoryBackend, MemoryInventory, RedisInventory, Sharded, StockBackend,
};

use crate::config::Config;

/// The three stores of a gateway.
pub struct Stores {
    /// Admission queue.
    pub queue: QueueBackend,
    /// Reservation inventory (sharded events routed).
    pub inventory: StockBackend,
    /// Invite codes of invite-only rooms.
    pub invites: sluice_admission::invites::InviteStore,
    /// The place bound to each account (enqueue tokens).
    pub accounts: sluice_admission::enqueue::AccountPlaces,
    /// The stock feeds' lane (`crate::reserve::feeds`), a consumer named
    /// after this gateway.
    pub feed_lane: crate::reserve::feeds::FeedLane,
}

/// Bound on every admission-store call: a slow Redis answers 503 quickly
/// instead of piling up requests.
const STORE_TIMEOUT: Duration = Duration::from_millis(1000);

/// Connects the stores the configuration asks for.
pub async fn connect(config: &Config) -> anyhow::Result<Stores> {
    let Some(url) = &config.redis else {
        return Ok(Stores {
            queue: QueueBackend::Memory(MemoryQueueStore::new(std::sync::Arc::new(SystemClock))),
            inventory: Sharded::new(InventoryBackend::Memory(
                MemoryInventory::new().with_retention(config.reservation.retention()),
            )),
            invites: sluice_admission::invites::InviteStore::memory(),
            accounts: sluice_admission::enqueue::AccountPlaces::memory(),
            feed_lane: crate::reserve::feeds::FeedLane::Memory(Default::default()),
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
    // The proof-of-work replay guard is the queue store's (a join and its
    // solution are one script); invites and accounts share a connection of
    // their own (keys under the room's hash tag, as the queue's).
    let shared = sluice_redis::RedisUrl::parse(url)?
        .connect_with(STORE_TIMEOUT, &tls)
        .await
        .map_err(|e| anyhow::anyhow!("invite and account store at {url}: {e}"))?;
    let prefix = sluice_admission::redis_store::RedisConfig::default().prefix;
    let invites = sluice_admission::invites::InviteStore::redis(shared.clone(), &prefix);
    let accounts = sluice_admission::enqueue::AccountPlaces::redis(shared, &prefix);
    let lane_conn = sluice_redis::RedisUrl::parse(url)?
        .connect_with(STORE_TIMEOUT, &tls)
        .await
        .map_err(|e| anyhow::anyhow!("feed lane at {url}: {e}"))?;
    let feed_lane = crate::reserve::feeds::FeedLane::Redis(crate::reserve::feeds::RedisLane::new(
        lane_conn,
        format!("gw-{:016x}", rand::random::<u64>()),
        config.feeds.claim_after,
    ));
    Ok(Stores {
        queue: QueueBackend::Redis(queue),
        inventory: Sharded::new(InventoryBackend::Redis(inventory)),
        invites,
        accounts,
        feed_lane,
    })
}
