//! The `sluice` command line: `serve`, `check-config`, and the operator
//! tools. Flags of `serve` follow API.md's operating contract; each also
//! reads the environment variable beside it. Precedence: flag or
//! environment, then the config file, then the built-in default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;

use crate::app::state::AppState;
use crate::config::{Config, ConfigError, EXIT_CONFIG, LogFormat};
use crate::edge::server;
use crate::tools::demo_origin;

/// sluice — an edge virtual waiting room.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Validate a config file and exit (0 valid, 64 invalid).
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Read and change a running gateway's rooms and events (admin API).
    #[cfg(feature = "tools")]
    Admin(crate::tools::admin_cli::AdminArgs),
    /// Simulate a queue in virtual time with the real admission code.
    #[cfg(feature = "tools")]
    Simulate(crate::tools::simulate::SimulateArgs),
    /// Throw a bounded crowd of real HTTP visitors at a running gateway
    /// (loopback only unless --allow-remote) and report what they got.
    #[cfg(feature = "tools")]
    Swarm(crate::tools::swarm::SwarmArgs),
    /// Check a scheduled room's published pre-queue draw: that the revealed
    /// seed matches the commitment published before the opening, and the
    /// place each ticket got (or one seq's place). Exit 1 on a mismatch.
    PrequeueVerify(crate::gate::schedule::VerifyArgs),
    /// Write every event's reservation stream into PostgreSQL (the ledger).
    Ledger(crate::tools::ledger_cmd::LedgerArgs),
    /// Ask a running gateway's probe (readiness by default): exit 0 when it
    /// answers 2xx, else 1. The container image's health check.
    Health(crate::tools::health::HealthArgs),
    /// Write a new Ed25519 signing key (PKCS#8, mode 0600) named by a fresh
    /// key id into DIR. The newest key signs; older keys keep verifying
    /// (rotation without logging anyone out). Prints the key id.
    Keygen {
        /// The keys directory (`--keys-dir` of `serve`).
        #[arg(long)]
        out: PathBuf,
    },
}

/// Flags of `sluice serve` (API.md, operating contract).
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "SLUICE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain (leaf first): `--listen` serves HTTPS, h2 and
    /// http/1.1 by ALPN (`server.tls.cert`) [default: plain HTTP].
    #[arg(long, env = "SLUICE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert` (`server.tls.key`).
    #[arg(long, env = "SLUICE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Origin base URL, http:// or https:// [default: the built-in demo shop].
    #[arg(long, env = "SLUICE_ORIGIN")]
    pub origin: Option<String>,
    /// PEM bundle of the CAs an https:// origin's certificate must chain
    /// to (`proxy.origin_ca`) [default: the system's roots].
    #[arg(long, env = "SLUICE_ORIGIN_CA")]
    pub origin_ca: Option<PathBuf>,
    /// Redis URL: redis://, redis+cluster:// or redis+sentinel://host:port,…/service; rediss… for TLS [default: in-memory stores].
    #[arg(long, env = "SLUICE_REDIS_URL")]
    pub redis: Option<String>,
    #[command(flatten)]
    pub redis_tls: RedisTlsArgs,
    /// Redis replicas that must acknowledge each hold and payment
    /// confirmation (`WAIT`) [default: 0, asynchronous].
    #[arg(long, env = "SLUICE_REDIS_WAIT_REPLICAS")]
    pub redis_wait_replicas: Option<u32>,
    /// How long holds wait for those replicas, e.g. `100ms` [default: 100ms].
    #[arg(long, env = "SLUICE_REDIS_WAIT_TIMEOUT", value_parser = humantime_serde::re::humantime::parse_duration)]
    pub redis_wait_timeout: Option<std::time::Duration>,
    /// PostgreSQL URL of the ledger: `serve` runs a ledger consumer
    /// in-process and can rebuild a lost event from it [default: no ledger].
    #[arg(long, env = "SLUICE_POSTGRES_URL", hide_env_values = true)]
    pub postgres: Option<String>,
    /// Bearer token of the admin API [default: admin API closed].
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Shared proof-of-work HMAC secret [default: random at start].
    #[arg(long, env = "SLUICE_POW_SECRET", hide_env_values = true)]
    pub pow_secret: Option<String>,
    /// An earlier proof-of-work secret, still accepted (not used to sign)
    /// while challenges issued before a rotation live out their TTL;
    /// repeat for two [default: none].
    #[arg(
        long = "pow-previous-secret",
        env = "SLUICE_POW_PREVIOUS_SECRETS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub pow_previous_secrets: Vec<String>,
    /// Payment webhook HMAC secret [default: webhook refuses everything].
    #[arg(long, env = "SLUICE_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,
    /// Directory of Ed25519 PKCS#8 keys [default: an ephemeral key].
    #[arg(long, env = "SLUICE_KEYS_DIR")]
    pub keys_dir: Option<PathBuf>,
    /// TOML config file.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Load each configured event's stock into a store that never had it
    /// (`load_stock`; a lost event, known by the store's load marker, this
    /// process or `reservation.state_file`, is never reloaded) [default:
    /// with the in-memory stores only; a Redis flushed with no gateway left
    /// running and no state file looks new].
    #[arg(long, env = "SLUICE_LOAD_STOCK", num_args = 0..=1, default_missing_value = "true")]
    pub load_stock: Option<bool>,
    /// Threads serving connections, each with an event loop of its own
    /// (`server.io_threads`) [default: 0, one per core].
    #[arg(long, env = "SLUICE_IO_THREADS")]
    pub io_threads: Option<usize>,
}

