//! Server-sent events (issue 21) through real sockets: a waiting
//! visitor's status stream (the event-stream framing, positions that only
//! fall, the admission delivered once and the stream ended after it, the
//! same session as a poll), `Last-Event-ID` resuming (and 204 after an
//! admission), the per-network cap and `max_connections`, an expired
//! token ending its stream, the availability stream of an admitted
//! visitor (pushed as stock moves, ended by a revoke), SIGTERM ending
//! every stream with a short `retry`, and a stream through another
//! gateway than the join on Redis.
//!
//! The Redis test skips loudly when `redis-server` is missing (a failure
//! under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{GatewayProcess, TestGateway, temp_file, temp_keys};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One event as read off the wire.
#[derive(Debug, Default, Clone)]
struct Event {
    id: Option<String>,
    event: String,
    data: String,
    retry: Option<u64>,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {}", self.data))
    }
}

/// A raw HTTP/1.1 event-stream client: the status line and headers, then
/// events (comments counted, not returned).
struct Stream {
    status: u16,
    headers: Vec<(String, String)>,
    reader: Option<BufReader<TcpStream>>,
    comments: usize,
    /// A `retry` sent on its own (no event).
    bare_retry: Option<u64>,
}

impl Stream {
    async fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Stream {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let mut req =
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut reader = BufReader::new(tcp);
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            line.clear();
            reader.read_line(&mut line).await.unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.to_ascii_lowercase(), v.trim().to_owned()));
        }
        Stream {
            status,
            headers,
            reader: Some(reader),
            comments: 0,
            bare_retry: None,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body of a non-stream answer (content-length).
    async fn body(&mut self) -> String {
        let n: usize = self
            .header("content-length")
            .unwrap_or("0")
            .parse()
            .unwrap();
        let mut buf = vec![0; n];
        self.reader
            .as_mut()
            .unwrap()
            .read_exact(&mut buf)
            .await
            .unwrap();
        String::from_utf8(buf).unwrap()
    }

    /// Whether the gateway closes the connection (end of file) within
    /// `limit`, whatever bytes come before.
    async fn closed_within(&mut self, limit: Duration) -> bool {
        let Some(reader) = self.reader.as_mut() else {
            return true;
        };
        let mut sink = [0u8; 512];
        let read_all = async {
            loop {
                match reader.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(limit, read_all).await.is_ok()
    }

    /// One chunk-decoded line of the event stream; `None` at its end.
    async fn line(&mut self) -> Option<String> {
        let reader = self.reader.as_mut()?;
        let mut line = String::new();
        let n = reader.read_line(&mut line).await.ok()?;
        if n == 0 {
            return None;
        }
        Some(line)
    }

    /// The next event within `limit`; `None` when the stream ended (or
    /// nothing came in time, with `quiet` true).
    async fn next(&mut self, limit: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut ev = Event::default();
        let mut pending = String::new();
        loop {
            // Chunk size line.
            let size = tokio::time::timeout_at(deadline, self.line())
                .await
                .ok()??;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            if size == 0 {
                self.reader = None;
                return None;
            }
            let mut buf = vec![0; size + 2];
            tokio::time::timeout_at(deadline, self.reader.as_mut()?.read_exact(&mut buf))
                .await
                .ok()?
                .ok()?;
            pending.push_str(std::str::from_utf8(&buf[..size]).unwrap());
            while let Some(i) = pending.find('\n') {
                let l: String = pending.drain(..=i).collect();
                let l = l.trim_end_matches('\n');
                if l.is_empty() {
                    if !ev.event.is_empty() || !ev.data.is_empty() {
                        return Some(ev);
                    }
                    continue;
                }
                if l.starts_with(':') {
                    self.comments += 1;
                    continue;
                }
                let (k, v) = l.split_once(": ").unwrap_or((l, ""));
                match k {
                    "id" => ev.id = Some(v.to_owned()),
                    "event" => ev.event = v.to_owned(),
                    "data" => ev.data.push_str(v),
                    "retry" => {
                        ev.retry = v.parse().ok();
                        self.bare_retry = ev.retry;
                    }
                    other => panic!("unknown field {other}"),
                }
            }
        }
    }
}

fn room(rate: f64) -> RoomConfig {
    RoomConfig {
        id: "default".into(),
        rate_per_sec: rate,
        burst: 1.0,
        puzzles: 1,
        difficulty_floor_bits: 1,
        difficulty_ceiling_bits: 2,
        join_limit_per_prefix_per_min: 0,
        attack_min_solve: Duration::ZERO,
        ..RoomConfig::default()
    }
}

async fn gateway(
    origin: &TestOrigin,
    rate: f64,
    f: impl FnOnce(&mut sluice_gateway::config::Config) + Send + 'static,
) -> TestGateway {
    TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = vec![room(rate)];
            f(c);
        })
        .spawn()
        .await
}

