//! Adaptive admission: the gateway listens to the origin and steers a
//! room's admission rate to hold a latency and error objective.
//!
//! # How it decides
//!
//! Every proxied request of a room records its upstream latency (time to
//! the origin's response headers) and whether it failed (5xx, unreachable,
//! timeout) in the room's [`Window`]: a histogram of atomic counters, no
//! lock on the hot path. Every `interval` the steering gateway drains the
//! window and [`decide`]s:
//!
//! - **decrease** (`rate × decrease_factor`) when the window's p99 is above
//!   [`DECREASE_ABOVE`] of the objective, or the error ratio above its
//!   maximum. Acting at 80% leaves a margin for the one interval it takes to
//!   see an overload. After a decrease the next interval holds (visitors
//!   admitted at the old rate are still arriving) unless p99 is past
//!   [`SEVERE`] times the objective, and for a few more a p99
//!   that is still high but falling holds too (the origin is draining the
//!   backlog of the old rate): one cut per round trip, not a cascade.
//! - **increase** (`rate + increase_step`) while p99 is below
//!   [`INCREASE_BELOW`] of the objective, errors under their maximum, and
//!   the room actually uses its rate: people wait (a queue) and admission
//!   is not held back by something else (the `max_active` cap reached, a
//!   pause, sold out). Otherwise nothing is learned about a higher rate,
//!   so it holds. While p99 is below [`FAR_BELOW`] of the
//!   objective the origin is far from its limit and the step is at least
//!   [`FAST_STEP`] of the rate — up to `decrease_factor` × the rate at
//!   which the last overload episode began (TCP's slow-start threshold) —
//!   so the recovery from a deep cut takes seconds, not minutes, without
//!   overshooting the last known limit.
//! - **decrease** too when p99 is between half and 80% of the objective
//!   and rose over two windows running: the origin's backlog is growing,
//!   so act before the objective is crossed.
//! - **hold** otherwise, and with fewer than `min_samples` requests in the
//!   window (too little to tell). At a low rate the window first stretches
//!   over up to [`MAX_STRETCH`] intervals to gather them.
//!
//! The rate always stays within `[floor_rate, ceiling]`, where the ceiling
//! is `ceiling_rate`, lowered to the capacity-derived rate when the room
//! has `capacity_rps` (the calibrated capacity is never exceeded; if the
//! capacity is below the floor, the capacity wins).
//!
//! # One steering gateway per room
//!
//! Gateways sharing a store elect one steerer per room with a lease in the
//! store ([`sluice_admission::QueueStore::lease`], `SET NX PX` semantics,
//! renewed every interval, lasting three). The steerer decides from **its
//! own** proxied traffic (behind a load balancer, a fair sample of the
//! whole) and writes the rate through the store's `configure`, as an admin
//! PATCH does, so every gateway follows within a tick. Its decision (mode,
//! reason, p99, error ratio) is stored with the room's settings, so the
//! admin API of any gateway shows it.
//!
//! # The operator has the last word
//!
//! A manual `rate_per_sec` PATCH overrides adaptation for `override` (or for
//! the PATCH's `adaptive_override_secs`); a PATCH of `adaptive_enabled`
//! switches it on or off live.

use std::sync::Arc;

use sluice_admission::{QueueBackend, QueueStore};

use crate::app::telemetry::Telemetry;
pub use crate::config::adaptive::{AdaptiveConfig, bounds};
use crate::gate::rooms::Room;
pub use crate::gate::window::{Window, WindowSummary};

/// Increases only while the window's p99 is below this share of the
/// objective.
pub const INCREASE_BELOW: f64 = 0.5;
/// Decreases when the window's p99 is above this share of the objective.
pub const DECREASE_ABOVE: f64 = 0.8;
/// Right after a decrease, a p99 above this multiple of the objective cuts
/// again at once (a severe overload) instead of settling an interval.
pub const SEVERE: f64 = 2.0;
/// While p99 is below this share of the objective the origin is far from
/// its limit: the increase is at least [`FAST_STEP`] of the rate.
pub const FAR_BELOW: f64 = 0.25;
/// The least relative increase while far below the objective.
pub const FAST_STEP: f64 = 0.1;
/// A window with fewer than `min_samples` requests stretches over up to
/// this many intervals before a decision.
pub const MAX_STRETCH: u32 = 10;

