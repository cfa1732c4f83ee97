//! `sluice ledger`: the process that writes every event's reservation
//! stream into PostgreSQL (the `sluice-ledger` crate does the work; this
//! file is its flags and its process: runtime, logs, signals, exit codes).
//!
//! Exit codes: 0 after SIGTERM or Ctrl-C (the batches in hand written and
//! acknowledged first), 64 for unusable flags, 1 when the runtime cannot
//! start. PostgreSQL or Redis being away is not a reason to exit: the
//! ledger retries, and its lag shows it.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sluice_ledger::{ConsumerConfig, Metrics};

use crate::config::{EXIT_CONFIG, LogFormat};

/// Flags of `sluice ledger`.
#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// The store's URL (as `sluice serve --redis`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    pub redis: Option<String>,
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
        let mut c = ConsumerConfig::new(redis, postgres);
        c.batch = self.batch;
        c.flush = Duration::from_millis(self.flush_ms);
        c.claim_idle = Duration::from_millis(self.claim_idle_ms);
        c.consumer = self.consumer.clone();
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

/// Runs `sluice ledger`; returns the exit code.
pub fn run(args: LedgerArgs) -> ExitCode {
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
