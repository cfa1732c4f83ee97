//! The operator's dashboard (`/_sluice/admin/`) in a real headless
//! Chromium, driven over WebDriver: while JSON visitors join in the
//! background (and one admitted visitor browses the origin and holds
//! stock), the operator is refused with a wrong token, logs in, watches the
//! numbers move, raises the rate through the confirmation (which shows the
//! simulated drain of the line), and the new rate shows in the admin API
//! and in how fast the frontier moves. A setting the gateway refuses is
//! explained in plain words. Every step's screenshot goes to
//! `target/browser-artifacts/dashboard/`; with `SLUICE_UPDATE_DOCS=1` the
//! 1280×800 one also replaces `docs/dashboard.png`.
//!
//! Without chromium or chromedriver the browser test prints a loud SKIPPED
//! line, except under `CI=true`, where that is a failure (as in
//! `browser.rs`). The what-if endpoint is tested without a browser.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fantoccini::Locator;
use http::Method;
use serde_json::json;
use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_tests::browser::wait_for;
use sluice_tests::chromium::Browser;
use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway, admin_room};

/// The operator's screen.
const WINDOW: (u32, u32) = (1280, 800);
/// A phone.
const NARROW: (u32, u32) = (412, 915);

/// "1,234" → 1234.
fn number(text: &str) -> Option<f64> {
    text.split_whitespace()
        .next()?
        .replace(',', "")
        .trim_end_matches("/s")
        .parse()
        .ok()
}

// === the sale ===

/// A room at 2 visitors/s with burst 1 and an easy proof of work, and
/// event `demo` of 100 units.
async fn gateway(origin: &TestOrigin) -> TestGateway {
    TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.rooms = vec![RoomConfig {
                rate_per_sec: 2.0,
                burst: 1.0,
                puzzles: 2,
                difficulty_floor_bits: 6,
                difficulty_ceiling_bits: 8,
                join_limit_per_prefix_per_min: 0,
                attack_min_solve: Duration::ZERO,
                ..RoomConfig::default()
            }];
            c.events = vec![EventConfig {
                total: 100,
                ..EventConfig::default()
            }];
        })
        .spawn()
        .await
}

/// Opens the dashboard of the gateway at `base` and waits for its token
/// prompt.
async fn open_to_prompt(b: &mut Browser, base: &str) {
    b.c()
        .goto(&format!("{base}/_sluice/admin/"))
        .await
        .expect("open the dashboard");
    wait_for(Duration::from_secs(10), "the token prompt", || async {
        b.c()
            .find(Locator::Css("#login-token"))
            .await
            .ok()?
            .is_displayed()
            .await
            .ok()?
            .then_some(())
    })
    .await;
}

/// Opens the dashboard of the gateway at `base` and signs in with the
/// admin token.
async fn sign_in(b: &mut Browser, base: &str) {
    open_to_prompt(b, base).await;
    b.type_into("#login-token", &format!("{ADMIN_TOKEN}\u{e007}"))
        .await;
}

