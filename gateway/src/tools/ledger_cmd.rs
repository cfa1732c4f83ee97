//! `sluice ledger`: the process that writes every event's reservation
//! stream into PostgreSQL (the `sluice-ledger` crate does the work; this
//! file is its flags and its process: runtime, logs, signals, exit codes).
//!
//! Exit codes: 0 after SIGTERM or Ctrl-C (the batches in hand written and
//! acknowledged first), 64 for unusable flags, 1 when the runtime cannot
//! start. PostgreSQL or Redis being away is not a reason to exit: the
//! ledger retries, and its lag shows it.
//!
//! `sluice ledger payments --provider URL` reconciles the payment
//! provider's list of payment events with the recorded holds
//! (`sluice_ledger::payments`): it prints what needs doing (refunds,
//! webhooks lost) and exits 0 when everything is in order, 1 when
//! something needs doing, 2 when the provider or the database could not
//! be read, 64 for unusable flags.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use sluice_ledger::{ConsumerConfig, Finding, Ledger, Metrics, ProviderPayment};

use crate::config::{EXIT_CONFIG, LogFormat};

/// Flags of `sluice ledger`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LedgerArgs {
    /// Instead of running the ledger: one of its tools.
    #[command(subcommand)]
    pub command: Option<LedgerCommand>,
    /// The store's URL (as `sluice serve --redis`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    pub redis: Option<String>,
    /// Its TLS files (as `sluice serve`).
    #[command(flatten)]
    pub redis_tls: crate::tools::cli::RedisTlsArgs,
    /// The ledger database: postgres://user[:password]@host:port/db.
    #[arg(long, env = "SLUICE_POSTGRES_URL", hide_env_values = true)]
    pub postgres: Option<String>,
    /// Most stream entries written per transaction.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Longest wait for new entries, in ms, before looking around.
    #[arg(long, default_value_t = 200)]
    pub flush_ms: u64,
    /// This consumer's name in the group [default: host-pid-random].
    #[arg(long, env = "SLUICE_LEDGER_CONSUMER")]
    pub consumer: Option<String>,
    /// How long, in ms, an entry stays pending with a silent consumer
    /// before this one claims it.
    #[arg(long, default_value_t = 10_000)]
    pub claim_idle_ms: u64,
    /// Serve the ledger's counters (Prometheus text) on this address.
    #[arg(long, env = "SLUICE_LEDGER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
}

/// The ledger's tools.
#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Reconcile the payment provider's payment events with the recorded
    /// holds: paid holds that lapsed (refunds), webhooks that never
    /// arrived, double charges.
    Payments(PaymentsArgs),
}

/// Flags of `sluice ledger payments`.
#[derive(Debug, Args)]
pub struct PaymentsArgs {
    /// The ledger database.
    #[arg(long, env = "SLUICE_POSTGRES_URL", hide_env_values = true)]
    pub postgres: Option<String>,
    /// The provider's list of payment events (http://…; JSON `{"data":
    /// [{"payment_event_id", "hold_id", "outcome"}]}` or a bare array),
    /// e.g. the demo shop's `http://127.0.0.1:PORT/demo-pay/events`.
    #[arg(long)]
    pub provider: String,
    /// Print every payment event with its finding, as JSON lines.
    #[arg(long)]
    pub all: bool,
}

