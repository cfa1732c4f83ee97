//! The reverse proxy through real sockets: a real origin, the real gateway,
//! a real client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use sha2::{Digest, Sha256};
use sluice_tests::client::{TestClient, body, empty};
use sluice_tests::origin::{TestOrigin, pattern_sha256, pattern_stream};
use sluice_tests::{TestGateway, hex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A gateway that trusts loopback as a proxy (so `X-Forwarded-For` is
/// appended) in front of a fresh origin.
async fn setup() -> (TestOrigin, TestGateway) {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()])
        .spawn()
        .await;
    (origin, gw)
}

/// One keep-alive HTTP/1.1 connection to `addr`, driven by hand so that
/// every request takes it, and the task driving it.
async fn keep_alive(
    addr: std::net::SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (tx, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    (tx, tokio::spawn(conn))
}

/// A GET without a body for [`keep_alive`] connections.
fn get(path: &str) -> Request<http_body_util::Empty<bytes::Bytes>> {
    Request::get(path)
        .header("host", "shop.example")
        .body(http_body_util::Empty::new())
        .unwrap()
}

/// A WebSocket through the gateway at `addr` echoes `count` messages, sent
/// `pause` apart.
async fn websocket_echoes(addr: std::net::SocketAddr, count: usize, pause: Duration) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut ws, res) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .expect("websocket handshake through the gateway");
    assert_eq!(res.status(), StatusCode::SWITCHING_PROTOCOLS);
    for i in 0..count {
        tokio::time::sleep(pause).await;
        let msg = format!("hello {i}");
        ws.send(Message::text(msg.clone())).await.unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), msg);
    }
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn methods_and_query_strings_are_intact() {
    let (_origin, gw) = setup().await;
    let client = TestClient::new();
    for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        let url = format!("{}/echo/a%20b/c?x=1&y=%2F&x=2&empty=", gw.url());
        let res = client.call(m, &url, &[], body("payload")).await;
        assert_eq!(res.status, 200, "{method}");
        let v = res.json();
        assert_eq!(v["method"], method);
        assert_eq!(v["path"], "/echo/a%20b/c");
        assert_eq!(v["query"], "x=1&y=%2F&x=2&empty=");
        assert_eq!(v["body_bytes"], 7);
    }
    // HEAD carries no body back.
    let res = client
        .call(Method::HEAD, &format!("{}/echo", gw.url()), &[], empty())
        .await;
    assert_eq!(res.status, 200);
    assert!(res.body.is_empty());
}

