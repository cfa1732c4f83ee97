//! Enqueue tokens (issue 22): one place per account per room, end to end
//! over HTTP, in memory and on a real `redis-server` shared by two
//! gateways.
//!
//! The origin signs its logged-in visitor a short-lived token (HS256 with
//! a shared secret, or EdDSA with a key of its JWKS). A hostile client
//! tries no token, a forged one, an expired one, a long-lived one,
//! another room's, one signed with an algorithm or key the room does not
//! trust, garbage: each is refused before any work is looked at (the
//! join's proof of work is garbage too, and the answer is still the
//! token's), no place taken. An account joining from many devices at once
//! through two gateways gets one place, the same for every device.
//!
//! The Redis test skips loudly when `redis-server` is missing (a failure
//! under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use http::Method;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use sluice_gateway::config::RoomConfig;
use sluice_gateway::config::room::EnqueueConfig;
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::{ADMIN_TOKEN, TestGateway};

const SECRET: &str = "the-origin-and-sluice-share-this-32+-byte-secret";
/// The Ed25519 seed of the origin's JWKS key `origin-1`.
const SEED: [u8; 32] = [7; 32];

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hs256(claims: Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// A token of `sub` for `room`, valid a minute.
fn token(room: &str, sub: &str) -> String {
    hs256(json!({"sub": sub, "aud": room, "exp": now() + 60, "iat": now()}))
}

/// PKCS#8 v1 DER of the Ed25519 seed (RFC 8410).
fn pkcs8(seed: &[u8; 32]) -> Vec<u8> {
    let mut der = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(seed);
    der
}

fn eddsa(kid: &str, seed: &[u8; 32], claims: Value) -> String {
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = Some(kid.into());
    encode(&h, &claims, &EncodingKey::from_ed_der(&pkcs8(seed))).unwrap()
}

/// The origin's JWKS, written to a file of the test's own.
fn jwks_file() -> std::path::PathBuf {
    let key = ed25519_dalek::SigningKey::from_bytes(&SEED);
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
    let dir = std::env::temp_dir().join(format!("sluice-enqueue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("jwks.json");
    std::fs::write(
        &path,
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "origin-1", "alg": "EdDSA", "use": "sig"}]})
            .to_string(),
    )
    .unwrap();
    path
}

/// `members`: tokens required (HS256); `shop`: tokens optional, from the
/// origin's JWKS. Both let the first visitor through and queue the rest.
fn rooms() -> Vec<RoomConfig> {
    let easy = RoomConfig {
        puzzles: 1,
        difficulty_floor_bits: 1,
        difficulty_ceiling_bits: 2,
        join_limit_per_prefix_per_min: 0,
        attack_min_solve: Duration::ZERO,
        rate_per_sec: 0.01,
        burst: 1.0,
        ..RoomConfig::default()
    };
    vec![
        RoomConfig {
            id: "members".into(),
            paths: vec!["/members".into()],
            enqueue: EnqueueConfig {
                required: true,
                hmac_secret: Some(SECRET.into()),
                ..EnqueueConfig::default()
            },
            ..easy.clone()
        },
        RoomConfig {
            id: "shop".into(),
            enqueue: EnqueueConfig {
                jwks_file: Some(jwks_file()),
                ..EnqueueConfig::default()
            },
            ..easy
        },
    ]
}

async fn gateway(origin: &TestOrigin, redis: Option<&RedisServer>) -> TestGateway {
    let mut b = TestGateway::builder().origin(origin.url()).config(|c| {
        c.rooms = rooms();
        c.pow_secret = Some("enqueue-test-pow-secret-0123456789abcdef".into());
    });
    if let Some(r) = redis {
        b = b.redis(r.url());
    }
    b.spawn().await
}

