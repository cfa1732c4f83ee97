//! The simulator against seed 003's worked example and the room's rules.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use sluice_admission::RoomSettings;
use sluice_admission::sim::{Arrivals, Dist, SimConfig, SimReport, run};

fn seed003() -> SimConfig {
    SimConfig {
        visitors: 50_000,
        arrivals: Arrivals::Spike,
        room: RoomSettings {
            rate_per_sec: 200.0,
            burst: 200.0,
            ..Default::default()
        },
        session_seconds: 1.0,
        ..Default::default()
    }
}

fn sim(cfg: &SimConfig) -> SimReport {
    run(cfg, |_| {}).unwrap()
}

/// Seed 003: 50,000 visitors at once, 200/s → drain 250 s, mean wait
/// ≈ 125 s, a flat origin rate of 200/s.
#[test]
fn seed_003_worked_example() {
    let started = Instant::now();
    let r = sim(&seed003());
    let elapsed = started.elapsed();
    eprintln!(
        "{r:#?}\n(in {elapsed:?})",
        r = SimReport {
            series: Vec::new(),
            ..r.clone()
        }
    );
    assert!(r.completed);
    assert_eq!(r.visitors, 50_000);
    assert_eq!(r.admitted, 50_000);
    assert_eq!(r.abandoned, 0);
    let drain = r.drain_seconds.unwrap();
    assert!((drain - 250.0).abs() <= 250.0 * 0.03, "drain {drain}");
    let w = r.wait_seconds;
    assert!(
        (w.mean - 125.0).abs() <= 125.0 * 0.05,
        "mean wait {}",
        w.mean
    );
    assert!((w.p50 - 125.0).abs() <= 125.0 * 0.05, "p50 {}", w.p50);
    assert!(w.max <= 255.0 && w.max >= 240.0, "max {}", w.max);
    assert!(
        r.peak_queue_length >= 49_000,
        "peak {}",
        r.peak_queue_length
    );
    // flat origin rate: 1 request/s for 1 s per admitted visitor
    assert!(
        r.origin_peak_rps <= 200.0 * 1.15,
        "peak {}",
        r.origin_peak_rps
    );
    assert!(
        (r.origin_mean_rps - 200.0).abs() <= 200.0 * 0.03,
        "mean {}",
        r.origin_mean_rps
    );
    let steady: Vec<f64> = r.series[5..240].iter().map(|s| s.origin_rps).collect();
    for (i, v) in steady.iter().enumerate() {
        assert!((v - 200.0).abs() <= 200.0 * 0.15, "second {}: {v}", i + 5);
    }
    // the frontier moves at the rate, every second
    for s in &r.series[1..245] {
        assert!((195..=205).contains(&s.admitted_per_sec), "{s:?}");
    }
    assert!(r.edge_polls_per_sec.peak > 0);
}

#[test]
fn deterministic_given_the_seed() {
    let cfg = SimConfig {
        visitors: 20_000,
        arrivals: Arrivals::Poisson { per_sec: 300.0 },
        solve: Dist::from_median_p95(1.0, Some(3.0)),
        patience: Some(Dist::from_median_p95(40.0, Some(120.0))),
        room: RoomSettings {
            rate_per_sec: 150.0,
            burst: 50.0,
            ..Default::default()
        },
        seed: 42,
        ..Default::default()
    };
    let a = sim(&cfg);
    let b = sim(&cfg);
    assert_eq!(a, b);
    let c = sim(&SimConfig { seed: 43, ..cfg });
    assert_ne!(a, c);
    assert_ne!(a.wait_seconds, c.wait_seconds);
}

