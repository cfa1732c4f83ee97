//! The store conformance suite: every [`QueueStore`] must pass it.
//!
//! Each check is an `async fn` over a [`Harness`] (a store plus a way to
//! let time pass and to lose the store's state); each uses its own room, so
//! one store can run them all. [`crate::conformance_tests!`] expands to one
//! `#[tokio::test]` per check:
//!
//! ```ignore
//! sluice_admission::conformance_tests!(make_harness());
//! ```
//!
//! where `make_harness()` is an `async fn` returning `Option<H>` (`None`
//! skips, e.g. without `redis-server`). In virtual time (memory store and a
//! [`crate::ManualClock`]) the checks are exact; in real time (Redis) they
//! allow a tolerance and keep each check to a few seconds.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use crate::error::AdmissionError;
use crate::lanes::{Lane, LaneMode};
use crate::settings::{QueueMethod, RoomSettings};
use crate::store::{
    AdmitOutcome, ClaimOutcome, Floors, JoinOnce, QueueStore, Snapshot, Solution, Spend,
};

/// A store under test and control over its world.
pub trait Harness: Send {
    /// The store.
    type Store: QueueStore + Clone + 'static;
    /// A handle to the store (clones share state).
    fn store(&self) -> Self::Store;
    /// Lets `d` pass on the store's clock: instantly in virtual time, by
    /// sleeping in real time.
    fn elapse(&self, d: Duration) -> impl Future<Output = ()> + Send;
    /// Whether the store runs on real time (checks widen their tolerance).
    fn real_time(&self) -> bool;
    /// Makes the store lose every room's state, as Redis restarted empty.
    fn lose_state(&mut self) -> impl Future<Output = ()> + Send;
}

fn settings(rate: f64, burst: f64) -> RoomSettings {
    RoomSettings {
        rate_per_sec: rate,
        burst,
        ..Default::default()
    }
}

fn floors(tail: u64, frontier: u64) -> Floors {
    Floors {
        tail,
        frontier,
        epoch: 0,
    }
}

async fn setup<H: Harness>(h: &H, room: &str, s: &RoomSettings) -> H::Store {
    let store = h.store();
    store.configure(room, s).await.unwrap();
    store
}

/// Retries an operation a few times (a store that just restarted may refuse
/// the first calls while the client reconnects).
async fn retry<T, F, Fut>(mut f: F) -> Result<T, AdmissionError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, AdmissionError>>,
{
    let mut last = None;
    for _ in 0..50 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e @ (AdmissionError::Store(_) | AdmissionError::StoreTimeout(_))) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap())
}

/// Nobody waits and credit remains: joins pass at once, up to the burst.
pub async fn passthrough<H: Harness>(h: &mut H) {
    let room = "c-passthrough";
    let store = setup(h, room, &settings(0.01, 3.0)).await;
    for seq in 1..=3 {
        let j = store.join(room).await.unwrap();
        assert_eq!((j.seq, j.admitted), (seq, true), "join {seq}");
        assert_eq!(j.position(), 0);
    }
    let j = store.join(room).await.unwrap();
    assert_eq!(j.seq, 4);
    assert!(!j.admitted);
    assert_eq!(j.position(), 1);
    let s = store.snapshot(room).await.unwrap();
    assert_eq!((s.tail, s.frontier, s.queue_length()), (4, 3, 1));
    assert_eq!(s.joins_total, 4);
    assert_eq!(s.admitted_total, 3);
    // passthrough places are claimed by the join itself
    assert_eq!(s.claimed_total, 3);
    assert_eq!(
        store.claim(room, 2).await.unwrap(),
        ClaimOutcome::AlreadyClaimed
    );
}

/// `queue_all`: a join at an idle room with credit takes a place and is
/// not admitted by the join; the next advance admits it, in FIFO order; a
/// passthrough (no proof of work) admits nobody. Switching back to FIFO
/// passes through again.
pub async fn method_queue_all<H: Harness>(h: &mut H) {
    let room = "c-queue-all";
    let mut s = RoomSettings {
        method: QueueMethod::QueueAll,
        ..settings(1000.0, 5.0)
    };
    let store = setup(h, room, &s).await;
    assert_eq!(store.passthrough(room).await.unwrap(), None);
    let j = store.join(room).await.unwrap();
    assert_eq!((j.seq, j.admitted), (1, false));
    assert_eq!(
        store.claim(room, 1).await.unwrap(),
        ClaimOutcome::NotAdmitted
    );
    // every later operation is an advance: a join admits those before it
    for seq in 2..=3 {
        let j = store.join(room).await.unwrap();
        assert_eq!((j.seq, j.admitted), (seq, false), "join {seq}");
    }
    let snap = store.advance(room).await.unwrap();
    assert_eq!(
        (snap.tail, snap.frontier),
        (3, 3),
        "the next advance admits"
    );
    assert_eq!(store.claim(room, 1).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(
        store.settings(room).await.unwrap().unwrap().method,
        QueueMethod::QueueAll
    );
    s.method = QueueMethod::Fifo;
    store.configure(room, &s).await.unwrap();
    h.elapse(Duration::from_millis(50)).await;
    assert!(store.join(room).await.unwrap().admitted);
}

/// `reject`: a join is admitted on the spot or refused with
/// [`AdmissionError::Full`], handing out no seq and taking no place.
pub async fn method_reject<H: Harness>(h: &mut H) {
    let room = "c-reject";
    let s = RoomSettings {
        method: QueueMethod::Reject,
        ..settings(0.01, 2.0)
    };
    let store = setup(h, room, &s).await;
    for seq in 1..=2 {
        let j = store.join(room).await.unwrap();
        assert_eq!((j.seq, j.admitted), (seq, true));
    }
    for _ in 0..5 {
        assert!(matches!(
            store.join(room).await,
            Err(AdmissionError::Full(_))
        ));
    }
    assert_eq!(store.passthrough(room).await.unwrap(), None);
    let snap = store.snapshot(room).await.unwrap();
    assert_eq!((snap.tail, snap.frontier, snap.joins_total), (2, 2, 2));
    // the active cap fills a reject room as well
    let capped = "c-reject-cap";
    let s = RoomSettings {
        method: QueueMethod::Reject,
        max_active: Some(1),
        ..settings(1000.0, 10.0)
    };
    let store = setup(h, capped, &s).await;
    assert!(store.join(capped).await.unwrap().admitted);
    assert!(matches!(
        store.join(capped).await,
        Err(AdmissionError::Full(_))
    ));
    assert_eq!(store.snapshot(capped).await.unwrap().tail, 1);
}

fn solution<'a>(id: &'a [u8; 16], sub: &'a str, spent: bool) -> Solution<'a> {
    Solution {
        id,
        ttl: Duration::from_secs(60),
        sub,
        spent,
        lane: None,
    }
}

fn joined(o: crate::store::Result<JoinOnce>) -> crate::store::JoinOutcome {
    match o {
        Ok(JoinOnce::Joined(j)) => j,
        other => panic!("expected a place, got {other:?}"),
    }
}

/// `join_once`: a solution buys one place, and a replay of it gets that
/// place's note, changing nothing; a join that hands out nothing (closed,
/// full) records nothing; `spend_solution` + `join_once(spent)` for joins
/// with steps between; `release_solution` lets it pay again; the record
/// goes with its ttl.
pub async fn solution_buys_one_place<H: Harness>(h: &mut H) {
    let room = "c-once";
    let mut s = settings(0.01, 1.0);
    let store = setup(h, room, &s).await;
    let (a, b, c, d) = ([1u8; 16], [2u8; 16], [3u8; 16], [4u8; 16]);
    // admitted at once (the one credit): recorded, with no place to give back
    let j = joined(store.join_once(room, solution(&a, "v-a", false)).await);
    assert_eq!((j.seq, j.admitted), (1, true));
    assert_eq!(
        store
            .join_once(room, solution(&a, "v-x", false))
            .await
            .unwrap(),
        JoinOnce::Replayed { note: None }
    );
    // a place in line: its note comes back to every replay
    let j = joined(store.join_once(room, solution(&b, "v-b", false)).await);
    assert_eq!((j.seq, j.admitted), (2, false));
    let note = Some(format!("2:{}:v-b", j.epoch));
    for _ in 0..3 {
        assert_eq!(
            store
                .join_once(room, solution(&b, "v-y", false))
                .await
                .unwrap(),
            JoinOnce::Replayed { note: note.clone() }
        );
    }
    assert_eq!(
        store
            .spend_solution(room, &b, Duration::from_secs(60))
            .await
            .unwrap(),
        Spend::Replayed { note: note.clone() }
    );
    let snap = store.snapshot(room).await.unwrap();
    assert_eq!((snap.tail, snap.joins_total), (2, 2), "no second place");
    // the solution's own join again (a store that went back): a new
    // place, noted over the old one
    let j = joined(store.join_once(room, solution(&b, "v-b2", true)).await);
    assert_eq!(j.seq, 3);
    assert_eq!(
        store
            .join_once(room, solution(&b, "v-y", false))
            .await
            .unwrap(),
        JoinOnce::Replayed {
            note: Some(format!("3:{}:v-b2", j.epoch))
        }
    );
    // a closed room takes nothing: the solution stays good
    s.closed = true;
    store.configure(room, &s).await.unwrap();
    assert!(matches!(
        store.join_once(room, solution(&c, "v-c", false)).await,
        Err(AdmissionError::Closed(_))
    ));
    s.closed = false;
    store.configure(room, &s).await.unwrap();
    assert_eq!(
        joined(store.join_once(room, solution(&c, "v-c", false)).await).seq,
        4
    );
    // spent first, then joined as its own; released, it pays again
    let ttl = Duration::from_secs(60);
    assert_eq!(
        store.spend_solution(room, &d, ttl).await.unwrap(),
        Spend::First
    );
    assert_eq!(
        store.spend_solution(room, &d, ttl).await.unwrap(),
        Spend::Replayed { note: None }
    );
    assert_eq!(
        store
            .join_once(room, solution(&d, "v-z", false))
            .await
            .unwrap(),
        JoinOnce::Replayed { note: None },
        "spent, not joined yet: no place to give back"
    );
    let j = joined(store.join_once(room, solution(&d, "v-d", true)).await);
    assert_eq!(
        store.spend_solution(room, &d, ttl).await.unwrap(),
        Spend::Replayed {
            note: Some(format!("{}:{}:v-d", j.seq, j.epoch))
        }
    );
    store.release_solution(room, &d).await.unwrap();
    assert_eq!(
        store.spend_solution(room, &d, ttl).await.unwrap(),
        Spend::First
    );
    // forgotten after its ttl
    let e = [5u8; 16];
    let short = Solution {
        ttl: Duration::from_millis(200),
        ..solution(&e, "v-e", false)
    };
    let first = joined(store.join_once(room, short).await).seq;
    h.elapse(Duration::from_millis(400)).await;
    assert!(joined(store.join_once(room, short).await).seq > first);
    // a reject room that is full takes nothing, the solution included
    let full = "c-once-reject";
    let s = RoomSettings {
        method: QueueMethod::Reject,
        ..settings(0.01, 1.0)
    };
    let store = setup(h, full, &s).await;
    let f = [6u8; 16];
    assert!(
        joined(
            store
                .join_once(full, solution(&[7u8; 16], "v", false))
                .await
        )
        .admitted
    );
    assert!(matches!(
        store.join_once(full, solution(&f, "v-f", false)).await,
        Err(AdmissionError::Full(_))
    ));
    assert_eq!(
        store.spend_solution(full, &f, ttl).await.unwrap(),
        Spend::First
    );
    assert_eq!(store.snapshot(full).await.unwrap().tail, 1);
    assert!(matches!(
        store
            .join_once("c-once-never", solution(&f, "v", false))
            .await,
        Err(AdmissionError::RoomNotFound(_))
    ));
}

/// The same solutions sent at once from many callers: each buys exactly
/// one place, and every other call gets that place's note.
pub async fn solution_replays_race<H: Harness>(h: &mut H) {
    let room = "c-once-race";
    let store = setup(h, room, &settings(0.01, 1.0)).await;
    assert!(store.join(room).await.unwrap().admitted, "the one credit");
    const IDS: u8 = 8;
    const CALLERS: usize = 12;
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let st = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..IDS {
                let id = [i; 16];
                let sub = format!("v-{caller}");
                let o = st
                    .join_once(room, solution(&id, &sub, false))
                    .await
                    .unwrap();
                got.push((i, sub, o));
            }
            got
        }));
    }
    let mut places: Vec<Vec<String>> = vec![Vec::new(); IDS as usize];
    let mut notes: Vec<Vec<String>> = vec![Vec::new(); IDS as usize];
    for t in tasks {
        for (i, sub, o) in t.await.unwrap() {
            match o {
                JoinOnce::Joined(j) => {
                    assert!(!j.admitted);
                    places[i as usize].push(format!("{}:{}:{sub}", j.seq, j.epoch));
                }
                JoinOnce::Replayed { note } => notes[i as usize].push(note.expect("a place")),
            }
        }
    }
    for i in 0..IDS as usize {
        assert_eq!(places[i].len(), 1, "solution {i} bought {:?}", places[i]);
        assert_eq!(notes[i].len(), CALLERS - 1);
        assert!(
            notes[i].iter().all(|n| *n == places[i][0]),
            "{:?}",
            notes[i]
        );
    }
    let snap = store.snapshot(room).await.unwrap();
    let n = u64::from(IDS) + 1;
    assert_eq!((snap.tail, snap.joins_total), (n, n));
}

