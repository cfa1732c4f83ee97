//! Faults, end to end and bounded, on loopback only: Redis killed mid-sale
//! (with and without its append-only file), Redis slowed (`DEBUG SLEEP`,
//! `CLIENT PAUSE`), one of three gateway processes SIGKILLed while
//! visitors join, the origin down, slow or failing, and clocks that
//! disagree.
//!
//! After each: nothing oversold (`available + held + confirmed = total`,
//! successful holds ≤ stock, every acknowledged hold still there when Redis
//! kept its AOF), seqs unique and never reissued, FIFO (a visitor is never
//! admitted after one with a higher seq), and the gateway recovered without
//! a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use sluice_admission::{AdmitClaims, Keyring, QueueClaims};
use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::{RedisOptions, RedisServer, free_port};
use sluice_tests::visitor::Visitor;
use sluice_tests::{
    ADMIN_TOKEN, GatewayProcess, TestGateway, admin_patch, admin_room, metric, temp_file, temp_keys,
};

fn room(id: &str, rate: f64, paths: &[&str]) -> RoomConfig {
    let burst = if rate > 0.0 { 1000.0 } else { 1.0 };
    sluice_tests::easy_room(id, rate, burst, paths)
}

fn admin() -> String {
    format!("Bearer {ADMIN_TOKEN}")
}

