//! Queueing methods (issue 22), through real sockets, on the memory store
//! and on a real Redis with two gateways sharing it:
//!
//! - `queue_all`: a lone visitor at an idle room with credit is not let
//!   through by its join nor by a guarded request; it waits for the next
//!   tick, then is admitted.
//! - `reject`: a full room answers 503 `room_full` with `Retry-After` at
//!   once, at the challenge (before any work) and at the join, on every
//!   gateway; nothing is taken (no seq, the proof of work still good).
//! - bad values of `method` are 422 `invalid_setting`, changing nothing.
//!
//! The fairness measure with a gateway SIGKILLed mid-flight is in
//! `tests/tests/fairness.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;
use sluice_gateway::config::RoomConfig;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{TestGateway, admin_patch, admin_room, temp_keys};

fn room(id: &str, rate: f64, burst: f64, method: &str) -> RoomConfig {
    RoomConfig {
        method: sluice_admission::QueueMethod::parse(method).unwrap(),
        ..sluice_tests::easy_room(id, rate, burst, &[&format!("/{id}")])
    }
}

/// Gateways on one store: one on memory (`redis` none), or two on Redis.
async fn gateways(origin: &TestOrigin, redis: Option<&RedisServer>) -> Vec<TestGateway> {
    let keys = temp_keys();
    let n = if redis.is_some() { 2 } else { 1 };
    let mut out = Vec::new();
    for _ in 0..n {
        let keys = keys.clone();
        let mut b = TestGateway::builder()
            .origin(origin.url())
            .config(move |c| {
                c.rooms = vec![
                    room("all", 1000.0, 50.0, "queue_all"),
                    room("full", 0.001, 1.0, "reject"),
                    room("plain", 1000.0, 50.0, "fifo"),
                ];
                c.pow_secret = Some("methods-test-pow-secret-0123456789abcdef".into());
                c.keys_dir = Some(keys);
            });
        if let Some(r) = redis {
            b = b.redis(r.url());
        }
        out.push(b.spawn().await);
    }
    out
}

async fn queue_all(gws: &[TestGateway]) {
    let a = gws[0].url();
    let b = gws[gws.len() - 1].url();
    // a guarded request without a place is not let through (no passthrough)
    let page = TestClient::new()
        .get(&format!("{a}/all/item"), &[("accept", "text/html")])
        .await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("set-cookie")
            .is_none_or(|c| !c.contains("sluice_a_all"))
    );
    assert!(page.text().contains("data-room"), "the waiting page");
    // joins at an idle room with credit wait, on either gateway
    let mut first = Visitor::new(&a, "all");
    let res = first.join("/all/item").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["state"], "waiting");
    let mut second = Visitor::new(&b, "all");
    let res = second.join("/all/item").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert!(second.seq.unwrap() > first.seq.unwrap());
    // the next tick admits them, in order
    assert!(first.wait_admitted(Duration::from_secs(10), 200).await);
    assert!(second.wait_admitted(Duration::from_secs(10), 200).await);
    let view = admin_room(&a, "all").await;
    assert_eq!(view["method"], "queue_all");
    // the same settings elsewhere in FIFO pass a lone visitor through
    let mut plain = Visitor::new(&b, "plain");
    let res = plain.join("/plain").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "admitted");
}

async fn reject(gws: &[TestGateway]) {
    let a = gws[0].url();
    let b = gws[gws.len() - 1].url();
    // a challenge fetched and solved while the room still has its one slot
    let spare = Visitor::new(&b, "full");
    let (challenge, solutions) = spare.solved().await;
    let mut lucky = Visitor::new(&a, "full");
    let res = lucky.join("/full").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "admitted");
    let tail = admin_room(&a, "full").await["tail"].as_u64().unwrap();

    // Now full, on both gateways: the join, with the solution bought
    // before (atomic in the store, whatever the gateway's snapshot says)…
    let mut late = Visitor::new(&b, "full");
    let res = late.join_with(&challenge, &solutions, "/full").await;
    assert_eq!(res.status, 503, "{}", res.text());
    let v = res.json();
    assert_eq!(v["code"], "room_full", "{v}");
    assert!(res.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    assert!(late.queue_token.is_none() && late.admission_token.is_none());
    assert!(
        res.header("content-type")
            .unwrap()
            .starts_with("application/problem+json")
    );
    // …and, once the snapshots have the slot gone, the challenge: no work
    // is handed out for a room that would refuse it
    let mut refused = None;
    for _ in 0..50 {
        let c = Visitor::new(&a, "full").challenge().await;
        if c.status == 503 {
            refused = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = refused.expect("the challenge of a full reject room is refused");
    assert_eq!(c.json()["code"], "room_full");
    assert!(c.header("retry-after").is_some());
    // nothing taken: no seq, nobody waiting
    for base in [&a, &b] {
        let view = admin_room(base, "full").await;
        assert_eq!(view["tail"].as_u64().unwrap(), tail, "{view}");
        assert_eq!(view["queue_length"], 0, "{view}");
        assert_eq!(view["method"], "reject");
        // Each gateway says so from its own snapshot: the one that did not
        // refuse may be a tick behind (it was, once, in a full run).
        let mut public = serde_json::Value::Null;
        for _ in 0..50 {
            public = TestClient::new()
                .get(&format!("{base}/_sluice/rooms/full"), &[])
                .await
                .json();
            if public["full"] == true {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(public["method"], "reject");
        assert_eq!(public["full"], true, "{public}");
    }
    // counted on the gateways that refused
    let refusals = sluice_tests::metric(&a, "sluice_room_full_total{room=\"full\"}").await;
    assert!(refusals >= 1.0, "{refusals}");
    // the same solution stays good: once the room has room, it gets in
    let res = admin_patch(&a, "full", json!({"rate_per_sec": 1000.0})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let res = late.join_with(&challenge, &solutions, "/full").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "admitted");
}

async fn bad_values(gws: &[TestGateway]) {
    let a = gws[0].url();
    let before = admin_room(&a, "plain").await;
    for bad in [
        json!({"method": "lottery"}),
        json!({"method": "FIFO"}),
        json!({"method": 3}),
        json!({"method": null}),
        json!({"method": "reject", "opens_at": "2999-01-01T00:00:00Z"}),
        json!({"method": "queue_all", "burst": 0.5}),
    ] {
        let res = admin_patch(&a, "plain", bad.clone()).await;
        assert_eq!(res.status, 422, "{bad}: {}", res.text());
        assert_eq!(res.json()["code"], "invalid_setting", "{bad}");
    }
    let after = admin_room(&a, "plain").await;
    assert_eq!(after["method"], "fifo");
    assert_eq!(after["burst"], before["burst"]);
    assert!(after["opens_at"].is_null(), "{after}");
    // a good one reaches every gateway within a tick
    let res = admin_patch(&a, "plain", json!({"method": "queue_all"})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["method"], "queue_all");
    let b = gws[gws.len() - 1].url();
    let mut seen = false;
    for _ in 0..30 {
        if admin_room(&b, "plain").await["method"] == "queue_all" {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "the method did not reach the other gateway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn methods_on_the_memory_store() {
    let origin = TestOrigin::start().await;
    let gws = gateways(&origin, None).await;
    queue_all(&gws).await;
    reject(&gws).await;
    bad_values(&gws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn methods_on_redis_with_two_gateways() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gws = gateways(&origin, Some(&redis)).await;
    queue_all(&gws).await;
    reject(&gws).await;
    bad_values(&gws).await;
}