/// Background traffic until `stop`: one visitor admitted at once (the
/// bucket's credit) who holds 2 units and then browses the origin every
/// 100 ms (one request in twenty answered 503), and a new visitor joining every ~40 ms.
fn traffic(base: String, stop: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    let browsing = {
        let (base, stop) = (base.clone(), stop.clone());
        tokio::spawn(async move {
            let mut v = Visitor::new(&base, "default");
            let res = v.join("/").await;
            assert_eq!(res.status, 200, "first visitor admitted: {}", res.text());
            let res = v
                .call_admitted(
                    Method::POST,
                    "/_sluice/events/demo/holds",
                    Some(json!({"qty": 2})),
                    &[],
                )
                .await;
            assert_eq!(res.status, 201, "hold: {}", res.text());
            // one request in twenty fails at the origin, for the 5xx chart
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let (path, want) = if n.is_multiple_of(20) {
                    ("/status/503", 503)
                } else {
                    ("/echo/browse", 200)
                };
                let res = v.get_admitted(path).await;
                assert_eq!(res.status, want, "origin {path}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let joining = tokio::spawn(async move {
        // let the first visitor take the credit
        tokio::time::sleep(Duration::from_millis(300)).await;
        while !stop.load(Ordering::Relaxed) {
            let mut v = Visitor::new(&base, "default");
            let res = v.join("/").await;
            assert!(res.status.is_success(), "join: {}", res.text());
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    });
    vec![browsing, joining]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_watches_the_sale_and_raises_the_rate() {
    let Some(mut b) = Browser::start("dashboard", WINDOW).await else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = traffic(gw.url(), stop.clone());

    // The page loads without a token and asks for one; a wrong one is
    // refused in plain words.
    open_to_prompt(&mut b, &gw.url()).await;
    b.type_into("#login-token", "not-the-admin-token-000").await;
    b.click("#login-form button[type=submit]").await;
    wait_for(Duration::from_secs(10), "the refusal", || async {
        b.text_content("#login-error")
            .await
            .contains("refused")
            .then_some(())
    })
    .await;
    b.shot("refused").await;

    // The right token, submitted from the keyboard.
    b.type_into("#login-token", &format!("{ADMIN_TOKEN}\u{e007}"))
        .await;
    let first = wait_for(Duration::from_secs(10), "live numbers", || async {
        number(&b.text_content("#default-queue_length").await)
    })
    .await;
    let stored = b
        .js("return sessionStorage.getItem('sluice_admin_token')")
        .await;
    assert_eq!(stored, json!(ADMIN_TOKEN), "the token is kept for the tab");

    // The numbers move (the line grows: ~20 joins/s against 2 admitted/s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = number(&b.text_content("#default-queue_length").await).unwrap();
    assert!(
        second > first,
        "queue length did not move: {first} then {second}"
    );
    let joins = number(&b.text_content("#default-joins_per_sec").await).unwrap();
    assert!(joins > 1.0, "joins/s shown: {joins}");
    let fresh = b.text_content("#freshness").await;
    let age: f64 = fresh
        .trim_start_matches("Last updated ")
        .trim_end_matches(" s ago")
        .parse()
        .unwrap_or_else(|_| panic!("freshness: {fresh:?}"));
    assert!(age <= 1.5, "the figures are {age} s old");

    // The stock of the event, live.
    wait_for(Duration::from_secs(5), "the stock", || async {
        (b.text_content("#ev-demo-held").await == "2").then_some(())
    })
    .await;
    assert_eq!(b.text_content("#ev-demo-available").await, "98");
    assert_eq!(b.text_content("#ev-demo-invariant").await, "holds");

    // The origin's figures come from /metrics.
    wait_for(Duration::from_secs(10), "origin requests/s", || async {
        let t = b.text_content("#origin-charts figure b").await;
        number(&t).filter(|x| *x > 0.0)
    })
    .await;

    // A long enough line for the rate measurement, then the screen.
    wait_for(Duration::from_secs(30), "a line of 100", || async {
        number(&b.text_content("#default-queue_length").await).filter(|q| *q >= 100.0)
    })
    .await;
    b.shot("live").await;

    // Raise the rate to 10/s: type it, press Enter, read the confirmation.
    b.type_into("#default-input-rate_per_sec", "10\u{e007}")
        .await;
    let effect = wait_for(Duration::from_secs(10), "the simulated effect", || async {
        let t = b.text_content("#confirm-effect").await;
        t.starts_with("Simulated:").then_some(t)
    })
    .await;
    assert!(
        effect.contains("drains in") && effect.contains("at 10 visitors/s"),
        "{effect}"
    );
    assert!(
        b.text_content("#confirm-body")
            .await
            .contains("Rate: 2 → 10")
    );
    b.shot("confirm").await;
    assert_eq!(
        admin_room(&gw.url(), "default").await["rate_per_sec"],
        2.0,
        "nothing applied before the confirmation"
    );
    b.click("#confirm-apply").await;
    wait_for(Duration::from_secs(5), "the applied note", || async {
        b.text_content("#controls-default .note")
            .await
            .starts_with("Applied")
            .then_some(())
    })
    .await;

    // The admin API shows it …
    let room = admin_room(&gw.url(), "default").await;
    assert_eq!(room["rate_per_sec"], 10.0);
    // … and so does the frontier: ~10 admissions/s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let f0 = admin_room(&gw.url(), "default").await["frontier"]
        .as_u64()
        .unwrap();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = admin_room(&gw.url(), "default").await;
    let f1 = after["frontier"].as_u64().unwrap();
    let rate = (f1 - f0) as f64 / t0.elapsed().as_secs_f64();
    assert!(
        after["queue_length"].as_u64().unwrap() > 0,
        "the line ran dry: the measurement means nothing"
    );
    assert!(
        (7.0..=13.0).contains(&rate),
        "frontier advanced at {rate:.1}/s after setting 10/s"
    );
    let png = std::fs::read(b.shot("applied").await).expect("the screenshot");
    // The README's picture is refreshed only on request: a test run leaves
    // the source tree as it found it.
    if std::env::var_os("SLUICE_UPDATE_DOCS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard.png");
        std::fs::write(docs, png).expect("docs/dashboard.png");
    }

    // A setting the gateway refuses, said in plain words; nothing changes.
    b.type_into("#default-input-difficulty_floor_bits", "12")
        .await;
    b.click("#controls-default .apply").await;
    wait_for(Duration::from_secs(5), "the confirmation", || async {
        b.text_content("#confirm-effect")
            .await
            .contains("bits")
            .then_some(())
    })
    .await;
    b.click("#confirm-apply").await;
    let error = wait_for(Duration::from_secs(5), "the refusal", || async {
        let t = b.text_content("#controls-default .error").await;
        (!t.is_empty()).then_some(t)
    })
    .await;
    assert!(
        error.starts_with("PoW floor:") && error.ends_with("Nothing was changed."),
        "{error}"
    );
    assert_eq!(
        admin_room(&gw.url(), "default").await["difficulty_floor_bits"],
        6
    );
    b.shot("refused-setting").await;

    // A phone: nothing wider than the screen.
    b.c()
        .set_window_size(NARROW.0, NARROW.1)
        .await
        .expect("resize");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let overflow = b
        .js("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        .await;
    assert!(
        overflow.as_i64().unwrap() <= 0,
        "horizontal overflow on a phone: {overflow}"
    );
    b.shot("narrow").await;

    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("traffic task");
    }
    b.close().await;
    gw.shutdown().await;
}

// === without a browser ===

#[tokio::test]
async fn the_page_and_the_what_if() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin).await;
    let client = TestClient::new();

    let res = client
        .get(&format!("{}/_sluice/admin/", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    let csp = res.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    // Its script and stylesheet by their hashed names, cached for a year;
    // the plain names still answer (no-store).
    let page = res.text();
    for ext in [".js", ".css"] {
        let url = page
            .match_indices("\"/_sluice/static/admin.")
            .map(|(at, _)| &page[at + 1..at + 1 + page[at + 1..].find('"').unwrap()])
            .find(|url| url.ends_with(ext))
            .unwrap_or_else(|| panic!("admin{ext}: {page}"));
        let hash = &url["/_sluice/static/admin.".len()..url.len() - ext.len()];
        assert!(
            hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
            "{url}"
        );
        let res = client.get(&format!("{}{url}", gw.url()), &[]).await;
        assert_eq!(res.status, 200, "{url}");
        assert_eq!(
            res.header("cache-control"),
            Some("public, max-age=31536000, immutable"),
            "{url}"
        );
        let plain = format!("{}/_sluice/static/admin{ext}", gw.url());
        let res = client.get(&plain, &[]).await;
        assert_eq!(res.status, 200, "{plain}");
        assert_eq!(res.header("cache-control"), Some("no-store"), "{plain}");
    }

    // A line of 20 (the first visitor takes the credit).
    let mut v = Visitor::new(&gw.url(), "default");
    assert_eq!(v.join("/").await.status, 200);
    for _ in 0..20 {
        let mut v = Visitor::new(&gw.url(), "default");
        assert!(v.join("/").await.status.is_success());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let whatif = |q: &'static str| {
        let url = format!("{}/_sluice/admin/rooms/default/whatif?{q}", gw.url());
        let bearer = bearer.clone();
        async move {
            TestClient::new()
                .get(&url, &[("authorization", &bearer)])
                .await
        }
    };
    let res = whatif("rate_per_sec=0.5").await;
    assert_eq!(res.status, 200, "{}", res.text());
    let w = res.json();
    let line = w["queue_length"].as_f64().unwrap();
    assert!(line >= 15.0, "{w}");
    let drain = w["drain_seconds"].as_f64().unwrap();
    // The simulator's answer is the line over the rate, give or take a
    // tick and the line moving while we asked.
    assert!(
        (drain - line / 0.5).abs() <= 6.0,
        "drain {drain} s for a line of {line} at 0.5/s"
    );
    assert_eq!(w["rate_per_sec"], 0.5);
    // nothing changed
    assert_eq!(admin_room(&gw.url(), "default").await["rate_per_sec"], 2.0);

    let res = whatif("rate_per_sec=-1").await;
    assert_eq!(res.status, 422);
    assert_eq!(res.json()["field"], "rate_per_sec");
    let res = whatif("paused=true").await;
    assert_eq!(res.status, 422);
    let res = client
        .get(
            &format!(
                "{}/_sluice/admin/rooms/default/whatif?rate_per_sec=1",
                gw.url()
            ),
            &[],
        )
        .await;
    assert_eq!(res.status, 401);
    gw.shutdown().await;
}

/// An invite-only room shows its codes on the dashboard: issued, redeemed
/// and revoked, kept live; a room open to all shows no such line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invite_only_room_shows_its_codes() {
    let Some(mut b) = Browser::start("dashboard-invites", WINDOW).await else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.rooms = vec![
                RoomConfig {
                    id: "vip".into(),
                    paths: vec!["/vip".into()],
                    invite_only: true,
                    ..RoomConfig::default()
                },
                RoomConfig::default(),
            ];
        })
        .spawn()
        .await;
    let client = TestClient::new();
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let url = format!("{}/_sluice/admin/rooms/vip/invites", gw.url());
    let res = client
        .post_json(&url, &headers, &json!({"count": 3, "label": "press"}))
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let ids: Vec<String> = res.json()["invites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    let res = client
        .call(
            Method::DELETE,
            &format!("{url}/{}", ids[2]),
            &headers,
            sluice_tests::client::body(String::new()),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());

    sign_in(&mut b, &gw.url()).await;
    wait_for(Duration::from_secs(10), "the invites line", || async {
        (b.text_content("#vip-invites").await == "3 issued · 0 redeemed · 1 revoked").then_some(())
    })
    .await;
    // one more issued: the line follows
    let res = client.post_json(&url, &headers, &json!({})).await;
    assert_eq!(res.status, 201);
    wait_for(Duration::from_secs(10), "the line to follow", || async {
        b.text_content("#vip-invites")
            .await
            .starts_with("4 issued")
            .then_some(())
    })
    .await;
    let hidden = b
        .js("return document.querySelector('#room-default .invites').hidden")
        .await;
    assert_eq!(hidden, json!(true), "an open room has no invites line");
    b.shot("invites").await;
    gw.shutdown().await;
}

/// A room with verified crawlers shows their passes (issue 22): a crawler
/// confirmed by reverse DNS (the test's own DNS server) passes once and is
/// counted; a request with its User-Agent from an address that does not
/// confirm is counted as not verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_with_crawlers_shows_their_passes() {
    use sluice_tests::crawler::{DnsServer, Zone};
    let Some(mut b) = Browser::start("dashboard-crawlers", WINDOW).await else {
        return;
    };
    let origin = TestOrigin::start().await;
    let dns = DnsServer::start(
        Zone::new()
            .ptr("203.0.113.10", &["crawl-10.googlebot.com."])
            .addrs("crawl-10.googlebot.com", &["203.0.113.10"]),
    )
    .await;
    let dns_addr = dns.addr;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = vec![RoomConfig {
                method: sluice_admission::QueueMethod::QueueAll,
                ..RoomConfig::default()
            }];
            c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            c.crawlers.dns.nameservers = vec![dns_addr];
            c.crawlers.agents = vec![sluice_gateway::config::crawlers::CrawlerConfig {
                name: "googlebot".into(),
                hostnames: vec![".googlebot.com".into()],
                user_agents: vec!["Googlebot".into()],
                ..Default::default()
            }];
        })
        .spawn()
        .await;
    let client = TestClient::new();
    for (ip, status) in [("203.0.113.10", 200), ("203.0.113.66", 503)] {
        let res = client
            .get(
                &format!("{}/echo/page", gw.url()),
                &[
                    ("accept", "application/json"),
                    ("user-agent", "Googlebot/2.1"),
                    ("x-forwarded-for", ip),
                ],
            )
            .await;
        assert_eq!(res.status, status, "{ip}: {}", res.text());
    }
    sign_in(&mut b, &gw.url()).await;
    wait_for(Duration::from_secs(10), "the crawlers line", || async {
        (b.text_content("#default-crawlers").await
            == "1 passed · 0 over their limit · 1 not verified (googlebot 1)")
            .then_some(())
    })
    .await;
    b.shot("crawlers").await;
    gw.shutdown().await;
}

