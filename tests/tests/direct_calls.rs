//! Holds and joins past the router (`server.direct_calls`,
//! gateway/src/app/direct.rs) against the same calls through it: the same
//! requests, sent in the same order to a gateway with it and to one
//! without it (each on a store of its own, set up alike), must bring the
//! same answers: status line, header lines in order, framing and body
//! (decoded when compressed), whatever the request is. For holds: every
//! refusal API.md gives a hold (no token, another room's, an unknown or
//! malformed event, a bad quantity, a body that is not JSON, not said to be
//! JSON, too large or sent in chunks, a bad idempotency key, the cart
//! limit, sold out, too many holds from one visitor), a replay, items on an
//! event with categories, and every `Accept-Encoding` (br, gzip, none,
//! identity refused: 406 after the hold is taken, as the router's
//! compression layer answers). For joins: a place taken, asked again with
//! the same proof or with the queue token, proofs that are wrong, forged
//! or of another room, bodies with unknown fields, malformed, too large or
//! not JSON, unknown rooms, return URLs off the site, every
//! `Accept-Encoding`. Then generated calls of both kinds (any bytes as
//! the body, content types, encodings, tokens, paths and near misses).
//! What differs by nature is normalised: the date,
//! request ids, tokens, cookies' values, hold ids, deadlines, positions
//! and `Retry-After`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_gateway::config::EventConfig;
use sluice_gateway::config::event::CategoryConfig;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::{Visitor, admit};
use sluice_tests::{TestGateway, easy_room};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Categories of the event `cats`: an items hold naming all of them is
/// answered with more than the kilobyte the compression layer starts at.
const CATEGORIES: usize = 24;

fn category(i: usize) -> String {
    format!("category-with-long-name-{i:02}")
}

async fn gateway(origin: &TestOrigin, direct: bool) -> TestGateway {
    TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.server.direct_calls = direct;
            c.limits.holds_per_visitor_per_min = 30;
            c.limits.control_body_bytes = 2048;
            c.rooms = vec![
                easy_room("default", 10_000.0, 10_000.0, &[]),
                easy_room("vip", 10_000.0, 10_000.0, &["/vip"]),
                // a line: one place admitted at once, the rest wait
                easy_room("line", 0.0, 1.0, &["/line"]),
            ];
            c.events = vec![
                EventConfig {
                    id: "demo".into(),
                    total: 8,
                    cart_limit: 4,
                    ..EventConfig::default()
                },
                EventConfig {
                    id: "cats".into(),
                    total: 20 * CATEGORIES as u64,
                    cart_limit: 100,
                    categories: (0..CATEGORIES)
                        .map(|i| CategoryConfig {
                            id: category(i),
                            total: 20,
                            cart_limit: None,
                        })
                        .collect(),
                    ..EventConfig::default()
                },
                EventConfig {
                    id: "vipev".into(),
                    room: "vip".into(),
                    total: 10,
                    cart_limit: 2,
                    ..EventConfig::default()
                },
            ];
        })
        .spawn()
        .await
}

/// Whose token a request carries.
#[derive(Clone, Copy, Debug)]
enum Who {
    Nobody,
    Forged,
    /// Visitor `n` of the room `default`.
    Fan(usize),
    /// The visitor of the room `vip`.
    Vip,
}

/// One request, written out for each gateway with that gateway's tokens.
#[derive(Clone, Debug)]
struct Ask {
    method: &'static str,
    path: String,
    who: Who,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    chunked: bool,
}

fn ask(path: &str, who: Who, body: &str) -> Ask {
    Ask {
        method: "POST",
        path: path.into(),
        who,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Some(body.as_bytes().to_vec()),
        chunked: false,
    }
}

fn hold(who: Who, body: &str) -> Ask {
    ask("/_sluice/events/demo/holds", who, body)
}

