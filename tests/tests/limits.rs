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

/// Behind a trusted load balancer the limit is keyed by the forwarded
/// client's network, joins draw on it as challenges do, and every refusal
/// is counted in `sluice_rate_limited_total{limit="network"}`.
#[tokio::test]
async fn joins_are_limited_by_the_forwarded_network_and_counted() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.rooms = vec![room(3, vec![])];
            c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        })
        .spawn()
        .await;
    let c = TestClient::new();
    let challenge = format!("{}/_sluice/rooms/default/challenge", gw.url());
    let join = format!("{}/_sluice/rooms/default/join", gw.url());
    let fan = [("x-forwarded-for", "203.0.113.7")];
    let neighbour = [("x-forwarded-for", "203.0.113.200")]; // same /24
    let elsewhere = [("x-forwarded-for", "198.51.100.9")];
    for _ in 0..3 {
        assert_eq!(c.post_json(&challenge, &fan, &json!({})).await.status, 200);
    }
    // The budget of 203.0.113.0/24 is spent: a join (well formed, its proof
    // never looked at) and a neighbour's challenge are refused.
    let body = json!({"challenge": "x", "solutions": ["1"]});
    let res = c.post_json(&join, &fan, &body).await;
    assert_eq!(res.status, 429, "{}", res.text());
    assert_eq!(res.json()["code"], "rate_limited");
    assert!(res.header("retry-after").is_some());
    assert_eq!(
        c.post_json(&challenge, &neighbour, &json!({})).await.status,
        429
    );
    // Another network behind the same balancer has its own budget.
    let res = c.post_json(&challenge, &elsewhere, &json!({})).await;
    assert_eq!(res.status, 200, "{}", res.text());

    let refused = sluice_tests::metric(
        &gw.url(),
        "sluice_rate_limited_total{room=\"default\",limit=\"network\"}",
    )
    .await;
    assert_eq!(refused, 2.0);
}

/// The limiter forgets networks whose budget has refilled, so a spray of
/// addresses cannot grow it without bound.
#[tokio::test]
async fn the_limiter_forgets_refilled_networks() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            // 600 a minute: one token back every 100 ms.
            c.rooms = vec![room(600, vec![])];
            c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        })
        .spawn()
        .await;
    let c = TestClient::new();
    let challenge = format!("{}/_sluice/rooms/default/challenge", gw.url());
    for i in 0..50 {
        let xff = format!("10.{i}.0.1");
        let res = c
            .post_json(&challenge, &[("x-forwarded-for", &xff)], &json!({}))
            .await;
        assert_eq!(res.status, 200);
    }
    let room = gw.state().room("default").unwrap();
    assert_eq!(room.rate_limited_networks(), 50);
    // Every one of them took a single token, back within 100 ms; the
    // ticker prunes every LIMITER_PRUNE_EVERY.
    let deadline = std::time::Instant::now()
        + sluice_gateway::gate::rooms::LIMITER_PRUNE_EVERY
        + Duration::from_secs(5);
    while room.rate_limited_networks() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "still {} networks remembered",
            room.rate_limited_networks()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Join pressure against a room that admits nobody raises its global
/// level, step by step, up to the ceiling and then past it (under attack:
/// a minimum solve time), and the level shows in the admin state and in
/// the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_pressure_raises_the_level_visibly() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            let mut r = room(0, vec![]);
            r.difficulty_floor_bits = 4;
            r.difficulty_ceiling_bits = 6;
            r.attack_min_solve = Duration::from_millis(1);
            c.rooms = vec![r];
        })
        .spawn()
        .await;
    let state = admin_room(&gw.url(), "default").await;
    assert_eq!(state["difficulty_bits"], 4, "{state}");
    assert_eq!(state["under_attack"], false);

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let state = loop {
        // Eight visitors joining at once, again and again: far above the
        // 20 joins/s the policy ignores and twice the (zero) admission rate.
        let joins = (0..8).map(|_| async {
            let mut v = Visitor::new(&gw.url(), "default");
            v.join("/").await.status
        });
        for s in futures_util::future::join_all(joins).await {
            assert!(s.is_success(), "join: {s}");
        }
        let state = admin_room(&gw.url(), "default").await;
        if state["under_attack"] == true {
            break state;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never under attack: {state}"
        );
    };
    assert_eq!(
        state["difficulty_bits"], 6,
        "capped at the ceiling: {state}"
    );
    let res = Visitor::new(&gw.url(), "default").challenge().await.json();
    assert_eq!(res["difficulty_bits"], 6, "{res}");
    assert!(res["min_solve_ms"].as_u64().unwrap() >= 1, "{res}");

    tokio::time::sleep(Duration::from_millis(300)).await; // a tick records it
    let bits =
        sluice_tests::metric(&gw.url(), "sluice_pow_difficulty_bits{room=\"default\"}").await;
    assert_eq!(bits, 6.0);
}

/// The value of `sluice_shed_total{what="…"}` on `/metrics`.
async fn shed_total(base: &str, what: &str) -> u64 {
    sluice_tests::metric(base, &format!("sluice_shed_total{{what=\"{what}\"}}")).await as u64
}

/// One raw HTTP/1.1 request on a fresh connection: what came back (empty
/// when the gateway closed the connection unanswered).
async fn raw_get(addr: &str, path: &str) -> String {
    raw_get_with(addr, path, "").await
}

