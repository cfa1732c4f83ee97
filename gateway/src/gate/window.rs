//! One room's upstream requests since the last look: the latencies and
//! failures adaptive admission ([`crate::gate::adaptive`]) decides from,
//! recorded by the gate on every proxied request of the room in atomic
//! counters (no lock per request). Not hdrhistogram (which `sluice swarm`
//! uses): its `record` takes `&mut`, a lock on every proxied request, where
//! 128 fixed atomic buckets 10% wide are all a p99 to steer by needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets of the latency histogram: bucket `i ≥ 1` holds latencies up to
/// `1.1^i` ms (about 10% wide), bucket 0 those under 1 ms; the last one
/// everything above ~3 minutes.
const BUCKETS: usize = 128;
const GROWTH: f64 = 1.1;

/// The upper bound of bucket `i`, in ms.
fn bucket_upper_ms(i: usize) -> f64 {
    GROWTH.powi(i as i32)
}

fn bucket_of(ms: f64) -> usize {
    if ms.is_nan() || ms <= 1.0 {
        return 0;
    }
    ((ms.ln() / GROWTH.ln()).ceil() as usize).min(BUCKETS - 1)
}

/// One room's upstream requests since the last drain: a latency histogram
/// and an error count, all atomics (the proxy path takes no lock).
pub struct Window {
    buckets: [AtomicU64; BUCKETS],
    errors: AtomicU64,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            errors: AtomicU64::new(0),
        }
    }
}

/// What a window saw.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WindowSummary {
    /// Upstream requests.
    pub requests: u64,
    /// Of which failed.
    pub errors: u64,
    /// The 99th percentile latency, ms (to the bucket's upper bound, so at
    /// most ~10% high); `None` with no request.
    pub p99_ms: Option<f64>,
}

impl WindowSummary {
    /// `errors / requests` (`None` with no request).
    pub fn error_ratio(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.errors as f64 / self.requests as f64)
    }
}

impl Window {
    /// Records one upstream request.
    pub fn record(&self, latency: Duration, failed: bool) {
        let ms = latency.as_secs_f64() * 1000.0;
        self.buckets[bucket_of(ms)].fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests recorded since the last drain.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Takes what was recorded since the last drain (and starts a new
    /// window). Requests recorded while it drains land in one window or the
    /// next, never in none or both.
    pub fn drain(&self) -> WindowSummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect();
        let errors = self.errors.swap(0, Ordering::Relaxed);
        let requests: u64 = counts.iter().sum();
        let p99_ms = (requests > 0).then(|| {
            // the smallest bucket holding the 99th percentile request
            let rank = (requests as f64 * 0.99).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return bucket_upper_ms(i);
                }
            }
            bucket_upper_ms(BUCKETS - 1)
        });
        WindowSummary {
            requests,
            errors: errors.min(requests),
            p99_ms,
        }
    }
}
