//! Sold out stops admission and resumes it when stock comes back, across
//! two gateways sharing a real Redis: an event of 2 tickets, one buyer's
//! holds take both; visitors who then wait are told `sold_out` and the
//! frontier stays put on both gateways; the holds expire (a short hold
//! TTL), the reaper returns the stock, and the room admits again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_gateway::config::EventConfig;
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{TestGateway, admin_room, easy_room};

async fn until(limit: Duration, what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sold_out_stops_admission_and_returning_stock_resumes_it() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gateway = || {
        TestGateway::builder()
            .origin(origin.url())
            .redis(redis.url())
            .config(|c| {
                c.rooms = vec![easy_room("shop", 20.0, 1.0, &["/shop"])];
                c.events = vec![EventConfig {
                    id: "gig".into(),
                    room: "shop".into(),
                    total: 2,
                    cart_limit: 2,
                    hold_ttl: Duration::from_secs(3),
                    ..EventConfig::default()
                }];
            })
            .spawn()
    };
    let gw1 = gateway().await;
    let gw2 = gateway().await;
    let (b1, b2) = (gw1.url(), gw2.url());

    // The buyer passes through (nobody waits) and holds both tickets.
    let mut buyer = Visitor::new(&b1, "shop");
    let res = buyer.join("/shop").await;
    assert_eq!(res.json()["state"], "admitted", "{}", res.text());
    let res = buyer
        .call_admitted(
            http::Method::POST,
            "/_sluice/events/gig/holds",
            Some(json!({"qty": 2})),
            &[],
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());

    // Every gateway sees the room sold out and stops admitting.
    for base in [&b1, &b2] {
        until(Duration::from_secs(5), "sold out", async || {
            let v = admin_room(base, "shop").await;
            v["sold_out"] == true && v["state"] == "sold_out"
        })
        .await;
    }
    let frontier = admin_room(&b1, "shop").await["frontier"].as_u64().unwrap();

    // Visitors joining now keep a place but are told it is sold out.
    let mut waiting = Vec::new();
    for base in [&b1, &b2, &b2] {
        let mut v = Visitor::new(base, "shop");
        let res = v.join("/shop").await;
        assert_eq!(res.status, 201, "{}", res.text());
        assert_eq!(res.json()["state"], "waiting", "{}", res.text());
        let res = v.status().await;
        let s = res.json();
        assert_eq!(s["state"], "sold_out", "{s}");
        assert_eq!(s["stock_may_return"], true, "{s}");
        waiting.push(v);
    }
    let public = sluice_tests::client::TestClient::new()
        .get(&format!("{b2}/_sluice/rooms/shop"), &[])
        .await
        .json();
    assert_eq!(public["state"], "sold_out", "{public}");
    // Ticks go by on both gateways (credit at 20/s would admit them all):
    // the frontier stays put.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for base in [&b1, &b2] {
        let v = admin_room(base, "shop").await;
        assert_eq!(v["frontier"].as_u64().unwrap(), frontier, "{v}");
        assert_eq!(v["queue_length"].as_u64().unwrap(), 3, "{v}");
    }

    // The holds expire, the reaper returns the stock: admission resumes
    // and the waiting visitors get in, in order.
    for v in &mut waiting {
        assert!(
            v.wait_admitted(Duration::from_secs(15), 200).await,
            "visitor {:?} not admitted after the stock came back",
            v.seq
        );
    }
    let v = admin_room(&b2, "shop").await;
    assert_eq!(v["sold_out"], false, "{v}");
    assert!(v["frontier"].as_u64().unwrap() >= frontier + 3, "{v}");
    let stock = sluice_tests::client::TestClient::new()
        .get(
            &format!("{b1}/_sluice/admin/events/gig"),
            &[(
                "authorization",
                &format!("Bearer {}", sluice_tests::ADMIN_TOKEN),
            )],
        )
        .await
        .json();
    assert_eq!(
        (stock["available"].clone(), stock["held"].clone()),
        (json!(2), json!(0)),
        "{stock}"
    );
    gw1.shutdown().await;
    gw2.shutdown().await;
}