/// A random room shows its current draw (issue 22): none before anyone
/// waits; once a visitor has joined, the draw that took it, its seed still
/// secret; after closing, the seed revealed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_room_shows_its_draw() {
    let Some(mut b) = Browser::start("dashboard-random", WINDOW).await else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.rooms = vec![RoomConfig {
                method: sluice_admission::QueueMethod::Random,
                ..sluice_tests::easy_room("default", 1000.0, 10.0, &["/"])
            }];
        })
        .spawn()
        .await;
    sign_in(&mut b, &gw.url()).await;
    wait_for(Duration::from_secs(10), "no draw yet", || async {
        (b.text_content("#default-draw").await == "none yet").then_some(())
    })
    .await;
    assert_eq!(b.text_content("#default-method").await, "random draws");
    let mut v = sluice_tests::visitor::Visitor::new(&gw.url(), "default");
    assert_eq!(v.join("/").await.status, 201);
    wait_for(Duration::from_secs(10), "the first draw", || async {
        (b.text_content("#default-draw").await
            == "#1 · 1 drawn from seq 1 · seed secret until closed")
            .then_some(())
    })
    .await;
    b.shot("random").await;
    let res =
        sluice_tests::admin_patch(&gw.url(), "default", serde_json::json!({"closed": true})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    wait_for(Duration::from_secs(10), "the seed revealed", || async {
        b.text_content("#default-draw")
            .await
            .ends_with("seed revealed")
            .then_some(())
    })
    .await;
    gw.shutdown().await;
}
