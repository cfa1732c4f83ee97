//! The gateway's own endpoints: health, readiness, admin auth, errors as
//! problem+json, body limits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

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
    for path in ["healthz", "readyz", "serving"] {
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
    // … and says why (issue 21), where a wrong token is just refused
    let p = res.json();
    assert_eq!(p["code"], "unauthorized");
    assert_eq!(p["reason"], "no_admin_token");
    assert_eq!(
        p["detail"],
        "this gateway has no admin token (start it with --admin-token or SLUICE_ADMIN_TOKEN)"
    );
    let res = c.get(&url, &[("authorization", "Bearer wrong")]).await;
    assert_eq!(res.json()["reason"], "token_refused");
    // both reasons are the document's
    let doc = served_openapi(&gw).await;
    let r = &doc["components"]["responses"]["AdminUnauthorized"];
    let reasons = &r["content"]["application/problem+json"]["schema"]["allOf"][1]["properties"]["reason"]
        ["enum"];
    assert_eq!(reasons, &json!(["no_admin_token", "token_refused"]));
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

// === the OpenAPI document (issue 17) ===

/// The document as the gateway serves it.
async fn served_openapi(gw: &TestGateway) -> Value {
    let res = TestClient::new()
        .get(&format!("{}/_sluice/openapi.json", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    let doc = res.json();
    assert_eq!(doc["openapi"], "3.1.0");
    doc
}

/// The gateway's sources, read from the workspace (its CLI tools, the
/// demo shop among them, serve nothing of the gateway's).
fn gateway_sources() -> Vec<(std::path::PathBuf, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    walk(&root.join("gateway/src"), &mut out);
    out.retain(|(path, _)| !path.starts_with(root.join("gateway/src/tools")));
    walk(&root.join("pow/src"), &mut out);
    out
}

/// A path with its parameters' names dropped (`/holds/{hold}` and
/// `/holds/{hold_id}` are one route).
fn shape(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

/// The router's table, read from the `.route("…", get(…).patch(…))` calls
/// of the gateway's sources: path shape → methods. The catch-all
/// `/_sluice/{*rest}` (404 `not_found`, any method) is no operation, nor
/// is a route for any method alone (forward-auth's Envoy form,
/// `/_sluice/auth/…`, described with `GET /_sluice/auth`).
fn route_table() -> BTreeMap<String, BTreeSet<String>> {
    let mut table: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, text) in gateway_sources() {
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            // The call's text, up to its closing parenthesis.
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find_map(|(i, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    (depth == 0).then_some(i)
                })
                .unwrap();
            let call = &rest[..end];
            let Some(path) = call.split('"').nth(1) else {
                continue;
            };
            if path.contains("{*") {
                continue;
            }
            let methods: BTreeSet<String> = ["get", "post", "put", "patch", "delete"]
                .into_iter()
                .filter(|m| call.contains(&format!("{m}(")))
                .map(str::to_owned)
                .collect();
            if methods.is_empty() && call.contains("any(") {
                continue;
            }
            table.entry(shape(path)).or_default().extend(methods);
        }
    }
    table
}

/// Every `code` the gateway can put in a problem: the first string of each
/// `Problem::new(…)` and the proof-of-work error codes.
fn server_codes() -> BTreeSet<String> {
    let mut codes = BTreeSet::new();
    for (path, text) in gateway_sources() {
        for piece in text.split("Problem::new(").skip(1) {
            if let Some(code) = piece.split('"').nth(1) {
                codes.insert(code.to_owned());
            }
        }
        if path.ends_with("pow/src/error.rs") {
            let body = text.split("pub fn code(").nth(1).unwrap();
            let body = &body[..body.find("\n    }\n").unwrap()];
            for piece in body.split("=> \"").skip(1) {
                codes.insert(piece.split('"').next().unwrap().to_owned());
            }
        }
    }
    codes
}

/// Resolves a local `$ref` of the document.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let target = r
                .trim_start_matches("#/")
                .split('/')
                .fold(doc, |at, key| &at[key]);
            resolve(doc, target)
        }
        None => v,
    }
}