/// Visitors who give up leave admitted places unclaimed: the claim window
/// refunds them as credit, the frontier speeds up past them, and the origin
/// keeps seeing close to the configured rate. Without refunds (a day-long
/// window) it sees only the share of visitors still there.
#[test]
fn abandonment_refunds_keep_the_claimed_rate() {
    let cfg = SimConfig {
        visitors: 20_000,
        arrivals: Arrivals::Spike,
        patience: Some(Dist::from_median_p95(150.0, Some(400.0))),
        room: RoomSettings {
            rate_per_sec: 100.0,
            burst: 100.0,
            claim_window: Duration::from_secs(10),
            ..Default::default()
        },
        ..Default::default()
    };
    let claimed_rate = |r: &SimReport| {
        let end = r.drain_seconds.unwrap() as usize;
        let window = &r.series[30..end - 10];
        window.iter().map(|s| s.claimed).sum::<u64>() as f64 / window.len() as f64
    };
    let r = sim(&cfg);
    eprintln!(
        "{:?}",
        SimReport {
            series: Vec::new(),
            ..r.clone()
        }
    );
    assert!(r.completed);
    assert!(r.abandoned > 2_000, "{}", r.abandoned);
    assert_eq!(r.admitted + r.abandoned, 20_000);
    assert!(r.refunded > 1_000, "no-shows refunded: {}", r.refunded);
    let with = claimed_rate(&r);
    assert!((85.0..=110.0).contains(&with), "claimed {with}/s");

    let slow = sim(&SimConfig {
        room: RoomSettings {
            claim_window: Duration::from_secs(86_400),
            ..cfg.room.clone()
        },
        ..cfg
    });
    assert_eq!(slow.refunded, 0);
    let without = claimed_rate(&slow);
    eprintln!("claimed {with}/s with refunds, {without}/s without");
    assert!(without < with * 0.9, "{without} vs {with}");
    assert!(slow.drain_seconds.unwrap() > r.drain_seconds.unwrap());
}

/// With max_active, active sessions plus places not yet claimed never
/// exceed the cap, and the throughput is the cap over the session length.
#[test]
fn max_active_caps_active_sessions() {
    let cfg = SimConfig {
        visitors: 5_000,
        arrivals: Arrivals::Spike,
        session_seconds: 10.0,
        revoke_at_end: true,
        room: RoomSettings {
            rate_per_sec: 200.0,
            burst: 200.0,
            max_active: Some(500),
            ..Default::default()
        },
        ..Default::default()
    };
    let r = sim(&cfg);
    assert!(r.completed);
    assert_eq!(r.admitted, 5_000);
    for s in &r.series {
        assert!(s.active_sessions + s.pending_claims <= 500, "{s:?}");
    }
    assert!(r.series.iter().any(|s| s.active_sessions >= 400));
    // ≈ 500 / 10 s = 50 visitors/s, not 200/s
    let drain = r.drain_seconds.unwrap();
    assert!(drain > 80.0 && drain < 120.0, "drain {drain}");
}

#[test]
fn ramp_below_the_rate_is_all_passthrough() {
    let r = sim(&SimConfig {
        visitors: 1_000,
        arrivals: Arrivals::Ramp { seconds: 100.0 },
        room: RoomSettings {
            rate_per_sec: 50.0,
            burst: 10.0,
            ..Default::default()
        },
        ..Default::default()
    });
    assert_eq!(r.passthrough, 1_000);
    assert_eq!(r.wait_seconds.max, 0.0);
    assert!(r.peak_queue_length <= 1);
}

#[test]
fn initial_line_from_a_live_room() {
    let r = sim(&SimConfig {
        visitors: 0,
        initial_queue: 3_000,
        room: RoomSettings {
            rate_per_sec: 50.0,
            burst: 50.0,
            ..Default::default()
        },
        ..Default::default()
    });
    assert_eq!(r.passthrough, 0);
    let drain = r.drain_seconds.unwrap();
    assert!((drain - 60.0).abs() <= 1.0, "drain {drain}");
    // nobody in line
    let r = sim(&SimConfig {
        visitors: 0,
        ..Default::default()
    });
    assert_eq!(r.drain_seconds, Some(0.0));
    assert!(r.completed);
}