async fn tail(base: &str, room: &str) -> u64 {
    let res = TestClient::new()
        .call(
            Method::GET,
            &format!("{base}/_sluice/admin/rooms/{room}"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            body(String::new()),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["tail"].as_u64().unwrap()
}

/// A solved challenge of `room`: the join body.
async fn solved(base: &str, room: &str) -> Value {
    let c = TestClient::new()
        .post_json(
            &format!("{base}/_sluice/rooms/{room}/challenge"),
            &[],
            &json!({}),
        )
        .await;
    sluice_tests::visitor::join_body(&c, "/").await
}

async fn join(base: &str, room: &str, mut req: Value, token: Option<&str>) -> Answer {
    if let Some(t) = token {
        req["enqueue_token"] = json!(t);
    }
    TestClient::new()
        .post_json(&format!("{base}/_sluice/rooms/{room}/join"), &[], &req)
        .await
}

/// A device of `sub` joining `room` at `base` with a fresh token and a
/// solved challenge: its seq.
async fn device(base: &str, room: &str, sub: &str) -> u64 {
    let req = solved(base, room).await;
    let res = join(base, room, req, Some(&token(room, sub))).await;
    assert!(res.status.is_success(), "{}", res.text());
    res.json()["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("no seq: {}", res.text()))
}

fn refused(res: &Answer, status: u16, code: &str, reason: Option<&str>) {
    assert_eq!(res.status, status, "{}", res.text());
    let v = res.json();
    assert_eq!(v["code"], code, "{v}");
    if let Some(r) = reason {
        assert_eq!(v["reason"], r, "{v}");
    }
}

async fn scenario(a: &str, b: &str) {
    let t0 = tail(a, "members").await;
    // garbage proof of work: the token is judged first
    let garbage = json!({"challenge": "a.b", "solutions": ["1"]});
    refused(
        &join(a, "members", garbage.clone(), None).await,
        403,
        "enqueue_token_required",
        None,
    );
    let other_secret = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice", "aud": "members", "exp": now() + 60}),
        &EncodingKey::from_secret(b"not-the-origin-secret-but-32-bytes-long").unwrap(),
    )
    .unwrap();
    let cases: Vec<(String, &str)> = vec![
        (other_secret, "bad_signature"),
        (
            hs256(json!({"sub": "alice", "aud": "members", "exp": now() - 10})),
            "expired",
        ),
        (
            hs256(json!({"sub": "alice", "aud": "members", "exp": now() + 86_400})),
            "too_long_lived",
        ),
        (token("shop", "alice"), "wrong_room"),
        (
            hs256(json!({"aud": "members", "exp": now() + 60})),
            "malformed",
        ),
        ("not.a.token".into(), "malformed"),
        ("garbage".into(), "malformed"),
        (
            eddsa(
                "origin-1",
                &SEED,
                json!({"sub": "alice", "aud": "members", "exp": now() + 60}),
            ),
            "algorithm",
        ),
    ];
    for (t, reason) in &cases {
        refused(
            &join(b, "members", garbage.clone(), Some(t)).await,
            401,
            "enqueue_token_invalid",
            Some(reason),
        );
    }
    assert_eq!(
        tail(a, "members").await,
        t0,
        "no place taken by a refused token"
    );

    // zed takes the room's one passthrough: the joins after it wait
    let req = solved(a, "members").await;
    let res = join(a, "members", req, Some(&token("members", "zed"))).await;
    assert_eq!(res.json()["state"], "admitted", "{}", res.text());
    let t0 = t0 + 1;

    // alice's first device takes a place; her second (another browser,
    // another gateway, a fresh token) gets the same one
    let first = device(a, "members", "alice").await;
    let second = device(b, "members", "alice").await;
    assert_eq!(first, second, "one place per account");
    // a second device needs no new work: a garbage proof still gets the
    // account's place (no place is taken by it)
    let res = join(
        b,
        "members",
        garbage.clone(),
        Some(&token("members", "alice")),
    )
    .await;
    assert!(res.status.is_success(), "{}", res.text());
    assert_eq!(res.json()["seq"].as_u64(), Some(first));
    assert_eq!(tail(b, "members").await, t0 + 1);

    // bob from eight devices at once, through both gateways: one place
    let mut reqs = Vec::new();
    for i in 0..8 {
        reqs.push(solved(if i % 2 == 0 { a } else { b }, "members").await);
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, req) in reqs.into_iter().enumerate() {
        let base = if i % 2 == 0 { a } else { b }.to_owned();
        set.spawn(async move {
            let res = join(&base, "members", req, Some(&token("members", "bob"))).await;
            assert!(res.status.is_success(), "{}", res.text());
            res.json()["seq"].as_u64().unwrap()
        });
    }
    let mut seqs = Vec::new();
    while let Some(s) = set.join_next().await {
        seqs.push(s.unwrap());
    }
    seqs.dedup();
    assert_eq!(seqs.len(), 1, "bob got places {seqs:?}");
    assert_ne!(seqs[0], first);
    assert_eq!(tail(a, "members").await, t0 + 2, "two accounts, two places");

    // the JWKS room: EdDSA with the origin's key; an unknown kid, another
    // key, HS256 (not trusted there) refused; no token is a plain join
    let claims = json!({"sub": "carol", "aud": "shop", "exp": now() + 60});
    let req = solved(a, "shop").await;
    let res = join(a, "shop", req, None).await;
    assert_eq!(
        res.json()["state"],
        "admitted",
        "the passthrough: {}",
        res.text()
    );
    let req = solved(a, "shop").await;
    let res = join(
        a,
        "shop",
        req,
        Some(&eddsa("origin-1", &SEED, claims.clone())),
    )
    .await;
    assert!(res.status.is_success(), "{}", res.text());
    let carol = res.json()["seq"].as_u64().unwrap();
    let req = solved(b, "shop").await;
    let res = join(
        b,
        "shop",
        req,
        Some(&eddsa("origin-1", &SEED, claims.clone())),
    )
    .await;
    assert_eq!(res.json()["seq"].as_u64(), Some(carol), "{}", res.text());
    for (t, reason) in [
        (eddsa("origin-2", &SEED, claims.clone()), "unknown_key"),
        (eddsa("origin-1", &[9; 32], claims.clone()), "bad_signature"),
        (token("shop", "carol"), "algorithm"),
    ] {
        refused(
            &join(a, "shop", garbage.clone(), Some(&t)).await,
            401,
            "enqueue_token_invalid",
            Some(reason),
        );
    }
    let req = solved(a, "shop").await;
    let res = join(a, "shop", req, None).await;
    assert!(
        res.status.is_success(),
        "no token, a plain join: {}",
        res.text()
    );
    assert_ne!(res.json()["seq"].as_u64(), Some(carol));
}

#[tokio::test]
async fn one_place_per_account_in_memory() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, None).await;
    scenario(&gw.url(), &gw.url()).await;
}

#[tokio::test]
async fn one_place_per_account_across_two_gateways_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let a = gateway(&origin, Some(&redis)).await;
    let b = gateway(&origin, Some(&redis)).await;
    scenario(&a.url(), &b.url()).await;
    // the account ids are not in Redis in clear
    let keys = sluice_tests::redis_server::cli(redis.port(), None, &["--scan"]);
    assert!(keys.contains(":acct:"), "{keys}");
    assert!(!keys.contains("alice") && !keys.contains("bob"), "{keys}");
}
