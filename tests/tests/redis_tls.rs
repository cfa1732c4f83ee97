//! `rediss://`: real `redis-server`s serving TLS only (`--port 0
//! --tls-port`), certificates made in the test (rcgen), the real `sluice`
//! binary as the client.
//!
//! - standalone with `--redis-ca`: holds through the gateway, and `sluice
//!   ledger` (same flags) writes them into PostgreSQL;
//! - a server that requires client certificates: served with
//!   `--redis-client-cert/--redis-client-key`, refused clearly without;
//! - a CA or a host name that does not match: `serve` exits at start
//!   saying TLS verification failed; a certificate that stops matching
//!   while running: readiness 503 `store_unavailable`, said once in the log;
//! - Sentinel over TLS (sentinel, primary, replica, replication): holds,
//!   then a failover, holds again;
//! - Cluster over TLS (`--tls-cluster yes`): holds on events of different
//!   shards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::json;
use sluice_tests::client::TestClient;
use sluice_tests::cluster::RedisCluster;
use sluice_tests::origin::TestOrigin;
use sluice_tests::postgres::PgServer;
use sluice_tests::redis_server::{RedisOptions, RedisServer, ServerTls};
use sluice_tests::redis_tls_certs::TlsCerts;
use sluice_tests::sentinel::Sentinel;
use sluice_tests::visitor::Visitor;
use sluice_tests::{
    ADMIN_TOKEN, GatewayProcess, admitted_visitor, sluice_bin, temp_file, temp_keys,
};

const SECRET: &str = "redis-tls-test-pow-secret-0123";