#[tokio::test]
async fn end_to_end_headers_kept_hop_by_hop_removed_both_ways() {
    let (_origin, gw) = setup().await;
    let client = TestClient::new();
    let res = client
        .get(
            &format!("{}/echo", gw.url()),
            &[
                ("x-custom", "kept"),
                ("accept-language", "fr"),
                ("connection", "keep-alive, x-hop-private"),
                ("x-hop-private", "must go"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("proxy-authorization", "Basic Zm9vOmJhcg=="),
                ("proxy-connection", "keep-alive"),
                ("upgrade", "h2c"),
            ],
        )
        .await;
    let v = res.json();
    let h = &v["headers"];
    assert_eq!(h["x-custom"][0], "kept");
    assert_eq!(h["accept-language"][0], "fr");
    for gone in [
        "x-hop-private",
        "keep-alive",
        "te",
        "proxy-authorization",
        "proxy-connection",
        "upgrade",
    ] {
        assert!(h.get(gone).is_none(), "{gone} reached the origin: {h}");
    }
    // the request id travels upstream and comes back
    assert!(h["x-request-id"][0].as_str().unwrap().len() > 4);
    assert!(res.header("x-request-id").is_some());

    // response direction
    let res = client.get(&format!("{}/hop", gw.url()), &[]).await;
    assert_eq!(res.status, 200);
    assert_eq!(res.header("x-end-to-end"), Some("kept"));
    for gone in ["x-origin-private", "keep-alive", "proxy-authenticate"] {
        assert!(res.headers.get(gone).is_none(), "{gone} reached the client");
    }
}

#[tokio::test]
async fn forwarding_headers() {
    let (_origin, gw) = setup().await;
    let client = TestClient::new();
    // behind a trusted proxy: appended
    let res = client
        .get(
            &format!("{}/echo", gw.url()),
            &[("x-forwarded-for", "203.0.113.9"), ("host", "shop.example")],
        )
        .await;
    let h = &res.json()["headers"];
    assert_eq!(h["x-forwarded-for"][0], "203.0.113.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"][0], "http");
    assert_eq!(h["x-forwarded-host"][0], "shop.example");
    assert_eq!(h["host"][0], "shop.example");
    assert_eq!(
        h["forwarded"][0],
        "for=203.0.113.9;host=\"shop.example\";proto=http"
    );

    // an untrusted peer cannot forge its address
    let origin = TestOrigin::start().await;
    let untrusting = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .spawn()
        .await;
    let res = client
        .get(
            &format!("{}/echo", untrusting.url()),
            &[
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-proto", "https"),
            ],
        )
        .await;
    let h = &res.json()["headers"];
    assert_eq!(h["x-forwarded-for"][0], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"][0], "http");
    assert!(
        h["forwarded"][0]
            .as_str()
            .unwrap()
            .starts_with("for=127.0.0.1;")
    );
}

#[tokio::test]
async fn forged_sluice_headers_are_dropped() {
    let (_origin, gw) = setup().await;
    let res = TestClient::new()
        .get(
            &format!("{}/echo", gw.url()),
            &[
                ("sluice-admission", "forged.token.here"),
                ("Sluice-Command", "revoke"),
                ("x-not-sluice", "kept"),
            ],
        )
        .await;
    let h = &res.json()["headers"];
    assert!(h.get("sluice-admission").is_none(), "{h}");
    assert!(h.get("sluice-command").is_none(), "{h}");
    assert_eq!(h["x-not-sluice"][0], "kept");
}

#[tokio::test]
async fn chunked_bodies_both_ways() {
    let (_origin, gw) = setup().await;
    let client = TestClient::new();
    let res = client.get(&format!("{}/chunked", gw.url()), &[]).await;
    assert_eq!(res.text(), "one,two,three");
    // a chunked upload (no content-length)
    let stream = StreamBody::new(pattern_stream(300_000));
    let req = Request::post(format!("{}/echo", gw.url()))
        .body(BodyExt::boxed(stream))
        .unwrap();
    let res = client.send(req).await;
    let v = res.json();
    assert_eq!(v["body_bytes"], 300_000);
    assert_eq!(v["body_sha256"], pattern_sha256(300_000));
    assert!(v["headers"].get("content-length").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_intact_without_buffering() {
    const UP: u64 = 24 * 1024 * 1024;
    const DOWN: u64 = 32 * 1024 * 1024;
    let origin = TestOrigin::start().await;
    // The real binary in its own process, so its memory is measured alone
    // (tests of this file run in parallel in one process).
    let cfg = sluice_tests::temp_file(
        "proxy.toml",
        "[[rooms]]\nid = \"default\"\npaths = [\"/queue\"]\n",
    );
    let gw = sluice_tests::GatewayProcess::start(&[
        "--origin",
        &origin.url(),
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let client = TestClient::new();
    // warm up allocators and pools
    let _ = client
        .get(&format!("{}/bytes/1000000", gw.url()), &[])
        .await;
    // and wait for the start-up's compression of the stored files and
    // documents (visitor::assets::warm): its peak is not a body's
    for path in [
        "/_sluice/static/waiting.js",
        "/_sluice/openapi.json",
        "/_sluice/admin/",
    ] {
        assert_eq!(
            client.get(&format!("{}{path}", gw.url()), &[]).await.status,
            200
        );
    }
    let before = gw.memory("VmHWM").expect("gateway memory");

    // 24 MiB up, streamed from a generator, hashed by the origin as it arrives
    let req = Request::post(format!("{}/echo/upload", gw.url()))
        .header("content-length", UP.to_string())
        .body(BodyExt::boxed(StreamBody::new(pattern_stream(UP))))
        .unwrap();
    let res = client.send(req).await;
    let v = res.json();
    assert_eq!(v["body_bytes"], UP);
    assert_eq!(v["body_sha256"], pattern_sha256(UP));

    // 32 MiB down, hashed frame by frame by the client
    let res = client
        .send_streaming(
            Request::get(format!("{}/bytes/{DOWN}", gw.url()))
                .body(empty())
                .unwrap(),
        )
        .await;
    let expected = res.headers()["x-body-sha256"].to_str().unwrap().to_owned();
    let mut body = res.into_body();
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Some(d) = frame.unwrap().data_ref() {
            n += d.len() as u64;
            h.update(d);
        }
    }
    assert_eq!(n, DOWN);
    assert_eq!(hex(&h.finalize()), expected);

    // Peak resident memory of the gateway: had it buffered either body, it
    // would have grown by about that body's size.
    let growth = gw.memory("VmHWM").unwrap().saturating_sub(before);
    assert!(
        growth < 8 * 1024 * 1024,
        "gateway peak memory grew by {growth} bytes while streaming {UP} up and {DOWN} down"
    );
}

#[tokio::test]
async fn websocket_echo_through_the_proxy() {
    let (_origin, gw) = setup().await;
    websocket_echoes(gw.addr, 5, Duration::ZERO).await;
}

#[tokio::test]
async fn origin_unreachable_is_502_problem() {
    // a port nobody listens on
    let port = sluice_tests::redis_server::free_port();
    let gw = TestGateway::builder()
        .origin(format!("http://127.0.0.1:{port}"))
        .unguarded()
        .spawn()
        .await;
    let res = TestClient::new()
        .get(&format!("{}/anything", gw.url()), &[])
        .await;
    assert_eq!(res.status, StatusCode::BAD_GATEWAY);
    assert_eq!(res.header("content-type"), Some("application/problem+json"));
    assert_eq!(res.json()["code"], "origin_unreachable");
    assert!(res.header("retry-after").is_some());
}

#[tokio::test]
async fn origin_too_slow_is_504_problem() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| c.timeouts.upstream_response = Duration::from_millis(300))
        .spawn()
        .await;
    let client = TestClient::new();
    let res = client.get(&format!("{}/slow/2000", gw.url()), &[]).await;
    assert_eq!(res.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.json()["code"], "origin_timeout");
    // a fast request still passes
    let res = client.get(&format!("{}/slow/10", gw.url()), &[]).await;
    assert_eq!(res.status, 200);
}

/// The wait for the origin is bounded on both ways to it (the server's
/// direct path, and the admission gate's for a guarded path, here a visitor
/// let through at once), with a header timeout far longer than the
/// response timeout; the client's connection carries on after a 504.
#[tokio::test]
async fn origin_too_slow_is_504_on_either_path_and_the_connection_carries_on() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.timeouts.upstream_response = Duration::from_millis(300);
            c.timeouts.header_read = Duration::from_secs(30);
            // 3001 ms: guarded; 3000 ms: no room's.
            c.rooms = vec![sluice_tests::easy_room(
                "shop",
                1000.0,
                1000.0,
                &["/slow/3001"],
            )];
        })
        .spawn()
        .await;
    let (mut tx, _conn) = keep_alive(gw.addr).await;
    for path in ["/slow/3000", "/slow/3001", "/slow/3000"] {
        tx.ready().await.unwrap();
        let res = tx.send_request(get(path)).await.unwrap();
        assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT, "{path}");
        // The guarded one went through the gate: it admitted the visitor.
        let admitted = res
            .headers()
            .get_all("set-cookie")
            .iter()
            .any(|c| c.to_str().unwrap().starts_with("sluice_a_shop="));
        assert_eq!(admitted, path == "/slow/3001", "{path}");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "origin_timeout", "{path}");
        // The same connection is served again at once.
        tx.ready().await.unwrap();
        let res = tx.send_request(get("/echo/next")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
    }
}

