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

// === priority lanes ===

fn lanes_room(mode: sluice_admission::lanes::LaneMode) -> RoomSettings {
    use sluice_admission::lanes::Lane;
    RoomSettings {
        rate_per_sec: 100.0,
        burst: 10.0,
        lanes: vec![
            Lane {
                id: "presale".into(),
                weight: 70,
            },
            Lane {
                id: "public".into(),
                weight: 30,
            },
        ],
        lane_mode: mode,
        ..Default::default()
    }
}

/// 6,000 visitors over ten seconds (no two arriving in the same ms: tau-b
/// counts ties), half in each lane, at 100/s. Weighted
/// 70/30, presale's 3,000 are through at 70/s (≈ 43 s); public had 30/s
/// meanwhile and then the whole rate, so the room drains at 60 s as
/// without lanes (the unused share flows on). Strict: presale first, at
/// the whole rate (30 s). Within each lane arrival order is kept (tau 1:
/// fixed solve time), while the room-wide order is not (the lanes
/// overtake on purpose).
#[test]
fn lanes_share_the_rate_by_weight_and_keep_fifo_within_each() {
    use sluice_admission::lanes::LaneMode;
    let cfg = |mode| SimConfig {
        visitors: 6_000,
        arrivals: Arrivals::Ramp { seconds: 10.0 },
        solve: Dist::Fixed(0.5),
        room: lanes_room(mode),
        lane_mix: vec![0.5, 0.5],
        ..Default::default()
    };
    let r = sim(&cfg(LaneMode::Weighted));
    assert_eq!(r.admitted, 6_000, "{r:?}");
    assert_eq!(r.lanes.len(), 2);
    let (pre, publ) = (&r.lanes[0], &r.lanes[1]);
    assert_eq!((pre.id.as_str(), pre.weight), ("presale", 70));
    assert_eq!(pre.visitors + publ.visitors, 6_000);
    // a fair coin over 6,000 draws: within 4 sigma of half
    assert!(pre.visitors.abs_diff(3_000) < 160, "{pre:?}");
    assert_eq!(pre.admitted, pre.visitors);
    assert_eq!(publ.admitted, publ.visitors);
    let pre_drain = pre.drain_seconds.unwrap();
    let expect = pre.visitors as f64 / 70.0;
    assert!(
        (pre_drain - expect).abs() < 2.5,
        "presale drained at {pre_drain}, expected ≈ {expect}"
    );
    let publ_drain = publ.drain_seconds.unwrap();
    assert!(
        (publ_drain - 60.0).abs() < 2.5,
        "public drained at {publ_drain}"
    );
    assert!((r.drain_seconds.unwrap() - publ_drain).abs() < 0.2, "{r:?}");
    assert_eq!(pre.kendall_tau, Some(1.0));
    assert_eq!(publ.kendall_tau, Some(1.0));
    let room_tau = r.kendall_tau.unwrap();
    assert!(
        room_tau < 0.99,
        "the lanes reorder the room: tau {room_tau}"
    );
    assert!(pre.wait_seconds.p95 < publ.wait_seconds.p95, "{r:?}");

    let s = sim(&cfg(LaneMode::Strict));
    let pre_drain = s.lanes[0].drain_seconds.unwrap();
    let expect = s.lanes[0].visitors as f64 / 100.0;
    assert!(
        (pre_drain - expect).abs() < 2.5,
        "strict: presale drained at {pre_drain}, expected ≈ {expect}"
    );
    assert!(
        (s.lanes[1].drain_seconds.unwrap() - 60.0).abs() < 2.5,
        "{s:?}"
    );
    assert_eq!(s.lanes[0].kendall_tau, Some(1.0));
    assert_eq!(s.lanes[1].kendall_tau, Some(1.0));
}

/// A room with one lane is the plain room: same admissions, drain, waits
/// and polls as without lanes (the simulator's lane path and the store's
/// lane bookkeeping change nothing when there is nothing to share).
#[test]
fn one_lane_is_the_plain_room() {
    use sluice_admission::lanes::Lane;
    let plain = SimConfig {
        visitors: 20_000,
        arrivals: Arrivals::Poisson { per_sec: 400.0 },
        solve: Dist::from_median_p95(1.0, Some(3.0)),
        patience: Some(Dist::from_median_p95(60.0, Some(200.0))),
        room: RoomSettings {
            rate_per_sec: 150.0,
            burst: 20.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut one = plain.clone();
    one.room.lanes = vec![Lane {
        id: "all".into(),
        weight: 1,
    }];
    let (a, b) = (sim(&plain), sim(&one));
    assert_eq!(a.admitted, b.admitted);
    assert_eq!(a.abandoned, b.abandoned);
    assert_eq!(a.passthrough, b.passthrough);
    assert_eq!(a.drain_seconds, b.drain_seconds);
    assert_eq!(a.wait_seconds, b.wait_seconds);
    assert_eq!(a.edge_polls_per_sec, b.edge_polls_per_sec);
    assert_eq!(b.lanes[0].admitted, b.admitted);
    assert_eq!(b.lanes[0].kendall_tau, a.kendall_tau);
    assert!(a.lanes.is_empty());
}

/// Lane settings the simulation refuses, each with a reason: a mix without
/// lanes, a mix of the wrong length or not adding up to 1, an initial line
/// per lane that does not add up.
#[test]
fn invalid_lane_configs_are_refused() {
    use sluice_admission::lanes::LaneMode;
    let ok = SimConfig {
        visitors: 10,
        room: lanes_room(LaneMode::Weighted),
        lane_mix: vec![0.2, 0.8],
        ..Default::default()
    };
    assert!(ok.validate().is_ok());
    let bad = [
        SimConfig {
            room: RoomSettings::default(),
            ..ok.clone()
        },
        SimConfig {
            lane_mix: vec![1.0],
            ..ok.clone()
        },
        SimConfig {
            lane_mix: vec![0.5, 0.6],
            ..ok.clone()
        },
        SimConfig {
            lane_mix: vec![-0.5, 1.5],
            ..ok.clone()
        },
        SimConfig {
            lane_mix: vec![f64::NAN, 1.0],
            ..ok.clone()
        },
        SimConfig {
            initial_queue: 5,
            initial_lanes: vec![1, 2],
            ..ok.clone()
        },
        SimConfig {
            initial_queue: 3,
            initial_lanes: vec![3],
            ..ok.clone()
        },
    ];
    for cfg in bad {
        let e = run(&cfg, |_| {}).unwrap_err().to_string();
        assert!(e.contains("lane"), "{e}");
    }
}

/// An initial line per lane (a live room's): each lane's line is drained
/// by its share, and the lanes' visitors are counted.
#[test]
fn initial_line_per_lane() {
    use sluice_admission::lanes::LaneMode;
    let r = sim(&SimConfig {
        visitors: 0,
        initial_queue: 1_000,
        initial_lanes: vec![700, 300],
        room: lanes_room(LaneMode::Weighted),
        ..Default::default()
    });
    assert_eq!(r.admitted, 1_000);
    assert_eq!(r.lanes[0].visitors, 700);
    assert_eq!(r.lanes[1].visitors, 300);
    // 70/30 of 100/s: both lanes drain together in ≈ 10 s
    for l in &r.lanes {
        let d = l.drain_seconds.unwrap();
        assert!((d - 10.0).abs() < 1.5, "{l:?}");
    }
}