/// [`raw_get`] with more header lines (each ending in CRLF).
async fn raw_get_with(addr: &str, path: &str, lines: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{lines}Connection: close\r\n\r\n");
    // A refused connection may already be closed: writing or reading then
    // fails, which counts as no answer.
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends `GET /_sluice/healthz` on a keep-alive connection: whether the
/// answer came.
async fn healthz_on(s: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if s.write_all(b"GET /_sluice/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&out).contains("\"ok\"}") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200")
}

/// A connection the gateway serves (kept open).
async fn served_connection(addr: &str) -> tokio::net::TcpStream {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        if healthz_on(&mut s).await {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn connections_past_max_connections_are_closed_and_room_comes_back() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.limits.max_connections = 2)
        .spawn()
        .await;
    let addr = gw.url().trim_start_matches("http://").to_owned();
    // Two keep-alive connections take both slots (retried while the
    // readiness probe's connection may still hold one).
    let mut first = served_connection(&addr).await;
    let mut second = served_connection(&addr).await;
    let refused = raw_get(&addr, "/_sluice/healthz").await;
    assert_eq!(refused, "", "a third connection must be closed unanswered");
    let refused = raw_get(&addr, "/_sluice/healthz").await;
    assert_eq!(refused, "");
    // The connections already open are still served.
    assert!(healthz_on(&mut first).await);
    assert!(healthz_on(&mut second).await);
    drop(first);
    // Both slots come back once their connections end.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let res = raw_get(&addr, "/_sluice/healthz").await;
        if res.starts_with("HTTP/1.1 200") {
            break;
        }
        assert_eq!(res, "", "refused connections get no answer");
        assert!(std::time::Instant::now() < deadline, "no slot came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The scrape needs a slot as well: the one the last probe took comes
    // back once the server has seen that connection end.
    drop(second);
    let auth = format!("Authorization: Bearer {}\r\n", sluice_tests::ADMIN_TOKEN);
    let scrape = loop {
        let res = raw_get_with(&addr, "/metrics", &auth).await;
        if res.starts_with("HTTP/1.1 200") {
            break res;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no slot for the scrape"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let shed: f64 = scrape
        .lines()
        .find_map(|l| l.strip_prefix("sluice_shed_total{what=\"connection\"} "))
        .expect("the connection shed counter")
        .trim()
        .parse()
        .unwrap();
    assert!(shed >= 2.0, "{shed}");
}

#[tokio::test]
async fn requests_past_max_origin_requests_get_503_overloaded_not_the_origin() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| c.limits.max_origin_requests = 2)
        .spawn()
        .await;
    let base = gw.url();
    // Two slow requests hold both slots.
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let url = format!("{base}/slow/4000");
            tokio::spawn(async move { TestClient::new().get(&url, &[]).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while origin.requests() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "slow requests never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reached = origin.requests();
    let c = TestClient::new();
    for _ in 0..5 {
        let res = c.get(&format!("{base}/echo/x"), &[]).await;
        assert_eq!(res.status, 503, "{}", res.text());
        assert_eq!(res.json()["code"], "overloaded", "{}", res.text());
        let retry: u64 = res.header("retry-after").unwrap().parse().unwrap();
        assert!(retry >= 1);
    }
    // The gateway's own endpoints are not behind the origin's bound.
    assert_eq!(
        c.get(&format!("{base}/_sluice/healthz"), &[]).await.status,
        200
    );
    for s in slow {
        let res = s.await.unwrap();
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.text(), "slept");
    }
    assert_eq!(
        origin.requests(),
        reached,
        "a refused request reached the origin"
    );
    let res = c.get(&format!("{base}/echo/x"), &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(shed_total(&base, "origin").await, 5);
}

/// A client that stops reading (a slow-read attack) loses its connection
/// after `timeouts.write_stall`, and its `max_connections` slot with it:
/// two connections that ask for 64 MiB and read nothing hold both slots
/// (a third is refused) only until then; then both slots serve others at
/// once, and what the stalled ones get when they finally read ends well
/// short of the body.
#[tokio::test]
async fn a_client_that_stops_reading_loses_its_connection_and_its_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BODY: usize = 64 << 20;
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.limits.max_connections = 2;
            c.timeouts.write_stall = Duration::from_secs(2);
        })
        .spawn()
        .await;
    let addr = gw.url().trim_start_matches("http://").to_owned();
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut s = served_connection(&addr).await;
        let req = format!("GET /bytes/{BODY} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        stalled.push(s);
    }
    let started = std::time::Instant::now();
    let refused = raw_get(&addr, "/_sluice/healthz").await;
    if started.elapsed() < Duration::from_secs(1) {
        assert_eq!(refused, "", "both slots are held while the readers stall");
    }
    // the stalls end them: both slots serve two other connections at once
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (_a, _b) = loop {
        let a = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let b = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (mut a, mut b) = (a, b);
        if healthz_on(&mut a).await && healthz_on(&mut b).await {
            break (a, b);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slots did not come back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "not before the stall limit"
    );
    for mut s in stalled {
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("the connection was closed, not left open");
        // closed (or reset) well short of the body
        assert!(read.is_err() || got.len() < BODY, "{} bytes", got.len());
    }
}
