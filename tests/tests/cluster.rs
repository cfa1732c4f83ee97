//! Two gateways over a 3-primary Redis Cluster (one replica each): rooms
//! and events on different shards, joins, admission, holds and reaping;
//! then a primary killed: the cluster fails over, the gateways carry on
//! without a restart, nothing is oversold.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use http::Method;
use serde_json::json;
use sluice_tests::client::TestClient;
use sluice_tests::cluster::RedisCluster;
use sluice_tests::origin::TestOrigin;
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, admin_room, temp_file, temp_keys};

/// Names whose hash tags land on distinct primaries.
fn spread_names(cluster: &RedisCluster, prefix: &str, key: &str, n: usize) -> Vec<(String, u16)> {
    let mut out: Vec<(String, u16)> = Vec::new();
    let mut ports = HashSet::new();
    for i in 0..200 {
        let name = format!("{prefix}{i}");
        let port = cluster.primary_for(&format!("sluice:{{{name}}}:{key}"));
        if ports.insert(port) {
            out.push((name, port));
            if out.len() == n {
                break;
            }
        }
    }
    assert_eq!(out.len(), n, "could not spread {n} names over the shards");
    out
}

async fn admin_event(base: &str, event: &str) -> serde_json::Value {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let res = TestClient::new()
        .get(
            &format!("{base}/_sluice/admin/events/{event}"),
            &[("authorization", &bearer)],
        )
        .await;
    res.json()
}

async fn hold(v: &Visitor, event: &str, qty: u64) -> (u16, serde_json::Value) {
    let res = v
        .call_admitted(
            Method::POST,
            &format!("/_sluice/events/{event}/holds"),
            Some(json!({ "qty": qty })),
            &[],
        )
        .await;
    let body = serde_json::from_slice(&res.body).unwrap_or(json!(null));
    (res.status.as_u16(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_over_a_three_shard_cluster_survive_a_failover() {
    let Some(mut cluster) = RedisCluster::start(3, 1) else {
        return;
    };
    let rooms = spread_names(&cluster, "room", "state", 2);
    let events = spread_names(&cluster, "ev", "stock", 2);
    let mut config = String::new();
    for (i, (room, _)) in rooms.iter().enumerate() {
        config.push_str(&format!(
            "[[rooms]]\nid = \"{room}\"\npaths = [\"/r{i}\"]\nrate_per_sec = 100\nburst = 100\npuzzles = 1\ndifficulty_floor_bits = 2\ndifficulty_ceiling_bits = 4\njoin_limit_per_prefix_per_min = 0\nattack_min_solve = \"0s\"\n\n"
        ));
    }
    for (i, (event, _)) in events.iter().enumerate() {
        config.push_str(&format!(
            "[[events]]\nid = \"{event}\"\nroom = \"{}\"\ntotal = 40\ncart_limit = 4\nhold_ttl = \"2s\"\n\n",
            rooms[i].0
        ));
    }
    let cfg = temp_file("cluster.toml", &config);
    let keys = temp_keys();
    let origin = TestOrigin::start().await;
    let url = cluster.url();
    let gws: Vec<GatewayProcess> = (0..2)
        .map(|_| {
            GatewayProcess::start_shared(
                &url,
                &origin.url(),
                &cfg,
                &keys,
                "cluster-test-pow-secret-0123",
                &[],
            )
        })
        .collect();
    let urls: Vec<String> = gws.iter().map(|g| g.url()).collect();

    // Joins and admission in both rooms, through both gateways.
    let mut visitors: Vec<(usize, Visitor)> = Vec::new();
    for i in 0..40usize {
        let r = i % 2;
        let mut v = Visitor::new(&urls[i % urls.len()], &rooms[r].0);
        let res = v.join("/").await;
        assert!(res.status.is_success(), "{}", res.text());
        assert!(v.wait_admitted(Duration::from_secs(15), 200).await);
        visitors.push((r, v));
    }
    for (room, _) in &rooms {
        // snapshots are at most a tick old
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let s = admin_room(&urls[0], room).await;
            assert_eq!(s["store_ok"], true);
            if s["tail"] == 20 {
                break;
            }
            assert!(Instant::now() < deadline, "{s}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Holds on both events until sold out: never more than the stock.
    let mut held = [0u64; 2];
    for round in 0..3u64 {
        for (r, v) in &visitors {
            let (status, body) = hold(v, &events[*r].0, 1 + (round % 2)).await;
            match status {
                201 => held[*r] += body["qty"].as_u64().unwrap(),
                409 => {}
                other => panic!("hold answered {other}: {body}"),
            }
        }
    }
    for (i, (event, _)) in events.iter().enumerate() {
        assert!(held[i] <= 40, "{event}: {} units held of 40", held[i]);
        let e = admin_event(&urls[1], event).await;
        assert_eq!(e["invariant_holds"], true, "{e}");
        assert_eq!(e["held"].as_u64().unwrap(), held[i], "{e}");
    }

    // Reaping: the 2 s holds come back, exactly once.
    let deadline = Instant::now() + Duration::from_secs(15);
    for (event, _) in &events {
        loop {
            let e = admin_event(&urls[0], event).await;
            if e["held"] == 0 {
                assert_eq!(e["available"], 40, "{e}");
                assert_eq!(e["invariant_holds"], true);
                break;
            }
            assert!(Instant::now() < deadline, "holds never reaped: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Fail over the primary that holds event 0 (quiet: nothing in flight).
    let victim = events[0].1;
    cluster.cli(&["WAIT", "1", "1000"]);
    cluster.kill(victim);
    let deadline = Instant::now() + Duration::from_secs(30);
    let key = format!("sluice:{{{}}}:stock", events[0].0);
    while cluster.try_primary_for(&key).is_none_or(|p| p == victim) {
        assert!(Instant::now() < deadline, "no replica took over");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.wait_ok(Duration::from_secs(30));

    // The gateways carry on without a restart.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (r0, v0) = visitors.iter().find(|(r, _)| *r == 0).unwrap();
    loop {
        let (status, body) = hold(v0, &events[*r0].0, 1).await;
        if status == 201 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "holds still failing after failover: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut after = 1u64;
    for (r, v) in &visitors {
        if *r == 0 {
            let (status, body) = hold(v, &events[0].0, 2).await;
            if status == 201 {
                after += body["qty"].as_u64().unwrap();
            }
        }
    }
    assert!(after <= 40, "{after} units held after failover");
    let e = admin_event(&urls[1], &events[0].0).await;
    assert_eq!(e["invariant_holds"], true, "{e}");
    assert_eq!(e["held"].as_u64().unwrap(), after, "{e}");
    // A new join in the other room works too.
    let mut v = Visitor::new(&urls[1], &rooms[1].0);
    assert!(v.join("/").await.status.is_success());
}