/// `limits.max_header_bytes` bounds the request head however it arrives
/// (in one write, here, where the read buffer's bound alone let a head
/// past it).
#[tokio::test]
async fn request_heads_past_max_header_bytes_are_431() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .spawn()
        .await;
    // The default bound: 64 KiB.
    for (size, want) in [
        (60 * 1024, "HTTP/1.1 200"),
        (100 * 1024, "HTTP/1.1 431"),
        (1024 * 1024, "HTTP/1.1 431"),
    ] {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let req = format!(
            "GET /echo/big HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(size)
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with(want),
            "{size} bytes: {}",
            &text[..text.len().min(80)]
        );
    }
    assert_eq!(
        origin.requests(),
        1,
        "only the one under the bound reached the origin"
    );
}

/// An origin under a base path gets every target under it, on both ways to
/// it (a request without a body, and one with).
#[tokio::test]
async fn an_origin_base_path_prefixes_every_target() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(format!("{}/echo/base/", origin.url()))
        .unguarded()
        .spawn()
        .await;
    let client = TestClient::new();
    let res = client.get(&format!("{}/x/y?q=1", gw.url()), &[]).await;
    assert_eq!(res.status, 200);
    assert_eq!(res.json()["path"], "/echo/base/x/y");
    assert_eq!(res.json()["query"], "q=1");
    let req = Request::post(format!("{}/z?r=2", gw.url()))
        .body(body("data"))
        .unwrap();
    let res = client.send(req).await;
    assert_eq!(res.status, 200);
    assert_eq!(res.json()["path"], "/echo/base/z");
    assert_eq!(res.json()["query"], "r=2");
    assert_eq!(res.json()["body_bytes"], 4);
}

