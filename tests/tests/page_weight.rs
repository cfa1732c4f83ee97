//! Page weight (issue 21): what a waiting visitor's browser moves over
//! the wire, on a real socket to a real gateway. The page links every
//! file it loads by a content-hashed name answered `Cache-Control: public,
//! max-age=31536000, immutable`, compressed, so a reload fetches the page
//! alone; the page and every control-plane answer stay `no-store`.
//!
//! `cargo test -p sluice-tests --test page_weight -- --nocapture` prints
//! the figures (README, "What a visitor sees").

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;

use sluice_gateway::config::RoomConfig;
use sluice_tests::TestGateway;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// What Chromium sends for a page and its subresources.
const BROWSER_ENCODINGS: &str = "gzip, deflate, br, zstd";

/// A gateway whose one room admits nobody (its one credit spent), so a
/// browser gets the waiting page.
async fn waiting_room(origin: &TestOrigin) -> TestGateway {
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.rooms = vec![RoomConfig {
                rate_per_sec: 0.0,
                burst: 1.0,
                puzzles: 1,
                difficulty_floor_bits: 2,
                difficulty_ceiling_bits: 4,
                join_limit_per_prefix_per_min: 0,
                attack_min_solve: std::time::Duration::ZERO,
                ..RoomConfig::default()
            }];
        })
        .spawn()
        .await;
    let mut first = Visitor::new(&gw.url(), "default");
    assert!(first.join("/").await.status.is_success());
    gw
}

// === a client that counts the bytes ===

/// One answer as it came over the wire.
struct Wire {
    status: u16,
    /// Header names in lower case; a repeated field joined by ", ".
    headers: BTreeMap<String, String>,
    /// The content as sent (still encoded), the framing removed.
    body: Vec<u8>,
    /// Every byte of the answer on the wire: status line, fields, framing
    /// and content.
    wire: usize,
}

impl Wire {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The content, decoded as its `Content-Encoding` says.
    fn decoded(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self.header("content-encoding") {
            None => out.extend_from_slice(&self.body),
            Some("br") => {
                brotli_decompressor::Decompressor::new(&self.body[..], 4096)
                    .read_to_end(&mut out)
                    .expect("valid br");
            }
            Some("gzip") => {
                flate2::read::GzDecoder::new(&self.body[..])
                    .read_to_end(&mut out)
                    .expect("valid gzip");
            }
            Some(other) => panic!("unexpected encoding {other}"),
        }
        out
    }
}

