//! Categories (tiers) within an event, end to end over HTTP, on the
//! in-memory store and on a real `redis-server`: an event configured with
//! categories, multi-category holds (all or nothing), cart limits per
//! category and across them, every bad-input code with nothing partially
//! applied, payment, and stock changes per category.
//!
//! The Redis test skips loudly when `redis-server` is missing (a failure
//! under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};
use sluice_gateway::config::event::CategoryConfig;
use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway, pay_succeeded};

const WEBHOOK_SECRET: &str = "whsec-categories-0123456789";

/// `tiers`: floor 5 (at most 2 per visitor) and vip 2, at most 3 units per
/// visitor across both; `demo`: the plain event of 100 units.
async fn gateway(origin: &TestOrigin, redis: Option<&RedisServer>) -> TestGateway {
    gateway_at(origin.url(), redis).await
}

/// [`gateway`] in front of the origin at `origin`.
async fn gateway_at(origin: String, redis: Option<&RedisServer>) -> TestGateway {
    let room = RoomConfig {
        id: "default".into(),
        rate_per_sec: 10_000.0,
        burst: 10_000.0,
        puzzles: 1,
        difficulty_floor_bits: 1,
        difficulty_ceiling_bits: 2,
        join_limit_per_prefix_per_min: 0,
        attack_min_solve: Duration::ZERO,
        ..RoomConfig::default()
    };
    let tiers = EventConfig {
        id: "tiers".into(),
        cart_limit: 3,
        categories: vec![
            CategoryConfig {
                id: "floor".into(),
                total: 5,
                cart_limit: Some(2),
            },
            CategoryConfig {
                id: "vip".into(),
                total: 2,
                cart_limit: None,
            },
        ],
        ..EventConfig::default()
    };
    let mut b = TestGateway::builder().origin(origin).config(move |c| {
        c.webhook_secret = Some(WEBHOOK_SECRET.into());
        c.rooms = vec![room];
        c.events = vec![tiers, EventConfig::default()];
    });
    if let Some(r) = redis {
        b = b.redis(r.url());
    }
    let gw = b.spawn().await;
    for ev in ["tiers", "demo"] {
        wait_ready(&gw.url(), ev).await;
    }
    gw
}

fn admin_headers() -> Vec<(&'static str, String)> {
    vec![
        ("authorization", format!("Bearer {ADMIN_TOKEN}")),
        ("content-type", "application/json".into()),
    ]
}

async fn admin(base: &str, method: Method, event: &str, body_text: &str) -> Answer {
    let h = admin_headers();
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    TestClient::new()
        .call(
            method,
            &format!("{base}/_sluice/admin/events/{event}"),
            &h,
            body(body_text.to_owned()),
        )
        .await
}