/// `join_once_many`: each solution of a batch as its own `join_once` would
/// be, in order: places handed out one after another, a solution sent
/// twice in one batch a replay of itself, a spent one joined with its note
/// written over, a lane the room lacks refused for that join alone; a
/// closed room refuses each and records none; a room without state
/// refuses the whole.
pub async fn joins_sent_together<H: Harness>(h: &mut H) {
    let room = "c-many";
    let mut s = settings(0.0, 1.0);
    let store = setup(h, room, &s).await;
    assert!(store.join_once_many(room, &[]).await.unwrap().is_empty());
    let (a, b, c, d) = ([11u8; 16], [12u8; 16], [13u8; 16], [14u8; 16]);
    let lane0 = Solution {
        lane: Some(0),
        ..solution(&d, "v-d", false)
    };
    let got = store
        .join_once_many(
            room,
            &[
                solution(&a, "v-a", false),
                solution(&b, "v-b", false),
                solution(&a, "v-a2", false),
                solution(&b, "v-b2", false),
                lane0,
                solution(&c, "v-c", true),
            ],
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 6);
    let mut got = got.into_iter();
    let j = joined(got.next().unwrap());
    assert_eq!((j.seq, j.admitted), (1, true), "the one credit");
    let epoch = j.epoch;
    let j = joined(got.next().unwrap());
    assert_eq!((j.seq, j.admitted), (2, false));
    assert_eq!(
        got.next().unwrap().unwrap(),
        JoinOnce::Replayed { note: None },
        "a, again in the same batch"
    );
    assert_eq!(
        got.next().unwrap().unwrap(),
        JoinOnce::Replayed {
            note: Some(format!("2:{epoch}:v-b"))
        },
        "b, again in the same batch"
    );
    assert!(matches!(
        got.next().unwrap(),
        Err(AdmissionError::LaneNotFound(_))
    ));
    let j = joined(got.next().unwrap());
    assert_eq!((j.seq, j.admitted), (3, false), "c, spent by its caller");
    // what the batch recorded, every later replay sees
    assert_eq!(
        store
            .join_once(room, solution(&c, "v-x", false))
            .await
            .unwrap(),
        JoinOnce::Replayed {
            note: Some(format!("3:{epoch}:v-c"))
        }
    );
    // the lane's refusal recorded nothing: d still pays, once
    let j = joined(store.join_once(room, solution(&d, "v-d", false)).await);
    assert_eq!(j.seq, 4);
    let snap = store.snapshot(room).await.unwrap();
    assert_eq!((snap.tail, snap.joins_total), (4, 4));

    // closed: each refused, none recorded
    s.closed = true;
    store.configure(room, &s).await.unwrap();
    let e = [15u8; 16];
    let got = store
        .join_once_many(
            room,
            &[solution(&e, "v-e", false), solution(&e, "v-e", false)],
        )
        .await
        .unwrap();
    assert!(
        got.iter()
            .all(|r| matches!(r, Err(AdmissionError::Closed(_)))),
        "{got:?}"
    );
    s.closed = false;
    store.configure(room, &s).await.unwrap();
    let j = joined(store.join_once(room, solution(&e, "v-e", false)).await);
    assert_eq!(j.seq, 5, "the closed room recorded nothing");

    assert!(matches!(
        h.store()
            .join_once_many("c-many-none", &[solution(&a, "v-a", false)])
            .await,
        Err(AdmissionError::RoomNotFound(_))
    ));
}

/// `join_once_many` against `join_once` one call at a time, on two rooms
/// of the same settings: the same sequence of solutions (drawn from a
/// small pool, so replays, replays within a batch and spent ones are
/// common), cut into batches of 1 to 8, gets the same answer for every
/// solution and leaves the same room.
pub async fn batches_are_joins_one_after_another<H: Harness>(h: &mut H) {
    let (one, many) = ("c-many-one", "c-many-batch");
    let s = settings(0.0, 3.0);
    let store = setup(h, one, &s).await;
    store.configure(many, &s).await.unwrap();
    // a small LCG: the same sequence every run, no dependency
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % n
    };
    // the answer with the epoch left out (the rooms' epochs may differ)
    let plain = |r: crate::store::Result<JoinOnce>| match r {
        Ok(JoinOnce::Joined(j)) => format!("joined {} {} {}", j.seq, j.admitted, j.place),
        Ok(JoinOnce::Replayed { note }) => format!(
            "replayed {:?}",
            note.map(|n| {
                let p: Vec<&str> = n.split(':').collect();
                format!("{}:{}", p[0], p[2])
            })
        ),
        Err(e) => format!("refused {e:?}")
            .replace(one, "R")
            .replace(many, "R"),
    };
    let mut done = 0;
    while done < 120 {
        let n = 1 + next(8) as usize;
        let ids: Vec<[u8; 16]> = (0..n).map(|_| [40 + next(40) as u8; 16]).collect();
        let subs: Vec<String> = (0..n).map(|i| format!("v-{}", done + i)).collect();
        let spent: Vec<bool> = (0..n).map(|_| next(10) == 0).collect();
        let sols: Vec<Solution<'_>> = (0..n)
            .map(|i| solution(&ids[i], &subs[i], spent[i]))
            .collect();
        let mut alone = Vec::new();
        for sol in &sols {
            alone.push(plain(store.join_once(one, *sol).await));
        }
        let together: Vec<String> = store
            .join_once_many(many, &sols)
            .await
            .unwrap()
            .into_iter()
            .map(plain)
            .collect();
        assert_eq!(alone, together, "batch from solution {done}");
        done += n;
    }
    let (a, b) = (
        store.snapshot(one).await.unwrap(),
        store.snapshot(many).await.unwrap(),
    );
    assert_eq!(
        (a.tail, a.frontier, a.joins_total, a.admitted_total),
        (b.tail, b.frontier, b.joins_total, b.admitted_total)
    );
}

/// Seqs come out in order and are admitted in order.
pub async fn fifo<H: Harness>(h: &mut H) {
    let room = "c-fifo";
    let store = setup(h, room, &settings(20.0, 1.0)).await;
    let mut seqs = Vec::new();
    for _ in 0..30 {
        seqs.push(store.join(room).await.unwrap().seq);
    }
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
    let mut frontier = 0;
    for _ in 0..6 {
        h.elapse(Duration::from_millis(200)).await;
        let s = store.advance(room).await.unwrap();
        assert!(s.frontier >= frontier);
        frontier = s.frontier;
        for seq in 1..=30 {
            let c = store.claim(room, seq).await.unwrap();
            assert_eq!(
                c.is_admitted(),
                seq <= frontier,
                "seq {seq} frontier {frontier}"
            );
        }
    }
    assert!(frontier > 1);
}

