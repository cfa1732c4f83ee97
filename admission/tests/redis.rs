//! The conformance suite on the Redis store, against a `redis-server` of
//! the test's own (skipped loudly without one, a failure under CI=true).

#![allow(clippy::unwrap_used)]

#[path = "../../tests/src/redis_server.rs"]
#[allow(unreachable_pub)] // shared with the crates that export it
mod redis_server;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use sluice_admission::conformance::Harness;
use sluice_admission::{AdmissionError, QueueStore, RedisConfig, RedisQueueStore, RoomSettings};

struct RedisHarness {
    server: RedisServer,
    store: RedisQueueStore,
}

impl Harness for RedisHarness {
    type Store = RedisQueueStore;
    fn store(&self) -> RedisQueueStore {
        self.store.clone()
    }
    async fn elapse(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
    fn real_time(&self) -> bool {
        true
    }
    async fn lose_state(&mut self) {
        self.server.restart_empty();
    }
}

async fn harness() -> Option<RedisHarness> {
    let server = RedisServer::start()?;
    let store = RedisQueueStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    Some(RedisHarness { server, store })
}

sluice_admission::conformance_tests!(harness());

/// Two gateways (two connections) joining from many tasks at once get
/// unique seqs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_joins_across_connections() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = RedisQueueStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    let b = RedisQueueStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    a.configure("many", &RoomSettings::default()).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let st = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut v = Vec::new();
            for _ in 0..40 {
                v.push(st.join("many").await.unwrap().seq);
                if v.len() % 10 == 0 {
                    st.advance("many").await.unwrap();
                }
            }
            v
        }));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        for seq in t.await.unwrap() {
            assert!(seen.insert(seq), "seq {seq} handed out twice");
        }
    }
    assert_eq!(seen.len(), 64 * 40);
    assert_eq!(*seen.iter().max().unwrap(), 64 * 40);
}

/// `CLIENT PAUSE ms ALL` on the server of `port`: commands sent from now
/// on wait until the pause ends.
fn pause_clients(port: u16, ms: u32) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(&mut s, format!("CLIENT PAUSE {ms} ALL\r\n").as_bytes()).unwrap();
    let mut buf = [0u8; 64];
    let _ = std::io::Read::read(&mut s, &mut buf);
}

/// A Redis that does not answer gives a timeout error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_redis_times_out() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let cfg = RedisConfig {
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let store = RedisQueueStore::connect(&server.url(), cfg).await.unwrap();
    store
        .configure("slow", &RoomSettings::default())
        .await
        .unwrap();
    pause_clients(server.port(), 1500);
    let t0 = Instant::now();
    let r = store.join("slow").await;
    assert!(matches!(r, Err(AdmissionError::StoreTimeout(_))), "{r:?}");
    assert!(t0.elapsed() < Duration::from_millis(900));
    // and it comes back by itself
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let mut ok = false;
    for _ in 0..20 {
        if store.join("slow").await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok);
}

fn solution(id: &[u8; 16]) -> sluice_admission::Solution<'_> {
    sluice_admission::Solution {
        id,
        ttl: Duration::from_secs(60),
        sub: "v",
        spent: false,
        lane: None,
    }
}

