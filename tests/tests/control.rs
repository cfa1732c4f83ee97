//! The gateway's own endpoints: health, readiness, admin auth, errors as
//! problem+json, body limits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::Method;
use serde_json::{Value, json};
use sluice_tests::client::{TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, TestGateway};

async fn setup() -> (TestOrigin, TestGateway) {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder().origin(origin.url()).spawn().await;
    (origin, gw)
}

#[tokio::test]
async fn health_and_readiness() {
    let (origin, gw) = setup().await;
    let c = TestClient::new();
    for path in ["healthz", "readyz"] {
        let res = c.get(&format!("{}/_sluice/{path}", gw.url()), &[]).await;
        assert_eq!(res.status, 200);
        assert_eq!(res.header("cache-control"), Some("no-store"));
    }
    assert_eq!(
        origin.requests(),
        0,
        "control plane must not reach the origin"
    );
}

#[tokio::test]
async fn unknown_gateway_paths_are_problems_not_proxied() {
    let (origin, gw) = setup().await;
    let c = TestClient::new();
    let res = c.get(&format!("{}/_sluice/nope", gw.url()), &[]).await;
    assert_eq!(res.status, 404);
    assert_eq!(res.header("content-type"), Some("application/problem+json"));
    assert_eq!(res.json()["code"], "not_found");
    let res = c
        .call(
            Method::DELETE,
            &format!("{}/_sluice/healthz", gw.url()),
            &[],
            body(""),
        )
        .await;
    assert_eq!(res.status, 405);
    assert_eq!(res.json()["code"], "method_not_allowed");
    assert_eq!(origin.requests(), 0);
}

#[tokio::test]
async fn admin_requires_the_token() {
    let (_origin, gw) = setup().await;
    let c = TestClient::new();
    let url = format!("{}/_sluice/admin/rooms/default", gw.url());
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer "),
        Some(ADMIN_TOKEN),
    ] {
        let h: Vec<(&str, &str)> = auth.map(|a| vec![("authorization", a)]).unwrap_or_default();
        let res = c.get(&url, &h).await;
        assert_eq!(res.status, 401, "{auth:?}");
        assert_eq!(res.json()["code"], "unauthorized");
    }
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let res = c.get(&url, &[("authorization", &bearer)]).await;
    assert_eq!(res.status, 200);

    // a gateway without an admin token refuses everyone
    let origin = TestOrigin::start().await;
    let closed = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.admin_token = None)
        .spawn()
        .await;
    let res = c
        .get(
            &format!("{}/_sluice/admin/rooms/default", closed.url()),
            &[("authorization", &bearer)],
        )
        .await;
    assert_eq!(res.status, 401);
}

#[tokio::test]
async fn admin_patch_rate_and_burst() {
    let (_origin, gw) = setup().await;
    let c = TestClient::new();
    let url = format!("{}/_sluice/admin/rooms/default", gw.url());
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let res = c
        .call(
            Method::PATCH,
            &url,
            &[
                ("authorization", &bearer),
                ("content-type", "application/json"),
            ],
            body(json!({"rate_per_sec": 300, "burst": 20}).to_string()),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v = res.json();
    assert_eq!(v["rate_per_sec"], 300.0);
    assert_eq!(v["burst"], 20.0);
    assert_eq!(c.get(&url, &auth).await.json()["rate_per_sec"], 300.0);

    for bad in [
        json!({"rate_per_sec": -1}),
        json!({"rate_per_sec": "fast"}),
        json!({"burst": null}),
        json!([1, 2]),
    ] {
        let res = c
            .call(Method::PATCH, &url, &auth, body(bad.to_string()))
            .await;
        assert_eq!(res.status, 422, "{bad}: {}", res.text());
        assert_eq!(res.json()["code"], "invalid_setting");
    }
    // nothing changed
    assert_eq!(c.get(&url, &auth).await.json()["rate_per_sec"], 300.0);

    let res = c.call(Method::PATCH, &url, &auth, body("{not json")).await;
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["code"], "malformed_request");

    let res = c
        .call(
            Method::PATCH,
            &format!("{}/_sluice/admin/rooms/nope", gw.url()),
            &auth,
            body("{}"),
        )
        .await;
    assert_eq!(res.status, 404);
    assert_eq!(res.json()["code"], "room_not_found");
}

