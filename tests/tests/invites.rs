//! Invite codes (issue 22) end to end over HTTP: an invite-only room on the
//! in-memory store and on a real `redis-server` shared by two gateways.
//!
//! What a hostile or unlucky visitor tries: no code, a malformed code, a
//! guessed code, a used-up code, a revoked code, an expired code, one
//! N-use code raced by more than N visitors through two gateways at once,
//! a join resubmitted with the same proof of work, guessing fast from one
//! network. Each refusal is 403 `invite_invalid` (or 429 `rate_limited`)
//! with no work issued, nothing redeemed and no place taken; the codes are
//! stored only as hashes (the whole Redis keyspace is searched for them).
//!
//! The Redis tests skip loudly when `redis-server` is missing (a failure
//! under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use sluice_gateway::config::RoomConfig;
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::{RedisServer, cli};
use sluice_tests::{ADMIN_TOKEN, TestGateway};

/// `vip`: invite-only, `attempts` codes per network per minute (0: no
/// limit), one passthrough then a slow queue; `default`: open to all.
fn rooms(attempts: u32) -> Vec<RoomConfig> {
    let easy = RoomConfig {
        puzzles: 1,
        difficulty_floor_bits: 1,
        difficulty_ceiling_bits: 2,
        join_limit_per_prefix_per_min: 0,
        attack_min_solve: Duration::ZERO,
        ..RoomConfig::default()
    };
    vec![
        RoomConfig {
            id: "vip".into(),
            paths: vec!["/vip".into()],
            invite_only: true,
            invite_attempts_per_prefix_per_min: attempts,
            rate_per_sec: 0.01,
            burst: 1.0,
            ..easy.clone()
        },
        RoomConfig {
            id: "default".into(),
            rate_per_sec: 1000.0,
            burst: 1000.0,
            ..easy
        },
    ]
}

async fn gateway(origin: &TestOrigin, redis: Option<&RedisServer>, attempts: u32) -> TestGateway {
    let mut b = TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = rooms(attempts);
            // gateways sharing a store share the proof-of-work secret
            c.pow_secret = Some("invites-test-pow-secret-0123456789abcdef".into());
        });
    if let Some(r) = redis {
        b = b.redis(r.url());
    }
    b.spawn().await
}

fn admin_headers() -> Vec<(&'static str, String)> {
    vec![
        ("authorization", format!("Bearer {ADMIN_TOKEN}")),
        ("content-type", "application/json".into()),
    ]
}

async fn admin(base: &str, method: Method, path: &str, body_text: &str) -> Answer {
    let h = admin_headers();
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    TestClient::new()
        .call(
            method,
            &format!("{base}/_sluice/admin/rooms/{path}"),
            &h,
            body(body_text.to_owned()),
        )
        .await
}