/// A paused room takes joins and admits nobody; resuming admits at most the
/// burst at once.
pub async fn paused<H: Harness>(h: &mut H) {
    let room = "c-paused";
    let mut s = settings(100.0, 5.0);
    s.paused = true;
    let store = setup(h, room, &s).await;
    for _ in 0..50 {
        let j = store.join(room).await.unwrap();
        assert!(!j.admitted);
    }
    h.elapse(Duration::from_millis(500)).await;
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.frontier, 0);
    assert!(snap.paused);
    assert!(snap.credit <= 5.0);
    s.paused = false;
    let snap = store.configure(room, &s).await.unwrap();
    let snap = if snap.frontier == 0 {
        store.advance(room).await.unwrap()
    } else {
        snap
    };
    // at most the burst (+ what a real clock earns between the two calls)
    let slack = if h.real_time() { 3 } else { 0 };
    assert!(
        snap.frontier >= 5 && snap.frontier <= 5 + slack,
        "{}",
        snap.frontier
    );
}

/// Credit saved while nobody waits is capped at the burst.
pub async fn burst<H: Harness>(h: &mut H) {
    let room = "c-burst";
    let store = setup(h, room, &settings(50.0, 4.0)).await;
    h.elapse(Duration::from_millis(1_000)).await;
    let snap = store.advance(room).await.unwrap();
    assert!(snap.credit <= 4.0 + 1e-9);
    let mut admitted = 0;
    for _ in 0..20 {
        if store.join(room).await.unwrap().admitted {
            admitted += 1;
        }
    }
    let slack = if h.real_time() { 2 } else { 0 };
    assert!((4..=4 + slack).contains(&admitted), "{admitted}");
}

/// The frontier advances at the rate: 50/s over 2 s.
pub async fn rate_over_time<H: Harness>(h: &mut H) {
    let room = "c-rate";
    let store = setup(h, room, &settings(50.0, 1.0)).await;
    for _ in 0..300 {
        store.join(room).await.unwrap();
    }
    let start = store.advance(room).await.unwrap();
    for _ in 0..20 {
        h.elapse(Duration::from_millis(100)).await;
        store.advance(room).await.unwrap();
    }
    let end = store.advance(room).await.unwrap();
    let secs = (end.store_now_ms - start.store_now_ms) as f64 / 1000.0;
    let admitted = (end.frontier - start.frontier) as f64;
    let expected = 50.0 * secs;
    if h.real_time() {
        assert!((admitted - expected).abs() <= 3.0, "{admitted} in {secs} s");
        assert!((1.8..3.0).contains(&secs), "{secs}");
    } else {
        assert_eq!(admitted, 100.0);
    }
    assert_eq!(end.admitted_total, end.frontier);
}

/// A settings change settles credit at the old rate first.
pub async fn configure_reanchors<H: Harness>(h: &mut H) {
    let room = "c-reanchor";
    let mut s = settings(10.0, 1.0);
    let store = setup(h, room, &s).await;
    for _ in 0..500 {
        store.join(room).await.unwrap();
    }
    let a = store.advance(room).await.unwrap();
    h.elapse(Duration::from_millis(1_000)).await;
    s.rate_per_sec = 200.0;
    let b = store.configure(room, &s).await.unwrap();
    // the second at 10/s is settled at 10/s, not 200/s
    let secs = (b.store_now_ms - a.store_now_ms) as f64 / 1000.0;
    let got = (b.frontier - a.frontier) as f64;
    assert!((got - 10.0 * secs).abs() <= 1.5, "{got} in {secs} s");
    assert_eq!(b.rate_per_sec, 200.0);
    h.elapse(Duration::from_millis(500)).await;
    let c = store.advance(room).await.unwrap();
    let secs = (c.store_now_ms - b.store_now_ms) as f64 / 1000.0;
    let got = (c.frontier - b.frontier) as f64;
    assert!((got - 200.0 * secs).abs() <= 2.0, "{got} in {secs} s");
}

/// An admitted place not claimed within the window gives its slot back
/// once; a late claim is honoured and takes it back.
pub async fn no_show_refund<H: Harness>(h: &mut H) {
    let room = "c-noshow";
    let mut s = settings(10.0, 1.0);
    s.claim_window = Duration::from_secs(1);
    let store = setup(h, room, &s).await;
    for _ in 0..100 {
        store.join(room).await.unwrap(); // seq 1 passes through
    }
    h.elapse(Duration::from_millis(1_000)).await;
    let a = store.advance(room).await.unwrap();
    let batch = a.frontier - 1;
    assert!(batch >= 9, "{batch}");
    assert_eq!(a.pending_claims, batch);
    assert_eq!(store.claim(room, 2).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(store.claim(room, 3).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(
        store.claim(room, 3).await.unwrap(),
        ClaimOutcome::AlreadyClaimed
    );
    assert_eq!(
        store.claim(room, 99).await.unwrap(),
        ClaimOutcome::NotAdmitted
    );
    assert_eq!(
        store.claim(room, 0).await.unwrap(),
        ClaimOutcome::NotAdmitted
    );
    let b = store.snapshot(room).await.unwrap();
    assert_eq!(b.pending_claims, batch - 2);
    assert_eq!(b.claimed_total, 3);
    // the window passes: the batch's unclaimed slots come back
    h.elapse(Duration::from_millis(1_100)).await;
    let c = store.advance(room).await.unwrap();
    assert_eq!(c.refunded_total, batch - 2);
    let secs = (c.store_now_ms - a.store_now_ms) as f64 / 1000.0;
    let earned = 10.0 * secs;
    let got = (c.frontier - a.frontier) as f64;
    let expected = earned + (batch - 2) as f64;
    assert!((got - expected).abs() <= 1.5, "{got} vs {expected}");
    // once only
    let d = store.advance(room).await.unwrap();
    assert_eq!(d.refunded_total, batch - 2);
    // a late claim is honoured and counted
    assert_eq!(store.claim(room, 4).await.unwrap(), ClaimOutcome::Late);
    assert_eq!(
        store.claim(room, 4).await.unwrap(),
        ClaimOutcome::AlreadyClaimed
    );
    let e = store.snapshot(room).await.unwrap();
    assert_eq!(e.late_claims_total, 1);
    assert!(e.credit < d.credit);
}

/// Sessions count against max_active; ending one frees its slot at once;
/// expired ones stop counting.
pub async fn sessions_and_max_active<H: Harness>(h: &mut H) {
    let room = "c-sessions";
    let mut s = settings(100.0, 5.0);
    s.max_active = Some(2);
    let store = setup(h, room, &s).await;
    let ttl = Duration::from_secs(60);
    // a place admitted at once starts its own session ({epoch}.{seq}); the
    // gateway's start is a renewal
    let a = store.join(room).await.unwrap();
    assert!(a.admitted);
    assert_eq!(store.snapshot(room).await.unwrap().active_sessions, 1);
    let sa = crate::session_of(a.epoch, a.seq);
    assert_eq!(store.session_start(room, &sa, ttl).await.unwrap(), 1);
    let b = store.join(room).await.unwrap();
    assert!(b.admitted);
    let sb = crate::session_of(b.epoch, b.seq);
    assert_eq!(store.session_start(room, &sb, ttl).await.unwrap(), 2);
    let c = store.join(room).await.unwrap();
    assert!(!c.admitted, "the cap holds a third visitor back");
    h.elapse(Duration::from_millis(200)).await;
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.frontier, 2);
    assert_eq!(snap.active_sessions, 2);
    assert_eq!(snap.max_active, Some(2));
    assert!(store.session_touch(room, &sa, ttl).await.unwrap());
    assert!(!store.session_touch(room, "nobody", ttl).await.unwrap());
    assert!(store.session_end(room, &sa).await.unwrap());
    assert!(!store.session_end(room, &sa).await.unwrap());
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.frontier, 3, "revoke freed a slot");
    assert_eq!(snap.pending_claims, 1);
    // an admitted but unclaimed place holds its slot: nobody else gets in
    store.join(room).await.unwrap();
    h.elapse(Duration::from_millis(200)).await;
    assert_eq!(store.advance(room).await.unwrap().frontier, 3);
    assert_eq!(store.claim(room, 3).await.unwrap(), ClaimOutcome::Claimed);
    // a short session expires and stops counting
    assert_eq!(
        store
            .session_start(room, "sc", Duration::from_secs(1))
            .await
            .unwrap(),
        2
    );
    h.elapse(Duration::from_millis(1_200)).await;
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.active_sessions, 1);
    assert_eq!(snap.frontier, 4);
}

/// A store that lost its state: recovery never reissues a seq nor moves a
/// position back, and the epoch changes.
pub async fn lost_store_reseed<H: Harness>(h: &mut H) {
    let room = "c-lost";
    let s = settings(20.0, 2.0);
    let store = setup(h, room, &s).await;
    let mut seen = HashSet::new();
    for _ in 0..40 {
        seen.insert(store.join(room).await.unwrap().seq);
    }
    h.elapse(Duration::from_millis(300)).await;
    let before = store.advance(room).await.unwrap();
    // reseed never lowers
    let same = store.reseed(room, 1, 1).await.unwrap();
    assert_eq!((same.tail, same.frontier), (before.tail, before.frontier));
    h.lose_state().await;
    let store = h.store();
    match retry(|| store.join(room)).await {
        Err(AdmissionError::RoomNotFound(r)) => assert_eq!(r, room),
        other => panic!("expected RoomNotFound, got {other:?}"),
    }
    assert!(matches!(
        store.reseed(room, 1, 1).await,
        Err(AdmissionError::RoomNotFound(_))
    ));
    assert_eq!(store.settings(room).await.unwrap(), None);
    // a gateway pushes back the highest values it saw
    let floors = Floors {
        tail: before.tail,
        frontier: before.frontier,
        epoch: before.epoch,
    };
    let after = store.recover(room, &s, floors).await.unwrap();
    assert_eq!(after.carried_epoch, before.epoch);
    assert_eq!(after.carried_tail, before.tail);
    assert!(after.covers(before.epoch, before.tail));
    assert!(!after.covers(before.epoch, before.tail + 1));
    assert!(
        !after.covers(after.epoch + 1, 1),
        "a newer epoch: the store went back"
    );
    assert!(after.tail >= before.tail);
    assert!(after.frontier >= before.frontier);
    assert!(
        after.epoch > before.epoch,
        "{} > {}",
        after.epoch,
        before.epoch
    );
    // another gateway saw more of the lost epoch: before anyone joins the
    // new state, its floors widen the coverage
    let wider = Floors {
        tail: before.tail + 3,
        ..floors
    };
    let after = store.recover(room, &s, wider).await.unwrap();
    assert_eq!(after.carried_tail, before.tail + 3);
    assert!(after.covers(before.epoch, before.tail + 3));
    for _ in 0..10 {
        let j = store.join(room).await.unwrap();
        assert!(j.seq > before.tail + 3);
        assert!(seen.insert(j.seq), "seq {} reissued", j.seq);
        assert_eq!(j.epoch, after.epoch);
    }
    // a second gateway with older values changes nothing
    let older = Floors {
        tail: 5,
        frontier: 3,
        epoch: 1,
    };
    let again = store.recover(room, &s, older).await.unwrap();
    assert!(again.tail >= before.tail + 10);
    assert_eq!(again.epoch, after.epoch);
    assert_eq!(again.carried_epoch, before.epoch, "coverage is set once");
}

