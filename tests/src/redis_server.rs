//! A `redis-server` of the test's own, on a free loopback port.
//!
//! Tests that need Redis start one of these instead of using the machine's
//! shared instance, so they can kill it, restart it (empty, or from its AOF
//! file) and slow it down without disturbing anyone else. The process is
//! killed when the value is dropped.
//!
//! This file has no dependency beyond `std`, so the domain crates include it
//! in their own integration tests with `#[path = "../../tests/src/redis_server.rs"]`
//! and the cross-crate tests use it through `sluice_tests::redis_server`.
//!
//! When `redis-server` is not on the PATH, [`RedisServer::start`] returns
//! `None` after printing a loud `SKIPPED` line, except under `CI=true`, where
//! a missing server is a failure (it panics).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How a test wants its server configured.
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// Turn on the append-only file with `appendfsync always`, so a restart
    /// recovers every acknowledged write.
    pub appendonly: bool,
    /// Extra `--name value` arguments, passed as given.
    pub extra_args: Vec<String>,
    /// Serve TLS only (no plain port), with these files.
    pub tls: Option<ServerTls>,
}

/// The files of a TLS `redis-server` (made by the test, e.g. with
/// `sluice_tests::redis_tls_certs`), and whether it requires clients to
/// present a certificate.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The server's certificate (also its client certificate when it
    /// replicates or speaks on the cluster bus).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The CA that signed the certificates, peers' included.
    pub ca: PathBuf,
    /// A client certificate the CA signed, for `redis-cli`.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// `--tls-auth-clients yes` (a client certificate is required).
    pub auth_clients: bool,
}

impl ServerTls {
    /// `redis-server` arguments serving TLS on `port` only (`--port 0`),
    /// replicating over TLS too.
    pub fn server_args(&self, port: u16) -> Vec<String> {
        let mut args: Vec<String> = ["--port", "0", "--tls-port"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        args.push(port.to_string());
        for (flag, path) in [
            ("--tls-cert-file", &self.cert),
            ("--tls-key-file", &self.key),
            ("--tls-ca-cert-file", &self.ca),
        ] {
            args.push(flag.to_owned());
            args.push(path.display().to_string());
        }
        let auth = if self.auth_clients { "yes" } else { "no" };
        args.extend(["--tls-auth-clients", auth, "--tls-replication", "yes"].map(String::from));
        args
    }

    /// The same as lines of a config file (`name value`).
    pub fn config_lines(&self, port: u16) -> String {
        self.server_args(port)
            .chunks(2)
            .map(|kv| format!("{} {}\n", kv[0].trim_start_matches('-'), kv[1]))
            .collect()
    }

    /// `redis-cli` arguments for this server: TLS, its CA, the client
    /// certificate.
    pub fn cli_args(&self) -> Vec<String> {
        let mut args = vec!["--tls".to_owned()];
        for (flag, path) in [
            ("--cacert", &self.ca),
            ("--cert", &self.client_cert),
            ("--key", &self.client_key),
        ] {
            args.push(flag.to_owned());
            args.push(path.display().to_string());
        }
        args
    }
}

/// `redis-cli -p PORT [TLS args] args…`; stdout.
pub fn cli(port: u16, tls: Option<&ServerTls>, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(tls.map(ServerTls::cli_args).unwrap_or_default())
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running `redis-server` child process.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    options: RedisOptions,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with default options (no persistence).
    pub fn start() -> Option<Self> {
        Self::start_with(RedisOptions::default())
    }

    /// Starts a server with the given options, or returns `None` (loudly)
    /// when `redis-server` is missing outside CI.
    pub fn start_with(options: RedisOptions) -> Option<Self> {
        let tools: &[&str] = match options.tls {
            Some(_) => &["redis-server", "redis-cli"],
            None => &["redis-server"],
        };
        if !tools_or_skip(tools, "this test needs a real Redis and") {
            return None;
        }
        let mut server = RedisServer {
            port: 0,
            dir: PathBuf::new(),
            options,
            child: None,
        };
        // A port that was free may be taken before the server binds it: the
        // server then exits at once, and another port is tried.
        let mut failures = Vec::new();
        for _ in 0..5 {
            server.port = free_port();
            server.dir = std::env::temp_dir().join(format!(
                "sluice-redis-{}-{}",
                std::process::id(),
                server.port
            ));
            std::fs::create_dir_all(&server.dir).expect("create redis dir");
            match server.try_spawn() {
                Ok(()) => return Some(server),
                Err(why) => {
                    let _ = std::fs::remove_dir_all(&server.dir);
                    failures.push(why);
                }
            }
        }
        panic!("redis-server did not start: {}", failures.join("; "));
    }

    fn spawn(&mut self) {
        // A restart keeps its port (clients hold the URL): a port taken in the
        // meantime is waited out a few times before giving up.
        let mut failures = Vec::new();
        for attempt in 0..4 {
            match self.try_spawn() {
                Ok(()) => return,
                Err(why) => failures.push(why),
            }
            std::thread::sleep(Duration::from_millis(250 << attempt));
        }
        panic!(
            "redis-server did not restart on port {}: {}",
            self.port,
            failures.join("; ")
        );
    }

    /// Starts the process and waits for its PING; on failure the child is
    /// gone and the error says why (its log's last lines).
    fn try_spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        match &self.options.tls {
            Some(tls) => cmd.args(tls.server_args(self.port)),
            None => cmd.arg("--port").arg(self.port.to_string()),
        };
        let log = self.dir.join("redis.log");
        cmd.arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .arg("--protected-mode")
            .arg("no")
            .arg("--enable-debug-command")
            .arg("local");
        if self.options.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        cmd.args(&self.options.extra_args);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn redis-server");
        let ready = match &self.options.tls {
            Some(tls) => wait_ready_tls(self.port, tls, &self.dir, &mut child),
            None => wait_ready(self.port, &self.dir, &mut child),
        };
        match ready {
            Ok(()) => {
                self.child = Some(child);
                Ok(())
            }
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                let tail: String = std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | ");
                Err(format!("port {}: {why} (log: {tail})", self.port))
            }
        }
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A `redis://` URL for clients (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Its TLS files, for a TLS server.
    pub fn tls(&self) -> Option<&ServerTls> {
        self.options.tls.as_ref()
    }

    /// Replaces the TLS files a restart will use (a certificate rotated).
    pub fn set_tls(&mut self, tls: ServerTls) {
        self.options.tls = Some(tls);
    }

    /// The working directory (AOF files live here).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills the process at once (SIGKILL): nothing is flushed beyond what
    /// `appendfsync always` already wrote.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port. With AOF on it reloads its
    /// data; without, it comes back empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server, deletes its files and starts it again empty.
    pub fn restart_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).expect("create redis dir");
        self.spawn();
    }

    /// Sends one inline command and returns the raw reply (for test setup
    /// such as `DEBUG SLEEP` or `CLIENT PAUSE`).
    pub fn command(&self, line: &str) -> String {
        if let Some(tls) = &self.options.tls {
            let args: Vec<&str> = line.split_whitespace().collect();
            return cli(self.port, Some(tls), &args);
        }
        let mut stream = TcpStream::connect(self.addr()).expect("connect redis");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        stream
            .write_all(format!("{line}\r\n").as_bytes())
            .expect("write");
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `redis-server` can be started here.
pub fn redis_available() -> bool {
    runs("redis-server")
}

fn runs(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether every Redis tool in `tools` runs. When one does not: a failure
/// under `CI=true`; otherwise a loud SKIPPED line naming `what` did not
/// run, and `false`.
pub fn tools_or_skip(tools: &[&str], what: &str) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !runs(t)).collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!("{} not found on PATH", missing.join(" and "));
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("{msg}: CI=true requires them (apt-get install redis-server redis-tools)");
    }
    eprintln!("\n*** SKIPPED: {msg}; {what} did not run ***\n");
    false
}

