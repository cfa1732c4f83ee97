//! Priority lanes (issue 22) end to end: two gateways on one real
//! `redis-server`, visitors joining through both, presale ones with an
//! enqueue token naming their lane, public ones without (the default
//! lane). The room's saved-up credit is split 70/30 between the lanes by
//! the store's atomic advance (one split, whichever gateway ticks), each
//! lane admits in its own join order (FIFO within a lane), positions are
//! told within the lane, and a token naming a lane the room does not have
//! is refused (422 `lane_not_found`) before any work is looked at, taking
//! no place.
//!
//! Skips loudly when `redis-server` is missing (a failure under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::Method;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use sluice_admission::lanes::Lane;
use sluice_gateway::config::room::EnqueueConfig;
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::{TestGateway, admin_patch, admin_room, easy_room};

const SECRET: &str = "the-origin-and-sluice-share-this-32+-byte-secret";
const ROOM: &str = "drop";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The origin's enqueue token for `sub`, naming `lane`.
fn token(sub: &str, lane: &str) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": sub, "aud": ROOM, "exp": now() + 60, "iat": now(), "lane": lane}),
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

async fn gateway(origin: &TestOrigin, redis: &RedisServer) -> TestGateway {
    TestGateway::builder()
        .origin(origin.url())
        .redis(redis.url())
        .config(|c| {
            let room = sluice_gateway::config::RoomConfig {
                lanes: vec![
                    Lane {
                        id: "presale".into(),
                        weight: 70,
                    },
                    Lane {
                        id: "public".into(),
                        weight: 30,
                    },
                ],
                enqueue: EnqueueConfig {
                    hmac_secret: Some(SECRET.into()),
                    ..EnqueueConfig::default()
                },
                ..easy_room(ROOM, 0.01, 10.0, &[])
            };
            c.rooms = vec![
                sluice_gateway::config::RoomConfig {
                    id: "idle".into(),
                    paths: vec!["/idle".into()],
                    ..room.clone()
                },
                room,
            ];
            c.pow_secret = Some("lanes-test-pow-secret-0123456789abcdef".into());
        })
        .spawn()
        .await
}

async fn join(base: &str, token: Option<&str>) -> Answer {
    let c = TestClient::new()
        .post_json(
            &format!("{base}/_sluice/rooms/{ROOM}/challenge"),
            &[],
            &json!({}),
        )
        .await;
    let mut req = sluice_tests::visitor::join_body(&c, "/").await;
    if let Some(t) = token {
        req["enqueue_token"] = json!(t);
    }
    TestClient::new()
        .post_json(&format!("{base}/_sluice/rooms/{ROOM}/join"), &[], &req)
        .await
}

