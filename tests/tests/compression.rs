//! The gateway's own text answers are compressed (br, gzip) when the
//! client asks, through a real socket; the origin's answers pass as the
//! origin sent them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;

use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_tests::TestGateway;
use sluice_tests::client::{Answer, TestClient};
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;

/// A gateway in front of `origin` whose one room guards everything, at
/// `rate` admissions a second.
async fn gateway(origin: &TestOrigin, rate: f64) -> TestGateway {
    TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = vec![RoomConfig {
                rate_per_sec: rate,
                burst: 1.0,
                puzzles: 1,
                difficulty_floor_bits: 2,
                difficulty_ceiling_bits: 4,
                join_limit_per_prefix_per_min: 0,
                attack_min_solve: std::time::Duration::ZERO,
                ..RoomConfig::default()
            }];
            c.events = vec![EventConfig {
                total: 10,
                ..EventConfig::default()
            }];
        })
        .spawn()
        .await
}

/// Spends the room's one credit (rate 0): every later visitor waits, and
/// every page is the waiting room's.
async fn spend_the_credit(gw: &TestGateway) {
    let mut first = Visitor::new(&gw.url(), "default");
    assert!(first.join("/").await.status.is_success());
}

/// A gateway in front of `origin` whose room admits nobody more.
async fn waiting_room(origin: &TestOrigin) -> TestGateway {
    let gw = gateway(origin, 0.0).await;
    spend_the_credit(&gw).await;
    gw
}

/// The body of `res` decoded as its `Content-Encoding` says.
fn decoded(res: &Answer) -> Vec<u8> {
    let mut out = Vec::new();
    match res.header("content-encoding") {
        None => out.extend_from_slice(&res.body),
        Some("gzip") => {
            flate2::read::GzDecoder::new(&res.body[..])
                .read_to_end(&mut out)
                .expect("valid gzip");
        }
        Some("br") => {
            brotli_decompressor::Decompressor::new(&res.body[..], 4096)
                .read_to_end(&mut out)
                .expect("valid br");
        }
        Some(other) => panic!("unexpected encoding {other}"),
    }
    out
}

fn varies_on_encoding(res: &Answer) -> bool {
    res.headers
        .get_all("vary")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("accept-encoding"))
}

#[tokio::test]
async fn own_text_answers_are_compressed_as_asked() {
    let origin = TestOrigin::start().await;
    let gw = waiting_room(&origin).await;
    let c = TestClient::new();
    let page = format!("{}/tickets/1", gw.url());
    let spec = format!("{}/_sluice/openapi.json", gw.url());
    let script = format!("{}/_sluice/static/waiting.js", gw.url());
    for url in [&page, &spec, &script] {
        let plain = c.get(url, &[("accept", "text/html")]).await;
        assert_eq!(plain.header("content-encoding"), None, "{url}: not asked");
        assert!(plain.body.len() > 1000, "{url}: a body worth compressing");
        for (asked, want) in [
            ("br", Some("br")),
            ("gzip", Some("gzip")),
            ("gzip, deflate, br", Some("br")),
            ("br;q=0, gzip", Some("gzip")),
            ("gzip;q=0", None),
            ("identity", None),
            ("zstd", None),
        ] {
            let res = c
                .get(url, &[("accept", "text/html"), ("accept-encoding", asked)])
                .await;
            assert_eq!(res.status, plain.status, "{url} {asked}");
            assert_eq!(res.header("content-encoding"), want, "{url} {asked}");
            assert_eq!(decoded(&res), plain.body, "{url} {asked}: same content");
            if want.is_some() {
                assert!(res.body.len() * 2 < plain.body.len(), "{url}: compressed");
                assert!(varies_on_encoding(&res), "{url}: Vary: Accept-Encoding");
                // What the gateway promises about caching is kept.
                assert_eq!(res.header("cache-control"), plain.header("cache-control"));
            }
        }
    }
    assert_eq!(origin.requests(), 0);
}

