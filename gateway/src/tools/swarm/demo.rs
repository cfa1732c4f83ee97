//! The crowd of the embedded demo (issue 21, "the first five minutes"):
//! `sluice serve` with no `--origin` gives its demo shop a [`DemoCrowd`],
//! and the control on the shop's front page sends it through this very
//! gateway, so a newcomer sees a line form, move and drain.
//!
//! It is `sluice swarm`'s crowd run in-process: the same visitors (proof of
//! work solved natively, join, polls, admission) over real HTTP to the
//! gateway's own listener, on loopback only (the address is checked as
//! `--url` is). Its visitors leave once let in, holding nothing, so the
//! shop's stock is still there for the newcomer.
//!
//! Bounds: [`VISITORS`] visitors, arriving at [`ARRIVALS_PER_SEC`], all
//! stopped at [`HARD_STOP`] at the latest, at most [`REQUESTS_PER_SEC`]
//! requests/s in all, one proof of work solved at a time; one crowd at a
//! time (a second press while one is on its way starts nothing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::crowd::{self, Counters};
use super::{Settings, check_target};
use crate::tools::demo_origin::{Crowd, CrowdProgress, CrowdStart};

/// Visitors in one crowd.
pub const VISITORS: u64 = 300;
/// How fast they arrive: the demo room admits 6/s, so the line grows for
/// the ~8 s they take to arrive and drains in well under a minute.
pub const ARRIVALS_PER_SEC: f64 = 40.0;
/// However far it got, the crowd stops by itself after this.
pub const HARD_STOP: Duration = Duration::from_secs(120);
/// Cap on the crowd's requests per second (polls included).
pub const REQUESTS_PER_SEC: f64 = 200.0;
/// Proofs of work solved at once: one core's worth, the rest of the
/// machine is the gateway's (and the newcomer's browser's). One after the
/// other, the fans join in the order they came, as a real crowd would.
const SOLVERS: usize = 1;
/// Longest sleep between two polls of a visitor in line, whatever the
/// gateway suggests: a fan let in notices within this.
const MAX_POLL: Duration = Duration::from_secs(3);

/// The crowd of one gateway's embedded demo.
pub struct DemoCrowd {
    base: String,
    room: String,
    run: Mutex<Option<Run>>,
}

/// One crowd on its way, or the last one.
struct Run {
    counters: Arc<Counters>,
    began: Instant,
    done: Arc<AtomicBool>,
}

impl DemoCrowd {
    /// A crowd for the gateway at `gateway` (`http://host:port`, as the
    /// demo shop reaches it) queueing in `room`. An unspecified address
    /// (`0.0.0.0`, `[::]`) is reached on loopback; `None` when the address
    /// is not loopback then, or not plain HTTP: the demo never sends a crowd
    /// anywhere else.
    pub fn new(gateway: &str, room: &str) -> Option<DemoCrowd> {
        let local = gateway
            .replacen("//0.0.0.0:", "//127.0.0.1:", 1)
            .replacen("//[::]:", "//[::1]:", 1);
        let base = check_target(&local, false).ok()?;
        Some(DemoCrowd {
            base,
            room: room.to_owned(),
            run: Mutex::new(None),
        })
    }

    fn settings(&self) -> Settings {
        Settings {
            bases: vec![self.base.clone()],
            arrival_rate: ARRIVALS_PER_SEC,
            room: self.room.clone(),
            event: "demo".to_owned(),
            visitors: VISITORS,
            // every visitor waits in line at once: one worker each
            concurrency: VISITORS as usize,
            duration: HARD_STOP,
            rate: REQUESTS_PER_SEC,
            max_poll: MAX_POLL,
            max_qty: None,
            pay_ratio: 0.0,
            webhook_secret: None,
            admin_token: None,
            lane_mix: Vec::new(),
            enqueue_secret: None,
            seed: rand::random(),
            buy: false,
            solvers: SOLVERS,
            progress: false,
        }
    }

    fn progress_of(&self, run: Option<&Run>) -> CrowdProgress {
        let Some(r) = run else {
            return CrowdProgress {
                room: self.room.clone(),
                visitors: VISITORS,
                stops_within_secs: HARD_STOP.as_secs(),
                ..CrowdProgress::default()
            };
        };
        let c = &r.counters;
        let elapsed = r.began.elapsed();
        let running = !r.done.load(Ordering::Acquire);
        CrowdProgress {
            room: self.room.clone(),
            running,
            visitors: VISITORS,
            arrived: c.started.load(Ordering::Relaxed),
            joined: c.joined.load(Ordering::Relaxed),
            admitted: c.admitted.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            elapsed_secs: elapsed.as_secs(),
            stops_within_secs: if running {
                HARD_STOP.saturating_sub(elapsed).as_secs()
            } else {
                0
            },
        }
    }
}

impl Crowd for DemoCrowd {
    fn start(&self) -> CrowdStart {
        // The lock is held from the check to the new run's record, so two
        // presses at once start one crowd.
        let mut current = self.run.lock();
        if let Some(r) = current.as_ref()
            && !r.done.load(Ordering::Acquire)
        {
            return CrowdStart::AlreadyRunning(self.progress_of(Some(r)));
        }
        let run = Run {
            counters: Arc::default(),
            began: Instant::now(),
            done: Arc::new(AtomicBool::new(false)),
        };
        let (settings, counters, done) = (self.settings(), run.counters.clone(), run.done.clone());
        tracing::info!(
            visitors = VISITORS,
            gateway = %self.base,
            room = %self.room,
            "demo: a crowd is on its way"
        );
        tokio::spawn(async move {
            match crowd::run(settings, counters).await {
                Ok(report) => tracing::info!(
                    admitted = report.admitted,
                    failed = report.failed,
                    stopped_by = report.stopped_by,
                    seconds = report.elapsed.as_secs(),
                    "demo: the crowd is through"
                ),
                Err(e) => tracing::warn!(error = %e.message, "demo: the crowd could not start"),
            }
            done.store(true, Ordering::Release);
        });
        let progress = self.progress_of(Some(&run));
        *current = Some(run);
        CrowdStart::Started(progress)
    }

    fn progress(&self) -> CrowdProgress {
        self.progress_of(self.run.lock().as_ref())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_loopback_is_ever_the_target() {
        let at = |url: &str| DemoCrowd::new(url, "default").map(|c| c.base);
        assert_eq!(
            at("http://127.0.0.1:8080").as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(
            at("http://0.0.0.0:8080").as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(at("http://[::]:9").as_deref(), Some("http://[::1]:9"));
        assert!(at("http://192.0.2.7:8080").is_none());
        assert!(at("https://127.0.0.1:8443").is_none());
    }

    #[tokio::test]
    async fn a_second_press_while_one_runs_starts_nothing() {
        // A loopback port nobody listens on: the crowd fails its first
        // probe and stops; the second press comes before (the runtime
        // runs the crowd's task only once this test yields).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let crowd = DemoCrowd::new(&format!("http://127.0.0.1:{port}"), "default").unwrap();
        assert!(!crowd.progress().running);
        let CrowdStart::Started(p) = crowd.start() else {
            panic!("the first press starts a crowd");
        };
        assert!(p.running);
        assert_eq!(p.visitors, VISITORS);
        assert!(matches!(crowd.start(), CrowdStart::AlreadyRunning(_)));
        // It stops by itself (here: at once, nobody to visit), and then a
        // press starts a new one.
        let deadline = Instant::now() + Duration::from_secs(20);
        while crowd.progress().running {
            assert!(Instant::now() < deadline, "the crowd never stopped");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(matches!(crowd.start(), CrowdStart::Started(_)));
    }
}