#[tokio::test]
async fn slowloris_is_closed_by_the_header_timeout() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| c.timeouts.header_read = Duration::from_millis(500))
        .spawn()
        .await;

    // 1. a client that connects and says nothing
    let mut silent = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    // 2. a client that trickles its headers
    let mut trickle = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    trickle
        .write_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let trickler = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if trickle.write_all(b"X-A: b\r\n").await.is_err() {
                return true;
            }
        }
        // after 2 s of trickling the server must have closed the stream
        let mut buf = [0u8; 1024];
        matches!(
            tokio::time::timeout(Duration::from_secs(2), trickle.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        ) || matches!(
            tokio::time::timeout(Duration::from_secs(2), trickle.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    });
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("silent connection must be closed within the timeout");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    assert!(trickler.await.unwrap(), "trickling client was not cut off");
    assert_eq!(origin.requests(), 0);
}

/// The header timeout counts only while the connection waits for a request
/// head: a slow origin, a response streamed for longer than the timeout, a
/// keep-alive connection used again and again, and a WebSocket are never
/// cut by it.
#[tokio::test]
async fn the_header_timeout_never_cuts_a_request_being_answered() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| c.timeouts.header_read = Duration::from_millis(300))
        .spawn()
        .await;

    // One keep-alive connection, driven by hand so every request takes it.
    let (mut tx, conn) = keep_alive(gw.addr).await;
    // The origin takes 0.8 s to answer: the connection is busy, not idle.
    let res = tx.send_request(get("/slow/800")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        &res.into_body().collect().await.unwrap().to_bytes()[..],
        b"slept"
    );
    // A body streamed over 0.8 s arrives whole.
    tx.ready().await.unwrap();
    let res = tx.send_request(get("/drip/8/100")).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let want: String = (0..8).map(|i| format!("drop {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&body), want);
    // Requests 0.15 s apart for 1.2 s: each gap is under the timeout, the
    // whole is four times it.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        tx.ready().await.unwrap();
        let res = tx.send_request(get("/echo/again")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
    }
    // Then silence: the connection is closed after the timeout.
    let ended = tokio::time::timeout(Duration::from_secs(3), conn).await;
    assert!(
        ended.is_ok(),
        "an idle keep-alive connection was not closed"
    );

    // A WebSocket lives on well past the timeout, quiet between messages.
    websocket_echoes(gw.addr, 3, Duration::from_millis(400)).await;
}

/// Connections go to the I/O thread with the fewest open, and each thread's
/// `sluice_open_connections` follows them opening and closing.
#[tokio::test]
async fn connections_are_spread_over_the_io_threads() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| {
            c.server.io_threads = 3;
            c.admin_token = Some(sluice_tests::ADMIN_TOKEN.to_owned());
        })
        .spawn()
        .await;
    // One scrape, on a connection of its own, read for every thread.
    let open = |base: String| async move {
        let text = TestClient::new()
            .get(
                &format!("{base}/metrics"),
                &[(
                    "authorization",
                    &format!("Bearer {}", sluice_tests::ADMIN_TOKEN),
                )],
            )
            .await
            .text();
        (0..3)
            .map(|t| {
                let prefix = format!("sluice_open_connections{{io_thread=\"{t}\"}} ");
                text.lines()
                    .find_map(|l| l.strip_prefix(&prefix))
                    .map_or(-1.0, |v| v.trim().parse::<f64>().unwrap())
            })
            .collect::<Vec<f64>>()
    };
    let mut held = Vec::new();
    for _ in 0..6 {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"GET /echo/held HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(s); // kept alive
    }
    // Six held, plus the scrape's own connection on one of the threads.
    let counts = open(gw.url()).await;
    assert_eq!(counts.iter().sum::<f64>(), 7.0, "{counts:?}");
    assert!(counts.iter().all(|&c| c == 2.0 || c == 3.0), "{counts:?}");
    drop(held);
    let mut counts = Vec::new();
    for _ in 0..50 {
        counts = open(gw.url()).await;
        if counts.iter().sum::<f64>() == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        counts.iter().sum::<f64>(),
        1.0,
        "closed connections still counted: {counts:?}"
    );
}