impl LedgerArgs {
    /// The consumer's settings, or why the flags cannot work.
    pub fn resolve(&self) -> Result<ConsumerConfig, String> {
        let redis = self
            .redis
            .clone()
            .ok_or("--redis (or SLUICE_REDIS_URL) is required")?;
        let postgres = self
            .postgres
            .clone()
            .ok_or("--postgres (or SLUICE_POSTGRES_URL) is required")?;
        let tls = self.tls(&redis)?;
        let mut c = ConsumerConfig::new(redis, postgres);
        c.redis_tls = tls;
        c.batch = self.batch;
        c.flush = Duration::from_millis(self.flush_ms);
        c.claim_idle = Duration::from_millis(self.claim_idle_ms);
        c.consumer = self.consumer.clone();
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

impl LedgerArgs {
    /// The TLS files, checked as `serve` checks them (the words name the
    /// config keys `serve` reads; the flags are spelled alike).
    fn tls(&self, redis: &str) -> Result<sluice_redis::RedisTls, String> {
        let mut c = crate::config::Config {
            redis: Some(redis.to_owned()),
            ..crate::config::Config::default()
        };
        self.redis_tls.apply(&mut c);
        c.redis_tls().map_err(|e| e.to_string())
    }
}

/// Runs `sluice ledger`; returns the exit code.
pub fn run(args: LedgerArgs) -> ExitCode {
    if let Some(LedgerCommand::Payments(p)) = args.command {
        return payments(p);
    }
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: ledger: {e}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    crate::tools::cli::init_tracing(args.log_format.unwrap_or(LogFormat::Text));
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: ledger: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let metrics = Arc::new(Metrics::default());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        if let Some(addr) = args.metrics_listen {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => {
                    let local = listener.local_addr().unwrap_or(addr);
                    println!("sluice ledger metrics on http://{local}/metrics");
                    let mut stop = stop_rx.clone();
                    tokio::spawn(sluice_ledger::serve_metrics(
                        listener,
                        metrics.clone(),
                        async move {
                            let _ = stop.wait_for(|v| *v).await;
                        },
                    ));
                }
                Err(e) => {
                    eprintln!("sluice: ledger: cannot listen on {addr}: {e}");
                    return ExitCode::from(EXIT_CONFIG as u8);
                }
            }
        }
        let shutdown = async move {
            crate::tools::cli::shutdown_signal().await;
            let _ = stop_tx.send(true);
        };
        match sluice_ledger::run(config, metrics, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice: ledger: {e}");
                ExitCode::from(EXIT_CONFIG as u8)
            }
        }
    })
}

// === sluice ledger payments ===

fn payments(args: PaymentsArgs) -> ExitCode {
    let Some(pg) = args.postgres.clone() else {
        eprintln!("sluice: ledger payments: --postgres (or SLUICE_POSTGRES_URL) is required");
        return ExitCode::from(EXIT_CONFIG as u8);
    };
    let Ok(uri) = args.provider.parse::<http::Uri>() else {
        eprintln!("sluice: ledger payments: --provider is not a URL");
        return ExitCode::from(EXIT_CONFIG as u8);
    };
    if uri.scheme_str() != Some("http") {
        eprintln!("sluice: ledger payments: --provider must be an http:// URL");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: ledger payments: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let report = rt.block_on(async move {
        let listed = fetch_payments(uri).await?;
        let ledger = Ledger::connect(&pg, Duration::from_secs(5))
            .await
            .map_err(|e| format!("database: {e}"))?;
        ledger
            .reconcile_payments(&listed)
            .await
            .map_err(|e| format!("database: {e}"))
    });
    let findings = match report {
        Ok(f) => f,
        Err(e) => {
            eprintln!("sluice: ledger payments: {e}");
            return ExitCode::from(2);
        }
    };
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    let mut act = 0;
    for (p, f) in &findings {
        let name = match f {
            Finding::Settled => "settled",
            Finding::NoSale => "no_sale",
            Finding::Refund { .. } => "refund",
            Finding::DoubleCharge { .. } => "double_charge",
            Finding::WebhookMissing => "webhook_missing",
            Finding::UnknownHold => "unknown_hold",
            Finding::Inconsistent { .. } => "inconsistent",
        };
        *counts.entry(name).or_default() += 1;
        if f.needs_action() {
            act += 1;
        }
        if args.all || f.needs_action() {
            println!("{}", serde_json::json!({"payment": p, "finding": f}));
        }
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    eprintln!(
        "sluice: ledger payments: {} payment events: {}",
        findings.len(),
        summary.join(", ")
    );
    if act > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Reads the provider's list (bounded: 64 MiB, 30 s).
async fn fetch_payments(uri: http::Uri) -> Result<Vec<ProviderPayment>, String> {
    use http_body_util::{BodyExt, Full, Limited};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::get(uri)
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(bytes::Bytes::new()))
        .map_err(|e| format!("provider: {e}"))?;
    let res = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .map_err(|_| "provider: no answer in 30 s".to_owned())?
        .map_err(|e| format!("provider: {e}"))?;
    if !res.status().is_success() {
        return Err(format!("provider answered {}", res.status()));
    }
    let body = Limited::new(res.into_body(), 64 << 20)
        .collect()
        .await
        .map_err(|e| format!("provider: {e}"))?
        .to_bytes();
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("provider: not JSON: {e}"))?;
    let list = match v {
        serde_json::Value::Object(mut o) => o.remove("data").unwrap_or_default(),
        other => other,
    };
    serde_json::from_value(list).map_err(|e| format!("provider: unexpected list: {e}"))
}