/// Issues `count` codes of `uses` uses: `(code, id)` each.
async fn issue(base: &str, count: u64, uses: u64, extra: Value) -> Vec<(String, String)> {
    let mut req = json!({"count": count, "uses": uses, "label": "test"});
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    let res = admin(base, Method::POST, "vip/invites", &req.to_string()).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let v = res.json();
    assert_eq!(v["invite_only"], true);
    v["invites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let code = i["code"].as_str().unwrap().to_owned();
            assert_eq!(code.len(), 26, "{i}");
            assert_eq!(i["uses"], uses);
            assert_eq!(i["used"], 0);
            (code, i["id"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// `used` of the invite `id`, by the admin API.
async fn used(base: &str, id: &str) -> u64 {
    let res = admin(base, Method::GET, &format!("vip/invites/{id}"), "").await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["used"].as_u64().unwrap()
}

/// The room's tail (places handed out), by the admin view.
async fn tail(base: &str) -> u64 {
    let res = admin(base, Method::GET, "vip", "").await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v = res.json();
    v["tail"]
        .as_u64()
        .or_else(|| v["queue"]["tail"].as_u64())
        .unwrap_or_else(|| panic!("no tail in {v}"))
}

async fn challenge(base: &str, room: &str, invite: Option<&str>) -> Answer {
    let req = match invite {
        Some(c) => json!({"invite": c}),
        None => json!({}),
    };
    TestClient::new()
        .post_json(&format!("{base}/_sluice/rooms/{room}/challenge"), &[], &req)
        .await
}

/// A solved challenge of `room`, fetched with `invite`: the join body
/// without the code.
async fn solved(base: &str, room: &str, invite: Option<&str>) -> Value {
    sluice_tests::visitor::join_body(&challenge(base, room, invite).await, "/vip").await
}

async fn join(base: &str, room: &str, mut req: Value, invite: Option<&str>) -> Answer {
    if let Some(c) = invite {
        req["invite"] = json!(c);
    }
    TestClient::new()
        .post_json(&format!("{base}/_sluice/rooms/{room}/join"), &[], &req)
        .await
}

fn refused(res: &Answer, reason: &str) {
    assert_eq!(res.status, 403, "{}", res.text());
    let v = res.json();
    assert_eq!(v["code"], "invite_invalid", "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert!(v.get("challenge").is_none(), "no work issued: {v}");
}

/// The whole life of codes on one or two gateways (`b` may be `a`).
async fn scenario(a: &str, b: &str) {
    let issued_before = admin(a, Method::GET, "vip/invites", "").await.json()["issued"]
        .as_u64()
        .unwrap();
    let codes = issue(a, 3, 1, json!({})).await;
    let (single, single_id) = codes[0].clone();
    let (to_revoke, revoke_id) = codes[1].clone();
    let (typed, typed_id) = codes[2].clone();
    let tail0 = tail(a).await;

    // No code, a malformed one, a guessed one: no work issued.
    refused(&challenge(a, "vip", None).await, "required");
    refused(&challenge(b, "vip", Some("abc")).await, "malformed");
    let guess = "a".repeat(26);
    refused(&challenge(a, "vip", Some(&guess)).await, "unknown");

    // A join must carry the code too: a challenge fetched with one does
    // not make a join without it pass, and nothing is redeemed.
    let req = solved(a, "vip", Some(&single)).await;
    refused(&join(a, "vip", req.clone(), None).await, "required");
    refused(&join(a, "vip", req.clone(), Some(&guess)).await, "unknown");
    assert_eq!(used(a, &single_id).await, 0);
    assert_eq!(tail(a).await, tail0, "no place taken by a refused join");

    // Typed by a fan: upper case, dashes, spaces. (The room's one
    // passthrough: the joins after it wait.)
    let fancy = format!(
        " {}-{} ",
        typed[..13].to_ascii_uppercase(),
        typed[13..].to_ascii_uppercase()
    );
    let fancy_req = solved(a, "vip", Some(&fancy)).await;
    let res = join(b, "vip", fancy_req, Some(&fancy)).await;
    assert!(res.status.is_success(), "{}", res.text());
    assert_eq!(used(b, &typed_id).await, 1);

    // The code: one place. The same proof resubmitted (a lost answer) is
    // the same place, not a second redemption.
    let first = join(b, "vip", req.clone(), Some(&single)).await;
    assert!(first.status.is_success(), "{}", first.text());
    let seq = first.json()["seq"].as_u64();
    let again = join(a, "vip", req, Some(&single)).await;
    assert!(again.status.is_success(), "{}", again.text());
    assert_eq!(again.json()["seq"].as_u64(), seq, "same place");
    assert_eq!(used(a, &single_id).await, 1);
    assert_eq!(tail(a).await, tail0 + 2);

    // Used up: refused at the challenge, before any work.
    refused(&challenge(a, "vip", Some(&single)).await, "exhausted");
    refused(&challenge(b, "vip", Some(&single)).await, "exhausted");

    // Revoked: refused everywhere, at once.
    let res = admin(b, Method::DELETE, &format!("vip/invites/{revoke_id}"), "").await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["revoked"], true);
    refused(&challenge(a, "vip", Some(&to_revoke)).await, "revoked");

    // Expired.
    let expiring = issue(a, 1, 1, json!({"expires_in_seconds": 1})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    refused(&challenge(b, "vip", Some(&expiring[0].0)).await, "expired");

    // One code of 3 uses raced by 6 visitors through both gateways: every
    // challenge passes (nothing is redeemed by a check), exactly 3 joins
    // get a place, the others are refused as exhausted.
    let three = issue(a, 1, 3, json!({})).await;
    let (code3, id3) = three[0].clone();
    let tail1 = tail(a).await;
    let mut reqs = Vec::new();
    for i in 0..6 {
        reqs.push(solved(if i % 2 == 0 { a } else { b }, "vip", Some(&code3)).await);
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, req) in reqs.into_iter().enumerate() {
        let base = if i % 2 == 0 { a } else { b }.to_owned();
        let code = code3.clone();
        set.spawn(async move { join(&base, "vip", req, Some(&code)).await });
    }
    let mut ok = 0;
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        if res.status.is_success() {
            ok += 1;
        } else {
            refused(&res, "exhausted");
        }
    }
    assert_eq!(ok, 3, "a 3-use code bought exactly 3 places");
    assert_eq!(used(a, &id3).await, 3);
    assert_eq!(tail(b).await, tail1 + 3, "no place without a redemption");

    // The operator's view: redemptions recorded with the network.
    let res = admin(a, Method::GET, &format!("vip/invites/{single_id}"), "").await;
    let v = res.json();
    let r = v["redemptions"].as_array().unwrap();
    assert_eq!(r.len(), 1, "{v}");
    assert_eq!(r[0]["note"], "network 127.0.0.0/24", "{v}");
    assert!(v.get("code").is_none(), "a code is shown only when issued");
    let res = admin(b, Method::GET, "vip/invites", "").await;
    let v = res.json();
    assert_eq!(v["issued"], issued_before + 5, "{v}");
    assert_eq!(v["redeemed"], 5, "{v}");
    assert_eq!(v["revoked"], 1, "{v}");

    // A room open to all ignores a code.
    let req = solved(a, "default", None).await;
    let res = join(a, "default", req, Some("not-a-code")).await;
    assert!(res.status.is_success(), "{}", res.text());

    // Counted in the metrics, by the gateway that redeemed: a redemption
    // on `a` is not certain (the race above may give all three uses to
    // `b`), so both gateways' metrics are read.
    let mut m = String::new();
    for base in [a, b] {
        m += &TestClient::new()
            .get(
                &format!("{base}/metrics"),
                &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            )
            .await
            .text();
    }
    assert!(
        m.contains(r#"sluice_invites_total{result="redeemed",room="vip"}"#)
            || m.contains(r#"sluice_invites_total{room="vip",result="redeemed"}"#),
        "{m}"
    );
}

#[tokio::test]
async fn invite_codes_in_memory() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, None, 0).await;
    scenario(&gw.url(), &gw.url()).await;
}

#[tokio::test]
async fn invite_codes_on_redis_across_two_gateways_and_stored_hashed() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let a = gateway(&origin, Some(&redis), 0).await;
    let b = gateway(&origin, Some(&redis), 0).await;
    // the codes of this test, to look for in the keyspace afterwards
    let codes = issue(&a.url(), 4, 2, json!({})).await;
    scenario(&a.url(), &b.url()).await;
    let keys = cli(redis.port(), None, &["--scan"]);
    let mut dump = String::new();
    for key in keys.lines().filter(|k| !k.is_empty()) {
        let kind = cli(redis.port(), None, &["type", key]);
        let out = match kind.trim() {
            "hash" => cli(redis.port(), None, &["hgetall", key]),
            "list" => cli(redis.port(), None, &["lrange", key, "0", "-1"]),
            "string" => cli(redis.port(), None, &["get", key]),
            "zset" => cli(redis.port(), None, &["zrange", key, "0", "-1"]),
            "set" => cli(redis.port(), None, &["smembers", key]),
            _ => String::new(),
        };
        dump.push_str(key);
        dump.push_str(&out);
    }
    assert!(dump.contains(":inv:"), "the invites are in Redis");
    for (code, _) in &codes {
        assert!(!dump.contains(code.as_str()), "code {code} stored in clear");
    }
}

#[tokio::test]
async fn guessing_is_rate_limited_per_network() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, None, 5).await;
    let base = gw.url();
    let good = issue(&base, 1, 1, json!({})).await;
    for i in 0..5 {
        let guess = format!("{:a>26}", i);
        let guess: String = guess.replace(|c: char| !c.is_ascii_lowercase(), "b");
        refused(&challenge(&base, "vip", Some(&guess)).await, "unknown");
    }
    // the network's attempts are spent: even a good code waits
    let res = challenge(&base, "vip", Some(&good[0].0)).await;
    assert_eq!(res.status, 429, "{}", res.text());
    assert_eq!(res.json()["code"], "rate_limited");
    assert!(res.header("retry-after").is_some());
    // a join is an attempt too, refused before its work is looked at
    let res = join(
        &base,
        "vip",
        json!({"challenge": "a.b", "solutions": ["1"]}),
        Some(&good[0].0),
    )
    .await;
    assert_eq!(res.status, 429, "{}", res.text());
    // a room open to all is not affected
    assert_eq!(challenge(&base, "default", None).await.status, 200);
}

/// A network guessing through two gateways on one Redis gets the
/// attempts of one gateway, not of two: the budget is the store's. Per
/// gateway, as it once was, the guesses below would pass 8 attempts.
#[tokio::test]
async fn guessing_through_two_gateways_gets_the_attempts_of_one() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let a = gateway(&origin, Some(&redis), 4).await;
    let b = gateway(&origin, Some(&redis), 4).await;
    let (a, b) = (a.url(), b.url());
    let good = issue(&a, 1, 1, json!({})).await;
    for i in 0..4 {
        let guess: String = format!("{:a>26}", i).replace(|c: char| !c.is_ascii_lowercase(), "c");
        let base = if i % 2 == 0 { &a } else { &b };
        refused(&challenge(base, "vip", Some(&guess)).await, "unknown");
    }
    // spent at both gateways, though each saw only two attempts
    for base in [&a, &b] {
        let res = challenge(base, "vip", Some(&good[0].0)).await;
        assert_eq!(res.status, 429, "{}", res.text());
        assert_eq!(res.json()["code"], "rate_limited");
        let wait: u64 = res.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=15).contains(&wait), "retry-after {wait}");
    }
    // the code was never looked at, and nothing was redeemed
    assert_eq!(used(&a, &good[0].1).await, 0);
    // the store holds no address of the network, only a digest
    let keys = cli(redis.port(), None, &["KEYS", "*invite.*"]);
    assert!(keys.contains("invite."), "no shared bucket: {keys}");
    assert!(!keys.contains("127.0"), "an address in the store: {keys}");
}

