//! The `random` queueing method (issue 22), through real sockets, on the
//! memory store and on a real Redis with two gateways sharing it:
//!
//! - while the room is paused, everyone who comes waits and nothing is
//!   drawn; when admission resumes, one draw orders all of them: their
//!   places (shown as positions, admission held at a trickle) are a
//!   permutation of their seqs, the same on both gateways, far from FIFO
//!   (Kendall tau), and exactly what the room's seed gives once it is
//!   revealed at closing (it matches the commitment published from the
//!   start, before any draw);
//! - a visitor who joins after the draw waits for the next one, never
//!   admitted with it, whatever credit there is;
//! - every visitor of both draws is admitted once, each place claimed once,
//!   including through a gateway started after both draws (it places the
//!   first draw's seqs from the store's record of that draw);
//! - on Redis, a FLUSHALL in the middle of the first draw loses nothing:
//!   the gateways hand the store the draw back, every place stands (the
//!   same on both gateways); a second FLUSHALL after the second draw, and
//!   the late gateway still finds the first one (the gateways handed back
//!   the draws they kept).
//!
//! The store's side (the frontier never passes a draw, draws follow each
//! other without gap or overlap) is the conformance check
//! `method_random` and the property `room::tests::random_rolling_draws`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_admission::prequeue::{draw_seed, from_hex, to_hex};
use sluice_admission::{PlaceMap, PrequeueDraw};
use sluice_gateway::config::RoomConfig;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{TestGateway, admin_patch, admin_room, temp_keys};

const ROOM: &str = "lottery";
const FIRST: usize = 30;
const LATE: usize = 10;

async fn gateway(origin: &TestOrigin, redis: Option<&RedisServer>, keys: &Path) -> TestGateway {
    let keys = keys.to_path_buf();
    let mut b = TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = vec![RoomConfig {
                method: sluice_admission::QueueMethod::Random,
                ..sluice_tests::easy_room(ROOM, 1000.0, 50.0, &["/lottery"])
            }];
            c.pow_secret = Some("random-test-pow-secret-0123456789abcdef".into());
            c.keys_dir = Some(keys);
        });
    if let Some(r) = redis {
        b = b.redis(r.url());
    }
    b.spawn().await
}

async fn public(base: &str) -> Value {
    TestClient::new()
        .get(&format!("{base}/_sluice/rooms/{ROOM}"), &[])
        .await
        .json()
}

/// Waits until `f` holds for the public state on every gateway.
async fn until(bases: &[String], what: &str, f: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    'outer: while Instant::now() < deadline {
        for b in bases {
            if !f(&public(b).await) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue 'outer;
            }
        }
        return;
    }
    panic!("{what}: {}", public(&bases[0]).await);
}

