//! # sluice-tests
//!
//! The cross-crate test harness: real sockets, a real origin
//! ([`origin::TestOrigin`]), a `redis-server` of the test's own
//! ([`redis_server::RedisServer`]), a PostgreSQL of its own
//! ([`postgres::PgServer`]), gateways in-process
//! ([`TestGateway::builder`]) or as child processes of the real `sluice`
//! binary ([`GatewayProcess`]), a small HTTP client ([`client`]), and real
//! browsers: headless Chromium over WebDriver ([`chromium`]) and headless
//! Firefox over WebDriver BiDi ([`firefox`]); for the verified crawlers, a
//! signer, its key directory and a DNS server ([`crawler`]).
//! The end-to-end tests live in `tests/tests/`.

pub mod browser;
pub mod chromium;
pub mod client;
pub mod cluster;
pub mod crawler;
pub mod firefox;
pub mod origin;
pub mod postgres;
pub mod process;
#[path = "redis_server.rs"]
pub mod redis_server;
pub mod redis_tls_certs;
pub mod relay;
pub mod sentinel;
pub mod shop_path;
pub mod tls;
pub mod visitor;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_gateway::app::AppState;
use sluice_gateway::config::Config;
use sluice_gateway::edge::server::{self, RunningGateway};

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An in-process gateway on a free loopback port.
pub struct TestGateway {
    running: Option<RunningGateway>,
    /// Its address.
    pub addr: SocketAddr,
}

/// Builds a [`TestGateway`].
pub struct TestGatewayBuilder {
    config: Config,
}

impl TestGateway {
    /// Starts building a gateway with a default config and a test admin
    /// token.
    pub fn builder() -> TestGatewayBuilder {
        TestGatewayBuilder {
            config: Config {
                admin_token: Some(ADMIN_TOKEN.to_owned()),
                ..Config::default()
            },
        }
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The gateway's state.
    pub fn state(&self) -> &AppState {
        #[allow(clippy::expect_used)]
        &self.running.as_ref().expect("running").state
    }

    /// Drains and stops the gateway.
    pub async fn shutdown(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await.expect("clean shutdown");
        }
    }
}

/// The admin token test gateways use.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

impl TestGatewayBuilder {
    /// The origin to proxy to.
    pub fn origin(mut self, url: impl Into<String>) -> Self {
        self.config.origin = Some(url.into());
        self
    }

    /// Redis URL for the stores (the configured stock loaded into it, as
    /// on a first deploy; `load_stock = Some(false)` in [`Self::config`]
    /// for a restart).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.config.redis = Some(url.into());
        self.config.load_stock.get_or_insert(true);
        self
    }

    /// Edits the config before start.
    pub fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut self.config);
        self
    }

    /// Starts the gateway.
    pub async fn spawn(self) -> TestGateway {
        let config = self.config.with_defaults();
        config.validate().expect("valid test config");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind gateway");
        let state = AppState::new(config).await.expect("gateway state");
        let running = server::spawn(state, listener).expect("spawn gateway");
        let gw = TestGateway {
            addr: running.addr,
            running: Some(running),
        };
        wait_ready(&gw.url()).await;
        gw
    }

    /// Guards only `/queue` with the default room, so other paths are
    /// proxied straight through (for tests of the proxy itself).
    pub fn unguarded(self) -> Self {
        self.config(|c| {
            c.rooms = vec![sluice_gateway::config::RoomConfig {
                paths: vec!["/queue".into()],
                ..Default::default()
            }]
        })
    }
}

/// Waits until `/_sluice/readyz` answers 200 (the stores answered once).
pub async fn wait_ready(base: &str) {
    wait_ready_with(&client::TestClient::new(), base).await;
}

