//! The gate's promises, tried as a hostile client would (issue 16): each
//! test is named after the class of attack it closes, and generates members
//! of the class rather than trying one example.
//!
//! - one canonical request: every spelling of a guarded path is guarded,
//!   what cannot be read one way is refused, the origin sees the canonical
//!   form;
//! - only WebSocket is tunnelled, counted as a connection, bounded in time;
//! - no place in line without proof of work;
//! - one place, one admission, one session;
//! - a revoke sticks on every gateway;
//! - live settings are the store's and never lost;
//! - difficulty means what it says;
//! - the control plane cannot be held hostage by stalled bodies;
//! - a place is never given twice across store loss.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::{Rng, RngExt as _, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use sluice_gateway::config::{Config, RoomConfig};
use sluice_tests::client::{TestClient, raw, statuses};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{
    ADMIN_TOKEN, TestGateway, admin_patch, admin_room, easy_room, metric, temp_keys,
};

const POW_SECRET: &str = "integrity-test-pow-secret-0123456789";

/// A gateway in front of `origin` with `rooms`, on `redis` if given, keys
/// and proof-of-work secret shared (so several gateways make one cluster).
async fn gateway(
    origin: &TestOrigin,
    keys: &std::path::Path,
    redis: Option<&str>,
    rooms: Vec<RoomConfig>,
    edit: impl FnOnce(&mut Config),
) -> TestGateway {
    let keys = keys.to_owned();
    let mut b = TestGateway::builder().origin(origin.url());
    if let Some(url) = redis {
        b = b.redis(url);
    }
    b.config(move |c| {
        c.keys_dir = Some(keys);
        c.pow_secret = Some(POW_SECRET.into());
        c.rooms = rooms;
        edit(c);
    })
    .spawn()
    .await
}

/// A gateway of a group on one Redis, with one room.
async fn on_redis(
    origin: &TestOrigin,
    keys: &std::path::Path,
    redis: &RedisServer,
    room: &RoomConfig,
) -> TestGateway {
    gateway(origin, keys, Some(&redis.url()), vec![room.clone()], |_| {}).await
}

/// The event `demo` (of room `default`) with `total` units and a cart
/// limit of `cart_limit`.
fn demo_event(total: u64, cart_limit: u32) -> Vec<sluice_gateway::config::EventConfig> {
    vec![sluice_gateway::config::EventConfig {
        total,
        cart_limit,
        ..Default::default()
    }]
}

