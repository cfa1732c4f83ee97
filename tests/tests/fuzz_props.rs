//! Bounded fuzzing as property tests, run with the normal suite: the
//! parsers that face the network or the operator get arbitrary and mutated
//! input, and must refuse it cleanly — no panic, no 5xx, and no mutation of
//! a genuine token or challenge ever verifies.
//!
//! The same targets run unbounded under `cargo fuzz` (see `fuzz/`); these
//! are their everyday, deterministic-budget versions (a few hundred to a
//! couple of thousand cases each, a few seconds in all).
//!
//! - tokens: `Keyring::verify_queue` / `verify_admit` on arbitrary strings
//!   and on one-character mutations of real tokens;
//! - challenges: `Keyset::verify` on arbitrary challenges and counters, and
//!   on mutations of a real solved challenge;
//! - JSON bodies: every control endpoint that reads a body, driven
//!   in-process through the gateway's router (`tower::ServiceExt::oneshot`)
//!   with arbitrary bytes and arbitrary JSON shaped like the real bodies.
//!   Holds carry a valid admission token of the event's room and webhook
//!   bodies a valid signature, so every body reaches its parser; after each
//!   case the event's stock invariant still holds;
//! - the config: `Config::from_toml` + `validate` on arbitrary text and on
//!   mutations of the example configuration;
//! - the gateway's own HTTP/1.1 reader (`sluice_wire::front::serve`) on
//!   request-shaped and arbitrary bytes: only plain requests answered, the
//!   rest handed on to hyper untouched;
//! - the origin side (`sluice_wire::origin::exchange`) on answer-shaped and
//!   arbitrary bytes from the origin, given a few bytes at a time: no panic
//!   or hang, no body longer than the answer, none for HEAD.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use http::{Method, Request};
use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_admission::{AdmitClaims, Keyring, QueueClaims, unix_now_s};
use sluice_gateway::app::{self, AppState};
use sluice_gateway::config::{Config, RoomConfig};
use sluice_gateway::edge::client_ip::ClientInfo;
use sluice_pow::{ChallengeSpec, Keyset};
use tower::ServiceExt;

// === tokens ===

struct Tokens {
    ring: Keyring,
    queue: String,
    admit: String,
}

fn tokens() -> &'static Tokens {
    static T: OnceLock<Tokens> = OnceLock::new();
    T.get_or_init(|| {
        let ring = Keyring::ephemeral();
        let now = unix_now_s();
        let mut q = QueueClaims::new("default", "visitor", 42, 1, now, Duration::from_secs(600));
        q.ret = Some("/tickets".into());
        let a = AdmitClaims::new("default", "visitor", 1, now, Duration::from_secs(600));
        Tokens {
            queue: ring.sign_queue(&q).unwrap(),
            admit: ring.sign_admit(&a).unwrap(),
            ring,
        }
    })
}

/// Replaces the character at `at % len` by `c`.
fn mutate(s: &str, at: usize, c: char) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return c.to_string();
    }
    let i = at % chars.len();
    chars[i] = c;
    chars.into_iter().collect()
}

const B64ISH: &str = "[A-Za-z0-9_.=+/-]";

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_verify_as_tokens(s in ".{0,600}", t in "[A-Za-z0-9_-]{0,200}\\.[A-Za-z0-9_-]{0,400}\\.[A-Za-z0-9_-]{0,100}") {
        let k = tokens();
        let now = unix_now_s();
        for x in [&s, &t] {
            prop_assert!(k.ring.verify_queue(x, "default", now).is_err());
            prop_assert!(k.ring.verify_admit(x, "default", now).is_err());
        }
    }

}

// A mutation inside the payload or signature costs a full Ed25519 verify,
// slow in a debug build: fewer cases here, the long run is `cargo fuzz`.
proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_tokens_never_verify(at in 0usize..4096, c in B64ISH.prop_map(|s| s.chars().next().unwrap())) {
        let k = tokens();
        let now = unix_now_s();
        let q = mutate(&k.queue, at, c);
        prop_assert_eq!(k.ring.verify_queue(&q, "default", now).is_ok(), q == k.queue);
        let a = mutate(&k.admit, at, c);
        prop_assert_eq!(k.ring.verify_admit(&a, "default", now).is_ok(), a == k.admit);
    }
}

