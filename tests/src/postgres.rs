//! A PostgreSQL server of the test's own, on a free loopback port, in a
//! temporary directory.
//!
//! Tests that need PostgreSQL (the ledger's) start one of these, never the
//! machine's own server on 5432: they stop it, start it again on the same
//! data and port, and kill it. `initdb` and `pg_ctl` come from the Debian
//! packages (`/usr/lib/postgresql/*/bin`, the newest version); when the
//! test runs as root they run as the `postgres` user (`runuser`), as
//! PostgreSQL refuses to run as root. The server is stopped and its files
//! removed when the value is dropped.
//!
//! Like [`crate::redis_server`], this file needs nothing beyond `std`. When
//! the tools are missing, [`PgServer::new`] prints a loud `SKIPPED` line
//! and returns `None`, except under `CI=true`, where it panics.

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A PostgreSQL cluster of the test's own.
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    running: bool,
}

/// The newest `/usr/lib/postgresql/<version>/bin` with `initdb` and
/// `pg_ctl`, or the directory `dpkg -L` names for them.
fn find_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((v, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Some(bin);
    }
    // Another layout: ask dpkg where the server package put pg_ctl.
    let out = Command::new("sh")
        .arg("-c")
        .arg("dpkg -L $(dpkg -l 'postgresql-[0-9]*' 2>/dev/null | awk '/^ii/{print $2}') 2>/dev/null | grep '/bin/pg_ctl$' | head -1")
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let bin = Path::new(&path).parent()?.to_owned();
    bin.join("initdb").exists().then_some(bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn skip_or_panic(why: &str) -> Option<PgServer> {
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("{why}: CI=true requires it (apt-get install postgresql)");
    }
    eprintln!("\n*** SKIPPED: {why}; this test needs a real PostgreSQL and did not run ***\n");
    None
}

impl PgServer {
    /// Makes a cluster (`initdb -A trust -U postgres`) in a fresh temporary
    /// directory and starts it on a free loopback port; `None` (loudly)
    /// when PostgreSQL is not installed, outside CI.
    pub fn new() -> Option<Self> {
        let Some(bin) = find_bin() else {
            return skip_or_panic("initdb/pg_ctl not found under /usr/lib/postgresql");
        };
        let as_postgres = is_root();
        if as_postgres
            && !Command::new("id")
                .arg("postgres")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        {
            return skip_or_panic("running as root and there is no postgres user");
        }
        let port = crate::redis_server::free_port();
        let dir = std::env::temp_dir().join(format!(
            "sluice-pg-{}-{port}-{:08x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).expect("create postgres dir");
        let mut server = PgServer {
            bin,
            dir,
            port,
            as_postgres,
            running: false,
        };
        if as_postgres {
            let ok = Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(&server.dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "chown {} to postgres", server.dir.display());
        }
        let data = server.data();
        let out = server.tool(
            "initdb",
            &[
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
                &data,
            ],
        );
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        server.start();
        Some(server)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn tool(&self, name: &str, args: &[&str]) -> Output {
        let exe = self.bin.join(name);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args)
            .stdin(Stdio::null())
            // pg_ctl's server inherits these: a pipe would keep the test's
            // output reader waiting, so the log goes to a file instead.
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()))
    }

    /// Starts the server (again) on the same data directory and port, and
    /// waits until it accepts connections.
    pub fn start(&mut self) {
        let data = self.data();
        let log = self.dir.join("server.log").display().to_string();
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        // A killed postmaster's children may hold its shared memory for a
        // moment: try again for a while.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.tool(
                "pg_ctl",
                &[
                    "-D", &data, "-l", &log, "-o", &opts, "-w", "-t", "30", "start",
                ],
            );
            if out.status.success() {
                break;
            }
            if Instant::now() > deadline {
                let server_log =
                    std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                panic!(
                    "pg_ctl start failed: {}{}\n{server_log}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        self.running = true;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "postgres did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown: sessions are ended, their open
    /// transactions rolled back).
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        let data = self.data();
        let _ = self.tool("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
        self.running = false;
    }

    /// Kills the postmaster at once (SIGKILL); [`PgServer::start`] recovers
    /// from the write-ahead log.
    pub fn kill(&mut self) {
        if !self.running {
            return;
        }
        if let Some(pid) = self.postmaster_pid() {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.running = false;
    }

    fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The port it listens on (loopback).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether it was started and not stopped or killed since.
    pub fn running(&self) -> bool {
        self.running
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres` (trust auth).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The directory of its socket and files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `psql` against it with `sql`; the output (unaligned, tuples
    /// only). Panics when psql fails.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| panic!("psql failed: {e}"))
    }

    /// [`PgServer::psql`], with psql's complaint as the error: for a poll
    /// that may run before the ledger created its tables.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        let psql = self.bin.join("psql");
        let out = Command::new(&psql)
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.url())
            .arg("-c")
            .arg(sql)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", psql.display()));
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.running {
            let data = self.data();
            let _ = self.tool("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
