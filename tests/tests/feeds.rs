//! Stock feeds end to end (issue 20): one row at once over
//! `POST /_sluice/admin/events/{event}/stock` and the ingestion lane
//! (`POST`/`GET …/feed`), in memory and on a real `redis-server`.
//!
//! - every bad-input code with nothing applied (a delta making stock
//!   negative, a reused key, a stale snapshot, a snapshot below what is
//!   held, unknown category and event, a missing category, malformed
//!   rows, a batch with one bad row);
//! - the lane with two gateway processes on one Redis: each row applied
//!   once (exact totals, exact counts of applied and replayed rows);
//! - a gateway SIGKILLed mid-lane and another started: no row lost, none
//!   applied twice (exact totals);
//! - Redis SIGKILLed while the consumer's pipelines are in flight and
//!   restarted from its append-only file: the failed pipeline goes back
//!   whole, no row lost, none applied twice (exact totals, one `stock`
//!   entry per row);
//! - the rate bound: right after a batch is accepted, most of it still
//!   waits (counts, not timings).
//!
//! The Redis tests skip loudly when `redis-server` is missing (a failure
//! under `CI=true`). Tests starting gateway processes need
//! `cargo build --workspace --all-features --bin sluice` first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};
use sluice_gateway::config::event::CategoryConfig;
use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::{RedisOptions, RedisServer};
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, TestGateway, temp_file, temp_keys};

// === helpers ===

async fn call(base: &str, method: Method, path: &str, body_text: String) -> Answer {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    TestClient::new()
        .call(
            method,
            &format!("{base}{path}"),
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ],
            body(body_text),
        )
        .await
}

async fn stock(base: &str, event: &str, row: Value) -> Answer {
    call(
        base,
        Method::POST,
        &format!("/_sluice/admin/events/{event}/stock"),
        row.to_string(),
    )
    .await
}

async fn feed(base: &str, event: &str, rows: &[Value]) -> Answer {
    call(
        base,
        Method::POST,
        &format!("/_sluice/admin/events/{event}/feed"),
        json!({ "rows": rows }).to_string(),
    )
    .await
}

/// The answer to a read of the event's feed lane.
async fn lane_answer(base: &str, event: &str) -> Answer {
    call(
        base,
        Method::GET,
        &format!("/_sluice/admin/events/{event}/feed"),
        String::new(),
    )
    .await
}

async fn lane(base: &str, event: &str) -> Value {
    let res = lane_answer(base, event).await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

/// [`lane`], or `None` while the gateway does not answer 200 (a 503 while
/// it reaches a restarted Redis again).
async fn lane_if_up(base: &str, event: &str) -> Option<Value> {
    let res = lane_answer(base, event).await;
    (res.status == 200).then(|| res.json())
}

async fn view(base: &str, event: &str) -> Value {
    let res = call(
        base,
        Method::GET,
        &format!("/_sluice/admin/events/{event}"),
        String::new(),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v = res.json();
    assert_eq!(v["invariant_holds"], true, "{v}");
    v
}

/// `(total, available, held)` of the event, and of each category.
async fn counts(base: &str, event: &str) -> (Value, Vec<Value>) {
    let v = view(base, event).await;
    let cats = v["categories"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| json!([c["id"], c["total"], c["available"], c["held"]]))
        .collect();
    (json!([v["total"], v["available"], v["held"]]), cats)
}

fn problem(res: &Answer, status: u16, code: &str) -> Value {
    assert_eq!(res.status, status, "{}", res.text());
    let v = res.json();
    assert_eq!(v["code"], code, "{v}");
    v
}

async fn wait_for(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ],
            body(req.to_string()),
        )
        .await
}

/// An in-process gateway with `plain` (100 units) and `tiers` (floor 5,
/// vip 2), on Redis when given.
async fn gateway(origin: &TestOrigin, redis: Option<&RedisServer>) -> TestGateway {
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
    let plain = EventConfig {
        id: "plain".into(),
        total: 100,
        cart_limit: 4,
        ..EventConfig::default()
    };
    let tiers = EventConfig {
        id: "tiers".into(),
        cart_limit: 4,
        categories: vec![
            CategoryConfig {
                id: "floor".into(),
                total: 5,
                cart_limit: None,
            },
            CategoryConfig {
                id: "vip".into(),
                total: 2,
                cart_limit: None,
            },
        ],
        ..EventConfig::default()
    };
    let mut b = TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = vec![room];
            c.events = vec![plain, tiers];
            c.feeds.rows_per_sec = 100_000;
        });
    if let Some(r) = redis {
        b = b.redis(r.url());
    }
    let gw = b.spawn().await;
    let base = gw.url();
    for ev in ["plain", "tiers"] {
        wait_for(ev, Duration::from_secs(15), async || {
            call(
                &base,
                Method::GET,
                &format!("/_sluice/admin/events/{ev}"),
                String::new(),
            )
            .await
            .json()["ready"]
                == true
        })
        .await;
    }
    gw
}

