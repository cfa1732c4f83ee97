//! Enqueue tokens verified with the origin's JWKS fetched by URL
//! (`[rooms.enqueue] jwks_url`), end to end: the origin publishes its
//! keys over HTTPS (a test CA, a loopback port), a gateway fetches them,
//! and joins carry EdDSA tokens.
//!
//! As a hostile client and a failing origin would try it:
//! - tokens naming made-up key ids, many of them: refused, and the
//!   gateway fetches the JWKS at most once per `jwks_retry` for all of
//!   them (a client cannot make it hammer the origin);
//! - a key of the right id but another secret, HS256 where only the JWKS
//!   is trusted: refused, no place taken;
//! - the origin rotates its key: the new key verifies at once (one early
//!   fetch), the removed one stops verifying;
//! - the origin's JWKS goes down: the keys fetched before keep verifying
//!   (an outage is no revocation);
//! - a gateway that never got the JWKS answers 503
//!   `enqueue_keys_unavailable` with `Retry-After`, takes nothing, and
//!   verifies once the origin is back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use sluice_gateway::config::RoomConfig;
use sluice_gateway::config::room::EnqueueConfig;
use sluice_tests::TestGateway;
use sluice_tests::client::{Answer, TestClient};
use sluice_tests::crawler::KeyDirectory;
use sluice_tests::origin::TestOrigin;
use sluice_tests::tls::TestCa;

const ROOM: &str = "shop";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// PKCS#8 v1 DER of an Ed25519 seed (RFC 8410).
fn pkcs8(seed: &[u8; 32]) -> Vec<u8> {
    let mut der = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(seed);
    der
}

/// An EdDSA token of `sub` for the room, signed with `seed` under `kid`.
fn eddsa(kid: &str, seed: u8, sub: &str) -> String {
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = Some(kid.into());
    let claims = json!({"sub": sub, "aud": ROOM, "exp": now() + 60});
    encode(&h, &claims, &EncodingKey::from_ed_der(&pkcs8(&[seed; 32]))).unwrap()
}

/// The public JWK of `seed` under `kid`.
fn jwk(kid: &str, seed: u8) -> Value {
    let public = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]).verifying_key();
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public.as_bytes());
    json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": x, "alg": "EdDSA", "use": "sig"})
}

/// The origin's JWKS: `keys`, beside an RSA key for something else (the
/// gateway skips it).
fn jwks(keys: &[Value]) -> Value {
    let mut all = vec![json!({"kty": "RSA", "kid": "rsa-for-the-api", "n": "AQAB", "e": "AQAB"})];
    all.extend(keys.iter().cloned());
    json!({ "keys": all })
}

/// A gateway whose room `shop` trusts only the JWKS at `origin_keys`
/// (refetched early at most once a second), lets the first visitor
/// through and queues the rest.
async fn gateway(origin: &TestOrigin, ca: &TestCa, origin_keys: &KeyDirectory) -> TestGateway {
    let (url, ca) = (origin_keys.jwks_url(), ca.cert.clone());
    TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.pow_secret = Some("enqueue-jwks-test-pow-secret-0123456789".into());
            c.rooms = vec![RoomConfig {
                id: ROOM.into(),
                puzzles: 1,
                difficulty_floor_bits: 1,
                difficulty_ceiling_bits: 2,
                join_limit_per_prefix_per_min: 0,
                attack_min_solve: Duration::ZERO,
                rate_per_sec: 0.01,
                burst: 1.0,
                enqueue: EnqueueConfig {
                    jwks_url: Some(url),
                    jwks_ca: Some(ca),
                    jwks_retry: Duration::from_secs(1),
                    ..EnqueueConfig::default()
                },
                ..RoomConfig::default()
            }];
        })
        .spawn()
        .await
}

async fn tail(base: &str) -> u64 {
    sluice_tests::admin_room(base, ROOM).await["tail"]
        .as_u64()
        .unwrap()
}

/// A join with a solved challenge and `token`.
async fn join(base: &str, token: &str) -> Answer {
    let c = TestClient::new()
        .post_json(
            &format!("{base}/_sluice/rooms/{ROOM}/challenge"),
            &[],
            &json!({}),
        )
        .await;
    let mut req = sluice_tests::visitor::join_body(&c, "/").await;
    req["enqueue_token"] = json!(token);
    TestClient::new()
        .post_json(&format!("{base}/_sluice/rooms/{ROOM}/join"), &[], &req)
        .await
}

/// A join with a garbage proof of work: the token is judged first.
async fn garbage_join(base: &str, token: &str) -> Answer {
    let req = json!({"challenge": "a.b", "solutions": ["1"], "enqueue_token": token});
    TestClient::new()
        .post_json(&format!("{base}/_sluice/rooms/{ROOM}/join"), &[], &req)
        .await
}