/// A closed room refuses joins and admits nobody.
pub async fn closed_room<H: Harness>(h: &mut H) {
    let room = "c-closed";
    let mut s = settings(100.0, 5.0);
    let store = setup(h, room, &s).await;
    store.join(room).await.unwrap();
    s.closed = true;
    store.configure(room, &s).await.unwrap();
    assert!(matches!(
        store.join(room).await,
        Err(AdmissionError::Closed(_))
    ));
    assert!(store.snapshot(room).await.unwrap().closed);
    assert!(matches!(
        store.join("c-never-configured").await,
        Err(AdmissionError::RoomNotFound(_))
    ));
    assert!(matches!(
        store.join("bad{room}").await,
        Err(AdmissionError::InvalidRoomId(_) | AdmissionError::RoomNotFound(_))
    ));
}

/// What configure stored comes back from `settings` (calibrated).
pub async fn settings_roundtrip<H: Harness>(h: &mut H) {
    let room = "c-settings";
    let s = RoomSettings {
        capacity_rps: Some(1000.0),
        safety_margin: 0.2,
        requests_per_visitor_per_sec: 4.0,
        session_length: Some(Duration::from_secs(30)),
        claim_window: Duration::from_secs(45),
        ..Default::default()
    };
    let store = h.store();
    let snap = store.configure(room, &s).await.unwrap();
    assert_eq!(snap.rate_per_sec, 200.0);
    assert_eq!(snap.max_active, Some(6_000));
    let back = store.settings(room).await.unwrap().unwrap();
    assert_eq!(back.rate_per_sec, 200.0);
    assert_eq!(back.capacity_rps, Some(1000.0));
    assert_eq!(back.claim_window, Duration::from_secs(45));
    assert_eq!(store.settings("c-none").await.unwrap(), None);
    let bad = RoomSettings {
        burst: 0.0,
        ..Default::default()
    };
    assert!(matches!(
        store.configure(room, &bad).await,
        Err(AdmissionError::InvalidSetting(_))
    ));
}

/// Many tasks joining at once get unique, gap-free seqs.
pub async fn concurrent_joins<H: Harness>(h: &mut H) {
    let room = "c-concurrent";
    let store = setup(h, room, &settings(5.0, 3.0)).await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let st = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut v = Vec::new();
            for _ in 0..50 {
                v.push(st.join(room).await.unwrap().seq);
            }
            v
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let v = t.await.unwrap();
        assert!(v.windows(2).all(|w| w[0] < w[1]), "a task's seqs increase");
        all.extend(v);
    }
    all.sort_unstable();
    assert_eq!(all, (1..=1000).collect::<Vec<_>>());
    let s = store.snapshot(room).await.unwrap();
    assert_eq!((s.tail, s.joins_total), (1000, 1000));
}

/// `snapshot` changes nothing; concurrent `advance` calls split the time.
pub async fn snapshot_is_read_only<H: Harness>(h: &mut H) {
    let room = "c-snapshot";
    let store = setup(h, room, &settings(100.0, 1.0)).await;
    for _ in 0..500 {
        store.join(room).await.unwrap();
    }
    let a = store.advance(room).await.unwrap();
    h.elapse(Duration::from_millis(300)).await;
    let b = store.snapshot(room).await.unwrap();
    assert_eq!(b.frontier, a.frontier);
    assert_eq!(b.credit, a.credit);
    // ten gateways advance at once: together they earn what one would
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let st = store.clone();
        tasks.push(tokio::spawn(async move { st.advance(room).await.unwrap() }));
    }
    let mut last: Option<Snapshot> = None;
    for t in tasks {
        let s = t.await.unwrap();
        if last
            .as_ref()
            .is_none_or(|l| s.store_now_ms >= l.store_now_ms)
        {
            last = Some(s);
        }
    }
    let c = store.advance(room).await.unwrap();
    let secs = (c.store_now_ms - a.store_now_ms) as f64 / 1000.0;
    let got = (c.frontier - a.frontier) as f64;
    assert!((got - 100.0 * secs).abs() <= 1.5, "{got} in {secs} s");
}

/// A room with its opening `in_ms` after the store's clock, and a seed.
async fn scheduled<H: Harness>(h: &H, room: &str, s: &mut RoomSettings, in_ms: u64) -> H::Store {
    let store = setup(h, room, s).await;
    let now = store.snapshot(room).await.unwrap().store_now_ms;
    s.opens_at_ms = Some(now + in_ms);
    s.prequeue_seed = Some(crate::prequeue::new_seed_hex());
    let snap = store.configure(room, s).await.unwrap();
    assert!(snap.prequeue_open);
    assert_eq!(snap.opens_at_ms, s.opens_at_ms);
    store
}

/// Lets store time pass until the opening (and a little more).
async fn until_open<H: Harness>(h: &H, store: &H::Store, room: &str, opens_ms: u64) {
    loop {
        let now = store.snapshot(room).await.unwrap().store_now_ms;
        if now >= opens_ms + 10 {
            return;
        }
        h.elapse(Duration::from_millis((opens_ms + 10 - now).min(200)))
            .await;
    }
}

/// A scheduled room: before the opening joins get pre-queue tickets and
/// nobody is admitted; the first operation after it records the draw once
/// (n = the tail then); then the frontier moves at the rate, later joins
/// come after every ticket, and claims count places.
pub async fn prequeue<H: Harness>(h: &mut H) {
    let room = "c-prequeue";
    let mut s = settings(20.0, 3.0);
    let store = scheduled(h, room, &mut s, 1_500).await;
    let opens = s.opens_at_ms.unwrap();
    for seq in 1..=30 {
        let j = store.join(room).await.unwrap();
        assert_eq!((j.seq, j.admitted, j.prequeue), (seq, false, true));
    }
    h.elapse(Duration::from_millis(600)).await;
    let snap = store.advance(room).await.unwrap();
    if snap.store_now_ms < opens {
        assert_eq!(snap.frontier, 0, "no admission before the opening");
        assert!(snap.prequeue_open);
        assert_eq!(snap.prequeue_draw, None);
        // a settings change keeps the pre-queue open
        s.rate_per_sec = 25.0;
        let snap = store.configure(room, &s).await.unwrap();
        assert!(snap.prequeue_open);
    }
    until_open(h, &store, room, opens).await;
    // snapshot writes nothing: the draw waits for an operation
    let snap = store.advance(room).await.unwrap();
    assert!(!snap.prequeue_open);
    let draw = snap.prequeue_draw.unwrap();
    assert_eq!(
        draw,
        crate::PrequeueDraw {
            from: 0,
            n: 30,
            k: 0
        }
    );
    // credit is earned from the opening only: at most the burst at once
    // plus the rate since the opening
    let since = (snap.store_now_ms - opens) as f64 / 1000.0;
    assert!(
        snap.frontier as f64 <= 3.0 + 25.0 * since + 1.0,
        "{} in {since} s",
        snap.frontier
    );
    let late = store.join(room).await.unwrap();
    assert_eq!((late.seq, late.prequeue, late.admitted), (31, false, false));
    // the draw is set once: settings changes and joins leave it alone, and
    // a new opening does not replace it while its tickets wait
    let again = store.configure(room, &s).await.unwrap();
    assert_eq!(again.prequeue_draw, Some(draw));
    assert_eq!(again.opens_at_ms, Some(opens));
    let mut moved = s.clone();
    moved.opens_at_ms = Some(again.store_now_ms + 60_000);
    let again = store.configure(room, &moved).await.unwrap();
    assert_eq!(again.prequeue_draw, Some(draw));
    assert!(!again.prequeue_open);
    store.configure(room, &s).await.unwrap();
    // places are admitted in order; claims count places
    h.elapse(Duration::from_millis(400)).await;
    let snap = store.advance(room).await.unwrap();
    assert!(snap.frontier >= 1);
    assert_eq!(snap.prequeue_draw, Some(draw));
    let map = crate::PlaceMap::new(
        &crate::prequeue::from_hex(s.prequeue_seed.as_deref().unwrap()).unwrap(),
        draw,
    );
    let mut places: Vec<u64> = (1..=31).map(|seq| map.place(seq)).collect();
    assert_eq!(places[30], 31, "a late joiner keeps its seq as place");
    places.sort_unstable();
    assert_eq!(places, (1..=31).collect::<Vec<_>>());
    assert_eq!(store.claim(room, 1).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(
        store.claim(room, snap.frontier + 1).await.unwrap(),
        ClaimOutcome::NotAdmitted
    );
}

/// Joins racing the opening: each is either a ticket of the draw or after
/// it, never both, and the draw counts exactly the tickets.
pub async fn prequeue_race<H: Harness>(h: &mut H) {
    let room = "c-prequeue-race";
    let mut s = settings(5.0, 1.0);
    let store = scheduled(h, room, &mut s, 300).await;
    let opens = s.opens_at_ms.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let st = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut v = Vec::new();
            let mut after = 0;
            while after < 10 && v.len() < 3_000 {
                let j = st.join(room).await.unwrap();
                assert!(!j.admitted || !j.prequeue);
                after += usize::from(!j.prequeue);
                v.push((j.seq, j.prequeue));
                tokio::task::yield_now().await;
            }
            v
        }));
    }
    until_open(h, &store, room, opens).await;
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let draw = store.advance(room).await.unwrap().prequeue_draw.unwrap();
    assert_eq!(draw.from, 0);
    let tickets = all.iter().filter(|(_, pre)| *pre).count() as u64;
    assert_eq!(draw.n, tickets);
    for (seq, pre) in all {
        assert_eq!(pre, seq <= draw.n, "seq {seq}");
    }
}

