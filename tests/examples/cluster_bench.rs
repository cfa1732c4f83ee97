//! Holds per second for 8 concurrent events on a 3-shard Redis Cluster
//! against the same on one Redis, in one run (issue 9's bench).
//!
//!   cargo run --release -p sluice-tests --example cluster_bench [seconds=10] [tasks=64]
//!
//! Starts its own `redis-server` processes on free loopback ports, drives
//! `RedisInventory::hold` (the same Lua script the gateway runs) from
//! `tasks` concurrent tasks round-robin over 8 events with stock enough
//! never to sell out, and prints holds/s for each and the ratio. Stops by
//! itself; checks the invariant of every event at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_reservation::{EventId, HoldOutcome, Inventory, RedisConfig, RedisInventory, StockSpec};
use sluice_tests::cluster::RedisCluster;
use sluice_tests::redis_server::RedisServer;

const EVENTS: usize = 8;

async fn run(url: &str, seconds: u64, tasks: usize) -> f64 {
    let inv = RedisInventory::connect(&RedisConfig::new(url))
        .await
        .expect("connect");
    let events: Vec<EventId> = (0..EVENTS)
        .map(|i| EventId::parse(&format!("bench{i}")).unwrap())
        .collect();
    for e in &events {
        inv.set_stock(
            e,
            &StockSpec {
                total: 100_000_000,
                cart_limit: 1_000_000,
                hold_ttl: Duration::from_secs(600),
                version: 1,
                room: "default".into(),
            },
        )
        .await
        .expect("stock");
    }
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let inv = inv.clone();
        let events = events.clone();
        let done = done.clone();
        handles.push(tokio::spawn(async move {
            let mut i = t;
            while Instant::now() < stop {
                let e = &events[i % EVENTS];
                let visitor = format!("v{t}-{i}");
                if let Ok(HoldOutcome::Held(_)) = inv.hold(e, &visitor, 1, None).await {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                i += tasks;
            }
        }));
    }
    let start = Instant::now();
    for h in handles {
        h.await.unwrap();
    }
    let rate = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    for e in &events {
        let s = inv.read(e).await.unwrap().unwrap();
        assert!(s.invariant_holds, "{e:?}: invariant broken");
    }
    rate
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let tasks: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let single = RedisServer::start().expect("redis-server");
    let cluster = RedisCluster::start(3, 0).expect("redis cluster");
    let one = run(&single.url(), seconds, tasks).await;
    let three = run(&cluster.url(), seconds, tasks).await;
    println!("holds/s, {EVENTS} events, {tasks} tasks, {seconds} s each, one client process:");
    println!("  one Redis          {one:>10.0}");
    println!("  3-shard cluster    {three:>10.0}");
    println!("  cluster / single   {:>10.2}", three / one);
}
