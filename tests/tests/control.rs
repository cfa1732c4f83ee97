//! The gateway's own endpoints: health, readiness, admin auth, errors as
//! problem+json, body limits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::Method;
use serde_json::json;
use sluice_tests::client::{TestClient, body};
use sluice_tests::origin::TestOrigin;
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