fn addr(base: &str) -> SocketAddr {
    base.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// A visitor that joined and waits (its queue token held).
async fn waiting(base: &str) -> Visitor {
    let mut v = Visitor::new(base, "default");
    let res = v.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    v
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_visitor_hears_its_place_fall_then_its_admission_once() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 2.0, |_| {}).await;
    let base = gw.url();
    // A line in front: the credit spent, four wait.
    for _ in 0..5 {
        let mut v = Visitor::new(&base, "default");
        assert!(v.join("/").await.status.is_success());
    }
    let me = waiting(&base).await;
    let token = me.queue_token.clone().unwrap();
    let auth = bearer(&token);
    let mut s = Stream::open(
        addr(&base),
        "/_sluice/rooms/default/status",
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("text/event-stream"));
    assert_eq!(s.header("cache-control"), Some("no-store"));
    assert_eq!(s.header("x-accel-buffering"), Some("no"));
    // A stream is its connection's last answer: the connection keeps no
    // deadline task while it is open, and closes after it.
    assert_eq!(s.header("connection"), Some("close"));
    let first = s
        .next(Duration::from_secs(5))
        .await
        .expect("a first event at once");
    assert_eq!(first.event, "status");
    let retry = first.retry.expect("the first event says when to reconnect");
    assert!((1_000..=30_000).contains(&retry), "{retry}");
    let body = first.json();
    assert_eq!(body["state"], "waiting", "{body}");
    // The same object as the poll answers.
    for k in [
        "seq",
        "position",
        "eta_seconds",
        "poll_after_ms",
        "rate_per_sec",
    ] {
        assert!(body.get(k).is_some(), "{k} in {body}");
    }
    let mut positions = vec![body["position"].as_u64().unwrap()];
    assert!(positions[0] >= 3, "{body}");
    let admitted = loop {
        let ev = s
            .next(Duration::from_secs(20))
            .await
            .expect("the stream ended before the admission");
        assert_eq!(ev.event, "status");
        let v = ev.json();
        match v["state"].as_str().unwrap() {
            "waiting" => {
                let p = v["position"].as_u64().unwrap();
                assert!(
                    p < *positions.last().unwrap(),
                    "positions fall: {positions:?} then {p}"
                );
                assert!(ev.id.as_deref().unwrap().starts_with('w'), "{ev:?}");
                positions.push(p);
            }
            "admitted" => {
                assert_eq!(ev.id.as_deref(), Some("admitted"));
                break v;
            }
            other => panic!("{other}: {v}"),
        }
    };
    eprintln!("positions heard: {positions:?}");
    // The stream ends after the admission: nothing more, ever.
    assert!(
        s.next(Duration::from_secs(3)).await.is_none(),
        "the stream goes on after admitted"
    );
    assert!(
        s.closed_within(Duration::from_secs(5)).await,
        "the connection stays open after its stream"
    );
    let token_a = admitted["admission_token"].as_str().unwrap();
    // One place, one session: the poll answers the same session (and sets
    // the cookie).
    let mut me = me;
    let res = me.status().await;
    assert_eq!(res.json()["state"], "admitted", "{}", res.text());
    assert!(
        res.headers
            .get_all("set-cookie")
            .iter()
            .any(|c| c.to_str().unwrap().starts_with("sluice_a_default="))
    );
    let sid = |t: &str| {
        let claims = t.split('.').nth(1).unwrap();
        let raw = base64_decode(claims);
        serde_json::from_slice::<Value>(&raw).unwrap()["sid"].clone()
    };
    assert_eq!(
        sid(token_a),
        sid(res.json()["admission_token"].as_str().unwrap())
    );
    // A reconnect naming the admission: 204, the EventSource stops.
    let mut again = Stream::open(
        addr(&base),
        "/_sluice/rooms/default/status",
        &[("authorization", &auth), ("last-event-id", "admitted")],
    )
    .await;
    assert_eq!(again.status, 204);
    assert!(again.next(Duration::from_millis(500)).await.is_none());
    gw.shutdown().await;
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_resumes_without_repeating_and_the_room_state_ends_or_goes_on() {
    let origin = TestOrigin::start().await;
    // Nobody is admitted (rate 0): positions stand still.
    let gw = gateway(&origin, 0.0, |_| {}).await;
    let base = gw.url();
    let mut first = Visitor::new(&base, "default");
    assert!(first.join("/").await.status.is_success());
    let me = waiting(&base).await;
    // The room's one credit spent on the first: positions stand still.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let auth = bearer(me.queue_token.as_deref().unwrap());
    let mut s = Stream::open(
        addr(&base),
        "/_sluice/rooms/default/status",
        &[("authorization", &auth)],
    )
    .await;
    let ev = s.next(Duration::from_secs(5)).await.unwrap();
    let id = ev.id.clone().unwrap();
    drop(s);
    // Resumed with the id it has: nothing is repeated.
    let mut s = Stream::open(
        addr(&base),
        "/_sluice/rooms/default/status",
        &[("authorization", &auth), ("last-event-id", &id)],
    )
    .await;
    assert_eq!(s.status, 200);
    let repeated = s.next(Duration::from_secs(2)).await;
    assert!(
        repeated.is_none(),
        "repeated what the client had ({id}): {repeated:?}"
    );
    // A pause reaches it at once, and the stream goes on.
    let patch = sluice_tests::admin_patch(&base, "default", json!({"paused": true})).await;
    assert_eq!(patch.status, 200, "{}", patch.text());
    let ev = s
        .next(Duration::from_secs(3))
        .await
        .expect("the pause is pushed");
    assert_eq!(ev.json()["state"], "paused", "{}", ev.data);
    assert_eq!(ev.id.as_deref(), Some("paused"));
    // Closed: pushed, and the stream ends.
    let patch =
        sluice_tests::admin_patch(&base, "default", json!({"paused": false, "closed": true})).await;
    if patch.status == 200 {
        let ev = s
            .next(Duration::from_secs(3))
            .await
            .expect("closing is pushed");
        assert_eq!(ev.json()["state"], "closed", "{}", ev.data);
        assert!(
            s.next(Duration::from_secs(2)).await.is_none(),
            "a closed room's stream ends"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_capped_per_network_and_an_expired_token_ends_its_stream() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 0.0, |c| {
        c.limits.streams_per_prefix = 3;
        c.rooms[0].queue_token_ttl = Duration::from_secs(3);
    })
    .await;
    let base = gw.url();
    let mut front = Visitor::new(&base, "default");
    assert!(front.join("/").await.status.is_success());
    let mut open = Vec::new();
    let mut tokens = Vec::new();
    for _ in 0..4 {
        tokens.push(waiting(&base).await.queue_token.unwrap());
    }
    for t in &tokens[..3] {
        let auth = bearer(t);
        let mut s = Stream::open(
            addr(&base),
            "/_sluice/rooms/default/status",
            &[("authorization", &auth)],
        )
        .await;
        assert_eq!(s.status, 200);
        assert!(s.next(Duration::from_secs(5)).await.is_some());
        open.push(s);
    }
    // The fourth from the same network: 429, and its poll still answers.
    let auth = bearer(&tokens[3]);
    let mut s = Stream::open(
        addr(&base),
        "/_sluice/rooms/default/status",
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(s.status, 429);
    let p: Value = serde_json::from_str(&s.body().await).unwrap();
    assert_eq!(
        (p["code"].as_str(), p["reason"].as_str()),
        (Some("rate_limited"), Some("streams")),
        "{p}"
    );
    let mut v = Visitor::new(&base, "default");
    v.queue_token = Some(tokens[3].clone());
    let res = v.status().await;
    assert_eq!(res.status, 200, "{}", res.text());
    // The queue tokens expire (3 s): each stream says so and ends.
    for s in &mut open {
        let ev = loop {
            let ev = s.next(Duration::from_secs(6)).await.expect("an end event");
            if ev.event == "end" {
                break ev;
            }
        };
        assert_eq!(
            ev.json(),
            json!({"code": "token_invalid", "reason": "expired"})
        );
        assert!(s.next(Duration::from_secs(1)).await.is_none());
    }
    // The slots came back: a stream opens again (with a fresh token).
    let fresh = waiting(&base).await;
    let auth = bearer(fresh.queue_token.as_deref().unwrap());
    let s = Stream::open(
        addr(&base),
        "/_sluice/rooms/default/status",
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(s.status, 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn availability_is_pushed_to_an_admitted_visitor_until_its_session_is_revoked() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 100.0, |c| {
        c.rooms[0].burst = 100.0;
        c.events = vec![EventConfig::default()];
    })
    .await;
    let base = gw.url();
    // Stock loaded.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buyer = Visitor::new(&base, "default");
    assert!(buyer.join("/").await.status.is_success());
    let token = buyer.admission_token.clone().expect("admitted at once");
    loop {
        if buyer.get_admitted("/_sluice/events/demo").await.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let auth = bearer(&token);
    let mut s = Stream::open(
        addr(&base),
        "/_sluice/events/demo",
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(s.status, 200);
    let ev = s.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(ev.event, "availability");
    let v = ev.json();
    assert_eq!(
        (v["event"].as_str(), v["available"].as_u64()),
        (Some("demo"), Some(100)),
        "{v}"
    );
    for k in ["total", "cart_limit", "hold_ttl_seconds"] {
        assert!(v.get(k).is_some(), "{k} in {v}");
    }
    // Another visitor holds 3: pushed within the view's refresh.
    let mut other = Visitor::new(&base, "default");
    assert!(other.join("/").await.status.is_success());
    let res = other
        .call_admitted(
            http::Method::POST,
            "/_sluice/events/demo/holds",
            Some(json!({"qty": 3})),
            &[],
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let ev = s
        .next(Duration::from_secs(5))
        .await
        .expect("the hold is pushed");
    assert_eq!(ev.json()["available"], 97, "{}", ev.data);
    // Checkout done, the origin revokes the session: the stream ends.
    let res = buyer.get_admitted("/command/revoke").await;
    assert_eq!(res.status, 200);
    let ev = loop {
        let ev = s.next(Duration::from_secs(5)).await.expect("an end event");
        if ev.event == "end" {
            break ev;
        }
    };
    assert_eq!(
        ev.json(),
        json!({"code": "not_admitted", "reason": "revoked"})
    );
    assert!(s.next(Duration::from_secs(1)).await.is_none());
    // A visitor without an admission gets no stream.
    let s = Stream::open(addr(&base), "/_sluice/events/demo", &[]).await;
    assert_eq!(s.status, 401);
    gw.shutdown().await;
}

/// SIGTERM: every stream ends at once with a short `retry` (clients
/// reconnect elsewhere) and the process exits without waiting out its
/// grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_every_stream_with_a_short_retry() {
    let origin = TestOrigin::start().await;
    let cfg = temp_file(
        "streams-sigterm.toml",
        "[[rooms]]\nid = \"default\"\npaths = [\"/\"]\nrate_per_sec = 0\nburst = 1\npuzzles = 1\n\
         difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
         attack_min_solve = \"0s\"\n\n[timeouts]\nshutdown_grace = \"30s\"\n",
    );
    let mut gw =
        GatewayProcess::start(&["--origin", &origin.url(), "--config", cfg.to_str().unwrap()]);
    let base = gw.url();
    let mut front = Visitor::new(&base, "default");
    assert!(front.join("/").await.status.is_success());
    let mut streams = Vec::new();
    for _ in 0..5 {
        let v = waiting(&base).await;
        let auth = bearer(v.queue_token.as_deref().unwrap());
        let mut s = Stream::open(
            gw.addr,
            "/_sluice/rooms/default/status",
            &[("authorization", &auth)],
        )
        .await;
        assert!(s.next(Duration::from_secs(5)).await.is_some());
        streams.push(s);
    }
    let t = Instant::now();
    gw.signal("TERM");
    for s in &mut streams {
        assert!(
            s.next(Duration::from_secs(5)).await.is_none(),
            "the stream ends"
        );
        let r = s.bare_retry.expect("a retry before the end");
        assert!((1_000..=5_000).contains(&r), "{r}");
    }
    // Well inside the 30 s grace, even on a loaded machine.
    assert_eq!(gw.wait(Duration::from_secs(20)), Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "waited out the grace: {:?}",
        t.elapsed()
    );
}

/// Streams count as connections: with `max_connections` = 3, three open
/// streams leave no room for a fourth connection until one ends (a client
/// gone is noticed at its stream's next write: within a heartbeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_take_connection_slots() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, 0.0, |c| {
        c.limits.max_connections = 3;
        c.limits.stream_heartbeat = Duration::from_secs(1);
    })
    .await;
    let base = gw.url();
    let mut tokens = Vec::new();
    {
        // The joins' clients (and their kept-alive connections) go before
        // the streams open.
        let mut front = Visitor::new(&base, "default");
        assert!(front.join("/").await.status.is_success());
        for _ in 0..3 {
            tokens.push(waiting(&base).await.queue_token.unwrap());
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut streams = Vec::new();
    for t in &tokens {
        let auth = bearer(t);
        let mut s = Stream::open(
            addr(&base),
            "/_sluice/rooms/default/status",
            &[("authorization", &auth)],
        )
        .await;
        assert!(s.next(Duration::from_secs(5)).await.is_some());
        streams.push(s);
    }
    // A fourth connection is closed unanswered.
    let mut tcp = TcpStream::connect(addr(&base)).await.unwrap();
    let _ = tcp
        .write_all(b"GET /_sluice/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(3), tcp.read_to_end(&mut buf)).await;
    assert!(
        matches!(n, Ok(Ok(0)) | Ok(Err(_))),
        "answered: {:?}",
        String::from_utf8_lossy(&buf)
    );
    // One client goes away: its slot comes back once the gateway notices,
    // at the stream's next write (a heartbeat at the latest).
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let client = sluice_tests::client::TestClient::new();
        let req = http::Request::builder()
            .uri(format!("{base}/_sluice/healthz"))
            .body(sluice_tests::client::empty())
            .unwrap();
        if client.try_send(req).await.is_some_and(|r| r.status == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.shutdown().await;
}

/// On Redis, a visitor that joined through one gateway streams through
/// another and is admitted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_through_another_gateway_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let cfg = temp_file(
        "streams-redis.toml",
        "[[rooms]]\nid = \"default\"\npaths = [\"/\"]\nrate_per_sec = 2\nburst = 1\npuzzles = 1\n\
         difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
         attack_min_solve = \"0s\"\n",
    );
    let secret = "streams-pow-secret-0123456789";
    let a = GatewayProcess::start_shared(&redis.url(), &origin.url(), &cfg, &keys, secret, &[]);
    let b = GatewayProcess::start_shared(&redis.url(), &origin.url(), &cfg, &keys, secret, &[]);
    for _ in 0..3 {
        let mut v = Visitor::new(&a.url(), "default");
        assert!(v.join("/").await.status.is_success());
    }
    let me = waiting(&a.url()).await;
    let auth = bearer(me.queue_token.as_deref().unwrap());
    let mut s = Stream::open(
        b.addr,
        "/_sluice/rooms/default/status",
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(s.status, 200);
    let mut states = Vec::new();
    while let Some(ev) = s.next(Duration::from_secs(15)).await {
        let v = ev.json();
        states.push(v["state"].as_str().unwrap().to_owned());
        if v["state"] == "admitted" {
            assert!(v["admission_token"].is_string());
        }
    }
    assert_eq!(
        states.last().map(String::as_str),
        Some("admitted"),
        "{states:?}"
    );
    assert_eq!(states.iter().filter(|s| *s == "admitted").count(), 1);
}
