//! The visitor's whole path through the JSON API alone (no browser):
//! challenge, solve, join, poll, admission, the guarded origin, a hold, the
//! payment webhook, the confirmation — on the in-memory stores and on a
//! real Redis.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use http::Method;
use serde_json::json;
use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_gateway::reserve::sign_webhook;
use sluice_tests::client::{TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway, TestGatewayBuilder};

const WEBHOOK_SECRET: &str = "whsec-test-0123456789";

/// A room at `rate`/s with burst 1 and an easy proof of work (k = 2,
/// b = 6) so tests solve in microseconds; event `demo` of 100 units.
fn builder(origin: &TestOrigin, rate: f64) -> TestGatewayBuilder {
    TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.webhook_secret = Some(WEBHOOK_SECRET.into());
            c.rooms = vec![RoomConfig {
                rate_per_sec: rate,
                burst: 1.0,
                puzzles: 2,
                difficulty_floor_bits: 6,
                difficulty_ceiling_bits: 8,
                join_limit_per_prefix_per_min: 0,
                ..RoomConfig::default()
            }];
            c.events = vec![EventConfig {
                total: 100,
                ..EventConfig::default()
            }];
        })
}

/// Spends the room's one credit, so the next visitor has to queue.
async fn spend_credit(gw: &TestGateway) {
    let mut first = Visitor::new(&gw.url(), "default");
    let res = first.join("/").await;
    assert!(res.status.is_success(), "{}", res.text());
}

