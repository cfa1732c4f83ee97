//! Sessions: the active cap, revoke by the origin, sliding renewal.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_gateway::config::RoomConfig;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use sluice_tests::{TestGateway, admin_room};

async fn capped_gateway(origin: &TestOrigin) -> TestGateway {
    TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.rooms = vec![RoomConfig {
                rate_per_sec: 100.0,
                burst: 100.0,
                max_active: Some(2),
                puzzles: 1,
                difficulty_floor_bits: 2,
                difficulty_ceiling_bits: 4,
                join_limit_per_prefix_per_min: 0,
                attack_min_solve: Duration::ZERO,
                ..RoomConfig::default()
            }]
        })
        .spawn()
        .await
}

#[tokio::test]
async fn revoke_by_the_origin_frees_a_slot_under_max_active() {
    let origin = TestOrigin::start().await;
    let gw = capped_gateway(&origin).await;
    let mut a = Visitor::new(&gw.url(), "default");
    let mut b = Visitor::new(&gw.url(), "default");
    assert!(a.join("/").await.status.is_success());
    assert!(b.join("/").await.status.is_success());
    assert!(a.admission_token.is_some() && b.admission_token.is_some());

    // The cap is reached: the third visitor waits, however long.
    let mut c = Visitor::new(&gw.url(), "default");
    let res = c.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.status().await.json()["state"], "waiting");
    let state = admin_room(&gw.url(), "default").await;
    assert_eq!(state["active_sessions"], 2, "{state}");

    // Checkout done: the origin says revoke.
    let res = a.get_admitted("/command/revoke").await;
    assert_eq!(res.status, 200);
    assert!(
        res.headers.get("sluice-command").is_none(),
        "internal header leaked"
    );
    let cleared = res.headers.get_all("set-cookie").iter().any(|v| {
        v.to_str().unwrap().starts_with("sluice_a_default=;")
            && v.to_str().unwrap().contains("Max-Age=0")
    });
    assert!(cleared, "admission cookie not cleared: {:?}", res.headers);

    // Within a tick or two the freed slot admits the next in line.
    assert!(
        c.wait_admitted(Duration::from_secs(5), 100).await,
        "revoke did not free a slot"
    );
    // never more than the cap at once (sessions plus admitted, unclaimed places)
    let state = admin_room(&gw.url(), "default").await;
    let busy =
        state["active_sessions"].as_u64().unwrap() + state["pending_claims"].as_u64().unwrap();
    assert!(busy <= 2, "{state}");
    assert_eq!(state["admitted_total"], 3, "{state}");
}
