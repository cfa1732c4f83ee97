//! Holds per second through the stores.
//!
//! - `memory/hold`: one task, sequential holds on the in-memory store.
//! - `redis/hold_seq`: one hold at a time through `RedisInventory` (latency
//!   bound: one round trip each).
//! - `redis/hold_64`: 64 tasks over one multiplexed connection (throughput).
//!
//! Redis: `SLUICE_BENCH_REDIS=redis://host:port/` to use a running server,
//! otherwise a private `redis-server` is started (skipped when missing).
//! Every hold is a distinct visitor, qty 1, on stock that never runs out:
//! the same script path as `bench/hold_script.sh` drives with
//! `redis-benchmark`, so the two figures compare directly.

#![allow(clippy::unwrap_used)]

#[path = "../../tests/src/redis_server.rs"]
#[allow(unreachable_pub)] // shared with the crates that export it
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_reservation::{
    EventId, HoldOutcome, Inventory, MemoryInventory, RedisConfig, RedisInventory, StockSpec,
};

fn spec() -> StockSpec {
    StockSpec {
        total: 1 << 50,
        cart_limit: 4,
        hold_ttl: Duration::from_secs(600),
        version: 1,
        room: "default".into(),
    }
}

static VISITOR: AtomicU64 = AtomicU64::new(0);

async fn one_hold<I: Inventory>(inv: &I, ev: &EventId) {
    let v = VISITOR.fetch_add(1, Ordering::Relaxed);
    let out = inv.hold(ev, &format!("v{v}"), 1, None).await.unwrap();
    assert!(matches!(out, HoldOutcome::Held(_)), "{out:?}");
}

fn bench_memory(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inv = MemoryInventory::new();
    let ev = EventId::parse("bench-memory").unwrap();
    rt.block_on(inv.set_stock(&ev, &spec())).unwrap();
    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Elements(1));
    g.bench_function("hold", |b| b.iter(|| rt.block_on(one_hold(&inv, &ev))));
    g.finish();
}

fn bench_redis(c: &mut Criterion) {
    let (url, _server) = match std::env::var("SLUICE_BENCH_REDIS") {
        Ok(url) => (url, None),
        Err(_) => match redis_server::RedisServer::start() {
            Some(s) => (s.url(), Some(s)),
            None => return,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let inv = rt
        .block_on(RedisInventory::connect(&RedisConfig::new(url)))
        .unwrap();
    let ev = EventId::parse(&format!("bench-{}", std::process::id())).unwrap();
    rt.block_on(async {
        inv.load_scripts().await.unwrap();
        inv.set_stock(&ev, &spec()).await.unwrap();
    });
    eprintln!("hold.lua sha1 {}", inv.hold_script_sha());
    let mut g = c.benchmark_group("redis");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("hold_seq", |b| b.iter(|| rt.block_on(one_hold(&inv, &ev))));
    let inv = Arc::new(inv);
    g.bench_function("hold_64", |b| {
        b.iter_custom(|iters| {
            let inv = inv.clone();
            let ev = ev.clone();
            rt.block_on(async move {
                let next = Arc::new(AtomicU64::new(0));
                let start = Instant::now();
                let mut tasks = Vec::new();
                for _ in 0..64 {
                    let (inv, ev, next) = (inv.clone(), ev.clone(), next.clone());
                    tasks.push(tokio::spawn(async move {
                        while next.fetch_add(1, Ordering::Relaxed) < iters {
                            one_hold(&*inv, &ev).await;
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench_memory, bench_redis);
criterion_main!(benches);
