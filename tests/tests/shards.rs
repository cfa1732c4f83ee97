//! A hot event split across shards (issue 20), end to end over HTTP:
//! two gateway processes on a real 3-primary Redis Cluster sell an event
//! of 8 shards to visitors racing through both, a greedy visitor fires
//! holds at both gateways at once, one gateway is SIGKILLed mid-sale and
//! restarted. Units the kill left in transit are sold to nobody until a
//! sweep lands them, then late visitors buy them; at the end exactly the
//! stock is held, nothing is left available or in transit, every
//! visitor's cart is on its home shard alone and within the limit (read
//! from the store's own keys, so holds whose answer the kill lost count
//! too), and the store, the answers and the admin view agree. Also, in memory: every bad input of the layout
//! (shard ids named as events, shard counts out of range, categories with
//! shards, a count change with holds open) answers its code and changes
//! nothing.
//!
//! The Cluster test skips loudly when `redis-server` is missing (a
//! failure under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};
use sluice_gateway::config::{EventConfig, RoomConfig};
use sluice_tests::client::{Answer, TestClient, body};
use sluice_tests::cluster::RedisCluster;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use sluice_tests::{
    ADMIN_TOKEN, GatewayProcess, TestGateway, admitted_visitor, pay_succeeded, temp_file, temp_keys,
};

const WEBHOOK_SECRET: &str = "whsec-shards-0123456789abcdef";
const TOTAL: u64 = 120;
const LIMIT: u64 = 3;

fn config() -> std::path::PathBuf {
    let text = format!(
        "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 500\nburst = 500\npuzzles = 1\n\
         difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
         attack_min_solve = \"0s\"\n\n\
         [[events]]\nid = \"hot\"\nroom = \"hall\"\ntotal = {TOTAL}\ncart_limit = {LIMIT}\n\
         hold_ttl = \"300s\"\nshards = 8\n\n[limits]\nholds_per_visitor_per_min = 0\n"
    );
    temp_file("shards.toml", &text)
}

fn gateway(cluster: &RedisCluster, origin: &TestOrigin, keys: &std::path::Path) -> GatewayProcess {
    let cfg = config();
    GatewayProcess::start(&[
        "--redis",
        &cluster.url(),
        "--origin",
        &origin.url(),
        "--config",
        cfg.to_str().unwrap(),
        "--keys-dir",
        keys.to_str().unwrap(),
        "--admin-token",
        ADMIN_TOKEN,
        "--webhook-secret",
        WEBHOOK_SECRET,
        "--load-stock",
    ])
}

async fn admin(base: &str, method: Method, path: &str, body_text: &str) -> Answer {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    TestClient::new()
        .call(
            method,
            &format!("{base}/_sluice/admin/events/{path}"),
            &[
                ("authorization", &bearer),
                ("content-type", "application/json"),
            ],
            body(body_text.to_owned()),
        )
        .await
}

