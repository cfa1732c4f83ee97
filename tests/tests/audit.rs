//! Every admin change leaves an audit line (target `audit`): who (a
//! fingerprint of the admin token, never the token, and the client
//! address), what was asked, and the state before and after. Read from the
//! log of a real `sluice serve` process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::client::{TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, admin_patch, temp_file};

/// The audit lines logged so far, as the JSON objects tracing writes.
fn audit_lines(gw: &GatewayProcess) -> Vec<Value> {
    gw.log_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "audit")
        .collect()
}

/// Waits for an audit line whose message is `message`.
async fn audit_line(gw: &GatewayProcess, message: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = audit_lines(gw)
            .into_iter()
            .find(|v| v["fields"]["message"] == message)
        {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no audit line {message:?} in {:?}",
            gw.log_lines()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A JSON value logged as text (`before = %json`).
fn field_json(line: &Value, field: &str) -> Value {
    let text = line["fields"][field]
        .as_str()
        .unwrap_or_else(|| panic!("field {field} missing in {line}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("field {field} not JSON ({e}): {text}"))
}

#[tokio::test]
async fn room_and_event_changes_are_audited_with_who_before_and_after() {
    let origin = TestOrigin::start().await;
    let config = temp_file(
        "audit.toml",
        r#"
[[rooms]]
id = "default"
rate_per_sec = 7

[[events]]
id = "gig"
room = "default"
total = 10
"#,
    );
    let gw = GatewayProcess::start_logged(
        &[
            "--origin",
            &origin.url(),
            "--config",
            config.to_str().unwrap(),
            "--admin-token",
            ADMIN_TOKEN,
        ],
        "warn,audit=info",
    );
    use sha2::Digest;
    let fingerprint: String = sha2::Sha256::digest(ADMIN_TOKEN.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();

    // A room PATCH.
    let res = admin_patch(&gw.url(), "default", json!({"rate_per_sec": 12.5})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let line = audit_line(&gw, "room settings changed").await;
    let who = line["fields"]["who"].as_str().unwrap();
    assert_eq!(who, format!("token:{fingerprint} ip:127.0.0.1"));
    assert_eq!(line["fields"]["room"], "default");
    assert_eq!(field_json(&line, "change"), json!({"rate_per_sec": 12.5}));
    assert_eq!(field_json(&line, "before")["rate_per_sec"], 7.0);
    assert_eq!(field_json(&line, "after")["rate_per_sec"], 12.5);

    // An event change (the stock PUT of the admin API).
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    // the configured stock is loaded by the reaper's first pass
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let res = TestClient::new()
            .get(
                &format!("{}/_sluice/admin/events/gig", gw.url()),
                &[("authorization", &bearer)],
            )
            .await;
        if res.status == 200 && res.json()["total"] == 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stock not loaded: {}",
            res.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let change = json!({"total": 25, "cart_limit": 2, "hold_ttl_seconds": 60, "version": 2});
    let res = TestClient::new()
        .call(
            http::Method::PUT,
            &format!("{}/_sluice/admin/events/gig", gw.url()),
            &[
                ("authorization", &bearer),
                ("content-type", "application/json"),
            ],
            body(change.to_string()),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let line = audit_line(&gw, "event stock set").await;
    assert_eq!(
        line["fields"]["who"].as_str().unwrap(),
        format!("token:{fingerprint} ip:127.0.0.1")
    );
    assert_eq!(line["fields"]["event"], "gig");
    assert_eq!(field_json(&line, "change"), change);
    let before = field_json(&line, "before");
    let after = field_json(&line, "after");
    assert_eq!(
        (before["total"].clone(), before["version"].clone()),
        (json!(10), json!(1))
    );
    assert_eq!(
        (after["total"].clone(), after["version"].clone()),
        (json!(25), json!(2))
    );
    assert_eq!(after["cart_limit"], 2);

    // The token itself never appears in the log.
    for l in gw.log_lines() {
        assert!(!l.contains(ADMIN_TOKEN), "token logged: {l}");
    }
}