/// Redis loses everything: waits until the gateway at `base` has recovered
/// the room (a new epoch).
async fn flush_and_recover(r: &RedisServer, base: &str) {
    let epoch = admin_room(base, ROOM).await["epoch"].clone();
    r.command("FLUSHALL");
    let deadline = Instant::now() + Duration::from_secs(15);
    while admin_room(base, ROOM).await["epoch"] == epoch {
        assert!(Instant::now() < deadline, "not recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The same visitor, calling through another gateway.
fn through(v: &Visitor, base: &str) -> Visitor {
    let mut o = Visitor::new(base, ROOM);
    o.queue_token = v.queue_token.clone();
    o.seq = v.seq;
    o
}

/// Kendall's tau of the pairs (seq, place).
fn tau(pairs: &[(u64, u64)]) -> f64 {
    let mut s = 0i64;
    for i in 0..pairs.len() {
        for j in i + 1..pairs.len() {
            let a = (pairs[i].0 as i64 - pairs[j].0 as i64).signum();
            let b = (pairs[i].1 as i64 - pairs[j].1 as i64).signum();
            s += a * b;
        }
    }
    let n = pairs.len() as f64;
    s as f64 / (n * (n - 1.0) / 2.0)
}

async fn run(redis: Option<&RedisServer>) {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut gws = vec![gateway(&origin, redis, &keys).await];
    if redis.is_some() {
        gws.push(gateway(&origin, redis, &keys).await);
    }
    let mut bases: Vec<String> = gws.iter().map(|g| g.url()).collect();
    let a = bases[0].clone();

    // published from the start: the method and the seed's commitment, not
    // the seed
    let p = public(&a).await;
    assert_eq!(p["method"], "random", "{p}");
    let commitment = p["prequeue_commitment"].as_str().unwrap().to_owned();
    assert!(p.get("prequeue_seed").is_none(), "{p}");

    // paused: everyone who comes waits, nothing is drawn
    let res = admin_patch(&a, ROOM, json!({"paused": true})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    for b in &bases {
        let deadline = Instant::now() + Duration::from_secs(10);
        while admin_room(b, ROOM).await["paused"] != true {
            assert!(Instant::now() < deadline, "pause not seen");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut first = Vec::new();
    for i in 0..FIRST {
        let mut v = Visitor::new(&bases[i % bases.len()], ROOM);
        let res = v.join("/lottery").await;
        assert_eq!(res.status, 201, "{}", res.text());
        assert_eq!(res.json()["awaiting_draw"], true, "{}", res.text());
        assert_eq!(v.seq, Some(i as u64 + 1));
        first.push(v);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        public(&a).await.get("draw_index").is_none(),
        "drawn while paused"
    );

    // admission resumes at a trickle: one draw orders everyone waiting; one
    // place goes at once (the burst), the rest show as positions above it
    let res = admin_patch(
        &a,
        ROOM,
        json!({"paused": false, "rate_per_sec": 0.001, "burst": 1.0}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    until(&bases, "the first draw", |p| {
        p["draw_index"] == 1 && p["draw_first_seq"] == 1 && p["draw_tickets"] == FIRST
    })
    .await;
    // (each gateway builds the draw's place map as it sees the draw: 30
    // tickets take microseconds)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let frontier = admin_room(&a, ROOM).await["frontier"].as_u64().unwrap();
    assert_eq!(frontier, 1, "the burst admits one");
    let mut places = Vec::new();
    for v in first.iter_mut() {
        let mut answers = Vec::new();
        for b in &bases {
            let res = through(v, b).status().await;
            assert_eq!(res.status.as_u16() / 100, 2, "{}", res.text());
            let body = res.json();
            let place = match body["state"].as_str() {
                Some("admitted") => 1,
                Some("waiting") => {
                    assert!(body.get("awaiting_draw").is_none(), "{body}");
                    body["position"].as_u64().unwrap() + frontier
                }
                _ => panic!("{body}"),
            };
            answers.push(place);
        }
        assert!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "seq {:?}: the gateways disagree: {answers:?}",
            v.seq
        );
        places.push((v.seq.unwrap(), answers[0]));
    }
    let mut sorted: Vec<u64> = places.iter().map(|&(_, p)| p).collect();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (1..=FIRST as u64).collect::<Vec<_>>(),
        "a place each: {places:?}"
    );
    let t = tau(&places);
    assert!(t.abs() < 0.6, "far from FIFO: tau {t} over {places:?}");

    if let Some(r) = redis {
        // the store loses everything mid-draw: the gateways give it the
        // draw back, and every place stands
        flush_and_recover(r, &a).await;
        until(&bases, "the draw back", |p| p["draw_index"] == 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // (the recovered bucket starts full: its burst admits one more)
        let frontier = admin_room(&a, ROOM).await["frontier"].as_u64().unwrap();
        assert!((1..=2).contains(&frontier), "{frontier}");
        for (v, &(seq, place)) in first.iter_mut().zip(&places) {
            for b in &bases {
                let body = through(v, b).status().await.json();
                match body["state"].as_str() {
                    Some("admitted") => assert!(place <= frontier, "seq {seq}: {body}"),
                    _ => assert_eq!(
                        body["position"].as_u64().unwrap() + frontier,
                        place,
                        "seq {seq} after the loss: {body}"
                    ),
                }
            }
        }
    }

    // joined after the draw: waits for the next one, whatever the credit
    let mut late = Vec::new();
    for i in 0..LATE {
        let mut v = Visitor::new(&bases[i % bases.len()], ROOM);
        let res = v.join("/lottery").await;
        assert_eq!(res.status, 201, "{}", res.text());
        assert_eq!(res.json()["awaiting_draw"], true);
        late.push(v);
    }
    for v in late.iter_mut() {
        let body = v.status().await.json();
        assert_eq!(body["state"], "waiting", "{body}");
        assert_eq!(body["awaiting_draw"], true, "{body}");
        assert!(
            body["position"].as_u64().unwrap() >= (FIRST as u64 - 1),
            "behind the draw: {body}"
        );
    }

    // full speed: the first draw drains, then the second orders the late
    let res = admin_patch(&a, ROOM, json!({"rate_per_sec": 1000.0, "burst": 50.0})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    until(&bases, "the second draw", |p| {
        p["draw_index"] == 2 && p["draw_first_seq"] == FIRST + 1 && p["draw_tickets"] == LATE
    })
    .await;
    if let Some(r) = redis {
        // the store loses everything again, the first draw with it: the
        // gateways hand it back the draws they kept…
        flush_and_recover(r, &a).await;
        until(&bases, "the second draw back", |p| p["draw_index"] == 2).await;
        // …and a gateway that saw neither draw being made finds them there
        let old = gws.pop().unwrap();
        drop(old);
        gws.push(gateway(&origin, redis, &keys).await);
        bases = gws.iter().map(|g| g.url()).collect();
    }
    let fresh = gws.last().unwrap().url();
    for (i, v) in first.iter_mut().chain(late.iter_mut()).enumerate() {
        let mut o = through(v, if i % 2 == 0 { &fresh } else { &a });
        assert!(
            o.wait_admitted(Duration::from_secs(20), 300).await,
            "seq {:?} admitted",
            v.seq
        );
    }
    let view = admin_room(&a, ROOM).await;
    assert_eq!(view["tail"], FIRST + LATE, "{view}");
    assert_eq!(view["frontier"], FIRST + LATE, "{view}");
    assert_eq!(view["claimed_total"], FIRST + LATE, "a place each: {view}");

    // closed: the seed is revealed, matches the commitment, and gives the
    // places every gateway showed
    let res = admin_patch(&a, ROOM, json!({"closed": true})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    until(&bases, "the seed revealed", |p| {
        p.get("prequeue_seed").is_some()
    })
    .await;
    let seed = public(&a).await["prequeue_seed"]
        .as_str()
        .unwrap()
        .to_owned();
    let seed = from_hex(&seed).unwrap();
    assert_eq!(to_hex(&Sha256::digest(&seed)), commitment);
    let map = PlaceMap::new(
        &draw_seed(&seed, 1),
        PrequeueDraw {
            from: 0,
            n: FIRST as u64,
            k: 1,
        },
    );
    for &(seq, place) in &places {
        assert_eq!(map.place(seq), place, "seq {seq}");
    }
    // and anyone can check it with the CLI
    let (probe, place) = places[7];
    let text = sluice_tests::prequeue_verify(&[
        "--seed",
        &to_hex(&seed),
        "--commitment",
        &commitment,
        "--draw",
        "1",
        "--first-seq",
        "1",
        "--tickets",
        &FIRST.to_string(),
        "--seq",
        &probe.to_string(),
    ]);
    assert!(
        text.contains(&format!("seq {probe}: place {place} ")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_on_the_memory_store() {
    run(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_on_redis_with_two_gateways_and_one_started_late() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    run(Some(&redis)).await;
}