/// The TLS files of a `rediss…` store, for `serve` and `ledger` alike.
#[derive(Debug, Args, Default, Clone)]
pub struct RedisTlsArgs {
    /// PEM CA certificates the Redis servers' certificates must chain to
    /// (`redis_ca`) [default: the system roots].
    #[arg(long, env = "SLUICE_REDIS_CA")]
    pub redis_ca: Option<PathBuf>,
    /// PEM client certificate for Redis servers that require one
    /// (`tls-auth-clients yes`; `redis_client_cert`), with --redis-client-key.
    #[arg(long, env = "SLUICE_REDIS_CLIENT_CERT")]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM private key of --redis-client-cert (`redis_client_key`).
    #[arg(long, env = "SLUICE_REDIS_CLIENT_KEY")]
    pub redis_client_key: Option<PathBuf>,
}

impl RedisTlsArgs {
    /// Puts the flags given over the config file's settings.
    pub fn apply(&self, c: &mut Config) {
        if let Some(v) = &self.redis_ca {
            c.redis_ca = Some(v.clone());
        }
        if let Some(v) = &self.redis_client_cert {
            c.redis_client_cert = Some(v.clone());
        }
        if let Some(v) = &self.redis_client_key {
            c.redis_client_key = Some(v.clone());
        }
    }
}

