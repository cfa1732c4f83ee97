//! Hostile input, end to end through real sockets: forged and stolen
//! tokens, replayed and tampered proofs of work, spoofed headers, request
//! smuggling shapes, oversized heads and bodies, idle connections, open
//! redirects, path traversal, markup injection, admin brute force and the
//! cookies' flags.
//!
//! Every attack must get a clear 4xx (or a closed connection), never a 5xx
//! or a panic, and must change nothing: the queue's `tail` (seqs handed
//! out) and the origin's request count are read before and after.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use http::Method;
use serde_json::{Value, json};
use sha2::Sha256;
use sluice_admission::{AdmitClaims, Keyring, QueueClaims};
use sluice_gateway::admin::ADMIN_FAILURES_PER_MIN;
use sluice_gateway::config::RoomConfig;
use sluice_tests::client::{Answer, TestClient, body, raw, statuses};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway, admin_patch, admin_room, metric, temp_keys};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POW_SECRET: &str = "hostile-pow-secret-0123456789";

/// A room with an easy proof of work and no per-network limit (every test
/// client is 127.0.0.1).
fn room(id: &str, rate: f64, paths: &[&str]) -> RoomConfig {
    let burst = if rate > 0.0 { 100.0 } else { 1.0 };
    sluice_tests::easy_room(id, rate, burst, paths)
}

