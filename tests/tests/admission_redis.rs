//! Admission across gateway processes sharing one real Redis: unique seqs,
//! the metered rate, live settings, no-shows, revoke, and a Redis that
//! restarts empty in the middle of a queue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{GatewayProcess, admin_patch, admin_room, temp_file, temp_keys};

const POW_SECRET: &str = "shared-pow-secret-for-the-test";

/// A config for one room with an easy proof of work and no per-prefix
/// limit (every test visitor comes from 127.0.0.1).
fn room_config(rate: f64, extra: &str) -> String {
    format!(
        r#"
[[rooms]]
id = "default"
rate_per_sec = {rate}
burst = 1
puzzles = 2
difficulty_floor_bits = 4
difficulty_ceiling_bits = 6
join_limit_per_prefix_per_min = 0
# every test visitor comes from 127.0.0.1: no wall-clock floor on solving
attack_min_solve = "0s"
{extra}
"#
    )
}

fn gateways(
    n: usize,
    redis: &RedisServer,
    origin: &TestOrigin,
    config: &str,
) -> Vec<GatewayProcess> {
    let cfg = temp_file("sluice.toml", config);
    let keys = temp_keys();
    (0..n)
        .map(|_| {
            GatewayProcess::start_shared_logged(
                &redis.url(),
                &origin.url(),
                &cfg,
                &keys,
                POW_SECRET,
                "warn",
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_joins_across_three_gateways_get_unique_seqs() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gws = gateways(3, &redis, &origin, &room_config(0.0, ""));
    let urls: Vec<String> = gws.iter().map(|g| g.url()).collect();
    let mut tasks = Vec::new();
    for i in 0..1000usize {
        let url = urls[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            let mut v = Visitor::new(&url, "default");
            let res = v.join("/").await;
            assert!(res.status.is_success(), "{}", res.text());
            v.seq
        }));
    }
    let mut seqs = Vec::new();
    for t in tasks {
        if let Some(s) = t.await.unwrap() {
            seqs.push(s);
        }
    }
    let unique: HashSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "a seq was handed out twice");
    // at most the one passthrough admission has no seq in its answer
    assert!(seqs.len() >= 999, "{} waiting visitors", seqs.len());
    let state = admin_room(&urls[0], "default").await;
    assert_eq!(state["tail"], 1000);
    // Joins answered while a gateway's ticker was asking the store are no
    // sign of a store that lost its state: no gateway recovered the room
    // (a recovery rewrites the room's settings with what that gateway
    // knows).
    for gw in &gws {
        let recovered: Vec<String> = gw
            .log_lines()
            .into_iter()
            .filter(|l| l.contains("recovering from the highest values seen"))
            .collect();
        assert!(recovered.is_empty(), "{recovered:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_meter_twenty_per_second_and_share_live_settings() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gws = gateways(3, &redis, &origin, &room_config(20.0, ""));
    let urls: Vec<String> = gws.iter().map(|g| g.url()).collect();
    // 600 visitors: more than 20 s of admissions at 20/s
    let mut tasks = Vec::new();
    for i in 0..600usize {
        let url = urls[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            let mut v = Visitor::new(&url, "default");
            assert!(v.join("/").await.status.is_success());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let f0 = admin_room(&urls[0], "default").await["frontier"]
        .as_u64()
        .unwrap();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let f1 = admin_room(&urls[1], "default").await["frontier"]
        .as_u64()
        .unwrap();
    let rate = (f1 - f0) as f64 / t0.elapsed().as_secs_f64();
    assert!(
        (19.0..=21.0).contains(&rate),
        "frontier advanced at {rate:.2}/s, expected 20 ± 5%"
    );

    // A PATCH on one gateway reaches the others within 250 ms.
    let res = admin_patch(&urls[0], "default", json!({"rate_per_sec": 7.5})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let patched = Instant::now();
    for url in &urls[1..] {
        loop {
            let seen = admin_room(url, "default").await["rate_per_sec"]
                .as_f64()
                .unwrap();
            if (seen - 7.5).abs() < 1e-9 {
                break;
            }
            assert!(
                patched.elapsed() < Duration::from_millis(250),
                "{url} still sees rate {seen} after {:?}",
                patched.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_shows_give_their_slots_back() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gws = gateways(
        2,
        &redis,
        &origin,
        &room_config(10.0, "claim_window = \"3s\""),
    );
    let urls: Vec<String> = gws.iter().map(|g| g.url()).collect();
    // The line forms while the room is paused; 30% of the visitors never
    // poll again after joining.
    let res = admin_patch(&urls[0], "default", json!({"paused": true})).await;
    assert_eq!(res.status, 200);
    let mut tasks = Vec::new();
    for i in 0..400usize {
        let url = urls[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut v = Visitor::new(&url, "default");
            assert!(v.join("/").await.status.is_success());
            v
        }));
    }
    let mut pollers = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let v = t.await.unwrap();
        if i % 10 >= 3 {
            pollers.push(v);
        }
    }
    let res = admin_patch(&urls[0], "default", json!({"paused": false})).await;
    assert_eq!(res.status, 200);
    let stop = Instant::now() + Duration::from_secs(26);
    let mut tasks = Vec::new();
    for mut v in pollers {
        tasks.push(tokio::spawn(async move {
            // honour poll_after_ms, as the page does
            while Instant::now() < stop {
                let res = v.status().await;
                let j = res.json();
                if j["state"] == "admitted" {
                    return;
                }
                let wait = j["poll_after_ms"].as_u64().unwrap_or(1000);
                tokio::time::sleep(
                    Duration::from_millis(wait).min(stop.saturating_duration_since(Instant::now())),
                )
                .await;
            }
        }));
    }
    // measure after the first claim windows have passed
    tokio::time::sleep(Duration::from_secs(5)).await;
    let c0 = admin_room(&urls[0], "default").await["claimed_total"]
        .as_u64()
        .unwrap();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let state = admin_room(&urls[0], "default").await;
    let c1 = state["claimed_total"].as_u64().unwrap();
    let claimed_rate = (c1 - c0) as f64 / t0.elapsed().as_secs_f64();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        claimed_rate >= 9.0,
        "claimed admissions at {claimed_rate:.2}/s with 30% no-shows; expected ≥ 90% of 10/s ({state})"
    );
    assert!(state["refunded_total"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_reissues_no_seq_and_admitted_visitors_pass() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gws = gateways(2, &redis, &origin, &room_config(2.0, ""));
    let urls: Vec<String> = gws.iter().map(|g| g.url()).collect();
    let mut admitted = Visitor::new(&urls[0], "default");
    admitted.join("/").await;
    assert!(admitted.wait_admitted(Duration::from_secs(10), 200).await);
    let mut waiting = Vec::new();
    for i in 0..40usize {
        let mut v = Visitor::new(&urls[i % 2], "default");
        assert!(v.join("/").await.status.is_success());
        waiting.push(v);
    }
    let max_seq = waiting.iter().filter_map(|v| v.seq).max().unwrap();
    let mut positions = Vec::new();
    for v in waiting.iter_mut() {
        positions.push(v.status().await.json()["position"].as_u64().unwrap_or(0));
    }

    redis.kill();
    // Admitted visitors keep passing while the store is down; polls answer
    // from the last snapshot.
    for _ in 0..5 {
        let res = admitted.get_admitted("/echo/during-outage").await;
        assert_eq!(res.status, 200, "{}", res.text());
        let res = waiting[5].status().await;
        assert_eq!(res.status, 200, "{}", res.text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    redis.restart_empty();
    // Back without a restart of the gateways: new joins get new seqs.
    let deadline = Instant::now() + Duration::from_secs(15);
    let new_seq = loop {
        let mut v = Visitor::new(&urls[1], "default");
        let res = v.join("/").await;
        if res.status.is_success()
            && let Some(seq) = v.seq
        {
            break seq;
        }
        assert!(
            Instant::now() < deadline,
            "store never came back: {}",
            res.text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        new_seq > max_seq,
        "seq {new_seq} reissued (highest before: {max_seq})"
    );
    for (v, before) in waiting.iter_mut().zip(positions) {
        let res = v.status().await;
        let j = res.json();
        if j["state"] == "waiting" {
            assert!(
                j["position"].as_u64().unwrap() <= before,
                "position moved back: {} > {before}",
                j["position"]
            );
        }
    }
    let res = admitted.get_admitted("/echo/after").await;
    assert_eq!(res.status, 200);
    let ready = TestClient::new()
        .get(&format!("{}/_sluice/readyz", urls[0]), &[])
        .await;
    assert_eq!(ready.status, 200);
}

/// A gateway killed (SIGKILL) while joins are in flight loses no place and
/// sells none twice: every solution sent to it, sent again to another
/// gateway, gets a place (the one it bought, if its join ran; a new one if
/// it never did), no two share one, and the tail moved by exactly one per
/// solution. The replay guard and the join are one script: there is no
/// moment where a solution is spent and its place not noted (the
/// three-step join left such solutions refused with 409 `pow_replayed`
/// and their places orphaned).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_killed_mid_join_loses_no_place_and_sells_none_twice() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gws = gateways(2, &redis, &origin, &room_config(0.0, ""));
    let (a, b) = (gws[0].url(), gws[1].url());
    // the one credit: every later join waits
    let mut first = Visitor::new(&a, "default");
    assert!(first.join("/").await.status.is_success());
    const N: usize = 150;
    let mut bodies = Vec::new();
    for _ in 0..N {
        let (challenge, solutions) = Visitor::new(&a, "default").solved().await;
        bodies.push(json!({"challenge": challenge, "solutions": solutions}));
    }
    let tail_before = admin_room(&b, "default").await["tail"].as_u64().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for body in bodies.clone() {
        let (a, answered) = (a.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let req = http::Request::post(format!("{a}/_sluice/rooms/default/join"))
                .header("content-type", "application/json")
                .body(sluice_tests::client::body(body.to_string()))
                .unwrap();
            let res = TestClient::new().try_send(req).await;
            answered.fetch_add(1, Ordering::Relaxed);
            res.map(|r| r.status.as_u16())
        }));
    }
    // kill it with joins flowing: some answered, most in flight
    let deadline = Instant::now() + Duration::from_secs(20);
    while answered.load(Ordering::Relaxed) < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    gws[0].signal("KILL");
    let mut lost = 0;
    for t in tasks {
        if t.await.unwrap().is_none() {
            lost += 1;
        }
    }
    eprintln!("{lost} of {N} joins lost their answer in the kill");
    let client = TestClient::new();
    let mut seqs = HashSet::new();
    for (i, body) in bodies.iter().enumerate() {
        let res = client
            .post_json(&format!("{b}/_sluice/rooms/default/join"), &[], body)
            .await;
        assert_eq!(res.status, 201, "solution {i} sent again: {}", res.text());
        assert!(
            seqs.insert(res.json()["seq"].as_u64().unwrap()),
            "solution {i} got a place another holds"
        );
    }
    // every place handed out is one solution's
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let tail = admin_room(&b, "default").await["tail"].as_u64().unwrap();
        if tail == tail_before + N as u64 {
            break;
        }
        assert!(
            tail <= tail_before + N as u64 && Instant::now() < deadline,
            "tail {tail}: {} places for {N} solutions",
            tail - tail_before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