/// [`wait_ready`] through `client` (an https one for a TLS gateway).
pub async fn wait_ready_with(client: &client::TestClient, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let res = client.get(&format!("{base}/_sluice/readyz"), &[]).await;
        if res.status == 200 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "gateway at {base} not ready: {}",
            res.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Path of the `sluice` binary built by `cargo test --workspace` (cargo
/// builds the gateway's binary for its own integration tests, into the
/// same target directory as this test).
pub fn sluice_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_owned();
    let bin = dir.join(format!("sluice{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: run the suite with `cargo test --workspace` so cargo builds the sluice binary",
        bin.display()
    );
    bin
}

/// A `sluice serve` child process.
pub struct GatewayProcess {
    child: Option<Child>,
    /// Its address.
    pub addr: SocketAddr,
    /// Its log lines (stderr), when started with [`GatewayProcess::start_logged`].
    log: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
    /// `http`, or `https` when started with [`GatewayProcess::start_https`].
    scheme: &'static str,
}

impl GatewayProcess {
    /// Starts `sluice serve` with these extra arguments, on a free port, and
    /// waits for its "listening" line. Its log (warnings and errors) goes to
    /// the test's stderr.
    pub fn start(args: &[&str]) -> GatewayProcess {
        Self::spawn(args, None)
    }

    /// Starts `sluice serve` with these arguments (which name its TLS
    /// certificate: `--tls-cert`/`--tls-key`, or a config's
    /// `[server.tls]`), waiting until it answers over https through
    /// `client` (e.g. [`tls::TestCa::https_client`]); its log kept as
    /// [`GatewayProcess::start_logged`] does when `filter` is given.
    pub fn start_https(
        args: &[&str],
        client: &client::TestClient,
        filter: Option<&str>,
    ) -> GatewayProcess {
        Self::spawn_with(args, filter, Some(client.clone()), None)
    }

    /// A gateway of a group sharing one store: `--redis`, `--origin`,
    /// `--config`, `--keys-dir`, `--pow-secret` and the test admin token,
    /// then `extra` flags.
    pub fn start_shared(
        redis_url: &str,
        origin_url: &str,
        config: &Path,
        keys_dir: &Path,
        pow_secret: &str,
        extra: &[&str],
    ) -> GatewayProcess {
        Self::shared(
            redis_url, origin_url, config, keys_dir, pow_secret, extra, None,
        )
    }

    /// [`GatewayProcess::start_shared`], keeping its log as
    /// [`GatewayProcess::start_logged`] does.
    pub fn start_shared_logged(
        redis_url: &str,
        origin_url: &str,
        config: &Path,
        keys_dir: &Path,
        pow_secret: &str,
        filter: &str,
    ) -> GatewayProcess {
        Self::shared(
            redis_url,
            origin_url,
            config,
            keys_dir,
            pow_secret,
            &[],
            Some(filter),
        )
    }

    /// [`GatewayProcess::start_shared`] listening on `addr`: a gateway
    /// restarted where a killed one listened, so that clients that know
    /// its address find it again.
    pub fn start_shared_at(
        addr: SocketAddr,
        redis_url: &str,
        origin_url: &str,
        config: &Path,
        keys_dir: &Path,
        pow_secret: &str,
    ) -> GatewayProcess {
        let args = Self::shared_args(redis_url, origin_url, config, keys_dir, pow_secret);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::spawn_with(&args, None, None, Some(addr))
    }

    fn shared_args(
        redis_url: &str,
        origin_url: &str,
        config: &Path,
        keys_dir: &Path,
        pow_secret: &str,
    ) -> Vec<String> {
        let config = config.to_str().expect("a UTF-8 config path");
        let keys = keys_dir.to_str().expect("a UTF-8 keys path");
        [
            "--redis",
            redis_url,
            "--origin",
            origin_url,
            "--config",
            config,
            "--keys-dir",
            keys,
            "--pow-secret",
            pow_secret,
            "--admin-token",
            ADMIN_TOKEN,
            // the group's first deploy: configured stock goes into the store
            "--load-stock",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn shared(
        redis_url: &str,
        origin_url: &str,
        config: &Path,
        keys_dir: &Path,
        pow_secret: &str,
        extra: &[&str],
        filter: Option<&str>,
    ) -> GatewayProcess {
        let mut args = Self::shared_args(redis_url, origin_url, config, keys_dir, pow_secret);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::spawn(&args, filter)
    }

    /// Like [`GatewayProcess::start`], logging as JSON lines at the level
    /// `filter` asks (an `EnvFilter`, e.g. `warn,audit=info`) and keeping
    /// every line for [`GatewayProcess::log_lines`] (still echoed to the
    /// test's stderr).
    pub fn start_logged(args: &[&str], filter: &str) -> GatewayProcess {
        Self::spawn(args, Some(filter))
    }

    /// The log lines captured so far (empty unless started with
    /// [`GatewayProcess::start_logged`]).
    pub fn log_lines(&self) -> Vec<String> {
        self.log
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }

    fn spawn(args: &[&str], log_filter: Option<&str>) -> GatewayProcess {
        Self::spawn_with(args, log_filter, None, None)
    }

    fn spawn_with(
        args: &[&str],
        log_filter: Option<&str>,
        https: Option<client::TestClient>,
        at: Option<SocketAddr>,
    ) -> GatewayProcess {
        let listen = match at {
            Some(addr) => addr.to_string(),
            None => format!("127.0.0.1:{}", redis_server::free_port()),
        };
        let mut cmd = Command::new(sluice_bin());
        cmd.arg("serve")
            .arg("--listen")
            .arg(&listen)
            .args(args)
            .env_remove("SLUICE_CONFIG")
            .env("SLUICE_LOG", log_filter.unwrap_or("warn"))
            .stdout(Stdio::piped());
        if log_filter.is_some() {
            cmd.env("SLUICE_LOG_FORMAT", "json").stderr(Stdio::piped());
        } else {
            cmd.stderr(Stdio::inherit());
        }
        let mut child = cmd.spawn().expect("spawn sluice");
        let log = child.stderr.take().map(|stderr| {
            let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    eprintln!("{line}");
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            });
            lines
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                if line.contains("listening") {
                    let _ = tx.send(());
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if rx.recv_timeout(Duration::from_millis(50)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("sluice serve exited before listening: {status}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("sluice did not report listening within 20 s");
            }
        }
        let gw = GatewayProcess {
            child: Some(child),
            addr: listen.parse().expect("addr"),
            log,
            scheme: if https.is_some() { "https" } else { "http" },
        };
        let url = gw.url();
        let client = https.unwrap_or_default();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(wait_ready_with(&client, &url));
        })
        .join()
        .expect("gateway ready");
        gw
    }

    /// `http://addr`, or `https://localhost:port` for a TLS gateway (the
    /// name test certificates carry).
    pub fn url(&self) -> String {
        match self.scheme {
            "https" => format!("https://localhost:{}", self.addr.port()),
            _ => format!("http://{}", self.addr),
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// A field of `/proc/PID/status` in bytes (e.g. `VmRSS`, `VmHWM`).
    pub fn memory(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    }

    /// Sends a signal (e.g. `TERM`, `KILL`) with `kill(1)`.
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(c.id().to_string())
                .status();
        }
    }

    /// Waits for the process to exit and returns its status code.
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Writes `text` to a fresh temporary file and returns its path (for
/// `--config`).
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write temp file");
    p
}

/// A fresh keys directory with one signing key, shared by the gateways of
/// a test.
pub fn temp_keys() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-keys-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    sluice_admission::keygen(&dir).expect("keygen");
    dir
}

/// Admin GET of `path` (e.g. `/_sluice/admin/events/demo`), which must
/// answer 200.
pub async fn admin_get(base: &str, path: &str) -> serde_json::Value {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let res = client::TestClient::new()
        .get(&format!("{base}{path}"), &[("authorization", &bearer)])
        .await;
    assert_eq!(res.status, 200, "{path}: {}", res.text());
    res.json()
}

/// The value of one sample on the gateway's `/metrics` (read with the test
/// admin token), named with its labels as Prometheus prints them, e.g.
/// `sluice_shed_total{what="origin"}`; 0 when it was never recorded.
pub async fn metric(base: &str, sample: &str) -> f64 {
    let res = client::TestClient::new()
        .get(
            &format!("{base}/metrics"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let prefix = format!("{sample} ");
    res.text()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

/// Admin GET of a room's state.
pub async fn admin_room(base: &str, room: &str) -> serde_json::Value {
    admin_get(base, &format!("/_sluice/admin/rooms/{room}")).await
}

/// Admin PATCH of a room.
pub async fn admin_patch(base: &str, room: &str, patch: serde_json::Value) -> client::Answer {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    client::TestClient::new()
        .call(
            http::Method::PATCH,
            &format!("{base}/_sluice/admin/rooms/{room}"),
            &[
                ("authorization", &bearer),
                ("content-type", "application/json"),
            ],
            client::body(patch.to_string()),
        )
        .await
}

/// A room for tests: an easy proof of work (k = 1, b = 2..6), no
/// per-network limit and no minimum solve time (every test client is
/// 127.0.0.1), guarding `paths`, at `rate`/s with `burst`.
pub fn easy_room(
    id: &str,
    rate: f64,
    burst: f64,
    paths: &[&str],
) -> sluice_gateway::config::RoomConfig {
    sluice_gateway::config::RoomConfig {
        id: id.into(),
        paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        rate_per_sec: rate,
        burst,
        puzzles: 1,
        difficulty_floor_bits: 2,
        difficulty_ceiling_bits: 6,
        join_limit_per_prefix_per_min: 0,
        attack_min_solve: Duration::ZERO,
        ..Default::default()
    }
}

/// The payment provider's signed webhook for a succeeded payment of
/// `hold_id` (payment event `pe-{hold_id}`), sent to the gateway at `base`.
pub async fn pay_succeeded(base: &str, secret: &str, hold_id: &str) -> client::Answer {
    let payload = serde_json::json!({
        "payment_event_id": format!("pe-{hold_id}"),
        "hold_id": hold_id,
        "outcome": "succeeded",
    })
    .to_string();
    let sig = sluice_gateway::reserve::sign_webhook(
        secret.as_bytes(),
        sluice_gateway::app::now_s(),
        payload.as_bytes(),
    );
    client::TestClient::new()
        .call(
            http::Method::POST,
            &format!("{base}/_sluice/webhooks/payment"),
            &[
                ("content-type", "application/json"),
                ("sluice-signature", &sig),
            ],
            client::body(payload),
        )
        .await
}

/// A visitor of `room` at `base` holding an admission token signed by the
/// newest key of `keys_dir` (as any gateway sharing that directory signs
/// one), for a fresh visitor id and 600 s: a buyer without the queue.
pub fn admitted_visitor(keys_dir: &Path, base: &str, room: &str) -> visitor::Visitor {
    let ring = sluice_admission::Keyring::load_dir(keys_dir).expect("the keys directory");
    let claims = sluice_admission::AdmitClaims::new(
        room,
        &sluice_admission::new_visitor_id(),
        1,
        sluice_gateway::app::now_s(),
        Duration::from_secs(600),
    );
    let mut v = visitor::Visitor::new(base, room);
    v.admission_token = Some(ring.sign_admit(&claims).expect("a signed admission"));
    v
}

/// Runs `sluice prequeue-verify` with `args` and returns what it printed,
/// after checking it exited 0 and found the seed matching its commitment.
pub fn prequeue_verify(args: &[&str]) -> String {
    let out = std::process::Command::new(sluice_bin())
        .arg("prequeue-verify")
        .args(args)
        .output()
        .expect("sluice prequeue-verify runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("commitment matches"), "{text}");
    text
}