/// Waits until `check` holds of the room's admin view, or panics.
async fn until_room(base: &str, room: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = admin_room(base, room).await;
        if check(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: {v:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A GET as raw bytes: `GET {target} HTTP/1.1` with `headers`.
async fn get_raw(gw: &TestGateway, target: &str, headers: &[&str]) -> String {
    let mut req = format!("GET {target} HTTP/1.1\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("Connection: close\r\n\r\n");
    raw(gw.addr, req.as_bytes(), Duration::from_secs(3)).await
}

fn body_of(text: &str) -> &str {
    text.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// The claims of a JWT, unverified.
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64")).expect("JSON")
}

// === 1. one canonical request, decided once ===

/// A spelling an origin resolves to the same path as `canonical`: merged
/// or doubled slashes, `.` and `x/..` segments, percent-escapes of
/// unreserved characters in either hex case.
fn spelling(canonical: &str, rng: &mut impl Rng) -> String {
    let segments: Vec<&str> = canonical.trim_start_matches('/').split('/').collect();
    let mut out = String::new();
    for seg in segments {
        match rng.random_range(0..6) {
            0 => out.push_str("//"),
            1 => out.push_str("/./"),
            2 => out.push_str("/zz/../"),
            3 => out.push_str("/%2e/"),
            4 => out.push_str("/j%2E%2e/../"),
            _ => out.push('/'),
        }
        for c in seg.chars() {
            let unreserved = c.is_ascii_alphanumeric() || "-._~".contains(c);
            if unreserved && rng.random_bool(0.3) {
                let hex = format!("{:02x}", c as u32);
                let hex = if rng.random_bool(0.5) {
                    hex.to_uppercase()
                } else {
                    hex
                };
                out.push('%');
                out.push_str(&hex);
            } else {
                out.push(c);
            }
        }
    }
    // `/a//` and `/a/./` leave the trailing slash the canonical form has
    out = out.replace("///", "//");
    out
}

/// Rooms of the canonical-request test: `tickets` guards `/echo/tickets`
/// (but lets `/echo/tickets/public` by), `vip` guards `/echo/vip` on host
/// `vip.example` only. Both paused: nobody passes through.
fn canonical_rooms() -> Vec<RoomConfig> {
    let mut tickets = easy_room("tickets", 10.0, 1.0, &["/echo/tickets"]);
    tickets.bypass_paths = vec!["/echo/tickets/public".into()];
    let mut vip = easy_room("vip", 10.0, 1.0, &["/echo/vip"]);
    vip.hosts = vec!["VIP.Example".into()];
    let mut v6 = easy_room("v6", 10.0, 1.0, &["/echo/v6"]);
    v6.hosts = vec!["[2001:DB8::1]".into()];
    vec![tickets, vip, v6]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canonical_spellings_of_a_guarded_path_never_reach_the_origin_unqueued() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None, canonical_rooms(), |_| {}).await;
    let base = gw.url();
    for room in ["tickets", "vip", "v6"] {
        assert_eq!(
            admin_patch(&base, room, json!({"paused": true}))
                .await
                .status,
            200
        );
    }
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    let host = "Host: shop.example";
    let waiting = |text: &str| statuses(text) == [503] && text.contains("waiting_room_active");
    let refused = |text: &str| statuses(text) == [400] && text.contains("malformed_request");

    // Generated spellings of guarded paths: the waiting room or a refusal,
    // never the origin.
    let guarded = [
        "/echo/tickets",
        "/echo/tickets/42",
        "/echo/tickets/public/../42",
        "/echo/tickets/a-b_c~d.e/seat",
        "/echo/tickets/",
    ];
    let before = origin.requests();
    for _ in 0..60 {
        for path in guarded {
            let s = spelling(path, &mut rng);
            let text = get_raw(&gw, &s, &[host]).await;
            assert!(waiting(&text) || refused(&text), "{s}: {text}");
        }
    }
    // Tomcat's path parameters and what climbs through them.
    for s in [
        "/echo/tickets;jsessionid=1",
        "/echo/tickets;a=b/42",
        "/echo/;x/tickets",
        "/echo/TICKETS/../tickets/1",
    ] {
        let text = get_raw(&gw, s, &[host]).await;
        assert!(waiting(&text), "{s}: {text}");
    }
    // What no origin reads one way: refused.
    for s in [
        "/echo/tickets%2F42",
        "/echo/x%2F..%2Ftickets",
        "/echo/tickets%5c42",
        "/echo/tickets/public/..;/42",
        "/echo/tickets/public/%2e%2e;/42",
        "/echo/%00/tickets",
        "/../echo/tickets",
        "/echo/%2e%2e/%2e%2e/%2e%2e/tickets",
        "/echo/tickets/%zz",
        "/echo/tickets/%252e%252e/x",
        "/echo/tickets/%c0%ae%c0%ae/x",
    ] {
        let text = get_raw(&gw, s, &[host]).await;
        assert!(refused(&text), "{s}: {text}");
    }
    assert_eq!(
        origin.requests(),
        before,
        "a guarded path reached the origin"
    );

    // Unguarded and bypassed paths pass, and the origin is sent the
    // canonical form whatever the spelling (its echo says what it got).
    let passing = [
        "/echo/other/a",
        "/echo/ticketsx",
        "/echo/tickets/public/map",
        "/echo/vip/1",
    ];
    for _ in 0..30 {
        for path in passing {
            let s = spelling(path, &mut rng);
            let text = get_raw(&gw, &format!("{s}?q=%2F..%2F"), &[host]).await;
            assert_eq!(statuses(&text), [200], "{s}: {text}");
            let echoed: Value = serde_json::from_str(body_of(&text)).expect("the origin's echo");
            assert_eq!(echoed["path"], path, "{s}");
            assert_eq!(
                echoed["query"], "q=%2F..%2F",
                "the query is forwarded as sent"
            );
        }
    }

    // Hosts: one canonical host decides, whatever its case or trailing dot.
    for h in [
        "VIP.EXAMPLE",
        "vip.example.",
        "Vip.Example:8080",
        "vip.example:80",
    ] {
        let text = get_raw(&gw, "/echo/vip/1", &[&format!("Host: {h}")]).await;
        assert!(waiting(&text), "{h}: {text}");
    }
    // Two hosts, a disagreeing absolute form, a bad host: refused.
    let text = get_raw(
        &gw,
        "/echo/vip/1",
        &["Host: a.example", "Host: vip.example"],
    )
    .await;
    assert!(refused(&text), "{text}");
    let text = get_raw(&gw, "http://a.example/echo/vip/1", &["Host: vip.example"]).await;
    assert!(refused(&text), "{text}");
    for h in [
        "Host: vip.example:99999",
        "Host: user@vip.example",
        "Host: vip..example",
    ] {
        let text = get_raw(&gw, "/echo/vip/1", &[h]).await;
        assert!(refused(&text), "{h}: {text}");
    }
    // An IPv6 literal host in any spelling of the same address is that
    // room's; a malformed literal is refused; another address is not it.
    for h in [
        "[2001:db8::1]",
        "[2001:DB8::1]:8080",
        "[2001:0db8:0:0:0:0:0:1]",
        "[2001:db8:0::0:1]:80",
    ] {
        let text = get_raw(&gw, "/echo/v6/x", &[&format!("Host: {h}")]).await;
        assert!(waiting(&text), "{h}: {text}");
        let text = get_raw(
            &gw,
            &format!("http://{h}/echo/v6/y"),
            &[&format!("Host: {h}")],
        )
        .await;
        assert!(waiting(&text), "absolute {h}: {text}");
    }
    for h in [
        "[2001:db8::1",
        "[2001:db8::1]x",
        "[2001:db8::zz]",
        "[fe80::1%25eth0]",
    ] {
        let text = get_raw(&gw, "/echo/v6/x", &[&format!("Host: {h}")]).await;
        assert!(refused(&text), "{h}: {text}");
    }
    let before_v6 = origin.requests();
    let text = get_raw(&gw, "/echo/v6/x", &["Host: [2001:db8::2]"]).await;
    assert_eq!(
        statuses(&text),
        [200],
        "another address is not the room's: {text}"
    );
    assert_eq!(origin.requests(), before_v6 + 1);
    // The absolute form is its host: guarded as the vip host.
    let text = get_raw(&gw, "http://VIP.example/echo/vip/1", &["Host: vip.example"]).await;
    assert!(waiting(&text), "{text}");
    assert_eq!(
        origin.requests(),
        before + 121,
        "only the passing requests reached the origin"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_may_pass_encoded_slashes_and_still_routes_on_the_decoded_path() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut files = easy_room("files", 10.0, 1.0, &["/echo/files"]);
    files.allow_encoded_slashes = true;
    let tickets = easy_room("tickets", 10.0, 1.0, &["/echo/tickets"]);
    let gw = gateway(&origin, &keys, None, vec![files, tickets], |_| {}).await;
    for room in ["files", "tickets"] {
        admin_patch(&gw.url(), room, json!({"paused": true})).await;
    }
    let before = origin.requests();
    // /echo/files/a%2Fb is the files room's (opted in): queued, not refused
    let text = get_raw(&gw, "/echo/files/a%2Fb", &["Host: x"]).await;
    assert_eq!(statuses(&text), [503], "{text}");
    // climbing through an encoded slash into a room that did not opt in
    let text = get_raw(&gw, "/echo/files/x%2F..%2F..%2Ftickets", &["Host: x"]).await;
    assert_eq!(statuses(&text), [400], "{text}");
    // unguarded either way: passed as sent (the origin decides)
    let text = get_raw(&gw, "/echo/open/a%2Fb", &["Host: x"]).await;
    assert_eq!(statuses(&text), [200], "{text}");
    assert_eq!(origin.requests(), before + 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_insensitive_rules_are_a_room_option() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut iis = easy_room("iis", 10.0, 1.0, &["/echo/Tickets"]);
    iis.case_insensitive_paths = true;
    let strict = easy_room("strict", 10.0, 1.0, &["/echo/vip"]);
    let gw = gateway(&origin, &keys, None, vec![iis, strict], |_| {}).await;
    for room in ["iis", "strict"] {
        admin_patch(&gw.url(), room, json!({"paused": true})).await;
    }
    for p in ["/echo/tickets", "/echo/TICKETS/1", "/echo/tIcKeTs;x"] {
        let text = get_raw(&gw, p, &["Host: x"]).await;
        assert_eq!(statuses(&text), [503], "{p}: {text}");
    }
    // off by default: another spelling of the case is another path
    let text = get_raw(&gw, "/echo/VIP", &["Host: x"]).await;
    assert_eq!(statuses(&text), [200], "{text}");
    gw.shutdown().await;
}

// === 2. only WebSocket is tunnelled ===

/// `sluice_open_connections`, summed over the I/O threads.
async fn open_connections(base: String) -> f64 {
    let res = TestClient::new()
        .get(
            &format!("{base}/metrics"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await;
    res.text()
        .lines()
        .filter(|l| l.starts_with("sluice_open_connections{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_websocket_is_tunnelled() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(
        &origin,
        &keys,
        None,
        vec![easy_room("default", 10.0, 1.0, &["/queue"])],
        |c| c.timeouts.tunnel_idle = Duration::from_millis(1500),
    )
    .await;
    // Every other upgrade is a plain request: no 101, the upgrade headers
    // never reach the origin.
    for (conn, upgrade) in [
        ("Upgrade, HTTP2-Settings", "h2c"),
        ("upgrade", "H2C"),
        ("Upgrade", "websocket, h2c"),
        ("Upgrade", "tls/1.2"),
        ("keep-alive, Upgrade", "foo/1"),
    ] {
        let text = get_raw(
            &gw,
            "/echo/up",
            &[
                "Host: x",
                &format!("Connection: {conn}"),
                &format!("Upgrade: {upgrade}"),
                "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version: 13",
            ],
        )
        .await;
        assert_eq!(statuses(&text), [200], "{upgrade}: {text}");
        let echoed: Value = serde_json::from_str(body_of(&text)).unwrap();
        for h in ["upgrade", "http2-settings", "connection"] {
            assert!(
                echoed["headers"][h].is_null(),
                "{upgrade}: {h} reached the origin: {echoed}"
            );
        }
    }
    // A WebSocket is counted as an open connection while it lives, and
    // closed once idle.
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let open = || open_connections(gw.url());
    let idle = open().await;
    let (mut ws, res) = tokio_tungstenite::connect_async(format!("ws://{}/ws", gw.addr))
        .await
        .expect("a websocket handshake");
    assert_eq!(res.status(), 101);
    ws.send(Message::text("ping")).await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap();
    assert_eq!(
        echoed.unwrap().unwrap().into_text().unwrap().as_str(),
        "ping"
    );
    // the handshake's connection ended in hyper; the tunnel still counts
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        open().await >= idle + 1.0,
        "the tunnel is not counted as a connection"
    );
    let started = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), ws.next()).await;
    assert!(
        matches!(
            end,
            Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_))))
        ),
        "an idle tunnel was not closed: {end:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1000),
        "closed too early: {took:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        open().await <= idle + 0.5,
        "the closed tunnel is still counted"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_websocket_ends_when_its_admission_is_revoked() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(
        &origin,
        &keys,
        None,
        vec![easy_room("default", 100.0, 5.0, &["/ws", "/command"])],
        |_| {},
    )
    .await;
    let mut v = Visitor::new(&gw.url(), "default");
    v.join("/ws").await;
    assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
    let token = v.admission_token.clone().unwrap();
    let mut req = format!("ws://{}/ws", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "cookie",
        format!("sluice_a_default={token}").parse().unwrap(),
    );
    let (mut ws, res) = tokio_tungstenite::connect_async(req)
        .await
        .expect("handshake");
    assert_eq!(res.status(), 101);
    // the origin revokes the session on another request of the visitor
    let res = v.get_admitted("/command/revoke").await;
    assert_eq!(res.status, 200, "{}", res.text());
    let end = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
    assert!(
        matches!(
            end,
            Ok(None)
                | Ok(Some(Err(_)))
                | Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Close(_))))
        ),
        "the tunnel outlived its revoked admission: {end:?}"
    );
    gw.shutdown().await;
}