/// `default` (rate 0: everybody but the first visitor waits; that first
/// one is let in here) guards every path; `open` (fast) guards `/echo/open`.
async fn gateway(origin: &TestOrigin, keys: &std::path::Path, redis: Option<&str>) -> TestGateway {
    let keys = keys.to_owned();
    let mut b = TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.keys_dir = Some(keys);
            c.pow_secret = Some(POW_SECRET.into());
            c.rooms = vec![
                room("default", 0.0, &[]),
                room("open", 1000.0, &["/echo/open"]),
            ];
        });
    if let Some(url) = redis {
        b = b.redis(url);
    }
    let gw = b.spawn().await;
    // A new room holds one credit: spend it so every later visitor waits.
    let mut first = Visitor::new(&gw.url(), "default");
    let res = first.join("/").await;
    assert!(res.status.is_success(), "{}", res.text());
    let deadline = Instant::now() + Duration::from_secs(5);
    while admin_room(&gw.url(), "default").await["tail"].as_u64() < Some(1) {
        assert!(Instant::now() < deadline, "the first join never showed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw
}

/// Two gateways on one Redis of the test's own, sharing keys, origin and
/// proof-of-work secret (`None`: no `redis-server`, said by
/// [`RedisServer::start`]).
struct Pair {
    redis: RedisServer,
    a: TestGateway,
    b: TestGateway,
    _origin: TestOrigin,
}

async fn two_gateways() -> Option<Pair> {
    let redis = RedisServer::start()?;
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let a = gateway(&origin, &keys, Some(&redis.url())).await;
    let b = gateway(&origin, &keys, Some(&redis.url())).await;
    Some(Pair {
        redis,
        a,
        b,
        _origin: origin,
    })
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

fn hs256(key: &[u8], signing_input: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(signing_input.as_bytes());
    URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Asserts a 4xx problem+json (never 5xx).
fn assert_4xx(res: &Answer, what: &str) {
    assert!(
        res.status.is_client_error(),
        "{what}: {} {}",
        res.status,
        res.text()
    );
}

/// The room's `tail` once the gateway's snapshot has caught up (the admin
/// view is refreshed every tick).
async fn settled_tail(base: &str, room: &str) -> u64 {
    let mut last = admin_room(base, room).await["tail"].as_u64().unwrap();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = admin_room(base, room).await["tail"].as_u64().unwrap();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

// === tokens ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_attacks_on_status_and_gate_are_refused_and_change_nothing() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None).await;
    let base = gw.url();
    let client = TestClient::new();

    // A real place in line, to steal claims from.
    let mut v = Visitor::new(&base, "default");
    let res = v.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    let real = v.queue_token.clone().unwrap();
    let real_payload = real.split('.').nth(1).unwrap().to_owned();
    let jwks = client
        .get(&format!("{base}/_sluice/jwks.json"), &[])
        .await
        .json();
    let kid = jwks["keys"][0]["kid"].as_str().unwrap().to_owned();
    let x = jwks["keys"][0]["x"].as_str().unwrap().to_owned();
    let public = URL_SAFE_NO_PAD.decode(&x).unwrap();

    // Tokens minted by the right key but wrong in one claim.
    let ring = Keyring::load_dir(&keys).unwrap();
    let now = now_s();
    let mut expired = QueueClaims::new("default", "v", 1, 0, now - 7200, Duration::from_secs(60));
    expired.iat = now - 7200;
    let other_room = QueueClaims::new("open", "v", 1, 0, now, Duration::from_secs(600));
    let admit = AdmitClaims::new("default", "v", 0, now, Duration::from_secs(600));
    let queue_as_admit = QueueClaims::new("default", "v", 1, 0, now, Duration::from_secs(600));
    let mut future = QueueClaims::new("default", "v", 1, 0, now + 3600, Duration::from_secs(600));
    future.iat = now + 3600;

    let mut forged: Vec<(&str, String)> = Vec::new();
    let none_header = json!({"alg": "none", "typ": "JWT", "kid": kid});
    forged.push(("alg none", format!("{}.{real_payload}.", b64(&none_header))));
    forged.push((
        "alg none, real signature",
        format!(
            "{}.{real_payload}.{}",
            b64(&none_header),
            real.split('.').nth(2).unwrap()
        ),
    ));
    let hs_header = b64(&json!({"alg": "HS256", "typ": "JWT", "kid": kid}));
    let input = format!("{hs_header}.{real_payload}");
    forged.push((
        "HS256 keyed with the public key bytes",
        format!("{input}.{}", hs256(&public, &input)),
    ));
    forged.push((
        "HS256 keyed with the JWK x",
        format!("{input}.{}", hs256(x.as_bytes(), &input)),
    ));
    forged.push((
        "HS256 keyed with the whole JWKS",
        format!("{input}.{}", hs256(jwks.to_string().as_bytes(), &input)),
    ));
    for bad_kid in [
        "../../etc/passwd",
        "/dev/null",
        "..",
        "",
        "a/../b",
        "%2e%2e",
    ] {
        let h = b64(&json!({"alg": "EdDSA", "typ": "JWT", "kid": bad_kid}));
        let sig = real.split('.').nth(2).unwrap();
        forged.push(("kid path trick", format!("{h}.{real_payload}.{sig}")));
    }
    let mut tampered = real.clone();
    tampered.insert(real.find('.').unwrap() + 1, 'e');
    forged.push(("payload tampered", tampered));
    forged.push((
        "10 KB token",
        format!(
            "{}.{}.{}",
            "e".repeat(4000),
            "e".repeat(4000),
            "e".repeat(2300)
        ),
    ));
    forged.push(("expired", ring.sign_queue(&expired).unwrap()));
    forged.push((
        "another room's token",
        ring.sign_queue(&other_room).unwrap(),
    ));
    forged.push((
        "admission token as queue token",
        ring.sign_admit(&admit).unwrap(),
    ));
    forged.push(("issued an hour ahead", ring.sign_queue(&future).unwrap()));
    forged.push(("not a JWT", "not-a-token".into()));
    forged.push(("three empty parts", "..".into()));

    let tail_before = settled_tail(&base, "default").await;
    let origin_before = origin.requests();
    let status_url = format!("{base}/_sluice/rooms/default/status");
    for (what, token) in &forged {
        let bearer = format!("Bearer {token}");
        let res = client.get(&status_url, &[("authorization", &bearer)]).await;
        assert_eq!(res.status, 401, "{what} (bearer): {}", res.text());
        assert_eq!(res.json()["code"], "token_invalid", "{what}");
        let cookie = format!("sluice_q_default={token}");
        let res = client.get(&status_url, &[("cookie", &cookie)]).await;
        assert_eq!(res.status, 401, "{what} (cookie): {}", res.text());
    }
    // The same forgeries as admission tokens at the gate, and admission
    // tokens wrong in one claim: the waiting room, never the origin.
    let mut at_gate: Vec<(&str, String)> = forged
        .into_iter()
        .filter(|(w, _)| *w != "admission token as queue token")
        .collect();
    at_gate.push((
        "queue token at the gate",
        ring.sign_queue(&queue_as_admit).unwrap(),
    ));
    let mut a = AdmitClaims::new("default", "v", 0, now - 7200, Duration::from_secs(60));
    a.iat = now - 7200;
    at_gate.push(("expired admission", ring.sign_admit(&a).unwrap()));
    let a = AdmitClaims::new("open", "v", 0, now, Duration::from_secs(600));
    at_gate.push(("another room's admission", ring.sign_admit(&a).unwrap()));
    let a = AdmitClaims::new("default", "v", 0, now + 3600, Duration::from_secs(600));
    at_gate.push((
        "admission issued an hour ahead",
        ring.sign_admit(&a).unwrap(),
    ));
    for (what, token) in &at_gate {
        let bearer = format!("Bearer {token}");
        let res = client
            .get(
                &format!("{base}/echo"),
                &[("authorization", &bearer), ("accept", "application/json")],
            )
            .await;
        assert_eq!(res.status, 503, "{what} (bearer at gate): {}", res.text());
        assert_eq!(res.json()["code"], "waiting_room_active", "{what}");
        let cookie = format!("sluice_a_default={token}");
        let res = client
            .get(
                &format!("{base}/echo"),
                &[("cookie", &cookie), ("accept", "application/json")],
            )
            .await;
        assert_eq!(res.status, 503, "{what} (cookie at gate): {}", res.text());
    }
    // Nothing changed: no seq handed out, nothing reached the origin, and
    // the real token still works.
    assert_eq!(settled_tail(&base, "default").await, tail_before);
    assert_eq!(origin.requests(), origin_before);
    assert_eq!(v.status().await.status, 200);
    gw.shutdown().await;
}

/// The gate remembers the admission token each connection showed last
/// (it is settled at the edge without the shared verify cache): on one
/// keep-alive connection that showed a valid admission, every forgery and
/// every admission wrong in one claim still gets the waiting room, the
/// valid token passes again after each, and once its session is revoked it
/// passes no more, on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_showed_a_valid_admission_gets_nothing_for_a_forged_one() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let dir = keys.clone();
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.keys_dir = Some(dir);
            c.pow_secret = Some(POW_SECRET.into());
            // rate 0: each room's one credit is spent below, and then
            // nobody is let in on the spot (a refused token gets the
            // waiting room, not a passthrough)
            c.rooms = vec![
                room("default", 0.0, &[]),
                room("other", 0.0, &["/echo/other"]),
            ];
        })
        .spawn()
        .await;
    let mut v = Visitor::new(&gw.url(), "default");
    assert!(v.join("/").await.status.is_success());
    assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
    let valid = v.admission_token.clone().expect("admitted");
    let res = TestClient::new()
        .get(&format!("{}/echo/other/spend", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200, "the other room's credit: {}", res.text());

    let ring = Keyring::load_dir(&keys).unwrap();
    let now = now_s();
    let mut forged: Vec<(&str, String)> = Vec::new();
    let mut tampered = valid.clone();
    tampered.insert(valid.find('.').unwrap() + 1, 'e');
    forged.push(("payload tampered", tampered));
    let mut last = valid.clone();
    let c = last.pop().unwrap();
    forged.push((
        "signature's last character changed",
        format!("{last}{}", if c == 'A' { 'B' } else { 'A' }),
    ));
    forged.push(("signature cut short", last.clone()));
    forged.push(("one more character", format!("{valid}A")));
    forged.push((
        "unsigned",
        valid.rsplit_once('.').unwrap().0.to_owned() + ".",
    ));
    let a = AdmitClaims::new("other", "v", 0, now, Duration::from_secs(600));
    forged.push(("another room's admission", ring.sign_admit(&a).unwrap()));
    let mut a = AdmitClaims::new("default", "v", 0, now - 7200, Duration::from_secs(60));
    a.iat = now - 7200;
    forged.push(("expired admission", ring.sign_admit(&a).unwrap()));
    let mut a = AdmitClaims::new("default", "v", 0, now, Duration::from_secs(600));
    a.ipp = Some("203.0.113.0/24".into());
    forged.push(("bound to another network", ring.sign_admit(&a).unwrap()));
    let mut bound_here = AdmitClaims::new("default", "v", 0, now, Duration::from_secs(600));
    bound_here.ipp = Some("127.0.0.0/24".into());
    let bound_here = ring.sign_admit(&bound_here).unwrap();

    let get = |path: &str, token: &str, last: bool| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\nCookie: sluice_a_default={token}\r\n{}\r\n",
            if last { "Connection: close\r\n" } else { "" }
        )
    };
    // One connection, the requests in order: the valid token, then each
    // forgery followed by the valid token again (and the valid token as
    // another room's cookie name: no admission there).
    let mut wire = get("/echo/a", &valid, false);
    let mut want = vec![200];
    for (_, token) in &forged {
        wire += &get("/echo/b", token, false);
        wire += &get("/echo/c", &valid, false);
        want.extend([503, 200]);
    }
    wire += &format!(
        "GET /echo/other/x HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\nCookie: sluice_a_other={valid}\r\n\r\n"
    );
    want.push(503);
    wire += &get("/echo/d", &bound_here, false);
    wire += &get("/echo/e", &valid, false);
    want.extend([200, 200]);
    // The origin ends the session: the same token, on the same connection,
    // is refused from the next request on (its cookies cleared).
    wire += &get("/command/revoke", &valid, false);
    wire += &get("/echo/f", &valid, true);
    want.extend([200, 503]);

    let before = origin.requests();
    let text = raw(gw.addr, wire.as_bytes(), Duration::from_secs(10)).await;
    let codes = statuses(&text);
    assert_eq!(
        codes,
        want,
        "{:?}\n{text}",
        forged.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    let passed = want.iter().filter(|c| **c == 200).count() as u64;
    assert_eq!(origin.requests() - before, passed, "{text}");
    assert!(
        !text.contains("/echo/b"),
        "a forgery reached the origin: {text}"
    );
    let refused = text.rsplit("HTTP/1.1 ").next().unwrap();
    assert!(refused.contains("waiting_room_active"), "{refused}");
    assert!(refused.contains("sluice_a_default=;"), "{refused}");
    gw.shutdown().await;
}