#[tokio::test]
async fn http2_cleartext_is_served() {
    let (_origin, gw) = setup().await;
    let res = TestClient::http2()
        .get(&format!("{}/echo/h2?q=1", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    let v = res.json();
    assert_eq!(v["path"], "/echo/h2");
    assert_eq!(v["query"], "q=1");
    // upstream is HTTP/1.1 with the authority as Host
    assert_eq!(v["version"], "HTTP/1.1");
    assert_eq!(v["headers"]["host"][0], gw.addr.to_string());
}

/// Request ids on both ways to the origin: the direct path of unguarded
/// requests and the guarded path through the room give ids from one
/// counter, keep a client's own id, and echo the id in the response.
#[tokio::test]
async fn request_ids_are_kept_given_and_echoed_on_both_paths() {
    let (_origin, gw) = setup().await;
    let client = TestClient::new();
    let mut given = Vec::new();
    // `/echo` is unguarded (the direct path); `/queue/echo` is the room's.
    for path in ["/echo", "/queue/echo", "/echo"] {
        let res = client.get(&format!("{}{path}", gw.url()), &[]).await;
        let id = res.header("x-request-id").unwrap().to_owned();
        if res.status == 200 {
            assert_eq!(
                res.json()["headers"]["x-request-id"][0],
                id.as_str(),
                "{path}"
            );
        }
        given.push(id);
    }
    // One per-process prefix, one counter: the ids share their prefix and
    // increase in the order the requests came.
    let parts: Vec<(&str, u64)> = given
        .iter()
        .map(|id| {
            let (prefix, n) = id.split_once('-').unwrap();
            (prefix, u64::from_str_radix(n, 16).unwrap())
        })
        .collect();
    assert!(
        parts
            .windows(2)
            .all(|w| w[0].0 == w[1].0 && w[0].1 < w[1].1),
        "{given:?}"
    );

    let res = client
        .get(
            &format!("{}/echo", gw.url()),
            &[("x-request-id", "client-chosen-42")],
        )
        .await;
    assert_eq!(res.header("x-request-id"), Some("client-chosen-42"));
    assert_eq!(res.json()["headers"]["x-request-id"][0], "client-chosen-42");
}