/// One waiting page asked for `path` in `lang` with `Accept-Encoding:
/// coding`, checked as every answer must be (200, no-store, varying on
/// language and encoding, compressed as asked or not at all) and to be
/// the page of its own URL and language: its encoding and decoded body.
async fn waiting_page(
    c: &TestClient,
    gw: &TestGateway,
    path: &str,
    lang: &str,
    coding: &str,
) -> (Option<String>, Vec<u8>) {
    let res = c
        .get(
            &format!("{}{path}", gw.url()),
            &[
                ("accept", "text/html"),
                ("accept-language", lang),
                ("accept-encoding", coding),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{path}");
    let got = res.header("content-encoding").map(str::to_owned);
    let want = (coding != "identity").then_some(coding);
    assert!(
        got.is_none() || got.as_deref() == want,
        "{path} {coding}: {got:?}"
    );
    assert_eq!(res.header("cache-control"), Some("no-store"));
    let vary = res.header("vary").unwrap_or_default().to_ascii_lowercase();
    assert!(vary.contains("accept-language"), "{vary}");
    assert!(varies_on_encoding(&res), "{vary}");
    let body = decoded(&res);
    let html = String::from_utf8_lossy(&body);
    let escaped = path.replace('&', "&amp;");
    assert!(
        html.contains(&format!("data-return-to=\"{escaped}\"")),
        "{path}: the page returns to its own URL"
    );
    assert!(
        html.contains(&format!("<html lang=\"{lang}\">")),
        "{path} {lang}"
    );
    (got, body)
}

/// The waiting page is kept per room, language and return URL (module
/// `visitor::page`, `PageCache`): what a hostile client would try against
/// such a cache is to get another visitor its page, or to have the
/// gateway compress a page per request. Each answer below, decoded, is
/// the page of its own URL and language, byte for byte the same every
/// time:
/// - 80 URLs and one too long to keep, in two languages and three
///   encodings, interleaved, three times over: more than the room keeps,
///   so the kept pages are dropped over and over;
/// - 10 URLs in two languages (fewer than the room keeps), three times
///   over: from the second round on, each is kept and compressed as asked;
/// - 100 URLs made up one after the other, asked with br: each rendered
///   for its request and sent as it is, never compressed.
#[tokio::test]
async fn every_visitor_gets_the_waiting_page_of_its_own_url_and_language() {
    let origin = TestOrigin::start().await;
    let gw = waiting_room(&origin).await;
    let c = TestClient::new();
    let mut seen: std::collections::HashMap<(String, &str), Vec<u8>> = Default::default();
    let mut same_page = |path: &str, lang: &'static str, body: Vec<u8>| {
        let kept = seen.entry((path.to_owned(), lang)).or_insert(body.clone());
        assert_eq!(kept, &body, "{path} {lang}: the same page each time");
    };
    let codings = ["br", "gzip", "identity"];
    let mut many: Vec<String> = (0..80).map(|i| format!("/tickets/{i}?a={i}&b=2")).collect();
    many.push(format!("/tickets/long?{}", "y".repeat(600)));
    for round in 0..3 {
        for (i, path) in many.iter().enumerate() {
            for (j, lang) in ["en", "fr"].into_iter().enumerate() {
                let coding = codings[(i + j + round) % 3];
                let (_, body) = waiting_page(&c, &gw, path, lang, coding).await;
                same_page(path, lang, body);
            }
        }
    }
    for round in 0..3 {
        for i in 0..10 {
            let path = format!("/hot/{i}?a=1&b=2");
            for lang in ["en", "fr"] {
                let coding = codings[(i + round) % 2];
                let (got, body) = waiting_page(&c, &gw, &path, lang, coding).await;
                if round > 0 {
                    assert_eq!(got.as_deref(), Some(coding), "{path} {lang}: kept");
                }
                same_page(&path, lang, body);
            }
        }
    }
    for i in 0..100 {
        let (got, _) = waiting_page(&c, &gw, &format!("/made/up/{i}"), "en", "br").await;
        assert_eq!(got, None, "made-up URL {i}: never compressed");
    }
    assert_eq!(origin.requests(), 0);
}

/// The constant documents (the OpenAPI document, the dashboard's page)
/// come from forms stored compressed once, as the static files do: each
/// form has its own `ETag` (which per-request compression never gives),
/// and `If-None-Match` with it answers 304. Compressed per request, the
/// 200 KB OpenAPI document cost about 7 ms of br a request, for anyone.
#[tokio::test]
async fn constant_documents_are_compressed_once() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 0.0).await;
    let c = TestClient::new();
    for path in ["/_sluice/openapi.json", "/_sluice/admin/"] {
        let url = format!("{}{path}", gw.url());
        let plain = c.get(&url, &[]).await;
        assert_eq!(plain.status, 200, "{path}");
        for coding in ["br", "gzip"] {
            let res = c.get(&url, &[("accept-encoding", coding)]).await;
            assert_eq!(res.status, 200, "{path}");
            assert_eq!(res.header("content-encoding"), Some(coding), "{path}");
            assert_eq!(decoded(&res), plain.body, "{path} {coding}");
            assert_eq!(res.header("cache-control"), Some("no-store"), "{path}");
            let tag = res.header("etag").expect("a stored form's ETag").to_owned();
            assert!(tag.ends_with(&format!("-{coding}\"")), "{path}: {tag}");
            let again = c
                .get(
                    &url,
                    &[("accept-encoding", coding), ("if-none-match", &tag)],
                )
                .await;
            assert_eq!(again.status, 304, "{path} {coding}");
            assert!(again.body.is_empty());
        }
    }
}

