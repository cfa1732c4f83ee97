//! A Redis Cluster of the test's own: `redis-server --cluster-enabled yes`
//! processes on free loopback ports, joined with `redis-cli --cluster
//! create`. Killed when dropped. `None` (with a loud SKIPPED line) when
//! `redis-server` or `redis-cli` is missing outside CI; a failure under
//! `CI=true`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_server::{ServerTls, cli as cli_on, free_port};

/// One node of the cluster.
pub struct Node {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
}

/// A running cluster.
pub struct RedisCluster {
    /// Every node, primaries first.
    pub nodes: Vec<Node>,
    tls: Option<ServerTls>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    /// Starts `primaries × (1 + replicas)` nodes and creates the cluster.
    pub fn start(primaries: usize, replicas: usize) -> Option<RedisCluster> {
        Self::start_with(primaries, replicas, None)
    }

    /// [`RedisCluster::start`], every node serving TLS only, replicating
    /// and speaking on the cluster bus over TLS too (`--tls-cluster yes`),
    /// when `tls` is given.
    pub fn start_with(
        primaries: usize,
        replicas: usize,
        tls: Option<&ServerTls>,
    ) -> Option<RedisCluster> {
        if !crate::redis_server::tools_or_skip(&["redis-server", "redis-cli"], "this cluster test")
        {
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "sluice-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let total = primaries * (1 + replicas);
        let mut nodes = Vec::new();
        for _ in 0..total {
            let port = node_port();
            let listen = match tls {
                Some(tls) => {
                    let mut args = tls.server_args(port);
                    args.extend(["--tls-cluster", "yes"].map(String::from));
                    args
                }
                None => vec!["--port".to_owned(), port.to_string()],
            };
            let child = Command::new("redis-server")
                .args(listen)
                .args([
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "1000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                    // replicas sync at once (the default waits 5 s to batch
                    // them): a replica that never synced cannot fail over
                    "--repl-diskless-sync-delay",
                    "0",
                ])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            nodes.push(Node {
                port,
                child: Some(child),
            });
        }
        for n in &nodes {
            wait_ping(n.port, tls);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(tls.map(ServerTls::cli_args).unwrap_or_default())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster {
            nodes,
            tls: tls.cloned(),
            dir,
        };
        cluster.wait_ok(Duration::from_secs(20));
        cluster.wait_replicas_synced(replicas, Duration::from_secs(20));
        Some(cluster)
    }

    /// `redis+cluster://` URL naming every node (`rediss+cluster://` over
    /// TLS).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss+cluster"
        } else {
            "redis+cluster"
        };
        format!("{scheme}://{}", nodes.join(","))
    }

    /// Runs `redis-cli -p PORT args…` (with `-c` to follow redirects) and
    /// returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let port = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .map(|n| n.port)
            .expect("a live node");
        let mut with_c = vec!["-c"];
        with_c.extend_from_slice(args);
        cli_on(port, self.tls.as_ref(), &with_c)
    }

    /// The port of the primary serving `key` now.
    pub fn primary_for(&self, key: &str) -> u16 {
        self.try_primary_for(key)
            .unwrap_or_else(|| panic!("no primary serves {key}"))
    }

    /// The port of the healthy primary serving `key`, if any (none during a
    /// failover).
    pub fn try_primary_for(&self, key: &str) -> Option<u16> {
        let slot: u16 = self
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("keyslot");
        let nodes = self.cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            for range in &f[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>())
                    && (a..=b).contains(&slot)
                {
                    let port = f[1]
                        .split('@')
                        .next()
                        .and_then(|hp| hp.rsplit(':').next())
                        .and_then(|p| p.parse().ok())
                        .expect("node port");
                    return Some(port);
                }
            }
        }
        None
    }

    /// Waits until every replica's link to its primary is up and every
    /// primary counts `per_primary` online replicas. (Right after `cluster
    /// create` a node meant to be a replica can still say `role:master`:
    /// the primaries' side is what `WAIT` counts.)
    pub fn wait_replicas_synced(&self, per_primary: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            loop {
                let out = cli_on(n.port, self.tls.as_ref(), &["INFO", "replication"]);
                let online = out
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count();
                let primary_ready = out.contains("role:master")
                    && (online >= per_primary || !self.owns_slots(n.port));
                if primary_ready || out.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "node {} never synced", n.port);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Whether the node on `port` serves hash slots (a primary with slots,
    /// not a replica still switching roles).
    fn owns_slots(&self, port: u16) -> bool {
        self.cli(&["CLUSTER", "NODES"]).lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 8
                && f[1].starts_with(&format!("127.0.0.1:{port}@"))
                && f[2].contains("master")
        })
    }

    /// Kills the node on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port == port)
            && let Some(mut c) = n.child.take()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until `CLUSTER INFO` says `cluster_state:ok` on a live node.
    pub fn wait_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not ok within {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free port whose cluster bus port (10000 higher) is a port too, and
/// free: a node given a port above 55535 refuses to start, and one whose
/// bus port is taken never joins (each made "node not up" now and then).
fn node_port() -> u16 {
    loop {
        let port = free_port();
        // the bus port (+10000) stays below the ephemeral range too
        if port < 22_768 && std::net::TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

fn wait_ping(port: u16, tls: Option<&ServerTls>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if cli_on(port, tls, &["PING"]).contains("PONG") {
            return;
        }
        assert!(Instant::now() < deadline, "node {port} not up");
        std::thread::sleep(Duration::from_millis(50));
    }
}
