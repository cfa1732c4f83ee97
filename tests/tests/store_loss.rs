//! Store loss never puts sold stock back on sale (issue 18), with a real
//! `redis-server` and real `sluice serve` processes started with
//! `--load-stock` (the flag that used to reload configured stock into any
//! store missing the event).
//!
//! Each test sells 4 of 5 units (two holds of 2, paid through the signed
//! webhook), then loses the event in one way or another:
//!
//! - `FLUSHALL`, then every gateway restarted: with `[reservation]
//!   state_file` the gateways remember the event and refuse to load it;
//! - `FLUSHALL` while one gateway stays up: it writes the store's load
//!   marker back within a tick, so a gateway restarted afterwards refuses
//!   too, without any state file;
//! - the event's keys deleted (all of them, the counters only, the stream
//!   only) while the gateways run, then one restarted: the marker, which is
//!   not one of the event's keys, survives and says "lost".
//!
//! A lost event answers 503 `inventory_not_ready` to holds and reads (never
//! 201, never `sold_out`), the admin view says `lost`, and the operator's
//! explicit load (`PUT /_sluice/admin/events/{event}`) works, answers
//! `"lost": true` and is logged. A store that never had the event still
//! gets the configured stock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};
use sluice_tests::client::{TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, temp_file, temp_keys};

const WEBHOOK_SECRET: &str = "whsec-store-loss-0123456789";
const TOTAL: u64 = 5;

/// One store, one origin, one keys directory: what every gateway of a test
/// shares.
struct Site {
    redis: RedisServer,
    origin: TestOrigin,
    keys: PathBuf,
}

impl Site {
    async fn start() -> Option<Site> {
        let redis = RedisServer::start()?;
        Some(Site {
            redis,
            origin: TestOrigin::start().await,
            keys: temp_keys(),
        })
    }

    /// The config of a gateway, with its own state file when `state_file`.
    fn config(&self, state_file: Option<&Path>) -> PathBuf {
        let mut text = String::from(
            "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 500\nburst = 500\npuzzles = 1\n\
             difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
             attack_min_solve = \"0s\"\n\n",
        );
        text.push_str(&format!(
            "[[events]]\nid = \"gig\"\nroom = \"hall\"\ntotal = {TOTAL}\ncart_limit = 4\nhold_ttl = \"120s\"\n\n"
        ));
        if let Some(p) = state_file {
            text.push_str(&format!(
                "[reservation]\nstate_file = {:?}\n",
                p.to_str().unwrap()
            ));
        }
        temp_file("store-loss.toml", &text)
    }

    /// `sluice serve --load-stock` on this site, its log kept.
    fn gateway(&self, state_file: Option<&Path>) -> GatewayProcess {
        let cfg = self.config(state_file);
        GatewayProcess::start_logged(
            &[
                "--redis",
                &self.redis.url(),
                "--origin",
                &self.origin.url(),
                "--config",
                cfg.to_str().unwrap(),
                "--keys-dir",
                self.keys.to_str().unwrap(),
                "--admin-token",
                ADMIN_TOKEN,
                "--webhook-secret",
                WEBHOOK_SECRET,
                "--load-stock",
            ],
            "warn,audit=info,sluice_gateway::reserve=info",
        )
    }

    /// A visitor of room `hall` with an admission signed by the site's key.
    fn visitor(&self, base: &str) -> Visitor {
        sluice_tests::admitted_visitor(&self.keys, base, "hall")
    }

    /// Deletes the keys matching each of `patterns` (`KEYS` globs), leaving
    /// every other key: an eviction or a partial loss.
    fn delete(&self, patterns: &[&str]) {
        for pattern in patterns {
            let reply = self.redis.command(&format!(
                "EVAL \"local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do n = n + redis.call('DEL', k) end return n\" 0 {pattern}"
            ));
            assert!(reply.starts_with(':'), "{reply}");
            let n: i64 = reply.trim().trim_start_matches(':').parse().unwrap();
            assert!(n > 0, "nothing matched {pattern}");
        }
    }
}

fn state_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-state-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