/// A store that lost its state around a scheduled opening: before it, the
/// recovered room keeps its pre-queue open; after it, a gateway's record of
/// the draw (the settings' hint) restores it, and a store that drew on its
/// own keeps its draw.
pub async fn prequeue_lost_store<H: Harness>(h: &mut H) {
    let room = "c-prequeue-lost";
    let mut s = settings(10.0, 1.0);
    let store = scheduled(h, room, &mut s, 800).await;
    let opens = s.opens_at_ms.unwrap();
    for _ in 0..12 {
        store.join(room).await.unwrap();
    }
    h.lose_state().await;
    let store = h.store();
    let snap = retry(|| store.recover(room, &s, floors(12, 0)))
        .await
        .unwrap();
    assert!(snap.prequeue_open || snap.store_now_ms >= opens);
    let j = store.join(room).await.unwrap();
    assert_eq!(j.seq, 13);
    until_open(h, &store, room, opens).await;
    let draw = store.advance(room).await.unwrap().prequeue_draw.unwrap();
    assert_eq!(
        draw,
        crate::PrequeueDraw {
            from: 0,
            n: 13,
            k: 0
        }
    );
    // lost again after the opening: the hint restores the draw
    h.lose_state().await;
    let store = h.store();
    let mut hinted = s.clone();
    hinted.prequeue_draw = Some(draw);
    let snap = retry(|| store.recover(room, &hinted, floors(14, 2)))
        .await
        .unwrap();
    assert_eq!(snap.prequeue_draw, Some(draw));
    assert!(!snap.prequeue_open);
    // the store's own draw wins over a different hint
    hinted.prequeue_draw = Some(crate::PrequeueDraw {
        from: 0,
        n: 99,
        k: 0,
    });
    let snap = store.configure(room, &hinted).await.unwrap();
    assert_eq!(snap.prequeue_draw, Some(draw));
}

/// A `random` room draws again and again ([`crate::prequeue`], "Rolling
/// draws"): nothing is drawn while it is paused; a draw orders everyone
/// waiting; the frontier never passes it; the next one is made once it is
/// exhausted and a second has passed, from where it ended, with the next
/// index; `draw_of` finds each seq's draw; a store that lost its state takes
/// the current draw back from a gateway's hint and goes on counting.
pub async fn method_random<H: Harness>(h: &mut H) {
    use crate::PrequeueDraw;
    let room = "c-random";
    let mut s = settings(1000.0, 50.0);
    s.method = QueueMethod::Random;
    s.prequeue_seed = Some("11".repeat(32));
    s.paused = true;
    let store = setup(h, room, &s).await;
    for seq in 1..=30 {
        let j = store.join(room).await.unwrap();
        assert_eq!((j.seq, j.admitted), (seq, false));
    }
    let snap = store.advance(room).await.unwrap();
    assert_eq!((snap.frontier, snap.prequeue_draw), (0, None));
    s.paused = false;
    store.configure(room, &s).await.unwrap();
    let snap = store.advance(room).await.unwrap();
    let d1 = PrequeueDraw {
        from: 0,
        n: 30,
        k: 1,
    };
    assert_eq!(snap.prequeue_draw, Some(d1));
    assert_eq!(snap.frontier, 30, "the burst admits the draw, not more");
    let drawn_at = snap.store_now_ms;
    for seq in 31..=40 {
        let j = store.join(room).await.unwrap();
        assert_eq!(
            (j.seq, j.admitted),
            (seq, false),
            "nobody joins on the spot"
        );
    }
    let snap = store.advance(room).await.unwrap();
    if snap.store_now_ms < drawn_at + crate::room::DRAW_EVERY_MS {
        assert_eq!(snap.prequeue_draw, Some(d1));
        assert_eq!(snap.frontier, 30, "never past the draw");
    }
    h.elapse(Duration::from_millis(1_100)).await;
    let snap = store.advance(room).await.unwrap();
    let d2 = PrequeueDraw {
        from: 30,
        n: 10,
        k: 2,
    };
    assert_eq!(snap.prequeue_draw, Some(d2));
    assert_eq!(snap.frontier, 40);
    for seq in [1, 17, 30] {
        assert_eq!(
            store.draw_of(room, seq).await.unwrap(),
            Some(d1),
            "seq {seq}"
        );
    }
    for seq in [31, 40] {
        assert_eq!(
            store.draw_of(room, seq).await.unwrap(),
            Some(d2),
            "seq {seq}"
        );
    }
    assert_eq!(store.draw_of(room, 41).await.unwrap(), None);
    assert_eq!(store.draw_of(room, 0).await.unwrap(), None);
    // places are the draws' own range: claims count them as ever
    assert_eq!(store.claim(room, 35).await.unwrap(), ClaimOutcome::Claimed);
    // lost: the hint brings the current draw back, and the count goes on
    h.lose_state().await;
    let store = h.store();
    let mut hinted = s.clone();
    hinted.prequeue_draw = Some(d2);
    let snap = retry(|| store.recover(room, &hinted, floors(40, 40)))
        .await
        .unwrap();
    assert_eq!(snap.prequeue_draw, Some(d2));
    assert_eq!(store.draw_of(room, 35).await.unwrap(), Some(d2));
    // (the recovered state does not know when d2 was made: the second join
    // may already draw the first alone)
    store.join(room).await.unwrap();
    store.join(room).await.unwrap();
    h.elapse(Duration::from_millis(1_100)).await;
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.frontier, 42);
    let d3 = store.draw_of(room, 41).await.unwrap().unwrap();
    assert_eq!((d3.from, d3.k), (40, 3));
    let last = store.draw_of(room, 42).await.unwrap().unwrap();
    assert!(
        last == d3
            || last
                == PrequeueDraw {
                    from: 41,
                    n: 1,
                    k: 4
                }
    );
    // the hinted draw is kept as one the room made
    assert_eq!(store.draw_of(room, 35).await.unwrap(), Some(d2));
    // switched to FIFO and scheduled: the pre-queue's draw goes on counting
    // (a gateway places seqs before a draw of index 0 as their own)
    let k = last.k;
    let mut fifo = s.clone();
    fifo.method = QueueMethod::Fifo;
    fifo.opens_at_ms = Some(snap.store_now_ms + 1_500);
    let snap = store.configure(room, &fifo).await.unwrap();
    assert!(snap.prequeue_open, "{snap:?}");
    for _ in 0..3 {
        assert!(store.join(room).await.unwrap().prequeue);
    }
    until_open(h, &store, room, fifo.opens_at_ms.unwrap()).await;
    let snap = store.advance(room).await.unwrap();
    assert_eq!(
        snap.prequeue_draw,
        Some(PrequeueDraw {
            from: 42,
            n: 3,
            k: k + 1
        })
    );
    assert_eq!(store.draw_of(room, 41).await.unwrap(), Some(d3));

    // draws older than lane_keep are forgotten (no token of them is valid)
    let room = "c-random-keep";
    let mut s = settings(1000.0, 50.0);
    s.method = QueueMethod::Random;
    s.prequeue_seed = Some("22".repeat(32));
    s.lane_keep = Some(Duration::from_secs(1));
    let store = setup(h, room, &s).await;
    store.join(room).await.unwrap();
    let first = store.advance(room).await.unwrap().prequeue_draw.unwrap();
    assert_eq!((first.from, first.n, first.k), (0, 1, 1));
    assert_eq!(store.draw_of(room, 1).await.unwrap(), Some(first));
    store.join(room).await.unwrap();
    h.elapse(Duration::from_millis(1_100)).await;
    let second = store.advance(room).await.unwrap().prequeue_draw.unwrap();
    assert_eq!((second.from, second.n, second.k), (1, 1, 2));
    assert_eq!(store.draw_of(room, 1).await.unwrap(), None);
    assert_eq!(store.draw_of(room, 2).await.unwrap(), Some(second));
}

/// A `random` room that lost its state takes back the draws the gateways
/// kept ([`QueueStore::keep_draws`]): each once (by its first seq), beside
/// the hinted current draw, so `draw_of` finds them again; a room of
/// another method keeps none.
pub async fn random_draws_handed_back<H: Harness>(h: &mut H) {
    use crate::PrequeueDraw;
    let room = "c-random-back";
    let mut s = settings(1000.0, 50.0);
    s.method = QueueMethod::Random;
    s.prequeue_seed = Some("33".repeat(32));
    let store = setup(h, room, &s).await;
    let d = |from, n, k| PrequeueDraw { from, n, k };
    h.lose_state().await;
    let store2 = h.store();
    let mut hinted = s.clone();
    hinted.prequeue_draw = Some(d(40, 10, 3));
    retry(|| store2.recover(room, &hinted, floors(50, 50)))
        .await
        .unwrap();
    drop(store);
    let store = store2;
    assert_eq!(
        store.draw_of(room, 5).await.unwrap(),
        None,
        "lost with the state"
    );
    let kept = [d(0, 30, 1), d(30, 10, 2), d(40, 10, 3), d(50, 0, 4)];
    store.keep_draws(room, &kept).await.unwrap();
    store.keep_draws(room, &kept[..2]).await.unwrap();
    for (seq, want) in [(1, kept[0]), (30, kept[0]), (31, kept[1]), (45, kept[2])] {
        assert_eq!(
            store.draw_of(room, seq).await.unwrap(),
            Some(want),
            "seq {seq}"
        );
    }
    assert_eq!(store.draw_of(room, 51).await.unwrap(), None);
    // the count goes on from the hinted draw
    store.join(room).await.unwrap();
    store.join(room).await.unwrap();
    h.elapse(Duration::from_millis(1_100)).await;
    store.advance(room).await.unwrap();
    assert_eq!(store.draw_of(room, 51).await.unwrap().map(|x| x.k), Some(4));
    assert_eq!(store.draw_of(room, 31).await.unwrap(), Some(kept[1]));
    // a FIFO room keeps no draws
    let fifo = "c-random-back-fifo";
    setup(h, fifo, &settings(10.0, 1.0)).await;
    store.keep_draws(fifo, &kept).await.unwrap();
    assert_eq!(store.draw_of(fifo, 5).await.unwrap(), None);
}

