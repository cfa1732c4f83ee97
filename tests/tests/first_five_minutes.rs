//! The first five minutes (issue 21): the real `sluice serve` with no
//! flags (only `--listen`, for a free port), a newcomer in a real headless
//! Chromium. Alone they pass straight through to the demo shop; the
//! dashboard says plainly that the gateway has no admin token and shows a
//! read-only view; the shop's control sends the crowd (`sluice swarm`'s
//! visitors, in the gateway's process, against its own listener) and gives
//! the newcomer's pass back; a line forms on the shop's panel and on the
//! dashboard; the newcomer opens the shop in a new tab and waits in it,
//! their position falling until they are let in; the line drains to 0 and
//! every fan was let in.
//!
//! Screenshots go to `target/browser-artifacts/first_five_minutes/`.
//! Without chromium or chromedriver the browser test prints a loud SKIPPED
//! line, except under `CI=true`, where that is a failure (as in
//! `browser.rs`). The control's refusals and the no-token answers are
//! tested without a browser.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use fantoccini::Locator;
use fantoccini::wd::WindowHandle;
use http::Method;
use sluice_gateway::tools::demo_origin::{self, DemoOptions};
use sluice_tests::GatewayProcess;
use sluice_tests::browser::wait_for;
use sluice_tests::chromium::Browser;
use sluice_tests::client::{TestClient, body};

/// A laptop's window (the dashboard's charts need the width).
const WINDOW: (u32, u32) = (1280, 900);
/// Fans in the crowd (`sluice_gateway::tools::swarm::demo::VISITORS`).
const FANS: u64 = 300;

/// "1,234" → 1234.
fn count(text: &str) -> Option<u64> {
    text.split_whitespace()
        .next()?
        .replace(',', "")
        .parse()
        .ok()
}

/// The dashboard's queue length of room `default`, read in its window.
async fn dashboard_line(b: &Browser, dash: &WindowHandle) -> Option<u64> {
    b.c()
        .switch_to_window(dash.clone())
        .await
        .expect("dashboard");
    count(&b.text_content("#default-queue_length").await)
}

