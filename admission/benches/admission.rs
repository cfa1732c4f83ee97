//! Criterion benches: token sign and verify (raw and cached), the memory
//! store's join and advance, and the pure bucket.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use jsonwebtoken::{Algorithm, Header};
use sluice_admission::bucket::{Bucket, BucketParams};
use sluice_admission::{
    AdmitClaims, Keyring, ManualClock, MemoryQueueStore, QueueClaims, RoomSettings, VerifyCache,
    new_visitor_id,
};

const NOW: u64 = 1_800_000_000;

fn tokens(c: &mut Criterion) {
    let ring = Keyring::ephemeral();
    let claims = QueueClaims::new(
        "sale",
        &new_visitor_id(),
        123_456,
        7,
        NOW,
        Duration::from_secs(3600),
    );
    let admit = AdmitClaims::new("sale", &new_visitor_id(), 7, NOW, Duration::from_secs(300));
    let token = ring.sign_queue(&claims).unwrap();
    let mut g = c.benchmark_group("tokens");
    g.bench_function("sign_queue (cached dalek key)", |b| {
        b.iter(|| ring.sign_queue(&claims).unwrap())
    });
    g.bench_function("sign_admit (cached dalek key)", |b| {
        b.iter(|| ring.sign_admit(&admit).unwrap())
    });
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(ring.signing_kid().to_owned());
    g.bench_function("jsonwebtoken::encode (cached EncodingKey)", |b| {
        b.iter(|| jsonwebtoken::encode(&header, &claims, ring.encoding_key()).unwrap())
    });
    g.bench_function("verify_queue (raw)", |b| {
        b.iter(|| ring.verify_queue(&token, "sale", NOW).unwrap())
    });
    let cache = VerifyCache::default();
    cache.verify_queue(&ring, &token, "sale", NOW).unwrap();
    g.bench_function("verify_queue (cached)", |b| {
        b.iter(|| cache.verify_queue(&ring, &token, "sale", NOW).unwrap())
    });
    g.finish();
}

fn store(c: &mut Criterion) {
    let clock = ManualClock::new(0);
    let store = MemoryQueueStore::new(Arc::new(clock.clone()));
    let s = RoomSettings {
        rate_per_sec: 1000.0,
        burst: 10.0,
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        use sluice_admission::QueueStore;
        store.configure("r", &s).await.unwrap();
    });
    let mut g = c.benchmark_group("memory store");
    g.bench_function("join", |b| b.iter(|| store.join_now("r").unwrap()));
    g.bench_function("advance (1 ms tick)", |b| {
        b.iter(|| {
            clock.advance_ms(1);
            store.advance_now("r").unwrap()
        })
    });
    g.finish();
    let p = BucketParams::from_settings(&s);
    let mut bucket = Bucket::new(0, &p);
    let mut now = 0;
    c.bench_function("bucket join+advance", |b| {
        b.iter(|| {
            now += 1;
            bucket.advance(now, &p, u64::MAX, 0);
            bucket.join(&p, u64::MAX)
        })
    });
}

criterion_group!(benches, tokens, store);
criterion_main!(benches);
