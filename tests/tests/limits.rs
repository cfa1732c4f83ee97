//! Per-network rate limits on the challenge and join endpoints, and the
//! bypass rules that let good bots, feeds and allow-listed ranges through
//! without a queue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;
use sluice_gateway::config::RoomConfig;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use sluice_tests::{TestGateway, admin_patch, admin_room};

fn room(limit: u32, bypass_ips: Vec<ipnet::IpNet>) -> RoomConfig {
    RoomConfig {
        rate_per_sec: 0.0,
        burst: 1.0,
        puzzles: 1,
        difficulty_floor_bits: 2,
        difficulty_ceiling_bits: 4,
        join_limit_per_prefix_per_min: limit,
        attack_min_solve: Duration::ZERO,
        bypass_paths: vec!["/robots.txt".into(), "/feeds/".into()],
        bypass_ips,
        ..RoomConfig::default()
    }
}

#[tokio::test]
async fn challenges_and_joins_are_limited_per_network_with_retry_after() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.rooms = vec![room(5, vec![])])
        .spawn()
        .await;
    let c = TestClient::new();
    let url = format!("{}/_sluice/rooms/default/challenge", gw.url());
    let mut limited = None;
    for _ in 0..10 {
        let res = c.post_json(&url, &[], &json!({})).await;
        if res.status == 429 {
            limited = Some(res);
            break;
        }
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let res = limited.expect("the sixth challenge from one network must be refused");
    assert_eq!(res.json()["code"], "rate_limited");
    assert!(res.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    let state = admin_room(&gw.url(), "default").await;
    assert_eq!(state["join_limit_per_prefix_per_min"], 5);

    // The operator turns the limit off live: challenges flow again.
    let res = admin_patch(
        &gw.url(),
        "default",
        json!({"join_limit_per_prefix_per_min": 0}),
    )
    .await;
    assert_eq!(res.status, 200);
    let mut v = Visitor::new(&gw.url(), "default");
    assert!(v.join("/").await.status.is_success());
}

#[tokio::test]
async fn bypass_paths_and_allow_listed_ranges_skip_the_queue() {
    let origin = TestOrigin::start().await;
    // A room admitting nobody, so anything that reaches the origin bypassed it.
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.rooms = vec![room(0, vec![])])
        .spawn()
        .await;
    let mut first = Visitor::new(&gw.url(), "default");
    first.join("/").await; // spends the one credit
    let c = TestClient::new();
    let json_accept = [("accept", "application/json")];
    let res = c
        .get(&format!("{}/echo/product", gw.url()), &json_accept)
        .await;
    assert_eq!(res.status, 503, "a guarded path must queue");
    for path in ["/robots.txt", "/feeds/rss.xml"] {
        let res = c.get(&format!("{}{path}", gw.url()), &json_accept).await;
        // the test origin has no such files: its 404 proves the request got through
        assert_eq!(res.status, 404, "{path}: {}", res.text());
        assert_eq!(res.text(), "origin: not found");
    }
    // /feedsX is not under /feeds/
    let res = c.get(&format!("{}/feedsX", gw.url()), &json_accept).await;
    assert_eq!(res.status, 503);

    // An allow-listed range (loopback here) is never queued.
    let origin2 = TestOrigin::start().await;
    let allow = TestGateway::builder()
        .origin(origin2.url())
        .config(|c| c.rooms = vec![room(0, vec!["127.0.0.0/8".parse().unwrap()])])
        .spawn()
        .await;
    let res = c
        .get(&format!("{}/echo/product", allow.url()), &json_accept)
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}