#[tokio::test]
async fn the_admin_api_refuses_bad_input() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, None, 0).await;
    let base = gw.url();
    for bad in [
        r#"{"count": 0}"#,
        r#"{"count": 1001}"#,
        r#"{"uses": 0}"#,
        r#"{"uses": "3"}"#,
        r#"{"expires_in_seconds": -5}"#,
        r#"{"label": 7}"#,
        r#"{"colour": "red"}"#,
    ] {
        let res = admin(&base, Method::POST, "vip/invites", bad).await;
        assert_eq!(res.status, 422, "{bad}: {}", res.text());
        assert_eq!(res.json()["code"], "invalid_setting", "{bad}");
    }
    let res = admin(&base, Method::POST, "vip/invites", "{not json").await;
    assert_eq!(res.status, 400, "{}", res.text());
    let res = admin(&base, Method::POST, "nope/invites", "{}").await;
    assert_eq!(res.status, 404, "{}", res.text());
    assert_eq!(res.json()["code"], "room_not_found");
    for id in ["000000000000", "not-an-id", "ABCDEF012345"] {
        let res = admin(&base, Method::GET, &format!("vip/invites/{id}"), "").await;
        assert_eq!(res.status, 404, "{id}: {}", res.text());
        assert_eq!(res.json()["code"], "invite_not_found");
        let res = admin(&base, Method::DELETE, &format!("vip/invites/{id}"), "").await;
        assert_eq!(res.status, 404, "{id}: {}", res.text());
    }
    // A visitor's challenge whose `invite` is not a string (schemathesis
    // found `{"invite": {}}` answered with work): 400 in every room, no
    // work issued, and so is a body that is not JSON (schemathesis again);
    // an empty body or an object without the member still gets work where
    // the room is open to all.
    for room in ["vip", "default"] {
        for bad in [
            json!({"invite": {}}),
            json!({"invite": 7}),
            json!({"invite": ["x"]}),
            json!({"invite": null}),
            json!([1, 2]),
        ] {
            let res = TestClient::new()
                .post_json(&format!("{base}/_sluice/rooms/{room}/challenge"), &[], &bad)
                .await;
            assert_eq!(res.status, 400, "{room} {bad}: {}", res.text());
            assert_eq!(res.json()["code"], "malformed_request", "{room} {bad}");
            assert!(res.json().get("challenge").is_none());
        }
    }
    for garbage in ["\u{1}\u{2}", "{\"invite\":", "invite=abc"] {
        let res = TestClient::new()
            .call(
                Method::POST,
                &format!("{base}/_sluice/rooms/default/challenge"),
                &[("content-type", "application/json")],
                body(garbage.to_owned()),
            )
            .await;
        assert_eq!(res.status, 400, "{garbage:?}: {}", res.text());
        assert_eq!(res.json()["code"], "malformed_request");
    }
    for empty in ["", "  \n"] {
        let res = TestClient::new()
            .call(
                Method::POST,
                &format!("{base}/_sluice/rooms/default/challenge"),
                &[],
                body(empty.to_owned()),
            )
            .await;
        assert_eq!(res.status, 200, "{empty:?}: {}", res.text());
    }
    // The bound is 128 characters, as the OpenAPI document's maxLength
    // counts them (schemathesis sent 100 four-byte letters): such an
    // invite is no code (403 malformed at the invite-only door) and is
    // ignored where the room is open; 129 characters is 400 everywhere.
    let wide = "\u{1d57f}".repeat(100);
    refused(&challenge(&base, "vip", Some(&wide)).await, "malformed");
    assert_eq!(challenge(&base, "default", Some(&wide)).await.status, 200);
    let long = "a".repeat(129);
    for room in ["vip", "default"] {
        let res = challenge(&base, room, Some(&long)).await;
        assert_eq!(res.status, 400, "{room}: {}", res.text());
    }
    for fine in [json!({}), json!({"other": 1})] {
        let res = TestClient::new()
            .post_json(
                &format!("{base}/_sluice/rooms/default/challenge"),
                &[],
                &fine,
            )
            .await;
        assert_eq!(res.status, 200, "{fine}: {}", res.text());
    }
    // without the admin token
    let res = TestClient::new()
        .call(
            Method::POST,
            &format!("{base}/_sluice/admin/rooms/vip/invites"),
            &[("content-type", "application/json")],
            body("{}".to_owned()),
        )
        .await;
    assert_eq!(res.status, 401, "{}", res.text());
    let res = admin(&base, Method::GET, "vip/invites", "").await;
    assert_eq!(
        res.json()["issued"],
        0,
        "nothing issued by refused requests"
    );
}

