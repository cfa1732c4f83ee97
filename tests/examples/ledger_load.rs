//! The sale of `tests/bench/ledger.sh`: holds through [`RedisInventory`]
//! directly (no HTTP), and the ledger's lag watched while it runs.
//!
//! Usage:
//!
//! - `ledger_load REDIS_URL EVENT fill N` — loads the event (stock that
//!   never runs out) and takes N holds as fast as it can, each then paid,
//!   failed, released or left to lapse (about 2 stream entries per hold);
//!   prints `entries=<stream length>`.
//! - `ledger_load REDIS_URL EVENT sale RATE SECONDS` — holds at RATE per
//!   second (paced per 10 ms tick) for SECONDS while sampling the ledger's
//!   lag every second; prints the holds/s reached and the lag (max and
//!   mean, entries and seconds), then how long the ledger took to catch up.
//! - `ledger_load REDIS_URL EVENT wait` — waits until the ledger's lag on
//!   EVENT is zero; prints the seconds it took.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_ledger::stream;
use sluice_reservation::{EventId, HoldOutcome, Inventory, RedisConfig, RedisInventory, StockSpec};

const TASKS: usize = 64;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, event, mode) = match args.as_slice() {
        [u, e, m, ..] => (u.clone(), e.clone(), m.clone()),
        _ => anyhow::bail!("usage: ledger_load REDIS_URL EVENT fill N | sale RATE SECONDS | wait"),
    };
    let event = EventId::parse(&event).ok_or_else(|| anyhow::anyhow!("bad event id"))?;
    let mut config = RedisConfig::new(&url);
    config.stream_maxlen = 100_000_000;
    let inv = RedisInventory::connect(&config).await?;
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    match mode.as_str() {
        "fill" => {
            let n: u64 = args
                .get(3)
                .map(|s| s.parse())
                .transpose()?
                .unwrap_or(100_000);
            load(&inv, &event).await?;
            let started = Instant::now();
            run(&inv, &event, n, None, Duration::from_secs(3600)).await;
            let len: u64 = redis::cmd("XLEN")
                .arg(stream::stream_key(&event))
                .query_async(&mut conn)
                .await?;
            println!(
                "holds={n} seconds={:.2} entries={len}",
                started.elapsed().as_secs_f64()
            );
        }
        "sale" => {
            let rate: u64 = args
                .get(3)
                .map(|s| s.parse())
                .transpose()?
                .unwrap_or(20_000);
            let secs: u64 = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(20);
            load(&inv, &event).await?;
            let sampler = {
                let mut conn = conn.clone();
                let event = event.clone();
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    for _ in 0..secs {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        if let Ok(l) = stream::stream_lag(&mut conn, &event).await {
                            samples.push((l.entries, l.seconds));
                        }
                    }
                    samples
                })
            };
            let started = Instant::now();
            let held = run(
                &inv,
                &event,
                rate * secs,
                Some(rate),
                Duration::from_secs(secs),
            )
            .await;
            let elapsed = started.elapsed().as_secs_f64();
            let samples = sampler.await?;
            let max_e = samples.iter().map(|s| s.0).max().unwrap_or(0);
            let max_s = samples.iter().map(|s| s.1).fold(0.0, f64::max);
            let n = samples.len().max(1) as f64;
            let mean_e = samples.iter().map(|s| s.0 as f64).sum::<f64>() / n;
            let mean_s = samples.iter().map(|s| s.1).sum::<f64>() / n;
            let catch = wait(&mut conn, &event).await;
            println!(
                "holds={held} holds_per_s={:.0} lag_max_entries={max_e} lag_mean_entries={mean_e:.0} \
                 lag_max_s={max_s:.2} lag_mean_s={mean_s:.2} catch_up_s={catch:.2}",
                held as f64 / elapsed
            );
        }
        "wait" => {
            let s = wait(&mut conn, &event).await;
            println!("caught_up_s={s:.2}");
        }
        other => anyhow::bail!("unknown mode {other}"),
    }
    Ok(())
}

async fn load(inv: &RedisInventory, event: &EventId) -> anyhow::Result<()> {
    let spec = StockSpec {
        total: 1 << 50,
        cart_limit: 1000,
        hold_ttl: Duration::from_secs(2),
        version: 1,
        room: "default".into(),
    };
    inv.set_stock(event, &spec).await?;
    Ok(())
}

/// Takes up to `n` holds (paced to `rate` per second when given) until
/// `limit`; returns the holds taken.
async fn run(
    inv: &RedisInventory,
    event: &EventId,
    n: u64,
    rate: Option<u64>,
    limit: Duration,
) -> u64 {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (inv, event, next) = (inv.clone(), event.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut held = 0u64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || started.elapsed() >= limit {
                    break;
                }
                if let Some(r) = rate {
                    // Hold i is due at i / rate seconds.
                    let due = Duration::from_secs_f64(i as f64 / r as f64);
                    let now = started.elapsed();
                    if due > now {
                        tokio::time::sleep(due - now).await;
                    }
                }
                let visitor = format!("v{t}-{i}");
                if let Ok(HoldOutcome::Held(h)) = inv.hold(&event, &visitor, 1, None).await {
                    held += 1;
                    let pay = format!("pay-{i}");
                    let _ = match i % 4 {
                        0 => inv.confirm(&h.hold_id, &pay, true).await.map(|_| ()),
                        1 => inv.confirm(&h.hold_id, &pay, false).await.map(|_| ()),
                        2 => inv.release(&h.hold_id, &visitor).await.map(|_| ()),
                        _ => Ok(()),
                    };
                }
            }
            held
        }));
    }
    let mut held = 0;
    for t in tasks {
        held += t.await.unwrap_or(0);
    }
    held
}

/// Seconds until the ledger's lag on `event` is zero (at most 300).
async fn wait(conn: &mut redis::aio::MultiplexedConnection, event: &EventId) -> f64 {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(300) {
        if let Ok(l) = stream::stream_lag(conn, event).await
            && l.grouped
            && l.entries == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed().as_secs_f64()
}