/// Tunnels are bounded like connections and by their admission: open
/// WebSockets take `limits.max_connections` slots (a connection past the
/// bound is closed unanswered, and a slot comes back when a tunnel ends);
/// a guarded tunnel closes when its admission token expires (a WebSocket
/// renews nothing); an origin that refuses the handshake opens no tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_are_bounded_like_connections_and_by_their_admission() {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 100.0, 5.0, &["/ws"]);
    room.session_ttl = Duration::from_secs(3);
    let gw = gateway(&origin, &keys, None, vec![room], |c| {
        c.limits.max_connections = 3;
    })
    .await;
    // one connection past the bound is closed unanswered
    let refused = || async {
        let Ok(mut s) = tokio::net::TcpStream::connect(gw.addr).await else {
            return true;
        };
        let _ = s
            .write_all(b"GET /_sluice/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await;
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut buf)).await;
        buf.is_empty()
    };
    let admitted = |token: String| {
        let mut req = format!("ws://{}/ws", gw.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "cookie",
            format!("sluice_a_default={token}").parse().unwrap(),
        );
        req
    };
    let mut v = Visitor::new(&gw.url(), "default");
    v.join("/ws").await;
    assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
    let token = v.admission_token.clone().unwrap();
    let exp = claims(&token)["exp"].as_u64().unwrap();
    drop(v); // its kept-alive connections free their slots

    // an origin that refuses the handshake: its answer, and no tunnel
    let mut req = format!("ws://{}/status/403", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("host", "x".parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(res)) => assert_eq!(res.status(), 403),
        other => panic!("a refused handshake opened a tunnel: {other:?}"),
    }

    // three tunnels fill the bound; a fourth connection is refused
    let mut tunnels = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while tunnels.len() < 3 {
        // retried while a closed client connection may still hold a slot
        match tokio_tungstenite::connect_async(admitted(token.clone())).await {
            Ok((ws, res)) => {
                assert_eq!(res.status(), 101);
                tunnels.push(ws);
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no slot for a tunnel: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        refused().await,
        "a connection past the bound was served beside 3 tunnels"
    );
    // every tunnel still carries
    for ws in tunnels.iter_mut() {
        ws.send(Message::text("ping")).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap();
        assert_eq!(m.unwrap().unwrap().into_text().unwrap().as_str(), "ping");
    }
    // a tunnel that ends gives its slot back
    let mut one = tunnels.pop().unwrap();
    one.close(None).await.unwrap();
    drop(one);
    let deadline = Instant::now() + Duration::from_secs(5);
    while refused().await {
        assert!(
            Instant::now() < deadline,
            "the ended tunnel's slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // the others close when the admission token expires, not before
    for ws in tunnels.iter_mut() {
        let end = tokio::time::timeout(Duration::from_secs(10), ws.next()).await;
        assert!(
            matches!(
                end,
                Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_))))
            ),
            "a tunnel outlived its admission: {end:?}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            now + 1 >= exp,
            "closed before its admission expired ({now} < {exp})"
        );
    }
    gw.shutdown().await;
}

// === 3. no place in line without proof of work ===