/// `sluice admin invites`: issue (each code shown once), list, one with its
/// redemptions, revoke; the codes it printed work at the door. (Multi-
/// threaded: the CLI runs as a blocking child while the gateway answers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_issues_lists_and_revokes() {
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, None, 0).await;
    let base = gw.url();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(sluice_tests::sluice_bin())
            .args(["admin", "--url", &base, "--token", ADMIN_TOKEN])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let v: Value = serde_json::from_str(&cli(&[
        "--json",
        "invites",
        "vip",
        "issue",
        "count=2",
        "uses=1",
        "label=cli",
    ]))
    .unwrap();
    let invites = v["invites"].as_array().unwrap();
    assert_eq!(invites.len(), 2);
    let code = invites[0]["code"].as_str().unwrap().to_owned();
    let id = invites[1]["id"].as_str().unwrap().to_owned();
    // the table shows the codes of an issue, and never in a listing
    let table = cli(&["invites", "vip", "issue", "label=table"]);
    assert!(table.contains("code"), "{table}");
    let listing = cli(&["invites", "vip"]);
    assert!(
        listing.contains(&id) && listing.contains("cli"),
        "{listing}"
    );
    assert!(!listing.contains(&code), "{listing}");
    // the code works; the revoked one does not
    let req = solved(&base, "vip", Some(&code)).await;
    assert!(
        join(&base, "vip", req, Some(&code))
            .await
            .status
            .is_success()
    );
    let one: Value = serde_json::from_str(&cli(&[
        "--json",
        "invites",
        "vip",
        invites[0]["id"].as_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(one["used"], 1, "{one}");
    assert_eq!(one["redemptions"].as_array().unwrap().len(), 1, "{one}");
    cli(&["invites", "vip", "revoke", &id]);
    let revoked_code = invites[1]["code"].as_str().unwrap();
    refused(
        &challenge(&base, "vip", Some(revoked_code)).await,
        "revoked",
    );
}