/// One easy room `hall` on `/`, and `events` (each `total` 20) in it.
fn config(events: &[&str]) -> std::path::PathBuf {
    let mut text = String::from(
        "[[rooms]]\nid = \"hall\"\npaths = [\"/\"]\nrate_per_sec = 100\nburst = 100\npuzzles = 1\n\
         difficulty_floor_bits = 2\ndifficulty_ceiling_bits = 4\njoin_limit_per_prefix_per_min = 0\n\
         attack_min_solve = \"0s\"\n\n",
    );
    for e in events {
        text.push_str(&format!(
            "[[events]]\nid = \"{e}\"\nroom = \"hall\"\ntotal = 20\ncart_limit = 4\nhold_ttl = \"120s\"\n\n"
        ));
    }
    temp_file("redis-tls.toml", &text)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn tls_server(tls: ServerTls) -> Option<RedisServer> {
    RedisServer::start_with(RedisOptions {
        tls: Some(tls),
        ..RedisOptions::default()
    })
}

/// One hold of `qty` on `event` by a freshly admitted buyer: status, body.
async fn hold(keys: &Path, base: &str, event: &str, qty: u64) -> (u16, serde_json::Value) {
    let v = admitted_visitor(keys, base, "hall");
    hold_by(&v, event, qty).await
}

async fn hold_by(v: &Visitor, event: &str, qty: u64) -> (u16, serde_json::Value) {
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

async fn admin_event(base: &str, event: &str) -> serde_json::Value {
    TestClient::new()
        .get(
            &format!("{base}/_sluice/admin/events/{event}"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await
        .json()
}

/// A hold succeeds within `limit` (a store still settling answers 503).
async fn hold_eventually(keys: &Path, base: &str, event: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let (status, body) = hold(keys, base, event, 1).await;
        if status == 201 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no hold on {event} within {limit:?}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `sluice serve` with `args`, expected to exit before listening: its exit
/// code and what it wrote to stderr. Bounded: killed after 20 s.
fn serve_refused(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(sluice_bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("SLUICE_CONFIG")
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice serve {args:?} still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_rediss_with_the_ca_serves_holds_and_the_ledger_reads_them() {
    let certs = TlsCerts::generate();
    let Some(redis) = tls_server(certs.server(false)) else {
        return;
    };
    assert!(redis.url().starts_with("rediss://"));
    let cfg = config(&["gig"]);
    let keys = temp_keys();
    let origin = TestOrigin::start().await;
    let ca = certs.ca();
    let gw = GatewayProcess::start_shared(
        &redis.url(),
        &origin.url(),
        &cfg,
        &keys,
        SECRET,
        &["--redis-ca", s(&ca)],
    );
    let base = gw.url();
    for qty in [1, 2, 3] {
        let (status, body) = hold(&keys, &base, "gig", qty).await;
        assert_eq!(status, 201, "{body}");
    }
    let e = admin_event(&base, "gig").await;
    assert_eq!(e["held"], 6, "{e}");
    assert_eq!(e["invariant_holds"], true, "{e}");
    // The stock is in this TLS server (read with redis-cli over TLS).
    assert!(redis.command("KEYS *").contains("gig"));

    // `sluice ledger` over the same TLS connection writes them down.
    let Some(pg) = PgServer::new() else {
        return;
    };
    let _ledger = Killed(
        Command::new(sluice_bin())
            .args(["ledger", "--redis", &redis.url(), "--postgres", &pg.url()])
            .args(["--redis-ca", s(&ca), "--flush-ms", "50"])
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sluice ledger"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The table exists once the ledger has migrated the schema.
        let n = match pg.psql("SELECT to_regclass('holds') IS NOT NULL").as_str() {
            "t" => pg.psql("SELECT count(*) FROM holds WHERE event = 'gig'"),
            _ => String::new(),
        };
        if n == "3" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ledger recorded {n:?} holds of 3"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A child process killed when dropped (a failed assertion included).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_requiring_client_certificates_gets_one_or_refuses_clearly() {
    let certs = TlsCerts::generate();
    let Some(redis) = tls_server(certs.server(true)) else {
        return;
    };
    let cfg = config(&["gig"]);
    let keys = temp_keys();
    let origin = TestOrigin::start().await;
    let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
    let url = redis.url();

    // Without a client certificate: refused at start, saying why.
    let (code, stderr) = serve_refused(&[
        "--redis",
        &url,
        "--origin",
        &origin.url(),
        "--config",
        s(&cfg),
        "--redis-ca",
        s(&ca),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("TLS refused by the server"), "{stderr}");

    // A certificate without its key is a configuration error (64).
    let (code, stderr) = serve_refused(&["--redis", &url, "--redis-client-cert", s(&cert)]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("`redis_client_cert`"), "{stderr}");

    // With it: served.
    let gw = GatewayProcess::start_shared(
        &url,
        &origin.url(),
        &cfg,
        &keys,
        SECRET,
        &[
            "--redis-ca",
            s(&ca),
            "--redis-client-cert",
            s(&cert),
            "--redis-client-key",
            s(&key),
        ],
    );
    let (status, body) = hold(&keys, &gw.url(), "gig", 2).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_host_name_is_refused_and_said_once() {
    let certs = TlsCerts::generate();
    let other = TlsCerts::generate();
    let Some(mut redis) = tls_server(certs.server(false)) else {
        return;
    };
    let cfg = config(&["gig"]);
    let origin = TestOrigin::start().await;
    let url = redis.url();
    let other_ca = other.ca();
    let base_args = [
        "--redis",
        &url,
        "--origin",
        &origin.url(),
        "--config",
        s(&cfg),
    ];

    // Another CA: refused at start, not a hang, not a panic.
    let mut args = base_args.to_vec();
    args.extend(["--redis-ca", s(&other_ca)]);
    let (code, stderr) = serve_refused(&args);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("TLS verification failed"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The right CA, but the server's certificate names another host.
    let misnamed = TlsCerts::for_names(&["redis.invalid"]);
    let Some(wrong_host) = tls_server(misnamed.server(false)) else {
        return;
    };
    let wrong_host_url = wrong_host.url();
    let misnamed_ca = misnamed.ca();
    let (code, stderr) = serve_refused(&[
        "--redis",
        &wrong_host_url,
        "--origin",
        &origin.url(),
        "--config",
        s(&cfg),
        "--redis-ca",
        s(&misnamed_ca),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("TLS verification failed"), "{stderr}");
    assert!(stderr.contains("not valid for name"), "{stderr}");

    // Running, then the server comes back with a certificate of another
    // CA: not ready, the store unreachable, the log says why once.
    let keys = temp_keys();
    let ca = certs.ca();
    let mut args = base_args.to_vec();
    let keys_s = s(&keys).to_owned();
    args.extend([
        "--redis-ca",
        s(&ca),
        "--keys-dir",
        &keys_s,
        "--pow-secret",
        SECRET,
        "--admin-token",
        ADMIN_TOKEN,
        "--load-stock",
    ]);
    let gw = GatewayProcess::start_logged(&args, "warn");
    let base = gw.url();
    let (status, body) = hold(&keys, &base, "gig", 1).await;
    assert_eq!(status, 201, "{body}");
    redis.set_tls(other.server(false));
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let res = TestClient::new()
            .get(&format!("{base}/_sluice/readyz"), &[])
            .await;
        if res.status.as_u16() == 503 {
            assert_eq!(res.json()["status"], "store_unavailable");
            break;
        }
        assert!(Instant::now() < deadline, "still ready: {}", res.text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A few more seconds of retries (the room ticks, the reaper reaps)
    // add no more lines saying so.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let said: Vec<String> = gw
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("TLS verification failed"))
        .collect();
    assert!(
        !said.is_empty(),
        "the log never said TLS verification failed"
    );
    assert!(
        said.len() <= 2,
        "said {} times (once per store at most): {said:#?}",
        said.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_serves_holds_across_a_failover() {
    let certs = TlsCerts::generate();
    let tls = certs.server(false);
    let Some(mut primary) = tls_server(tls.clone()) else {
        return;
    };
    let Some(replica) = RedisServer::start_with(RedisOptions {
        tls: Some(tls.clone()),
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replica
        .command("INFO replication")
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "replica never synced over TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(sentinel) = Sentinel::start_with("shop", primary.port(), Some(&tls)) else {
        return;
    };
    sentinel.wait_replicas(1, Duration::from_secs(20));
    assert!(sentinel.url().starts_with("rediss+sentinel://"));

    let cfg = config(&["gig"]);
    let keys = temp_keys();
    let origin = TestOrigin::start().await;
    let ca = certs.ca();
    let gw = GatewayProcess::start_shared(
        &sentinel.url(),
        &origin.url(),
        &cfg,
        &keys,
        SECRET,
        &["--redis-ca", s(&ca)],
    );
    let base = gw.url();
    let (status, body) = hold(&keys, &base, "gig", 2).await;
    assert_eq!(status, 201, "{body}");
    primary.command("WAIT 1 1000");

    primary.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sentinel.primary_port() != Some(replica.port()) {
        assert!(
            Instant::now() < deadline,
            "Sentinel never promoted the replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    hold_eventually(&keys, &base, "gig", Duration::from_secs(20)).await;
    let e = admin_event(&base, "gig").await;
    assert_eq!(e["invariant_holds"], true, "{e}");
    assert!(e["held"].as_u64().unwrap() >= 3, "{e}");
    assert!(replica.command("ROLE").contains("master"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_serves_holds_on_every_shard() {
    let certs = TlsCerts::generate();
    let tls = certs.server(true);
    let Some(cluster) = RedisCluster::start_with(3, 0, Some(&tls)) else {
        return;
    };
    assert!(cluster.url().starts_with("rediss+cluster://"));
    // Events whose keys land on three different primaries.
    let mut events: Vec<String> = Vec::new();
    let mut ports = std::collections::HashSet::new();
    for i in 0..200 {
        let name = format!("ev{i}");
        if ports.insert(cluster.primary_for(&format!("sluice:{{{name}}}:stock"))) {
            events.push(name);
        }
        if events.len() == 3 {
            break;
        }
    }
    assert_eq!(
        events.len(),
        3,
        "could not spread the events over the shards"
    );
    let names: Vec<&str> = events.iter().map(String::as_str).collect();
    let cfg = config(&names);
    let keys = temp_keys();
    let origin = TestOrigin::start().await;
    let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
    let gw = GatewayProcess::start_shared(
        &cluster.url(),
        &origin.url(),
        &cfg,
        &keys,
        SECRET,
        &[
            "--redis-ca",
            s(&ca),
            "--redis-client-cert",
            s(&cert),
            "--redis-client-key",
            s(&key),
        ],
    );
    let base = gw.url();
    for event in &events {
        for qty in [1, 3] {
            let (status, body) = hold(&keys, &base, event, qty).await;
            assert_eq!(status, 201, "{event}: {body}");
        }
        let e = admin_event(&base, event).await;
        assert_eq!(e["held"], 4, "{e}");
        assert_eq!(e["invariant_holds"], true, "{e}");
    }
}