// === proof of work ===

/// One solution sent at once over many connections to two gateways on
/// one Redis: it buys one place, and every answer is that place (201, the
/// same seq), however the requests interleave. The replay guard and the
/// join are one script: no request sees the solution spent without its
/// place (which the three-step join answered with 409 `pow_replayed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_solution_sent_at_once_over_many_connections_buys_one_place() {
    let Some(Pair {
        redis: _redis,
        a,
        b,
        _origin,
    }) = two_gateways().await
    else {
        return;
    };
    let tail = settled_tail(&a.url(), "default").await;
    // joins arriving while one is on its way to Redis go together
    // (sluice_admission::batch): a solution's sends land in one batch and
    // in several, on both gateways
    const SOLUTIONS: usize = 24;
    const SENDS: usize = 8;
    let mut solved = Vec::new();
    for _ in 0..SOLUTIONS {
        solved.push(Visitor::new(&a.url(), "default").solved().await);
    }
    let carried = "sluice_join_store_step_joins_total{room=\"default\"}";
    let steps = "sluice_join_store_steps_total{room=\"default\"}";
    let carried_before = metric(&a.url(), carried).await + metric(&b.url(), carried).await;
    let steps_before = metric(&a.url(), steps).await + metric(&b.url(), steps).await;
    let mut set = tokio::task::JoinSet::new();
    for (i, (challenge, solutions)) in solved.iter().enumerate() {
        for k in 0..SENDS {
            let base = if k % 2 == 0 { a.url() } else { b.url() };
            let body = json!({"challenge": challenge, "solutions": solutions});
            set.spawn(async move {
                // a client of its own: a connection of its own
                let res = TestClient::new()
                    .post_json(&format!("{base}/_sluice/rooms/default/join"), &[], &body)
                    .await;
                (i, res)
            });
        }
    }
    let mut seqs: Vec<Vec<u64>> = vec![Vec::new(); SOLUTIONS];
    while let Some(r) = set.join_next().await {
        let (i, res) = r.unwrap();
        assert_eq!(res.status, 201, "solution {i}: {}", res.text());
        seqs[i].push(res.json()["seq"].as_u64().unwrap());
    }
    let mut places = Vec::new();
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(s.len(), SENDS);
        assert!(s.iter().all(|q| *q == s[0]), "solution {i} got {s:?}");
        places.push(s[0]);
    }
    places.sort_unstable();
    places.dedup();
    assert_eq!(places.len(), SOLUTIONS, "two solutions shared a place");
    assert_eq!(
        settled_tail(&a.url(), "default").await,
        tail + SOLUTIONS as u64,
        "one place per solution"
    );
    // every send went to the store through a gateway's batchers (the
    // counters follow at the next tick)
    let mut sent = 0.0;
    for _ in 0..40 {
        sent = metric(&a.url(), carried).await + metric(&b.url(), carried).await - carried_before;
        if sent >= (SOLUTIONS * SENDS) as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        sent,
        (SOLUTIONS * SENDS) as f64,
        "joins through the batchers"
    );
    let stepped = metric(&a.url(), steps).await + metric(&b.url(), steps).await - steps_before;
    assert!(
        stepped >= 1.0 && stepped <= sent,
        "{stepped} steps for {sent} joins"
    );
    eprintln!("{sent} joins in {stepped} store steps");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pow_replay_across_gateways_tampering_and_oversized_counters() {
    let Some(Pair {
        redis: _redis,
        a,
        b,
        _origin,
    }) = two_gateways().await
    else {
        return;
    };
    let client = TestClient::new();

    let mut v = Visitor::new(&a.url(), "default");
    let (challenge, solutions) = v.solved().await;
    let res = v.join_with(&challenge, &solutions, "/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    let tail = settled_tail(&a.url(), "default").await;

    let join = |base: String, body: Value| {
        let client = client.clone();
        async move {
            client
                .post_json(&format!("{base}/_sluice/rooms/default/join"), &[], &body)
                .await
        }
    };
    // Replayed on the other gateway, and on the same one: the solution
    // bought one place, and a replay only ever gets that same place back
    // (what a client that lost the first answer needs), never a new one.
    let seq = v.seq.unwrap();
    for base in [b.url(), a.url()] {
        let res = join(
            base,
            json!({"challenge": challenge, "solutions": solutions}),
        )
        .await;
        assert_eq!(res.status, 201, "{}", res.text());
        assert_eq!(res.json()["seq"], seq, "{}", res.text());
    }
    assert_eq!(
        settled_tail(&a.url(), "default").await,
        tail,
        "no new place"
    );

    // A fresh solved challenge, then every way of spoiling it.
    let (fresh, good) = Visitor::new(&b.url(), "default").solved().await;
    let other = Visitor::new(&b.url(), "open").solved().await;
    let mut flipped = fresh.clone().into_bytes();
    let i = flipped.len() / 3;
    flipped[i] = if flipped[i] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let huge_list: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
    let cases: Vec<(&str, Value, &[u16])> = vec![
        (
            "challenge tampered",
            json!({"challenge": flipped, "solutions": good}),
            &[400, 403],
        ),
        (
            "another room's challenge",
            json!({"challenge": other.0, "solutions": other.1}),
            &[403],
        ),
        (
            "21-digit counter",
            json!({"challenge": fresh, "solutions": ["1".repeat(21)]}),
            &[400, 403],
        ),
        (
            "u64 overflow",
            json!({"challenge": fresh, "solutions": ["18446744073709551616"]}),
            &[400, 403],
        ),
        (
            "leading zero",
            json!({"challenge": fresh, "solutions": [format!("0{}", good[0])]}),
            &[400, 403],
        ),
        (
            "signed counter",
            json!({"challenge": fresh, "solutions": [format!("+{}", good[0])]}),
            &[400, 403],
        ),
        (
            "negative counter",
            json!({"challenge": fresh, "solutions": ["-1"]}),
            &[400, 403],
        ),
        (
            "no solutions",
            json!({"challenge": fresh, "solutions": []}),
            &[400, 403],
        ),
        (
            "too many solutions",
            json!({"challenge": fresh, "solutions": [good[0], good[0]]}),
            &[400, 403],
        ),
        (
            "10,000 solutions",
            json!({"challenge": fresh, "solutions": huge_list}),
            &[400, 403, 413],
        ),
        (
            "1,000 solutions",
            json!({"challenge": fresh, "solutions": huge_list[..1000]}),
            &[400, 403],
        ),
        (
            "counter as a number",
            json!({"challenge": fresh, "solutions": [12]}),
            &[400],
        ),
        (
            "unknown field",
            json!({"challenge": fresh, "solutions": good, "seq": 1}),
            &[400],
        ),
        (
            "2 KB challenge",
            json!({"challenge": "a".repeat(2048), "solutions": good}),
            &[400, 403],
        ),
    ];
    for (what, body, allowed) in &cases {
        let res = join(b.url(), body.clone()).await;
        assert!(
            allowed.contains(&res.status.as_u16()),
            "{what}: {} {}",
            res.status,
            res.text()
        );
        assert!(res.json()["code"].is_string(), "{what}: problem+json");
    }
    // Not JSON at all.
    let res = client
        .call(
            Method::POST,
            &format!("{}/_sluice/rooms/default/join", b.url()),
            &[("content-type", "application/json")],
            body("{\"challenge\": "),
        )
        .await;
    assert_eq!(res.status, 400, "{}", res.text());
    let res = client
        .call(
            Method::POST,
            &format!("{}/_sluice/rooms/default/join", b.url()),
            &[("content-type", "text/plain")],
            body("x"),
        )
        .await;
    assert_4xx(&res, "text/plain body");

    // None of it took a place; the untouched solution still does, once.
    assert_eq!(settled_tail(&b.url(), "default").await, tail);
    let res = join(b.url(), json!({"challenge": fresh, "solutions": good})).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let first = res.json()["seq"].clone();
    let res = join(a.url(), json!({"challenge": fresh, "solutions": good})).await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["seq"], first, "the same place, not a new one");
    assert_eq!(settled_tail(&a.url(), "default").await, tail + 1);
    a.shutdown().await;
    b.shutdown().await;
}