/// One holder at a time: a lease is taken when free, renewed by its holder,
/// refused to others while it runs, and free again once it expired.
pub async fn steering_lease<H: Harness>(h: &mut H) {
    let room = "c-lease";
    let store = h.store();
    let ttl = Duration::from_millis(400);
    assert!(store.lease(room, "gw-a", ttl).await.unwrap());
    assert!(!store.lease(room, "gw-b", ttl).await.unwrap());
    assert!(store.lease(room, "gw-a", ttl).await.unwrap(), "renewed");
    // another room's lease is independent
    assert!(store.lease("c-lease-2", "gw-b", ttl).await.unwrap());
    h.elapse(Duration::from_millis(250)).await;
    assert!(
        store.lease(room, "gw-a", ttl).await.unwrap(),
        "renewed again"
    );
    h.elapse(Duration::from_millis(250)).await;
    // 500 ms after the first take, but the renewal keeps it gw-a's
    assert!(!store.lease(room, "gw-b", ttl).await.unwrap());
    h.elapse(Duration::from_millis(600)).await;
    assert!(
        store.lease(room, "gw-b", ttl).await.unwrap(),
        "expired: taken over"
    );
    assert!(!store.lease(room, "gw-a", ttl).await.unwrap());
}

/// A shared rate limit ([`QueueStore::take_rate`]): `burst` at once from
/// a rested bucket, then one per interval, across handles of the store (two
/// gateways) and under a crowd of concurrent takes; keys are independent;
/// bad keys and buckets are refused and change nothing.
pub async fn shared_rate<H: Harness>(h: &mut H) {
    let a = h.store();
    let b = h.store();
    // 2 a second, 3 at once: a, b, a, then refused at both
    for (i, s) in [&a, &b, &a].into_iter().enumerate() {
        assert_eq!(
            s.take_rate("c-rate", 2.0, 3).await.unwrap(),
            None,
            "take {i}"
        );
    }
    for s in [&a, &b] {
        let wait = s.take_rate("c-rate", 2.0, 3).await.unwrap();
        let wait = wait.expect("the fourth take at once is refused");
        assert!((1..=500).contains(&wait), "{wait}");
    }
    // another key is another bucket
    assert_eq!(b.take_rate("c-rate-2", 2.0, 1).await.unwrap(), None);
    assert!(b.take_rate("c-rate-2", 2.0, 1).await.unwrap().is_some());
    // bad input: refused, and nothing changed
    for (key, per_sec, burst) in [
        ("c{rate}", 2.0, 3),
        ("", 2.0, 3),
        ("c-rate", 0.0, 3),
        ("c-rate", -1.0, 3),
        ("c-rate", f64::NAN, 3),
        ("c-rate", f64::INFINITY, 3),
        ("c-rate", 2.0, 0),
    ] {
        let e = a.take_rate(key, per_sec, burst).await.unwrap_err();
        assert!(
            matches!(
                e,
                AdmissionError::InvalidRoomId(_) | AdmissionError::InvalidSetting(_)
            ),
            "{key:?} {per_sec} {burst}: {e}"
        );
    }
    // one interval later: one more, then refused again
    h.elapse(Duration::from_millis(520)).await;
    assert_eq!(a.take_rate("c-rate", 2.0, 3).await.unwrap(), None);
    assert!(b.take_rate("c-rate", 2.0, 3).await.unwrap().is_some());

    // a crowd on a rested bucket of 10 (one take every 2 s after): 10 pass
    let mut tasks = Vec::new();
    for i in 0..60 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            s.take_rate("c-rate-crowd", 0.5, 10).await.unwrap()
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    let passed = got.iter().filter(|w| w.is_none()).count();
    if h.real_time() {
        assert!((10..=11).contains(&passed), "{passed} of 60 passed");
    } else {
        assert_eq!(passed, 10, "{got:?}");
    }
}

/// `sold_out` halts admission like a pause (joins take places, nobody is
/// admitted); lifting it resumes. Adaptive state round-trips, and while
/// adaptive admission is on the capacity-derived rate is a ceiling.
pub async fn sold_out_and_adaptive_settings<H: Harness>(h: &mut H) {
    let room = "c-soldout";
    let mut s = settings(1000.0, 1.0);
    s.sold_out = true;
    let store = setup(h, room, &s).await;
    for _ in 0..3 {
        assert!(!store.join(room).await.unwrap().admitted);
    }
    h.elapse(Duration::from_millis(200)).await;
    let snap = store.advance(room).await.unwrap();
    assert_eq!((snap.tail, snap.frontier), (3, 0));
    assert!(store.settings(room).await.unwrap().unwrap().sold_out);
    s.sold_out = false;
    store.configure(room, &s).await.unwrap();
    h.elapse(Duration::from_millis(200)).await;
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.frontier, 3, "resumed");

    let room = "c-adaptive";
    let mut s = RoomSettings {
        capacity_rps: Some(100.0),
        safety_margin: 0.0,
        ..Default::default()
    };
    s.adaptive.enabled = true;
    s.adaptive.mode = "decreasing".into();
    s.adaptive.reason = "p99 812 ms > 500 ms".into();
    s.adaptive.p99_ms = Some(812.0);
    s.adaptive.override_until_ms = 42;
    // a steered rate below the capacity-derived one stays
    s.rate_per_sec = 60.0;
    let snap = h.store().configure(room, &s).await.unwrap();
    assert_eq!(snap.rate_per_sec, 60.0);
    let back = h.store().settings(room).await.unwrap().unwrap();
    assert_eq!(back.adaptive, s.adaptive);
    // one above it is capped
    s.rate_per_sec = 150.0;
    let snap = h.store().configure(room, &s).await.unwrap();
    assert_eq!(snap.rate_per_sec, 100.0);
    // adaptive off: the capacity-derived rate again
    s.adaptive.enabled = false;
    s.rate_per_sec = 60.0;
    let snap = h.store().configure(room, &s).await.unwrap();
    assert_eq!(snap.rate_per_sec, 100.0);
}

/// Passthrough admits on the spot or hands out nothing: never a seq it
/// does not admit, whatever the state (queue, no credit, paused, capped,
/// closed).
pub async fn passthrough_takes_no_place<H: Harness>(h: &mut H) {
    let room = "c-passthrough-only";
    let mut s = settings(0.01, 2.0);
    let store = setup(h, room, &s).await;
    let a = store.passthrough(room).await.unwrap().unwrap();
    assert!(a.admitted);
    assert_eq!((a.seq, a.frontier), (1, 1));
    assert!(store.passthrough(room).await.unwrap().unwrap().admitted);
    // credit spent: nothing, and the tail stays
    for _ in 0..20 {
        assert_eq!(store.passthrough(room).await.unwrap(), None);
    }
    let snap = store.snapshot(room).await.unwrap();
    assert_eq!((snap.tail, snap.frontier), (2, 2));
    // paused, someone waiting: nothing either
    s.burst = 5.0;
    s.rate_per_sec = 1000.0;
    s.version = store.settings(room).await.unwrap().unwrap().version;
    store.update_settings(room, &s).await.unwrap();
    s.version += 1;
    let snap = store.snapshot(room).await.unwrap();
    assert_eq!(snap.tail, 2);
    s.paused = true;
    store.update_settings(room, &s).await.unwrap();
    s.version += 1;
    store.join(room).await.unwrap();
    h.elapse(Duration::from_millis(50)).await;
    assert_eq!(store.passthrough(room).await.unwrap(), None);
    assert_eq!(store.snapshot(room).await.unwrap().tail, 3);
    s.closed = true;
    store.update_settings(room, &s).await.unwrap();
    assert_eq!(store.passthrough(room).await.unwrap(), None);
    assert!(matches!(
        store.passthrough("c-never").await,
        Err(AdmissionError::RoomNotFound(_))
    ));
}

/// Concurrent passthroughs admit exactly the credit there is, and take no
/// other seq.
pub async fn passthrough_race<H: Harness>(h: &mut H) {
    let room = "c-passthrough-race";
    let store = setup(h, room, &settings(0.01, 5.0)).await;
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let st = store.clone();
        tasks.push(tokio::spawn(async move {
            st.passthrough("c-passthrough-race").await.unwrap()
        }));
    }
    let mut admitted = Vec::new();
    for t in tasks {
        if let Some(o) = t.await.unwrap() {
            assert!(o.admitted);
            admitted.push(o.seq);
        }
    }
    admitted.sort_unstable();
    assert_eq!(admitted, vec![1, 2, 3, 4, 5]);
    let snap = store.snapshot(room).await.unwrap();
    assert_eq!((snap.tail, snap.frontier), (5, 5));
}

/// Places admitted on the spot (passthroughs and joins admitted at once)
/// racing at an idle room with credit to spare never push the active
/// sessions past `max_active`: each starts its session in the step that
/// admits it.
pub async fn admissions_at_once_never_pass_the_cap<H: Harness>(h: &mut H) {
    let room = "c-cap-race";
    let mut s = settings(0.01, 20.0);
    s.max_active = Some(3);
    let store = setup(h, room, &s).await;
    let mut tasks = Vec::new();
    for i in 0..120 {
        let st = store.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                st.passthrough(room).await.unwrap().map(|o| o.seq)
            } else {
                let j = st.join(room).await.unwrap();
                j.admitted.then_some(j.seq)
            }
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap().is_some());
    }
    assert_eq!(admitted, 3, "admitted at once past a cap of 3");
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.active_sessions, 3, "{snap:?}");
    assert_eq!(snap.frontier, 3, "a queued place was admitted past the cap");
}