#[test]
fn tokens_never_cross_types_or_rooms() {
    let k = tokens();
    let now = unix_now_s();
    assert!(k.ring.verify_queue(&k.queue, "default", now).is_ok());
    assert!(k.ring.verify_admit(&k.admit, "default", now).is_ok());
    assert!(k.ring.verify_admit(&k.queue, "default", now).is_err());
    assert!(k.ring.verify_queue(&k.admit, "default", now).is_err());
    assert!(k.ring.verify_queue(&k.queue, "other", now).is_err());
}

// === challenges ===

struct Challenge {
    keys: Keyset,
    challenge: String,
    solutions: Vec<String>,
}

fn challenge() -> &'static Challenge {
    static C: OnceLock<Challenge> = OnceLock::new();
    C.get_or_init(|| {
        let keys = Keyset::from_secret(b"fuzz-props-secret-0123456789").unwrap();
        let spec = ChallengeSpec {
            room: "default".into(),
            puzzles: 2,
            difficulty_bits: 4,
            ttl: Duration::from_secs(3600),
            min_solve: Duration::ZERO,
        };
        let issued = keys.issue(&spec, now_ms()).unwrap();
        let solutions = sluice_pow::solve(&issued.challenge, 2, 4, 1);
        Challenge {
            keys,
            challenge: issued.challenge,
            solutions,
        }
    })
}

fn now_ms() -> u64 {
    unix_now_s() * 1000
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_challenges_never_verify(
        ch in ".{0,700}",
        sols in prop::collection::vec(".{0,30}", 0..70),
        digits in prop::collection::vec("[0-9]{1,40}", 0..4),
    ) {
        let c = challenge();
        prop_assert!(c.keys.verify(&ch, &sols, "default", now_ms()).is_err());
        // the real challenge with arbitrary counters: no panic; only real
        // solutions pass
        let r = c.keys.verify(&c.challenge, &digits, "default", now_ms());
        if r.is_ok() {
            for (i, d) in digits.iter().enumerate() {
                let h = sluice_pow::leading_zero_bits(&sha(&format!("{}:{i}:{d}", c.challenge)));
                prop_assert!(h >= 4);
            }
        }
    }

    #[test]
    fn mutated_challenges_never_verify(at in 0usize..600, ch in B64ISH.prop_map(|s| s.chars().next().unwrap())) {
        let c = challenge();
        let m = mutate(&c.challenge, at, ch);
        let r = c.keys.verify(&m, &c.solutions, "default", now_ms());
        prop_assert_eq!(r.is_ok(), m == c.challenge);
        prop_assert!(c.keys.verify(&c.challenge, &c.solutions, "other", now_ms()).is_err());
    }
}

fn sha(s: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes()).into()
}

// === JSON bodies through the router ===

struct Router {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
    state: AppState,
}

const ADMIN: &str = "fuzz-admin-token-0123456789";
const WEBHOOK_SECRET: &str = "fuzz-webhook-secret-0123";

fn router() -> &'static Router {
    static R: OnceLock<Router> = OnceLock::new();
    R.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let config = Config {
            origin: Some("http://127.0.0.1:9".into()),
            admin_token: Some(ADMIN.into()),
            webhook_secret: Some(WEBHOOK_SECRET.into()),
            rooms: vec![RoomConfig {
                join_limit_per_prefix_per_min: 0,
                ..RoomConfig::default()
            }],
            ..Config::default()
        }
        .with_defaults();
        config.validate().unwrap();
        let state = rt.block_on(AppState::new(config)).unwrap();
        let r = Router {
            app: app::build(state.clone()),
            state,
            rt,
        };
        // The stock of `demo` is loaded before any hold is fuzzed (an
        // unloaded event answers 503 `inventory_not_ready`, by contract).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while admin_event_of(&r)["ready"] != true {
            assert!(std::time::Instant::now() < deadline, "stock never loaded");
            std::thread::sleep(Duration::from_millis(10));
        }
        r
    })
}

/// How a fuzzed request is authorised.
#[derive(Clone, Copy, Debug)]
enum Auth {
    None,
    /// The admin bearer token.
    Admin,
    /// A fresh admission token of room `default` (the room of event `demo`),
    /// for a new visitor each time (so the cart limit never hides a body).
    Admitted,
    /// `Sluice-Signature` over the body with the configured webhook secret.
    Signed,
}