async fn admin_view(base: &str, event: &str) -> Value {
    let res = admin(base, Method::GET, event, "").await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

async fn wait_ready(base: &str, event: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while admin(base, Method::GET, event, "").await.json()["ready"] != true {
        assert!(Instant::now() < deadline, "{event} never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `(available, held, confirmed)` of each category, by the admin view.
async fn counters(base: &str) -> Vec<(String, u64, u64, u64)> {
    let v = admin_view(base, "tiers").await;
    assert_eq!(v["invariant_holds"], true, "{v}");
    v["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["available"].as_u64().unwrap(),
                c["held"].as_u64().unwrap(),
                c["confirmed"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn admit(base: &str) -> String {
    let mut v = Visitor::new(base, "default");
    let res = v.join("/").await;
    assert!(res.status.is_success(), "join: {}", res.text());
    assert!(v.wait_admitted(Duration::from_secs(30), 50).await);
    v.admission_token.expect("admission token")
}

async fn hold(base: &str, token: &str, event: &str, req: Value) -> Answer {
    let auth = format!("Bearer {token}");
    TestClient::new()
        .call(
            Method::POST,
            &format!("{base}/_sluice/events/{event}/holds"),
            &[
                ("content-type", "application/json"),
                ("authorization", &auth),
            ],
            body(req.to_string()),
        )
        .await
}

fn items(list: &[(&str, u64)]) -> Value {
    json!({"items": list.iter().map(|(c, q)| json!({"category": c, "qty": q})).collect::<Vec<_>>()})
}

fn expect(res: &Answer, status: u16, code: &str) -> Value {
    assert_eq!(res.status, status, "{}", res.text());
    let v = res.json();
    assert_eq!(v["code"], code, "{v}");
    v
}

async fn scenario(redis: Option<&RedisServer>) {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, redis).await;
    let base = gw.url();
    let (a, b) = (admit(&base).await, admit(&base).await);

    // The visitor's view lists the categories.
    let auth = format!("Bearer {a}");
    let ev = TestClient::new()
        .get(
            &format!("{base}/_sluice/events/tiers"),
            &[("authorization", &auth)],
        )
        .await
        .json();
    assert_eq!(ev["total"], 7, "{ev}");
    assert_eq!(ev["categories"][0]["id"], "floor", "{ev}");
    assert_eq!(ev["categories"][0]["cart_limit"], 2, "{ev}");

    // A multi-category hold: all of it, answered with its items.
    let res = hold(&base, &a, "tiers", items(&[("floor", 2), ("vip", 1)])).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let held = res.json();
    assert_eq!(held["qty"], 3);
    assert_eq!(held["items"][1], json!({"category": "vip", "qty": 1}));
    assert_eq!(held["available"], 4);
    let start = counters(&base).await;
    assert_eq!(
        start,
        vec![("floor".into(), 3, 2, 0), ("vip".into(), 1, 1, 0)]
    );

    // Refusals, each changing nothing.
    let v = expect(
        &hold(&base, &a, "tiers", items(&[("vip", 1)])).await,
        409,
        "cart_limit_exceeded",
    );
    assert_eq!(
        (v["limit"].clone(), v["held"].clone()),
        (json!(3), json!(3))
    );
    let v = expect(
        &hold(&base, &b, "tiers", items(&[("floor", 3)])).await,
        409,
        "cart_limit_exceeded",
    );
    assert_eq!(v["category"], "floor", "{v}");
    let v = expect(
        &hold(&base, &b, "tiers", items(&[("floor", 1), ("vip", 2)])).await,
        409,
        "sold_out",
    );
    assert_eq!(
        (v["category"].clone(), v["available"].clone()),
        (json!("vip"), json!(1))
    );
    let v = expect(
        &hold(&base, &b, "tiers", items(&[("floor", 1), ("balcony", 1)])).await,
        404,
        "category_not_found",
    );
    assert_eq!(v["category"], "balcony");
    let v = expect(
        &hold(&base, &b, "tiers", items(&[("vip", 1), ("vip", 1)])).await,
        400,
        "duplicate_category",
    );
    assert_eq!(v["category"], "vip");
    expect(
        &hold(&base, &b, "tiers", items(&[("floor", 1), ("vip", 0)])).await,
        422,
        "invalid_quantity",
    );
    expect(
        &hold(&base, &b, "tiers", json!({"qty": 1})).await,
        422,
        "items_required",
    );
    expect(
        &hold(
            &base,
            &b,
            "tiers",
            json!({"qty": 1, "items": [{"category": "vip", "qty": 1}]}),
        )
        .await,
        400,
        "malformed_request",
    );
    expect(
        &hold(&base, &b, "tiers", json!({"items": []})).await,
        400,
        "malformed_request",
    );
    // Items on an event without categories; a bare qty there as before.
    expect(
        &hold(&base, &b, "demo", items(&[("floor", 1)])).await,
        404,
        "category_not_found",
    );
    assert_eq!(hold(&base, &b, "demo", json!({"qty": 1})).await.status, 201);
    assert_eq!(counters(&base).await, start, "a refusal changed something");

    // A category's total below what is held in it: refused, nothing changed.
    let put = |floor: u64, version: u64| {
        json!({"cart_limit": 3, "hold_ttl_seconds": 300, "version": version,
            "categories": [{"id": "floor", "total": floor, "cart_limit": 2}, {"id": "vip", "total": 2}]})
        .to_string()
    };
    let v = expect(
        &admin(&base, Method::PUT, "tiers", &put(1, 2)).await,
        409,
        "category_below_committed",
    );
    assert_eq!(
        (v["category"].clone(), v["held"].clone()),
        (json!("floor"), json!(2))
    );
    let dropped = json!({"cart_limit": 3, "hold_ttl_seconds": 300, "version": 2,
        "categories": [{"id": "floor", "total": 5}]});
    let v = expect(
        &admin(&base, Method::PUT, "tiers", &dropped.to_string()).await,
        409,
        "category_below_committed",
    );
    assert_eq!(v["category"], "vip");
    let mismatch = json!({"total": 3, "cart_limit": 3, "hold_ttl_seconds": 300, "version": 2,
        "categories": [{"id": "floor", "total": 5}, {"id": "vip", "total": 2}]});
    expect(
        &admin(&base, Method::PUT, "tiers", &mismatch.to_string()).await,
        422,
        "invalid_setting",
    );
    let twice = json!({"cart_limit": 3, "hold_ttl_seconds": 300, "version": 2,
        "categories": [{"id": "vip", "total": 5}, {"id": "vip", "total": 2}]});
    expect(
        &admin(&base, Method::PUT, "tiers", &twice.to_string()).await,
        422,
        "invalid_setting",
    );
    assert_eq!(counters(&base).await, start);

    // Paid: each category's units are sold, once.
    let hold_id = held["hold_id"].as_str().unwrap();
    let paid = pay_succeeded(&base, WEBHOOK_SECRET, hold_id).await;
    assert_eq!(paid.status, 200, "{}", paid.text());
    assert_eq!(
        counters(&base).await,
        vec![("floor".into(), 3, 0, 2), ("vip".into(), 1, 0, 1)]
    );
    // More floor stock: what is sold stays sold.
    let res = admin(&base, Method::PUT, "tiers", &put(10, 2)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        counters(&base).await,
        vec![("floor".into(), 8, 0, 2), ("vip".into(), 1, 0, 1)]
    );
    assert_eq!(admin_view(&base, "tiers").await["total"], 12);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn categories_in_memory() {
    tokio::time::timeout(Duration::from_secs(60), scenario(None))
        .await
        .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn categories_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    tokio::time::timeout(Duration::from_secs(60), scenario(Some(&redis)))
        .await
        .expect("bounded");
}

/// The served OpenAPI document names every category code where it is
/// answered: `duplicate_category` (400) and `category_not_found` (404) and
/// `items_required` (422) on a hold, `category_below_committed` (409) on a
/// stock `PUT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_openapi_names_the_category_codes() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, None).await;
    let res = TestClient::new()
        .call(
            Method::GET,
            &format!("{}/_sluice/openapi.json", gw.url()),
            &[],
            body(""),
        )
        .await;
    assert_eq!(res.status, 200);
    let doc = res.json();
    let codes_of = |path: &str, method: &str, status: &str| -> Vec<String> {
        let resp = &doc["paths"][path][method]["responses"][status];
        let text = resp.to_string();
        assert!(!resp.is_null(), "{method} {path} {status} undocumented");
        [
            "duplicate_category",
            "category_not_found",
            "items_required",
            "category_below_committed",
        ]
        .iter()
        .filter(|c| text.contains(*c))
        .map(|c| (*c).to_owned())
        .collect()
    };
    let holds = "/_sluice/events/{event}/holds";
    assert_eq!(codes_of(holds, "post", "400"), ["duplicate_category"]);
    assert_eq!(codes_of(holds, "post", "404"), ["category_not_found"]);
    assert_eq!(codes_of(holds, "post", "422"), ["items_required"]);
    assert_eq!(
        codes_of("/_sluice/admin/events/{event}", "put", "409"),
        ["category_below_committed"]
    );
    gw.shutdown().await;
}

/// The demo shop in a real headless Chromium on an event with categories:
/// the page shows each category with what is left, the visitor picks 2
/// floor and 1 vip, holds them in one request, sees the breakdown, pays
/// through the demo provider and sees it on the confirmation; the admin
/// view counts the units per category. Skips loudly without chromium
/// (a failure under `CI=true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_shop_sells_categories_in_a_browser() {
    use sluice_gateway::tools::demo_origin::{self, DemoOptions};
    use sluice_tests::browser::wait_for;
    use sluice_tests::shop_path::Page as _;
    let Some(mut b) = sluice_tests::chromium::Browser::start("categories", (412, 915)).await else {
        return;
    };
    let shop = demo_origin::spawn(DemoOptions {
        webhook_secret: Some(WEBHOOK_SECRET.into()),
        gateway: None,
    })
    .await
    .expect("demo shop");
    let gw = gateway_at(shop.url(), None).await;
    shop.set_gateway(gw.url());
    let base = gw.url();
    b.c()
        .goto(&format!("{base}/shop/tiers"))
        .await
        .expect("open the shop");
    wait_for(Duration::from_secs(30), "the categories", || async {
        (b.visible("#tiers").await && b.text("#tiers").await.contains("5 of 5")).then_some(())
    })
    .await;
    assert!(!b.visible("#single").await, "no bare quantity");
    b.select("#qty-floor", "2").await;
    b.select("#qty-vip", "1").await;
    b.shot("tiers").await;
    b.click("#hold-btn").await;
    wait_for(Duration::from_secs(10), "the hold", || async {
        (b.visible("#hold").await && b.text("#hold-qty").await == "3").then_some(())
    })
    .await;
    assert_eq!(b.text("#hold-items").await, "floor × 2, vip × 1");
    b.click("#pay").await;
    wait_for(Duration::from_secs(10), "the payment page", || async {
        b.url().await.contains("/demo-pay/").then_some(())
    })
    .await;
    assert_eq!(b.text("#order-items").await, "floor × 2, vip × 1");
    b.click("#pay-confirm").await;
    wait_for(Duration::from_secs(10), "the confirmation", || async {
        (b.text("#order-status").await == "confirmed").then_some(())
    })
    .await;
    assert_eq!(b.text("#order-items").await, "floor × 2, vip × 1");
    b.shot("confirmed").await;
    b.close().await;
    assert_eq!(
        counters(&base).await,
        vec![("floor".to_owned(), 3, 0, 2), ("vip".to_owned(), 1, 0, 1)]
    );
    gw.shutdown().await;
}
