//! The run: one probe per gateway before the crowd (a wrong address, room
//! or token fails fast), `--concurrency` workers each starting visitors
//! until `--visitors` have come (open-loop arrivals with
//! `--arrival-rate`), the hard stop at `--duration`, and the admin view of
//! the stock before and after.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use indicatif::ProgressBar;
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::Settings;
use super::client::{Endpoint, Http, Stats};
use super::fairness::{Admission, RANDOM_NOT_MEASURED, draw_of, fairness_json};
use super::ledger::Ledger;
use super::report::{Report, progress_bar};
use super::visitor::{EventInfo, Outcome, Stop, visit};
use crate::tools::{Failure, failure};

/// What the visitors did, counted as they go (the progress bar reads it).
#[derive(Default)]
pub(super) struct Counters {
    pub(super) started: AtomicU64,
    pub(super) finished: AtomicU64,
    pub(super) joined: AtomicU64,
    pub(super) admitted: AtomicU64,
    pub(super) sold_out: AtomicU64,
    pub(super) failed: AtomicU64,
}

/// Everything the visitors share.
pub(super) struct Shared {
    pub(super) s: Settings,
    pub(super) http: Http,
    pub(super) ledger: Mutex<Ledger>,
    pub(super) counters: Arc<Counters>,
    next_visitor: AtomicUsize,
    pub(super) event: tokio::sync::OnceCell<EventInfo>,
    /// Proofs of work solved at once, when bounded (`Settings::solvers`).
    pub(super) solvers: Option<tokio::sync::Semaphore>,
    /// Keeps idempotency keys and payment ids of two runs apart (the seed
    /// only fixes the visitors' choices).
    pub(super) run_id: u64,
    bar: ProgressBar,
    /// When the crowd started (arrivals are paced from it, joins are
    /// timed from it).
    pub(super) t0: tokio::time::Instant,
    /// Every admitted visitor's arrival and place, for the fairness measure.
    pub(super) admissions: Mutex<Vec<Admission>>,
}

