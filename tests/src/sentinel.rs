//! A Redis Sentinel of the test's own: one `redis-server --sentinel`
//! process on a free loopback port, watching one primary under one service
//! name with quorum 1, quick to declare it down. Killed when dropped.
//! `None` (with a loud SKIPPED line) when `redis-server` or `redis-cli` is
//! missing outside CI; a failure under `CI=true`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_server::{ServerTls, free_port};

/// A running sentinel.
pub struct Sentinel {
    /// Its port.
    pub port: u16,
    /// The service name it monitors.
    pub service: String,
    tls: Option<ServerTls>,
    child: Option<Child>,
    dir: std::path::PathBuf,
}

impl Sentinel {
    /// Starts a sentinel monitoring `127.0.0.1:primary_port` as `service`.
    /// It declares the primary down after 400 ms without an answer and
    /// promotes a replica on its own (quorum 1).
    pub fn start(service: &str, primary_port: u16) -> Option<Sentinel> {
        Self::start_with(service, primary_port, None)
    }

    /// [`Sentinel::start`], serving TLS only (and speaking TLS to the
    /// primary and replicas, `tls-replication yes`) when `tls` is given.
    pub fn start_with(
        service: &str,
        primary_port: u16,
        tls: Option<&ServerTls>,
    ) -> Option<Sentinel> {
        if !crate::redis_server::tools_or_skip(&["redis-server", "redis-cli"], "this sentinel test")
        {
            return None;
        }
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("sluice-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("sentinel dir");
        // Sentinel rewrites its config file as it learns the topology, so it
        // must be a file of its own.
        let conf = dir.join("sentinel.conf");
        let listen = match tls {
            Some(tls) => tls.config_lines(port),
            None => format!("port {port}\n"),
        };
        std::fs::write(
            &conf,
            format!(
                "{listen}bind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor {service} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {service} 400\n\
                 sentinel failover-timeout {service} 4000\n\
                 sentinel parallel-syncs {service} 1\n",
                dir.display()
            ),
        )
        .expect("sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        let s = Sentinel {
            port,
            service: service.to_owned(),
            tls: tls.cloned(),
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !s.cli(&["PING"]).contains("PONG") {
            assert!(Instant::now() < deadline, "sentinel never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(s)
    }

    /// `redis+sentinel://127.0.0.1:PORT/SERVICE` (`rediss+sentinel://`
    /// over TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!("{scheme}://127.0.0.1:{}/{}", self.port, self.service)
    }

    /// Runs `redis-cli -p PORT args…` against the sentinel; stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        crate::redis_server::cli(self.port, self.tls.as_ref(), args)
    }

    /// The port of the primary the sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        let out = self.cli(&["SENTINEL", "get-master-addr-by-name", &self.service]);
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until the sentinel knows `n` replicas of the primary (it learns
    /// them from the primary's `INFO`; a replica it has not seen cannot be
    /// promoted).
    pub fn wait_replicas(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.cli(&["SENTINEL", "replicas", &self.service]);
            let known = out.lines().filter(|l| l.trim() == "flags").count();
            let down = out.contains("s_down") || out.contains("disconnected");
            if known >= n && !down {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sentinel knows {known} replicas: {out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