/// A loopback port that was free a moment ago, taken below the kernel's
/// ephemeral range (32768 and up on Linux) so that no test's outgoing
/// connection can have been given it as a source port between this call and
/// the server's bind; successive calls in one process walk the range from a
/// start of their own, so two tests running at once do not draw the same.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 12_000;
    const SPAN: u32 = 20_000; // up to 31_999
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let seed = || {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        (std::process::id().wrapping_mul(7919) ^ nanos) % SPAN
    };
    let _ = NEXT.compare_exchange(u32::MAX, seed(), Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

fn exited(child: &mut Child) -> Option<String> {
    match child.try_wait() {
        Ok(Some(status)) => Some(format!("exited with {status}")),
        _ => None,
    }
}

/// The name of the server's own directory, which its `CONFIG GET dir`
/// answers with: a reply from another server that holds the port does not.
fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn wait_ready_tls(port: u16, tls: &ServerTls, dir: &Path, child: &mut Child) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let ours = dir_name(dir);
    while !cli(port, Some(tls), &["CONFIG", "GET", "dir"]).contains(&ours) {
        if let Some(why) = exited(child) {
            return Err(why);
        }
        if Instant::now() >= deadline {
            return Err("TLS server not ready in 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn wait_ready(port: u16, dir: &Path, child: &mut Child) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let ours = dir_name(dir);
    while Instant::now() < deadline {
        if let Some(why) = exited(child) {
            return Err(why);
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            if s.write_all(b"CONFIG GET dir\r\n").is_ok() {
                let mut buf = [0u8; 1024];
                if let Ok(n) = s.read(&mut buf)
                    && String::from_utf8_lossy(&buf[..n]).contains(&ours)
                {
                    return Ok(());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err("not ready in 10 s".into())
}