// === headers ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sluice_headers_and_forwarded_for_never_reach_the_origin() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None).await;
    let mut v = Visitor::new(&gw.url(), "open");
    v.join("/echo/open").await;
    assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
    let token = v.admission_token.clone().unwrap();
    let cookie = format!("sluice_a_open={token}");
    let res = TestClient::new()
        .get(
            &format!("{}/echo/open", gw.url()),
            &[
                ("cookie", &cookie),
                ("sluice-admission", "forged.token.here"),
                ("Sluice-Command", "revoke"),
                ("sluice-seq", "1"),
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-proto", "https"),
                ("forwarded", "for=6.6.6.6;proto=https"),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let h = &res.json()["headers"];
    assert_eq!(h["sluice-admission"].as_array().unwrap().len(), 1, "{h}");
    assert_eq!(h["sluice-admission"][0], token.as_str());
    assert!(h.get("sluice-command").is_none(), "{h}");
    assert!(h.get("sluice-seq").is_none(), "{h}");
    assert_eq!(h["x-forwarded-for"][0], "127.0.0.1", "{h}");
    assert_eq!(h["x-forwarded-proto"][0], "http", "{h}");
    assert!(!h["forwarded"][0].as_str().unwrap().contains("6.6.6.6"));
    // The forged revoke did not end the session.
    let res = v.get_admitted("/echo/open").await;
    assert_eq!(res.status, 200);
    gw.shutdown().await;
}

// === framing ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_smuggling_shapes_are_refused_or_closed() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .spawn()
        .await;
    let smuggled = "GET /echo/SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n";
    let shapes: Vec<(&str, String)> = vec![
        (
            "CL.TE",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "TE.CL",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\n{smuggled}\r\n0\r\n\r\n"
            ),
        ),
        (
            "duplicate differing Content-Length",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: {}\r\n\r\n{smuggled}",
                smuggled.len()
            ),
        ),
        (
            "Content-Length list",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0, {}\r\n\r\n{smuggled}",
                smuggled.len()
            ),
        ),
        (
            "obfuscated Transfer-Encoding",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nContent-Length: 0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "Transfer-Encoding not ending in chunked",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "bad chunk size",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "chunk size overflow",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nhello\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "space before colon",
            format!("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\nhello{smuggled}"),
        ),
        (
            "signed Content-Length",
            format!("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: +0\r\n\r\n{smuggled}"),
        ),
        (
            "Transfer-Encoding folded over two lines",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 0\r\n\r\n{smuggled}"
            ),
        ),
    ];
    for (what, bytes) in &shapes {
        let before = origin.requests();
        let text = raw(gw.addr, bytes.as_bytes(), Duration::from_secs(2)).await;
        let codes = statuses(&text);
        assert!(
            !text.contains("SMUGGLED"),
            "{what}: the smuggled request reached the origin: {text}"
        );
        assert!(
            codes.iter().all(|c| (200..500).contains(c)),
            "{what}: {codes:?} {text}"
        );
        // At most the one outer request went upstream, never a second.
        let seen = origin.requests() - before;
        assert!(seen <= 1, "{what}: the origin saw {seen} requests: {text}");
        if seen == 1 {
            // Accepted as one request: then the framing was unambiguous and
            // exactly one response came back.
            assert!(codes.len() <= 1, "{what}: {codes:?}");
        }
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_bodies_are_refused() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None).await;
    let before = origin.requests();
    let tail = settled_tail(&gw.url(), "default").await;

    // A 100 KB header, and 200 headers: 431, 400 or closed.
    let big = format!(
        "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let many = format!(
        "GET /echo HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    for (what, req) in [("100 KB header", big), ("200 headers", many)] {
        let text = raw(gw.addr, req.as_bytes(), Duration::from_secs(3)).await;
        let codes = statuses(&text);
        assert!(
            codes.is_empty() || codes.iter().all(|c| [400, 431].contains(c)),
            "{what}: {codes:?}"
        );
    }

    // A 1 MB body on every control endpoint that takes one: 413 (or 401 where
    // authentication comes first, or a closed connection), never 5xx, never
    // read whole.
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let huge = format!("{{\"challenge\": \"{}\"}}", "a".repeat(1024 * 1024));
    for (method, path, auth) in [
        ("POST", "/_sluice/rooms/default/join", None),
        ("PATCH", "/_sluice/admin/rooms/default", Some(&admin)),
        ("PUT", "/_sluice/admin/events/demo", Some(&admin)),
        ("POST", "/_sluice/events/demo/holds", None),
        ("POST", "/_sluice/webhooks/payment", None),
    ] {
        let auth_line = auth
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth_line}Content-Length: {}\r\n\r\n{huge}",
            huge.len()
        );
        let text = raw(gw.addr, req.as_bytes(), Duration::from_secs(3)).await;
        let codes = statuses(&text);
        assert!(
            codes.iter().all(|c| (400..500).contains(c)),
            "{path}: {codes:?} {}",
            text.get(..300).unwrap_or(&text)
        );
        if auth.is_some() || path.ends_with("/join") {
            assert_eq!(codes, [413], "{path}");
            assert!(text.contains("body_too_large"), "{path}");
        }
    }
    assert_eq!(origin.requests(), before);
    assert_eq!(settled_tail(&gw.url(), "default").await, tail);
    gw.shutdown().await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| c.timeouts.header_read = Duration::from_millis(700))
        .spawn()
        .await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /_sluice/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // Keep-alive, then silence: the next head never comes.
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(5) {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(_)) => continue, // a 408 is fine; then the close
            Err(_) => break,
        }
    }
    assert!(closed, "idle keep-alive connection still open after 5 s");
    assert!(started.elapsed() < Duration::from_secs(4));
    gw.shutdown().await;
}