impl Ask {
    fn with(mut self, name: &str, value: &str) -> Ask {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn without_content_type(mut self) -> Ask {
        self.headers.retain(|(n, _)| n != "content-type");
        self
    }

    fn wire(&self, tokens: &Tokens) -> Vec<u8> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nhost: sluice.test\r\nconnection: close\r\n",
            self.method, self.path
        );
        let token = match self.who {
            Who::Nobody => None,
            Who::Forged => Some("not.a.token".to_owned()),
            Who::Fan(n) => Some(tokens.fans[n].clone()),
            Who::Vip => Some(tokens.vip.clone()),
        };
        if let Some(t) = token {
            head.push_str(&format!("authorization: Bearer {t}\r\n"));
        }
        for (n, v) in &self.headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        let mut out = Vec::new();
        match (&self.body, self.chunked) {
            (None, _) => {
                head.push_str("\r\n");
                out.extend_from_slice(head.as_bytes());
            }
            (Some(b), false) => {
                head.push_str(&format!("content-length: {}\r\n\r\n", b.len()));
                out.extend_from_slice(head.as_bytes());
                out.extend_from_slice(b);
            }
            (Some(b), true) => {
                head.push_str("transfer-encoding: chunked\r\n\r\n");
                out.extend_from_slice(head.as_bytes());
                for piece in b.chunks(3) {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
        }
        out
    }
}

struct Tokens {
    fans: Vec<String>,
    vip: String,
}

/// Every kind of hold request, in an order that walks the stores through
/// the cart limit, a sale to the last unit and past it.
fn asks() -> Vec<Ask> {
    let mut v = vec![
        hold(Who::Fan(0), r#"{"qty":1}"#),
        hold(Who::Fan(0), r#"{"qty":1}"#).with("accept-encoding", "br"),
        hold(Who::Fan(0), r#"{"qty":1}"#).with("accept-encoding", "gzip, deflate, br, zstd"),
        // every encoding refused: the hold is taken, the answer is 406
        hold(Who::Fan(0), r#"{"qty":1}"#).with("accept-encoding", "identity;q=0"),
        hold(Who::Fan(0), r#"{"qty":1}"#).with("accept-encoding", "*;q=0"),
        hold(Who::Fan(1), r#"{"qty":5}"#),
        hold(Who::Fan(0), r#"{"qty":2}"#),
    ];
    for body in [
        r#"{"qty":0}"#,
        r#"{"qty":-1}"#,
        r#"{"qty":"2"}"#,
        r#"{"qty":1.5}"#,
        r#"{"qty":4294967296}"#,
        r#"{}"#,
        r#"[]"#,
        r#""qty""#,
        r#"{"qty":1,"items":[]}"#,
        r#"{"items":[{"category":"x","qty":1}]}"#,
        r#"{"qty":"#,
        "",
        "\u{0}",
    ] {
        v.push(hold(Who::Fan(1), body));
    }
    v.push(hold(Who::Fan(1), r#"{"qty":1}"#).with("accept-encoding", "br"));
    v.push(
        hold(Who::Fan(1), r#"{"qty":1}"#)
            .without_content_type()
            .with("content-type", "text/plain"),
    );
    v.push(hold(Who::Fan(1), r#"{"qty":1}"#).without_content_type());
    v.push(hold(Who::Fan(1), r#"{"qty":1}"#).with("content-type", "application/problem+json"));
    let big = format!(r#"{{"qty":1,"pad":"{}"}}"#, "x".repeat(3000));
    v.push(hold(Who::Fan(1), &big));
    v.push(hold(Who::Fan(1), &big).with("accept-encoding", "br"));
    let mut chunked = hold(Who::Fan(2), r#"{"qty":1}"#);
    chunked.chunked = true;
    v.push(chunked);
    let mut no_body = hold(Who::Fan(2), "");
    no_body.body = None;
    v.push(no_body);
    // idempotency keys: a first use, its replay, malformed ones
    v.push(hold(Who::Fan(2), r#"{"qty":1}"#).with("idempotency-key", "order-1"));
    v.push(hold(Who::Fan(2), r#"{"qty":1}"#).with("idempotency-key", "order-1"));
    v.push(hold(Who::Fan(2), r#"{"qty":3}"#).with("idempotency-key", "order-1"));
    v.push(hold(Who::Fan(2), r#"{"qty":1}"#).with("idempotency-key", "has space"));
    v.push(hold(Who::Fan(2), r#"{"qty":1}"#).with("idempotency-key", &"k".repeat(129)));
    // who may hold: nobody, a forged token, another room's visitor
    v.push(hold(Who::Nobody, r#"{"qty":1}"#));
    v.push(hold(Who::Forged, r#"{"qty":1}"#));
    v.push(hold(Who::Vip, r#"{"qty":1}"#));
    v.push(ask("/_sluice/events/vipev/holds", Who::Vip, r#"{"qty":1}"#));
    v.push(ask(
        "/_sluice/events/vipev/holds",
        Who::Fan(3),
        r#"{"qty":1}"#,
    ));
    // events: unknown, malformed ids, an escape (the router's either way)
    for path in [
        "/_sluice/events/nope/holds",
        "/_sluice/events/bad.id/holds",
        &format!("/_sluice/events/{}/holds", "e".repeat(65)),
        "/_sluice/events/d%65mo/holds",
        "/_sluice/events/demo/holds/",
        "/_sluice/events/demo/holds?x=1",
    ] {
        v.push(ask(path, Who::Fan(3), r#"{"qty":1}"#));
    }
    // to the last unit and past it
    for _ in 0..4 {
        v.push(hold(Who::Fan(3), r#"{"qty":1}"#));
        v.push(hold(Who::Fan(4), r#"{"qty":2}"#).with("accept-encoding", "gzip"));
    }
    // an event with categories: items, a bare qty, unknown and repeated ones
    let all: Vec<Value> = (0..CATEGORIES)
        .map(|i| json!({"category": category(i), "qty": 1}))
        .collect();
    let items = json!({ "items": all }).to_string();
    let cats = |who, body: &str| ask("/_sluice/events/cats/holds", who, body);
    v.push(cats(Who::Fan(5), &items).with("accept-encoding", "br"));
    v.push(cats(Who::Fan(5), &items).with("accept-encoding", "gzip"));
    v.push(cats(Who::Fan(5), &items));
    v.push(cats(Who::Fan(5), &items).with("accept-encoding", "identity;q=0"));
    v.push(
        cats(Who::Fan(6), &items)
            .with("idempotency-key", "cart-7")
            .with("accept-encoding", "br"),
    );
    // a bare qty naming that key again: the items hold, replayed
    v.push(cats(Who::Fan(6), r#"{"qty":1}"#).with("idempotency-key", "cart-7"));
    v.push(
        cats(Who::Fan(6), r#"{"qty":1}"#)
            .with("idempotency-key", "cart-7")
            .with("accept-encoding", "br"),
    );
    v.push(cats(Who::Fan(6), r#"{"qty":1}"#));
    v.push(cats(
        Who::Fan(6),
        r#"{"items":[{"category":"nope","qty":1}]}"#,
    ));
    v.push(cats(
        Who::Fan(6),
        &json!({"items":[{"category": category(0), "qty":1},{"category": category(0), "qty":1}]})
            .to_string(),
    ));
    // methods the route does not take, and an upgrade
    let mut get = hold(Who::Fan(3), "");
    get.method = "GET";
    get.body = None;
    v.push(get);
    let mut put = hold(Who::Fan(3), r#"{"qty":1}"#);
    put.method = "PUT";
    v.push(put);
    v.push(hold(Who::Fan(3), r#"{"qty":1}"#).with("upgrade", "websocket"));
    // one visitor past its holds a minute (30): 429 with Retry-After
    for _ in 0..33 {
        v.push(hold(Who::Fan(7), r#"{"qty":0}"#));
    }
    v
}

/// One answer: status line and header lines (normalised), and the body
/// decoded as its framing and `Content-Encoding` say, normalised.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    head: Vec<String>,
    body: String,
}

async fn exchange(addr: std::net::SocketAddr, wire: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(wire).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the gateway closes after a `connection: close` request")
        .unwrap();
    out
}

fn answer(raw: &[u8]) -> Answer {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut res = httparse::Response::new(&mut fields);
    let httparse::Status::Complete(len) = res.parse(raw).expect("a response head") else {
        panic!("a partial head: {}", String::from_utf8_lossy(raw));
    };
    let mut head = vec![format!(
        "{} {}",
        res.code.unwrap(),
        res.reason.unwrap_or("")
    )];
    let mut chunked = false;
    let mut coding = None;
    for h in res.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).into_owned();
        match name.as_str() {
            "transfer-encoding" => chunked = value.contains("chunked"),
            "content-encoding" => coding = Some(value.clone()),
            _ => {}
        }
        let shown = match name.as_str() {
            "date" | "x-request-id" | "retry-after" => "*".to_owned(),
            // the token in a cookie differs by nature; its name and
            // attributes not
            "set-cookie" => match value.split_once('=') {
                Some((cookie, rest)) => {
                    let attrs = rest.split_once(';').map_or("", |(_, a)| a);
                    format!("{cookie}=*;{attrs}")
                }
                None => value,
            },
            _ => value,
        };
        head.push(format!("{name}: {shown}"));
    }
    let mut body = raw[len..].to_vec();
    if chunked {
        body = unchunk(&body);
    }
    let body = match coding.as_deref() {
        Some("br") => {
            let mut out = Vec::new();
            brotli_decompressor::Decompressor::new(&body[..], 4096)
                .read_to_end(&mut out)
                .expect("valid br");
            out
        }
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut out)
                .expect("valid gzip");
            out
        }
        _ => body,
    };
    // The length follows the tokens, ids and deadlines, which differ by
    // nature: it must be the body's, and is then compared as present.
    for line in &mut head {
        if let Some(n) = line.strip_prefix("content-length: ") {
            assert_eq!(n.parse::<usize>().unwrap(), raw.len() - len, "{line}");
            *line = "content-length: *".into();
        }
    }
    Answer {
        head,
        body: normalised(&body),
    }
}

fn unchunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..line_end]).unwrap().trim(), 16)
            .expect("hex chunk size");
        b = &b[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Hold ids and deadlines differ between the gateways by nature.
fn normalised(body: &[u8]) -> String {
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        return String::from_utf8_lossy(body).into_owned();
    };
    if let Some(o) = v.as_object_mut() {
        if let Some(id) = o.get_mut("hold_id")
            && let Some(s) = id.as_str()
        {
            let event = s.split('.').next().unwrap_or("").to_owned();
            *id = json!(format!("{event}.*"));
        }
        for k in [
            "expires_at",
            "next_wave_at",
            "next_wave_at_ms",
            "position",
            "poll_after_ms",
            "eta_seconds",
        ] {
            if let Some(n) = o.get_mut(k) {
                *n = json!(0);
            }
        }
        for k in ["queue_token", "admission_token", "challenge"] {
            if let Some(t) = o.get_mut(k) {
                *t = json!("*");
            }
        }
    }
    v.to_string()
}

/// The two gateways (past the router, through it) in front of one origin,
/// and each one's tokens: eight fans of `default`, one visitor of `vip`.
async fn pair() -> (TestOrigin, TestGateway, TestGateway, Vec<Tokens>) {
    let origin = TestOrigin::start().await;
    let direct = gateway(&origin, true).await;
    let routed = gateway(&origin, false).await;
    let mut tokens = Vec::new();
    for gw in [&direct, &routed] {
        let url = gw.url();
        let fans = futures_util::future::join_all((0..8).map(|_| admit(&url, "default"))).await;
        let vip = admit(&url, "vip").await;
        tokens.push(Tokens { fans, vip });
    }
    (origin, direct, routed, tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_past_the_router_are_answered_as_through_it() {
    let (_origin, direct, routed, tokens) = pair().await;
    let asks = asks();
    let mut compressed = 0;
    let mut statuses = std::collections::BTreeMap::new();
    for (i, a) in asks.iter().enumerate() {
        let d = answer(&exchange(direct.addr, &a.wire(&tokens[0])).await);
        let r = answer(&exchange(routed.addr, &a.wire(&tokens[1])).await);
        assert_eq!(d, r, "request {i}: {a:?}");
        compressed += usize::from(d.head.iter().any(|l| l.starts_with("content-encoding")));
        *statuses.entry(d.head[0].clone()).or_insert(0) += 1;
    }
    // the walk met what it was written for
    for status in [
        "201 Created",
        "400 Bad Request",
        "401 Unauthorized",
        "404 Not Found",
        "405 Method Not Allowed",
        "406 Not Acceptable",
        "409 Conflict",
        "413 Payload Too Large",
        "415 Unsupported Media Type",
        "422 Unprocessable Entity",
        "429 Too Many Requests",
    ] {
        assert!(statuses.contains_key(status), "no {status}: {statuses:?}");
    }
    assert!(compressed >= 3, "{compressed} compressed answers");
    // and both stores hold the same: every unit of demo sold, the same
    // units of every category out
    for event in ["demo", "cats", "vipev"] {
        let [d, r] = [&direct, &routed].map(|gw| async move {
            let v =
                sluice_tests::admin_get(&gw.url(), &format!("/_sluice/admin/events/{event}")).await;
            assert!(v.get("available").is_some(), "{v}");
            v
        });
        let (d, r) = (d.await, r.await);
        assert_eq!(d, r, "{event}");
        if event == "demo" {
            assert_eq!(d["available"], 0, "{d}");
        }
    }
    direct.shutdown().await;
    routed.shutdown().await;
}

/// A solved join body for `room` of the gateway at `base` (a challenge
/// fetched from it), with `return_to` "/".
async fn proof(base: &str, room: &str) -> Value {
    let c = Visitor::new(base, room).challenge().await;
    sluice_tests::visitor::join_body(&c, "/").await
}

fn post(path: &str, body: &[u8], headers: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: sluice.test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Every kind of join, sent to one gateway: each needing a proof gets one
/// of its own from that gateway. The answers, in order.
async fn join_walk(gw: &TestGateway) -> Vec<Answer> {
    let base = gw.url();
    let join = "/_sluice/rooms/line/join";
    let json_ct = ("content-type", "application/json");
    let mut out = Vec::new();
    let send = async |wire: Vec<u8>| answer(&exchange(gw.addr, &wire).await);
    let first = proof(&base, "line").await.to_string();
    out.push(send(post(join, first.as_bytes(), &[json_ct])).await);
    // the same proof again, and again over br
    out.push(send(post(join, first.as_bytes(), &[json_ct])).await);
    out.push(
        send(post(
            join,
            first.as_bytes(),
            &[json_ct, ("accept-encoding", "br")],
        ))
        .await,
    );
    let waiting = proof(&base, "line").await.to_string();
    let raw = exchange(gw.addr, &post(join, waiting.as_bytes(), &[json_ct])).await;
    let queued = answer(&raw);
    let start = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let token = serde_json::from_slice::<Value>(&raw[start..]).unwrap()["queue_token"]
        .as_str()
        .expect("a queue token")
        .to_owned();
    out.push(queued);
    for coding in ["br", "gzip, deflate, br, zstd", "identity;q=0", "*;q=0"] {
        let p = proof(&base, "line").await.to_string();
        out.push(
            send(post(
                join,
                p.as_bytes(),
                &[json_ct, ("accept-encoding", coding)],
            ))
            .await,
        );
    }
    // proofs that do not hold
    let mut wrong = proof(&base, "line").await;
    wrong["solutions"] = json!(["AAAA"]);
    out.push(send(post(join, wrong.to_string().as_bytes(), &[json_ct])).await);
    let forged = json!({"challenge": "forged.challenge", "solutions": ["x"]}).to_string();
    out.push(send(post(join, forged.as_bytes(), &[json_ct])).await);
    let elsewhere = proof(&base, "default").await.to_string();
    out.push(send(post(join, elsewhere.as_bytes(), &[json_ct])).await);
    // bodies
    let mut extra = proof(&base, "line").await;
    extra["extra"] = json!(1);
    out.push(send(post(join, extra.to_string().as_bytes(), &[json_ct])).await);
    out.push(send(post(join, br#"{"challenge":"#, &[json_ct])).await);
    out.push(send(post(join, b"", &[json_ct])).await);
    let plain = proof(&base, "line").await.to_string();
    out.push(
        send(post(
            join,
            plain.as_bytes(),
            &[("content-type", "text/plain")],
        ))
        .await,
    );
    let mut big = proof(&base, "line").await;
    big["return_to"] = json!(format!("/{}", "x".repeat(3000)));
    out.push(send(post(join, big.to_string().as_bytes(), &[json_ct])).await);
    // rooms
    let p = proof(&base, "line").await.to_string();
    out.push(send(post("/_sluice/rooms/nope/join", p.as_bytes(), &[json_ct])).await);
    let p = proof(&base, "default").await.to_string();
    out.push(
        send(post(
            "/_sluice/rooms/d%65fault/join",
            p.as_bytes(),
            &[json_ct],
        ))
        .await,
    );
    // where to go after
    for to in ["https://evil.example/x", "//evil.example", "/line/ok?x=1"] {
        let mut p = proof(&base, "line").await;
        p["return_to"] = json!(to);
        out.push(send(post(join, p.to_string().as_bytes(), &[json_ct])).await);
    }
    // a visitor already in line, asking again with its token
    let again = proof(&base, "line").await.to_string();
    let bearer = format!("Bearer {token}");
    let cookie = format!("sluice_q_line={token}");
    for shown in [
        ("authorization", bearer.as_str()),
        ("cookie", cookie.as_str()),
    ] {
        out.push(send(post(join, again.as_bytes(), &[json_ct, shown])).await);
    }
    // fields of other rooms' kinds
    let mut invite = proof(&base, "line").await;
    invite["invite"] = json!("not-a-code");
    out.push(send(post(join, invite.to_string().as_bytes(), &[json_ct])).await);
    let mut enqueue = proof(&base, "line").await;
    enqueue["enqueue_token"] = json!("not.a.token");
    out.push(send(post(join, enqueue.to_string().as_bytes(), &[json_ct])).await);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_past_the_router_are_answered_as_through_it() {
    let origin = TestOrigin::start().await;
    let direct = gateway(&origin, true).await;
    let routed = gateway(&origin, false).await;
    let d = join_walk(&direct).await;
    let r = join_walk(&routed).await;
    assert_eq!(d.len(), r.len());
    let mut statuses = std::collections::BTreeMap::new();
    for (i, (d, r)) in d.iter().zip(&r).enumerate() {
        assert_eq!(d, r, "join {i}");
        *statuses.entry(d.head[0].clone()).or_insert(0) += 1;
    }
    for status in [
        "200 OK",
        "201 Created",
        "400 Bad Request",
        "404 Not Found",
        "406 Not Acceptable",
        "413 Payload Too Large",
        "415 Unsupported Media Type",
    ] {
        assert!(statuses.contains_key(status), "no {status}: {statuses:?}");
    }
    // (a join's answer, some 500 bytes, is under the size the
    // compression layer starts at: asked with br it goes through the
    // layer, which leaves it as it is, as the router's does)
    // the line: the same places taken on both
    let d = sluice_tests::admin_room(&direct.url(), "line").await;
    let r = sluice_tests::admin_room(&routed.url(), "line").await;
    assert!(d["tail"].as_u64().unwrap() >= 10, "{d}");
    for k in ["tail", "frontier", "active_sessions"] {
        assert_eq!(d[k], r[k], "{k}: {d} against {r}");
    }
    direct.shutdown().await;
    routed.shutdown().await;
}

/// Generated hold and join requests: any bytes or near-JSON as the body,
/// any of a few content types, encodings, tokens and paths (the direct
/// ones and their near misses).
fn gen_ask() -> impl proptest::strategy::Strategy<Value = Ask> {
    use proptest::prelude::*;
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        (any::<i64>(), any::<bool>()).prop_map(|(q, items)| {
            if items {
                format!(
                    r#"{{"items":[{{"category":"{}","qty":{q}}}]}}"#,
                    category(0)
                )
                .into_bytes()
            } else {
                format!(r#"{{"qty":{q}}}"#).into_bytes()
            }
        }),
        (1u32..3).prop_map(|q| format!(r#"{{"qty":{q}}}"#).into_bytes()),
        Just(br#"{"challenge":"x","solutions":[]}"#.to_vec()),
    ];
    let path = prop_oneof![
        Just("/_sluice/events/demo/holds"),
        Just("/_sluice/events/cats/holds"),
        Just("/_sluice/events/nope/holds"),
        Just("/_sluice/events/de%6Do/holds"),
        Just("/_sluice/rooms/line/join"),
        Just("/_sluice/rooms/nope/join"),
    ];
    let who = prop_oneof![
        Just(Who::Nobody),
        Just(Who::Forged),
        (0usize..8).prop_map(Who::Fan),
        Just(Who::Vip),
    ];
    let content_type = prop_oneof![
        Just(None),
        Just(Some("application/json")),
        Just(Some("text/plain")),
    ];
    let coding = prop_oneof![
        Just(None),
        Just(Some("br")),
        Just(Some("gzip")),
        Just(Some("identity;q=0")),
    ];
    (body, path, who, content_type, coding, any::<bool>()).prop_map(
        |(body, path, who, content_type, coding, chunked)| {
            let mut headers = Vec::new();
            if let Some(ct) = content_type {
                headers.push(("content-type".to_owned(), ct.to_owned()));
            }
            if let Some(c) = coding {
                headers.push(("accept-encoding".to_owned(), c.to_owned()));
            }
            Ask {
                method: "POST",
                path: path.to_owned(),
                who,
                headers,
                body: Some(body),
                chunked,
            }
        },
    )
}

/// Any generated hold or join request gets the same answer past the router
/// as through it (the gateways' stores walk in step: each case goes to
/// both, in the same order).
#[test]
fn generated_calls_are_answered_alike() {
    use proptest::prelude::*;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (origin, direct, routed, tokens) = rt.block_on(pair());
    let config = ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(a in gen_ask())| {
        let (d, r) = rt.block_on(async {
            let d = answer(&exchange(direct.addr, &a.wire(&tokens[0])).await);
            let r = answer(&exchange(routed.addr, &a.wire(&tokens[1])).await);
            (d, r)
        });
        prop_assert_eq!(d, r, "{:?}", a);
    });
    rt.block_on(async {
        direct.shutdown().await;
        routed.shutdown().await;
        drop(origin);
    });
}