fn request(r: &Router, method: Method, path: &str, auth: Auth, body: Vec<u8>) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    match auth {
        Auth::None => {}
        Auth::Admin => b = b.header("authorization", format!("Bearer {ADMIN}")),
        Auth::Admitted => {
            let claims = AdmitClaims::new(
                "default",
                &sluice_admission::new_visitor_id(),
                0,
                unix_now_s(),
                Duration::from_secs(600),
            );
            let token = r.state.keyring().sign_admit(&claims).unwrap();
            b = b.header("authorization", format!("Bearer {token}"));
        }
        Auth::Signed => {
            let sig = sluice_gateway::reserve::sign_webhook(
                WEBHOOK_SECRET.as_bytes(),
                unix_now_s(),
                &body,
            );
            b = b.header("sluice-signature", sig);
        }
    }
    let mut req = b.body(Body::from(body)).unwrap();
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    // A direct client, as the server resolves one.
    req.extensions_mut()
        .insert(ClientInfo::resolve(peer, &http::HeaderMap::new(), &[]));
    req
}

/// Sends one request through the router in-process; returns the status and
/// the problem `code` (empty for a success).
fn send(method: Method, path: &str, auth: Auth, body: Vec<u8>) -> (u16, String) {
    let r = router();
    let req = request(r, method, path, auth, body);
    r.rt.block_on(async {
        let res = r.app.clone().oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        let code = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        (status, code)
    })
}

fn admin_event_of(r: &Router) -> Value {
    let req = request(
        r,
        Method::GET,
        "/_sluice/admin/events/demo",
        Auth::Admin,
        Vec::new(),
    );
    r.rt.block_on(async {
        let res = r.app.clone().oneshot(req).await.unwrap();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    })
}

/// The stock of `demo` still adds up (available + held + confirmed = total).
fn stock_invariant_holds() -> bool {
    admin_event_of(router())["invariant_holds"] == true
}

/// Checks one answer of a fuzzed endpoint: below 500, and past the
/// authorisation (the body reached its parser).
fn check(path: &str, auth: Auth, (status, code): (u16, String)) -> Result<(), String> {
    if status >= 500 {
        return Err(format!("{path}: {status} {code}"));
    }
    match auth {
        Auth::Admitted if code == "not_admitted" => Err(format!("{path}: token refused")),
        Auth::Signed if code == "signature_invalid" => Err(format!("{path}: signature refused")),
        Auth::Admin if code == "unauthorized" => Err(format!("{path}: admin refused")),
        _ => Ok(()),
    }
}

#[test]
fn authorised_bodies_reach_the_parsers() {
    // A real hold: the admission token is accepted.
    let (status, code) = send(
        Method::POST,
        "/_sluice/events/demo/holds",
        Auth::Admitted,
        br#"{"qty": 1}"#.to_vec(),
    );
    assert_eq!(status, 201, "{code}");
    // An unknown hold: the signature is accepted, the body parsed.
    let (status, code) = send(
        Method::POST,
        "/_sluice/webhooks/payment",
        Auth::Signed,
        br#"{"payment_event_id": "p1", "hold_id": "nope", "outcome": "succeeded"}"#.to_vec(),
    );
    assert_eq!((status, code.as_str()), (404, "hold_not_found"));
    // Not JSON: the parsers answer, not the authorisation.
    for (path, auth) in [
        ("/_sluice/events/demo/holds", Auth::Admitted),
        ("/_sluice/webhooks/payment", Auth::Signed),
    ] {
        let (status, code) = send(Method::POST, path, auth, b"{".to_vec());
        assert_eq!(
            (status, code.as_str()),
            (400, "malformed_request"),
            "{path}"
        );
    }
    assert!(stock_invariant_holds());
}