async fn whole_path(gw: &TestGateway) {
    let client = TestClient::new();
    // Fill the bucket's one credit so the visitor under test must queue.
    let mut first = Visitor::new(&gw.url(), "default");
    let res = first.join("/").await;
    assert!(res.status.is_success(), "{}", res.text());

    let mut v = Visitor::new(&gw.url(), "default");
    let res = v.join("/echo/deep?x=1").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.header("cache-control"), Some("no-store"));
    let j = res.json();
    assert_eq!(j["state"], "waiting");
    assert!(j["position"].as_u64().unwrap() >= 1);
    assert!(j["poll_after_ms"].as_u64().unwrap() >= 500);
    assert!(
        res.header("set-cookie")
            .unwrap()
            .contains("sluice_q_default=")
    );
    let seq = v.seq.unwrap();

    // Without a token the origin is out of reach for a JSON client.
    let res = client
        .get(
            &format!("{}/echo/deep", gw.url()),
            &[("accept", "application/json")],
        )
        .await;
    assert_eq!(res.status, 503);
    assert_eq!(res.json()["code"], "waiting_room_active");
    assert!(res.header("retry-after").is_some());
    assert_eq!(res.json()["join_url"], "/_sluice/rooms/default/join");

    assert!(
        v.wait_admitted(Duration::from_secs(20), 300).await,
        "never admitted"
    );
    let res = v.status().await;
    let j = res.json();
    assert_eq!(j["state"], "admitted");
    assert_eq!(j["return_to"], "/echo/deep?x=1");
    assert!(
        res.header("set-cookie")
            .unwrap()
            .contains("sluice_a_default=")
    );
    // the same seq again: a second status claims nothing new
    assert_eq!(v.seq, Some(seq));

    // The origin now sees the visitor, with the gateway's own header.
    let res = v.get_admitted("/echo/deep?x=1").await;
    assert_eq!(res.status, 200, "{}", res.text());
    let seen = res.json();
    assert_eq!(seen["query"], "x=1");
    let forwarded = seen["headers"]["sluice-admission"][0].as_str().unwrap();
    assert_eq!(forwarded.split('.').count(), 3);

    // Buy: event, hold, pay, confirmation.
    let res = v
        .call_admitted(Method::GET, "/_sluice/events/demo", None, &[])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["available"], 100);
    assert_eq!(res.json()["cart_limit"], 4);
    let res = v
        .call_admitted(
            Method::POST,
            "/_sluice/events/demo/holds",
            Some(json!({"qty": 2})),
            &[("idempotency-key", "cart-1")],
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hold = res.json();
    assert_eq!(hold["status"], "held");
    assert_eq!(hold["qty"], 2);
    assert_eq!(hold["available"], 98);
    let hold_id = hold["hold_id"].as_str().unwrap().to_owned();
    // the same Idempotency-Key: the same hold, no second one
    let again = v
        .call_admitted(
            Method::POST,
            "/_sluice/events/demo/holds",
            Some(json!({"qty": 2})),
            &[("idempotency-key", "cart-1")],
        )
        .await;
    assert_eq!(again.status, 201);
    assert_eq!(again.json()["hold_id"], hold_id.as_str());

    let payment =
        json!({"payment_event_id": "pe_1", "hold_id": hold_id, "outcome": "succeeded"}).to_string();
    let t = sluice_gateway::app::now_s();
    let sig = sign_webhook(WEBHOOK_SECRET.as_bytes(), t, payment.as_bytes());
    for _ in 0..2 {
        let res = client
            .call(
                Method::POST,
                &format!("{}/_sluice/webhooks/payment", gw.url()),
                &[
                    ("sluice-signature", &sig),
                    ("content-type", "application/json"),
                ],
                body(payment.clone()),
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.json()["status"], "confirmed");
    }
    let res = v
        .call_admitted(Method::GET, &format!("/_sluice/holds/{hold_id}"), None, &[])
        .await;
    assert_eq!(res.json()["status"], "confirmed");
    let res = v
        .call_admitted(
            Method::DELETE,
            &format!("/_sluice/holds/{hold_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(res.status, 409);
    assert_eq!(res.json()["code"], "hold_confirmed");

    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let res = client
        .get(
            &format!("{}/_sluice/admin/events/demo", gw.url()),
            &[("authorization", &bearer)],
        )
        .await;
    let e = res.json();
    assert_eq!(e["total"], 100);
    assert_eq!(e["available"], 98);
    assert_eq!(e["confirmed"], 2);
    assert_eq!(e["held"], 0);
    assert_eq!(e["invariant_holds"], true);
}

#[tokio::test]
async fn json_client_walks_the_whole_path_in_memory() {
    let origin = TestOrigin::start().await;
    let gw = builder(&origin, 2.0).spawn().await;
    whole_path(&gw).await;
}

#[tokio::test]
async fn json_client_walks_the_whole_path_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gw = builder(&origin, 2.0).redis(redis.url()).spawn().await;
    whole_path(&gw).await;
}

#[tokio::test]
async fn a_place_is_kept_and_a_solution_buys_one_place_once() {
    let origin = TestOrigin::start().await;
    let gw = builder(&origin, 0.0).spawn().await;
    spend_credit(&gw).await;
    let mut v = Visitor::new(&gw.url(), "default");
    let (challenge, solutions) = v.solved().await;
    let res = v.join_with(&challenge, &solutions, "/").await;
    assert!(res.status.is_success(), "{}", res.text());
    let seq = v.seq.unwrap();

    // The answer was lost (a dropped connection): the same solution sent
    // again, without the cookie, gets the same place back — not a refusal
    // that would send the visitor to the back of the line, and not a
    // second place.
    let mut again = Visitor::new(&gw.url(), "default");
    let res = again.join_with(&challenge, &solutions, "/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["seq"], seq);
    assert_eq!(again.seq, Some(seq));
    assert!(
        res.header("set-cookie")
            .is_some_and(|c| c.starts_with("sluice_q_default=")),
        "the queue cookie comes back too"
    );
    let status = again.status().await;
    assert_eq!(status.json()["seq"], seq, "{}", status.text());
    let room = sluice_tests::admin_room(&gw.url(), "default").await;
    assert_eq!(room["tail"], seq, "no second place: {room}");

    // Joining again with the queue cookie: same seq, nothing new.
    let cookie = format!("sluice_q_default={}", v.queue_token.clone().unwrap());
    let (c2, s2) = v.solved().await;
    let res = TestClient::new()
        .post_json(
            &format!("{}/_sluice/rooms/default/join", gw.url()),
            &[("cookie", &cookie)],
            &json!({"challenge": c2, "solutions": s2}),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["seq"], seq);

    // Tampered solution, wrong room, garbage.
    let (c3, mut s3) = v.solved().await;
    s3[0] = "1".repeat(30);
    let res = Visitor::new(&gw.url(), "default")
        .join_with(&c3, &s3, "/")
        .await;
    assert!(
        matches!(
            res.json()["code"].as_str(),
            Some("pow_invalid" | "malformed_request")
        ),
        "{}",
        res.text()
    );
    let res = TestClient::new()
        .post_json(
            &format!("{}/_sluice/rooms/default/join", gw.url()),
            &[],
            &json!({"challenge": 7}),
        )
        .await;
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["code"], "malformed_request");
    let res = TestClient::new()
        .post_json(
            &format!("{}/_sluice/rooms/nope/challenge", gw.url()),
            &[],
            &json!({}),
        )
        .await;
    assert_eq!(res.status, 404);
    assert_eq!(res.json()["code"], "room_not_found");
}

#[tokio::test]
async fn status_without_or_with_bad_tokens_is_401() {
    let origin = TestOrigin::start().await;
    let gw = builder(&origin, 0.0).spawn().await;
    spend_credit(&gw).await;
    let c = TestClient::new();
    let url = format!("{}/_sluice/rooms/default/status", gw.url());
    let res = c.get(&url, &[]).await;
    assert_eq!(res.status, 401);
    assert_eq!(res.json()["code"], "token_missing");
    for bad in ["Bearer x.y.z", "Bearer eyJhbGciOiJub25lIn0.e30.", "Bearer "] {
        let res = c.get(&url, &[("authorization", bad)]).await;
        assert_eq!(res.status, 401, "{bad}");
    }
    // an admission token is not a queue token, and vice versa
    let mut v = Visitor::new(&gw.url(), "default");
    v.join("/").await;
    let q = v.queue_token.clone().unwrap();
    let cookie = format!("sluice_a_default={q}");
    let res = c
        .get(
            &format!("{}/echo", gw.url()),
            &[("cookie", &cookie), ("accept", "application/json")],
        )
        .await;
    assert_eq!(res.status, 503, "a queue token must not open the gate");
}

#[tokio::test]
async fn browsers_get_the_page_with_a_strict_policy() {
    let origin = TestOrigin::start().await;
    let gw = builder(&origin, 0.0).spawn().await;
    spend_credit(&gw).await;
    let res = TestClient::new()
        .get(
            &format!("{}/tickets/42?seat=a", gw.url()),
            &[
                ("accept", "text/html"),
                ("accept-language", "fr-FR,fr;q=0.9"),
            ],
        )
        .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.header("cache-control"), Some("no-store"));
    let csp = res.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    let html = res.text();
    assert!(html.contains("lang=\"fr\""));
    assert!(html.contains("data-return-to=\"/tickets/42?seat=a\""));
    assert!(!html.contains("<script>"), "no inline script");
    assert_eq!(
        origin.requests(),
        0,
        "the origin must not see a queued browser"
    );
    for f in [
        "waiting.js",
        "waiting.css",
        "pow-solver.js",
        "pow-worker.js",
    ] {
        let res = TestClient::new()
            .get(&format!("{}/_sluice/static/{f}", gw.url()), &[])
            .await;
        assert_eq!(res.status, 200, "{f}");
    }
    let res = TestClient::new()
        .get(&format!("{}/_sluice/static/..%2Fsecret", gw.url()), &[])
        .await;
    assert_eq!(res.status, 404);
}

