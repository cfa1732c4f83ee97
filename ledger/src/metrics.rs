//! The ledger process's counters, per event, and the small `/metrics`
//! endpoint that serves them in Prometheus' text format
//! (`sluice ledger --metrics-listen`).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use sluice_reservation::EventId;

/// Counters of one event, as the ledger process exposes them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EventStats {
    /// Entries recorded for the first time.
    pub entries: u64,
    /// Entries that were already recorded (replays, claims).
    pub duplicates: u64,
    /// Entries parked in `dead_letters`.
    pub dead_letters: u64,
    /// Batches committed.
    pub batches: u64,
    /// Failed attempts to write a batch.
    pub write_failures: u64,
    /// The last exact reconciliation's drift (`ledger − store` units).
    pub drift_units: i64,
    /// Exact reconciliation checks made.
    pub checks: u64,
    /// The last exact reconciliation's drift per category (every category
    /// checked, 0 where they agree; empty without categories).
    pub category_drift: BTreeMap<String, i64>,
    /// Entries not yet recorded (last look).
    pub lag_entries: u64,
    /// Age of the oldest of them, seconds (last look).
    pub lag_seconds: f64,
}

/// One exported series: name, type, help, and how to read it.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&EventStats) -> f64,
);

/// The process's counters, per event; shared by the tasks and the
/// `/metrics` endpoint.
#[derive(Debug, Default)]
pub struct Metrics {
    events: Mutex<BTreeMap<String, EventStats>>,
}

impl Metrics {
    /// A copy of every event's counters.
    pub fn snapshot(&self) -> BTreeMap<String, EventStats> {
        self.events.lock().clone()
    }

    pub(crate) fn update(&self, event: &EventId, f: impl FnOnce(&mut EventStats)) {
        f(self
            .events
            .lock()
            .entry(event.as_str().to_owned())
            .or_default());
    }

    /// The counters in Prometheus' text format.
    pub fn render(&self) -> String {
        let snap = self.snapshot();
        let mut out = String::new();
        let series: [Series; 9] = [
            (
                "sluice_ledger_entries_total",
                "counter",
                "Stream entries recorded for the first time.",
                |s| s.entries as f64,
            ),
            (
                "sluice_ledger_duplicates_total",
                "counter",
                "Stream entries already recorded (replays).",
                |s| s.duplicates as f64,
            ),
            (
                "sluice_ledger_dead_letters_total",
                "counter",
                "Stream entries parked in dead_letters.",
                |s| s.dead_letters as f64,
            ),
            (
                "sluice_ledger_batches_total",
                "counter",
                "Batches committed.",
                |s| s.batches as f64,
            ),
            (
                "sluice_ledger_write_failures_total",
                "counter",
                "Failed attempts to write a batch.",
                |s| s.write_failures as f64,
            ),
            (
                "sluice_ledger_checks_total",
                "counter",
                "Exact reconciliation checks.",
                |s| s.checks as f64,
            ),
            (
                "sluice_ledger_drift_units",
                "gauge",
                "Ledger minus store available units at the last check.",
                |s| s.drift_units as f64,
            ),
            (
                "sluice_ledger_lag_entries",
                "gauge",
                "Stream entries not yet recorded.",
                |s| s.lag_entries as f64,
            ),
            (
                "sluice_ledger_lag_seconds",
                "gauge",
                "Age of the oldest entry not yet recorded.",
                |s| s.lag_seconds,
            ),
        ];
        for (name, kind, help, get) in series {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (event, s) in &snap {
                out.push_str(&format!("{name}{{event=\"{event}\"}} {}\n", get(s)));
            }
        }
        let name = "sluice_ledger_category_drift_units";
        out.push_str(&format!(
            "# HELP {name} Ledger minus store available units of a category at the last check.\n\
             # TYPE {name} gauge\n"
        ));
        for (event, s) in &snap {
            for (category, d) in &s.category_drift {
                out.push_str(&format!(
                    "{name}{{event=\"{event}\",category=\"{category}\"}} {d}\n"
                ));
            }
        }
        out
    }
}

/// Serves `GET /metrics` (anything else too) with the counters, in
/// Prometheus' text format, until `stop` resolves.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let accept = async {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let m = metrics.clone();
            tokio::spawn(async move {
                // Read the request head (bounded), answer, close.
                let mut buf = vec![0u8; 4096];
                let mut n = 0;
                while n < buf.len() {
                    match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[n..]))
                        .await
                    {
                        Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                        Ok(Ok(k)) => {
                            n += k;
                            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                    }
                }
                let body = m.render();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(body.as_bytes()).await;
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = stop => {}
    }
}