/// The bodies' field names, so arbitrary JSON hits real fields.
const FIELDS: &[&str] = &[
    "challenge",
    "solutions",
    "return_to",
    "qty",
    "rate_per_sec",
    "burst",
    "paused",
    "max_active",
    "capacity_rps",
    "safety_margin",
    "difficulty_floor_bits",
    "difficulty_ceiling_bits",
    "join_limit_per_prefix_per_min",
    "total",
    "cart_limit",
    "hold_ttl_seconds",
    "version",
    "room",
    "payment_event_id",
    "hold_id",
    "outcome",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        Just(json!(1e308)),
        Just(json!(-0.0)),
        Just(json!(18446744073709551615u64)),
        ".{0,40}".prop_map(Value::from),
        "[0-9]{1,30}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

fn endpoints() -> Vec<(Method, &'static str, Auth)> {
    vec![
        (Method::POST, "/_sluice/rooms/default/join", Auth::None),
        (Method::POST, "/_sluice/rooms/default/challenge", Auth::None),
        (Method::PATCH, "/_sluice/admin/rooms/default", Auth::Admin),
        (Method::PUT, "/_sluice/admin/events/fuzz", Auth::Admin),
        (Method::POST, "/_sluice/events/demo/holds", Auth::Admitted),
        (Method::POST, "/_sluice/webhooks/payment", Auth::Signed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_on_control_endpoints_are_never_5xx(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        for (m, path, auth) in endpoints() {
            let answer = send(m, path, auth, bytes.clone());
            let checked = check(path, auth, answer);
            prop_assert!(checked.is_ok(), "{:?} for {}", checked, String::from_utf8_lossy(&bytes));
        }
        prop_assert!(stock_invariant_holds());
    }

    #[test]
    fn arbitrary_json_on_control_endpoints_is_never_5xx(v in json_value()) {
        let bytes = v.to_string().into_bytes();
        for (m, path, auth) in endpoints() {
            let answer = send(m.clone(), path, auth, bytes.clone());
            let checked = check(path, auth, answer);
            prop_assert!(checked.is_ok(), "{:?} for {}", checked, v);
        }
        prop_assert!(stock_invariant_holds());
    }
}

// === the configuration ===

const EXAMPLE: &str = include_str!("../../deploy/sluice.example.toml");

fn config_never_panics(text: &str) {
    if let Ok(c) = Config::from_toml(text) {
        let _ = c.validate();
        let _ = c.with_defaults().validate();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_config_text_is_refused_cleanly(text in ".{0,400}") {
        config_never_panics(&text);
    }

    #[test]
    fn mutated_example_config_is_refused_cleanly(at in 0usize..20_000, len in 0usize..40, insert in ".{0,20}") {
        let mut s: Vec<char> = EXAMPLE.chars().collect();
        let i = at % s.len().max(1);
        let end = (i + len).min(s.len());
        s.splice(i..end, insert.chars());
        config_never_panics(&s.into_iter().collect::<String>());
    }

    #[test]
    fn extreme_room_numbers_are_refused_cleanly(
        rate in prop_oneof![any::<f64>().prop_map(|f| format!("{f:?}")), Just("inf".to_owned()), Just("nan".to_owned()), Just("-inf".to_owned()), any::<i64>().prop_map(|i| i.to_string())],
        burst in prop_oneof![any::<f64>().prop_map(|f| format!("{f:?}")), Just("nan".to_owned())],
        puzzles in any::<i64>(),
        bits in any::<i64>(),
        margin in prop_oneof![any::<f64>().prop_map(|f| format!("{f:?}")), Just("nan".to_owned())],
        ttl in prop_oneof![Just("0s".to_owned()), Just("18446744073709551615s".to_owned()), "[0-9]{1,25}(ms|s|m|h|d|y)".prop_map(|s| s)],
    ) {
        let text = format!(
            "[[rooms]]\nid = \"r\"\nrate_per_sec = {rate}\nburst = {burst}\npuzzles = {puzzles}\ndifficulty_floor_bits = {bits}\nsafety_margin = {margin}\nsession_ttl = \"{ttl}\"\nclaim_window = \"{ttl}\"\n"
        );
        config_never_panics(&text);
    }
}

// === the gateway's own HTTP/1.1 reader ===

/// Serves `data` (then the client's end of input) with `front::serve`,
/// answering each request it takes with its target: the requests taken,
/// and how it ended.
fn front_serve(data: &[u8]) -> (usize, sluice_wire::front::Outcome) {
    use tokio::io::AsyncWriteExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        client.write_all(data).await.unwrap();
        client.shutdown().await.unwrap();
        let limits = sluice_wire::front::Limits {
            head_bytes: 1024,
            headers: 16,
        };
        let watch = sluice_wire::watch::ConnWatch::default();
        let taken = std::cell::Cell::new(0usize);
        let answer = |req: Request<Body>| {
            assert!(matches!(*req.method(), Method::GET | Method::HEAD));
            for name in [
                http::header::CONTENT_LENGTH,
                http::header::TRANSFER_ENCODING,
                http::header::UPGRADE,
                http::header::EXPECT,
            ] {
                assert!(!req.headers().contains_key(name));
            }
            taken.set(taken.get() + 1);
            std::future::ready(http::Response::new(Body::from(req.uri().to_string())))
        };
        let out = tokio::time::timeout(
            Duration::from_secs(5),
            sluice_wire::front::serve(&mut server, limits, &watch, || false, answer),
        )
        .await
        .expect("no hang");
        (taken.get(), out)
    })
}

/// Request-shaped pieces, so that generated input reaches past the
/// request line.
fn head_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            "GET / HTTP/1.1\r\n",
            "HEAD /a?b HTTP/1.1\r\n",
            "POST / HTTP/1.1\r\n",
            "GET / HTTP/1.0\r\n",
            "Host: a\r\n",
            "Connection: close\r\n",
            "Connection: keep-alive\r\n",
            "Content-Length: 3\r\n",
            "Transfer-Encoding: chunked\r\n",
            "Expect: 100-continue\r\n",
            " folded\r\n",
            "\r\n",
            "\n",
            "0\r\n\r\n",
            "abc",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever a client sends: no panic or hang, only plain requests
    /// answered, and what goes on to hyper is exactly what was not taken.
    #[test]
    fn the_front_takes_plain_heads_and_hands_on_the_rest_untouched(
        pieces in prop::collection::vec(head_piece(), 0..12),
    ) {
        let data = pieces.concat();
        let (_, out) = front_serve(&data);
        if let sluice_wire::front::Outcome::Handoff(rest) = out {
            prop_assert!(!rest.is_empty());
            prop_assert!(data.ends_with(&rest));
        }
    }
}

#[test]
fn the_front_answers_each_plain_request_once_and_stops_at_the_first_other() {
    let data = b"GET /1 HTTP/1.1\r\n\r\nHEAD /2 HTTP/1.1\r\n\r\nGET /3 HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET /4 HTTP/1.1\r\n\r\n";
    let (taken, out) = front_serve(data);
    assert_eq!(taken, 2);
    let sluice_wire::front::Outcome::Handoff(rest) = out else {
        panic!("not handed off: {out:?}");
    };
    assert!(rest.starts_with(b"GET /3 HTTP/1.1\r\nContent-Length: 0"));
}

// === the origin side of the wire code ===

/// An origin's connection: gives `data` `step` bytes at a read, then the
/// end; takes whatever is written.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    step: usize,
}

