//! A rate limit every gateway on one store shares
//! ([`crate::QueueStore::take_rate`]): a verified crawler's budget is one
//! budget however many gateways it is spread over. Our own code rather
//! than governor's: governor keeps its state in the process, and the Redis
//! store runs the same arithmetic in `lua/rate.lua`.
//!
//! # The arithmetic (GCRA, the generic cell rate algorithm)
//!
//! A bucket is one number, its *theoretical arrival time* `tat` (ms on the
//! store's clock; none yet: now). With `interval = 1000 / per_sec` ms, a
//! take at `now` moves `tat` to `max(tat, now) + interval` and is allowed
//! when that is at most `now + burst × interval`: `burst` takes at once
//! from a bucket left alone, then one per `interval`. A refused take
//! changes nothing and says how long until it would be allowed (at least
//! 1 ms). The store forgets a bucket once its `tat` has passed (it is then
//! the same as none).

/// Whether `per_sec` and `burst` make a bucket: a finite rate above zero,
/// at most 10⁶ a second, and a burst of at least one.
pub fn valid(per_sec: f64, burst: u32) -> bool {
    per_sec.is_finite() && per_sec > 0.0 && per_sec <= 1e6 && burst >= 1
}

/// [`valid`], as the stores answer it: the key of the characters of a
/// room id, at most 100 of them (`[A-Za-z0-9._-]{1,100}`, refused as
/// [`crate::AdmissionError::InvalidRoomId`]), the bucket a valid one.
pub fn check(key: &str, per_sec: f64, burst: u32) -> Result<(), crate::AdmissionError> {
    let key_ok = !key.is_empty()
        && key.len() <= 100
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !key_ok {
        return Err(crate::AdmissionError::InvalidRoomId(key.to_owned()));
    }
    if valid(per_sec, burst) {
        Ok(())
    } else {
        Err(crate::settings::InvalidSetting {
            field: "rate",
            reason: format!(
                "a shared rate needs 0 < per_sec <= 1e6 and burst >= 1 (got {per_sec}, {burst})"
            ),
        }
        .into())
    }
}

/// Slack in the comparison (ms): sums of float intervals round, and a
/// take exactly at its time must not be refused for a last bit.
const EPS_MS: f64 = 0.001;

/// One take at `now_ms` from a bucket whose time is `tat_ms` (module
/// docs): `Ok(new tat)` when allowed, `Err(ms to wait)` when not. The
/// same test as "the new tat at most `burst` intervals ahead": the old tat
/// at most `burst − 1` intervals ahead of now.
pub fn take(tat_ms: Option<f64>, now_ms: f64, per_sec: f64, burst: u32) -> Result<f64, u64> {
    let interval = 1000.0 / per_sec;
    let tat = tat_ms.unwrap_or(now_ms).max(now_ms);
    let ahead = tat - now_ms;
    let tolerance = f64::from(burst.saturating_sub(1)) * interval;
    if ahead > tolerance + EPS_MS {
        Err(((ahead - tolerance).ceil() as u64).max(1))
    } else {
        Ok(tat + interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes from one bucket at the given times; the allowed ones.
    fn run(per_sec: f64, burst: u32, times: &[f64]) -> Vec<bool> {
        let mut tat = None;
        times
            .iter()
            .map(|&t| match take(tat, t, per_sec, burst) {
                Ok(next) => {
                    tat = Some(next);
                    true
                }
                Err(_) => false,
            })
            .collect()
    }

    #[test]
    fn a_burst_then_one_per_interval() {
        // 2 a second, burst 3: three at once, then one every 500 ms
        let got = run(2.0, 3, &[0.0, 0.0, 0.0, 0.0, 499.0, 500.0, 500.0, 1000.0]);
        assert_eq!(got, [true, true, true, false, false, true, false, true]);
        assert_eq!(take(Some(1500.0), 0.0, 2.0, 1), Err(1500));
        assert_eq!(take(Some(1500.0), 0.0, 2.0, 2), Err(1000));
        assert_eq!(take(Some(1500.0), 1500.0, 2.0, 1), Ok(2000.0));
        assert_eq!(take(Some(0.5), 0.0, 1e6, 1), Err(1));
    }

    proptest::proptest! {
        /// However the takes are spread, no window of length w allows more
        /// than burst + w × per_sec of them, a bucket left alone for
        /// burst × interval allows burst at once, and a refusal's wait is
        /// exactly when a take is allowed again.
        #[test]
        fn never_more_than_the_rate_allows(
            per_sec in 0.01f64..1000.0,
            burst in 1u32..20,
            gaps in proptest::collection::vec(0f64..300.0, 1..200),
        ) {
            let mut t = 0.0;
            let times: Vec<f64> = gaps.iter().map(|g| { t += g; t }).collect();
            let allowed: Vec<f64> = times
                .iter()
                .zip(run(per_sec, burst, &times))
                .filter(|(_, ok)| *ok)
                .map(|(t, _)| *t)
                .collect();
            for (i, &start) in allowed.iter().enumerate() {
                for w in [0.0, 100.0, 1000.0, 10_000.0] {
                    let n = allowed[i..].iter().take_while(|&&x| x <= start + w).count();
                    let bound = f64::from(burst) + (w + EPS_MS) * per_sec / 1000.0;
                    proptest::prop_assert!(n as f64 <= bound, "{n} in {w} ms > {bound}");
                }
            }
            // a rested bucket: burst at once
            let rest = times.last().copied().unwrap_or(0.0) + f64::from(burst) * 1000.0 / per_sec + 1.0;
            let mut tat = None;
            for _ in 0..burst {
                let next = take(tat, rest, per_sec, burst);
                proptest::prop_assert!(next.is_ok());
                tat = next.ok();
            }
            match take(tat, rest, per_sec, burst) {
                Ok(_) => proptest::prop_assert!(false, "burst + 1 at once"),
                Err(wait) => {
                    // (a thousandth of a ms either way: float rounding)
                    let at = rest + wait as f64;
                    proptest::prop_assert!(take(tat, at + 0.001, per_sec, burst).is_ok(), "allowed after the wait");
                    if wait > 1 {
                        proptest::prop_assert!(take(tat, at - 1.001, per_sec, burst).is_err(), "not a ms before it");
                    }
                }
            }
        }
    }
}
