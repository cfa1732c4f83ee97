//! `/metrics`: behind the admin token, valid Prometheus text, every metric
//! of the README's table present (read from the README itself, so a metric
//! documented but never recorded fails here).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;
use sluice_gateway::config::{EventConfig, RoomConfig};
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
            }];
            c.events = vec![EventConfig {
                total: 10,
                cart_limit: 2,
                ..EventConfig::default()
            }];
        })
        .spawn()
        .await;
    let c = TestClient::new();
    // traffic of every kind
    let mut a = Visitor::new(&gw.url(), "default");
    a.join("/").await;
    let _ = a.get_admitted("/echo/x").await;
    // a hold (sluice_holds_total); the event's stock is loaded by the reaper
    let mut held = false;
    for _ in 0..50 {
        let res = a
            .call_admitted(
                http::Method::POST,
                "/_sluice/events/demo/holds",
                Some(json!({"qty": 1})),
                &[],
            )
            .await;
        if res.status == 201 {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held, "no hold");
    // an origin that cannot be reached (sluice_upstream_errors_total)
    let unreachable = TestGateway::builder()
        .origin("http://127.0.0.1:9".to_owned())
        .unguarded()
        .spawn()
        .await;
    let res = c.get(&format!("{}/x", unreachable.url()), &[]).await;
    assert_eq!(res.status, 502);
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
    // Metrics only a particular situation records, each checked where it
    // happens: a lagging replica (tests/failover.rs), adaptive admission
    // (tests/adaptive.rs), the per-network limit and the in-flight bounds
    // (tests/limits.rs, tests/faults.rs), an
    // unreachable origin (the other gateway, below).
    let elsewhere = [
        "sluice_hold_replication_lagged_total",
        "sluice_adaptive_rate_per_second",
        "sluice_adaptive_decisions_total",
        "sluice_origin_p99_seconds",
        "sluice_origin_error_ratio",
        "sluice_rate_limited_total",
        "sluice_upstream_errors_total",
        "sluice_shed_total",
        // the ledger's, with Redis and PostgreSQL (tests/rebuild.rs)
        "sluice_ledger_lag_entries",
        "sluice_ledger_lag_seconds",
        "sluice_ledger_behind",
        "sluice_ledger_drift_units",
        // ... per category, once one drifted (tests/rebuild.rs)
        "sluice_ledger_category_drift_units",
        "sluice_ledger_rebuilds_total",
        // the stock feeds' lane, once rows were posted (tests/feeds.rs)
        "sluice_feed_rows_total",
        "sluice_feed_depth",
        // a full `reject` room (tests/methods.rs)
        "sluice_room_full_total",
        // a request claiming to be a verified crawler (tests/crawlers.rs)
        "sluice_crawler_requests_total",
        // holds on Redis (tests/faults.rs)
        "sluice_hold_store_steps_total",
        "sluice_hold_store_step_holds_total",
    ];
    let documented = documented_metrics();
    assert!(documented.len() >= 20, "{documented:?}");
    for m in &documented {
        if !elsewhere.contains(&m.as_str()) {
            assert!(names.contains(m), "{m} missing from /metrics:\n{text}");
        }
    }
    for m in elsewhere {
        assert!(documented.iter().any(|d| d == m), "{m} is not documented");
    }
    let holds = scrape
        .samples
        .iter()
        .find(|s| s.metric == "sluice_holds_total")
        .unwrap();
    assert_eq!(holds.labels.get("outcome"), Some("held"));
    let other = c
        .get(
            &format!("{}/metrics", unreachable.url()),
            &[("authorization", &bearer)],
        )
        .await
        .text();
    assert!(
        other.contains("sluice_upstream_errors_total{kind=\"unreachable\"} 1"),
        "{other}"
    );
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

/// The metric names of the README's metrics table (rows starting with a
/// backquoted `sluice_…` name).
fn documented_metrics() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `sluice_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("sluice_{name}"))
        .collect()
}