// === the controller ===

/// What the controller knows at one decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// The rate in force.
    pub rate: f64,
    /// The capacity-derived rate, when `capacity_rps` is set.
    pub capacity_rate: Option<f64>,
    /// The window just drained.
    pub window: WindowSummary,
    /// The previous window's p99 (to see a backlog draining).
    pub previous_p99_ms: Option<f64>,
    /// Decisions since the last decrease (1: the previous one was a
    /// decrease; `u32::MAX`: none yet).
    pub since_decrease: u32,
    /// Visitors waiting.
    pub queue_length: u64,
    /// The fast climb stops here: `decrease_factor` × the rate at which the
    /// last overload episode began (`None` before the first: climb fast).
    pub fast_below: Option<f64>,
    /// Admission is held back by something else (the `max_active` cap is
    /// reached, or the room is paused or sold out): the rate is not in use.
    pub capped: bool,
}

/// What the controller decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The rate to set.
    pub rate: f64,
    /// `increasing`, `decreasing` or `holding`.
    pub mode: Mode,
    /// Why, in words.
    pub reason: String,
}

/// The controller's modes, as the admin API and metrics spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Healthy and used: the rate grows.
    Increasing,
    /// Over the objective: the rate shrinks.
    Decreasing,
    /// Nothing to learn, or near the objective.
    Holding,
    /// An operator's manual rate stands.
    Overridden,
    /// Adaptation is off.
    Off,
}

impl Mode {
    /// The name in the admin API and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Increasing => "increasing",
            Mode::Decreasing => "decreasing",
            Mode::Holding => "holding",
            Mode::Overridden => "overridden",
            Mode::Off => "off",
        }
    }
}