/// Starts visitors one after the other until none is left.
async fn worker(sh: Arc<Shared>) {
    loop {
        let i = sh.next_visitor.fetch_add(1, Ordering::Relaxed) as u64;
        if i >= sh.s.visitors {
            return;
        }
        if sh.s.arrival_rate > 0.0 {
            // open-loop arrivals: visitor i comes at i / rate
            let at = sh.t0 + Duration::from_secs_f64(i as f64 / sh.s.arrival_rate);
            tokio::time::sleep_until(at).await;
        }
        sh.counters.started.fetch_add(1, Ordering::Relaxed);
        let outcome = match visit(&sh, i).await {
            Ok(o) | Err(Stop(o)) => o,
        };
        let c = &sh.counters;
        match outcome {
            Outcome::Bought | Outcome::Left => {}
            Outcome::SoldOut => {
                c.sold_out.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Failed => {
                c.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        c.finished.fetch_add(1, Ordering::Relaxed);
        sh.bar.inc(1);
        let l = sh.ledger.lock();
        sh.bar.set_message(format!(
            "admitted {} · holds {} · failed {}",
            c.admitted.load(Ordering::Relaxed),
            l.holds,
            c.failed.load(Ordering::Relaxed)
        ));
    }
}

/// The admin view of the event.
async fn admin_event(http: &Http, s: &Settings) -> Result<Value, String> {
    let Some(token) = &s.admin_token else {
        return Err("no admin token".into());
    };
    let path = format!("/_sluice/admin/events/{}", s.event);
    let a = http.get(Endpoint::Admin, &path, Some(token)).await?;
    if a.status != StatusCode::OK {
        return Err(format!(
            "GET {path}: HTTP {} {}",
            a.status,
            a.code().unwrap_or("")
        ));
    }
    Ok(a.body)
}

/// Runs the crowd and gathers the report.
pub(super) async fn swarm(s: Settings) -> Result<Report, Failure> {
    run(s, Arc::default()).await
}

/// [`swarm`], counting into `counters` as it goes (the embedded demo
/// reads them while the crowd runs).
pub(super) async fn run(s: Settings, counters: Arc<Counters>) -> Result<Report, Failure> {
    let http = Http::new(s.bases.clone(), s.rate, s.concurrency);
    // Fail fast on a wrong address, room or token, before the crowd: one
    // probe per gateway (the round-robin starts at the first).
    let room_path = format!("/_sluice/rooms/{}", s.room);
    for base in &s.bases {
        match http.get(Endpoint::Status, &room_path, None).await {
            Ok(a) if a.status == StatusCode::OK => {}
            Ok(a) => {
                return Err(failure(format!(
                    "{base}{room_path}: HTTP {} {}",
                    a.status,
                    a.code().unwrap_or("")
                )));
            }
            Err(e) => return Err(failure(format!("{base}: {e}"))),
        }
    }
    let stock_before = match &s.admin_token {
        Some(_) => Some(
            admin_event(&http, &s)
                .await
                .map_err(|e| failure(format!("admin API: {e}")))?,
        ),
        None => None,
    };
    // the fail-fast probes are not part of the measurements
    *http.stats.lock() = Stats::default();

    let bar = progress_bar(&s);
    let sh = Arc::new(Shared {
        s: s.clone(),
        http,
        ledger: Mutex::new(Ledger::default()),
        counters,
        next_visitor: AtomicUsize::new(0),
        event: tokio::sync::OnceCell::new(),
        solvers: (s.solvers > 0).then(|| tokio::sync::Semaphore::new(s.solvers)),
        run_id: rand::random(),
        bar: bar.clone(),
        t0: tokio::time::Instant::now(),
        admissions: Mutex::new(Vec::new()),
    });
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let workers = s
        .concurrency
        .min(usize::try_from(s.visitors).unwrap_or(usize::MAX));
    for _ in 0..workers {
        set.spawn(worker(sh.clone()));
    }
    let all_done = async { while set.join_next().await.is_some() {} };
    let stopped_by = match tokio::time::timeout(s.duration, all_done).await {
        Ok(()) => "done",
        Err(_) => "duration",
    };
    set.abort_all();
    while set.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let stock = match &s.admin_token {
        Some(_) => Some(
            admin_event(&sh.http, &s)
                .await
                .unwrap_or_else(|e| json!({ "error": e })),
        ),
        None => None,
    };
    // the published draw of a scheduled room, for the places of its tickets
    let public = match sh.http.get(Endpoint::Status, &room_path, None).await {
        Ok(a) if a.status == StatusCode::OK => Some(a.body),
        _ => None,
    };
    let draw = public.as_ref().and_then(draw_of);
    let mut fairness = fairness_json(&sh.admissions.lock(), draw.as_ref());
    if public.as_ref().is_some_and(|p| p["method"] == "random") {
        // an admission token names the seq, not the place a draw gave it,
        // and the draws' seeds stay secret until the room closes: ranking
        // by seq would report FIFO order for a room that is not FIFO
        fairness["kendall_tau"] = Value::Null;
        fairness["admission"] = json!(RANDOM_NOT_MEASURED);
    }
    let event = sh.event.get().cloned();
    let stats = std::mem::take(&mut *sh.http.stats.lock());
    let ledger = std::mem::take(&mut *sh.ledger.lock());
    let c = &sh.counters;
    Ok(Report {
        s,
        stopped_by,
        elapsed,
        started: c.started.load(Ordering::Relaxed),
        finished: c.finished.load(Ordering::Relaxed),
        joined: c.joined.load(Ordering::Relaxed),
        admitted: c.admitted.load(Ordering::Relaxed),
        sold_out: c.sold_out.load(Ordering::Relaxed),
        failed: c.failed.load(Ordering::Relaxed),
        event,
        stock_before,
        stock,
        ledger,
        stats,
        fairness,
    })
}