/// The operations of the document: (path, method, operation).
fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if method != "parameters" {
                out.push((path.clone(), method.clone(), op));
            }
        }
    }
    out
}

/// The problem codes a documented response may carry (its schema's
/// `code` enum), empty when it names none.
fn documented_codes(doc: &Value, response: &Value) -> BTreeSet<String> {
    let r = resolve(doc, response);
    let schema = &r["content"]["application/problem+json"]["schema"];
    let mut out = BTreeSet::new();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        for c in part["properties"]["code"]["enum"]
            .as_array()
            .into_iter()
            .flatten()
        {
            out.insert(c.as_str().unwrap().to_owned());
        }
    }
    out
}

#[tokio::test]
async fn the_openapi_document_has_every_route_of_the_router_with_every_method() {
    let (_origin, gw) = setup().await;
    let doc = served_openapi(&gw).await;
    let routes = route_table();
    assert!(
        routes.len() > 15,
        "the route table was not read: {routes:?}"
    );
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, method, _) in operations(&doc) {
        documented.entry(shape(&path)).or_default().insert(method);
    }
    assert_eq!(
        documented, routes,
        "gateway/api/openapi.json and the router disagree"
    );
    // And the router refuses every other method of a documented path.
    let c = TestClient::new();
    for (path, methods) in &documented {
        let url = format!("{}{}", gw.url(), path.replace("{}", "default"));
        for m in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            if methods.contains(&m.to_ascii_lowercase()) {
                continue;
            }
            let res = c
                .call(
                    Method::from_bytes(m.as_bytes()).unwrap(),
                    &url,
                    &[],
                    body(""),
                )
                .await;
            assert_eq!(res.status, 405, "{m} {path}: {}", res.text());
        }
    }
}

#[tokio::test]
async fn every_documented_error_code_is_one_the_server_produces() {
    let (_origin, gw) = setup().await;
    let doc = served_openapi(&gw).await;
    let server = server_codes();
    assert!(server.contains("not_admitted") && server.contains("pow_invalid"));
    let mut in_doc = BTreeSet::new();
    for (path, method, op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().unwrap() {
            let codes = documented_codes(&doc, response);
            let r = resolve(&doc, response);
            if status.starts_with('4') || r["content"].get("application/problem+json").is_some() {
                assert!(
                    !codes.is_empty(),
                    "{method} {path} {status}: a problem answer must list its codes"
                );
            }
            for code in codes {
                assert!(
                    server.contains(&code),
                    "{method} {path} {status}: `{code}` is not a code the server produces"
                );
                in_doc.insert(code);
            }
        }
    }
    // The other way: every code of the control plane is documented. The
    // rest are answers of guarded paths (the proxy and the gate), of the
    // catch-all, or of a bug.
    let elsewhere: BTreeSet<&str> = [
        "internal_error",
        "method_not_allowed",
        "origin_unreachable",
        "origin_timeout",
        "origin_tls_failed",
        "overloaded",
        "waiting_room_active",
        "not_admitted_yet",
    ]
    .into();
    let missing: Vec<&String> = server
        .iter()
        .filter(|c| !in_doc.contains(*c) && !elsewhere.contains(c.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "codes the document never names: {missing:?}"
    );
}

#[tokio::test]
async fn the_openapi_document_lists_every_status_each_route_can_give() {
    let (_origin, gw) = setup().await;
    let doc = served_openapi(&gw).await;
    for (path, method, op) in operations(&doc) {
        let responses = op["responses"].as_object().unwrap();
        let has = |s: &str| responses.contains_key(s);
        let what = format!("{method} {path}");
        // Any request may fail the canonical-request check.
        assert!(has("400"), "{what}: 400");
        let admin = path.starts_with("/_sluice/admin") || path == "/metrics";
        if admin {
            // The lockout answers every admin call, whatever its token.
            assert!(has("429"), "{what}: the admin lockout's 429");
            let codes = documented_codes(&doc, &responses["429"]);
            assert!(codes.contains("rate_limited"), "{what}");
        }
        if op["security"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s.get("admin").is_some()))
        {
            assert!(has("401"), "{what}: 401 unauthorized");
        }
        if path.contains("{room}") && admin {
            assert!(has("404"), "{what}: 404 on an unknown room");
        }
        if sluice_gateway::app::touches_store(
            &path
                .replace("{room}", "r")
                .replace("{event}", "e")
                .replace("{hold_id}", "h"),
        ) {
            for s in ["408", "413", "503"] {
                assert!(has(s), "{what}: {s} (a store-bound endpoint)");
            }
            let h = &resolve(&doc, &responses["503"])["headers"];
            assert!(
                h.get("Retry-After").is_some(),
                "{what}: 503 with Retry-After"
            );
        }
        if let Some(content) = op["requestBody"]["content"].as_object()
            && content.contains_key("application/json")
            && path != "/_sluice/webhooks/payment"
            // the challenge's optional body (an invite code) is read
            // leniently: any other body is ignored, as before invites
            && !path.ends_with("/challenge")
        {
            // Read by the JSON extractor: an empty or broken body, and a
            // body that says it is not JSON.
            assert!(has("400"), "{what}: 400 on an empty or broken body");
            assert!(has("415"), "{what}: 415 on a non-JSON body");
        }
        for s in responses.keys() {
            if s.starts_with('4') || s.starts_with('5') {
                assert!(
                    s == "503" && (path == "/_sluice/readyz" || path == "/_sluice/serving")
                        || !documented_codes(&doc, &responses[s]).is_empty(),
                    "{what} {s}: no codes"
                );
            }
        }
    }
    let hold = &doc["paths"]["/_sluice/events/{event}/holds"]["post"]["responses"];
    assert!(documented_codes(&doc, &hold["401"]).contains("not_admitted"));
    assert!(documented_codes(&doc, &hold["400"]).contains("malformed_request"));
}