/// One decision of the AIMD controller (see the module docs). Pure.
///
/// One piece on purpose: its rules read top to bottom in priority order
/// (too few samples, errors, over the objective, near it, nothing to
/// learn, increase), each an early return; split, that order would be
/// spread over functions that each need the whole observation.
pub fn decide(cfg: &AdaptiveConfig, obs: &Observation) -> Decision {
    let (lo, hi) = bounds(cfg, obs.capacity_rate);
    let clamp = |r: f64| if r.is_finite() { r.clamp(lo, hi) } else { lo };
    let objective = cfg.latency_p99_ms;
    let w = &obs.window;
    if w.requests < cfg.min_samples {
        let rate = clamp(obs.rate);
        return Decision {
            rate,
            mode: if rate < obs.rate {
                Mode::Decreasing
            } else {
                Mode::Holding
            },
            reason: format!(
                "{} upstream requests in the window, fewer than {}: nothing to learn",
                w.requests, cfg.min_samples
            ),
        };
    }
    let p99 = w.p99_ms.unwrap_or(0.0);
    let errors = w.error_ratio().unwrap_or(0.0);
    if errors > cfg.max_error_ratio {
        return Decision {
            rate: clamp(obs.rate * cfg.decrease_factor),
            mode: Mode::Decreasing,
            reason: format!(
                "errors {:.1}% > {:.1}%",
                errors * 100.0,
                cfg.max_error_ratio * 100.0
            ),
        };
    }
    if p99 > objective * DECREASE_ABOVE {
        if obs.since_decrease == 1 && p99 <= objective * SEVERE {
            // Visitors admitted at the old rate are still arriving: judge
            // the cut once it has had an interval to act.
            return Decision {
                rate: clamp(obs.rate),
                mode: Mode::Holding,
                reason: format!("p99 {p99:.0} ms: settling after the last decrease"),
            };
        }
        let draining =
            obs.since_decrease <= 4 && obs.previous_p99_ms.is_some_and(|prev| p99 < prev);
        if draining {
            return Decision {
                rate: clamp(obs.rate),
                mode: Mode::Holding,
                reason: format!(
                    "p99 {p99:.0} ms falling since the last decrease: the origin drains its backlog"
                ),
            };
        }
        return Decision {
            rate: clamp(obs.rate * cfg.decrease_factor),
            mode: Mode::Decreasing,
            reason: format!(
                "p99 {p99:.0} ms > {:.0} ms ({:.0}% of the {objective:.0} ms objective)",
                objective * DECREASE_ABOVE,
                DECREASE_ABOVE * 100.0
            ),
        };
    }
    if p99 > objective * INCREASE_BELOW {
        // Near the objective and climbing two windows running: the rate is
        // above what the origin serves (its backlog grows), so act before
        // the objective is crossed.
        let rising = obs
            .previous_p99_ms
            .is_some_and(|prev| prev > objective * INCREASE_BELOW && p99 > prev);
        if rising && obs.since_decrease > 1 {
            return Decision {
                rate: clamp(obs.rate * cfg.decrease_factor),
                mode: Mode::Decreasing,
                reason: format!(
                    "p99 {p99:.0} ms rising towards the {objective:.0} ms objective (was {:.0} ms)",
                    obs.previous_p99_ms.unwrap_or(0.0)
                ),
            };
        }
        return Decision {
            rate: clamp(obs.rate),
            mode: Mode::Holding,
            reason: format!("p99 {p99:.0} ms near the {objective:.0} ms objective"),
        };
    }
    if obs.queue_length == 0 {
        return Decision {
            rate: clamp(obs.rate),
            mode: Mode::Holding,
            reason: format!("p99 {p99:.0} ms, nobody waiting: nothing to learn"),
        };
    }
    if obs.capped {
        return Decision {
            rate: clamp(obs.rate),
            mode: Mode::Holding,
            reason: format!(
                "p99 {p99:.0} ms, admission held back by max_active or a pause: nothing to learn"
            ),
        };
    }
    let step = match obs.fast_below {
        _ if p99 >= objective * FAR_BELOW => cfg.increase_step,
        None => cfg.increase_step.max(obs.rate * FAST_STEP),
        Some(t) => cfg
            .increase_step
            .max((obs.rate * FAST_STEP).min(t - obs.rate)),
    };
    let rate = clamp(obs.rate + step);
    let mode = if rate > obs.rate {
        Mode::Increasing
    } else if rate < obs.rate {
        Mode::Decreasing
    } else {
        Mode::Holding
    };
    let reason = if rate <= obs.rate && (obs.rate + step) > hi {
        format!(
            "p99 {p99:.0} ms ≤ {:.0} ms, at the ceiling {hi:.1}/s",
            objective * INCREASE_BELOW
        )
    } else {
        format!(
            "p99 {p99:.0} ms ≤ {:.0} ms, {} waiting",
            objective * INCREASE_BELOW,
            obs.queue_length
        )
    };
    Decision { rate, mode, reason }
}

// === the steering task ===