async fn hold(v: &Visitor, qty: u64) -> sluice_tests::client::Answer {
    v.call_admitted(
        Method::POST,
        "/_sluice/events/gig/holds",
        Some(json!({"qty": qty})),
        &[],
    )
    .await
}

async fn pay(base: &str, hold_id: &str) -> sluice_tests::client::Answer {
    sluice_tests::pay_succeeded(base, WEBHOOK_SECRET, hold_id).await
}

async fn admin_event(base: &str) -> Value {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    TestClient::new()
        .get(
            &format!("{base}/_sluice/admin/events/gig"),
            &[("authorization", &bearer)],
        )
        .await
        .json()
}

async fn admin_put(base: &str, spec: Value) -> sluice_tests::client::Answer {
    TestClient::new()
        .call(
            Method::PUT,
            &format!("{base}/_sluice/admin/events/gig"),
            &[
                ("authorization", &format!("Bearer {ADMIN_TOKEN}")),
                ("content-type", "application/json"),
            ],
            body(spec.to_string()),
        )
        .await
}

/// Waits until the gateway's view of `gig` satisfies `check`.
async fn until_event(base: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let e = admin_event(base).await;
        if check(&e) {
            return e;
        }
        assert!(Instant::now() < deadline, "{what}: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sells 4 of the 5 units through `base`: two visitors hold 2 each and pay.
async fn sell_four(site: &Site, base: &str) {
    until_event(base, "configured stock loaded", |e| e["available"] == TOTAL).await;
    for _ in 0..2 {
        let v = site.visitor(base);
        let res = hold(&v, 2).await;
        assert_eq!(res.status, 201, "{}", res.text());
        let id = res.json()["hold_id"].as_str().unwrap().to_owned();
        let paid = pay(base, &id).await;
        assert_eq!(paid.status, 200, "{}", paid.text());
        assert_eq!(paid.json()["status"], "confirmed");
    }
    let e = admin_event(base).await;
    assert_eq!(
        (&e["available"], &e["held"], &e["confirmed"]),
        (&json!(1), &json!(0), &json!(4)),
        "{e}"
    );
}

/// The event is lost and stays lost: holds answer 503
/// `inventory_not_ready` (never 201, never `sold_out`), the visitor's read
/// too, and the admin view says not ready.
async fn assert_not_on_sale(site: &Site, base: &str) {
    for qty in [1, 2, 1] {
        let v = site.visitor(base);
        let res = hold(&v, qty).await;
        assert_eq!(res.status, 503, "sold again after the loss: {}", res.text());
        assert_eq!(res.json()["code"], "inventory_not_ready", "{}", res.text());
    }
    let v = site.visitor(base);
    let res = v
        .call_admitted(Method::GET, "/_sluice/events/gig", None, &[])
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["code"], "inventory_not_ready");
    let e = admin_event(base).await;
    assert_eq!(e["ready"], false, "{e}");
}

/// The operator loads what is really left (1 unit): 201 saying the event had
/// been lost, logged; then exactly that unit is sold.
async fn operator_loads_the_rest(site: &Site, gw: &GatewayProcess) {
    let base = gw.url();
    let e = admin_event(&base).await;
    assert_eq!(e["lost"], true, "the admin view should say lost: {e}");
    let res = admin_put(
        &base,
        json!({"total": 1, "cart_limit": 4, "hold_ttl_seconds": 120, "version": 1}),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let answer = res.json();
    assert_eq!(answer["lost"], true, "{answer}");
    assert_eq!(answer["available"], 1, "{answer}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gw
        .log_lines()
        .iter()
        .any(|l| l.contains("after the store had lost the event"))
    {
        assert!(Instant::now() < deadline, "the reload was not logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = site.visitor(&base);
    let res = hold(&v, 1).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let res = hold(&site.visitor(&base), 1).await;
    assert_eq!(res.status, 409, "{}", res.text());
    assert_eq!(res.json()["code"], "sold_out");
}

/// Two gateways with state files sell 4 of 5; Redis is flushed; both are
/// killed and restarted with `--load-stock`: the store cannot tell (its
/// marker went with the flush), the state files can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_then_every_gateway_restarted_never_resells_with_state_files() {
    let Some(site) = Site::start().await else {
        return;
    };
    let files = [state_file("gw1.json"), state_file("gw2.json")];
    let gws: Vec<_> = files.iter().map(|f| site.gateway(Some(f))).collect();
    sell_four(&site, &gws[0].url()).await;
    // Both gateways have seen the event loaded (a reaper tick each).
    for f in &files {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !std::fs::read_to_string(f).is_ok_and(|t| t.contains("\"gig\"")) {
            assert!(Instant::now() < deadline, "{} never written", f.display());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(gws);
    site.redis.command("FLUSHALL");
    let gws: Vec<_> = files.iter().map(|f| site.gateway(Some(f))).collect();
    tokio::time::sleep(Duration::from_millis(2500)).await; // reaper ticks
    for gw in &gws {
        assert_not_on_sale(&site, &gw.url()).await;
        assert!(
            gw.log_lines().iter().any(|l| l.contains("event lost")),
            "the loss was not logged"
        );
    }
    operator_loads_the_rest(&site, &gws[1]).await;
}

/// A flush while one gateway stays up: it puts the load marker back, so a
/// gateway restarted with `--load-stock` (no state file anywhere) refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_behind_a_running_gateway_is_never_taken_for_a_new_store() {
    let Some(site) = Site::start().await else {
        return;
    };
    let stays = site.gateway(None);
    let restarts = site.gateway(None);
    sell_four(&site, &stays.url()).await;
    until_event(&restarts.url(), "second gateway sees the sale", |e| {
        e["confirmed"] == 4
    })
    .await;
    site.redis.command("FLUSHALL");
    drop(restarts);
    // One reaper tick of the running gateway writes the marker back.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !site
        .redis
        .command("EXISTS sluice:loaded:{gig}")
        .starts_with(":1")
    {
        assert!(Instant::now() < deadline, "the marker was not written back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let restarted = site.gateway(None);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_not_on_sale(&site, &restarted.url()).await;
    assert_not_on_sale(&site, &stays.url()).await;
    operator_loads_the_rest(&site, &restarted).await;
}

/// The event's keys vanish behind running gateways: all of them, the
/// counters only (stock and settings), or the stream only. Nothing is
/// reloaded, not by the running gateways and not by one restarted with
/// `--load-stock`; losing only the stream loses no sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_event_keys_are_never_reloaded_from_the_configuration() {
    let variants: [(&str, &[&str]); 3] = [
        ("all", &["sluice:{gig}:*"]),
        ("counters", &["sluice:{gig}:stock", "sluice:{gig}:meta"]),
        ("stream", &["sluice:{gig}:stream"]),
    ];
    for (what, patterns) in variants {
        let Some(site) = Site::start().await else {
            return;
        };
        let running = site.gateway(None);
        let restarted = site.gateway(None);
        sell_four(&site, &running.url()).await;
        site.delete(patterns);
        drop(restarted);
        let restarted = site.gateway(None);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        if what == "stream" {
            // The counters are intact: the last unit sells, once.
            let e = admin_event(&restarted.url()).await;
            assert_eq!(
                (&e["available"], &e["confirmed"]),
                (&json!(1), &json!(4)),
                "{e}"
            );
            assert_eq!(hold(&site.visitor(&restarted.url()), 1).await.status, 201);
            let res = hold(&site.visitor(&running.url()), 1).await;
            assert_eq!(res.json()["code"], "sold_out", "{}", res.text());
            continue;
        }
        for gw in [&running, &restarted] {
            assert_not_on_sale(&site, &gw.url()).await;
        }
        assert!(
            restarted
                .log_lines()
                .iter()
                .any(|l| l.contains("event lost")),
            "{what}: the refusal was not logged"
        );
        operator_loads_the_rest(&site, &running).await;
    }
}

/// The normal path still works: a store that never had the event gets the
/// configured stock from the first gateway, and a second gateway starting
/// later changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_never_had_the_event_gets_the_configured_stock() {
    let Some(site) = Site::start().await else {
        return;
    };
    let first = site.gateway(None);
    let e = until_event(&first.url(), "configured stock loaded", |e| {
        e["available"] == TOTAL
    })
    .await;
    assert_eq!(e["lost"], Value::Null, "{e}");
    let v = site.visitor(&first.url());
    assert_eq!(hold(&v, 2).await.status, 201);
    let second = site.gateway(None);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = admin_event(&second.url()).await;
    assert_eq!(
        (&e["available"], &e["held"], &e["total"]),
        (&json!(3), &json!(2), &json!(5)),
        "{e}"
    );
    assert_eq!(
        site.redis.command("GET sluice:loaded:{gig}").trim(),
        "$1\r\n1"
    );
}

/// On Redis Cluster every key a rebuild touches (counters, holds, visitor
/// indexes, the load marker) lives in the event's slot: `restore`,
/// `load_if_new` and an operator's reload run on events of every shard, and
/// the restored holds behave (cart counts, a payment, a release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuilds_run_on_every_shard_of_a_cluster() {
    use sluice_reservation::{
        ConfirmOutcome, EventId, EventRecord, HoldId, HoldOutcome, Inventory, LoadOutcome,
        OpenHold, RedisConfig, RedisInventory, RestoreOutcome, SetStockOutcome, StockSpec,
    };
    let Some(cluster) = sluice_tests::cluster::RedisCluster::start(3, 0) else {
        return;
    };
    let inv = RedisInventory::connect(&RedisConfig::new(cluster.url()))
        .await
        .unwrap();
    let spec = |total, version| StockSpec {
        total,
        cart_limit: 4,
        hold_ttl: Duration::from_secs(600),
        version,
        room: "hall".into(),
    };
    let mut shards = std::collections::HashSet::new();
    for i in 0..24 {
        let ev = EventId::parse(&format!("shard-{i}")).unwrap();
        shards.insert(cluster.primary_for(&format!("sluice:{{{ev}}}:stock")));
        assert_eq!(
            inv.load_if_new(&ev, &spec(5, 1)).await.unwrap(),
            LoadOutcome::Loaded { available: 5 }
        );
        // The event's keys go (the marker stays): a lost event.
        for key in ["stock", "meta", "deadlines", "visitors", "stream"] {
            cluster.cli(&["DEL", &format!("sluice:{{{ev}}}:{key}")]);
        }
        assert_eq!(
            inv.load_if_new(&ev, &spec(5, 1)).await.unwrap(),
            LoadOutcome::Lost { last_version: 1 }
        );
        let now = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        let a = OpenHold {
            hold_id: HoldId::generate(&ev),
            visitor: "alice".into(),
            qty: 2,
            expires_at_ms: now + 300_000,
        };
        let record = EventRecord {
            confirmed_holds: Vec::new(),
            total: 5,
            version: 3,
            confirmed: vec![("alice".into(), 1)],
            open_holds: vec![a.clone()],
        };
        assert_eq!(
            inv.restore(&ev, &spec(5, 1), &record).await.unwrap(),
            RestoreOutcome::Restored {
                available: 2,
                held: 2,
                confirmed: 1
            }
        );
        assert_eq!(
            inv.hold(&ev, "alice", 2, None).await.unwrap(),
            HoldOutcome::CartLimitExceeded { limit: 4, held: 3 }
        );
        assert_eq!(
            inv.confirm(&a.hold_id, "pay", true).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
        let s = inv.read(&ev).await.unwrap().unwrap();
        assert_eq!(
            (s.available, s.held, s.confirmed, s.version),
            (Some(2), 0, 3, 3)
        );
        assert!(s.invariant_holds);
        if i % 8 == 0 {
            // And the operator's reload of a lost one.
            for key in ["stock", "meta"] {
                cluster.cli(&["DEL", &format!("sluice:{{{ev}}}:{key}")]);
            }
            assert_eq!(
                inv.set_stock(&ev, &spec(1, 1)).await.unwrap(),
                SetStockOutcome::Recreated {
                    available: 1,
                    lost_version: 3
                }
            );
        }
    }
    assert_eq!(shards.len(), 3, "events on every shard: {shards:?}");
}