async fn admin_event(base: &str) -> Value {
    let res = TestClient::new()
        .get(
            &format!("{base}/_sluice/admin/events/demo"),
            &[("authorization", &admin())],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

/// A gateway on `redis` selling event `demo` (`total` units) to the
/// admitted visitors of room `default` (fast: everyone is admitted).
async fn sale_gateway(origin: &TestOrigin, redis: &RedisServer, total: u64) -> TestGateway {
    sale_gateway_bounded(origin, redis, total, 1024).await
}

/// [`sale_gateway`] with `limits.max_store_requests = max_store`.
async fn sale_gateway_bounded(
    origin: &TestOrigin,
    redis: &RedisServer,
    total: u64,
    max_store: usize,
) -> TestGateway {
    let gw = TestGateway::builder()
        .origin(origin.url())
        .redis(redis.url())
        .config(move |c| {
            c.limits.max_store_requests = max_store;
            c.rooms = vec![
                room("default", 10_000.0, &[]),
                room("line", 0.0, &["/line"]),
            ];
            c.events = vec![EventConfig {
                total,
                cart_limit: 4,
                ..EventConfig::default()
            }];
        })
        .spawn()
        .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while admin_event(&gw.url()).await["ready"] != true {
        assert!(Instant::now() < deadline, "stock never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw
}

/// An admission token of `room` (joins, then polls until admitted).
async fn admitted(base: &str, room: &str) -> String {
    let mut v = Visitor::new(base, room);
    let res = v.join("/").await;
    assert!(
        res.status.is_success(),
        "{} {}",
        res.text(),
        admin_room(base, room).await
    );
    assert!(v.wait_admitted(Duration::from_secs(20), 50).await);
    v.admission_token.unwrap()
}

/// `n` admission tokens of room `default`, admitted 16 at a time.
async fn admitted_crowd(base: &str, n: usize) -> Vec<String> {
    futures_util::stream::iter(0..n)
        .map(|_| admitted(base, "default"))
        .buffer_unordered(16)
        .collect()
        .await
}

async fn hold(c: &TestClient, base: &str, token: &str, qty: u64) -> Answer {
    c.call(
        Method::POST,
        &format!("{base}/_sluice/events/demo/holds"),
        &[
            ("authorization", &format!("Bearer {token}")),
            ("content-type", "application/json"),
        ],
        body(json!({ "qty": qty }).to_string()),
    )
    .await
}

/// Holds sent at once by a crowd of admitted visitors (60 visitors, 4
/// requests each over connections of their own, some repeating an
/// `Idempotency-Key`), on 100 units with a cart limit of 4: the gateway
/// sends them to Redis together (`sluice_hold_store_steps_total` below
/// the holds they carried), and no unit is held twice or past the stock,
/// no cart passes its limit, every answer of a key names one hold, and the
/// event's counters add up to the 201s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_at_once_sell_each_unit_once_and_keep_each_cart() {
    use std::collections::HashMap;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    const TOTAL: u64 = 100;
    let origin = TestOrigin::start().await;
    let gw = sale_gateway(&origin, &redis, TOTAL).await;
    let base = gw.url();
    let tokens = admitted_crowd(&base, 60).await;
    let steps = "sluice_hold_store_steps_total";
    let carried = "sluice_hold_store_step_holds_total";
    let (steps0, carried0) = (metric(&base, steps).await, metric(&base, carried).await);
    let mut set = tokio::task::JoinSet::new();
    for (v, token) in tokens.iter().enumerate() {
        for k in 0..4u64 {
            let (base, token) = (base.clone(), token.clone());
            set.spawn(async move {
                let key = (k < 2 && v % 3 == 0).then(|| format!("again-{v}"));
                let mut headers = vec![
                    ("authorization".to_owned(), format!("Bearer {token}")),
                    ("content-type".to_owned(), "application/json".to_owned()),
                ];
                if let Some(key) = &key {
                    headers.push(("idempotency-key".to_owned(), key.clone()));
                }
                let h: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(a, b)| (a.as_str(), b.as_str()))
                    .collect();
                // a client of its own: a connection of its own
                let res = TestClient::new()
                    .call(
                        Method::POST,
                        &format!("{base}/_sluice/events/demo/holds"),
                        &h,
                        body(json!({ "qty": 1 + k % 2 }).to_string()),
                    )
                    .await;
                (v, key, res)
            });
        }
    }
    let mut held = 0u64;
    let mut carts: HashMap<usize, u64> = HashMap::new();
    let mut ids = HashSet::new();
    let mut by_key: HashMap<String, HashSet<String>> = HashMap::new();
    let mut statuses: HashMap<u16, u32> = HashMap::new();
    while let Some(r) = set.join_next().await {
        let (v, key, res) = r.unwrap();
        *statuses.entry(res.status.as_u16()).or_default() += 1;
        match res.status.as_u16() {
            201 => {
                let j = res.json();
                let id = j["hold_id"].as_str().unwrap().to_owned();
                // a repeated key answers its hold's 201 again (API.md):
                // counted once
                let new = ids.insert(id.clone());
                match key {
                    Some(key) => {
                        by_key.entry(key).or_default().insert(id);
                    }
                    None => assert!(new, "hold {id} answered twice"),
                }
                if new {
                    let qty = j["qty"].as_u64().unwrap();
                    held += qty;
                    *carts.entry(v).or_default() += qty;
                }
            }
            409 => {
                let code = res.json()["code"].as_str().unwrap().to_owned();
                assert!(
                    code == "sold_out" || code == "cart_limit_exceeded",
                    "{}",
                    res.text()
                );
            }
            other => panic!("a hold answered {other}: {}", res.text()),
        }
    }
    eprintln!("answers {statuses:?}");
    for (v, c) in &carts {
        assert!(*c <= 4, "visitor {v} holds {c} units past the cart limit 4");
    }
    for (k, ids) in &by_key {
        assert_eq!(ids.len(), 1, "{k} named {ids:?}");
    }
    let e = admin_event(&base).await;
    assert_eq!(e["invariant_holds"], true, "{e}");
    assert!(held <= TOTAL, "oversold: {held} of {TOTAL}");
    assert_eq!(e["held"], held, "the counters add up to the 201s: {e}");
    let sent = metric(&base, carried).await - carried0;
    let stepped = metric(&base, steps).await - steps0;
    eprintln!("{sent} holds in {stepped} store steps");
    assert!(sent >= 240.0, "every hold through the batchers: {sent}");
    assert!(stepped < sent, "no hold went out with another");
    gw.shutdown().await;
}

/// A request that may fail at the transport (a gateway that died): the
/// status and JSON body, or `None`.
async fn try_call(
    method: Method,
    url: &str,
    auth: Option<&str>,
    body: Option<Value>,
) -> Option<(u16, Value)> {
    static CLIENT: std::sync::OnceLock<
        Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    > = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(|| Client::builder(TokioExecutor::new()).build_http());
    let mut b = Request::builder().method(method).uri(url);
    if let Some(a) = auth {
        b = b.header("authorization", format!("Bearer {a}"));
    }
    let payload = body.map(|v| v.to_string()).unwrap_or_default();
    if !payload.is_empty() {
        b = b.header("content-type", "application/json");
    }
    let req = b.body(Full::new(Bytes::from(payload))).ok()?;
    let res = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .ok()?
        .ok()?;
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.ok()?.to_bytes();
    Some((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

// === Redis killed mid-sale ===

/// Holds of one unit from 60 admitted visitors on a stock of 30 while Redis
/// is SIGKILLed and restarted under them. Returns the holds acknowledged
/// before the kill and in total.
async fn sale_through_a_kill(appendonly: bool) {
    let Some(mut redis) = RedisServer::start_with(RedisOptions {
        appendonly,
        ..RedisOptions::default()
    }) else {
        return;
    };
    const TOTAL: u64 = 30;
    let origin = TestOrigin::start().await;
    let gw = sale_gateway(&origin, &redis, TOTAL).await;
    let base = gw.url();
    let tokens = admitted_crowd(&base, 60).await;

    let acked = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let c = TestClient::new();
    // The buyers: each tries until it holds one or the stock is gone, for
    // at most 20 s; 503s are retried (the store is down, never "sold out").
    let buyers = {
        let (acked, answered, base) = (acked.clone(), answered.clone(), base.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut pending: Vec<String> = tokens;
            let mut sold_out_seen = 0;
            while !pending.is_empty() && Instant::now() < deadline {
                let mut next = Vec::new();
                for t in pending {
                    let res = hold(&c, &base, &t, 1).await;
                    answered.fetch_add(1, Ordering::SeqCst);
                    match res.status.as_u16() {
                        201 => {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        409 => {
                            assert_eq!(res.json()["code"], "sold_out", "{}", res.text());
                            sold_out_seen += 1;
                        }
                        503 => next.push(t),
                        other => panic!("hold answered {other}: {}", res.text()),
                    }
                    // a paced sale, so the kill lands in the middle of it
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                pending = next;
                if !pending.is_empty() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            sold_out_seen
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while acked.load(Ordering::SeqCst) < 10 {
        assert!(Instant::now() < deadline, "the sale never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    redis.kill();
    let acked_before_kill = acked.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // While Redis is down nothing is sold and nothing is called sold out.
    assert_eq!(acked.load(Ordering::SeqCst), acked_before_kill);
    if appendonly {
        redis.restart();
    } else {
        redis.restart_empty();
        // The stock is gone with Redis: "not ready" until the operator loads
        // what is left (never sold out, never the configured stock again).
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let e = admin_event(&base).await;
            if e["ready"] == false {
                break;
            }
            assert!(Instant::now() < deadline, "{e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(admin_event(&base).await["ready"], false);
        let left = TOTAL - acked.load(Ordering::SeqCst);
        let res = TestClient::new()
            .call(
                Method::PUT,
                &format!("{base}/_sluice/admin/events/demo"),
                &[
                    ("authorization", &admin()),
                    ("content-type", "application/json"),
                ],
                body(
                    json!({"total": left, "cart_limit": 4, "hold_ttl_seconds": 300, "version": 2})
                        .to_string(),
                ),
            )
            .await;
        assert!(res.status.is_success(), "{}", res.text());
    }
    let sold_out_seen = buyers.await.unwrap();
    let acked = acked.load(Ordering::SeqCst);
    let e = admin_event(&base).await;
    assert_eq!(e["invariant_holds"], true, "{e}");
    assert!(acked <= TOTAL, "oversold: {acked} holds of {TOTAL}");
    assert!(acked > acked_before_kill, "the sale did not resume: {e}");
    let held = e["held"].as_u64().unwrap() + e["confirmed"].as_u64().unwrap();
    if appendonly {
        // appendfsync always: every acknowledged hold survived the kill.
        assert!(
            held >= acked,
            "lost holds: {held} in Redis, {acked} acknowledged"
        );
        assert_eq!(e["total"], TOTAL);
        assert_eq!(e["available"].as_u64().unwrap() + held, TOTAL, "{e}");
    } else {
        // Only what was sold after the reload is in Redis.
        assert!(held <= TOTAL - acked_before_kill, "{e}");
    }
    // 60 buyers for 30 units: the stock ran out, and the rest were told so.
    assert_eq!(e["available"], 0, "{e}");
    assert!(sold_out_seen > 0);
    // The gateway recovered without a restart: admissions work again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tries = 0;
    loop {
        tries += 1;
        let mut v = Visitor::new(&base, "default");
        let res = v.join("/").await;
        if res.status.is_success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "join never recovered after {tries}: {}",
            res.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // At most one 503 on the first join after the outage: the replay
    // guard's connection notices the restart on its first call.
    assert!(tries <= 3, "{tries} joins to recover");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_sale_with_aof_loses_no_hold_and_oversells_nothing() {
    sale_through_a_kill(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_sale_without_aof_oversells_nothing() {
    sale_through_a_kill(false).await;
}

// === Redis slowed ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_redis_sheds_load_with_quick_503s_then_recovers() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let redis = Arc::new(redis);
    let origin = TestOrigin::start().await;
    let gw = sale_gateway(&origin, &redis, 1000).await;
    let base = gw.url();
    // One buyer per hold (the cart limit is per visitor).
    let mut buyers: Vec<String> = futures_util::stream::iter(0..20)
        .map(|_| admitted(&base, "default"))
        .buffer_unordered(8)
        .collect()
        .await;
    // `line` admits nobody after its first visitor: a place to poll.
    admitted(&base, "line").await;
    let mut queued = Visitor::new(&base, "line");
    assert_eq!(queued.join("/").await.status, 201);

    for (what, cmd) in [
        ("DEBUG SLEEP", "DEBUG SLEEP 3"),
        ("CLIENT PAUSE", "CLIENT PAUSE 3000"),
    ] {
        let r = redis.clone();
        let cmd = cmd.to_owned();
        let stall = tokio::task::spawn_blocking(move || r.command(&cmd));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stalled_at = Instant::now();
        // Solved before (challenges need no store), redeemed during.
        let mut joiners = Vec::new();
        for _ in 0..8 {
            let v = Visitor::new(&base, "default");
            joiners.push((v.solved().await, v));
        }
        let mut calls = Vec::new();
        for ((challenge, solutions), mut v) in joiners {
            calls.push(tokio::spawn(async move {
                let t = Instant::now();
                let res = v.join_with(&challenge, &solutions, "/").await;
                ("join", res, t.elapsed())
            }));
        }
        for _ in 0..8 {
            let (base, token) = (base.clone(), buyers.pop().unwrap());
            calls.push(tokio::spawn(async move {
                let t = Instant::now();
                let res = hold(&TestClient::new(), &base, &token, 1).await;
                ("hold", res, t.elapsed())
            }));
        }
        for path in [
            "/_sluice/rooms/default",
            "/_sluice/readyz",
            "/_sluice/healthz",
        ] {
            let url = format!("{base}{path}");
            calls.push(tokio::spawn(async move {
                let t = Instant::now();
                let res = TestClient::new().get(&url, &[]).await;
                (path, res, t.elapsed())
            }));
        }
        let t = Instant::now();
        let res = queued.status().await;
        assert_eq!(
            res.status,
            200,
            "{what}: a poll needs no store: {}",
            res.text()
        );
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{what}: poll took {:?}",
            t.elapsed()
        );
        for call in calls {
            let (kind, res, took) = call.await.unwrap();
            let status = res.status.as_u16();
            assert!(
                took < Duration::from_millis(2500),
                "{what}: {kind} took {took:?} (status {status})"
            );
            assert!(
                [200, 201, 503].contains(&status),
                "{what}: {kind} answered {status}"
            );
            if status != 503 {
                continue;
            }
            let body = res.json();
            if kind == "/_sluice/readyz" {
                // Readiness is not a problem document: it names the cause.
                assert_eq!(body["status"], "store_unavailable", "{what}: {body}");
                continue;
            }
            // A shed request is the store's problem, with a time to retry.
            assert_eq!(
                body["code"], "store_unavailable",
                "{what}: {kind} answered 503 {body}"
            );
            assert_eq!(body["status"], 503, "{what}: {body}");
            let retry: u64 = res
                .header("retry-after")
                .unwrap_or_else(|| panic!("{what}: {kind} 503 without Retry-After: {body}"))
                .parse()
                .unwrap();
            assert!((1..=60).contains(&retry), "{what}: Retry-After {retry}");
        }
        assert!(
            stalled_at.elapsed() < Duration::from_millis(2900),
            "{what}: the answers waited for Redis"
        );
        stall.await.unwrap();
        // Recovered without a restart.
        let deadline = Instant::now() + Duration::from_secs(10);
        let token = buyers.pop().unwrap();
        loop {
            let res = hold(&TestClient::new(), &base, &token, 1).await;
            if res.status == 201 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: never recovered: {}",
                res.text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut v = Visitor::new(&base, "default");
        let res = v.join("/").await;
        assert!(res.status.is_success(), "{what}: {}", res.text());
    }
    let e = admin_event(&base).await;
    assert_eq!(e["invariant_holds"], true, "{e}");
    gw.shutdown().await;
}

/// The value of `sluice_shed_total{what="…"}` on `/metrics` (0 before the
/// first refusal).
async fn shed_total(base: &str, what: &str) -> u64 {
    sluice_tests::metric(base, &format!("sluice_shed_total{{what=\"{what}\"}}")).await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_bound_requests_past_the_limit_are_refused_at_once_then_recover() {
    const BOUND: usize = 4;
    const JOINS: usize = 32;
    const HOLDS: usize = 8;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let redis = Arc::new(redis);
    let origin = TestOrigin::start().await;
    let gw = sale_gateway_bounded(&origin, &redis, 1000, BOUND).await;
    let base = gw.url();
    let mut buyers: Vec<String> = Vec::new();
    for _ in 0..=HOLDS {
        buyers.push(admitted(&base, "default").await);
    }
    // Solved before the pause (one at a time: the bound is small).
    let mut joiners = Vec::new();
    for _ in 0..JOINS + 1 {
        let v = Visitor::new(&base, "default");
        joiners.push((v.solved().await, v));
    }
    let ((challenge, solutions), mut after) = joiners.pop().unwrap();
    assert_eq!(shed_total(&base, "store").await, 0);

    // Redis stops answering for 3 s; each store call gives up after 1 s.
    let r = redis.clone();
    let stall = tokio::task::spawn_blocking(move || r.command("CLIENT PAUSE 3000"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut calls = Vec::new();
    for ((challenge, solutions), mut v) in joiners {
        calls.push(tokio::spawn(async move {
            v.join_with(&challenge, &solutions, "/").await
        }));
    }
    for token in buyers.drain(..HOLDS) {
        let base = base.clone();
        calls.push(tokio::spawn(async move {
            hold(&TestClient::new(), &base, &token, 1).await
        }));
    }
    // The store-bound budget is full: the operator still gets an answer
    // (the admin API has a budget of its own), never `overloaded`, and
    // within the store's timeout (the last snapshot when it gives up).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Instant::now();
    let res = TestClient::new()
        .get(
            &format!("{base}/_sluice/admin/rooms/default"),
            &[(
                "authorization",
                &format!("Bearer {}", sluice_tests::ADMIN_TOKEN),
            )],
        )
        .await;
    assert_eq!(
        res.status,
        200,
        "the operator was locked out: {}",
        res.text()
    );
    assert!(
        asked.elapsed() < Duration::from_millis(2500),
        "the admin answer waited {:?}",
        asked.elapsed()
    );
    let mut overloaded = 0u64;
    let mut waited = 0u64;
    for call in calls {
        let res = call.await.unwrap();
        // Every answer is the store's 503 (nothing panicked: no 500, no
        // dropped connection), with a time to retry.
        assert_eq!(res.status, 503, "{}", res.text());
        let body = res.json();
        assert_eq!(body["code"], "store_unavailable", "{body}");
        let retry: u64 = res
            .header("retry-after")
            .unwrap_or_else(|| panic!("503 without Retry-After: {body}"))
            .parse()
            .unwrap();
        assert!(retry >= 1, "{body}");
        if body["reason"] == "overloaded" {
            overloaded += 1;
        } else {
            waited += 1;
        }
    }
    // At most BOUND requests waited on the store at a time. Each of them
    // held its slot for the store timeout (1 s) of a 3 s pause, so at most
    // 3 × BOUND reached the store; all the others were refused unread.
    let total = (JOINS + HOLDS) as u64;
    assert!(
        waited <= 3 * BOUND as u64 && waited >= 1,
        "{waited} of {total} requests waited on the store"
    );
    assert_eq!(overloaded + waited, total);
    assert_eq!(shed_total(&base, "store").await, overloaded);
    stall.await.unwrap();

    // After the pause everything works again, without a restart.
    let deadline = Instant::now() + Duration::from_secs(10);
    let token = buyers.pop().unwrap();
    loop {
        let res = hold(&TestClient::new(), &base, &token, 1).await;
        if res.status == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {}", res.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let res = after.join_with(&challenge, &solutions, "/").await;
    assert!(res.status.is_success(), "{}", res.text());
    let e = admin_event(&base).await;
    assert_eq!(e["invariant_holds"], true, "{e}");
    gw.shutdown().await;
}

// === a gateway SIGKILLed ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_three_gateways_killed_mid_flight_loses_no_place() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let cfg = temp_file(
        "sluice.toml",
        r#"
[[rooms]]
id = "default"
rate_per_sec = 0
burst = 1
puzzles = 1
difficulty_floor_bits = 2
difficulty_ceiling_bits = 6
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
"#,
    );
    let keys = temp_keys();
    let gws: Vec<GatewayProcess> = (0..3)
        .map(|_| {
            GatewayProcess::start_shared(
                &redis.url(),
                &origin.url(),
                &cfg,
                &keys,
                "faults-pow-secret-0123456789",
                &[],
            )
        })
        .collect();
    let urls: Arc<Vec<String>> = Arc::new(gws.iter().map(|g| g.url()).collect());
    let dead = Arc::new(AtomicU64::new(u64::MAX));
    let done = Arc::new(AtomicU64::new(0));

    // 300 visitors join round-robin; a join that fails at the transport
    // (its gateway died) tries the next gateway with a fresh challenge.
    let joins = futures_util::stream::iter(0..300usize)
        .map(|i| {
            let (urls, dead, done) = (urls.clone(), dead.clone(), done.clone());
            async move {
                for attempt in 0..6usize {
                    let g = (i + attempt) % 3;
                    if dead.load(Ordering::SeqCst) == g as u64 {
                        continue;
                    }
                    let base = &urls[g];
                    let Some((200, c)) = try_call(
                        Method::POST,
                        &format!("{base}/_sluice/rooms/default/challenge"),
                        None,
                        Some(json!({})),
                    )
                    .await
                    else {
                        continue;
                    };
                    let challenge = c["challenge"].as_str().unwrap().to_owned();
                    let (k, b) = (
                        c["puzzles"].as_u64().unwrap() as u8,
                        c["difficulty_bits"].as_u64().unwrap() as u8,
                    );
                    let ch = challenge.clone();
                    let solutions =
                        tokio::task::spawn_blocking(move || sluice_pow::solve(&ch, k, b, 1))
                            .await
                            .unwrap();
                    if let Some((status, v)) = try_call(
                        Method::POST,
                        &format!("{base}/_sluice/rooms/default/join"),
                        None,
                        Some(json!({"challenge": challenge, "solutions": solutions})),
                    )
                    .await
                    {
                        assert!(status == 200 || status == 201, "join {status}: {v}");
                        done.fetch_add(1, Ordering::SeqCst);
                        let token = v["queue_token"].as_str().map(str::to_owned);
                        return (v["seq"].as_u64(), token, g);
                    }
                }
                panic!("visitor {i} never joined");
            }
        })
        .buffer_unordered(24)
        .collect::<Vec<_>>();
    let killer = {
        let done = done.clone();
        let dead = dead.clone();
        let victim = &gws[1];
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while done.load(Ordering::SeqCst) < 100 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            victim.signal("KILL");
            dead.store(1, Ordering::SeqCst);
        }
    };
    let (joined, ()) = tokio::join!(joins, killer);
    let survivors = [urls[0].clone(), urls[2].clone()];

    // Seqs are unique; the first visitor was admitted at once (no seq in
    // its answer), every other waits with a queue token.
    let waiting: Vec<(u64, String)> = joined
        .iter()
        .filter_map(|(s, t, _)| Some(((*s)?, t.clone()?)))
        .collect();
    assert!(waiting.len() >= 298, "{} waiting", waiting.len());
    let seqs: HashSet<u64> = waiting.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs.len(), waiting.len(), "a seq was handed out twice");
    assert!(
        joined.iter().any(|(_, _, g)| *g == 1),
        "nobody joined at the victim"
    );
    let max_seq = *seqs.iter().max().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while admin_room(&survivors[0], "default").await["tail"]
        .as_u64()
        .unwrap()
        < max_seq
    {
        assert!(Instant::now() < deadline, "tail below a seq handed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // After the kill, new places come after every old one.
    let mut late = Visitor::new(&survivors[1], "default");
    let res = late.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert!(late.seq.unwrap() > *seqs.iter().max().unwrap());

    // Open the gate and watch FIFO: sweeping from the highest seq down
    // through one gateway, once a visitor is admitted every lower seq must
    // be too. (Sweeps alternate between the survivors; within one sweep the
    // same gateway answers, since each answers from its own snapshot and two
    // snapshots may be one tick apart.)
    let res = admin_patch(
        &survivors[0],
        "default",
        json!({"rate_per_sec": 100.0, "burst": 1.0}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // A sample of 60 places, every fifth seq (a poll costs a signature
    // check in a debug build: the whole line would be slow to sweep).
    let mut order = waiting.clone();
    order.sort_by_key(|o| std::cmp::Reverse(o.0));
    let order: Vec<(u64, String)> = order.into_iter().step_by(5).collect();
    let mut admitted: HashSet<u64> = HashSet::new();
    let mut sweeps = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    while admitted.len() < order.len() {
        assert!(
            Instant::now() < deadline,
            "only {} of {} admitted",
            admitted.len(),
            order.len()
        );
        let mut higher_admitted: Option<u64> = None;
        sweeps += 1;
        let base = &survivors[sweeps % 2];
        for (seq, token) in &order {
            let (status, v) = try_call(
                Method::GET,
                &format!("{base}/_sluice/rooms/default/status"),
                Some(token),
                None,
            )
            .await
            .expect("a survivor answers");
            assert_eq!(status, 200, "{v}");
            if v["state"] == "admitted" {
                admitted.insert(*seq);
                higher_admitted.get_or_insert(*seq);
            } else {
                assert_eq!(v["state"], "waiting", "{v}");
                assert!(
                    higher_admitted.is_none(),
                    "FIFO broken: seq {} admitted before seq {seq}",
                    higher_admitted.unwrap()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(sweeps >= 2, "the gate opened too fast to watch");
    let state = admin_room(&survivors[1], "default").await;
    assert!(state["frontier"].as_u64().unwrap() >= *seqs.iter().max().unwrap());
}

// === the origin down, slow, failing ===

/// A tiny origin on a fixed port: `/slow` sleeps 3 s, `/status/{code}`
/// answers that code, anything else 200 `ok`.
async fn fixed_origin(port: u16) -> tokio::task::JoinHandle<()> {
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let path = req.uri().path().to_owned();
                    if path == "/slow" {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                    let code = path
                        .strip_prefix("/status/")
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(200u16);
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(code)
                            .body(Full::new(Bytes::from(format!("origin says {code}"))))
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_down_slow_and_failing_then_recovered() {
    let port = free_port();
    let gw = TestGateway::builder()
        .origin(format!("http://127.0.0.1:{port}"))
        .config(|c| {
            c.timeouts.upstream_response = Duration::from_secs(1);
            c.timeouts.upstream_connect = Duration::from_millis(500);
            c.rooms = vec![room("default", 1000.0, &[])];
        })
        .spawn()
        .await;
    let base = gw.url();
    let v = {
        let mut v = Visitor::new(&base, "default");
        v.join("/").await;
        assert!(v.wait_admitted(Duration::from_secs(10), 50).await);
        v
    };
    let timed = |path: &'static str| {
        let v = &v;
        async move {
            let t = Instant::now();
            let res = v.get_admitted(path).await;
            (res, t.elapsed())
        }
    };
    // Down: nothing listens.
    let (res, took) = timed("/page").await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert_eq!(res.json()["code"], "origin_unreachable");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Up: served, same session, no restart.
    let server = fixed_origin(port).await;
    let (res, _) = timed("/page").await;
    assert_eq!(res.status, 200, "{}", res.text());
    // Slow: 504 at the response timeout, not at the origin's pace.
    let (res, took) = timed("/slow").await;
    assert_eq!(res.status, 504, "{}", res.text());
    assert_eq!(res.json()["code"], "origin_timeout");
    assert!(took < Duration::from_millis(2500), "{took:?}");
    // Failing: the origin's own 5xx passes through untouched.
    for code in [500u16, 502, 503] {
        let (res, _) = timed(match code {
            500 => "/status/500",
            502 => "/status/502",
            _ => "/status/503",
        })
        .await;
        assert_eq!(res.status.as_u16(), code);
        assert_eq!(res.text(), format!("origin says {code}"));
    }
    // Down again with pooled connections open, then back.
    server.abort();
    let _ = server.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (res, _) = timed("/page").await;
    assert!([502, 200].contains(&res.status.as_u16()), "{}", res.text());
    let server = fixed_origin(port).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (res, _) = timed("/page").await;
        if res.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", res.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.abort();
    gw.shutdown().await;
}

// === clocks ===

#[tokio::test]
async fn clock_skew_within_leeway_is_tolerated_beyond_is_refused() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = {
        let keys = keys.clone();
        TestGateway::builder()
            .origin(origin.url())
            .config(move |c| {
                c.keys_dir = Some(keys);
                c.rooms = vec![room("default", 0.0, &[])];
            })
            .spawn()
            .await
    };
    let base = gw.url();
    // Spend the room's one credit so a refused token is not let in by
    // passthrough.
    let mut first = Visitor::new(&base, "default");
    assert!(first.join("/").await.status.is_success());
    // Another gateway's clock, simulated by minting with the shared key.
    let ring = Keyring::load_dir(&keys).unwrap();
    let now = sluice_admission::unix_now_s();
    let ttl = Duration::from_secs(600);
    let c = TestClient::new();
    let cases: [(&str, i64, i64, bool); 6] = [
        // (what, iat offset, exp offset, accepted)
        ("iat 3 s ahead", 3, 603, true),
        ("iat 30 s ahead", 30, 630, false),
        ("iat 1 h ahead", 3600, 4200, false),
        ("exp 3 s ago", -603, -3, true),
        ("exp 30 s ago", -630, -30, false),
        ("iat 3 s behind", -3, 597, true),
    ];
    for (what, iat, exp, ok) in cases {
        let at = |off: i64| (now as i64 + off) as u64;
        let mut q = QueueClaims::new("default", "skewed", 1_000_000, 0, at(iat), ttl);
        q.exp = at(exp);
        let token = ring.sign_queue(&q).unwrap();
        let res = c
            .get(
                &format!("{base}/_sluice/rooms/default/status"),
                &[("authorization", &format!("Bearer {token}"))],
            )
            .await;
        assert_eq!(res.status == 200, ok, "{what} (queue): {}", res.text());
        if !ok {
            assert_eq!(res.status, 401, "{what}");
        }
        let mut a = AdmitClaims::new("default", "skewed", 0, at(iat), ttl);
        a.exp = at(exp);
        let token = ring.sign_admit(&a).unwrap();
        let before = origin.requests();
        let res = c
            .get(
                &format!("{base}/echo"),
                &[
                    ("cookie", &format!("sluice_a_default={token}")),
                    ("accept", "application/json"),
                ],
            )
            .await;
        assert_eq!(res.status == 200, ok, "{what} (admission): {}", res.text());
        assert_eq!(origin.requests() - before, u64::from(ok), "{what}");
    }
    gw.shutdown().await;
}
