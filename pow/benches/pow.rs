//! Verify cost and native solve rate, per core.
//!
//! `verify_k16_b18`: one full verification (one HMAC, 16 SHA-256 tails) of
//! a challenge solved once at start. `hash_rate_single_thread`: the native
//! solver's inner loop (one hash and a difficulty check per counter).

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_pow::hash::{PuzzleHasher, meets_difficulty};
use sluice_pow::{ChallengeSpec, Keyset, solve};

const NOW: u64 = 1_800_000_000_000;

fn bench(c: &mut Criterion) {
    let keys = Keyset::from_secret(b"benchmark secret, 32 bytes long!").unwrap();
    let spec = ChallengeSpec {
        room: "flash-sale".into(),
        puzzles: 16,
        difficulty_bits: 18,
        ttl: Duration::from_secs(300),
        min_solve: Duration::ZERO,
    };
    let issued = keys.issue(&spec, NOW).unwrap();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = std::time::Instant::now();
    let solutions = solve(&issued.challenge, 16, 18, threads);
    eprintln!(
        "solved k=16 b=18 with {threads} threads in {:?}",
        started.elapsed()
    );
    keys.verify(&issued.challenge, &solutions, "flash-sale", NOW + 1000)
        .unwrap();

    let mut g = c.benchmark_group("pow");
    g.throughput(Throughput::Elements(1));
    g.bench_function("verify_k16_b18", |b| {
        b.iter(|| {
            keys.verify(
                black_box(&issued.challenge),
                black_box(&solutions),
                "flash-sale",
                NOW + 1000,
            )
            .unwrap()
        })
    });
    g.bench_function("issue", |b| {
        b.iter(|| keys.issue(black_box(&spec), NOW).unwrap())
    });

    let h = PuzzleHasher::new(&issued.challenge, 7);
    let mut n: u64 = 1_000_000;
    g.throughput(Throughput::Elements(1000));
    g.bench_function("hash_rate_single_thread", |b| {
        b.iter(|| {
            let mut hits = 0u32;
            for _ in 0..1000 {
                if meets_difficulty(&h.hash(n), 18) {
                    hits += 1;
                }
                n += 1;
            }
            hits
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