// === redirects, traversal, injection ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_redirects_never_leave_the_site() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None).await;
    let base = gw.url();
    let evil = [
        "https://evil.example/",
        "http://evil.example",
        "//evil.example/x",
        "///evil.example",
        "/\\evil.example",
        "\\\\evil.example",
        "/\\/evil.example",
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "evil.example",
        "/\t/evil.example",
        "/\r\nLocation: https://evil.example",
        " //evil.example",
        "/_sluice/admin/rooms",
    ];
    // Waiting visitors with evil return URLs, admitted once the rate opens.
    let mut waiting = Vec::new();
    for e in evil {
        let mut v = Visitor::new(&base, "default");
        let res = v.join(e).await;
        assert_eq!(res.status, 201, "{e}: {}", res.text());
        waiting.push((e, v));
    }
    // And visitors admitted at once by the open room.
    for e in evil {
        let mut v = Visitor::new(&base, "open");
        let res = v.join(e).await;
        assert!(res.status.is_success(), "{}", res.text());
        if res.json()["state"] == "admitted" {
            assert_eq!(res.json()["return_to"], "/", "{e}");
        }
        assert!(v.wait_admitted(Duration::from_secs(10), 100).await);
        let res = v.status().await;
        if res.status == 200 && res.json()["state"] == "admitted" {
            assert_eq!(res.json()["return_to"], "/", "{e}");
        }
    }
    let res = admin_patch(
        &base,
        "default",
        json!({"rate_per_sec": 1000.0, "burst": 100.0}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    for (e, mut v) in waiting {
        assert!(v.wait_admitted(Duration::from_secs(10), 100).await, "{e}");
        let res = v.status().await;
        assert_eq!(res.json()["state"], "admitted");
        assert_eq!(res.json()["return_to"], "/", "{e}");
    }
    // The page's data-return-to, for requests whose target is off-site.
    let res = admin_patch(&base, "default", json!({"rate_per_sec": 0.0, "burst": 1.0})).await;
    assert_eq!(res.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for target in [
        "//evil.example/x",
        "/\\evil.example",
        "//evil.example/%2F..",
    ] {
        let req = format!(
            "GET {target} HTTP/1.1\r\nHost: x\r\nAccept: text/html\r\nConnection: close\r\n\r\n"
        );
        let text = raw(gw.addr, req.as_bytes(), Duration::from_secs(2)).await;
        let codes = statuses(&text);
        assert!(codes.iter().all(|c| *c < 500), "{target}: {codes:?}");
        if let Some(i) = text.find("data-return-to=\"") {
            let rest = &text[i + 16..];
            let value = &rest[..rest.find('"').unwrap()];
            assert_eq!(value, "/", "{target}");
        }
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn static_path_traversal_is_404() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None).await;
    let before = origin.requests();
    for target in [
        "/_sluice/static/..%2f..%2fetc%2fpasswd",
        "/_sluice/static/..%2F..%2F..%2FCargo.toml",
        "/_sluice/static/%2e%2e/%2e%2e/etc/passwd",
        "/_sluice/static/../../etc/passwd",
        "/_sluice/static/..\\..\\etc\\passwd",
        "/_sluice/static/waiting.js%00.html",
        "/_sluice/static/%2fetc%2fpasswd",
        "/_sluice/static//etc/passwd",
        "/_sluice/static/.%2e/.%2e/etc/passwd",
        "/_sluice/static/WAITING.JS",
        "/_sluice/static/",
    ] {
        let req = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let text = raw(gw.addr, req.as_bytes(), Duration::from_secs(2)).await;
        let codes = statuses(&text);
        // A spelling that climbs out of /_sluice/ is the origin path it
        // resolves to (API.md, canonical targets): the room guards it, so
        // it gets the waiting room; never a file of the gateway's.
        let waiting = codes == [503] && text.contains("waiting_room_active");
        assert!(
            codes == [404] || codes == [400] || waiting,
            "{target}: {codes:?} {text}"
        );
        assert!(!text.contains("root:"), "{target}");
        assert!(!text.contains("[workspace]"), "{target}");
    }
    // Nothing reached the origin: what resolved out of /_sluice/ is guarded.
    assert_eq!(origin.requests(), before);
    gw.shutdown().await;
}

#[tokio::test]
async fn room_names_and_page_values_are_never_reflected_unescaped() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None).await;
    let client = TestClient::new();
    let base = gw.url();
    for name in [
        "%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E",
        "'%3E%3Csvg%2Fonload%3Dalert(1)%3E",
        "..%2F..%2Fadmin",
        "a%00b",
        &"x".repeat(5000),
    ] {
        for (method, suffix) in [
            (Method::GET, "/status"),
            (Method::POST, "/challenge"),
            (Method::POST, "/join"),
            (Method::GET, ""),
        ] {
            let res = client
                .call(
                    method.clone(),
                    &format!("{base}/_sluice/rooms/{name}{suffix}"),
                    &[("content-type", "application/json")],
                    body("{}"),
                )
                .await;
            // a name no origin reads one way (a NUL) is refused before
            // routing (API.md, canonical targets); any other is no room
            let refused = res.status == 400 && res.json()["code"] == "malformed_request";
            assert!(
                res.status == 404 || (refused && name.contains("%00")),
                "{name}{suffix}: {}",
                res.text()
            );
            assert_eq!(
                res.header("content-type"),
                Some("application/problem+json"),
                "{name}{suffix}"
            );
            let t = res.text();
            assert!(!t.contains('<') && !t.contains("onerror"), "{name}: {t}");
        }
    }
    // The page: a request target full of markup comes back escaped (or is
    // refused outright by the HTTP parser).
    let target = "/x?a=\"><script>alert(1)</script>&b='onmouseover='alert(1)";
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: x\r\nAccept: text/html\r\nAccept-Language: fr\"><script>alert(2)</script>\r\nConnection: close\r\n\r\n"
    );
    let text = raw(gw.addr, req.as_bytes(), Duration::from_secs(2)).await;
    let codes = statuses(&text);
    assert!(codes == [200] || codes == [400], "{codes:?}");
    assert!(!text.contains("<script>alert"), "{text}");
    assert!(!text.contains("'onmouseover='"), "{text}");
    if codes == [200] {
        assert!(text.contains("content-security-policy"), "{text}");
        assert!(text.contains("&quot;&gt;&lt;script&gt;"), "{text}");
    }
    gw.shutdown().await;
}