#[tokio::test]
async fn control_bodies_are_limited() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.limits.control_body_bytes = 1024)
        .spawn()
        .await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let big = format!("{{\"rate_per_sec\": 1, \"pad\": \"{}\"}}", "x".repeat(4096));
    let res = TestClient::new()
        .call(
            Method::PATCH,
            &format!("{}/_sluice/admin/rooms/default", gw.url()),
            &[("authorization", &bearer)],
            body(big),
        )
        .await;
    assert_eq!(res.status, 413);
    assert_eq!(res.json()["code"], "body_too_large");
}

#[tokio::test]
async fn the_openapi_document_names_every_endpoint() {
    let (_origin, gw) = setup().await;
    let res = TestClient::new()
        .get(&format!("{}/_sluice/openapi.json", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    let doc = res.json();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/_sluice/healthz",
        "/_sluice/readyz",
        "/_sluice/jwks.json",
        "/_sluice/rooms/{room}",
        "/_sluice/rooms/{room}/challenge",
        "/_sluice/rooms/{room}/join",
        "/_sluice/rooms/{room}/status",
        "/_sluice/events/{event}",
        "/_sluice/events/{event}/holds",
        "/_sluice/holds/{hold_id}",
        "/_sluice/webhooks/payment",
        "/_sluice/admin/rooms/{room}",
        "/_sluice/admin/rooms/{room}/whatif",
        "/_sluice/admin/",
        "/_sluice/admin/events/{event}",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "{path} missing from openapi.json"
        );
    }
}

/// Found by schemathesis: a closed room answered 423 to a join whose body
/// is malformed (a solution that is not a decimal u64, a challenge that is
/// not base64url.base64url); the body's shape is checked first, so it is
/// 400 whatever the room's state.
#[tokio::test]
async fn a_malformed_join_is_400_even_in_a_closed_room() {
    let (_origin, gw) = setup().await;
    let c = TestClient::new();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let res = c
        .call(
            Method::PATCH,
            &format!("{}/_sluice/admin/rooms/default", gw.url()),
            &[
                ("authorization", &bearer),
                ("content-type", "application/json"),
            ],
            body(json!({"closed": true}).to_string()),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let join = format!("{}/_sluice/rooms/default/join", gw.url());
    for challenge in ["", "abc", "9r.P*", "a.b.c", ".x", "x."] {
        let res = c
            .post_json(
                &join,
                &[],
                &json!({"challenge": challenge, "solutions": ["0"]}),
            )
            .await;
        assert_eq!(res.status, 400, "{challenge}: {}", res.text());
        assert_eq!(res.json()["code"], "malformed_request");
    }
    for solutions in [
        json!([""]),
        json!(["01"]),
        json!(["-1"]),
        json!(["18446744073709551616"]),
    ] {
        let res = c
            .post_json(
                &join,
                &[],
                &json!({"challenge": "0.0", "solutions": solutions}),
            )
            .await;
        assert_eq!(res.status, 400, "{solutions}: {}", res.text());
        assert_eq!(res.json()["code"], "malformed_request");
    }
    // A well-formed one meets the closed room.
    let res = c
        .post_json(&join, &[], &json!({"challenge": "0.0", "solutions": ["0"]}))
        .await;
    assert_eq!(res.status, 423, "{}", res.text());
}

/// Found by schemathesis: a what-if at rate 0 with people in line ran the
/// simulator over its whole two-day horizon (seconds of a blocking thread
/// per call); the line cannot move, and the answer says so at once.
#[tokio::test]
async fn a_whatif_at_rate_zero_answers_at_once() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.rooms = vec![sluice_tests::easy_room("default", 0.0, 1.0, &[])])
        .spawn()
        .await;
    for _ in 0..3 {
        let res = Visitor::new(&gw.url(), "default").join("/").await;
        assert!(res.status.is_success(), "{}", res.text());
    }
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    // The room's snapshot sees the line within a tick.
    let url = format!("{}/_sluice/admin/rooms/default/whatif?burst=1000", gw.url());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let started = std::time::Instant::now();
        let res = TestClient::new()
            .get(&url, &[("authorization", &bearer)])
            .await;
        let took = started.elapsed();
        assert_eq!(res.status, 200, "{}", res.text());
        let v = res.json();
        if v["queue_length"].as_u64().unwrap() >= 1 {
            assert_eq!(v["drain_seconds"], Value::Null, "{v}");
            assert!(took < std::time::Duration::from_secs(2), "took {took:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "nobody in line: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