/// Answers of up to a kilobyte fit one packet with their head: sent as
/// they are, whatever the client asks (compressing a join's answer cost
/// more than making it: README, "The opening surge"). The visitor's JSON
/// calls, asked as a browser's fetch() asks them.
#[tokio::test]
async fn small_answers_are_sent_as_they_are() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 0.0).await;
    let c = TestClient::new();
    let browser = [("accept-encoding", "gzip, deflate, br, zstd")];
    let res = c
        .get(&format!("{}/_sluice/healthz", gw.url()), &browser)
        .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.header("content-encoding"), None);
    // The one credit spent, then a join that waits (a queue token).
    spend_the_credit(&gw).await;
    let room = format!("{}/_sluice/rooms/default", gw.url());
    let challenge = c
        .post_json(
            &format!("{room}/challenge"),
            &browser,
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(challenge.header("content-encoding"), None);
    let body = sluice_tests::visitor::join_body(&challenge, "/").await;
    let join = c.post_json(&format!("{room}/join"), &browser, &body).await;
    assert_eq!(join.status, 201, "{}", join.text());
    assert_eq!(join.header("content-encoding"), None, "a join's answer");
    assert!(join.body.len() > 256, "bigger than the old threshold");
    let token = join.json()["queue_token"].as_str().unwrap().to_owned();
    let auth = format!("Bearer {token}");
    let status = c
        .get(
            &format!("{room}/status"),
            &[browser[0], ("authorization", auth.as_str())],
        )
        .await;
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(status.header("content-encoding"), None);
}

#[tokio::test]
async fn the_origins_answers_pass_as_sent() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 1000.0).await;
    let mut v = Visitor::new(&gw.url(), "default");
    assert!(v.join("/").await.status.is_success());
    assert!(
        v.wait_admitted(std::time::Duration::from_secs(10), 200)
            .await
    );
    // A JSON body of well over a kilobyte from the origin: the echo of a
    // request with a long header.
    let padding = "x".repeat(2000);
    let res = v
        .call_admitted(
            http::Method::GET,
            "/echo",
            None,
            &[("accept-encoding", "br, gzip"), ("x-padding", &padding)],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("content-encoding"), None, "not ours to compress");
    let echoed = res.json();
    assert_eq!(
        echoed["headers"]["accept-encoding"][0], "br, gzip",
        "the client's Accept-Encoding reaches the origin, which may compress"
    );
    assert!(!varies_on_encoding(&res));
}
