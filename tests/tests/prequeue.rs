//! Scheduled opening with a verifiable pre-queue draw: early visitors across
//! two gateway processes on one real Redis get pre-queue tickets and the
//! commitment; at the opening the seed is revealed, it matches the
//! commitment, and visitors are admitted in exactly the order
//! `shuffle_order(seed, N)` gives; a late joiner comes after every ticket.
//! Plus the admin API's `opens_at` (validation, moving it, opening at once).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_gateway::gate::schedule::format_rfc3339;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{
    GatewayProcess, TestGateway, admin_patch, admin_room, easy_room, temp_file, temp_keys,
};

const POW_SECRET: &str = "shared-pow-secret-for-the-prequeue-test";

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn public_room(base: &str, room: &str) -> Value {
    let res = TestClient::new()
        .get(&format!("{base}/_sluice/rooms/{room}"), &[])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

/// Two gateway processes on `redis` with one room at `rate`/s (burst 1)
/// opening at `opens_at`.
fn gateways(
    redis: &RedisServer,
    origin: &TestOrigin,
    rate: f64,
    opens_at: &str,
) -> Vec<GatewayProcess> {
    let cfg = temp_file(
        "sluice.toml",
        &format!(
            r#"
[[rooms]]
id = "default"
rate_per_sec = {rate}
burst = 1
puzzles = 1
difficulty_floor_bits = 2
difficulty_ceiling_bits = 4
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
opens_at = "{opens_at}"
"#
        ),
    );
    let keys = temp_keys();
    (0..2)
        .map(|_| {
            GatewayProcess::start_shared(&redis.url(), &origin.url(), &cfg, &keys, POW_SECRET, &[])
        })
        .collect()
}

/// Polls every visitor through one gateway, one request at a time (its
/// snapshot's frontier only moves forward), until all are admitted; then
/// checks that for every pair with place(i) < place(j), j was never
/// admitted before a poll that still found i waiting. Returns the poll
/// that admitted each seq.
async fn admit_all_in_place_order(
    visitors: &mut [Visitor],
    url: &str,
    place: &HashMap<u64, u64>,
    limit: Duration,
) -> HashMap<u64, u64> {
    let mut last_waiting: HashMap<u64, u64> = HashMap::new();
    let mut admitted_at: HashMap<u64, u64> = HashMap::new();
    let mut tick = 0u64;
    let deadline = Instant::now() + limit;
    for v in visitors.iter_mut() {
        v.base = url.to_owned();
    }
    while admitted_at.len() < visitors.len() {
        assert!(Instant::now() < deadline, "{} admitted", admitted_at.len());
        for v in visitors.iter_mut() {
            let seq = v.seq.unwrap();
            if admitted_at.contains_key(&seq) {
                continue;
            }
            tick += 1;
            let s = v.status().await;
            if s.status != 200 {
                // a store restarting: try again on the next round
                continue;
            }
            let s = s.json();
            match s["state"].as_str() {
                Some("admitted") => {
                    admitted_at.insert(seq, tick);
                }
                Some("waiting") => {
                    assert!(s.get("prequeue").is_none(), "after the opening: {s}");
                    last_waiting.insert(seq, tick);
                }
                other => panic!("unexpected state {other:?}: {s}"),
            }
        }
    }
    let mut seqs: Vec<u64> = place.keys().copied().collect();
    seqs.sort_by_key(|s| place[s]);
    for (a, i) in seqs.iter().enumerate() {
        for j in &seqs[a + 1..] {
            if let Some(w) = last_waiting.get(i) {
                assert!(
                    admitted_at[j] > *w,
                    "seq {j} (place {}) admitted at poll {} before seq {i} (place {}) \
                     was (still waiting at poll {w})",
                    place[j],
                    admitted_at[j],
                    place[i]
                );
            }
        }
    }
    admitted_at
}

/// Moves the opening to 6 s from now through the admin API; checks the
/// commitment stays and every gateway sees the new time.
async fn postpone(url: &str, commitment: &str) -> (u64, String) {
    let opens_ms = (unix_ms() / 1000 + 7) * 1000;
    let opens_at = format_rfc3339(opens_ms);
    let res = admin_patch(url, "default", json!({ "opens_at": opens_at })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["prequeue_commitment"], commitment);
    tokio::time::sleep(Duration::from_millis(300)).await;
    (opens_ms, opens_at)
}

/// seq → place for a draw of `n` tickets from seq 1.
fn places(seed: &[u8], n: u32) -> HashMap<u64, u64> {
    let order = sluice_admission::shuffle_order(seed, n);
    order
        .iter()
        .enumerate()
        .map(|(k, ticket)| (u64::from(*ticket) + 1, k as u64 + 1))
        .collect()
}

/// Waits for the public state to reveal the seed.
async fn revealed(url: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let p = public_room(url, "default").await;
        if p.get("prequeue_seed").is_some() {
            return p;
        }
        assert!(Instant::now() < deadline, "no seed: {p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_early_visitors_on_two_gateways_are_admitted_in_the_published_draw_order() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let mut opens_ms = (unix_ms() / 1000 + 9) * 1000;
    let mut opens_at = format_rfc3339(opens_ms);
    let gws = gateways(&redis, &origin, 20.0, &opens_at);
    let urls: Vec<String> = gws.iter().map(|g| g.url()).collect();

    // Before the opening: both gateways publish the same commitment, no seed.
    let mut commitment = None;
    for url in &urls {
        let p = public_room(url, "default").await;
        assert_eq!(p["state"], "paused", "{p}");
        assert_eq!(p["opens_at"], opens_at.as_str());
        assert!(p.get("prequeue_seed").is_none(), "{p}");
        let c = p["prequeue_commitment"].as_str().unwrap().to_owned();
        assert_eq!(c.len(), 64);
        assert_eq!(*commitment.get_or_insert(c.clone()), c);
    }
    let commitment = commitment.unwrap();
    // A slow machine took long to start the gateways: move the opening
    // (the commitment stays).
    if unix_ms() + 6_000 > opens_ms {
        (opens_ms, opens_at) = postpone(&urls[0], &commitment).await;
    }

    // 50 early visitors, alternating gateways.
    let mut tasks = Vec::new();
    for i in 0..50usize {
        let url = urls[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut v = Visitor::new(&url, "default");
            let res = v.join("/").await;
            assert_eq!(res.status, 201, "{}", res.text());
            (v, res.json())
        }));
    }
    let mut visitors = Vec::new();
    for t in tasks {
        let (v, body) = t.await.unwrap();
        assert_eq!(body["state"], "waiting");
        assert_eq!(body["prequeue"], true, "{body}");
        assert_eq!(body["prequeue_commitment"], commitment.as_str());
        assert_eq!(body["opens_at"], opens_at.as_str());
        assert!(body["position"].as_u64().unwrap() >= 1);
        visitors.push(v);
    }
    assert!(
        unix_ms() + 500 < opens_ms,
        "the joins took too long: the test needs them before the opening"
    );
    // every waiting visitor's status says pre-queue (counts as of the
    // gateway's last tick); nobody is admitted
    tokio::time::sleep(Duration::from_millis(300)).await;
    for v in visitors.iter_mut().take(6) {
        let s = v.status().await.json();
        assert_eq!(s["state"], "waiting", "{s}");
        assert_eq!(s["prequeue"], true);
        assert_eq!(s["prequeue_tickets"], 50);
        assert!(s["poll_after_ms"].as_u64().unwrap() >= 200);
    }
    let a = admin_room(&urls[1], "default").await;
    assert_eq!(
        (a["tail"].as_u64(), a["frontier"].as_u64()),
        (Some(50), Some(0))
    );
    assert_eq!(a["prequeue_tickets"], 50);

    // The opening: the seed is revealed and matches the commitment.
    let revealed = revealed(
        &urls[0],
        Duration::from_millis(opens_ms - unix_ms() + 5_000),
    )
    .await;
    assert!(unix_ms() >= opens_ms, "seed revealed before the opening");
    let seed_hex = revealed["prequeue_seed"].as_str().unwrap().to_owned();
    let seed = sluice_admission::prequeue::from_hex(&seed_hex).unwrap();
    assert_eq!(sluice_admission::commitment(&seed), commitment);
    assert_eq!(revealed["prequeue_commitment"], commitment.as_str());
    assert_eq!(revealed["prequeue_tickets"], 50);
    assert_eq!(revealed["prequeue_first_seq"], 1);

    // A late joiner, through the other gateway: after every ticket.
    let mut late = Visitor::new(&urls[1], "default");
    let res = late.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert!(res.json().get("prequeue").is_none());
    assert_eq!(late.seq, Some(51));
    visitors.push(late);

    // The predicted places: place k (1-based) is ticket order[k-1].
    let mut place = places(&seed, 50);
    place.insert(51, 51);

    // Everyone is admitted in the order of the places.
    let admitted_at =
        admit_all_in_place_order(&mut visitors, &urls[0], &place, Duration::from_secs(25)).await;
    // the late joiner came after every ticket: checked pairwise above (its
    // place is 51). Its admission poll need not be the last poll of all: a
    // ticket seen waiting just before the frontier passed both is admitted
    // at its next poll, after the late joiner's.
    // the draw was really observed in steps, not all at once
    let distinct: std::collections::HashSet<u64> = admitted_at.values().copied().collect();
    assert!(
        distinct.len() >= 10,
        "{} distinct admission polls",
        distinct.len()
    );

    // Anyone can check the draw with the CLI.
    let probe = *place.iter().find(|(_, p)| **p == 1).unwrap().0;
    let text = sluice_tests::prequeue_verify(&[
        "--seed",
        &seed_hex,
        "--commitment",
        &commitment,
        "--tickets",
        "50",
        "--seq",
        &probe.to_string(),
    ]);
    assert!(text.contains(&format!("seq {probe}: place 1 ")), "{text}");
}