/// `method path` on a connection of its own (`Connection: close`, read to
/// the end), with `headers`; counts what comes back.
async fn fetch(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Wire {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .expect("the answer within 10 s")
        .expect("read");
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut res = httparse::Response::new(&mut fields);
    let head = match res.parse(&raw).expect("an HTTP/1.1 answer") {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => panic!("a partial head: {}", String::from_utf8_lossy(&raw)),
    };
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for h in res.headers.iter() {
        let v = String::from_utf8_lossy(h.value).into_owned();
        headers
            .entry(h.name.to_ascii_lowercase())
            .and_modify(|old| *old = format!("{old}, {v}"))
            .or_insert(v);
    }
    let rest = &raw[head..];
    let body = if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    if let Some(len) = headers.get("content-length")
        && method != "HEAD"
        && res.code != Some(304)
    {
        assert_eq!(
            len.parse::<usize>().unwrap(),
            body.len(),
            "{path}: Content-Length"
        );
    }
    Wire {
        status: res.code.unwrap(),
        headers,
        body,
        wire: raw.len(),
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = std::str::from_utf8(&b[..line]).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        b = &b[line + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Every `/_sluice/static/…` URL the page names (stylesheets, scripts,
/// images, the worker's `data-worker-url`), in order, once each.
fn linked_files(html: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (at, _) in html.match_indices("\"/_sluice/static/") {
        let url = &html[at + 1..];
        let url = &url[..url.find('"').unwrap()];
        if !out.iter().any(|u| u == url) {
            out.push(url.to_owned());
        }
    }
    out
}

/// Whether a browser keeps this answer and reuses it without asking
/// (fresh for a year, and told never to revalidate it).
fn reused_without_asking(w: &Wire) -> bool {
    let cc = w.header("cache-control").unwrap_or("");
    !cc.contains("no-store") && cc.contains("immutable") && cc.contains("max-age=31536000")
}

// === the tests ===

/// The figures of the issue: a first load moves the page and its files
/// (br); a reload honouring the cache headers moves the page alone.
#[tokio::test]
async fn a_reload_moves_the_page_alone() {
    let origin = TestOrigin::start().await;
    let gw = waiting_room(&origin).await;
    let browser = [
        ("accept", "text/html,application/xhtml+xml,*/*;q=0.8"),
        ("accept-encoding", BROWSER_ENCODINGS),
        ("accept-language", "en-GB,en;q=0.9"),
    ];
    let subresource = [("accept", "*/*"), ("accept-encoding", BROWSER_ENCODINGS)];

    // First load: the page, then every file it names.
    let page = fetch(gw.addr, "GET", "/tickets/1", &browser).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("cache-control"), Some("no-store"));
    let html = String::from_utf8(page.decoded()).unwrap();
    assert!(html.contains("id=\"sluice\""), "the waiting page: {html}");
    let files = linked_files(&html);
    for want in [
        "waiting.css",
        "theme.default.css",
        "pow-solver.js",
        "waiting.js",
        "pow-worker.js",
    ] {
        let (stem, ext) = want.rsplit_once('.').unwrap();
        assert!(
            files.iter().any(|u| {
                u.strip_prefix(&format!("/_sluice/static/{stem}."))
                    .and_then(|r| r.strip_suffix(&format!(".{ext}")))
                    .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            }),
            "{want} linked by its hashed name: {files:?}"
        );
    }
    assert_eq!(files.len(), 5, "{files:?}");
    let mut cache: BTreeMap<String, Wire> = BTreeMap::new();
    let mut first = page.wire;
    let mut plain = page.decoded().len();
    println!("first load, as a browser sends it (Accept-Encoding: {BROWSER_ENCODINGS}):");
    println!(
        "  {:<52} {:>6} B on the wire ({} B of HTML, {})",
        "the page",
        page.wire,
        page.decoded().len(),
        page.header("content-encoding").unwrap_or("identity")
    );
    for url in &files {
        let w = fetch(gw.addr, "GET", url, &subresource).await;
        assert_eq!(w.status, 200, "{url}");
        assert_eq!(w.header("cache-control"), Some(IMMUTABLE), "{url}");
        assert!(
            w.header("etag").is_some_and(|t| t.starts_with('"')),
            "{url}: a strong ETag"
        );
        assert!(w.header("set-cookie").is_none(), "{url}");
        let decoded = w.decoded();
        if decoded.len() >= 256 {
            assert_eq!(w.header("content-encoding"), Some("br"), "{url}");
            assert_eq!(w.header("vary"), Some("Accept-Encoding"), "{url}");
        }
        println!(
            "  {:<52} {:>6} B on the wire ({} B plain, {})",
            url,
            w.wire,
            decoded.len(),
            w.header("content-encoding").unwrap_or("identity")
        );
        first += w.wire;
        plain += decoded.len();
        cache.insert(url.clone(), w);
    }
    println!("  total: {first} B on the wire ({plain} B uncompressed)");

    // Reload: the page is fetched again (no-store); a file kept fresh and
    // immutable is not asked for at all.
    let again = fetch(gw.addr, "GET", "/tickets/1", &browser).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("cache-control"), Some("no-store"));
    let mut reload = again.wire;
    for url in linked_files(&String::from_utf8(again.decoded()).unwrap()) {
        match cache.get(&url) {
            Some(kept) if reused_without_asking(kept) => {}
            _ => {
                let w = fetch(gw.addr, "GET", &url, &subresource).await;
                println!("  reload fetched {url} again: {} B", w.wire);
                reload += w.wire;
            }
        }
    }
    println!(
        "reload: {reload} B on the wire (the page alone: {} B)",
        again.wire
    );
    assert_eq!(reload, again.wire, "a reload moves the page alone");
    assert!(reload < 4 * 1024, "a few KB: {reload} B");
    assert!(first < plain / 3, "compressed: {first} of {plain} B");
    assert_eq!(origin.requests(), 0);
    gw.shutdown().await;
}

/// Hashed names: immutable, a strong ETag per form, 304 on a match, HEAD
/// the same head; plain names and stale hashes never immutable.
#[tokio::test]
async fn only_the_current_hashed_name_is_immutable() {
    let origin = TestOrigin::start().await;
    let gw = waiting_room(&origin).await;
    let page = fetch(gw.addr, "GET", "/", &[("accept", "text/html")]).await;
    let html = String::from_utf8(page.decoded()).unwrap();
    let worker = linked_files(&html)
        .into_iter()
        .find(|u| u.starts_with("/_sluice/static/pow-worker."))
        .expect("the worker's hashed URL");
    assert!(
        html.contains(&format!("data-worker-url=\"{worker}\"")),
        "{html}"
    );

    for (accept, coding) in [("br, gzip", Some("br")), ("gzip", Some("gzip")), ("", None)] {
        let asked: Vec<(&str, &str)> = if accept.is_empty() {
            vec![]
        } else {
            vec![("accept-encoding", accept)]
        };
        let get = fetch(gw.addr, "GET", &worker, &asked).await;
        assert_eq!(get.status, 200);
        assert_eq!(get.header("content-encoding"), coding, "{accept}");
        assert_eq!(get.header("cache-control"), Some(IMMUTABLE));
        assert_eq!(get.header("vary"), Some("Accept-Encoding"));
        assert_eq!(
            get.header("content-type"),
            Some("text/javascript; charset=utf-8")
        );
        assert_eq!(get.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(
            get.header("content-length")
                .map(|l| l.parse::<usize>().unwrap()),
            Some(get.body.len()),
            "{accept}: the exact length, not chunked"
        );
        let tag = get.header("etag").unwrap().to_owned();
        // HEAD: the same head, no content.
        let head = fetch(gw.addr, "HEAD", &worker, &asked).await;
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());
        for h in [
            "content-length",
            "content-encoding",
            "etag",
            "cache-control",
            "vary",
        ] {
            assert_eq!(head.header(h), get.header(h), "HEAD {h} ({accept})");
        }
        // A revalidation naming this form: 304, nothing but the head.
        let mut cond = asked.clone();
        cond.push(("if-none-match", &tag));
        let not_modified = fetch(gw.addr, "GET", &worker, &cond).await;
        assert_eq!(not_modified.status, 304, "{accept}");
        assert!(not_modified.body.is_empty());
        assert_eq!(not_modified.header("etag"), Some(tag.as_str()));
        assert_eq!(not_modified.header("cache-control"), Some(IMMUTABLE));
        // Every form has its own tag.
        let others = ["\"0123456789abcdef\"", "\"0123456789abcdef-br\""];
        let mut cond = asked.clone();
        cond.push(("if-none-match", others[0]));
        assert_eq!(fetch(gw.addr, "GET", &worker, &cond).await.status, 200);
        let decoded = get.decoded();
        assert!(decoded.starts_with(b"/*"), "the worker script");
    }

    // The plain name: the same bytes, no-store (an operator's template or
    // an old page may name it).
    let plain = fetch(
        gw.addr,
        "GET",
        "/_sluice/static/pow-worker.js",
        &[("accept-encoding", "br")],
    )
    .await;
    let hashed = fetch(gw.addr, "GET", &worker, &[("accept-encoding", "br")]).await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("cache-control"), Some("no-store"));
    assert_eq!(plain.decoded(), hashed.decoded());

    // A hashed name of other bytes (a page of another gateway version):
    // sent to the plain name, never cached.
    let stale = fetch(
        gw.addr,
        "GET",
        "/_sluice/static/pow-worker.0123456789abcdef.js",
        &[],
    )
    .await;
    assert_eq!(stale.status, 307);
    assert_eq!(
        stale.header("location"),
        Some("/_sluice/static/pow-worker.js")
    );
    assert_eq!(stale.header("cache-control"), Some("no-store"));
    // Not a file of ours, hashed or not: 404, no-store.
    for path in [
        "/_sluice/static/nope.0123456789abcdef.js",
        "/_sluice/static/nope.js",
    ] {
        let w = fetch(gw.addr, "GET", path, &[]).await;
        assert_eq!(w.status, 404, "{path}");
        assert_eq!(w.header("cache-control"), Some("no-store"), "{path}");
    }
    assert_eq!(origin.requests(), 0);
    gw.shutdown().await;
}

/// The page and every answer of the control plane a waiting visitor's
/// browser gets stay `no-store`; the one that sets the queue cookie too.
#[tokio::test]
async fn the_page_and_the_control_plane_stay_no_store() {
    let origin = TestOrigin::start().await;
    let gw = waiting_room(&origin).await;
    let page = fetch(
        gw.addr,
        "GET",
        "/tickets/1",
        &[("accept", "text/html"), ("accept-encoding", "br")],
    )
    .await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("cache-control"), Some("no-store"));
    assert!(
        page.header("content-type")
            .unwrap()
            .starts_with("text/html")
    );
    for path in [
        "/_sluice/rooms/default",
        "/_sluice/jwks.json",
        "/_sluice/openapi.json",
        "/_sluice/healthz",
        "/_sluice/rooms/default/status",
        "/_sluice/admin/",
    ] {
        let w = fetch(gw.addr, "GET", path, &[("accept-encoding", "br, gzip")]).await;
        assert_eq!(
            w.header("cache-control"),
            Some("no-store"),
            "{path} ({})",
            w.status
        );
    }
    // Join: the answer that sets `sluice_q_default`.
    let mut v = Visitor::new(&gw.url(), "default");
    let res = v.join("/tickets/1").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert!(
        res.header("set-cookie")
            .unwrap()
            .starts_with("sluice_q_default=")
    );
    let cc = res.header("cache-control").unwrap();
    assert!(cc.contains("no-store") && !cc.contains("public"), "{cc}");
    let status = v.status().await;
    assert_eq!(status.header("cache-control"), Some("no-store"));
    gw.shutdown().await;
}