async fn status(base: &str, queue_token: &str) -> Value {
    let res = TestClient::new()
        .call(
            Method::GET,
            &format!("{base}/_sluice/rooms/{ROOM}/status"),
            &[("authorization", &format!("Bearer {queue_token}"))],
            body(String::new()),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    res.json()
}

/// One visitor: the lane it joined, its seq there, its queue token.
struct Visitor {
    lane: &'static str,
    seq: u64,
    token: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lanes_split_by_weight_fifo_within_each_across_two_gateways() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let a = gateway(&origin, &redis).await;
    let b = gateway(&origin, &redis).await;
    let (a, b) = (a.url(), b.url());
    // held while everyone joins: the 10 saved up are split at the resume
    let res = admin_patch(&a, ROOM, json!({"paused": true})).await;
    assert_eq!(res.status, 200, "{}", res.text());

    // a lane the room does not have: refused before the (garbage) work,
    // nothing taken
    let tail = admin_room(&a, ROOM).await["tail"].as_u64().unwrap();
    let res = TestClient::new()
        .post_json(
            &format!("{b}/_sluice/rooms/{ROOM}/join"),
            &[],
            &json!({"challenge": "a.b", "solutions": ["1"], "enqueue_token": token("mallory", "vip")}),
        )
        .await;
    assert_eq!(res.status, 422, "{}", res.text());
    assert_eq!(res.json()["code"], "lane_not_found", "{}", res.text());
    let view = admin_room(&a, ROOM).await;
    assert_eq!(view["tail"].as_u64().unwrap(), tail, "{view}");

    // 12 presale visitors and 12 public ones, interleaved, through both
    // gateways
    let mut visitors = Vec::new();
    for i in 0..12u64 {
        for (lane, tok) in [
            ("presale", Some(token(&format!("member-{i}"), "presale"))),
            ("public", None),
        ] {
            let base = if visitors.len() % 2 == 0 { &a } else { &b };
            let res = join(base, tok.as_deref()).await;
            assert_eq!(res.status, 201, "{}", res.text());
            let v = res.json();
            assert_eq!(v["lane"], lane, "{v}");
            assert_eq!(v["seq"].as_u64().unwrap(), i + 1, "{v}");
            assert_eq!(v["position"].as_u64().unwrap(), i + 1, "{v}");
            visitors.push(Visitor {
                lane,
                seq: i + 1,
                token: v["queue_token"].as_str().unwrap().to_owned(),
            });
        }
    }
    let view = admin_room(&b, ROOM).await;
    let lanes = view["lanes"].as_array().expect("lanes in the admin view");
    assert_eq!(lanes[0]["id"], "presale", "{view}");
    assert_eq!(lanes[0]["waiting"], 12, "{view}");
    assert_eq!(lanes[1]["waiting"], 12, "{view}");

    // resume: the 10 saved up go 7/3 (whichever gateway advances)
    let res = admin_patch(&b, ROOM, json!({"paused": false})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let deadline = Instant::now() + Duration::from_secs(10);
    let (pre, public) = loop {
        let view = admin_room(&a, ROOM).await;
        let f = |i: usize| view["lanes"][i]["frontier"].as_u64().unwrap();
        if f(0) + f(1) >= 10 {
            break (f(0), f(1));
        }
        assert!(Instant::now() < deadline, "nothing admitted: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(pre + public, 10, "at most the credit: {pre} + {public}");
    assert!(
        pre.abs_diff(7) <= 1 && public.abs_diff(3) <= 1,
        "{pre}/{public}"
    );

    // FIFO within each lane: exactly its first `frontier` joiners are
    // admitted (claimed in the shared store), the rest wait, told
    // their position within their lane
    let mut sessions = std::collections::HashSet::new();
    for (n, v) in visitors.iter().enumerate() {
        // the gateway that signed its token (each has keys of its own)
        let base = if n % 2 == 0 { &a } else { &b };
        let frontier = if v.lane == "presale" { pre } else { public };
        // a gateway's snapshot may be a tick behind the resume
        let want = if v.seq <= frontier {
            "admitted"
        } else {
            "waiting"
        };
        let mut s = status(base, &v.token).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while s["state"] != want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            s = status(base, &v.token).await;
        }
        if v.seq <= frontier {
            assert_eq!(s["state"], "admitted", "{} #{}: {s}", v.lane, v.seq);
            let adm = s["admission_token"].as_str().unwrap_or_default().to_owned();
            assert!(sessions.insert(adm), "an admission given twice");
        } else {
            assert_eq!(s["state"], "waiting", "{} #{}: {s}", v.lane, v.seq);
            assert_eq!(s["lane"], v.lane, "{s}");
            assert_eq!(s["position"].as_u64().unwrap(), v.seq - frontier, "{s}");
        }
    }

    // The store forgets a lane seq's place once no queue token of it can be
    // presented: the gateways set lane_keep (the token's day, the account
    // binding's day, a minute of skew: the room takes enqueue tokens) and
    // the advances note their marks.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stored: String = redis::cmd("HGET")
        .arg(format!("sluice:{{{ROOM}}}:state"))
        .arg("settings")
        .query_async(&mut conn)
        .await
        .unwrap();
    let stored: Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(
        stored["lane_keep"],
        json!((2 * 86_400 + 60) * 1000),
        "{stored}"
    );
    let marks: i64 = redis::cmd("LLEN")
        .arg(format!("sluice:{{{ROOM}}}:lanemarks"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(marks >= 1, "no lane mark noted");
}

/// At an idle room with lanes, a guarded request without proof of work
/// passes straight through into the default lane, after joins of another
/// lane moved the room's tail past the lane's own seqs: the gateway's
/// check against a store that went back compares places, not lane seqs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passthrough_at_an_idle_room_with_lanes() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let origin = TestOrigin::start().await;
    let gw = gateway(&origin, &redis).await;
    let a = gw.url();
    let join_idle = |tok: String| {
        let a = a.clone();
        async move {
            let c = TestClient::new()
                .post_json(
                    &format!("{a}/_sluice/rooms/idle/challenge"),
                    &[],
                    &json!({}),
                )
                .await;
            let mut req = sluice_tests::visitor::join_body(&c, "/").await;
            req["enqueue_token"] = json!(tok);
            TestClient::new()
                .post_json(&format!("{a}/_sluice/rooms/idle/join"), &[], &req)
                .await
        }
    };
    let tok = |sub: &str| {
        encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": sub, "aud": "idle", "exp": now() + 60, "iat": now(), "lane": "presale"}),
            &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    for sub in ["m1", "m2", "m3"] {
        let res = join_idle(tok(sub)).await;
        assert_eq!(res.json()["state"], "admitted", "{}", res.text());
    }
    // a tick records the room's tail (3) on the gateway
    tokio::time::sleep(Duration::from_millis(400)).await;
    let res = TestClient::new().get(&format!("{a}/idle"), &[]).await;
    let cookies: Vec<_> = res
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        cookies.iter().any(|c| c.starts_with("sluice_a_idle=")),
        "not passed through: {cookies:?} {}",
        res.text()
    );
    let view = admin_room(&a, "idle").await;
    assert_eq!(view["lanes"][1]["admitted_total"], 1, "{view}");
    assert_eq!(view["lanes"][0]["admitted_total"], 3, "{view}");
}