async fn shown(b: &Browser, css: &str) -> bool {
    match b.c().find(Locator::Css(css)).await {
        Ok(e) => e.is_displayed().await.unwrap_or(false),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_sends_the_crowd_and_waits_in_the_line_it_makes() {
    let Some(mut b) = Browser::start("first_five_minutes", WINDOW).await else {
        return;
    };
    let gw = GatewayProcess::start(&[]);
    let base = gw.url();
    let started = Instant::now();

    // Alone, the newcomer passes straight through to the shop.
    b.c()
        .goto(&format!("{base}/"))
        .await
        .expect("open the shop");
    assert!(
        b.text("h1").await.contains("Welcome to the demo shop"),
        "the shop, not the waiting room: {}",
        b.text("body").await
    );
    assert_eq!(
        b.text("#crowd-start").await,
        format!("Send {FANS} fans"),
        "the control"
    );
    let shop = b.c().window().await.unwrap();

    // The dashboard, in a window of its own: no prompt for a token nobody
    // has, but the plain reason and a read-only view of the room.
    let dash = b.c().new_window(false).await.unwrap().handle;
    b.c().switch_to_window(dash.clone()).await.unwrap();
    b.c()
        .goto(&format!("{base}/_sluice/admin/"))
        .await
        .expect("open the dashboard");
    wait_for(Duration::from_secs(10), "the read-only view", || async {
        (shown(&b, "#readonly").await
            && count(&b.text_content("#default-queue_length").await) == Some(0))
        .then_some(())
    })
    .await;
    let why = b.text("#readonly").await;
    assert!(
        why.contains("this gateway has no admin token")
            && why.contains("--admin-token")
            && why.contains("SLUICE_ADMIN_TOKEN"),
        "{why}"
    );
    assert!(!why.contains("refused"), "{why}");
    assert!(!shown(&b, "#login").await, "no token prompt");
    assert!(
        b.text("#room-default").await.contains("read-only"),
        "labelled read-only"
    );
    b.shot("dashboard-read-only").await;

    // The control: the crowd comes, and the line forms on the shop's panel.
    b.c().switch_to_window(shop.clone()).await.unwrap();
    b.click("#crowd-start").await;
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !shown(&b, "#crowd-join").await {
        peak = peak.max(count(&b.text_content("#crowd-queue").await).unwrap_or(0));
        assert!(
            Instant::now() < deadline,
            "no line formed within 60 s (longest seen {peak})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("the line formed after {:?}", started.elapsed());
    b.shot("line-formed").await;
    assert!(
        b.text("#crowd-message")
            .await
            .contains("open the shop in a new tab"),
        "{}",
        b.text("#crowd-message").await
    );

    // The newcomer joins it in a new tab: the waiting room, a place.
    let before = b.c().windows().await.unwrap();
    b.click("#crowd-join").await;
    let tab = wait_for(Duration::from_secs(10), "the new tab", || async {
        let now = b.c().windows().await.ok()?;
        now.into_iter().find(|w| !before.contains(w))
    })
    .await;
    b.c().switch_to_window(tab.clone()).await.unwrap();
    let first: u64 = wait_for(Duration::from_secs(30), "a position in line", || async {
        b.text("#position").await.trim().parse().ok()
    })
    .await;
    assert!(first > 1, "fans stand in front: position {first}");
    assert!(
        b.text("h1").await.contains("in line"),
        "{}",
        b.text("h1").await
    );
    b.shot("waiting").await;

    // The line moves: the position falls until the shop's page replaces
    // the waiting room; the dashboard shows the line meanwhile.
    let mut positions = vec![first];
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let landed = loop {
        b.c().switch_to_window(tab.clone()).await.unwrap();
        if b.c().find(Locator::Css("#shop")).await.is_ok() {
            break b.url().await;
        }
        if let Ok(p) = b.text("#position").await.trim().parse::<u64>()
            && positions.last() != Some(&p)
        {
            positions.push(p);
        }
        if let Some(q) = dashboard_line(&b, &dash).await {
            lines.push(q);
        }
        assert!(
            Instant::now() < deadline,
            "not let in within 90 s: positions {positions:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    eprintln!(
        "let in after {:?}; positions {positions:?}",
        started.elapsed()
    );
    assert!(
        positions.len() >= 2 && positions.windows(2).all(|w| w[1] <= w[0]),
        "the position fell: {positions:?}"
    );
    assert_eq!(landed, format!("{base}/shop/demo"), "back where they asked");
    b.shot("let-in").await;

    // The line drains: the dashboard's queue falls to 0, having shown it
    // long; every fan was let in.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let q = dashboard_line(&b, &dash).await;
        if let Some(q) = q {
            lines.push(q);
        }
        if q == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the line did not drain within 120 s: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let most = lines.iter().copied().max().unwrap_or(0);
    eprintln!(
        "drained after {:?}; the dashboard's line peaked at {most} (the shop's panel at {peak})",
        started.elapsed()
    );
    // 0 before the press (above), a line of dozens, 0 again: it rose and
    // fell on the dashboard.
    assert!(most >= 30, "the dashboard showed a line: {lines:?}");
    b.shot("dashboard-drained").await;

    let c = TestClient::new();
    let crowd = wait_for(Duration::from_secs(60), "the crowd to finish", || async {
        let v = c
            .get(&format!("{base}/demo/crowd/status"), &[])
            .await
            .json();
        (v["crowd"]["running"] == false).then_some(v)
    })
    .await;
    assert_eq!(
        crowd["crowd"]["admitted"], FANS,
        "every fan let in: {crowd}"
    );
    assert_eq!(crowd["crowd"]["failed"], 0, "{crowd}");

    // The shop's panel says so too.
    b.c().switch_to_window(shop).await.unwrap();
    wait_for(Duration::from_secs(15), "the panel's last word", || async {
        b.text_content("#crowd-message")
            .await
            .contains("The line has drained")
            .then_some(())
    })
    .await;
    b.shot("shop-drained").await;
    b.close().await;
}

/// What the browser test does not press: the control's refusals, the
/// progress past the queue, and the no-token answers of the admin API.
#[tokio::test]
async fn the_control_is_the_embedded_shops_alone_and_the_admin_api_says_why_it_refuses() {
    let gw = GatewayProcess::start(&[]);
    let base = gw.url();
    let c = TestClient::new();
    let html = [("accept", "text/html")];

    // The front page carries the control; the progress is readable by
    // anyone (past the queue), and no crowd has come yet.
    let res = c.get(&format!("{base}/"), &html).await;
    assert_eq!(res.status, 200);
    assert!(res.text().contains(r#"id="crowd-start""#), "{}", res.text());
    let v = c
        .get(&format!("{base}/demo/crowd/status"), &[])
        .await
        .json();
    assert_eq!(v["crowd"]["running"], false, "{v}");
    assert_eq!(v["crowd"]["visitors"], FANS, "{v}");
    assert_eq!(v["crowd"]["room"], "default", "{v}");

    // A press without the control's header (a form of another site) starts
    // nothing.
    let res = c
        .call(Method::POST, &format!("{base}/demo/crowd"), &html, body(""))
        .await;
    assert_eq!(res.status, 403, "{}", res.text());
    let v = c
        .get(&format!("{base}/demo/crowd/status"), &[])
        .await
        .json();
    assert_eq!(v["crowd"]["arrived"], 0, "{v}");

    // No admin token: every admin call says so, and the dashboard's page
    // knows it.
    for auth in ["", "Bearer some-token-0123456789"] {
        let h: Vec<(&str, &str)> = if auth.is_empty() {
            vec![]
        } else {
            vec![("authorization", auth)]
        };
        let res = c.get(&format!("{base}/_sluice/admin/rooms"), &h).await;
        assert_eq!(res.status, 401);
        let p = res.json();
        assert_eq!(p["code"], "unauthorized");
        assert_eq!(p["reason"], "no_admin_token", "{p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("start it with --admin-token or SLUICE_ADMIN_TOKEN"),
            "{p}"
        );
    }
    let page = c.get(&format!("{base}/_sluice/admin/"), &html).await.text();
    assert!(page.contains(r#"data-admin-token="none""#));

    // A gateway with a token: a wrong one is refused as such.
    let token = "an-admin-token-0123456789";
    let with = GatewayProcess::start(&["--admin-token", token]);
    let res = c
        .get(
            &format!("{}/_sluice/admin/rooms", with.url()),
            &[("authorization", "Bearer not-it-0123456789")],
        )
        .await;
    assert_eq!(res.status, 401);
    assert_eq!(res.json()["reason"], "token_refused");
    let page = c
        .get(&format!("{}/_sluice/admin/", with.url()), &html)
        .await
        .text();
    assert!(page.contains(r#"data-admin-token="configured""#));

    // A shop no `sluice serve` gave a crowd (as behind any --origin) has
    // no control and sends nothing.
    let bare = demo_origin::spawn(DemoOptions::default()).await.unwrap();
    let res = c.get(&format!("{}/", bare.url()), &html).await;
    assert!(!res.text().contains("crowd-start"), "{}", res.text());
    let res = c
        .call(
            Method::POST,
            &format!("{}/demo/crowd", bare.url()),
            &[("x-demo-crowd", "start")],
            body(""),
        )
        .await;
    assert_eq!(res.status, 404, "{}", res.text());
}
