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
    let gw = gateway(&origin, 0.0).await;
    // Spend the one credit, so the page below is the waiting room's.
    let mut first = Visitor::new(&gw.url(), "default");
    assert!(first.join("/").await.status.is_success());
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

#[tokio::test]
async fn small_answers_are_sent_as_they_are() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 0.0).await;
    let res = TestClient::new()
        .get(
            &format!("{}/_sluice/healthz", gw.url()),
            &[("accept-encoding", "br, gzip")],
        )
        .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.header("content-encoding"), None);
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
