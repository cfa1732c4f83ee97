//! A Sentinel failover under write load.
//!
//! A primary `redis-server`, one replica (`--replicaof`), one Redis
//! Sentinel watching them, and a `sluice` gateway over
//! `redis+sentinel://…` with `replication.wait_replicas = 1`. Visitors
//! join, then hold, confirm (through the signed payment webhook, retried
//! like a payment provider) and release as fast as they can while the
//! primary is SIGKILLed; Sentinel promotes the replica, the gateway
//! follows it without a restart, and once a fresh replica follows the new
//! primary holds are acknowledged again. Afterwards:
//!
//! - the stock invariant holds and nothing is oversold;
//! - every hold the gateway acknowledged (201, `WAIT` satisfied) still
//!   exists, in the state last acknowledged; every acknowledged
//!   confirmation is still confirmed (the one loss that could oversell);
//! - joins before and after the failover never share a seq.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};
use sluice_gateway::app::now_s;
use sluice_gateway::reserve::sign_webhook;
use sluice_tests::client::{TestClient, body};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::{RedisOptions, RedisServer};
use sluice_tests::sentinel::Sentinel;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, temp_file, temp_keys};

const WEBHOOK_SECRET: &str = "whsec-failover-0123456789";
const TOTAL: u64 = 500;

/// What the gateway acknowledged about one hold.
#[derive(Clone, Debug, Default)]
struct Acked {
    visitor: usize,
    confirmed: bool,
    released: bool,
    /// A confirm or release was sent without an answer saying it happened
    /// (503 while the primary was gone): its fate is open.
    unsure: bool,
}

/// Each load task's record, merged at the end.
#[derive(Default)]
struct Ledger {
    holds: HashMap<String, Acked>,
    unavailable: u64,
    acked_before_kill: u64,
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(10), f).await.ok()
}