// === admin ===

#[tokio::test]
async fn admin_brute_force_is_401_then_429_without_comparing() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = gateway(&origin, &keys, None).await;
    let client = TestClient::new();
    let url = format!("{}/_sluice/admin/rooms/default", gw.url());
    // The right token works before any failure.
    let ok = format!("Bearer {ADMIN_TOKEN}");
    assert_eq!(
        client.get(&url, &[("authorization", &ok)]).await.status,
        200
    );
    let near = format!("Bearer {}", &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1]);
    let longer = format!("Bearer {ADMIN_TOKEN}x");
    let lower = format!("bearer {ADMIN_TOKEN}");
    let guesses = [
        "Bearer wrong".to_owned(),
        near,
        longer,
        lower,
        "Basic YWRtaW46YWRtaW4=".to_owned(),
        "Bearer ".to_owned(),
        format!("Bearer {}", "a".repeat(8000)),
    ];
    for i in 0..ADMIN_FAILURES_PER_MIN as usize {
        let g = &guesses[i % guesses.len()];
        let res = client.get(&url, &[("authorization", g)]).await;
        assert_eq!(res.status, 401, "guess {i}: {}", res.text());
        assert_eq!(res.json()["code"], "unauthorized");
    }
    // Over the limit: 429 with Retry-After, even for the right token (a
    // guess made now is not even compared), on every admin path.
    for auth in [&guesses[0], &ok] {
        let res = client.get(&url, &[("authorization", auth)]).await;
        assert_eq!(res.status, 429, "{}", res.text());
        assert_eq!(res.json()["code"], "rate_limited");
        let wait: u64 = res.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
    }
    let res = client
        .get(&format!("{}/metrics", gw.url()), &[("authorization", &ok)])
        .await;
    assert_eq!(res.status, 429);
    // Visitors are not affected.
    let res = client
        .get(&format!("{}/_sluice/rooms/default", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    gw.shutdown().await;
}

/// Guesses spread over two gateways on one Redis get the network's budget
/// once (plus the failure at each gateway that finds it spent), not once
/// per gateway: with each gateway's own count alone, as it once was, they
/// got 2 × `ADMIN_FAILURES_PER_MIN` guesses compared.
#[tokio::test]
async fn admin_guesses_through_two_gateways_get_the_budget_of_one() {
    let Some(Pair {
        redis,
        a,
        b,
        _origin,
    }) = two_gateways().await
    else {
        return;
    };
    let client = TestClient::new();
    let urls = [a.url(), b.url()].map(|u| format!("{u}/_sluice/admin/rooms/default"));
    let started = Instant::now();
    let mut compared = 0;
    let mut blocked = [false, false];
    for i in 0..4 * ADMIN_FAILURES_PER_MIN as usize {
        if blocked == [true, true] {
            break;
        }
        // alternate between the gateways, past a blocked one
        let g = if blocked[i % 2] { 1 - i % 2 } else { i % 2 };
        let res = client
            .get(&urls[g], &[("authorization", "Bearer wrong")])
            .await;
        match res.status.as_u16() {
            401 => compared += 1,
            429 => blocked[g] = true,
            s => panic!("guess {i}: {s} {}", res.text()),
        }
    }
    assert_eq!(blocked, [true, true], "{compared} guesses compared");
    // the bucket refills at ADMIN_FAILURES_PER_MIN a minute meanwhile
    let refilled = started.elapsed().as_secs() as usize * ADMIN_FAILURES_PER_MIN as usize / 60 + 1;
    let budget = ADMIN_FAILURES_PER_MIN as usize;
    assert!(
        compared >= budget && compared <= budget + 2 + refilled,
        "{compared} guesses compared, the budget is {budget}"
    );
    // blocked at both: even the right token waits, uncompared
    let ok = format!("Bearer {ADMIN_TOKEN}");
    for url in &urls {
        let res = client.get(url, &[("authorization", &ok)]).await;
        assert_eq!(res.status, 429, "{}", res.text());
        assert!(res.header("retry-after").is_some());
    }
    // the store holds a digest of the network, no address
    let keys = redis.command("KEYS *admin.*");
    assert!(keys.contains("admin."), "no shared bucket: {keys}");
    assert!(!keys.contains("127.0"), "an address in the store: {keys}");
    a.shutdown().await;
    b.shutdown().await;
}

// === cookies ===

fn set_cookies(res: &Answer) -> Vec<String> {
    res.headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

fn assert_flags(cookie: &str, secure: bool) {
    for flag in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(cookie.contains(flag), "{flag} missing: {cookie}");
    }
    assert_eq!(cookie.contains("Secure"), secure, "{cookie}");
    // Over https the name carries the __Host- prefix (this host only, no
    // Domain), over plain HTTP never.
    assert_eq!(cookie.starts_with("__Host-sluice_"), secure, "{cookie}");
    assert!(!cookie.contains("Domain"), "{cookie}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_carry_their_flags_and_secure_only_behind_trusted_tls() {
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let trusted = {
        let keys = keys.clone();
        TestGateway::builder()
            .origin(origin.url())
            .config(move |c| {
                c.keys_dir = Some(keys);
                c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
                c.rooms = vec![
                    room("default", 0.0, &[]),
                    room("open", 1000.0, &["/echo/open"]),
                ];
            })
            .spawn()
            .await
    };
    let untrusted = gateway(&origin, &keys, None).await;
    let client = TestClient::new();
    for (gw, secure) in [(&trusted, true), (&untrusted, false)] {
        let base = gw.url();
        for room_id in ["default", "open"] {
            let (challenge, solutions) = Visitor::new(&base, room_id).solved().await;
            let res = client
                .post_json(
                    &format!("{base}/_sluice/rooms/{room_id}/join"),
                    &[
                        ("x-forwarded-proto", "https"),
                        ("x-forwarded-for", "203.0.113.9"),
                    ],
                    &json!({"challenge": challenge, "solutions": solutions}),
                )
                .await;
            assert!(res.status.is_success(), "{}", res.text());
            let cookies = set_cookies(&res);
            assert!(!cookies.is_empty());
            for c in &cookies {
                assert!(
                    c.trim_start_matches("__Host-").starts_with("sluice_"),
                    "{c}"
                );
                assert_flags(c, secure);
            }
        }
        // The page's passthrough cookie (gate) too: the open room admits at
        // once when nobody waits.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let res = client
            .get(
                &format!("{base}/echo/open"),
                &[("x-forwarded-proto", "https"), ("accept", "text/html")],
            )
            .await;
        for c in set_cookies(&res) {
            assert_flags(&c, secure);
        }
    }
    trusted.shutdown().await;
    untrusted.shutdown().await;
}
