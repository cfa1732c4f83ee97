//! `/metrics`: behind the admin token, valid Prometheus text, every
//! documented metric present.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_gateway::config::RoomConfig;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway};

#[tokio::test]
async fn metrics_parse_and_name_everything_documented() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.rooms = vec![RoomConfig {
                rate_per_sec: 1.0,
                burst: 1.0,
                puzzles: 1,
                difficulty_floor_bits: 2,
                difficulty_ceiling_bits: 4,
                join_limit_per_prefix_per_min: 0,
                attack_min_solve: Duration::ZERO,
                ..RoomConfig::default()
            }]
        })
        .spawn()
        .await;
    let c = TestClient::new();
    // traffic of every kind
    let mut a = Visitor::new(&gw.url(), "default");
    a.join("/").await;
    let _ = a.get_admitted("/echo/x").await;
    let mut b = Visitor::new(&gw.url(), "default");
    b.join("/").await;
    let _ = c
        .get(
            &format!("{}/echo/y", gw.url()),
            &[("accept", "application/json")],
        )
        .await;
    let _ = b.join_with("bogus.challenge", &["1".to_owned()], "/").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let url = format!("{}/metrics", gw.url());
    assert_eq!(c.get(&url, &[]).await.status, 401);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let res = c.get(&url, &[("authorization", &bearer)]).await;
    assert_eq!(res.status, 200);
    assert!(
        res.header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let text = res.text();
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    let names: std::collections::HashSet<String> =
        scrape.samples.iter().map(|s| s.metric.clone()).collect();
    for m in [
        "sluice_joins_total",
        "sluice_admissions_total",
        "sluice_claims_total",
        "sluice_refunds_total",
        "sluice_queue_length",
        "sluice_active_sessions",
        "sluice_admission_rate_per_second",
        "sluice_admits_per_second",
        "sluice_pow_difficulty_bits",
        "sluice_store_up",
        "sluice_challenges_total",
        "sluice_pow_rejections_total",
        "sluice_waiting_room_served_total",
        "sluice_upstream_request_duration_seconds",
    ] {
        assert!(names.contains(m), "{m} missing from /metrics:\n{text}");
    }
    let latency = scrape
        .samples
        .iter()
        .find(|s| s.metric == "sluice_upstream_request_duration_seconds")
        .unwrap();
    assert!(
        matches!(latency.value, prometheus_parse::Value::Histogram(_)),
        "{:?}",
        latency.value
    );
    let joins = scrape
        .samples
        .iter()
        .find(|s| s.metric == "sluice_joins_total")
        .unwrap();
    assert_eq!(joins.labels.get("room"), Some("default"));
    match joins.value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => {
            assert!(v >= 2.0, "{v}")
        }
        ref other => panic!("joins_total is {other:?}"),
    }
}