/// One place, one session: claiming an admitted place again resumes the
/// same session (the active count does not grow, a cap holds), and a
/// revoked or expired session spends the place for good.
pub async fn one_place_one_session<H: Harness>(h: &mut H) {
    let room = "c-one-session";
    let mut s = settings(0.01, 3.0);
    s.max_active = Some(3);
    let store = setup(h, room, &s).await;
    for _ in 0..3 {
        store.join(room).await.unwrap();
    }
    let j = store.join(room).await.unwrap();
    assert!(!j.admitted);
    let ttl = Duration::from_secs(30);
    // seq 4 waits; 1..3 passed through (claimed by the join): a claim of
    // them is a resume only for a live session
    assert_eq!(
        store.admit(room, 4, "e.4", ttl).await.unwrap(),
        AdmitOutcome::NotAdmitted
    );
    assert_eq!(
        store.admit(room, 1, "e.1", ttl).await.unwrap(),
        AdmitOutcome::Spent,
        "a claimed place with no session is spent"
    );
    // a place admitted by advance
    let mut s2 = store.settings(room).await.unwrap().unwrap();
    s2.max_active = Some(10);
    s2.rate_per_sec = 1000.0;
    store.update_settings(room, &s2).await.unwrap();
    h.elapse(Duration::from_millis(50)).await;
    assert!(store.advance(room).await.unwrap().frontier >= 4);
    assert_eq!(
        store.admit(room, 4, "e.4", ttl).await.unwrap(),
        AdmitOutcome::Started { late: false }
    );
    let active = store.snapshot(room).await.unwrap().active_sessions;
    for _ in 0..20 {
        assert_eq!(
            store.admit(room, 4, "e.4", ttl).await.unwrap(),
            AdmitOutcome::Resumed
        );
    }
    assert_eq!(store.snapshot(room).await.unwrap().active_sessions, active);
    // revoked: spent, and listed in the ended set
    let before = store.snapshot(room).await.unwrap();
    assert!(store.session_end(room, "e.4").await.unwrap());
    let after = store.snapshot(room).await.unwrap();
    assert_eq!(after.ended_total, before.ended_total + 1);
    assert_eq!(
        store.admit(room, 4, "e.4", ttl).await.unwrap(),
        AdmitOutcome::Spent
    );
    let ended = store.ended_since(room, 0, 100).await.unwrap();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].0, "e.4");
    let at = ended[0].1;
    assert!(
        store
            .ended_since(room, at + 1, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.ended_since(room, at, 100).await.unwrap().len(), 1);
    // ending it again counts once
    assert!(!store.session_end(room, "e.4").await.unwrap());
    assert_eq!(
        store.snapshot(room).await.unwrap().ended_total,
        after.ended_total
    );
    // a session that expired spends its place too
    let j = store.join(room).await.unwrap();
    h.elapse(Duration::from_millis(50)).await;
    store.advance(room).await.unwrap();
    let short = Duration::from_secs(1);
    let sid = format!("e.{}", j.seq);
    if !j.admitted {
        assert_eq!(
            store.admit(room, j.seq, &sid, short).await.unwrap(),
            AdmitOutcome::Started { late: false }
        );
        h.elapse(Duration::from_millis(1_200)).await;
        assert_eq!(
            store.admit(room, j.seq, &sid, short).await.unwrap(),
            AdmitOutcome::Spent
        );
    }
}

/// Settings are written compare-and-set on their version: a writer with a
/// stale copy is refused and changes nothing, and every write bumps it.
pub async fn settings_compare_and_set<H: Harness>(h: &mut H) {
    let room = "c-settings-cas";
    let store = setup(h, room, &settings(10.0, 2.0)).await;
    let a = store.settings(room).await.unwrap().unwrap();
    let v0 = a.version;
    assert!(v0 >= 1);
    assert_eq!(store.snapshot(room).await.unwrap().settings_version, v0);
    let mut first = a.clone();
    first.rate_per_sec = 20.0;
    let mut second = a.clone();
    second.paused = true;
    let snap = store.update_settings(room, &first).await.unwrap();
    assert_eq!(snap.settings_version, v0 + 1);
    match store.update_settings(room, &second).await {
        Err(AdmissionError::SettingsConflict { current }) => assert_eq!(current, v0 + 1),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let now = store.settings(room).await.unwrap().unwrap();
    assert_eq!(now.rate_per_sec, 20.0);
    assert!(!now.paused, "the stale write changed nothing");
    assert_eq!(now.version, v0 + 1);
    // the loser reads again and applies its change on top
    let mut retried = now.clone();
    retried.paused = true;
    store.update_settings(room, &retried).await.unwrap();
    let last = store.settings(room).await.unwrap().unwrap();
    assert!(last.paused && last.rate_per_sec == 20.0);
    // concurrent writers each applying one field: none is lost
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let st = store.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let mut s = st.settings("c-settings-cas").await.unwrap().unwrap();
                s.join_limit_per_prefix_per_min =
                    Some(s.join_limit_per_prefix_per_min.unwrap_or(0) + (1 << i));
                match st.update_settings("c-settings-cas", &s).await {
                    Ok(_) => return,
                    Err(AdmissionError::SettingsConflict { .. }) => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let end = store.settings(room).await.unwrap().unwrap();
    assert_eq!(end.join_limit_per_prefix_per_min, Some(255));
    assert_eq!(end.version, v0 + 2 + 8);
    // an update of a room the store lost does not create it
    assert!(matches!(
        store.update_settings("c-never-cas", &end).await,
        Err(AdmissionError::RoomNotFound(_))
    ));
}

/// A queue token of a lost epoch gets a place of the new one: the same
/// for every ask, never a seq anyone else holds.
pub async fn reseat_is_stable_and_unshared<H: Harness>(h: &mut H) {
    let room = "c-reseat";
    let store = setup(h, room, &settings(0.01, 1.0)).await;
    store.join(room).await.unwrap();
    let mut seqs = HashSet::new();
    for _ in 0..5 {
        assert!(seqs.insert(store.join(room).await.unwrap().seq));
    }
    let ttl = Duration::from_secs(60);
    let r = store.reseat(room, 7, 3, ttl).await.unwrap();
    assert!(!r.admitted);
    assert!(seqs.insert(r.seq), "reseat shares seq {}", r.seq);
    for _ in 0..5 {
        assert_eq!(store.reseat(room, 7, 3, ttl).await.unwrap().seq, r.seq);
    }
    let other = store.reseat(room, 7, 4, ttl).await.unwrap();
    assert!(seqs.insert(other.seq));
    let j = store.join(room).await.unwrap();
    assert!(seqs.insert(j.seq));
    assert!(j.seq > other.seq);
}

fn lanes(weights: &[u32]) -> Vec<Lane> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &weight)| Lane {
            id: format!("l{i}"),
            weight,
        })
        .collect()
}

/// Every admitted lane seq has a place, places grow with lane seqs (FIFO
/// within a lane), no place is shared, and none is given to a seq still
/// waiting; the snapshot's lanes add up to the room's counts.
async fn check_lanes<S: QueueStore>(store: &S, room: &str) -> Snapshot {
    let snap = store.snapshot(room).await.unwrap();
    let mut places = HashSet::new();
    for (i, l) in snap.lanes.iter().enumerate() {
        let mut last = 0;
        for seq in 1..=l.tail {
            let p = store.lane_place(room, i as u8, seq).await.unwrap();
            if seq <= l.frontier {
                let p = p.unwrap_or_else(|| panic!("lane {i} seq {seq} admitted, no place"));
                assert!(p > last, "lane {i}: seq {seq} at place {p} after {last}");
                assert!(p <= snap.frontier);
                assert!(places.insert(p), "place {p} given twice");
                last = p;
            } else {
                assert_eq!(p, None, "lane {i} seq {seq} waits, yet has a place");
            }
        }
    }
    let joined: u64 = snap.lanes.iter().map(|l| l.tail).sum();
    let admitted: u64 = snap.lanes.iter().map(|l| l.frontier).sum();
    assert_eq!(joined, snap.joins_total);
    assert_eq!(admitted, snap.admitted_total);
    assert_eq!(snap.frontier, snap.admitted_total);
    assert_eq!(snap.tail - snap.frontier, joined - admitted);
    snap
}

/// Lanes: joins go to the named lane (the last by default), an unknown
/// lane takes nothing, a 70/30 room admits 70/30 from backlogged lanes
/// (exactly, up to one, whatever the advances), each lane FIFO; admitted
/// places claim as any place does.
pub async fn lanes_weighted<H: Harness>(h: &mut H) {
    let room = "c-lanes";
    let mut s = RoomSettings {
        paused: true,
        lanes: lanes(&[70, 30]),
        ..settings(0.001, 50.0)
    };
    let store = setup(h, room, &s).await;
    for _ in 0..100 {
        let j = store.join_lane(room, Some(0)).await.unwrap();
        assert_eq!((j.lane, j.admitted, j.place), (Some(0), false, 0));
    }
    for i in 1..=100 {
        let j = store.join_lane(room, None).await.unwrap();
        assert_eq!((j.lane, j.seq, j.position()), (Some(1), i, i));
    }
    let plain = store.join(room).await.unwrap();
    assert_eq!((plain.lane, plain.seq), (Some(1), 101));
    // an unknown lane: refused, nothing handed out
    let before = store.snapshot(room).await.unwrap();
    assert!(matches!(
        store.join_lane(room, Some(2)).await,
        Err(AdmissionError::LaneNotFound(_))
    ));
    let id = [42u8; 16];
    let sol = Solution {
        lane: Some(9),
        ..solution(&id, "v", false)
    };
    assert!(matches!(
        store.join_once(room, sol).await,
        Err(AdmissionError::LaneNotFound(_))
    ));
    // ... and the solution was not spent on it
    assert_eq!(
        store
            .spend_solution(room, &id, Duration::from_secs(60))
            .await
            .unwrap(),
        Spend::First
    );
    let after = store.snapshot(room).await.unwrap();
    assert_eq!(
        (after.tail, after.joins_total),
        (before.tail, before.joins_total)
    );
    assert_eq!(after.lanes, before.lanes);
    // a room without lanes has no lane to name
    let plain_room = "c-lanes-none";
    let p = setup(h, plain_room, &settings(1.0, 1.0)).await;
    assert!(matches!(
        p.join_lane(plain_room, Some(0)).await,
        Err(AdmissionError::LaneNotFound(_))
    ));
    assert!(p.snapshot(plain_room).await.unwrap().lanes.is_empty());
    assert_eq!(p.join_lane(plain_room, None).await.unwrap().lane, None);

    // resume: the 50 saved up go 35/15
    s.paused = false;
    store.configure(room, &s).await.unwrap();
    let snap = store.advance(room).await.unwrap();
    let (a, b) = (snap.lanes[0].frontier, snap.lanes[1].frontier);
    let slack = if h.real_time() { 2 } else { 0 };
    assert!((50..=50 + slack).contains(&(a + b)), "{a} + {b}");
    assert!(
        a.abs_diff(35) <= 1 && b.abs_diff(15) <= 1 + slack,
        "{a}/{b}"
    );
    let snap = check_lanes(&store, room).await;
    // an admitted lane seq claims through its place
    let place = store.lane_place(room, 0, 1).await.unwrap().unwrap();
    assert!(matches!(
        store
            .admit(room, place, "s-l0-1", Duration::from_secs(60))
            .await
            .unwrap(),
        AdmitOutcome::Started { .. }
    ));
    assert_eq!(
        store
            .lane_place(room, 0, snap.lanes[0].frontier + 1)
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.lane_place(room, 7, 1).await.unwrap(), None);

    // many advances at a rate: the split stays 70/30 across them
    s.rate_per_sec = 100.0;
    s.burst = 1.0;
    store.configure(room, &s).await.unwrap();
    let start = store.advance(room).await.unwrap();
    for _ in 0..8 {
        h.elapse(Duration::from_millis(100)).await;
        store.advance(room).await.unwrap();
    }
    let end = check_lanes(&store, room).await;
    let da = end.lanes[0].frontier - start.lanes[0].frontier;
    let db = end.lanes[1].frontier - start.lanes[1].frontier;
    let total = da + db;
    assert!(total >= 40, "{total} admitted");
    let exact = total as f64 * 0.7;
    assert!(
        (da as f64 - exact).abs() <= 2.0,
        "{da} of {total} to presale"
    );
}

