//! Criterion benches of the simulator: seed 003 (50,000 visitors at once,
//! 200/s) and the scale target (3,000,000 at once, 5,000/s; under
//! 10 s on the reference machine). The 3M run prints its wall time once
//! before sampling, so `cargo bench --bench sim -- 3m` also answers the
//! question quickly.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_admission::RoomSettings;
use sluice_admission::sim::{Arrivals, SimConfig, run};

fn spike(visitors: u64, rate: f64) -> SimConfig {
    SimConfig {
        visitors,
        arrivals: Arrivals::Spike,
        room: RoomSettings {
            rate_per_sec: rate,
            burst: rate,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn seed_003(c: &mut Criterion) {
    let cfg = spike(50_000, 200.0);
    c.bench_function("sim/50k_spike_200ps", |b| {
        b.iter(|| run(&cfg, |_| {}).unwrap())
    });
}

fn three_million(c: &mut Criterion) {
    let cfg = spike(3_000_000, 5_000.0);
    let t = Instant::now();
    let r = run(&cfg, |_| {}).unwrap();
    eprintln!(
        "sim/3m_spike_5000ps: one run {:.2} s (drain {:?} s, {} polls)",
        t.elapsed().as_secs_f64(),
        r.drain_seconds,
        r.edge_polls_per_sec.total
    );
    let mut g = c.benchmark_group("sim");
    g.sample_size(10).measurement_time(Duration::from_secs(30));
    g.bench_function("3m_spike_5000ps", |b| b.iter(|| run(&cfg, |_| {}).unwrap()));
    g.finish();
}

criterion_group!(benches, seed_003, three_million);
criterion_main!(benches);
