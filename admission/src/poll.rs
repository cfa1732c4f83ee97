//! How often a waiting page should poll, how long it will wait, and the
//! measured admission rate those estimates use.
//!
//! A queue of millions must not hammer the edge: the poll interval grows
//! with the distance to the front, from [`MIN_POLL_MS`] for the next few
//! hundred up to [`MAX_POLL_MS`] far back, with ±20% jitter so pages that
//! joined together do not poll together.

use std::collections::VecDeque;

use rand::{Rng, RngExt as _};

/// The shortest interval asked for (near the front).
pub const MIN_POLL_MS: u64 = 1_000;
/// The longest interval asked for (far back).
pub const MAX_POLL_MS: u64 = 20_000;

/// The interval before jitter for `position`: 1 s for the first 10
/// places, then `1 s × sqrt(position / 10)` (10 s at 1,000 ahead), at most
/// 20 s (from 4,000 ahead).
pub fn base_poll_ms(position: u64) -> u64 {
    let p = position.max(1) as f64;
    let ms = (MIN_POLL_MS as f64 * (p / 10.0).sqrt()).round() as u64;
    ms.clamp(MIN_POLL_MS, MAX_POLL_MS)
}

fn jitter<R: Rng + ?Sized>(ms: u64, rng: &mut R) -> u64 {
    let f: f64 = rng.random_range(0.8..1.2);
    ((ms as f64 * f).round() as u64).max(MIN_POLL_MS * 8 / 10)
}

/// `base_poll_ms(position)` ±20% jitter.
pub fn poll_after_ms<R: Rng + ?Sized>(position: u64, rng: &mut R) -> u64 {
    jitter(base_poll_ms(position), rng)
}

/// Like [`poll_after_ms`], but never longer than a quarter of the expected
/// wait at `admit_rate` (a fast queue near its turn polls sooner than its
/// position alone suggests). Without a measured rate, as [`poll_after_ms`].
pub fn poll_after_ms_eta<R: Rng + ?Sized>(position: u64, admit_rate: f64, rng: &mut R) -> u64 {
    let mut base = base_poll_ms(position);
    if admit_rate > 0.0 && admit_rate.is_finite() {
        let quarter = (position as f64 / admit_rate * 1000.0 / 4.0) as u64;
        base = base.min(quarter.max(MIN_POLL_MS));
    }
    jitter(base, rng)
}

/// Seconds until `position` is admitted at `admit_rate` admissions/s:
/// `ceil(position / rate)`; `None` when nothing is being admitted.
pub fn eta_seconds(position: u64, admit_rate: f64) -> Option<u64> {
    if position == 0 {
        return Some(0);
    }
    if admit_rate > 0.0 && admit_rate.is_finite() {
        Some((position as f64 / admit_rate).ceil() as u64)
    } else {
        None
    }
}

/// Measures a counter's rate (admissions/s, joins/s) from successive
/// snapshots over a sliding window.
#[derive(Clone, Debug)]
pub struct RateMeter {
    window_ms: u64,
    samples: VecDeque<(u64, u64)>,
}

impl RateMeter {
    /// A meter over `window_ms` (e.g. 10,000).
    pub fn new(window_ms: u64) -> Self {
        Self {
            window_ms: window_ms.max(1),
            samples: VecDeque::new(),
        }
    }

    /// Records the counter's value at `now_ms` (store clock). A counter that
    /// went down (a store that lost its state) restarts the meter.
    pub fn record(&mut self, now_ms: u64, total: u64) {
        if let Some(&(t, v)) = self.samples.back() {
            if total < v || now_ms < t {
                self.samples.clear();
            } else if now_ms == t {
                self.samples.pop_back();
            }
        }
        self.samples.push_back((now_ms, total));
        // keep one sample at or before the window start
        while self.samples.len() > 2 {
            if self.samples[1].0 + self.window_ms <= now_ms {
                self.samples.pop_front();
            } else {
                break;
            }
        }
    }

    /// Per second over the window; `None` before two samples.
    pub fn rate(&self) -> Option<f64> {
        let (t0, v0) = *self.samples.front()?;
        let (t1, v1) = *self.samples.back()?;
        if t1 <= t0 {
            return None;
        }
        Some((v1 - v0) as f64 * 1000.0 / (t1 - t0) as f64)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn poll_grows_with_distance() {
        assert_eq!(base_poll_ms(1), 1_000);
        assert_eq!(base_poll_ms(10), 1_000);
        assert_eq!(base_poll_ms(1_000), 10_000);
        assert_eq!(base_poll_ms(1_000_000), 20_000);
        let mut prev = 0;
        for p in [1, 50, 200, 900, 3_000, 10_000] {
            let b = base_poll_ms(p);
            assert!(b >= prev);
            prev = b;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..1000 {
            let v = poll_after_ms(5_000_000, &mut rng);
            assert!((16_000..=24_000).contains(&v));
            let v = poll_after_ms(1, &mut rng);
            assert!((800..=1_200).contains(&v));
        }
        // fast queue: 1000 ahead at 1000/s polls about every second
        let v = poll_after_ms_eta(1_000, 1_000.0, &mut rng);
        assert!(v <= 1_200);
    }

    #[test]
    fn eta() {
        assert_eq!(eta_seconds(0, 0.0), Some(0));
        assert_eq!(eta_seconds(100, 0.0), None);
        assert_eq!(eta_seconds(100, 30.0), Some(4));
    }

    #[test]
    fn rate_meter_window() {
        let mut m = RateMeter::new(10_000);
        assert_eq!(m.rate(), None);
        for i in 0..=100u64 {
            m.record(i * 250, i * 5); // 20/s
        }
        assert!((m.rate().unwrap() - 20.0).abs() < 1e-9);
        // rate changes: the window forgets the old one
        for i in 101..=200u64 {
            m.record(i * 250, 500 + (i - 100) * 10); // 40/s
        }
        assert!((m.rate().unwrap() - 40.0).abs() < 1.0);
        m.record(60_000, 3); // store lost its state
        assert_eq!(m.rate(), None);
    }
}