fn invalid(res: &Answer, reason: &str) {
    assert_eq!(res.status, 401, "{}", res.text());
    let v = res.json();
    assert_eq!(v["code"], "enqueue_token_invalid", "{v}");
    assert_eq!(v["reason"], reason, "{v}");
}

fn seq(res: &Answer) -> u64 {
    assert!(res.status.is_success(), "{}", res.text());
    res.json()["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("no seq: {}", res.text()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origins_jwks_is_fetched_rotated_and_rationed() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let keys = KeyDirectory::start(&ca, &[]).await;
    keys.serve_json(&jwks(&[jwk("k1", 1)]));
    let gw = gateway(&origin, &ca, &keys).await;
    let base = gw.url();

    // the first visitor takes the room's passthrough; alice then waits,
    // her place bound to her account by a token of the origin's key
    let first = join(&base, &eddsa("k1", 1, "zed")).await;
    assert_eq!(first.json()["state"], "admitted", "{}", first.text());
    let alice = seq(&join(&base, &eddsa("k1", 1, "alice")).await);
    assert_eq!(
        seq(&garbage_join(&base, &eddsa("k1", 1, "alice")).await),
        alice,
        "a second device of alice's gets her place"
    );
    let t0 = tail(&base).await;

    // forgeries: the right kid with another key, HS256 (not trusted
    // here), no kid at all
    invalid(
        &garbage_join(&base, &eddsa("k1", 2, "mallory")).await,
        "bad_signature",
    );
    let hs = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "mallory", "aud": ROOM, "exp": now() + 60}),
        &EncodingKey::from_secret(b"a-secret-nobody-configured-32-bytes-long").unwrap(),
    )
    .unwrap();
    invalid(&garbage_join(&base, &hs).await, "algorithm");
    let no_kid = encode(
        &Header::new(Algorithm::EdDSA),
        &json!({"sub": "mallory", "aud": ROOM, "exp": now() + 60}),
        &EncodingKey::from_ed_der(&pkcs8(&[1; 32])),
    )
    .unwrap();
    invalid(&garbage_join(&base, &no_kid).await, "unknown_key");

    // made-up key ids, many and at once: each refused, and the origin
    // sees at most one early fetch for all of them
    let fetched = keys.fetches();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..40 {
        let base = base.clone();
        set.spawn(
            async move { garbage_join(&base, &eddsa(&format!("made-up-{i}"), 3, "m")).await },
        );
    }
    while let Some(res) = set.join_next().await {
        invalid(&res.unwrap(), "unknown_key");
    }
    assert!(
        keys.fetches() <= fetched + 1,
        "40 made-up key ids made {} fetches",
        keys.fetches() - fetched
    );
    assert_eq!(tail(&base).await, t0, "no place taken by a refused token");

    // rotation: k2 in, k1 out. After `jwks_retry` the first token of k2
    // waits for one early fetch and verifies.
    keys.serve_json(&jwks(&[jwk("k2", 2)]));
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let bob = seq(&join(&base, &eddsa("k2", 2, "bob")).await);
    assert_ne!(bob, alice);
    invalid(
        &garbage_join(&base, &eddsa("k1", 1, "carol")).await,
        "unknown_key",
    );

    // an outage of the origin's JWKS revokes nothing: k2 keeps verifying
    keys.set_failing(true);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    invalid(
        &garbage_join(&base, &eddsa("k3", 3, "dave")).await,
        "unknown_key",
    );
    assert_eq!(
        seq(&garbage_join(&base, &eddsa("k2", 2, "bob")).await),
        bob,
        "bob's place, verified with the keys fetched before the outage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_the_jwks_says_so_and_takes_nothing() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let keys = KeyDirectory::start(&ca, &[]).await;
    keys.serve_json(&jwks(&[jwk("k1", 1)]));
    keys.set_failing(true);
    let gw = gateway(&origin, &ca, &keys).await;
    let base = gw.url();
    let t0 = tail(&base).await;

    let res = garbage_join(&base, &eddsa("k1", 1, "alice")).await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(
        res.json()["code"],
        "enqueue_keys_unavailable",
        "{}",
        res.text()
    );
    let retry: u64 = res
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    // a token of an algorithm the room does not trust is still refused
    // as such: only EdDSA waits for the keys
    let hs = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice", "aud": ROOM, "exp": now() + 60}),
        &EncodingKey::from_secret(b"a-secret-nobody-configured-32-bytes-long").unwrap(),
    )
    .unwrap();
    invalid(&garbage_join(&base, &hs).await, "algorithm");
    assert_eq!(
        tail(&base).await,
        t0,
        "nothing taken while the keys are missing"
    );

    // the origin is back: after `jwks_retry` the token verifies
    keys.set_failing(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let res = join(&base, &eddsa("k1", 1, "alice")).await;
        if res.status.is_success() {
            break;
        }
        assert_eq!(res.status, 503, "{}", res.text());
        assert!(
            std::time::Instant::now() < deadline,
            "the JWKS was never fetched once the origin was back"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
