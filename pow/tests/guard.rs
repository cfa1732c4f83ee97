//! The replay-guard conformance suite against both backends, and `redeem`
//! end to end: one place per solution, and no store write before full
//! verification.

#![allow(clippy::unwrap_used)]

#[path = "../../tests/src/redis_server.rs"]
#[allow(unreachable_pub)] // shared with the crates that export it
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_pow::{
    ChallengeSpec, GuardError, Keyset, MemoryReplayGuard, PowError, RedisReplayGuard, ReplayGuard,
    ReplayStore, conformance, redeem, solve,
};

const NOW: u64 = 1_800_000_000_000;

async fn redis_guard(server: &redis_server::RedisServer) -> RedisReplayGuard {
    let url = sluice_redis::RedisUrl::parse(&server.url()).unwrap();
    RedisReplayGuard::new(url.connect(Duration::from_secs(1)).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_guard_conformance() {
    conformance::run_all(Arc::new(MemoryReplayGuard::default())).await;
    conformance::run_all(Arc::new(ReplayGuard::memory())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_guard_conformance() {
    let Some(server) = redis_server::RedisServer::start() else {
        return;
    };
    let guard = redis_guard(&server).await;
    conformance::run_all(Arc::new(guard.clone())).await;
    conformance::run_all(Arc::new(ReplayGuard::Redis(guard))).await;
}

#[tokio::test]
async fn redis_key_schema_and_ttl() {
    let Some(server) = redis_server::RedisServer::start() else {
        return;
    };
    let guard = redis_guard(&server).await;
    let id = [0xab; 16];
    let key = guard.key(&id);
    assert_eq!(key, "sluice:pow:{abab}:abababababababababababababababab");
    assert!(
        guard
            .consume_once(&id, Duration::from_secs(90))
            .await
            .unwrap()
    );
    let pttl = server.command(&format!("PTTL {key}"));
    let ms: i64 = pttl.trim().trim_start_matches(':').parse().unwrap();
    assert!((80_000..=90_000).contains(&ms), "{pttl}");
}

#[tokio::test]
async fn redis_down_is_a_store_error() {
    let Some(mut server) = redis_server::RedisServer::start() else {
        return;
    };
    let guard = redis_guard(&server).await;
    server.kill();
    let keys = Keyset::random();
    let c = keys.issue(&spec(), NOW).unwrap();
    let sol = solve(&c.challenge, 2, 4, 1);
    let e = redeem(&keys, &guard, &c.challenge, &sol, "drop", NOW)
        .await
        .unwrap_err();
    assert!(matches!(e, PowError::Store(GuardError::Redis(_))), "{e}");
    assert_eq!(e.code(), "store_unavailable");
}

fn spec() -> ChallengeSpec {
    ChallengeSpec {
        room: "drop".into(),
        puzzles: 2,
        difficulty_bits: 4,
        ttl: Duration::from_secs(60),
        min_solve: Duration::ZERO,
    }
}

/// Counts writes, to prove a refused challenge never reaches the store.
#[derive(Default)]
struct CountingGuard {
    inner: MemoryReplayGuard,
    writes: AtomicUsize,
}

impl ReplayStore for CountingGuard {
    async fn consume_once(&self, id: &[u8; 16], ttl: Duration) -> Result<bool, GuardError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.consume_once(id, ttl).await
    }

    async fn note(&self, id: &[u8; 16], note: &str) -> Result<(), GuardError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.note(id, note).await
    }

    async fn noted(&self, id: &[u8; 16]) -> Result<Option<String>, GuardError> {
        self.inner.noted(id).await
    }

    async fn release(&self, id: &[u8; 16]) -> Result<(), GuardError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.release(id).await
    }
}

#[tokio::test]
async fn redeem_writes_only_after_full_verification() {
    let keys = Keyset::random();
    let guard = CountingGuard::default();
    let c = keys.issue(&spec(), NOW).unwrap();
    let sol = solve(&c.challenge, 2, 4, 1);
    let bad_sol = vec![sol[0].clone(), "x".to_string()];
    let cases: Vec<(&str, Vec<String>, &str, u64)> = vec![
        ("garbage", sol.clone(), "drop", NOW),
        (&c.challenge, sol.clone(), "other", NOW),
        (&c.challenge, sol.clone(), "drop", NOW + 60_000),
        (&c.challenge, sol.clone(), "drop", NOW - 10_000),
        (&c.challenge, sol[..1].to_vec(), "drop", NOW),
        (&c.challenge, bad_sol, "drop", NOW),
    ];
    for (ch, s, room, now) in cases {
        assert!(redeem(&keys, &guard, ch, &s, room, now).await.is_err());
    }
    assert_eq!(
        guard.writes.load(Ordering::SeqCst),
        0,
        "refused requests wrote to the store"
    );
    let v = redeem(&keys, &guard, &c.challenge, &sol, "drop", NOW + 1)
        .await
        .unwrap();
    assert_eq!(v.id, c.id);
    assert_eq!(guard.writes.load(Ordering::SeqCst), 1);
    let e = redeem(&keys, &guard, &c.challenge, &sol, "drop", NOW + 2)
        .await
        .unwrap_err();
    assert!(matches!(e, PowError::Replayed));
    assert_eq!(e.code(), "pow_replayed");
}

async fn racing_redemptions(guard: ReplayGuard) {
    let keys = Arc::new(Keyset::random());
    let c = keys.issue(&spec(), NOW).unwrap();
    let sol = Arc::new(solve(&c.challenge, 2, 4, 1));
    let guard = Arc::new(guard);
    let challenge = Arc::new(c.challenge);
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (keys, guard, challenge, sol, barrier) = (
                keys.clone(),
                guard.clone(),
                challenge.clone(),
                sol.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                redeem(&keys, &*guard, &challenge, &sol, "drop", NOW + 10).await
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert!(matches!(e, PowError::Replayed), "{e}"),
        }
    }
    assert_eq!(ok, 1, "one solution buys one place");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_place_per_solution_memory() {
    racing_redemptions(ReplayGuard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_place_per_solution_redis_across_gateways() {
    let Some(server) = redis_server::RedisServer::start() else {
        return;
    };
    // Two "gateways": two connection managers, one Redis.
    let a = ReplayGuard::Redis(redis_guard(&server).await);
    racing_redemptions(a).await;
    let keys = Keyset::from_secret(b"shared gateway secret!").unwrap();
    let g1 = redis_guard(&server).await;
    let g2 = redis_guard(&server).await;
    let c = keys.issue(&spec(), NOW).unwrap();
    let sol = solve(&c.challenge, 2, 4, 1);
    assert!(
        redeem(&keys, &g1, &c.challenge, &sol, "drop", NOW)
            .await
            .is_ok()
    );
    let e = redeem(&keys, &g2, &c.challenge, &sol, "drop", NOW)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "pow_replayed");
}