/// Redis restarted empty before the opening keeps the pre-queue (the same
/// commitment, no seq reissued); restarted empty after it keeps the draw
/// (the gateways write back the seed and N they saw), and the order holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_queue_and_the_draw_survive_redis_restarting_empty() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let mut opens_ms = (unix_ms() / 1000 + 8) * 1000;
    let gws = gateways(&redis, &origin, 4.0, &format_rfc3339(opens_ms));
    let urls: Vec<String> = gws.iter().map(|g| g.url()).collect();
    let commitment = public_room(&urls[0], "default").await["prequeue_commitment"]
        .as_str()
        .unwrap()
        .to_owned();
    if unix_ms() + 6_000 > opens_ms {
        opens_ms = postpone(&urls[0], &commitment).await.0;
    }
    let mut visitors = Vec::new();
    for i in 0..10usize {
        let mut v = Visitor::new(&urls[i % 2], "default");
        assert_eq!(v.join("/").await.status, 201);
        visitors.push(v);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.restart_empty();
    // the gateways recreate the room above the tail they saw, pre-queue open
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let p = public_room(&urls[1], "default").await;
        let a = admin_room(&urls[1], "default").await;
        if a["store_ok"] == true && a["tail"].as_u64() >= Some(10) {
            assert_eq!(p["prequeue_commitment"], commitment.as_str(), "{p}");
            assert_eq!(p["state"], "paused", "{p}");
            break;
        }
        assert!(Instant::now() < deadline, "not recovered: {a}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..4usize {
        let mut v = Visitor::new(&urls[i % 2], "default");
        // a connection of the gateway may still be reconnecting: retry 503s
        let mut res = v.join("/").await;
        for _ in 0..20 {
            if res.status != 503 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            res = v.join("/").await;
        }
        assert_eq!(res.status, 201, "{}", res.text());
        assert_eq!(res.json()["prequeue"], true);
        assert!(v.seq.unwrap() > 10, "seq {:?} reissued", v.seq);
        visitors.push(v);
    }
    assert!(
        unix_ms() + 300 < opens_ms,
        "too slow for the test's schedule"
    );
    let n = visitors.iter().map(|v| v.seq.unwrap()).max().unwrap();

    let p = revealed(
        &urls[0],
        Duration::from_millis(opens_ms - unix_ms() + 5_000),
    )
    .await;
    let seed_hex = p["prequeue_seed"].as_str().unwrap().to_owned();
    let seed = sluice_admission::prequeue::from_hex(&seed_hex).unwrap();
    assert_eq!(sluice_admission::commitment(&seed), commitment);
    assert_eq!(p["prequeue_tickets"].as_u64(), Some(n));

    // lost again after the opening: the same draw comes back
    tokio::time::sleep(Duration::from_millis(300)).await;
    let epoch = admin_room(&urls[1], "default").await["epoch"].clone();
    redis.restart_empty();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let a = admin_room(&urls[1], "default").await;
        if a["store_ok"] == true && a["epoch"] != epoch {
            break;
        }
        assert!(Instant::now() < deadline, "not recovered: {a}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let p = revealed(&urls[1], Duration::from_secs(5)).await;
    assert_eq!(p["prequeue_seed"], seed_hex.as_str());
    assert_eq!(p["prequeue_tickets"].as_u64(), Some(n));
    assert_eq!(p["prequeue_first_seq"], 1);
    let place = places(&seed, n as u32);
    let place: HashMap<u64, u64> = visitors
        .iter()
        .map(|v| (v.seq.unwrap(), place[&v.seq.unwrap()]))
        .collect();
    admit_all_in_place_order(&mut visitors, &urls[0], &place, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_opens_at_is_validated_moved_and_opened_at_once() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.rooms = vec![easy_room("default", 50.0, 5.0, &[])])
        .spawn()
        .await;
    let url = gw.url();
    for bad in [
        json!("tomorrow"),
        json!("2026-12-01"),
        json!(12),
        json!(true),
    ] {
        let res = admin_patch(&url, "default", json!({ "opens_at": bad })).await;
        assert_eq!(res.status, 422, "{bad}: {}", res.text());
        let p = res.json();
        assert_eq!(p["code"], "invalid_setting");
        assert_eq!(p["field"], "opens_at");
    }
    let past = format_rfc3339(unix_ms() - 60_000);
    let res = admin_patch(&url, "default", json!({ "opens_at": past })).await;
    assert_eq!(res.status, 422, "{}", res.text());

    // schedule an hour ahead: the room is "paused" with a commitment
    let opens = format_rfc3339((unix_ms() / 1000 + 3600) * 1000);
    let res = admin_patch(&url, "default", json!({ "opens_at": opens })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let view = res.json();
    assert_eq!(view["opens_at"], opens.as_str());
    let commitment = view["prequeue_commitment"].as_str().unwrap().to_owned();
    assert!(view.get("prequeue_seed").is_none());
    let mut v = Visitor::new(&url, "default");
    let res = v.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    let body = res.json();
    assert_eq!(body["prequeue"], true);
    assert!(body["eta_seconds"].as_u64().unwrap() > 3500);
    assert_eq!(body["poll_after_ms"], 20_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p = public_room(&url, "default").await;
    assert_eq!(p["state"], "paused");
    assert_eq!(p["prequeue_tickets"], 1);
    assert!(p["eta_seconds_for_new_visitor"].as_u64().unwrap() > 3500);

    // moving the opening keeps the commitment
    let later = format_rfc3339((unix_ms() / 1000 + 7200) * 1000);
    let view = admin_patch(&url, "default", json!({ "opens_at": later }))
        .await
        .json();
    assert_eq!(view["prequeue_commitment"], commitment.as_str());
    assert_eq!(view["opens_at"], later.as_str());

    // null before the opening opens the room now: the draw is made and the
    // seed revealed; the visitor is admitted
    let res = admin_patch(&url, "default", json!({ "opens_at": null })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let deadline = Instant::now() + Duration::from_secs(5);
    let p = loop {
        let p = public_room(&url, "default").await;
        if p.get("prequeue_seed").is_some() {
            break p;
        }
        assert!(Instant::now() < deadline, "{p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let seed = sluice_admission::prequeue::from_hex(p["prequeue_seed"].as_str().unwrap()).unwrap();
    assert_eq!(sluice_admission::commitment(&seed), commitment);
    assert_eq!(p["prequeue_tickets"], 1);
    assert!(v.wait_admitted(Duration::from_secs(5), 200).await);
}