// === one row at once, and the lane on one gateway ===

async fn rows_and_codes(base: &str) {
    // Deltas and their replays.
    let res = stock(base, "plain", json!({"delta": 5, "key": "erp-1"})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let first = res.json();
    assert_eq!(
        (&first["total"], &first["available"], &first["replayed"]),
        (&json!(105), &json!(105), &json!(false))
    );
    let res = stock(base, "plain", json!({"delta": 5, "key": "erp-1"})).await;
    assert_eq!(res.status, 200);
    let again = res.json();
    assert_eq!(again["replayed"], true);
    assert_eq!(
        (&again["total"], &again["available"]),
        (&first["total"], &first["available"])
    );
    let before = counts(base, "plain").await;
    assert_eq!(before.0, json!([105, 105, 0]));

    // Each refusal changes nothing.
    let token = admit(base).await;
    let res = hold(base, &token, "plain", json!({"qty": 3})).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let before = counts(base, "plain").await;
    assert_eq!(before.0, json!([105, 102, 3]));
    problem(
        &stock(base, "plain", json!({"delta": 6, "key": "erp-1"})).await,
        409,
        "feed_key_reused",
    );
    let v = problem(
        &stock(base, "plain", json!({"delta": -103, "key": "erp-2"})).await,
        409,
        "stock_negative",
    );
    assert_eq!(v["available"], 102);
    let res = stock(base, "plain", json!({"total": 50, "version": 2})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v = problem(
        &stock(base, "plain", json!({"total": 60, "version": 2})).await,
        409,
        "stale_version",
    );
    assert_eq!(v["current_version"], 2);
    let v = problem(
        &stock(base, "plain", json!({"total": 2, "version": 3})).await,
        409,
        "below_committed",
    );
    assert_eq!(v["held"], 3);
    problem(
        &stock(
            base,
            "plain",
            json!({"delta": 1, "key": "k", "category": "vip"}),
        )
        .await,
        404,
        "category_not_found",
    );
    problem(
        &stock(base, "nope", json!({"delta": 1, "key": "k"})).await,
        404,
        "event_not_found",
    );
    for (row, status, code) in [
        (json!({}), 400, "malformed_request"),
        (json!({"delta": 1}), 400, "malformed_request"),
        (
            json!({"delta": 1, "key": "k", "total": 1}),
            400,
            "malformed_request",
        ),
        (json!({"total": 1}), 400, "malformed_request"),
        (
            json!({"delta": 1, "key": "k", "extra": true}),
            400,
            "malformed_request",
        ),
        (json!([1, 2]), 400, "malformed_request"),
        (json!({"delta": 0, "key": "k"}), 422, "invalid_setting"),
        (json!({"delta": 1, "key": "a b"}), 422, "invalid_setting"),
        (
            json!({"delta": 1, "key": "k".repeat(129)}),
            422,
            "invalid_setting",
        ),
        (json!({"total": -1, "version": 4}), 422, "invalid_setting"),
        (
            json!({"total": 9_007_199_254_740_993u64, "version": 4}),
            422,
            "invalid_setting",
        ),
    ] {
        problem(&stock(base, "plain", row).await, status, code);
    }
    let unauth = TestClient::new()
        .call(
            Method::POST,
            &format!("{base}/_sluice/admin/events/plain/stock"),
            &[("content-type", "application/json")],
            body(json!({"delta": 1, "key": "x"}).to_string()),
        )
        .await;
    assert_eq!(unauth.status, 401);
    assert_eq!(counts(base, "plain").await.0, json!([50, 47, 3]));

    // Categories: each row names one; per-category versions.
    let res = hold(
        base,
        &token,
        "tiers",
        json!({"items": [{"category": "floor", "qty": 2}]}),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    problem(
        &stock(base, "tiers", json!({"delta": 1, "key": "t1"})).await,
        422,
        "category_required",
    );
    let v = problem(
        &stock(
            base,
            "tiers",
            json!({"delta": 1, "key": "t1", "category": "balcony"}),
        )
        .await,
        404,
        "category_not_found",
    );
    assert_eq!(v["category"], "balcony");
    let v = problem(
        &stock(
            base,
            "tiers",
            json!({"total": 1, "version": 1, "category": "floor"}),
        )
        .await,
        409,
        "category_below_committed",
    );
    assert_eq!((&v["category"], &v["held"]), (&json!("floor"), &json!(2)));
    problem(
        &stock(
            base,
            "tiers",
            json!({"delta": -4, "key": "t1", "category": "floor"}),
        )
        .await,
        409,
        "stock_negative",
    );
    let res = stock(
        base,
        "tiers",
        json!({"delta": 10, "key": "t1", "category": "vip"}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v = res.json();
    assert_eq!(
        (&v["total"], &v["category_total"], &v["category_available"]),
        (&json!(17), &json!(12), &json!(12))
    );
    let res = stock(
        base,
        "tiers",
        json!({"total": 9, "version": 7, "category": "floor"}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["version"], 7);
    // vip has no version yet: any applies; floor's guard is its own.
    let res = stock(
        base,
        "tiers",
        json!({"total": 12, "version": 1, "category": "vip"}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    problem(
        &stock(
            base,
            "tiers",
            json!({"total": 8, "version": 7, "category": "floor"}),
        )
        .await,
        409,
        "stale_version",
    );
    let (event, cats) = counts(base, "tiers").await;
    assert_eq!(event, json!([21, 19, 2]));
    assert_eq!(
        cats,
        vec![json!(["floor", 9, 7, 2]), json!(["vip", 12, 12, 0])]
    );

    // The lane: a batch with one bad row is refused whole.
    let mut rows: Vec<Value> = (0..50)
        .map(|i| json!({"delta": 1, "key": format!("lane-{i}")}))
        .collect();
    rows[37] = json!({"delta": 1});
    let v = problem(&feed(base, "plain", &rows).await, 400, "malformed_request");
    assert_eq!(v["row"], 37);
    rows[37] = json!({"delta": 0, "key": "zero"});
    let v = problem(&feed(base, "plain", &rows).await, 422, "invalid_setting");
    assert_eq!(v["row"], 37);
    problem(&feed(base, "plain", &[]).await, 422, "invalid_setting");
    problem(
        &feed(base, "nope", &rows[..1]).await,
        404,
        "event_not_found",
    );
    let bad_body = call(
        base,
        Method::POST,
        "/_sluice/admin/events/plain/feed",
        "{\"rows\": 3}".into(),
    )
    .await;
    problem(&bad_body, 400, "malformed_request");
    let s = lane(base, "plain").await;
    assert_eq!((&s["depth"], &s["applied"]), (&json!(0), &json!(0)));
    assert_eq!(counts(base, "plain").await.0, json!([50, 47, 3]));

    // A good batch: accepted, then applied; refusals recorded with codes.
    rows[37] = json!({"delta": 1, "key": "lane-37"});
    rows.push(json!({"delta": 1, "key": "lane-0"})); // a replay
    rows.push(json!({"delta": 2, "key": "lane-1"})); // a reused key
    rows.push(json!({"delta": -1000, "key": "lane-neg"}));
    rows.push(json!({"total": 10, "version": 2})); // stale
    rows.push(json!({"delta": 1, "key": "lane-cat", "category": "vip"}));
    let res = feed(base, "plain", &rows).await;
    assert_eq!(res.status, 202, "{}", res.text());
    assert_eq!(res.json()["accepted"], 55);
    wait_for("the lane to drain", Duration::from_secs(30), async || {
        let s = lane(base, "plain").await;
        s["depth"] == 0
            && s["applied"].as_u64().unwrap_or(0)
                + s["rejected"].as_u64().unwrap_or(0)
                + s["replayed"].as_u64().unwrap_or(0)
                == 55
    })
    .await;
    let s = lane(base, "plain").await;
    assert_eq!(
        (&s["applied"], &s["replayed"], &s["rejected"]),
        (&json!(50), &json!(1), &json!(4)),
        "{s}"
    );
    let mut codes: Vec<&str> = s["last_rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    codes.sort();
    assert_eq!(
        codes,
        vec![
            "category_not_found",
            "feed_key_reused",
            "stale_version",
            "stock_negative"
        ]
    );
    assert_eq!(counts(base, "plain").await.0, json!([100, 97, 3]));
    assert_eq!(
        sluice_tests::metric(base, "sluice_feed_rows_total{result=\"applied\"}").await,
        50.0
    );
    assert_eq!(
        sluice_tests::metric(base, "sluice_feed_rows_total{result=\"accepted\"}").await,
        55.0
    );
    let metrics = TestClient::new()
        .get(
            &format!("{base}/metrics"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await
        .text();
    assert!(
        metrics.contains("sluice_feed_depth{event=\"plain\"} 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_and_codes_in_memory() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, None).await;
    rows_and_codes(&gw.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_and_codes_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, Some(&redis)).await;
    rows_and_codes(&gw.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_lane_refuses_the_batch() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.events = vec![EventConfig {
                id: "plain".into(),
                total: 10,
                cart_limit: 4,
                ..EventConfig::default()
            }];
            c.feeds.rows_per_sec = 1;
            c.feeds.max_depth = 30;
        })
        .spawn()
        .await;
    let base = gw.url();
    let rows: Vec<Value> = (0..20)
        .map(|i| json!({"delta": 1, "key": format!("k{i}")}))
        .collect();
    assert_eq!(feed(&base, "plain", &rows).await.status, 202);
    let v = problem(&feed(&base, "plain", &rows).await, 503, "feed_full");
    assert_eq!(v["max_depth"], 30);
    // Nothing of the refused batch was queued.
    let depth = lane(&base, "plain").await["depth"].as_u64().unwrap();
    assert!(depth <= 20, "{depth}");
}

// === the lane across gateway processes ===

fn lane_config(rows_per_sec: u32) -> std::path::PathBuf {
    temp_file(
        "feeds.toml",
        &format!(
            "[[events]]\nid = \"sync\"\ntotal = 1000\ncart_limit = 4\n\n\
             [feeds]\nrows_per_sec = {rows_per_sec}\nclaim_after = \"1s\"\n"
        ),
    )
}

fn start(redis: &RedisServer, origin: &TestOrigin, cfg: &Path, keys: &Path) -> GatewayProcess {
    GatewayProcess::start_shared(
        &redis.url(),
        &origin.url(),
        cfg,
        keys,
        "pow-secret-feeds-0123456789",
        &[],
    )
}

async fn wait_loaded(base: &str) {
    wait_for("the event", Duration::from_secs(15), async || {
        call(
            base,
            Method::GET,
            "/_sluice/admin/events/sync",
            String::new(),
        )
        .await
        .json()["ready"]
            == true
    })
    .await;
}

/// `stock` entries of the event's stream (each applied row writes one).
async fn stock_entries(redis: &RedisServer) -> usize {
    let client = redis::Client::open(redis.url()).unwrap();
    // Thousands of entries: more than the client's default reply bound
    // on a loaded machine.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("sluice:{sync}:stream")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    entries
        .iter()
        .filter(|(_, f)| f.iter().any(|(k, v)| k == "reason" && v == "delta"))
        .count()
}

fn delta_rows(from: usize, to: usize) -> Vec<Value> {
    (from..to)
        .map(|i| json!({"delta": 1, "key": format!("erp-{i}")}))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_apply_each_row_once() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let cfg = lane_config(3000);
    let keys = temp_keys();
    let a = start(&redis, &origin, &cfg, &keys);
    let b = start(&redis, &origin, &cfg, &keys);
    let (ua, ub) = (a.url(), b.url());
    wait_loaded(&ua).await;
    // 6,000 distinct deltas, half through each gateway, then 1,000 replays.
    for (i, base) in [&ua, &ub, &ua, &ub, &ua, &ub].into_iter().enumerate() {
        let res = feed(base, "sync", &delta_rows(i * 1000, (i + 1) * 1000)).await;
        assert_eq!(res.status, 202, "{}", res.text());
    }
    let res = feed(&ub, "sync", &delta_rows(2000, 3000)).await;
    assert_eq!(res.status, 202, "{}", res.text());
    wait_for("the lane to drain", Duration::from_secs(60), async || {
        let s = lane(&ua, "sync").await;
        s["depth"] == 0 && s["applied"].as_u64().unwrap() + s["replayed"].as_u64().unwrap() == 7000
    })
    .await;
    let s = lane(&ub, "sync").await;
    assert_eq!(
        (&s["applied"], &s["replayed"], &s["rejected"], &s["pending"]),
        (&json!(6000), &json!(1000), &json!(0), &json!(0)),
        "{s}"
    );
    assert_eq!(counts(&ua, "sync").await.0, json!([7000, 7000, 0]));
    assert_eq!(stock_entries(&redis).await, 6000);
    // Both consumers took part.
    let applied_a = sluice_tests::metric(&ua, "sluice_feed_rows_total{result=\"applied\"}").await;
    let applied_b = sluice_tests::metric(&ub, "sluice_feed_rows_total{result=\"applied\"}").await;
    assert_eq!(applied_a + applied_b, 6000.0);
    assert!(
        applied_a > 0.0 && applied_b > 0.0,
        "{applied_a} {applied_b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_lane_loses_no_row_and_applies_none_twice() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let cfg = lane_config(400);
    let keys = temp_keys();
    let a = start(&redis, &origin, &cfg, &keys);
    let ua = a.url();
    wait_loaded(&ua).await;
    let res = feed(&ua, "sync", &delta_rows(0, 3000)).await;
    assert_eq!(res.status, 202, "{}", res.text());
    // The rate bound: right after the batch was accepted, most of it waits.
    let s = lane(&ua, "sync").await;
    assert!(s["applied"].as_u64().unwrap() < 1500, "{s}");
    assert!(s["depth"].as_u64().unwrap() > 1500, "{s}");
    wait_for("some rows applied", Duration::from_secs(30), async || {
        lane(&ua, "sync").await["applied"].as_u64().unwrap() >= 300
    })
    .await;
    let at_kill = lane(&ua, "sync").await;
    assert!(
        at_kill["depth"].as_u64().unwrap() > 0,
        "killed mid-lane: {at_kill}"
    );
    a.signal("KILL");
    drop(a);
    let b = start(&redis, &origin, &lane_config(5000), &keys);
    let ub = b.url();
    wait_for("the lane to drain", Duration::from_secs(60), async || {
        let s = lane(&ub, "sync").await;
        s["depth"] == 0 && s["pending"] == 0
    })
    .await;
    // Rows the killed gateway applied but had not finished come back to
    // the other one as replays: counted once each, applied once each.
    let s = lane(&ub, "sync").await;
    let (applied, replayed) = (
        s["applied"].as_u64().unwrap(),
        s["replayed"].as_u64().unwrap(),
    );
    assert_eq!(
        (applied + replayed, &s["rejected"]),
        (3000, &json!(0)),
        "{s}"
    );
    assert_eq!(counts(&ub, "sync").await.0, json!([4000, 4000, 0]));
    assert_eq!(stock_entries(&redis).await, 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_pipeline_loses_no_row_and_applies_none_twice() {
    let Some(mut redis) = RedisServer::start_with(RedisOptions {
        appendonly: true,
        ..Default::default()
    }) else {
        return;
    };
    let origin = TestOrigin::start().await;
    // 2,000 rows a second: batches of 200, pipelines of 32.
    let cfg = lane_config(2000);
    let keys = temp_keys();
    let a = start(&redis, &origin, &cfg, &keys);
    let ua = a.url();
    wait_loaded(&ua).await;
    let n = 6000;
    let res = feed(&ua, "sync", &delta_rows(0, n)).await;
    assert_eq!(res.status, 202, "{}", res.text());
    // Twice: Redis dies while rows are being applied (the consumer is
    // inside a batch nearly all the time: it waits for the rate bound
    // between pipelines), then comes back with what it had written.
    for at in [800, 2500] {
        // (after the first restart the gateway may answer 503 for a moment
        // while it reaches Redis again: not yet, rather than a failure)
        wait_for("rows being applied", Duration::from_secs(30), async || {
            lane_if_up(&ua, "sync")
                .await
                .is_some_and(|s| s["applied"].as_u64().unwrap_or(0) >= at)
        })
        .await;
        redis.kill();
        tokio::time::sleep(Duration::from_millis(700)).await;
        redis.restart();
    }
    // (the gateway answers 503 until it reaches Redis again)
    wait_for("the lane to drain", Duration::from_secs(90), async || {
        lane_if_up(&ua, "sync")
            .await
            .is_some_and(|s| s["depth"] == 0 && s["pending"] == 0)
    })
    .await;
    let s = lane(&ua, "sync").await;
    let (applied, replayed) = (
        s["applied"].as_u64().unwrap(),
        s["replayed"].as_u64().unwrap(),
    );
    // Rows applied in a pipeline whose end was lost come back as
    // replays: each counted once, applied once.
    assert_eq!(
        (applied + replayed, &s["rejected"]),
        (n as u64, &json!(0)),
        "{s}"
    );
    assert_eq!(
        counts(&ua, "sync").await.0,
        json!([1000 + n, 1000 + n, 0]),
        "every unit once"
    );
    assert_eq!(stock_entries(&redis).await, n, "one stock entry per row");
    eprintln!("after two Redis kills: {applied} applied, {replayed} replayed");
}