async fn racing_cookieless_requests_take_no_place(redis: Option<&str>) {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(
        &origin,
        &keys,
        redis,
        vec![easy_room("default", 0.01, 5.0, &["/echo/shop"])],
        |_| {},
    )
    .await;
    let base = gw.url();
    until_room(&base, "default", "full bucket", |v| v["tail"] == 0).await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let addr = gw.addr;
        tasks.push(tokio::spawn(async move {
            let req = format!(
                "GET /echo/shop/{i} HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
            );
            raw(addr, req.as_bytes(), Duration::from_secs(5)).await
        }));
    }
    let (mut admitted, mut waiting) = (0, 0);
    for t in tasks {
        let text = t.await.unwrap();
        let lower = text.to_ascii_lowercase();
        assert!(
            !lower.contains("set-cookie: sluice_q_"),
            "a place without work: {text}"
        );
        match statuses(&text).as_slice() {
            [200] => {
                assert!(lower.contains("set-cookie: sluice_a_default="));
                admitted += 1;
            }
            [503] => {
                assert!(text.contains("waiting_room_active"), "{text}");
                waiting += 1;
            }
            other => panic!("{other:?}: {text}"),
        }
    }
    assert_eq!(admitted + waiting, 200);
    assert!(admitted <= 5, "{admitted} admitted with a burst of 5");
    assert!(admitted >= 1, "nobody passed through an idle room");
    let room = until_room(&base, "default", "the snapshot catches up", |v| {
        v["tail"].as_u64() == Some(admitted)
    })
    .await;
    assert_eq!(
        room["frontier"], room["tail"],
        "a seq was taken and not admitted: {room}"
    );
    assert_eq!(room["queue_length"], 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_cookieless_requests_take_no_place_in_memory() {
    racing_cookieless_requests_take_no_place(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_cookieless_requests_take_no_place_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    racing_cookieless_requests_take_no_place(Some(&redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_is_limited_per_network_like_joins() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 1000.0, 1000.0, &["/echo/shop"]);
    room.join_limit_per_prefix_per_min = 10;
    let gw = gateway(&origin, &keys, None, vec![room], |_| {}).await;
    let mut admitted = 0;
    for i in 0..30 {
        let text = get_raw(
            &gw,
            &format!("/echo/shop/{i}"),
            &["Host: x", "Accept: application/json"],
        )
        .await;
        if statuses(&text) == [200] {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10, "passthrough is not limited per network");
    gw.shutdown().await;
}

// === 4. one place is one admission and one session ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_place_is_one_session_however_often_it_is_polled() {
    one_place_is_one_session(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_place_is_one_session_however_often_it_is_polled_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    one_place_is_one_session(Some(&redis.url())).await;
}

async fn one_place_is_one_session(redis: Option<&str>) {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 0.01, 1.0, &["/echo/shop"]);
    room.max_active = Some(2);
    let gw = gateway(&origin, &keys, redis, vec![room], |c| {
        c.limits.status_polls_per_token_per_min = 0;
    })
    .await;
    let base = gw.url();
    // The first visitor passes through (the one credit); the next two wait.
    let mut first = Visitor::new(&base, "default");
    first.join("/").await;
    assert!(first.admission_token.is_some());
    let mut a = Visitor::new(&base, "default");
    let mut b = Visitor::new(&base, "default");
    assert_eq!(a.join("/").await.status, 201);
    assert_eq!(b.join("/").await.status, 201);
    assert_eq!(
        admin_patch(&base, "default", json!({"rate_per_sec": 50}))
            .await
            .status,
        200
    );
    assert!(a.wait_admitted(Duration::from_secs(10), 50).await);
    // a's place polled from many tabs, sequentially and at once: every
    // admission names one session, and the cap of 2 keeps b waiting.
    let sid = claims(a.admission_token.as_ref().unwrap())["sid"].clone();
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let token = a.queue_token.clone().unwrap();
        let url = format!("{base}/_sluice/rooms/default/status");
        tasks.push(tokio::spawn(async move {
            TestClient::new()
                .get(&url, &[("authorization", &format!("Bearer {token}"))])
                .await
        }));
    }
    for t in tasks {
        let res = t.await.unwrap();
        assert_eq!(res.status, 200, "{}", res.text());
        let v = res.json();
        assert_eq!(v["state"], "admitted");
        assert_eq!(claims(v["admission_token"].as_str().unwrap())["sid"], sid);
    }
    let room = admin_room(&base, "default").await;
    assert!(room["active_sessions"].as_u64().unwrap() <= 2, "{room}");
    for _ in 0..10 {
        let v = b.status().await.json();
        assert_eq!(v["state"], "waiting", "the cap let a third visitor in: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let room = admin_room(&base, "default").await;
    assert_eq!(room["active_sessions"], 2, "{room}");
    gw.shutdown().await;
}

/// Admissions on the spot racing at an idle room with credit to spare
/// (cookie-less passthroughs and joins admitted at once) never push the active sessions past `max_active`.
async fn racing_admissions_at_once_never_pass_max_active(redis: Option<&str>) {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 0.01, 20.0, &["/echo/shop"]);
    room.max_active = Some(3);
    room.join_limit_per_prefix_per_min = 0; // one network races here
    let gw = gateway(&origin, &keys, redis, vec![room], |_| {}).await;
    let base = gw.url();
    until_room(&base, "default", "full bucket", |v| v["tail"] == 0).await;
    // solutions first, so the joins race the passthroughs
    let mut joiners = Vec::new();
    for _ in 0..12 {
        let v = Visitor::new(&base, "default");
        let (c, s) = v.solved().await;
        joiners.push((v, c, s));
    }
    let mut tasks = Vec::new();
    for i in 0..60 {
        let addr = gw.addr;
        tasks.push(tokio::spawn(async move {
            let req = format!(
                "GET /echo/shop/{i} HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
            );
            let text = raw(addr, req.as_bytes(), Duration::from_secs(5)).await;
            statuses(&text) == [200]
        }));
    }
    let mut joins = Vec::new();
    for (mut v, c, s) in joiners {
        joins.push(tokio::spawn(async move {
            let res = v.join_with(&c, &s, "/").await;
            assert!(res.status.is_success(), "{}", res.text());
            res.status == 200
        }));
    }
    let mut admitted = 0;
    for t in tasks.into_iter().chain(joins) {
        admitted += usize::from(t.await.unwrap());
    }
    assert!(
        admitted <= 3,
        "{admitted} admitted at once under a cap of 3"
    );
    assert!(admitted >= 1, "nobody admitted at an idle room");
    for _ in 0..5 {
        let room = admin_room(&base, "default").await;
        assert!(
            room["active_sessions"].as_u64().unwrap() <= 3,
            "past the cap: {room}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_admissions_at_once_never_pass_max_active_in_memory() {
    racing_admissions_at_once_never_pass_max_active(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_admissions_at_once_never_pass_max_active_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    racing_admissions_at_once_never_pass_max_active(Some(&redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_polls_are_limited_per_token() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 0.01, 1.0, &["/echo/shop"]);
    let gw = gateway(&origin, &keys, None, vec![room], |c| {
        c.limits.status_polls_per_token_per_min = 60;
    })
    .await;
    let base = gw.url();
    Visitor::new(&base, "default").join("/").await; // the one credit
    let mut a = Visitor::new(&base, "default");
    let mut b = Visitor::new(&base, "default");
    a.join("/").await;
    b.join("/").await;
    let mut limited = 0;
    for _ in 0..40 {
        let res = a.status().await;
        if res.status == 429 {
            assert_eq!(res.json()["code"], "rate_limited");
            assert!(res.header("retry-after").is_some());
            limited += 1;
        }
    }
    assert!(limited >= 20, "only {limited} of 40 polls limited");
    // another token is not affected
    assert_eq!(b.status().await.status, 200);
    gw.shutdown().await;
}

// === 5. a revoke sticks ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_sticks_on_every_gateway() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 0.01, 1.0, &["/echo/shop", "/command"]);
    // renewed at every request: a revoked session must not be
    room.session_ttl = Duration::from_secs(2);
    let mut gws = Vec::new();
    for _ in 0..2 {
        gws.push(
            gateway(
                &origin,
                &keys,
                Some(&redis.url()),
                vec![room.clone()],
                |c| {
                    c.events = demo_event(50, 10);
                },
            )
            .await,
        );
    }
    let (g0, g1) = (gws[0].url(), gws[1].url());
    Visitor::new(&g0, "default").join("/").await; // the one credit
    let mut v = Visitor::new(&g0, "default");
    let res = v.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(
        admin_patch(&g0, "default", json!({"rate_per_sec": 100}))
            .await
            .status,
        200
    );
    assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
    let queue = v.queue_token.clone();
    for base in [&g0, &g1] {
        let mut on = Visitor::new(base, "default");
        on.admission_token = v.admission_token.clone();
        assert_eq!(on.get_admitted("/echo/shop/1").await.status, 200);
    }
    let held = hold(&v, 1).await;
    assert_eq!(held.status, 201, "{}", held.text());
    let hold_id = held.json()["hold_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // past half its life: renewed while the session lives
    let res = v.get_admitted("/echo/shop/renew").await;
    assert!(
        res.header("set-cookie")
            .is_some_and(|c| c.starts_with("sluice_a_default="))
    );
    // the origin revokes it through gateway 0
    let res = v.get_admitted("/command/revoke").await;
    assert_eq!(res.status, 200);
    let cleared: Vec<&str> = res
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap())
        .collect();
    assert!(
        cleared.iter().any(|c| c.starts_with("sluice_a_default=;")),
        "{cleared:?}"
    );
    assert!(
        cleared.iter().any(|c| c.starts_with("sluice_q_default=;")),
        "{cleared:?}"
    );
    // within a tick, neither gateway lets the old token by, nor renews it
    tokio::time::sleep(Duration::from_millis(400)).await;
    for base in [&g0, &g1] {
        let mut on = Visitor::new(base, "default");
        on.admission_token = v.admission_token.clone();
        for i in 0..5 {
            let res = on.get_admitted(&format!("/echo/shop/after/{i}")).await;
            assert_eq!(res.status, 503, "{base}: {}", res.text());
            assert!(
                !res.headers
                    .get_all("set-cookie")
                    .iter()
                    .any(|c| c.to_str().unwrap().starts_with("sluice_a_default=e")),
                "a revoked session was renewed"
            );
        }
        // nor sells it anything more, in any shape of request
        for (method, path, body) in [
            (
                http::Method::POST,
                "/_sluice/events/demo/holds",
                Some(json!({"qty": 1})),
            ),
            (
                http::Method::POST,
                "/_sluice/events/demo/holds",
                Some(json!({"qty": 0})),
            ),
            (
                http::Method::POST,
                "/_sluice/events/demo/holds",
                Some(json!({"items": []})),
            ),
            (http::Method::GET, "/_sluice/events/demo", None),
        ] {
            for via_cookie in [false, true] {
                let res = if via_cookie {
                    let token = on.admission_token.clone().unwrap();
                    let cookie = format!("sluice_a_default={token}");
                    TestClient::new()
                        .call(
                            method.clone(),
                            &format!("{base}{path}"),
                            &[("cookie", &cookie), ("content-type", "application/json")],
                            sluice_tests::client::body(
                                body.as_ref().map_or(String::new(), |b| b.to_string()),
                            ),
                        )
                        .await
                } else {
                    on.call_admitted(method.clone(), path, body.clone(), &[])
                        .await
                };
                assert_eq!(
                    res.status,
                    401,
                    "{method} {path} after a revoke: {}",
                    res.text()
                );
                assert_eq!(res.json()["code"], "not_admitted");
            }
        }
        // what it already holds is still its own to read and to let go
        let res = on
            .call_admitted(
                http::Method::GET,
                &format!("/_sluice/holds/{hold_id}"),
                None,
                &[],
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        // the place is spent: its queue token admits nobody again
        let mut poll = Visitor::new(base, "default");
        poll.queue_token = queue.clone();
        let res = poll.status().await;
        assert_eq!(res.status, 401, "{}", res.text());
        assert_eq!(res.json()["reason"], "spent");
    }
    let res = v
        .call_admitted(
            http::Method::DELETE,
            &format!("/_sluice/holds/{hold_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let stock = TestClient::new()
        .get(
            &format!("{g1}/_sluice/admin/events/demo"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await
        .json();
    assert_eq!(stock["available"], 50, "{stock}");
    for gw in gws {
        gw.shutdown().await;
    }
}

/// More revokes than a gateway may remember (`limits.ended_sessions_per_room`)
/// still stick: past the bound the gateway asks the store about each
/// admitted request, so no revoke is forgotten while a token of it is
/// valid, and live sessions keep passing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_sticks_past_the_bound_of_the_ended_set() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 100.0, 20.0, &["/echo/shop", "/command"]);
    room.session_ttl = Duration::from_secs(60);
    let mut gws = Vec::new();
    for _ in 0..2 {
        gws.push(
            gateway(
                &origin,
                &keys,
                Some(&redis.url()),
                vec![room.clone()],
                |c| {
                    c.limits.ended_sessions_per_room = 2;
                    c.events = demo_event(50, 10);
                },
            )
            .await,
        );
    }
    let (g0, g1) = (gws[0].url(), gws[1].url());
    let mut visitors = Vec::new();
    for _ in 0..9 {
        let mut v = Visitor::new(&g0, "default");
        v.join("/").await;
        assert!(v.wait_admitted(Duration::from_secs(10), 50).await);
        visitors.push(v);
    }
    // six revoked through gateway 0: three times what either remembers
    let (revoked, live) = visitors.split_at_mut(6);
    for v in revoked.iter_mut() {
        assert_eq!(v.get_admitted("/command/revoke").await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    for (i, base) in [&g0, &g1].into_iter().enumerate() {
        let text = TestClient::new()
            .get(
                &format!("{base}/metrics"),
                &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            )
            .await
            .text();
        assert!(
            text.contains("sluice_ended_overflow{room=\"default\"} 1"),
            "gateway {i}: {}",
            text.lines()
                .filter(|l| l.contains("ended"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        for v in revoked.iter() {
            let mut on = Visitor::new(base, "default");
            on.admission_token = v.admission_token.clone();
            let res = on.get_admitted("/echo/shop/after").await;
            assert_eq!(res.status, 503, "gateway {i} let a revoked session by");
            assert_eq!(
                hold(&on, 1).await.status,
                401,
                "gateway {i}: a revoked session held"
            );
        }
        for v in live.iter() {
            let mut on = Visitor::new(base, "default");
            on.admission_token = v.admission_token.clone();
            let res = on.get_admitted("/echo/shop/live").await;
            assert_eq!(
                res.status,
                200,
                "gateway {i} refused a live session: {}",
                res.text()
            );
            assert_eq!(hold(&on, 1).await.status, 201, "gateway {i}");
        }
    }
    for gw in gws {
        gw.shutdown().await;
    }
}

// === 6. live settings are the store's, everywhere, never lost ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_settings_reach_every_gateway_and_concurrent_patches_never_revert() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 5.0, 2.0, &["/echo/shop"]);
    let a = on_redis(&origin, &keys, &redis, &room).await;
    let b = on_redis(&origin, &keys, &redis, &room).await;
    let (ua, ub) = (a.url(), b.url());
    // difficulty and the per-network limit, set through one gateway, are
    // in force on the other within a tick
    let res = admin_patch(
        &ua,
        "default",
        json!({"difficulty_floor_bits": 5, "difficulty_ceiling_bits": 7}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    until_room(&ub, "default", "floor on b", |v| {
        v["difficulty_floor_bits"] == 5
    })
    .await;
    let c = Visitor::new(&ub, "default").challenge().await.json();
    assert_eq!(c["difficulty_bits"], 5, "{c}");
    assert_eq!(
        admin_patch(&ub, "default", json!({"join_limit_per_prefix_per_min": 3}))
            .await
            .status,
        200
    );
    until_room(&ua, "default", "limit on a", |v| {
        v["join_limit_per_prefix_per_min"] == 3
    })
    .await;
    let codes: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(
                Visitor::new(&ua, "default")
                    .challenge()
                    .await
                    .status
                    .as_u16(),
            );
        }
        v
    };
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 2, "{codes:?}");
    admin_patch(&ua, "default", json!({"join_limit_per_prefix_per_min": 0})).await;

    // PATCHes of different fields through both gateways at once, racing
    // the sold-out sync and each other: none reverts another
    for round in 0..8u64 {
        let (ua, ub) = (ua.clone(), ub.clone());
        let pa =
            tokio::spawn(
                async move { admin_patch(&ua, "default", json!({"burst": 10 + round})).await },
            );
        let pb = tokio::spawn(async move {
            admin_patch(&ub, "default", json!({"max_active": 100 + round})).await
        });
        assert_eq!(pa.await.unwrap().status, 200);
        assert_eq!(pb.await.unwrap().status, 200);
        for base in [&a.url(), &b.url()] {
            until_room(base, "default", "both fields", |v| {
                v["burst"].as_f64() == Some((10 + round) as f64)
                    && v["max_active"] == json!(100 + round)
            })
            .await;
        }
    }
    // a gateway started later (or restarted) takes the store's settings,
    // not its configuration's
    let c = on_redis(&origin, &keys, &redis, &room).await;
    let v = until_room(&c.url(), "default", "settings on a new gateway", |v| {
        v["difficulty_floor_bits"] == 5
    })
    .await;
    assert_eq!(v["max_active"], 107);
    for gw in [a, b, c] {
        gw.shutdown().await;
    }
}

/// PATCHes through two gateways racing the sold-out flag (written by the
/// gateways' sold-out sync whenever the stock runs out or comes back):
/// no PATCH reverts the flag, and the flag reverts no PATCH.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn patches_racing_the_sold_out_flag_never_revert_each_other() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 5.0, 2.0, &["/echo/shop"]);
    let mut gws = Vec::new();
    for _ in 0..2 {
        gws.push(
            gateway(
                &origin,
                &keys,
                Some(&redis.url()),
                vec![room.clone()],
                |c| {
                    c.events = demo_event(2, 2);
                },
            )
            .await,
        );
    }
    let (ua, ub) = (gws[0].url(), gws[1].url());
    let mut buyer = Visitor::new(&ua, "default");
    buyer.join("/").await;
    assert!(buyer.wait_admitted(Duration::from_secs(10), 100).await);
    for round in 0..6u64 {
        // the stock runs out (odd rounds) or comes back (even rounds) while
        // both gateways take PATCHes of other fields
        let sold_out = round % 2 == 0;
        let change = if sold_out {
            let res = hold(&buyer, 2).await;
            assert_eq!(res.status, 201, "{}", res.text());
            res.json()["hold_id"].as_str().unwrap().to_owned()
        } else {
            String::new()
        };
        let mut patches = Vec::new();
        for i in 0..6u64 {
            let base = if i % 2 == 0 { ua.clone() } else { ub.clone() };
            let body = if i % 2 == 0 {
                json!({"burst": 10 + round * 10 + i})
            } else {
                json!({"max_active": 100 + round * 10 + i})
            };
            patches.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(40 * i)).await;
                admin_patch(&base, "default", body).await.status
            }));
        }
        for p in patches {
            assert_eq!(p.await.unwrap(), 200);
        }
        let (burst, max_active) = ((10 + round * 10 + 4) as f64, 100 + round * 10 + 5);
        for base in [&ua, &ub] {
            until_room(base, "default", "the flag and the last PATCHes", |v| {
                v["sold_out"] == json!(sold_out)
                    && v["burst"].as_f64() == Some(burst)
                    && v["max_active"] == json!(max_active)
            })
            .await;
        }
        // and it stays so over several ticks: nothing reverts late
        tokio::time::sleep(Duration::from_millis(500)).await;
        for base in [&ua, &ub] {
            let v = admin_room(base, "default").await;
            assert_eq!(v["sold_out"], json!(sold_out), "round {round}: {v}");
            assert_eq!(v["burst"].as_f64(), Some(burst), "round {round}: {v}");
            assert_eq!(v["max_active"], json!(max_active), "round {round}: {v}");
        }
        if sold_out {
            let res = buyer
                .call_admitted(
                    http::Method::DELETE,
                    &format!("/_sluice/holds/{change}"),
                    None,
                    &[],
                )
                .await;
            assert_eq!(res.status, 200, "{}", res.text());
        }
    }
    for gw in gws {
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_setting_in_the_store_is_refused_and_the_last_good_one_kept() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 5.0, 2.0, &["/echo/shop"]);
    let gw = gateway(&origin, &keys, Some(&redis.url()), vec![room], |_| {}).await;
    let base = gw.url();
    assert_eq!(
        admin_patch(&base, "default", json!({"rate_per_sec": 7}))
            .await
            .status,
        200
    );
    let oversized = format!(
        "{{\"rate_per_sec\":1,\"adaptive\":{{\"reason\":\"{}\"}}}}",
        "x".repeat(20_000)
    );
    for (i, bad) in [
        "not json at all".to_owned(),
        "{\"rate_per_sec\": -5}".to_owned(),
        "{\"rate_per_sec\": 1, \"unknown_field\": true}".to_owned(),
        "{\"difficulty_floor_bits\": 40}".to_owned(),
        oversized,
    ]
    .into_iter()
    .enumerate()
    {
        // written behind the gateways' back, as a bad push would be
        let key = "sluice:{default}:state";
        let client = redis::Client::open(redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("settings")
            .arg(&bad)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: i64 = redis::cmd("HINCRBY")
            .arg(key)
            .arg("settings_v")
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let want = (i + 1) as f64;
        let deadline = Instant::now() + Duration::from_secs(5);
        while metric(&base, "sluice_settings_rejected_total{room=\"default\"}").await < want {
            assert!(Instant::now() < deadline, "bad settings {i} not noticed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // still serving, with the last good settings
        let v = admin_room(&base, "default").await;
        assert_eq!(v["rate_per_sec"], 7.0, "{v}");
        assert_eq!(Visitor::new(&base, "default").challenge().await.status, 200);
    }
    // the operator repairs it: a PATCH applies to the last good settings
    // and writes them over the bad ones
    let res = admin_patch(&base, "default", json!({"burst": 3})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let refused = metric(&base, "sluice_settings_rejected_total{room=\"default\"}").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        metric(&base, "sluice_settings_rejected_total{room=\"default\"}").await,
        refused,
        "still refusing after the repair"
    );
    let v = admin_room(&base, "default").await;
    assert_eq!(
        (v["rate_per_sec"].as_f64(), v["burst"].as_f64()),
        (Some(7.0), Some(3.0)),
        "{v}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_that_fails_changes_nothing_anywhere() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let redis = Arc::new(redis);
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 5.0, 2.0, &["/echo/shop"]);
    let gw = gateway(&origin, &keys, Some(&redis.url()), vec![room], |_| {}).await;
    let base = gw.url();
    let before = admin_room(&base, "default").await;
    let r = redis.clone();
    let stall = tokio::task::spawn_blocking(move || r.command("CLIENT PAUSE 6000"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    for patch in [
        json!({"difficulty_floor_bits": 3, "difficulty_ceiling_bits": 5}),
        json!({"join_limit_per_prefix_per_min": 1}),
        json!({"rate_per_sec": 99}),
    ] {
        let res = admin_patch(&base, "default", patch.clone()).await;
        assert_eq!(res.status, 503, "{patch}: {}", res.text());
    }
    // bad values are refused before anything is written
    for patch in [
        json!({"difficulty_ceiling_bits": 30}),
        json!({"difficulty_floor_bits": 9, "difficulty_ceiling_bits": 8}),
        json!({"burst": 0}),
        json!({"rate_per_sec": 1, "bogus": 1}),
    ] {
        let res = admin_patch(&base, "default", patch.clone()).await;
        assert_eq!(res.status, 422, "{patch}: {}", res.text());
    }
    stall.await.unwrap();
    let after = until_room(&base, "default", "store back", |v| v["store_ok"] == true).await;
    for field in [
        "difficulty_floor_bits",
        "difficulty_ceiling_bits",
        "join_limit_per_prefix_per_min",
        "rate_per_sec",
        "burst",
    ] {
        assert_eq!(
            after[field], before[field],
            "{field} changed by a failed PATCH"
        );
    }
    gw.shutdown().await;
}

// === 7. difficulty means what it says ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_the_difficulty_bounds_of_a_room_at_rest_never_marks_it_under_attack() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 5.0, 2.0, &["/echo/shop"]);
    room.difficulty_floor_bits = 6;
    room.difficulty_ceiling_bits = 10;
    room.attack_min_solve = Duration::from_secs(3);
    let gw = gateway(&origin, &keys, None, vec![room], |_| {}).await;
    let base = gw.url();
    for (floor, ceiling) in [(2, 4), (4, 4), (1, 2), (3, 9), (0, 0), (5, 6)] {
        let res = admin_patch(
            &base,
            "default",
            json!({"difficulty_floor_bits": floor, "difficulty_ceiling_bits": ceiling}),
        )
        .await;
        assert_eq!(res.status, 200, "{}", res.text());
        let v = res.json();
        assert_eq!(v["under_attack"], false, "{floor}..{ceiling}: {v}");
        assert_eq!(v["difficulty_bits"], floor);
        let c = Visitor::new(&base, "default").challenge().await.json();
        assert_eq!(c["min_solve_ms"], 0, "{floor}..{ceiling}: {c}");
        assert_eq!(c["difficulty_bits"], floor);
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_solution_sent_too_early_is_told_when_and_keeps_its_place() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let mut room = easy_room("default", 0.01, 1.0, &["/echo/shop"]);
    room.difficulty_floor_bits = 1;
    room.difficulty_ceiling_bits = 1;
    room.attack_min_solve = Duration::from_millis(1500);
    let gw = gateway(&origin, &keys, None, vec![room], |_| {}).await;
    let base = gw.url();
    Visitor::new(&base, "default").join("/").await; // the one credit
    // a flooding network: past the ceiling, challenges carry a minimum age
    let v = Visitor::new(&base, "default");
    let mut c = Value::Null;
    for _ in 0..200 {
        c = v.challenge().await.json();
        if c["min_solve_ms"].as_u64().unwrap_or(0) > 0 {
            break;
        }
    }
    let min = c["min_solve_ms"].as_u64().unwrap();
    assert!(min > 0, "never under attack: {c}");
    let challenge = c["challenge"].as_str().unwrap().to_owned();
    let k = c["puzzles"].as_u64().unwrap() as u8;
    let bits = c["difficulty_bits"].as_u64().unwrap() as u8;
    let solutions = sluice_pow::solve(&challenge, k, bits, 1);
    let mut j = Visitor::new(&base, "default");
    let res = j.join_with(&challenge, &solutions, "/").await;
    assert_eq!(res.status, 429, "{}", res.text());
    let p = res.json();
    assert_eq!(p["code"], "pow_too_early");
    let wait_ms = p["retry_after_ms"].as_u64().unwrap();
    assert!(wait_ms > 0 && wait_ms <= min, "{p}");
    let retry_after: u64 = res.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, wait_ms.div_ceil(1000));
    // a wrong solution sent early is wrong, not early
    let mut bad = solutions.clone();
    bad[0] = failing_counter(&challenge, 0, bits).to_string();
    let res = Visitor::new(&base, "default")
        .join_with(&challenge, &bad, "/")
        .await;
    assert_eq!(res.status, 403, "{}", res.text());
    assert_eq!(res.json()["code"], "pow_invalid", "{}", res.text());
    // once due, the same solution buys its place, once
    tokio::time::sleep(Duration::from_millis(wait_ms + 100)).await;
    let res = j.join_with(&challenge, &solutions, "/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    let seq = res.json()["seq"].as_u64().unwrap();
    let again = Visitor::new(&base, "default")
        .join_with(&challenge, &solutions, "/")
        .await;
    assert_eq!(
        again.json()["seq"],
        seq,
        "the same solution bought a second place"
    );
    gw.shutdown().await;
}

/// A counter that does not solve puzzle `i` of `challenge` at `bits`
/// (API.md: SHA-256 of `challenge:i:n` must begin with `bits` zero bits).
fn failing_counter(challenge: &str, i: u8, bits: u8) -> u64 {
    use sha2::{Digest, Sha256};
    (0u64..)
        .find(|n| {
            let h = Sha256::digest(format!("{challenge}:{i}:{n}").as_bytes());
            let lead = h
                .iter()
                .position(|b| *b != 0)
                .map_or(256, |p| p as u32 * 8 + h[p].leading_zeros());
            lead < u32::from(bits)
        })
        .unwrap_or(0)
}

// === 8. the control plane cannot be held hostage ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_hold_no_permit_and_never_lock_out_the_operator() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 5.0, 2.0, &["/echo/shop"]);
    let gw = gateway(&origin, &keys, None, vec![room], |c| {
        c.limits.max_store_requests = 4;
        c.timeouts.body_read = Duration::from_millis(1500);
    })
    .await;
    let base = gw.url();
    // 12 requests that promise a body and send none (or a trickle), on the
    // endpoints that take bodies
    let mut stalled = Vec::new();
    for i in 0..12 {
        let target = match i % 3 {
            0 => "/_sluice/rooms/default/join",
            1 => "/_sluice/events/demo/holds",
            _ => "/_sluice/admin/rooms/default",
        };
        let method = if i % 3 == 2 { "PATCH" } else { "POST" };
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(
            format!("{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{")
                .as_bytes(),
        )
        .await
        .unwrap();
        if i % 2 == 1 {
            // a trickle: a byte every 100 ms, so no idle timer ever fires;
            // only a deadline on the whole body ends it
            let (mut rd, mut wr) = s.into_split();
            tokio::spawn(async move {
                for _ in 0..60 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if wr.write_all(b" ").await.is_err() {
                        break;
                    }
                }
            });
            stalled.push(Box::pin(async move {
                let mut buf = vec![0u8; 4096];
                let n = rd.read(&mut buf).await.unwrap_or(0);
                String::from_utf8_lossy(&buf[..n]).into_owned()
            })
                as std::pin::Pin<
                    Box<dyn std::future::Future<Output = String> + Send>,
                >);
        } else {
            stalled.push(Box::pin(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                String::from_utf8_lossy(&buf[..n]).into_owned()
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    // meanwhile the operator and new visitors are served at once
    for _ in 0..5 {
        let v = admin_room(&base, "default").await;
        assert_eq!(v["room"], "default");
        let c = Visitor::new(&base, "default").challenge().await;
        assert_eq!(c.status, 200, "{}", c.text());
    }
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "served late: {:?}",
        started.elapsed()
    );
    // and the stalled and trickling ones are answered 408 once the body
    // deadline passes (1.5 s after they began, whatever they still send)
    for answer in stalled {
        let text = tokio::time::timeout(Duration::from_secs(4), answer)
            .await
            .expect("a stalled or trickling body was never answered");
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("request_timeout"), "{text}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_to_the_origin_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(
        &origin,
        &keys,
        None,
        vec![easy_room("default", 5.0, 2.0, &["/queue"])],
        |c| c.timeouts.body_read = Duration::from_millis(800),
    )
    .await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /echo/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nsome")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("a stalled upload held the origin's slot")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || text.starts_with("HTTP/1.1 4"), "{text}");
    gw.shutdown().await;
}

// === 9. a place is never given twice, across store loss ===

/// Every visitor's place: (epoch, seq) of its queue token after a poll.
async fn places(visitors: &mut [Visitor]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for v in visitors.iter_mut() {
        let res = v.status().await;
        assert_eq!(res.status, 200, "{}", res.text());
        let c = claims(v.queue_token.as_ref().unwrap());
        out.push((c["epoch"].as_u64().unwrap(), c["seq"].as_u64().unwrap()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flushed_store_and_restarted_gateways_never_give_a_place_twice() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 0.01, 1.0, &["/echo/shop"]);
    let mut gws = vec![
        on_redis(&origin, &keys, &redis, &room).await,
        on_redis(&origin, &keys, &redis, &room).await,
    ];
    Visitor::new(&gws[0].url(), "default").join("/").await; // the one credit
    let mut old = Vec::new();
    for i in 0..16 {
        let mut v = Visitor::new(&gws[i % 2].url(), "default");
        assert_eq!(v.join("/").await.status, 201);
        old.push(v);
    }
    let old_places = places(&mut old).await;

    // Redis loses everything and every gateway restarts: nobody remembers.
    for gw in gws.drain(..) {
        gw.shutdown().await;
    }
    redis.command("FLUSHALL");
    let gws = vec![
        on_redis(&origin, &keys, &redis, &room).await,
        on_redis(&origin, &keys, &redis, &room).await,
    ];
    let bases = [gws[0].url(), gws[1].url()];
    // old tokens come back through the other gateway than they joined by
    for (i, v) in old.iter_mut().enumerate() {
        v.base = bases[(i + 1) % 2].clone();
    }
    // new visitors join through both, between old tokens polling in
    let mut new = Vec::new();
    let mut reseated = vec![None; old.len()];
    for i in 0..16 {
        let mut v = Visitor::new(&bases[i % 2], "default");
        let res = v.join("/").await;
        assert!(res.status.is_success(), "{}", res.text());
        if v.queue_token.is_some() {
            new.push(v);
        }
        let p = places(std::slice::from_mut(&mut old[i])).await;
        reseated[i] = Some(p[0]);
    }
    let reseated: Vec<(u64, u64)> = reseated.into_iter().map(Option::unwrap).collect();
    // each old token is given one place of the new epoch (the same for
    // every poll, through either gateway), never one a new visitor holds
    let mut all = places(&mut new).await;
    assert_eq!(places(&mut old).await, reseated, "a reseated token moved");
    for v in old.iter_mut() {
        v.base = bases[0].clone();
    }
    assert_eq!(
        places(&mut old).await,
        reseated,
        "two gateways reseated one token apart"
    );
    for (before, after) in old_places.iter().zip(&reseated) {
        assert_ne!(
            before.0, after.0,
            "an old token kept a place of a lost epoch"
        );
    }
    all.extend(&reseated);
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a place was given twice: {all:?}");
    let epochs: HashSet<u64> = all.iter().map(|p| p.0).collect();
    assert_eq!(
        epochs.len(),
        1,
        "everyone holds a place of the current epoch"
    );

    // and everyone is admitted exactly once, each with a session of its own
    assert_eq!(
        admin_patch(
            &bases[1],
            "default",
            json!({"rate_per_sec": 100, "burst": 50})
        )
        .await
        .status,
        200
    );
    let mut sessions = HashSet::new();
    for (i, v) in new.iter_mut().chain(old.iter_mut()).enumerate() {
        v.base = bases[i % 2].clone();
        assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
        let sid = claims(v.admission_token.as_ref().unwrap())["sid"].clone();
        assert!(
            sessions.insert(sid.to_string()),
            "two visitors share session {sid}"
        );
    }
    for gw in gws {
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flushed_store_behind_running_gateways_keeps_every_place() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 0.01, 1.0, &["/echo/shop"]);
    let a = on_redis(&origin, &keys, &redis, &room).await;
    let b = on_redis(&origin, &keys, &redis, &room).await;
    Visitor::new(&a.url(), "default").join("/").await;
    let mut old = Vec::new();
    for i in 0..20 {
        let base = if i % 2 == 0 { a.url() } else { b.url() };
        let mut v = Visitor::new(&base, "default");
        assert_eq!(v.join("/").await.status, 201);
        old.push(v);
    }
    // both gateways' snapshots have seen every join
    for base in [a.url(), b.url()] {
        until_room(&base, "default", "tail seen", |v| v["tail"] == 21).await;
    }
    let before = places(&mut old).await;
    redis.command("FLUSHALL");
    // the gateways recover the room above everything they saw
    for base in [a.url(), b.url()] {
        until_room(&base, "default", "recovered", |v| {
            v["tail"].as_u64() >= Some(21) && v["store_ok"] == true
        })
        .await;
    }
    let mut new = Vec::new();
    let mut told_to_retry = 0;
    for _ in 0..10 {
        let mut v = Visitor::new(&b.url(), "default");
        let (challenge, solutions) = v.solved().await;
        // Right after the flush a join may be told to try again (503
        // `store_unavailable`, once in four full-suite runs here); the
        // page sends the same join again, and so does this visitor: the
        // same solution, so a place it took is given back, never a second.
        let mut res = v.join_with(&challenge, &solutions, "/").await;
        for _ in 0..20 {
            if res.status != 503 {
                break;
            }
            told_to_retry += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
            res = v.join_with(&challenge, &solutions, "/").await;
        }
        assert_eq!(res.status, 201, "{}", res.text());
        new.push(v);
    }
    if told_to_retry > 0 {
        eprintln!("{told_to_retry} joins were told to retry after the flush");
    }
    let after = places(&mut old).await;
    let fresh = places(&mut new).await;
    // old tokens keep their seqs (covered by the recovery), new seqs lie
    // above every old one
    let old_seqs: Vec<u64> = before.iter().map(|p| p.1).collect();
    assert_eq!(after.iter().map(|p| p.1).collect::<Vec<_>>(), old_seqs);
    let top = *old_seqs.iter().max().unwrap();
    assert!(fresh.iter().all(|p| p.1 > top), "{fresh:?} vs {top}");
    for gw in [a, b] {
        gw.shutdown().await;
    }
}

// === 10. the smaller ones ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_queue_token_keeps_its_place_at_join() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(
        &origin,
        &keys,
        None,
        vec![easy_room("default", 0.01, 1.0, &["/echo/shop"])],
        |_| {},
    )
    .await;
    let base = gw.url();
    Visitor::new(&base, "default").join("/").await;
    let mut v = Visitor::new(&base, "default");
    assert_eq!(v.join("/").await.status, 201);
    let seq = v.seq.unwrap();
    let token = v.queue_token.clone().unwrap();
    // a new solution, with the place's token as bearer: the same place
    let (challenge, solutions) = v.solved().await;
    let res = TestClient::new()
        .call(
            http::Method::POST,
            &format!("{base}/_sluice/rooms/default/join"),
            &[
                ("authorization", &format!("Bearer {token}")),
                ("content-type", "application/json"),
            ],
            sluice_tests::client::body(
                json!({"challenge": challenge, "solutions": solutions}).to_string(),
            ),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["seq"], seq);
    assert_eq!(admin_room(&base, "default").await["tail"], 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_fails_does_not_spend_the_solution() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let redis = Arc::new(redis);
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(
        &origin,
        &keys,
        Some(&redis.url()),
        vec![easy_room("default", 0.01, 1.0, &["/echo/shop"])],
        |_| {},
    )
    .await;
    let base = gw.url();
    Visitor::new(&base, "default").join("/").await;
    let mut v = Visitor::new(&base, "default");
    let (challenge, solutions) = v.solved().await;
    // the join script fails after the replay guard took the solution (a
    // key of the room of the wrong type: every admission script errors)...
    redis.command("SET sluice:{default}:batches broken");
    let res = v.join_with(&challenge, &solutions, "/").await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["code"], "store_unavailable");
    redis.command("DEL sluice:{default}:batches");
    // ...so the same solution is still good
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let res = v.join_with(&challenge, &solutions, "/").await;
        if res.status == 201 {
            break;
        }
        assert_ne!(
            res.json()["code"],
            "pow_replayed",
            "the failed join spent the solution"
        );
        assert!(Instant::now() < deadline, "{}", res.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.shutdown().await;
}

/// A join refused because the room closed (seen by the gateway's snapshot,
/// or only by the store when the close came through another gateway a
/// moment before) buys nothing and spends nothing: once the room reopens,
/// the same solution buys its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_refused_by_a_closed_room_does_not_spend_the_solution() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let room = easy_room("default", 0.01, 1.0, &["/echo/shop"]);
    let a = on_redis(&origin, &keys, &redis, &room).await;
    let b = on_redis(&origin, &keys, &redis, &room).await;
    Visitor::new(&a.url(), "default").join("/").await; // the one credit
    for round in 0..6 {
        let mut v = Visitor::new(&a.url(), "default");
        let (challenge, solutions) = v.solved().await;
        // closed through b; the join goes to a at once (its snapshot may
        // still say open: then the store refuses it) or after a tick
        let res = admin_patch(&b.url(), "default", json!({"closed": true})).await;
        assert_eq!(res.status, 200, "{}", res.text());
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let res = v.join_with(&challenge, &solutions, "/").await;
        assert_eq!(res.status, 423, "round {round}: {}", res.text());
        assert_eq!(res.json()["code"], "room_closed");
        let res = admin_patch(&b.url(), "default", json!({"closed": false})).await;
        assert_eq!(res.status, 200, "{}", res.text());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let res = v.join_with(&challenge, &solutions, "/").await;
            if res.status == 201 {
                break;
            }
            assert_ne!(
                res.json()["code"],
                "pow_replayed",
                "round {round}: the refused join spent the solution"
            );
            assert!(Instant::now() < deadline, "round {round}: {}", res.text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let tail = admin_room(&a.url(), "default").await["tail"].clone();
    assert_eq!(tail, 7, "one place per solution, none for a refused join");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_sets_a_gateway_cookie_is_never_shared_cacheable() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    // passthroughs to public, cacheable assets of the origin: each answer
    // carries the visitor's admission cookie
    let mut room = easy_room("default", 1000.0, 1000.0, &["/cache"]);
    room.join_limit_per_prefix_per_min = 0;
    let gw = gateway(&origin, &keys, None, vec![room], |_| {}).await;
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    let shared = [
        "public",
        "PUBLIC",
        "Public",
        "s-maxage=600",
        "S-MaxAge=600",
        "s-maxage=\"600\"",
        "max-age=31536000",
        "immutable",
        "no-transform",
        "stale-while-revalidate=30",
        "must-revalidate",
        "proxy-revalidate",
        "private",
    ];
    let varies = [
        "",
        "Accept-Encoding",
        "accept-encoding, origin",
        "Cookie",
        "*",
    ];
    for case in 0..60 {
        // one to three Cache-Control fields of one to four directives each
        let mut fields = Vec::new();
        for _ in 0..rng.random_range(1..=3) {
            let n = rng.random_range(1..=4);
            let ds: Vec<&str> = (0..n)
                .map(|_| shared[rng.random_range(0..shared.len())])
                .collect();
            let sep = if rng.random_bool(0.5) { "," } else { " , " };
            fields.push(ds.join(sep));
        }
        let vary = varies[rng.random_range(0..varies.len())];
        let mut headers = vec!["Host: x".to_owned(), "Accept: text/css".to_owned()];
        headers.extend(
            fields
                .iter()
                .map(|f| format!("X-Origin-Cache-Control: {f}")),
        );
        if !vary.is_empty() {
            headers.push(format!("X-Origin-Vary: {vary}"));
        }
        let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
        let text = get_raw(&gw, &format!("/cache/asset-{case}.css"), &refs).await;
        assert_eq!(statuses(&text), [200], "{fields:?}: {text}");
        let head = text.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(head.contains("set-cookie: sluice_a_default="), "{head}");
        let cc: Vec<&str> = head
            .lines()
            .filter_map(|l| l.strip_prefix("cache-control:"))
            .collect();
        assert_eq!(cc.len(), 1, "{fields:?}: {head}");
        let directives: Vec<&str> = cc[0].split(',').map(str::trim).collect();
        assert_eq!(directives[0], "private", "{fields:?}: {head}");
        for d in &directives {
            let name = d.split('=').next().unwrap();
            assert!(
                name != "public" && name != "s-maxage",
                "shareable after a cookie: {fields:?} -> {head}"
            );
        }
        let vary_tokens: Vec<&str> = head
            .lines()
            .filter_map(|l| l.strip_prefix("vary:"))
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        assert!(
            vary_tokens.contains(&"cookie") || vary_tokens.contains(&"*"),
            "{vary:?}: {head}"
        );
        // what the origin varied on is kept
        for t in vary.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            assert!(
                vary_tokens.contains(&t.to_ascii_lowercase().as_str()),
                "{vary:?}: {head}"
            );
        }
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_paused_room_says_paused() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(
        &origin,
        &keys,
        None,
        vec![easy_room("default", 100.0, 1.0, &["/echo/shop"])],
        |_| {},
    )
    .await;
    let base = gw.url();
    assert_eq!(
        admin_patch(&base, "default", json!({"paused": true}))
            .await
            .status,
        200
    );
    let mut v = Visitor::new(&base, "default");
    let res = v.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    let b = res.json();
    assert_eq!(b["state"], "paused", "{b}");
    assert!(b["queue_token"].is_string());
    assert!(b["eta_seconds"].is_null(), "no promise of a wait: {b}");
    assert_eq!(v.status().await.json()["state"], "paused");
    gw.shutdown().await;
}

/// Keeps the generated spellings honest: the generator's spellings are
/// what an origin resolves to the canonical path (the model of
/// `sluice_gateway::edge::canonical`'s own property tests, applied to it).
#[test]
fn the_spelling_generator_makes_spellings_of_the_same_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..500 {
        for p in ["/echo/tickets/42", "/a/b-c/", "/x"] {
            let s = spelling(p, &mut rng);
            let c = sluice_gateway::edge::canonical::normalize_path(&s)
                .unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(c.route, p, "{s}");
            *seen.entry(s).or_default() += 1;
        }
    }
    assert!(
        seen.len() > 500,
        "too few distinct spellings: {}",
        seen.len()
    );
}

/// A hold of `qty` of event `demo` by the admitted visitor `v`.
async fn hold(v: &Visitor, qty: u64) -> sluice_tests::client::Answer {
    v.call_admitted(
        http::Method::POST,
        "/_sluice/events/demo/holds",
        Some(json!({"qty": qty})),
        &[],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_never_reloads_stock_into_a_flushed_store() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let rooms = vec![easy_room("default", 100.0, 10.0, &["/echo/shop"])];
    let events = |c: &mut Config| {
        c.events = demo_event(5, 4);
    };
    // the first deploy loads the configured stock (the harness's Redis
    // gateways do, as `--load-stock` would)
    let gw = gateway(&origin, &keys, Some(&redis.url()), rooms.clone(), events).await;
    let mut v = Visitor::new(&gw.url(), "default");
    v.join("/").await;
    assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
    let res = hold(&v, 4).await;
    assert_eq!(res.status, 201, "{}", res.text());
    gw.shutdown().await;

    // Redis loses everything; the gateway restarts as it would after a
    // crash (no --load-stock: the default with Redis)
    redis.command("FLUSHALL");
    let gw = gateway(&origin, &keys, Some(&redis.url()), rooms, |c| {
        events(c);
        c.load_stock = None;
    })
    .await;
    let base = gw.url();
    v.base = base.clone();
    tokio::time::sleep(Duration::from_millis(1500)).await; // a few reaper ticks
    for _ in 0..3 {
        let res = hold(&v, 1).await;
        assert_eq!(res.status, 503, "{}", res.text());
        assert_eq!(res.json()["code"], "inventory_not_ready", "{}", res.text());
    }
    let res = TestClient::new()
        .get(&format!("{base}/_sluice/events/demo"), &[])
        .await;
    assert_ne!(
        res.status,
        200,
        "the lost stock is on sale again: {}",
        res.text()
    );
    // the operator loads what is really left
    let res = TestClient::new()
        .call(
            http::Method::PUT,
            &format!("{base}/_sluice/admin/events/demo"),
            &[
                ("authorization", &format!("Bearer {ADMIN_TOKEN}")),
                ("content-type", "application/json"),
            ],
            sluice_tests::client::body(
                json!({"total": 1, "cart_limit": 4, "hold_ttl_seconds": 300, "version": 2})
                    .to_string(),
            ),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    assert_eq!(hold(&v, 1).await.status, 201);
    assert_eq!(hold(&v, 1).await.json()["code"], "sold_out");
    gw.shutdown().await;
}