/// Joins batched behind a step that Redis does not answer (a `CLIENT
/// PAUSE` longer than the store's timeout) fail within about one timeout,
/// not one per step before them; once Redis answers again every solution
/// buys exactly one place (the stalled step's joins ran when the pause
/// ended: theirs come back as replays), and no seq is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_joins_behind_a_stalled_step_fail_within_one_timeout() {
    use sluice_admission::JoinOnce;
    use sluice_admission::batch::JoinBatcher;
    use std::sync::Arc;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let timeout = Duration::from_millis(300);
    let cfg = RedisConfig {
        timeout,
        ..Default::default()
    };
    let store = RedisQueueStore::connect(&server.url(), cfg).await.unwrap();
    let room = "stalled";
    store
        .configure(room, &RoomSettings::default())
        .await
        .unwrap();
    pause_clients(server.port(), 1500);
    let batcher = Arc::new(JoinBatcher::default());
    let mut tasks = Vec::new();
    for i in 0..40u8 {
        let (b, st) = (batcher.clone(), store.clone());
        tasks.push(tokio::spawn(async move {
            // the first alone in its step, the rest waiting behind it
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let t0 = Instant::now();
            let r = b.join_once(&st, room, solution(&[i; 16])).await;
            (r, t0.elapsed())
        }));
    }
    for t in tasks {
        let (r, took) = t.await.unwrap();
        assert!(matches!(r, Err(AdmissionError::StoreTimeout(_))), "{r:?}");
        assert!(
            took < timeout * 5 / 3,
            "a join behind a stalled step waited {took:?} (timeout {timeout:?})"
        );
    }
    // Redis answers again: each solution buys one place, once
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let mut seqs = HashSet::new();
    for i in 0..40u8 {
        let mut answer = None;
        for _ in 0..20 {
            match batcher.join_once(&store, room, solution(&[i; 16])).await {
                Ok(a) => {
                    answer = Some(a);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        match answer.expect("Redis answers again") {
            JoinOnce::Joined(j) => assert!(seqs.insert(j.seq), "seq {} twice", j.seq),
            JoinOnce::Replayed { note } => {
                let seq: u64 = note
                    .expect("a place")
                    .split(':')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(seqs.insert(seq), "seq {seq} twice");
            }
        }
    }
    let snap = store.snapshot(room).await.unwrap();
    assert_eq!(snap.tail, 40, "one place per solution");
}

/// The keys of a room share one hash tag, and a room id that could break
/// it out is refused.
#[tokio::test]
async fn keys_share_the_hash_tag() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisQueueStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    // exactly these names, in the scripts' KEYS order (a store written by
    // an older build is read by this one)
    assert_eq!(
        store.keys("room-1"),
        [
            "sluice:{room-1}:state",
            "sluice:{room-1}:claims",
            "sluice:{room-1}:batches",
            "sluice:{room-1}:sessions",
            "sluice:{room-1}:ended",
            "sluice:{room-1}:reseats",
            "sluice:{room-1}:lanes",
            "sluice:{room-1}:lanemarks",
            "sluice:{room-1}:draws",
        ]
    );
    assert!(matches!(
        store.configure("a}b", &RoomSettings::default()).await,
        Err(AdmissionError::InvalidRoomId(_))
    ));
    store
        .configure("room-1", &RoomSettings::default())
        .await
        .unwrap();
    store.join("room-1").await.unwrap();
    store
        .session_start("room-1", "s", Duration::from_secs(5))
        .await
        .unwrap();
    let keys = server.command("KEYS *");
    assert!(keys.contains("sluice:{room-1}:state"), "{keys}");
    assert!(keys.contains("sluice:{room-1}:claims"), "{keys}");
    assert!(keys.contains("sluice:{room-1}:sessions"), "{keys}");
}

/// A room without lanes writes exactly what it wrote before lanes existed:
/// no lanes key, no lane field in its state, settings JSON without `lanes`
/// or `lane_mode`. A room with lanes writes them, and a lane is found by
/// its seq from another connection (another gateway).
#[tokio::test]
async fn lanes_leave_a_plain_room_as_it_was() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisQueueStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    let s = RoomSettings {
        rate_per_sec: 1.0,
        burst: 2.0,
        ..Default::default()
    };
    store.configure("plain", &s).await.unwrap();
    for _ in 0..4 {
        store.join("plain").await.unwrap();
    }
    store.advance("plain").await.unwrap();
    store.configure("plain", &s).await.unwrap();
    let keys = server.command("KEYS *");
    assert!(!keys.contains("lanes"), "{keys}");
    let fields = server.command("HKEYS sluice:{plain}:state");
    for f in ["ln", "lmode", "lmask", "lt1", "lw1"] {
        assert!(!fields.lines().any(|l| l.trim() == f), "{f} in {fields}");
    }
    let json = server.command("HGET sluice:{plain}:state settings");
    assert!(!json.contains("lane"), "{json}");

    let laned = RoomSettings {
        lanes: vec![
            sluice_admission::lanes::Lane {
                id: "presale".into(),
                weight: 70,
            },
            sluice_admission::lanes::Lane {
                id: "public".into(),
                weight: 30,
            },
        ],
        ..s
    };
    store.configure("laned", &laned).await.unwrap();
    let j = store.join_lane("laned", Some(0)).await.unwrap();
    assert_eq!((j.lane, j.seq, j.place, j.admitted), (Some(0), 1, 1, true));
    let other = RedisQueueStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    assert_eq!(other.lane_place("laned", 0, 1).await.unwrap(), Some(1));
    let fields = server.command("HKEYS sluice:{laned}:state");
    assert!(fields.lines().any(|l| l.trim() == "ln"), "{fields}");
    assert!(server.command("KEYS *").contains("sluice:{laned}:lanes"));
}