#[tokio::test]
async fn jwks_publishes_the_verifying_key() {
    let origin = TestOrigin::start().await;
    let gw = builder(&origin, 0.0).spawn().await;
    let res = TestClient::new()
        .get(&format!("{}/_sluice/jwks.json", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    let k = &res.json()["keys"][0];
    assert_eq!(k["kty"], "OKP");
    assert_eq!(k["crv"], "Ed25519");
    assert_eq!(k["alg"], "EdDSA");
    assert!(k["kid"].is_string() && k["x"].is_string());
}

/// Rotating the proof-of-work secret is no flag day: a gateway signing
/// with the new secret still accepts, for their lifetime, challenges
/// issued under the one named in `pow_previous_secrets`; a gateway that
/// does not list it refuses them.
#[tokio::test]
async fn a_rotated_pow_secret_still_accepts_challenges_issued_before() {
    const OLD: &str = "pow-secret-before-rotation-0123";
    const NEW: &str = "pow-secret-after-rotation-45678";
    let origin = TestOrigin::start().await;
    let before = builder(&origin, 10.0)
        .config(|c| c.pow_secret = Some(OLD.into()))
        .spawn()
        .await;
    let rotated = builder(&origin, 10.0)
        .config(|c| {
            c.pow_secret = Some(NEW.into());
            c.pow_previous_secrets = vec![OLD.into()];
        })
        .spawn()
        .await;
    let forgot = builder(&origin, 10.0)
        .config(|c| c.pow_secret = Some(NEW.into()))
        .spawn()
        .await;

    let (old_challenge, old_solutions) = Visitor::new(&before.url(), "default").solved().await;
    let res = Visitor::new(&forgot.url(), "default")
        .join_with(&old_challenge, &old_solutions, "/")
        .await;
    assert_eq!(res.status, 403, "{}", res.text());
    assert_eq!(res.json()["code"], "pow_invalid");
    let res = Visitor::new(&rotated.url(), "default")
        .join_with(&old_challenge, &old_solutions, "/")
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    // And the rotated gateway's own challenges are signed with the new
    // secret: the gateway that never heard of the old one accepts them.
    let (new_challenge, new_solutions) = Visitor::new(&rotated.url(), "default").solved().await;
    let res = Visitor::new(&forgot.url(), "default")
        .join_with(&new_challenge, &new_solutions, "/")
        .await;
    assert!(res.status.is_success(), "{}", res.text());

    // Misconfigurations exit 64 with one line, before listening.
    let bad = |f: fn(&mut sluice_gateway::config::Config)| {
        let mut c = sluice_gateway::config::Config::default();
        f(&mut c);
        c.validate().unwrap_err().to_string()
    };
    assert!(bad(|c| c.pow_previous_secrets = vec![OLD.into()]).contains("needs pow_secret"));
    assert!(
        bad(|c| {
            c.pow_secret = Some(NEW.into());
            c.pow_previous_secrets = vec![NEW.into()];
        })
        .contains("pow_secret")
    );
    assert!(bad(|c| c.pow_secret = Some("short".into())).contains("16 bytes"));
    assert!(
        bad(|c| {
            c.pow_secret = Some(NEW.into());
            c.pow_previous_secrets = vec![OLD.into(), "x".repeat(16), "y".repeat(16)];
        })
        .contains("at most two")
    );
}
