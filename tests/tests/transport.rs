//! How the waiting page hears its status, in every engine (issue 21): by
//! the event stream when it can be had, by polling when it cannot, and by
//! polling again when a proxy buffers the stream (nothing heard: the page
//! does not hang). Chromium, Firefox and WebKit (Safari's engine:
//! WebKitGTK's MiniBrowser under `Xvfb`) each walk the three ways, behind
//! a relay ([`sluice_tests::relay`]) that passes, refuses or buffers event
//! streams and counts what the page asked for.
//!
//! Each way: a line of four stands in front and does not move; the browser
//! opens the shop's deep URL, solves, joins and shows its position; the
//! page says which way it hears (`data-transport` on `#sluice`); then the
//! rate rises, the position falls and the browser lands on exactly the URL
//! it asked for. Pushed, the tab holds one stream and polls at most twice
//! (its first look, and the poll that sets the admission cookie); refused, it polls; buffered, it opened
//! the stream, heard nothing, and polled.
//!
//! Without a browser the tests print a loud SKIPPED line, except under
//! `CI=true`, where that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::admin_patch;
use sluice_tests::browser::wait_for;
use sluice_tests::chromium::Browser;
use sluice_tests::firefox::Firefox;
use sluice_tests::relay::{self, Streams};
use sluice_tests::shop_path::{Page, line_in_front, shop_behind_gateway, until_admitted};

/// A phone-sized window (CSS pixels).
const WINDOW: (u32, u32) = (412, 915);

/// The page's own limit on a silent stream (`STREAM_SILENCE_MS` in
/// `static/waiting.js`), and a margin for a slow machine.
const SILENCE: Duration = Duration::from_secs(6);

/// One way of hearing, walked by `page` in `engine`.
async fn one_way(page: &mut impl Page, engine: &str, way: Streams) {
    let started = Instant::now();
    page.clear_cookies().await;
    let (gw, _shop) = shop_behind_gateway(0.0, None).await;
    let base = gw.url();
    line_in_front(&base, 4).await;
    let relay = relay::start(gw.addr, way).await;

    let deep = format!("{}/shop/demo?via={way:?}", relay.url);
    page.goto(&deep).await;
    let first: u64 = wait_for(
        Duration::from_secs(30),
        "a position on the page",
        || async { page.text("#position").await.trim().parse().ok() },
    )
    .await;
    assert!(
        first >= 2,
        "{engine} {way:?}: the line stands in front: {first}"
    );

    // The way the page says it hears, while the line stands still.
    let expected = match way {
        Streams::Pass => "stream",
        Streams::Refuse | Streams::Buffer => "poll",
    };
    let limit = SILENCE + Duration::from_secs(10);
    wait_for(limit, "the page's transport", || async {
        (page.attr("#sluice", "data-transport").await == expected).then_some(())
    })
    .await;
    if way == Streams::Pass {
        // Still the stream a while later: nothing made it fall back.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            page.attr("#sluice", "data-transport").await,
            "stream",
            "{engine}: the stream holds"
        );
    }
    let polls_waiting = relay.polls();
    let streams_waiting = relay.streams();
    page.shot(&format!("{way:?}-waiting")).await;

    // The line moves: the position falls, the shop's page replaces it.
    let res = admin_patch(&base, "default", json!({"rate_per_sec": 1.0})).await;
    assert!(res.status.is_success(), "{}", res.text());
    let (landed, seen) = until_admitted(page, first, Duration::from_secs(40)).await;
    assert_eq!(
        landed, deep,
        "{engine} {way:?}: lands on exactly the URL asked"
    );
    let (polls, streams) = (relay.polls(), relay.streams());
    eprintln!(
        "{engine} {way:?}: positions {seen:?}; while waiting {streams_waiting} stream(s), \
         {polls_waiting} poll(s); in all {streams} stream(s), {polls} poll(s); {:?}",
        started.elapsed()
    );
    match way {
        Streams::Pass => {
            assert_eq!(
                streams, 1,
                "{engine}: one stream for the tab, never a second"
            );
            // The page's first look (has this tab a place already?) is a
            // poll; after it, pushed: no poll while waiting.
            assert!(
                polls_waiting <= 1,
                "{engine}: pushed, polled {polls_waiting} times"
            );
            assert!(
                polls - polls_waiting <= 1,
                "{engine}: one poll to take the admission ({polls} in all)"
            );
        }
        Streams::Refuse => {
            assert!(
                streams >= 1,
                "{engine}: the page asked for the stream first"
            );
            assert!(
                polls - polls_waiting >= 2,
                "{engine}: refused, it polled its way in ({polls} polls)"
            );
        }
        Streams::Buffer => {
            assert_eq!(streams_waiting, 1, "{engine}: it tried the stream once");
            assert!(
                polls_waiting >= 1,
                "{engine}: heard nothing, it fell back to polling"
            );
        }
    }
    gw.shutdown().await;
}

/// The three ways, one after the other, in one browser.
async fn every_way(page: &mut impl Page, engine: &str) {
    for way in [Streams::Pass, Streams::Refuse, Streams::Buffer] {
        one_way(page, engine, way).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_hears_by_stream_by_poll_and_falls_back() {
    let Some(mut b) = Browser::start("transport-chromium", WINDOW).await else {
        return;
    };
    every_way(&mut b, "chromium").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firefox_hears_by_stream_by_poll_and_falls_back() {
    let Some(mut ff) = Firefox::start("transport-firefox").await else {
        return;
    };
    ff.set_viewport(WINDOW.0, WINDOW.1).await;
    every_way(&mut ff, "firefox").await;
    ff.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webkit_hears_by_stream_by_poll_and_falls_back() {
    let Some(mut b) = Browser::start_webkit("transport-webkit", WINDOW).await else {
        return;
    };
    every_way(&mut b, "webkit").await;
    b.close().await;
}