impl ServeArgs {
    /// The effective configuration: file, then flags and environment on top,
    /// then the embedded default's room and event, validated. With no file
    /// and no origin (the embedded demo shop) that room is the demo's
    /// ([`demo_origin::room`]).
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(v) = self.listen {
            c.listen = v;
        }
        if let Some(v) = &self.origin {
            c.origin = Some(v.clone());
        }
        if let Some(v) = &self.origin_ca {
            c.proxy.origin_ca = Some(v.clone());
        }
        if let Some(v) = &self.redis {
            c.redis = Some(v.clone());
        }
        if self.tls_cert.is_some() || self.tls_key.is_some() {
            let tls = c.server.tls.get_or_insert_with(Default::default);
            if let Some(v) = &self.tls_cert {
                tls.cert = v.clone();
            }
            if let Some(v) = &self.tls_key {
                tls.key = v.clone();
            }
        }
        self.redis_tls.apply(&mut c);
        if let Some(v) = self.io_threads {
            c.server.io_threads = v;
        }
        if let Some(v) = &self.postgres {
            c.ledger.postgres = Some(v.clone());
        }
        if let Some(v) = self.load_stock {
            c.load_stock = Some(v);
        }
        if let Some(v) = self.redis_wait_replicas {
            c.replication.wait_replicas = v;
        }
        if let Some(v) = self.redis_wait_timeout {
            c.replication.wait_timeout = v;
        }
        if let Some(v) = &self.admin_token {
            c.admin_token = Some(v.clone());
        }
        if let Some(v) = &self.pow_secret {
            c.pow_secret = Some(v.clone());
        }
        if !self.pow_previous_secrets.is_empty() {
            c.pow_previous_secrets = self.pow_previous_secrets.clone();
        }
        if let Some(v) = &self.webhook_secret {
            c.webhook_secret = Some(v.clone());
        }
        if let Some(v) = &self.keys_dir {
            c.keys_dir = Some(v.clone());
        }
        if let Some(v) = self.log_format {
            c.log_format = v;
        }
        if self.config.is_none() && c.origin.is_none() && c.rooms.is_empty() {
            // The embedded demo: its room lets the shop's crowd form a line.
            c.rooms.push(demo_origin::room());
        }
        let c = c.with_defaults();
        c.validate()?;
        Ok(c)
    }
}

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => {
            match Config::from_file(&file).and_then(|c| {
                let c = c.with_defaults();
                c.validate().map(|()| c)
            }) {
                Ok(c) => {
                    println!(
                        "{}: ok ({} room(s), {} event(s))",
                        file.display(),
                        c.rooms.len(),
                        c.events.len()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => config_failure(&e),
            }
        }
        #[cfg(feature = "tools")]
        Command::Admin(args) => crate::tools::admin_cli::run(args),
        #[cfg(feature = "tools")]
        Command::Simulate(args) => crate::tools::simulate::run(args),
        #[cfg(feature = "tools")]
        Command::Swarm(args) => crate::tools::swarm::run(args),
        Command::Ledger(args) => crate::tools::ledger_cmd::run(args),
        Command::Health(args) => crate::tools::health::run(args),
        Command::PrequeueVerify(args) => crate::gate::schedule::run_verify(args),
        Command::Keygen { out } => match sluice_admission::keygen(&out) {
            Ok(kid) => {
                println!("{kid}");
                eprintln!(
                    "sluice: wrote {}/{kid}.pk8; gateways started with --keys-dir {} now sign with it",
                    out.display(),
                    out.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice: keygen: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            let config = match args.resolve() {
                Ok(c) => c,
                Err(e) => return config_failure(&e),
            };
            init_tracing(config.log_format);
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sluice: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sluice: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn config_failure(e: &ConfigError) -> ExitCode {
    eprintln!("sluice: {e}");
    ExitCode::from(EXIT_CONFIG as u8)
}

pub(crate) fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,hyper=warn,hyper_util=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// `sluice serve`: starts the demo origin when none is configured, binds,
/// prints the address, and serves until SIGTERM or Ctrl-C.
pub async fn serve(mut config: Config) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    let plain = server::bind_plain(&config).await?;
    let scheme = if config.server.tls.is_some() {
        crate::edge::tls::install_default_provider();
        "https"
    } else {
        "http"
    };
    let mut crowd = false;
    if config.origin.is_none() {
        // The demo shop's payment provider signs webhooks: with no secret
        // given, one is made up for this process and shared with it.
        let secret = config
            .webhook_secret
            .get_or_insert_with(|| {
                let bytes: [u8; 24] = rand::random();
                bytes.iter().map(|b| format!("{b:02x}")).collect()
            })
            .clone();
        let (gateway, reachable) = demo_gateway_url(&config, addr, plain.as_ref());
        let shop = demo_origin::spawn(demo_origin::DemoOptions {
            webhook_secret: Some(secret),
            gateway: Some(gateway.clone()),
        })
        .await?;
        tracing::info!(addr = %shop.addr, "no --origin given: serving the built-in demo shop");
        crowd = reachable && give_crowd(&shop, &gateway, &config);
        config.origin = Some(shop.url());
    }
    let state = AppState::new(config).await?;
    if let Some(p) = plain.as_ref().and_then(|p| p.local_addr().ok()) {
        tracing::info!(addr = %p, "plain HTTP listening beside HTTPS (server.tls.http_listen)");
    }
    // Written, never `println!`: a supervisor (or a test) that reads the
    // first line and closes the pipe must not make the gateway panic on
    // the second (EPIPE).
    let mut banner = format!("sluice listening on {scheme}://{addr}/ — open it in a browser\n");
    if crowd {
        banner.push_str(&format!(
            "the demo shop's front page sends a crowd through the waiting room; watch it at {scheme}://{addr}/_sluice/admin/\n"
        ));
    }
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
    }
    tracing::info!(%addr, "listening");
    server::serve_with_plain(state, listener, plain, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Gives the embedded shop its crowd: `sluice swarm`'s visitors sent to
/// this gateway on loopback (a build without the tools has none, nor has a
/// gateway the crowd cannot reach on loopback over plain HTTP); whether it
/// got one. The crowd queues in the first room (the only one, `default`,
/// without a config file).
#[cfg(feature = "tools")]
fn give_crowd(shop: &demo_origin::DemoShop, gateway: &str, config: &Config) -> bool {
    let Some(room) = config.rooms.first() else {
        return false;
    };
    match crate::tools::swarm::demo::DemoCrowd::new(gateway, &room.id) {
        Some(crowd) => {
            shop.set_crowd(std::sync::Arc::new(crowd));
            true
        }
        None => {
            tracing::warn!(
                gateway,
                "the demo shop's crowd needs the gateway on loopback over plain HTTP: its control is off"
            );
            false
        }
    }
}

#[cfg(not(feature = "tools"))]
fn give_crowd(_: &demo_origin::DemoShop, _: &str, _: &Config) -> bool {
    false
}

/// Where the demo shop sends its payment webhooks: the gateway's plain
/// HTTP (its client has no TLS): `listen`, or with TLS the plain listener
/// beside it when that one serves rather than redirects.
/// Whether it can (false: an HTTPS-only gateway, whose plain address is
/// given anyway and warned about; the crowd is not sent there).
fn demo_gateway_url(
    config: &Config,
    addr: SocketAddr,
    plain: Option<&TcpListener>,
) -> (String, bool) {
    let Some(tls) = &config.server.tls else {
        return (format!("http://{addr}"), true);
    };
    match plain.and_then(|p| p.local_addr().ok()) {
        Some(p) if !tls.redirect_to_https => (format!("http://{p}"), true),
        _ => {
            tracing::warn!(
                "the demo shop cannot reach an HTTPS-only gateway: its payment webhooks will fail and it sends no crowd (set server.tls.http_listen with redirect_to_https = false)"
            );
            (format!("http://{addr}"), false)
        }
    }
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}