/// A lane with nobody waiting passes its share on; one that starts waiting
/// again gets its share back. Passthrough takes the next place of the
/// default lane when nobody waits anywhere.
pub async fn lanes_unused_share_flows<H: Harness>(h: &mut H) {
    let room = "c-lanes-flow";
    let mut s = RoomSettings {
        lanes: lanes(&[3, 1]),
        ..settings(0.001, 2.0)
    };
    let store = setup(h, room, &s).await;
    // nobody waits: joins pass straight through, in their lane
    let j = store.join_lane(room, Some(0)).await.unwrap();
    assert_eq!((j.lane, j.seq, j.admitted, j.place), (Some(0), 1, true, 1));
    let j = store.passthrough(room).await.unwrap().unwrap();
    assert_eq!((j.lane, j.seq, j.place), (Some(1), 1, 2));
    assert_eq!(store.passthrough(room).await.unwrap(), None);
    check_lanes(&store, room).await;

    let room = "c-lanes-flow-2";
    s.paused = true;
    s.burst = 20.0;
    let store = setup(h, room, &s).await;
    for _ in 0..30 {
        store.join_lane(room, Some(1)).await.unwrap();
    }
    s.paused = false;
    store.configure(room, &s).await.unwrap();
    let snap = store.advance(room).await.unwrap();
    // nobody in lane 0: lane 1 gets everything saved (not its quarter)
    assert_eq!(snap.lanes[0].frontier, 0);
    assert!(snap.lanes[1].frontier >= 20, "{:?}", snap.lanes);
    // lane 0 starts waiting: it takes its three quarters again
    for _ in 0..60 {
        store.join_lane(room, Some(0)).await.unwrap();
    }
    s.rate_per_sec = 100.0;
    s.burst = 1.0;
    let start = store.configure(room, &s).await.unwrap();
    for _ in 0..4 {
        h.elapse(Duration::from_millis(100)).await;
        store.advance(room).await.unwrap();
    }
    let end = check_lanes(&store, room).await;
    let da = end.lanes[0].frontier - start.lanes[0].frontier;
    let db = end.lanes[1].frontier - start.lanes[1].frontier;
    assert!(da + db >= 20, "{da} + {db}");
    assert!(
        (da as f64 - 0.75 * (da + db) as f64).abs() <= 2.0,
        "{da} + {db}"
    );
}

/// Strict lanes: nobody in a lower lane is admitted while a higher one
/// waits.
pub async fn lanes_strict<H: Harness>(h: &mut H) {
    let room = "c-lanes-strict";
    let mut s = RoomSettings {
        paused: true,
        lanes: lanes(&[1, 1, 1]),
        lane_mode: LaneMode::Strict,
        ..settings(0.001, 10.0)
    };
    let store = setup(h, room, &s).await;
    for lane in [2, 1, 0, 2, 1, 0, 2, 1] {
        for _ in 0..2 {
            store.join_lane(room, Some(lane)).await.unwrap();
        }
    }
    // lane 0 has 4 waiting, lane 1 has 6, lane 2 has 6
    s.paused = false;
    store.configure(room, &s).await.unwrap();
    let snap = store.advance(room).await.unwrap();
    assert_eq!(snap.lanes[0].frontier, 4);
    assert!(snap.lanes[1].frontier >= 6, "{:?}", snap.lanes);
    let slack = if h.real_time() { 1 } else { 0 };
    assert!(snap.lanes[2].frontier <= slack, "{:?}", snap.lanes);
    check_lanes(&store, room).await;
}

/// Random joins into random lanes and random advances (a fixed seed, so
/// both stores run the same sequence): every check of [`check_lanes`] at
/// every step, never more admitted than the credit allows.
pub async fn lanes_random<H: Harness>(h: &mut H) {
    let room = "c-lanes-random";
    let s = RoomSettings {
        lanes: lanes(&[5, 3, 2]),
        ..settings(40.0, 3.0)
    };
    let store = setup(h, room, &s).await;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let start = store.snapshot(room).await.unwrap();
    for _ in 0..40 {
        match next(4) {
            0 => h.elapse(Duration::from_millis(20 + next(80))).await,
            1 => {
                store.advance(room).await.unwrap();
            }
            _ => {
                let lane = next(4);
                store
                    .join_lane(room, (lane < 3).then_some(lane as u8))
                    .await
                    .unwrap();
            }
        }
    }
    let end = check_lanes(&store, room).await;
    let secs = (end.store_now_ms - start.store_now_ms) as f64 / 1000.0;
    assert!(
        end.admitted_total as f64 <= 3.0 + 40.0 * secs + 1.0,
        "{} admitted in {secs} s",
        end.admitted_total
    );
}

/// A lane room with `lane_keep` forgets the segments of lane seqs admitted
/// `lane_keep` ago (their places are no longer found: no queue token of
/// them is valid any more) and keeps the recent ones; the room's counts do
/// not move, and a room without `lane_keep` keeps every segment.
pub async fn lanes_forget_old_segments<H: Harness>(h: &mut H) {
    let (room, plain) = ("c-lanes-forget", "c-lanes-keep");
    let keep = Duration::from_secs(2);
    let mut s = RoomSettings {
        lanes: lanes(&[50, 50]),
        lane_keep: Some(keep),
        paused: true,
        ..settings(1000.0, 1000.0)
    };
    let mut kept = RoomSettings {
        lane_keep: None,
        ..s.clone()
    };
    let store = setup(h, room, &s).await;
    store.configure(plain, &kept).await.unwrap();
    let join_both = |r: &'static str| {
        let store = store.clone();
        async move {
            for _ in 0..5 {
                for lane in [0, 1] {
                    store.join_lane(r, Some(lane)).await.unwrap();
                }
            }
        }
    };
    // seqs 1..=5 of each lane wait (the first join notes the first mark:
    // frontiers 0 and 0), then one advance admits them
    join_both(room).await;
    join_both(plain).await;
    s.paused = false;
    kept.paused = false;
    store.configure(room, &s).await.unwrap();
    store.configure(plain, &kept).await.unwrap();
    assert_eq!(store.advance(room).await.unwrap().frontier, 10);
    store.advance(plain).await.unwrap();
    // seqs 6..=10 admitted on the spot
    join_both(room).await;
    join_both(plain).await;
    // a second mark (frontiers 10 and 10) after a second
    h.elapse(Duration::from_millis(1_200)).await;
    store.advance(room).await.unwrap();
    // the first mark is `keep` old: it covers nothing, nothing goes
    h.elapse(Duration::from_millis(1_000)).await;
    store.advance(room).await.unwrap();
    for lane in [0, 1] {
        for seq in 1..=10 {
            assert!(
                store.lane_place(room, lane, seq).await.unwrap().is_some(),
                "lane {lane} seq {seq} was admitted under 2 s ago: kept"
            );
        }
    }
    // seqs 11..=15 admitted on the spot; then the second mark is `keep`
    // old: seqs up to 10 are forgotten, the later ones kept
    join_both(room).await;
    let before = store.snapshot(room).await.unwrap();
    assert_eq!((before.frontier, before.tail), (30, 30));
    h.elapse(Duration::from_millis(1_200)).await;
    store.advance(room).await.unwrap();
    for lane in [0, 1] {
        for seq in 1..=10 {
            assert_eq!(
                store.lane_place(room, lane, seq).await.unwrap(),
                None,
                "lane {lane} seq {seq}"
            );
        }
        for seq in 11..=15 {
            assert!(
                store.lane_place(room, lane, seq).await.unwrap().is_some(),
                "lane {lane} seq {seq}"
            );
        }
    }
    // the room's counts stay, and the room goes on
    let after = store.snapshot(room).await.unwrap();
    assert_eq!((after.frontier, after.tail), (30, 30));
    assert_eq!(after.lanes, before.lanes);
    let j = store.join_lane(room, Some(0)).await.unwrap();
    assert!(j.admitted, "{j:?}");
    assert_eq!(store.lane_place(room, 0, 16).await.unwrap(), Some(j.place));
    // without lane_keep nothing is forgotten
    store.advance(plain).await.unwrap();
    for seq in [1, 5, 10] {
        assert!(store.lane_place(plain, 0, seq).await.unwrap().is_some());
    }
}

/// Expands to one `#[tokio::test]` per conformance check, each building its
/// harness with `$make` (an expression of type `impl Future<Output =
/// Option<H>>`; `None` skips).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            passthrough fifo paused burst rate_over_time configure_reanchors
            no_show_refund sessions_and_max_active lost_store_reseed closed_room
            settings_roundtrip concurrent_joins snapshot_is_read_only
            prequeue prequeue_race prequeue_lost_store
            steering_lease sold_out_and_adaptive_settings
            passthrough_takes_no_place passthrough_race one_place_one_session
            admissions_at_once_never_pass_the_cap
            settings_compare_and_set reseat_is_stable_and_unshared
            method_queue_all method_reject method_random random_draws_handed_back
            solution_buys_one_place solution_replays_race
            joins_sent_together batches_are_joins_one_after_another
            lanes_weighted lanes_unused_share_flows lanes_strict lanes_random
            lanes_forget_old_segments shared_rate);
    };
    (@each $make:expr; $($name:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let Some(mut h) = $make.await else { return };
                $crate::conformance::$name(&mut h).await;
            }
        )*
    };
}