async fn view(base: &str, event: &str) -> Value {
    let res = admin(base, Method::GET, event, "").await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

async fn wait_sharded(base: &str, shards: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let res = admin(base, Method::GET, "hot", "").await;
        let v = res.json();
        if v["ready"] == true && v["shards"] == shards {
            return v;
        }
        assert!(Instant::now() < deadline, "never sharded: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn hold(v: &Visitor, event: &str, qty: u64) -> Answer {
    v.call_admitted(
        Method::POST,
        &format!("/_sluice/events/{event}/holds"),
        Some(json!({"qty": qty})),
        &[],
    )
    .await
}

/// A hold through a gateway that may be killed under it: `None` when the
/// connection failed.
async fn try_hold(base: &str, token: &str, qty: u64) -> Option<Answer> {
    let req = http::Request::builder()
        .method(Method::POST)
        .uri(format!("{base}/_sluice/events/hot/holds"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(body(json!({"qty": qty}).to_string()))
        .unwrap();
    TestClient::new().try_send(req).await
}

fn expect(res: &Answer, status: u16, code: &str) -> Value {
    assert_eq!(res.status, status, "{}", res.text());
    let v = res.json();
    assert_eq!(v["code"], code, "{v}");
    v
}

/// What the visitors were answered, for the final check.
#[derive(Default)]
struct Tally {
    /// Units of 201 answers per visitor.
    units: HashMap<usize, u64>,
    /// Hold ids taken, with their owner.
    holds: Vec<(usize, String)>,
    sold_out: u64,
    /// Units asked by requests whose answer was lost (the gateway killed
    /// under them): held or not, the client cannot know.
    unanswered: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_a_cluster_sell_a_sharded_event_exactly() {
    let Some(cluster) = RedisCluster::start(3, 0) else {
        return;
    };
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let a = gateway(&cluster, &origin, &keys);
    let mut b = gateway(&cluster, &origin, &keys);
    let (base_a, base_b) = (a.url(), b.url());
    let v = wait_sharded(&base_a, 8).await;
    assert_eq!(v["total"], TOTAL, "{v}");
    assert_eq!(v["shard_states"].as_array().unwrap().len(), 8, "{v}");
    // The shards spread over the primaries.
    let primaries: std::collections::HashSet<u16> = (0..8)
        .map(|k| {
            let id = if k == 0 {
                "hot".to_owned()
            } else {
                format!("hot~{k}")
            };
            cluster.primary_for(&format!("sluice:{{{id}}}:stock"))
        })
        .collect();
    assert_eq!(primaries.len(), 3, "{primaries:?}");

    // A shard is never an event of the API.
    let probe = admitted_visitor(&keys, &base_a, "hall");
    expect(&hold(&probe, "hot~3", 1).await, 404, "event_not_found");
    let res = probe.get_admitted("/_sluice/events/hot~3").await;
    expect(&res, 404, "event_not_found");
    let put = json!({"total": 5, "cart_limit": 1, "hold_ttl_seconds": 60, "version": 9});
    expect(
        &admin(&base_a, Method::PUT, "hot~3", &put.to_string()).await,
        422,
        "invalid_setting",
    );

    // 90 visitors, each wanting more than the cart limit, through both
    // gateways at once; one greedy visitor fires 20 holds of 1 at both.
    let visitors: Vec<Arc<Visitor>> = (0..90)
        .map(|i| {
            let base = if i % 2 == 0 { &base_a } else { &base_b };
            Arc::new(admitted_visitor(&keys, base, "hall"))
        })
        .collect();
    let greedy_token = visitors[0].admission_token.clone().unwrap();
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    let mut tasks = Vec::new();
    for (i, v) in visitors.iter().enumerate() {
        let base = if i % 2 == 0 { &base_a } else { &base_b }.clone();
        let (token, tally) = (v.admission_token.clone().unwrap(), tally.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..3 {
                let qty = 1 + ((i + round) % 2) as u64;
                match try_hold(&base, &token, qty).await {
                    Some(res) => record(&tally, i, qty, &res),
                    None => tally.lock().unwrap().unanswered += qty,
                }
            }
        }));
    }
    for n in 0..20 {
        let base = if n % 2 == 0 { &base_a } else { &base_b }.clone();
        let (token, tally) = (greedy_token.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            match try_hold(&base, &token, 1).await {
                Some(res) => record(&tally, 0, 1, &res),
                None => tally.lock().unwrap().unanswered += 1,
            }
        }));
    }
    // Gateway B dies mid-sale (SIGKILL: transfers may be cut in half)
    // and comes back.
    tokio::time::sleep(Duration::from_millis(150)).await;
    b.signal("KILL");
    b.wait(Duration::from_secs(5));
    for t in tasks {
        t.await.unwrap();
    }
    let b = gateway(&cluster, &origin, &keys);
    let base_b = b.url();
    // The visitors that B's death cut short try again through B.
    for (i, v) in visitors.iter().enumerate() {
        let have = tally.lock().unwrap().units.get(&i).copied().unwrap_or(0);
        if have < LIMIT {
            let mut v2 = Visitor::new(&base_b, "hall");
            v2.admission_token = v.admission_token.clone();
            let res = hold(&v2, "hot", LIMIT - have).await;
            record(&tally, i, LIMIT - have, &res);
        }
    }

    // Nobody over the limit, the greedy visitor included.
    {
        let t = tally.lock().unwrap();
        for (i, units) in &t.units {
            assert!(*units <= LIMIT, "visitor {i} holds {units}");
        }
        assert!(t.sold_out > 0, "demand above the stock must see sold out");
    }
    // Units a killed gateway left in transit land (the reapers sweep
    // them): until then they are sold to nobody, after it they are on
    // sale again. Late visitors take whatever is left, through both
    // gateways; then exactly the stock is held and nothing is left.
    let deadline = Instant::now() + Duration::from_secs(20);
    while view(&base_a, "hot").await["in_transit"] != 0 {
        assert!(Instant::now() < deadline, "units stuck in transit");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in 0..40 {
        let base = if n % 2 == 0 { &base_a } else { &base_b };
        let late = admitted_visitor(&keys, base, "hall");
        let res = hold(&late, "hot", 1).await;
        record(&tally, 1000 + n, 1, &res);
        if res.status == 409 {
            break;
        }
    }
    let (held, unanswered, holds) = {
        let t = tally.lock().unwrap();
        (t.units.values().sum::<u64>(), t.unanswered, t.holds.clone())
    };
    let v = view(&base_a, "hot").await;
    assert_eq!(
        (v["available"].as_u64(), v["in_transit"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(v["invariant_holds"], true, "{v}");
    assert_eq!(v["held"], TOTAL, "{v}");
    // Every answered hold is in the store; the rest are holds whose
    // answer the kill lost.
    assert!(
        held <= TOTAL && TOTAL - held <= unanswered,
        "answers {held}, lost {unanswered}: {v}"
    );
    // The store's own carts: each visitor's units on its home shard
    // only, never above the limit (the answers lost included).
    let mut carts: HashMap<String, (u64, usize)> = HashMap::new();
    for k in 0..8 {
        let id = if k == 0 {
            "hot".to_owned()
        } else {
            format!("hot~{k}")
        };
        let out = cluster.cli(&["HGETALL", &format!("sluice:{{{id}}}:visitors")]);
        let lines: Vec<&str> = out.lines().collect();
        for pair in lines.chunks(2) {
            let units: u64 = pair[1].trim().parse().unwrap();
            let e = carts.entry(pair[0].trim().to_owned()).or_default();
            e.0 += units;
            e.1 += 1;
        }
    }
    assert_eq!(carts.values().map(|c| c.0).sum::<u64>(), TOTAL);
    for (visitor, (units, shards)) in &carts {
        assert!(*units <= LIMIT, "{visitor} holds {units}");
        assert_eq!(*shards, 1, "{visitor}'s cart on {shards} shards");
    }
    let per_shard: u64 = v["shard_states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["held"].as_u64().unwrap())
        .sum();
    assert_eq!(per_shard, TOTAL, "{v}");

    // Holds on shards read, release and pay by id, on either gateway.
    let (owner, id) = holds[0].clone();
    let (other, _) = holds.iter().find(|(o, _)| *o != owner).unwrap().clone();
    let token = |i: usize| visitors[i].admission_token.clone().unwrap();
    let mut mine = Visitor::new(&base_b, "hall");
    mine.admission_token = Some(token(owner));
    let res = mine.get_admitted(&format!("/_sluice/holds/{id}")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["event"], "hot");
    let paid_qty = res.json()["qty"].as_u64().unwrap();
    let mut theirs = Visitor::new(&base_b, "hall");
    theirs.admission_token = Some(token(other));
    expect(
        &theirs.get_admitted(&format!("/_sluice/holds/{id}")).await,
        404,
        "hold_not_found",
    );
    let paid = pay_succeeded(&base_a, WEBHOOK_SECRET, &id).await;
    assert_eq!(paid.status, 200, "{}", paid.text());
    assert_eq!(paid.json()["status"], "confirmed");

    // The shard count cannot change while units are held or sold; the
    // total can (shard 0 takes the new units, visitors pull them).
    let busy = json!({"total": TOTAL, "cart_limit": LIMIT, "hold_ttl_seconds": 300, "version": 2, "shards": 4});
    let p = expect(
        &admin(&base_a, Method::PUT, "hot", &busy.to_string()).await,
        409,
        "shards_busy",
    );
    assert!(p["held"].as_u64().unwrap() > 0, "{p}");
    assert_eq!(view(&base_b, "hot").await["shards"], 8);
    let more =
        json!({"total": TOTAL + 10, "cart_limit": LIMIT, "hold_ttl_seconds": 300, "version": 2});
    let res = admin(&base_b, Method::PUT, "hot", &more.to_string()).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let late = admitted_visitor(&keys, &base_a, "hall");
    let res = hold(&late, "hot", 2).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let v = view(&base_a, "hot").await;
    assert_eq!(
        (
            v["total"].as_u64(),
            v["available"].as_u64(),
            v["confirmed"].as_u64()
        ),
        (Some(TOTAL + 10), Some(8), Some(paid_qty)),
        "{v}"
    );
    assert_eq!(v["invariant_holds"], true, "{v}");
    drop((a, b));
}

fn record(tally: &std::sync::Mutex<Tally>, visitor: usize, qty: u64, res: &Answer) {
    let mut t = tally.lock().unwrap();
    match res.status.as_u16() {
        201 => {
            *t.units.entry(visitor).or_default() += qty;
            let v = res.json();
            t.holds
                .push((visitor, v["hold_id"].as_str().unwrap().to_owned()));
            assert_eq!(v["event"], "hot");
        }
        409 => match res.json()["code"].as_str() {
            Some("sold_out") => t.sold_out += 1,
            Some("cart_limit_exceeded") => {}
            other => panic!("{other:?}: {}", res.text()),
        },
        // A store call cut short by the kill (nothing taken).
        503 => {}
        s => panic!("{s}: {}", res.text()),
    }
}

/// In memory: each bad input of the layout answers its code and changes
/// nothing; the count changes once nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_refusals_change_nothing_in_memory() {
    let origin = TestOrigin::start().await;
    let room = RoomConfig {
        id: "default".into(),
        rate_per_sec: 10_000.0,
        burst: 10_000.0,
        puzzles: 1,
        difficulty_floor_bits: 1,
        difficulty_ceiling_bits: 2,
        join_limit_per_prefix_per_min: 0,
        attack_min_solve: Duration::ZERO,
        ..RoomConfig::default()
    };
    let hot = EventConfig {
        id: "hot".into(),
        total: 40,
        cart_limit: 2,
        shards: 4,
        ..EventConfig::default()
    };
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(move |c| {
            c.rooms = vec![room];
            c.events = vec![hot];
        })
        .spawn()
        .await;
    let base = gw.url();
    let before = wait_sharded(&base, 4).await;
    let put = |extra: Value| {
        let mut v = json!({"total": 40, "cart_limit": 2, "hold_ttl_seconds": 300, "version": 5});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v.to_string()
    };
    for bad in [
        json!({"shards": 0}),
        json!({"shards": 65}),
        json!({"shards": "8"}),
        json!({"shards": -1}),
    ] {
        expect(
            &admin(&base, Method::PUT, "hot", &put(bad)).await,
            422,
            "invalid_setting",
        );
    }
    let cats = json!({"shards": 2, "categories": [{"id": "floor", "total": 40}]});
    expect(
        &admin(&base, Method::PUT, "hot", &put(cats)).await,
        422,
        "invalid_setting",
    );
    let waves = json!({"waves": [{"at": 4_102_444_800u64, "qty": 5}]});
    let res = admin(&base, Method::PUT, "hot/waves", &waves.to_string()).await;
    expect(&res, 422, "invalid_setting");
    // A count change with a hold open.
    let mut v = Visitor::new(&base, "default");
    assert!(v.join("/").await.status.is_success());
    assert!(v.wait_admitted(Duration::from_secs(20), 50).await);
    let res = hold(&v, "hot", 2).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hold_id = res.json()["hold_id"].as_str().unwrap().to_owned();
    let p = expect(
        &admin(&base, Method::PUT, "hot", &put(json!({"shards": 8}))).await,
        409,
        "shards_busy",
    );
    assert_eq!(
        (p["held"].as_u64(), p["confirmed"].as_u64()),
        (Some(2), Some(0))
    );
    let after = view(&base, "hot").await;
    for k in ["shards", "total", "version", "held"] {
        assert_eq!(
            after[k],
            if k == "held" {
                json!(2)
            } else {
                before[k].clone()
            },
            "{k}: {after}"
        );
    }
    // Released: the count changes, the stock re-split.
    let res = v
        .call_admitted(
            Method::DELETE,
            &format!("/_sluice/holds/{hold_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = admin(&base, Method::PUT, "hot", &put(json!({"shards": 8}))).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let v8 = res.json();
    assert_eq!(
        (
            v8["shards"].as_u64(),
            v8["total"].as_u64(),
            v8["available"].as_u64()
        ),
        (Some(8), Some(40), Some(40)),
        "{v8}"
    );
    assert_eq!(v8["shard_states"].as_array().unwrap().len(), 8);
    gw.shutdown().await;
}