/// Steers `room` while adaptive admission is on for it: every `interval`,
/// drains the room's window, and if this gateway holds (or takes) the
/// room's lease, decides and writes the rate and the decision through the
/// store. Every gateway runs it for every room; only the lease holder acts.
///
/// One piece on purpose: one loop whose state (the last decision, the
/// previous p99, the windows since the last decrease, the lease) lives in
/// its locals from one interval to the next, read in the order the steps
/// happen.
pub async fn run_steering(
    room: Arc<Room>,
    store: QueueBackend,
    telemetry: Telemetry,
    holder: String,
) {
    let cfg = room.config.adaptive.clone();
    let mut interval = tokio::time::interval(cfg.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    let mut previous_p99_ms = None;
    let mut since_decrease = u32::MAX;
    let mut fast_below = None;
    let mut last_mode = None;
    let mut stretched = 0;
    loop {
        interval.tick().await;
        // Too few requests to judge (a low rate): the window stretches over
        // more intervals, up to MAX_STRETCH, rather than decide from noise.
        if room.window().count() < cfg.min_samples && stretched < MAX_STRETCH {
            stretched += 1;
            continue;
        }
        stretched = 0;
        // Every gateway drains, so a gateway that takes over starts from a
        // fresh window.
        let window = room.window().drain();
        if !room.settings().adaptive.enabled {
            room.set_steering(false);
            previous_p99_ms = None;
            since_decrease = u32::MAX;
            fast_below = None;
            last_mode = None;
            continue;
        }
        let leader = match store.lease(room.id(), &holder, cfg.interval * 3).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(room = room.id(), error = %e, "steering lease: store unavailable");
                false
            }
        };
        room.set_steering(leader);
        if !leader {
            continue;
        }
        // Fresh from the store, so a PATCH made through another gateway a
        // moment ago (a manual rate, its override) is not written over.
        let mut settings = match store.settings(room.id()).await {
            Ok(Some(s)) if s.adaptive.enabled => s,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(room = room.id(), error = %e, "steering: store unavailable");
                continue;
            }
        };
        let snap = room.snapshot();
        let now_ms = snap.store_now_ms.max(1);
        let until = settings.adaptive.override_until_ms;
        let decision = if until > now_ms {
            Decision {
                rate: settings.rate_per_sec,
                mode: Mode::Overridden,
                reason: format!(
                    "manual rate {:.1}/s for {} s more",
                    settings.rate_per_sec,
                    (until - now_ms).div_ceil(1000)
                ),
            }
        } else {
            decide(
                &cfg,
                &Observation {
                    rate: settings.rate_per_sec,
                    capacity_rate: settings.capacity_rate(),
                    window,
                    previous_p99_ms,
                    since_decrease,
                    fast_below,
                    queue_length: snap.queue_length(),
                    capped: snap.paused
                        || snap
                            .max_active
                            .is_some_and(|m| snap.active_sessions + snap.pending_claims >= m),
                },
            )
        };
        previous_p99_ms = window.p99_ms;
        since_decrease = if decision.mode == Mode::Decreasing {
            if since_decrease > 4 {
                // a new overload episode: below the rate it began at, the
                // fast climb is safe
                fast_below = Some(settings.rate_per_sec * cfg.decrease_factor);
            }
            1
        } else {
            since_decrease.saturating_add(1)
        };
        // the store keeps rates to the thousandth
        settings.rate_per_sec = (decision.rate * 1000.0).round() / 1000.0;
        let a = &mut settings.adaptive;
        a.mode = decision.mode.as_str().to_owned();
        a.reason = decision.reason.clone();
        a.p99_ms = window.p99_ms;
        a.error_ratio = window.error_ratio();
        a.decided_at_ms = now_ms;
        // Compare and set on the version read above: a PATCH (or a sold-out
        // flag) written meanwhile wins, and this decision is taken again at
        // the next interval from what the store holds then.
        match store.update_settings(room.id(), &settings).await {
            Ok(snap) => {
                settings.version += 1;
                room.set_settings(settings.clone());
                room.record(snap);
            }
            Err(sluice_admission::AdmissionError::SettingsConflict { .. }) => {
                tracing::debug!(
                    room = room.id(),
                    "adaptive admission: settings changed meanwhile; deciding again next interval"
                );
                continue;
            }
            Err(e) => {
                tracing::warn!(room = room.id(), error = %e, "adaptive admission: rate not written");
                continue;
            }
        }
        telemetry.adaptive(
            room.id(),
            decision.mode.as_str(),
            settings.rate_per_sec,
            window.p99_ms,
            window.error_ratio(),
        );
        if last_mode != Some(decision.mode) {
            tracing::info!(
                room = room.id(),
                mode = decision.mode.as_str(),
                rate_per_sec = settings.rate_per_sec,
                reason = %decision.reason,
                "adaptive admission"
            );
            last_mode = Some(decision.mode);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn cfg() -> AdaptiveConfig {
        AdaptiveConfig {
            enabled: true,
            floor_rate: 5.0,
            ceiling_rate: 200.0,
            min_samples: 10,
            ..AdaptiveConfig::default()
        }
    }

    fn obs(rate: f64, p99: f64, errors: u64, queue: u64) -> Observation {
        Observation {
            rate,
            capacity_rate: None,
            window: WindowSummary {
                requests: 100,
                errors,
                p99_ms: Some(p99),
            },
            previous_p99_ms: None,
            since_decrease: u32::MAX,
            fast_below: None,
            queue_length: queue,
            capped: false,
        }
    }

    #[test]
    fn config_is_validated_and_read_from_toml() {
        let c: AdaptiveConfig = toml::from_str(
            "enabled = true\nlatency_p99_ms = 300\ninterval = \"1s\"\noverride = \"5m\"",
        )
        .unwrap();
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.override_for, Duration::from_secs(300));
        c.validate("rooms[0].adaptive").unwrap();
        for (bad, field) in [
            (
                AdaptiveConfig {
                    decrease_factor: 1.0,
                    ..c.clone()
                },
                "decrease_factor",
            ),
            (
                AdaptiveConfig {
                    floor_rate: 50.0,
                    ceiling_rate: 10.0,
                    ..c.clone()
                },
                "ceiling_rate",
            ),
            (
                AdaptiveConfig {
                    latency_p99_ms: f64::NAN,
                    ..c.clone()
                },
                "latency_p99_ms",
            ),
            (
                AdaptiveConfig {
                    max_error_ratio: 1.5,
                    ..c.clone()
                },
                "max_error_ratio",
            ),
            (
                AdaptiveConfig {
                    interval: Duration::ZERO,
                    ..c.clone()
                },
                "interval",
            ),
        ] {
            let e = bad.validate("rooms[0].adaptive").unwrap_err().to_string();
            assert!(e.contains(&format!("rooms[0].adaptive.{field}")), "{e}");
        }
        assert!(toml::from_str::<AdaptiveConfig>("enabeld = true").is_err());
    }

    #[test]
    fn window_percentile_and_errors() {
        let w = Window::default();
        for i in 0..99 {
            w.record(Duration::from_millis(10 + i % 5), false);
        }
        w.record(Duration::from_millis(900), true);
        let s = w.drain();
        assert_eq!((s.requests, s.errors), (100, 1));
        let p99 = s.p99_ms.unwrap();
        assert!((14.0..=16.0).contains(&p99), "{p99}");
        // the window starts anew
        assert_eq!(w.drain(), WindowSummary::default());
        for _ in 0..10 {
            w.record(Duration::from_millis(812), false);
        }
        let p99 = w.drain().p99_ms.unwrap();
        assert!((812.0..=812.0 * 1.1).contains(&p99), "{p99}");
    }

    #[test]
    fn breach_decreases_health_with_queue_increases() {
        let c = cfg();
        let d = decide(&c, &obs(100.0, 812.0, 0, 50));
        assert_eq!(d.mode, Mode::Decreasing);
        assert!((d.rate - 70.0).abs() < 1e-9);
        assert!(d.reason.starts_with("p99 812 ms > 400 ms"), "{}", d.reason);
        let d = decide(&c, &obs(100.0, 50.0, 5, 50));
        assert_eq!(d.mode, Mode::Decreasing);
        assert!(d.reason.starts_with("errors 5.0% > 1.0%"), "{}", d.reason);
        let d = decide(&c, &obs(100.0, 200.0, 0, 50));
        assert_eq!((d.mode, d.rate), (Mode::Increasing, 102.0));
        // far below the objective: at least 10% more
        let d = decide(&c, &obs(100.0, 50.0, 0, 50));
        assert_eq!((d.mode, d.rate), (Mode::Increasing, 110.0));
        // no queue: nothing learned
        let d = decide(&c, &obs(100.0, 50.0, 0, 0));
        assert_eq!((d.mode, d.rate), (Mode::Holding, 100.0));
        // near the objective: hold, unless rising two windows running
        let d = decide(&c, &obs(100.0, 300.0, 0, 50));
        assert_eq!((d.mode, d.rate), (Mode::Holding, 100.0));
        let mut o = obs(100.0, 330.0, 0, 50);
        o.previous_p99_ms = Some(280.0);
        assert_eq!(decide(&c, &o).mode, Mode::Decreasing);
        o.previous_p99_ms = Some(200.0);
        assert_eq!(decide(&c, &o).mode, Mode::Holding);
        // right after a cut: settle one interval, unless severe
        let mut o = obs(70.0, 600.0, 0, 50);
        o.since_decrease = 1;
        o.previous_p99_ms = Some(500.0);
        assert_eq!(decide(&c, &o).mode, Mode::Holding);
        o.window.p99_ms = Some(1200.0);
        assert_eq!(decide(&c, &o).mode, Mode::Decreasing);
        o.window.p99_ms = Some(600.0);
        // still high but falling soon after a cut: hold; rising: cut again
        o.since_decrease = 2;
        o.previous_p99_ms = Some(900.0);
        assert_eq!(decide(&c, &o).mode, Mode::Holding);
        o.previous_p99_ms = Some(500.0);
        assert_eq!(decide(&c, &o).mode, Mode::Decreasing);
        // the capacity-derived rate caps the increase
        let mut o = obs(100.0, 50.0, 0, 50);
        o.capacity_rate = Some(101.0);
        assert_eq!(decide(&c, &o).rate, 101.0);
    }

    fn any_obs() -> impl Strategy<Value = Observation> {
        (
            0.0f64..2_000.0,
            proptest::option::of(0.0f64..500.0),
            0u64..500,
            0u64..500,
            proptest::option::of(0.0f64..5_000.0),
            1u32..8,
            0u64..1_000,
            any::<bool>(),
        )
            .prop_map(
                |(rate, cap, req, err, p99, dec, queue, admits)| Observation {
                    rate,
                    capacity_rate: cap,
                    window: WindowSummary {
                        requests: req,
                        errors: err.min(req),
                        p99_ms: if req > 0 { p99.or(Some(1.0)) } else { None },
                    },
                    previous_p99_ms: p99.map(|p| p * 1.1),
                    since_decrease: dec,
                    fast_below: cap.map(|c| c * 0.5),
                    queue_length: queue,
                    capped: admits,
                },
            )
    }

    proptest! {
        /// Whatever it sees, the rate stays in [min(floor, hi), hi] with
        /// hi = min(ceiling, capacity rate).
        #[test]
        fn rate_stays_within_bounds(o in any_obs(), floor in 0.0f64..100.0, extra in 0.0f64..500.0) {
            let c = AdaptiveConfig { floor_rate: floor, ceiling_rate: floor + extra + 0.1, ..cfg() };
            let d = decide(&c, &o);
            let hi = o.capacity_rate.map_or(c.ceiling_rate, |cap| c.ceiling_rate.min(cap));
            prop_assert!(d.rate <= hi + 1e-9, "{} > {}", d.rate, hi);
            prop_assert!(d.rate >= c.floor_rate.min(hi) - 1e-9);
        }

        /// A breach (enough samples, p99 over the line or errors over the
        /// maximum, and not a backlog already draining) never raises the
        /// rate, and cuts it when there is room above the floor.
        #[test]
        fn breach_never_increases(o in any_obs()) {
            let c = cfg();
            let (lo, hi) = bounds(&c, o.capacity_rate);
            let p99 = o.window.p99_ms.unwrap_or(0.0);
            let errors = o.window.error_ratio().unwrap_or(0.0);
            let draining = (o.since_decrease == 1 && p99 <= c.latency_p99_ms * SEVERE)
                || (o.since_decrease <= 4 && o.previous_p99_ms.is_some_and(|p| p99 < p));
            let breach = o.window.requests >= c.min_samples
                && (errors > c.max_error_ratio || (p99 > c.latency_p99_ms * DECREASE_ABOVE && !draining));
            let d = decide(&c, &o);
            if breach {
                prop_assert!(d.rate <= o.rate.clamp(lo, hi) + 1e-9);
                prop_assert_eq!(d.mode, Mode::Decreasing);
                if o.rate > lo && o.rate <= hi {
                    prop_assert!(d.rate < o.rate || d.rate == lo);
                }
            }
        }

        /// Healthy (enough samples, low p99, no errors) with a queue and the
        /// rate in use: the rate grows unless at the ceiling.
        #[test]
        fn healthy_with_queue_increases(rate in 5.0f64..150.0, p99 in 0.0f64..249.0, queue in 1u64..1000) {
            let c = cfg();
            let d = decide(&c, &obs(rate, p99, 0, queue));
            prop_assert_eq!(d.mode, Mode::Increasing);
            let step = if p99 < c.latency_p99_ms * FAR_BELOW {
                c.increase_step.max(rate * FAST_STEP)
            } else {
                c.increase_step
            };
            // below the last episode's start the fast climb stops
            let mut o = obs(rate, p99, 0, queue);
            o.fast_below = Some(rate);
            prop_assert!((decide(&c, &o).rate - (rate + c.increase_step)).abs() < 1e-9);
            prop_assert!((d.rate - (rate + step)).abs() < 1e-9);
            prop_assert!(d.rate >= rate + c.increase_step - 1e-9);
        }
    }
}