/// A live room's sessions and pending claims hold slots under the cap: a
/// what-if that left them out would be optimistic.
#[test]
fn live_sessions_and_pending_claims_hold_slots() {
    // cap 100, 10 s visits ended by revoke: at most 10/s get through
    let base = SimConfig {
        visitors: 0,
        initial_queue: 1_000,
        room: RoomSettings {
            rate_per_sec: 50.0,
            burst: 50.0,
            max_active: Some(100),
            ..Default::default()
        },
        session_seconds: 10.0,
        revoke_at_end: true,
        ..Default::default()
    };
    let empty = sim(&base);
    let d0 = empty.drain_seconds.unwrap();
    assert!((85.0..=115.0).contains(&d0), "drain {d0}");

    // the cap already full of sessions: nobody in for their 10 s
    let busy = sim(&SimConfig {
        initial_active: 100,
        ..base.clone()
    });
    let d1 = busy.drain_seconds.unwrap();
    assert!(d1 >= d0 + 8.0, "drain {d1} with a full cap vs {d0}");
    assert_eq!(busy.visitors, 1_000, "carried sessions are not visitors");
    assert_eq!(busy.admitted, 1_000);
    assert_eq!(busy.series[0].admitted_per_sec, 0, "{:?}", busy.series[0]);
    // their origin load is there from the start
    assert!(busy.series[0].origin_rps >= 99.0, "{:?}", busy.series[0]);

    // the cap full of admitted places not yet claimed: they claim, stay
    // 10 s, and only then make room
    let pending = sim(&SimConfig {
        initial_pending: 100,
        ..base.clone()
    });
    let d2 = pending.drain_seconds.unwrap();
    assert!(d2 >= d0 + 8.0, "drain {d2} with a full cap vs {d0}");
    assert_eq!(pending.admitted, 1_000, "carried places are not counted");
    assert_eq!(pending.series[0].admitted_per_sec, 0);

    // without a cap they change nothing in the line
    let uncapped = RoomSettings {
        max_active: None,
        ..base.room.clone()
    };
    let free = sim(&SimConfig {
        room: uncapped.clone(),
        ..base.clone()
    });
    let free_busy = sim(&SimConfig {
        room: uncapped,
        initial_active: 100,
        initial_pending: 100,
        ..base
    });
    assert_eq!(free.drain_seconds, free_busy.drain_seconds);
}

#[test]
fn invalid_configs_are_refused() {
    for cfg in [
        SimConfig {
            tick_ms: 300,
            ..Default::default()
        },
        SimConfig {
            session_seconds: 0.0,
            ..Default::default()
        },
        SimConfig {
            solve: Dist::LogNormal {
                median: 3.0,
                p95: 1.0,
            },
            ..Default::default()
        },
        SimConfig {
            arrivals: Arrivals::Poisson { per_sec: 0.0 },
            ..Default::default()
        },
    ] {
        assert!(run(&cfg, |_| {}).is_err(), "{cfg:?}");
    }
}

/// Without a cap the simulator counts sessions itself; the count is the
/// store's (a cap too large to bite makes it use the store).
#[test]
fn session_count_matches_the_store() {
    for revoke in [false, true] {
        let cfg = SimConfig {
            visitors: 3_000,
            arrivals: Arrivals::Poisson { per_sec: 40.0 },
            session_seconds: 7.5,
            revoke_at_end: revoke,
            room: RoomSettings {
                rate_per_sec: 30.0,
                session_ttl: Duration::from_secs(20),
                ..Default::default()
            },
            ..Default::default()
        };
        let own = sim(&cfg);
        let store = sim(&SimConfig {
            room: RoomSettings {
                max_active: Some(1_000_000),
                ..cfg.room.clone()
            },
            ..cfg
        });
        assert_eq!(own.series.len(), store.series.len());
        for (a, b) in own.series.iter().zip(&store.series) {
            assert_eq!(
                a.active_sessions, b.active_sessions,
                "revoke {revoke}: {a:?} {b:?}"
            );
        }
        assert!(own.series.iter().any(|s| s.active_sessions > 100));
    }
}

/// The fairness measure: a spike has no arrival order (undefined); a ramp
/// with a fixed solve time keeps arrival order exactly (tau 1); solve times
/// that vary let fast devices overtake slow ones (tau below 1, still
/// clearly positive).
#[test]
fn kendall_tau_of_arrival_and_admission() {
    assert_eq!(sim(&seed003()).kendall_tau, None);
    let ramp = SimConfig {
        visitors: 5_000,
        arrivals: Arrivals::Ramp { seconds: 20.0 },
        solve: Dist::from_median_p95(1.0, None),
        room: RoomSettings {
            rate_per_sec: 100.0,
            burst: 10.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let r = sim(&ramp);
    assert_eq!(r.admitted, 5_000);
    assert_eq!(r.kendall_tau, Some(1.0));
    let varied = sim(&SimConfig {
        solve: Dist::from_median_p95(2.0, Some(8.0)),
        ..ramp
    });
    let t = varied.kendall_tau.unwrap();
    assert!(t > 0.3 && t < 0.999, "tau {t}");
}