/// The answer is listed for its operation: its status, and its code among
/// that status's codes.
fn assert_documented(doc: &Value, path: &str, method: &str, res: &sluice_tests::client::Answer) {
    let response = &doc["paths"][path][method]["responses"][res.status.as_str()];
    assert!(
        !response.is_null(),
        "{method} {path}: {} is not documented ({})",
        res.status,
        res.text()
    );
    let code = res.json()["code"].as_str().unwrap_or_default().to_owned();
    assert!(
        documented_codes(doc, response).contains(&code),
        "{method} {path} {}: `{code}` is not documented",
        res.status
    );
}

#[tokio::test]
async fn the_answers_the_issue_named_are_documented() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| c.rooms = vec![sluice_tests::easy_room("default", 1000.0, 1000.0, &[])])
        .spawn()
        .await;
    let doc = served_openapi(&gw).await;
    let c = TestClient::new();
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let room_url = format!("{}/_sluice/admin/rooms/default", gw.url());
    let json_ct = ("content-type", "application/json");

    // 400 on an empty PATCH or PUT body.
    let res = c
        .call(
            Method::PATCH,
            &room_url,
            &[("authorization", &admin), json_ct],
            body(""),
        )
        .await;
    assert_eq!(res.status, 400, "{}", res.text());
    assert_documented(&doc, "/_sluice/admin/rooms/{room}", "patch", &res);
    let res = c
        .call(
            Method::PUT,
            &format!("{}/_sluice/admin/events/demo", gw.url()),
            &[("authorization", &admin), json_ct],
            body(""),
        )
        .await;
    assert_eq!(res.status, 400, "{}", res.text());
    assert_documented(&doc, "/_sluice/admin/events/{event}", "put", &res);
    // 415 on a body that is not JSON.
    let res = c
        .call(
            Method::PATCH,
            &room_url,
            &[("authorization", &admin), ("content-type", "text/plain")],
            body("burst=2"),
        )
        .await;
    assert_eq!(res.status, 415, "{}", res.text());
    assert_documented(&doc, "/_sluice/admin/rooms/{room}", "patch", &res);
    // 404 on an unknown room.
    let res = c
        .call(
            Method::PATCH,
            &format!("{}/_sluice/admin/rooms/nope", gw.url()),
            &[("authorization", &admin), json_ct],
            body("{}"),
        )
        .await;
    assert_eq!(res.status, 404, "{}", res.text());
    assert_documented(&doc, "/_sluice/admin/rooms/{room}", "patch", &res);

    // Holds: 401 `not_admitted` without a token, 400 on a bad key.
    let holds = format!("{}/_sluice/events/demo/holds", gw.url());
    let res = c.post_json(&holds, &[], &json!({"qty": 1})).await;
    assert_eq!(res.status, 401, "{}", res.text());
    assert_documented(&doc, "/_sluice/events/{event}/holds", "post", &res);
    let mut v = Visitor::new(&gw.url(), "default");
    let res = v.join("/").await;
    assert!(res.status.is_success(), "{}", res.text());
    assert!(
        v.wait_admitted(std::time::Duration::from_secs(30), 50)
            .await
    );
    let res = v
        .call_admitted(
            Method::POST,
            "/_sluice/events/demo/holds",
            Some(json!({"qty": 1})),
            &[("idempotency-key", "")],
        )
        .await;
    assert_eq!(res.status, 400, "{}", res.text());
    assert_documented(&doc, "/_sluice/events/{event}/holds", "post", &res);

    // The admin lockout: 429 on every admin call, the right token too.
    for _ in 0..sluice_gateway::admin::ADMIN_FAILURES_PER_MIN {
        let res = c.get(&room_url, &[("authorization", "Bearer wrong")]).await;
        assert_eq!(res.status, 401);
    }
    for (path, method, url) in [
        ("/_sluice/admin/rooms/{room}", "get", room_url.clone()),
        (
            "/_sluice/admin/events/{event}",
            "get",
            format!("{}/_sluice/admin/events/demo", gw.url()),
        ),
        (
            "/_sluice/admin/rooms",
            "get",
            format!("{}/_sluice/admin/rooms", gw.url()),
        ),
        ("/metrics", "get", format!("{}/metrics", gw.url())),
    ] {
        let res = c.get(&url, &[("authorization", &admin)]).await;
        assert_eq!(res.status, 429, "{path}: {}", res.text());
        assert_documented(&doc, path, method, &res);
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

/// Three visitors in line at a room that admits nobody, then the what-if
/// with `query`, asked until the room's snapshot shows the line: its
/// answer and how long it took.
async fn whatif_with_three_in_line(query: &str) -> (Value, std::time::Duration) {
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
    let url = format!("{}/_sluice/admin/rooms/default/whatif?{query}", gw.url());
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
            return (v, took);
        }
        assert!(std::time::Instant::now() < deadline, "nobody in line: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Found by schemathesis: a what-if at rate 0 with people in line ran the
/// simulator over its whole two-day horizon (seconds of a blocking thread
/// per call); the line cannot move, and the answer says so at once.
#[tokio::test]
async fn a_whatif_at_rate_zero_answers_at_once() {
    let (v, took) = whatif_with_three_in_line("burst=1000").await;
    assert_eq!(v["drain_seconds"], Value::Null, "{v}");
    assert!(took < std::time::Duration::from_secs(2), "took {took:?}");
}

/// Found by schemathesis: a tiny positive rate with people in line
/// simulated two days in 100 ms ticks (about 12 s of a blocking thread in
/// a debug build); past ten minutes of drain the simulator ticks whole
/// seconds. Three in line at 0.001/s drain in about 3,000 s: inside the
/// horizon, so the answer is a number, not null.
#[tokio::test]
async fn a_whatif_at_a_tiny_rate_answers_with_the_long_drain() {
    let (v, took) = whatif_with_three_in_line("rate_per_sec=0.001").await;
    let drain = v["drain_seconds"].as_f64().unwrap_or_else(|| panic!("{v}"));
    assert!((2_000.0..=4_000.0).contains(&drain), "{v}");
    eprintln!("what-if at 0.001/s: {took:?}");
}
