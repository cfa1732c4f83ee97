//! Fairness measured (issue 22): `sluice swarm` against two `sluice serve`
//! processes sharing one Redis, one of them SIGKILLed while the crowd runs
//! and started again on the same address. The FIFO room's admission order
//! follows the order the joins were sent in: the swarm's Kendall tau
//! (join sent against place, see `gateway/src/tools/swarm/fairness.rs`) is
//! at least 0.999, however the kill fell. The same with priority lanes:
//! each lane's own tau (`fairness.lanes`) is at least 0.999, while the
//! room-wide one counts the lanes' overtaking.
//!
//! Bounded: 500 visitors arriving at 50/s, 1,500 requests/s at most, a hard
//! stop at 2 minutes, per test; loopback only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::RedisServer;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, admin_room, sluice_bin, temp_file, temp_keys};

const VISITORS: u64 = 500;

/// One swarm at a time. The tau compares the order the joins were *sent*
/// in with their places; two swarms and four gateways at once on two cores
/// starve the processes long enough between a join's send and its arrival
/// that both tests measured 0.97-0.997 here, with the per-thread Redis
/// connections and without them (`SLUICE_SHARED_REDIS=1`) alike, and
/// 0.999-1.0 one at a time: what was measured was the machine, not the
/// line.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const POW_SECRET: &str = "fairness-pow-secret-0123456789abcdef";
const ENQUEUE_SECRET: &str = "fairness-enqueue-secret-0123456789abcdef";

/// The room: 40 admissions/s against 50 arrivals/s, so a line forms and
/// drains; `lanes` goes in the room's table.
fn config(lanes: &str) -> String {
    format!(
        r#"
[[rooms]]
id = "default"
rate_per_sec = 40
burst = 5
puzzles = 1
difficulty_floor_bits = 2
difficulty_ceiling_bits = 6
join_limit_per_prefix_per_min = 0
attack_min_solve = "0s"
{lanes}

[[events]]
id = "demo"
room = "default"
total = 100000
cart_limit = 2
hold_ttl = "2m"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_tau_stays_above_0_999_with_a_gateway_killed_mid_flight() {
    let _serial = SERIAL.lock().await;
    let Some(report) = swarm_with_a_kill(&config(""), &[]).await else {
        return;
    };
    let fairness = &report["fairness"];
    let tau = fairness["kendall_tau"].as_f64().expect("a tau");
    assert!(tau >= 0.999, "Kendall tau {tau} below 0.999: {fairness}");
    assert!(fairness.get("lanes").is_none(), "{fairness}");
}

/// Lanes 70/30, 40% of the crowd in `presale` with an enqueue token (one
/// account each), the rest in the default lane: FIFO within each lane
/// survives the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lanes_tau_stays_above_0_999_with_a_gateway_killed_mid_flight() {
    let _serial = SERIAL.lock().await;
    let lanes = format!(
        "lanes = [{{ id = \"presale\", weight = 70 }}, {{ id = \"public\", weight = 30 }}]\n\
         [rooms.enqueue]\nhmac_secret = \"{ENQUEUE_SECRET}\""
    );
    let extra = [
        "--lane-mix",
        "presale:40%",
        "--enqueue-secret",
        ENQUEUE_SECRET,
    ];
    let Some(report) = swarm_with_a_kill(&config(&lanes), &extra).await else {
        return;
    };
    let fairness = &report["fairness"];
    let lanes = fairness["lanes"]
        .as_object()
        .unwrap_or_else(|| panic!("no lanes: {fairness}"));
    assert_eq!(lanes.len(), 2, "{fairness}");
    let mut total = 0;
    for (id, l) in lanes {
        let n = l["visitors"].as_u64().unwrap();
        assert!(n >= 100, "lane {id}: {n} admitted: {fairness}");
        total += n;
        let tau = l["kendall_tau"].as_f64().expect("a tau");
        assert!(
            tau >= 0.999,
            "lane {id}: Kendall tau {tau} below 0.999: {fairness}"
        );
    }
    assert_eq!(total, fairness["visitors"].as_u64().unwrap(), "{fairness}");
}

/// Runs the crowd against two gateways on one Redis, SIGKILLs one once a
/// third has joined and starts it again on its address; the swarm's
/// report, checked for what every run must show (nobody oversold, nearly
/// everyone admitted, every admission ranked). `None` when redis-server
/// is missing outside CI.
async fn swarm_with_a_kill(config: &str, extra: &[&str]) -> Option<Value> {
    let redis = RedisServer::start()?;
    let origin = TestOrigin::start().await;
    let cfg = temp_file("sluice.toml", config);
    let keys = temp_keys();
    let start =
        || GatewayProcess::start_shared(&redis.url(), &origin.url(), &cfg, &keys, POW_SECRET, &[]);
    let a = start();
    let mut b = start();
    let (url_a, url_b) = (a.url(), b.url());

    let swarm = {
        let (url_a, url_b) = (url_a.clone(), url_b.clone());
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        std::thread::spawn(move || {
            Command::new(sluice_bin())
                .args(["swarm", "--url", &url_a, "--url", &url_b])
                .args(["--visitors", &VISITORS.to_string()])
                .args(["--arrival-rate", "50", "--concurrency", "256"])
                .args([
                    "--rate",
                    "1500",
                    "--duration",
                    "120s",
                    "--max-poll-ms",
                    "400",
                ])
                .args(["--admin-token", ADMIN_TOKEN, "--seed", "22", "--json"])
                .args(&extra)
                .output()
                .expect("run sluice swarm")
        })
    };

    // Kill B once a third of the crowd has joined, start it again on its
    // address a moment later.
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin_room(&url_a, "default").await["tail"]
        .as_u64()
        .unwrap()
        < VISITORS / 3
    {
        assert!(Instant::now() < deadline, "the crowd never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.signal("KILL");
    // (killed by a signal: no exit code, and the child is gone)
    let _ = b.wait(Duration::from_secs(10));
    assert!(b.pid().is_none(), "B did not die");
    let killed_at_tail = admin_room(&url_a, "default").await["tail"]
        .as_u64()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let addr = b.addr;
    drop(b);
    let b =
        GatewayProcess::start_shared_at(addr, &redis.url(), &origin.url(), &cfg, &keys, POW_SECRET);
    assert_eq!(b.url(), url_b);

    let out = swarm.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("swarm report is not JSON ({e}): {stderr}"));
    eprintln!(
        "killed at tail {killed_at_tail}; report: {:#}",
        report["fairness"]
    );
    eprintln!(
        "admitted {} failed {} transport errors {} http errors {}",
        report["admitted"],
        report["failed_visitors"],
        report["transport_errors"],
        report["http_errors"]
    );
    assert!(killed_at_tail < VISITORS, "the kill came after the crowd");
    assert_eq!(report["oversold"], 0, "{report}");
    let admitted = report["admitted"].as_u64().unwrap();
    assert!(
        admitted >= VISITORS * 95 / 100,
        "only {admitted} admitted: {report}"
    );
    let fairness = &report["fairness"];
    assert_eq!(
        fairness["visitors"].as_u64().unwrap(),
        admitted,
        "{fairness}"
    );
    // the restarted gateway serves the same room
    assert_eq!(admin_room(&b.url(), "default").await["queue_length"], 0);
    drop(a);
    Some(report)
}