/// The payment provider: delivers the signed webhook, retrying on 503
/// (as providers do) for a while. `Some(status)` once answered otherwise.
async fn pay(c: &TestClient, base: &str, hold_id: &str) -> Option<String> {
    let payload =
        json!({"payment_event_id": format!("pe-{hold_id}"), "hold_id": hold_id, "outcome": "succeeded"})
            .to_string();
    for _ in 0..20 {
        let sig = sign_webhook(WEBHOOK_SECRET.as_bytes(), now_s(), payload.as_bytes());
        let res = bounded(c.call(
            Method::POST,
            &format!("{base}/_sluice/webhooks/payment"),
            &[
                ("content-type", "application/json"),
                ("sluice-signature", &sig),
            ],
            body(payload.clone()),
        ))
        .await?;
        if res.status != 503 {
            return res.json()["status"].as_str().map(str::to_owned);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// One visitor buying until told to stop: hold 1, then confirm it, release
/// it or keep it, in turn.
async fn buyer(
    i: usize,
    v: Arc<Visitor>,
    stop: Arc<AtomicBool>,
    killed: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
) -> Ledger {
    let c = TestClient::new();
    let mut ledger = Ledger::default();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("v{i}-{n}");
        let Some(res) = bounded(v.call_admitted(
            Method::POST,
            "/_sluice/events/gig/holds",
            Some(json!({"qty": 1})),
            &[("idempotency-key", &key)],
        ))
        .await
        else {
            continue;
        };
        match res.status.as_u16() {
            201 => {}
            503 => {
                ledger.unavailable += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            409 => break, // sold out or cart full: done
            other => panic!("hold answered {other}: {}", res.text()),
        }
        let id = res.json()["hold_id"].as_str().unwrap().to_owned();
        if !killed.load(Ordering::Relaxed) {
            ledger.acked_before_kill += 1;
        }
        acked.fetch_add(1, Ordering::Relaxed);
        let mut a = Acked {
            visitor: i,
            ..Acked::default()
        };
        match n % 3 {
            0 => match pay(&c, &v.base, &id).await.as_deref() {
                Some("confirmed") => a.confirmed = true,
                _ => a.unsure = true,
            },
            1 => {
                let res = bounded(v.call_admitted(
                    Method::DELETE,
                    &format!("/_sluice/holds/{id}"),
                    None,
                    &[],
                ))
                .await;
                match res {
                    Some(r) if r.status == 200 => a.released = true,
                    _ => a.unsure = true,
                }
            }
            _ => {}
        }
        ledger.holds.insert(id, a);
    }
    ledger
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

/// The seq a visitor was given: in the join's answer when it waited, in its
/// admission token when it was let through at once.
fn seq_of(v: &Visitor) -> u64 {
    use base64::Engine;
    if let Some(s) = v.seq {
        return s;
    }
    let token = v.admission_token.as_deref().expect("admitted");
    let payload = token.split('.').nth(1).expect("a JWT");
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .expect("base64url"),
    )
    .expect("JSON claims");
    claims["seq"]
        .as_u64()
        .expect("a seq in the admission token")
}

async fn join_many(base: &str, n: usize) -> Vec<Visitor> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut v = Visitor::new(base, "hall");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let res = v.join("/").await;
            if res.status.is_success() {
                break;
            }
            // 503 while the store fails over: join again, as a page would.
            assert_eq!(res.status, 503, "join: {}", res.text());
            assert!(Instant::now() < deadline, "joins never recovered");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(v.wait_admitted(Duration::from_secs(15), 200).await);
        out.push(v);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_under_write_load_loses_no_acknowledged_hold() {
    let Some(mut primary) = RedisServer::start() else {
        return;
    };
    // One replica: the one that acknowledges each hold is the one Sentinel
    // promotes (with several, `WAIT 1` cannot say which has the write).
    let mut replicas = Vec::new();
    for _ in 0..1 {
        let Some(r) = RedisServer::start_with(RedisOptions {
            extra_args: vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.port().to_string(),
                "--repl-diskless-sync-delay".into(),
                "0".into(),
            ],
            ..RedisOptions::default()
        }) else {
            return;
        };
        replicas.push(r);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for r in &replicas {
        while !r
            .command("INFO replication")
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "replica never synced");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let Some(sentinel) = Sentinel::start("shop", primary.port()) else {
        return;
    };
    sentinel.wait_replicas(1, Duration::from_secs(20));

    let cfg = temp_file(
        "failover.toml",
        &format!(
            "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 500\nburst = 500\npuzzles = 1\n\
             difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
             attack_min_solve = \"0s\"\n\n\
             [[events]]\nid = \"gig\"\nroom = \"hall\"\ntotal = {TOTAL}\ncart_limit = 200\nhold_ttl = \"120s\"\n\n\
             [replication]\nwait_replicas = 1\nwait_timeout = \"200ms\"\n"
        ),
    );
    let keys = temp_keys();
    let origin = TestOrigin::start().await;
    let gw = GatewayProcess::start_shared(
        &sentinel.url(),
        &origin.url(),
        &cfg,
        &keys,
        "failover-test-pow-secret-0123",
        &["--webhook-secret", WEBHOOK_SECRET],
    );
    let base = gw.url();

    // Joins before the failover.
    let visitors: Vec<Arc<Visitor>> = join_many(&base, 16)
        .await
        .into_iter()
        .map(Arc::new)
        .collect();
    let mut seqs: Vec<u64> = visitors.iter().map(|v| seq_of(v)).collect();

    // Write load, the primary killed in the middle of it.
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = visitors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            tokio::spawn(buyer(
                i,
                v.clone(),
                stop.clone(),
                killed.clone(),
                acked.clone(),
            ))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    while acked.load(Ordering::Relaxed) < 60 {
        assert!(Instant::now() < deadline, "no load before the kill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    killed.store(true, Ordering::Relaxed);
    primary.kill();
    let at_kill = acked.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    let promoted = loop {
        if let Some(r) = replicas
            .iter()
            .find(|r| sentinel.primary_port() == Some(r.port()))
        {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "Sentinel never promoted a replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(promoted.command("ROLE").contains("master"));
    // Until a replica follows the new primary, `WAIT 1` fails and holds are
    // refused (503, given back). The operator adds one; holds resume.
    let _fresh = RedisServer::start_with(RedisOptions {
        extra_args: vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            promoted.port().to_string(),
            "--repl-diskless-sync-delay".into(),
            "0".into(),
        ],
        ..RedisOptions::default()
    })
    .expect("redis-server");
    // The load carries on against the promoted replica.
    let deadline = Instant::now() + Duration::from_secs(25);
    while acked.load(Ordering::Relaxed) < at_kill + 60 {
        assert!(
            Instant::now() < deadline,
            "holds did not resume after the failover ({} acknowledged)",
            acked.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut ledger = Ledger::default();
    for t in tasks {
        let l = t.await.unwrap();
        ledger.holds.extend(l.holds);
        ledger.unavailable += l.unavailable;
        ledger.acked_before_kill += l.acked_before_kill;
    }
    assert!(ledger.acked_before_kill >= 60);
    eprintln!(
        "failover: {} holds acknowledged ({} before the kill), {} answered 503 meanwhile",
        ledger.holds.len(),
        ledger.acked_before_kill,
        ledger.unavailable
    );

    // The stock invariant, on the promoted replica; nothing oversold.
    let e = admin_event(&base).await;
    assert_eq!(e["invariant_holds"], true, "{e}");
    let (available, held, confirmed) = (
        e["available"].as_u64().unwrap(),
        e["held"].as_u64().unwrap(),
        e["confirmed"].as_u64().unwrap(),
    );
    assert_eq!(available + held + confirmed, TOTAL, "{e}");
    assert!(confirmed <= TOTAL, "{e}");

    // Every acknowledged hold is still there, as last acknowledged.
    let mut confirmed_acked = 0u64;
    for (id, a) in &ledger.holds {
        let v = &visitors[a.visitor];
        let res = bounded(v.call_admitted(Method::GET, &format!("/_sluice/holds/{id}"), None, &[]))
            .await
            .expect("hold read in time");
        assert_eq!(
            res.status,
            200,
            "acknowledged hold {id} lost: {}",
            res.text()
        );
        let status = res.json()["status"].as_str().unwrap().to_owned();
        if a.confirmed {
            confirmed_acked += 1;
            assert_eq!(
                status, "confirmed",
                "acknowledged confirmation of {id} lost"
            );
        } else if a.released {
            // A release is not waited for: a failover may undo it (the hold
            // then lapses at its deadline), never turn it into a sale.
            assert!(status == "released" || status == "held", "{id}: {status}");
        } else if !a.unsure {
            assert_eq!(status, "held", "acknowledged hold {id}");
        }
    }
    assert!(confirmed_acked > 0, "no confirmation went through");
    assert!(
        confirmed >= confirmed_acked,
        "{confirmed} < {confirmed_acked}"
    );

    // Joins after the failover: no seq handed out twice.
    let later = join_many(&base, 6).await;
    seqs.extend(later.iter().map(seq_of));
    let distinct: HashSet<u64> = seqs.iter().copied().collect();
    assert_eq!(distinct.len(), seqs.len(), "a seq was reissued: {seqs:?}");
}

/// `--redis-wait-replicas 1` with no replica at all: every hold is refused
/// with 503 `store_unavailable` (and `Retry-After`), its stock given back,
/// and counted in `sluice_hold_replication_lagged_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_no_replica_acknowledged_are_refused_and_given_back() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let cfg = temp_file(
        "lonely.toml",
        "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 500\nburst = 500\npuzzles = 1\n\
         difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
         attack_min_solve = \"0s\"\n\n\
         [[events]]\nid = \"gig\"\nroom = \"hall\"\ntotal = 10\ncart_limit = 4\nhold_ttl = \"60s\"\n",
    );
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = GatewayProcess::start(&[
        "--redis",
        &redis.url(),
        "--redis-wait-replicas",
        "1",
        "--redis-wait-timeout",
        "50ms",
        "--origin",
        &origin.url(),
        "--config",
        cfg.to_str().unwrap(),
        "--admin-token",
        ADMIN_TOKEN,
        "--keys-dir",
        keys.to_str().unwrap(),
        "--load-stock",
    ]);
    let base = gw.url();
    // Joins wait for replicas as holds do: none acknowledges, so a place a
    // failover could lose is never handed out.
    let mut joiner = Visitor::new(&base, "hall");
    for _ in 0..3 {
        let res = joiner.join("/").await;
        assert_eq!(res.status, 503, "{}", res.text());
        assert_eq!(res.json()["code"], "store_unavailable");
        assert!(res.header("retry-after").is_some());
    }
    // An admission as a gateway with replicas would have signed it.
    let v = sluice_tests::admitted_visitor(&keys, &base, "hall");
    for key in ["a", "a", "b"] {
        let res = v
            .call_admitted(
                Method::POST,
                "/_sluice/events/gig/holds",
                Some(json!({"qty": 2})),
                &[("idempotency-key", key)],
            )
            .await;
        assert_eq!(res.status, 503, "{}", res.text());
        assert_eq!(res.json()["code"], "store_unavailable");
        assert!(res.header("retry-after").is_some());
    }
    let e = admin_event(&base).await;
    assert_eq!(
        (&e["available"], &e["held"], &e["confirmed"]),
        (&json!(10), &json!(0), &json!(0)),
        "{e}"
    );
    assert_eq!(e["invariant_holds"], true);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let metrics = TestClient::new()
        .get(&format!("{base}/metrics"), &[("authorization", &bearer)])
        .await;
    assert!(
        metrics
            .text()
            .contains("sluice_hold_replication_lagged_total{op=\"hold\"} 3"),
        "{}",
        metrics.text()
    );
}

/// On Redis Cluster the script and its `WAIT` go to the node that owns the
/// event's slot, so the count is that node's replicas: with one replica per
/// primary, `wait_replicas = 1` holds on events of every shard, and `2`
/// (more than any shard has) is refused and given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_holds_wait_for_the_replica_of_their_own_shard() {
    use sluice_reservation::{
        EventId, HoldOutcome, Inventory, RedisConfig, RedisInventory, ReservationError, StockSpec,
    };
    let Some(cluster) = sluice_tests::cluster::RedisCluster::start(3, 1) else {
        return;
    };
    let connect = |n: u32| {
        let mut c = RedisConfig::new(cluster.url());
        c.wait_replicas = n;
        // Long enough for a replica on a loaded 2-core machine (100 ms
        // once left a write unacknowledged in the full suite); `two`
        // waits it out three times.
        c.wait_timeout = Duration::from_secs(1);
        async move { RedisInventory::connect(&c).await.unwrap() }
    };
    let one = connect(1).await;
    let two = connect(2).await;
    // Events on all three shards.
    let mut shards = HashSet::new();
    let mut events = Vec::new();
    for i in 0..200 {
        let name = format!("ev{i}");
        if shards.insert(cluster.primary_for(&format!("sluice:{{{name}}}:stock"))) {
            events.push(EventId::parse(&name).unwrap());
        }
        if events.len() == 3 {
            break;
        }
    }
    assert_eq!(events.len(), 3);
    for ev in &events {
        let spec = StockSpec {
            total: 10,
            cart_limit: 4,
            hold_ttl: Duration::from_secs(60),
            version: 1,
            room: "default".into(),
        };
        one.set_stock(ev, &spec).await.unwrap();
        assert!(matches!(
            one.hold(ev, "alice", 2, None).await.unwrap(),
            HoldOutcome::Held(_)
        ));
        let err = two.hold(ev, "bob", 2, Some("k")).await.unwrap_err();
        assert!(
            matches!(
                err,
                ReservationError::NotReplicated {
                    wanted: 2,
                    acked: 1
                }
            ),
            "{ev}: {err:?}"
        );
        let s = one.read(ev).await.unwrap().unwrap();
        assert_eq!((s.available, s.held), (Some(8), 2), "{ev}");
    }
}

/// The one-step join (replay guard, `join.lua` and the note in one
/// script) under `--redis-wait-replicas 1`: while no replica acknowledges,
/// a join is 503 (no place handed out that a failover could lose) and its
/// proof of work is given back: the same solution sent again is tried
/// again, never refused as spent; once a replica is back, that same
/// solution gets one place, and sending it again answers that place, never
/// a second one. (Checked to fail when the store stops refusing
/// unacknowledged joins, and when the gateway keeps the refused solution.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_no_replica_acknowledged_keeps_its_solution_and_buys_one_place_later() {
    let Some(primary) = RedisServer::start() else {
        return;
    };
    let replica_of = |port: u16| RedisOptions {
        extra_args: vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            port.to_string(),
            "--repl-diskless-sync-delay".into(),
            "0".into(),
        ],
        ..RedisOptions::default()
    };
    let Some(mut replica) = RedisServer::start_with(replica_of(primary.port())) else {
        return;
    };
    let synced = async |r: &RedisServer| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !r
            .command("INFO replication")
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "replica never synced");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    synced(&replica).await;
    // Nobody is let in after the room's one credit: every later join waits.
    let cfg = temp_file(
        "wait-join.toml",
        "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 0\nburst = 1\npuzzles = 1\n\
         difficulty_floor_bits = 1\ndifficulty_ceiling_bits = 2\njoin_limit_per_prefix_per_min = 0\n\
         attack_min_solve = \"0s\"\n",
    );
    let origin = TestOrigin::start().await;
    let keys = temp_keys();
    let gw = GatewayProcess::start(&[
        "--redis",
        &primary.url(),
        "--redis-wait-replicas",
        "1",
        "--redis-wait-timeout",
        "100ms",
        "--origin",
        &origin.url(),
        "--config",
        cfg.to_str().unwrap(),
        "--admin-token",
        ADMIN_TOKEN,
        "--keys-dir",
        keys.to_str().unwrap(),
    ]);
    let base = gw.url();
    let mut first = Visitor::new(&base, "hall");
    let res = first.join("/").await;
    assert_eq!(res.status, 200, "the credit: {}", res.text());
    assert!(res.json()["admission_token"].is_string(), "{}", res.text());

    replica.kill();
    let tail = |room: Value| room["tail"].as_u64().expect("tail");
    let before = tail(sluice_tests::admin_room(&base, "hall").await);
    let mut v = Visitor::new(&base, "hall");
    let (challenge, solutions) = v.solved().await;
    for attempt in 0..3 {
        let res = v.join_with(&challenge, &solutions, "/").await;
        assert_eq!(res.status, 503, "attempt {attempt}: {}", res.text());
        assert_eq!(res.json()["code"], "store_unavailable", "{}", res.text());
        assert!(res.header("retry-after").is_some());
        assert!(v.queue_token.is_none(), "no place handed out");
    }

    // Each refused attempt ran the script on the primary and was given
    // back: its seq is a gap nobody holds (a place a failover could lose
    // is never handed out), not a second place for anyone.
    assert_eq!(
        tail(sluice_tests::admin_room(&base, "hall").await),
        before + 3
    );
    // The replica comes back (empty: it syncs from the primary).
    replica.restart();
    synced(&replica).await;
    let res = v.join_with(&challenge, &solutions, "/").await;
    assert_eq!(res.status, 201, "the same solution, later: {}", res.text());
    let seq = res.json()["seq"].as_u64().expect("a waiting place");
    assert_eq!(seq, before + 4, "a fresh place, after the gaps");
    assert!(v.queue_token.is_some());
    for _ in 0..3 {
        let again = Visitor::new(&base, "hall")
            .join_with(&challenge, &solutions, "/")
            .await;
        assert_eq!(again.status, 201, "{}", again.text());
        assert_eq!(again.json()["seq"], json!(seq), "one solution, one place");
    }
    let mut other = Visitor::new(&base, "hall");
    let res = other.join("/").await;
    assert_eq!(res.status, 201, "{}", res.text());
    let next = res.json()["seq"].as_u64().unwrap();
    assert!(
        next > seq,
        "a new solution gets a place of its own: {next} after {seq}"
    );
    let res = v.status().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "waiting", "{}", res.text());
}
