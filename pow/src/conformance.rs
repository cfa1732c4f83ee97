//! The replay-guard conformance suite (feature `test-util`).
//!
//! Every [`ReplayStore`] backend must pass [`run_all`]; each check is also
//! public so a failing one can be run alone. Ids are random per call, so a
//! shared Redis needs no cleanup between runs.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use crate::guard::ReplayStore;

fn fresh_id() -> [u8; 16] {
    rand::random()
}

/// Runs every check against `guard`.
pub async fn run_all<G: ReplayStore + 'static>(guard: Arc<G>) {
    first_use_then_replay(&*guard).await;
    ids_are_independent(&*guard).await;
    expires_after_ttl(&*guard).await;
    notes_live_and_die_with_the_id(&*guard).await;
    released_ids_redeem_again(&*guard).await;
    concurrent_redemption_accepts_once(guard.clone(), 64).await;
    many_ids_race(guard).await;
}

/// A released id (a redemption whose purchase failed) is accepted once
/// more, its note gone with it; other ids are untouched.
pub async fn released_ids_redeem_again<G: ReplayStore>(guard: &G) {
    let (a, b) = (fresh_id(), fresh_id());
    let ttl = Duration::from_secs(60);
    assert!(guard.consume_once(&a, ttl).await.unwrap());
    assert!(guard.consume_once(&b, ttl).await.unwrap());
    guard.note(&a, "7:1:v").await.unwrap();
    guard.release(&a).await.unwrap();
    assert_eq!(guard.noted(&a).await.unwrap(), None);
    assert!(
        guard.consume_once(&a, ttl).await.unwrap(),
        "released: first use again"
    );
    assert!(!guard.consume_once(&a, ttl).await.unwrap());
    assert!(
        !guard.consume_once(&b, ttl).await.unwrap(),
        "another id kept"
    );
    // releasing an unknown id is harmless
    guard.release(&fresh_id()).await.unwrap();
}

/// The first use of an id is accepted, every later one refused.
pub async fn first_use_then_replay<G: ReplayStore>(guard: &G) {
    let id = fresh_id();
    let ttl = Duration::from_secs(30);
    assert!(
        guard.consume_once(&id, ttl).await.unwrap(),
        "first use must pass"
    );
    assert!(
        !guard.consume_once(&id, ttl).await.unwrap(),
        "second use is a replay"
    );
    assert!(
        !guard.consume_once(&id, ttl).await.unwrap(),
        "third use is a replay"
    );
}

/// Consuming one id does not consume another, even one differing in a bit.
pub async fn ids_are_independent<G: ReplayStore>(guard: &G) {
    let a = fresh_id();
    let mut b = a;
    b[15] ^= 1;
    let mut c = a;
    c[0] ^= 0x80;
    let ttl = Duration::from_secs(30);
    assert!(guard.consume_once(&a, ttl).await.unwrap());
    assert!(guard.consume_once(&b, ttl).await.unwrap());
    assert!(guard.consume_once(&c, ttl).await.unwrap());
}

/// After its TTL an id is forgotten (the challenge has expired by then, so
/// forgetting it is safe).
pub async fn expires_after_ttl<G: ReplayStore>(guard: &G) {
    let id = fresh_id();
    let ttl = Duration::from_millis(50);
    assert!(guard.consume_once(&id, ttl).await.unwrap());
    assert!(!guard.consume_once(&id, ttl).await.unwrap());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        guard.consume_once(&id, ttl).await.unwrap(),
        "expired id must be accepted again"
    );
}

/// A note is kept only for a recorded id, read back as written, does not
/// make the id consumable again, and goes when the id expires.
pub async fn notes_live_and_die_with_the_id<G: ReplayStore>(guard: &G) {
    let id = fresh_id();
    let ttl = Duration::from_millis(300);
    guard.note(&id, "before").await.unwrap();
    assert_eq!(
        guard.noted(&id).await.unwrap(),
        None,
        "no note without the id"
    );
    assert!(guard.consume_once(&id, ttl).await.unwrap());
    assert_eq!(guard.noted(&id).await.unwrap(), None, "no note yet");
    guard.note(&id, "7:1:visitor-a").await.unwrap();
    assert_eq!(
        guard.noted(&id).await.unwrap().as_deref(),
        Some("7:1:visitor-a")
    );
    assert!(
        !guard.consume_once(&id, ttl).await.unwrap(),
        "a noted id is still consumed"
    );
    let other = fresh_id();
    assert_eq!(guard.noted(&other).await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(guard.noted(&id).await.unwrap(), None, "gone with the id");
}

/// `tasks` tasks race to redeem one id: exactly one wins.
pub async fn concurrent_redemption_accepts_once<G: ReplayStore + 'static>(
    guard: Arc<G>,
    tasks: usize,
) {
    let id = fresh_id();
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let guard = guard.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                guard
                    .consume_once(&id, Duration::from_secs(30))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut wins = 0;
    for h in handles {
        if h.await.unwrap() {
            wins += 1;
        }
    }
    assert_eq!(
        wins, 1,
        "exactly one of {tasks} racing redemptions must win"
    );
}

/// 16 ids, each raced by 8 tasks: each id wins exactly once.
pub async fn many_ids_race<G: ReplayStore + 'static>(guard: Arc<G>) {
    let ids: Vec<[u8; 16]> = (0..16).map(|_| fresh_id()).collect();
    let mut handles = Vec::new();
    for _ in 0..8 {
        for (i, id) in ids.iter().enumerate() {
            let guard = guard.clone();
            let id = *id;
            handles.push(tokio::spawn(async move {
                (
                    i,
                    guard
                        .consume_once(&id, Duration::from_secs(30))
                        .await
                        .unwrap(),
                )
            }));
        }
    }
    let mut wins = [0u32; 16];
    for h in handles {
        let (i, won) = h.await.unwrap();
        if won {
            wins[i] += 1;
        }
    }
    assert_eq!(wins, [1; 16]);
}