impl tokio::io::AsyncRead for Trickle {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = self
            .step
            .min(self.data.len() - self.at)
            .min(buf.remaining());
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Trickle {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Reads `answer` as the origin's answer to `method`, `step` bytes at a
/// read (as `fuzz/fuzz_targets/origin_heads.rs` does): the body, when the
/// head and the body both read cleanly.
fn origin_read(answer: &[u8], method: &Method, step: usize) -> Option<bytes::Bytes> {
    use http_body_util::BodyExt as _;
    use sluice_wire::origin::{self, Conn, Discard};
    let conn = Conn::new(
        Trickle {
            data: answer.to_vec(),
            at: 0,
            step,
        },
        b"GET / HTTP/1.1\r\nhost: origin\r\n\r\n".to_vec(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let read = async {
            let res = origin::exchange(conn, method, &std::sync::Arc::new(Discard))
                .await
                .ok()?;
            Some(res.into_body().collect().await.ok()?.to_bytes())
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("no hang")
    })
}

/// Answer-shaped pieces, so that generated input reaches past the status
/// line into framing, chunks and trailers.
fn answer_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            "HTTP/1.1 200 OK\r\n",
            "HTTP/1.0 200 OK\r\n",
            "HTTP/1.1 103 Early Hints\r\n",
            "HTTP/1.1 204 No Content\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n",
            "Content-Length: 3\r\n",
            "content-length: 3, 4\r\n",
            "Transfer-Encoding: chunked\r\n",
            "Transfer-Encoding: gzip\r\n",
            "Connection: close, x-a\r\n",
            "x-a: 1\r\n",
            " folded\r\n",
            "\r\n",
            "\n",
            "3\r\nabc\r\n",
            "5;ext=\"v\"\r\nhello\r\n",
            "ffffffffffffffff\r\n",
            "0\r\n",
            "x-sum: 1\r\n",
            "abc",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever an origin answers, in whatever pieces: no panic or hang,
    /// and the body handed on is never longer than the answer (none for
    /// HEAD).
    #[test]
    fn the_origin_reader_survives_any_answer(
        pieces in prop::collection::vec(answer_piece(), 0..12),
        head in any::<bool>(),
        step in prop_oneof![Just(usize::MAX), 1usize..16],
    ) {
        let answer = pieces.concat();
        let method = if head { Method::HEAD } else { Method::GET };
        if let Some(body) = origin_read(&answer, &method, step) {
            prop_assert!(body.len() <= answer.len());
            prop_assert!(!head || body.is_empty());
        }
    }
}

#[test]
fn the_origin_reader_reads_a_chunked_answer_given_a_byte_at_a_time() {
    let answer =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-sum: 1\r\n\r\n";
    let body = origin_read(answer, &Method::GET, 1).expect("read");
    assert_eq!(&body[..], b"hello");
}
