//! The difficulty policy in virtual time: a flood from one prefix raises
//! that prefix within seconds while everyone else stays at the floor; after
//! the flood the level comes back down, slowly.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use sluice_pow::{DifficultyConfig, DifficultyPolicy, NetPrefix, network_prefix};

const T0: u64 = 1_800_000_000_000;
const FLOOR: u8 = 14;

fn policy() -> DifficultyPolicy {
    DifficultyPolicy::new(DifficultyConfig {
        floor_bits: FLOOR,
        default_bits: FLOOR,
        ..DifficultyConfig::default()
    })
    .unwrap()
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> NetPrefix {
    network_prefix(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
}

/// 500 ordinary prefixes, each asking one challenge every 10 s, staggered.
fn background(p: &DifficultyPolicy, from_ms: u64, to_ms: u64) {
    let mut t = from_ms;
    let mut i: u32 = 0;
    while t < to_ms {
        let n = i % 500;
        p.observe_challenge(v4(10, (n / 250) as u8, (n % 250) as u8, 7), t);
        i += 1;
        t += 20; // 50/s in total = 500 prefixes × 0.1/s
    }
}

#[test]
fn flood_from_one_prefix_raises_it_alone_then_decays_slowly() {
    let p = policy();
    let attacker = v4(203, 0, 113, 66);
    let bystanders: Vec<NetPrefix> = (0..100u8).map(|n| v4(10, 0, n, 7)).collect();
    // A quiet minute first.
    background(&p, T0, T0 + 60_000);
    assert_eq!(p.level_for(attacker, T0 + 60_000).difficulty_bits, FLOOR);

    // Flood: 200 challenges/s from one /24 (any host in it), for 20 s.
    let start = T0 + 60_000;
    let mut first_raise = None;
    let mut t = start;
    let mut host: u8 = 0;
    while t < start + 20_000 {
        let l = p.observe_and_level(v4(203, 0, 113, host), t);
        host = host.wrapping_add(1);
        if first_raise.is_none() && l.difficulty_bits > FLOOR {
            first_raise = Some(t - start);
        }
        if t - start == 5_000 {
            assert!(l.difficulty_bits >= FLOOR + 3, "5 s into the flood: {l:?}");
        }
        if t.is_multiple_of(1000) {
            background(&p, t, t + 1000);
            for b in &bystanders {
                let lb = p.level_for(*b, t);
                assert_eq!(
                    lb.difficulty_bits,
                    FLOOR,
                    "bystander {b} raised at +{} ms",
                    t - start
                );
                assert!(!lb.under_attack);
            }
        }
        t += 5;
    }
    let raised_after = first_raise.unwrap();
    assert!(raised_after <= 1_000, "raised after {raised_after} ms");
    let peak = p.level_for(attacker, start + 20_000);
    assert!(peak.difficulty_bits >= FLOOR + 4, "{peak:?}");
    assert!(peak.difficulty_bits <= p.config().ceiling_bits);
    // The global level never moved: only the flooding prefix pays.
    assert_eq!(p.current_level().difficulty_bits, FLOOR);

    // After the flood: not immediate...
    let end = start + 20_000;
    let one_s = p.level_for(attacker, end + 1_000);
    assert!(
        one_s.difficulty_bits >= peak.difficulty_bits - 1,
        "{one_s:?} vs {peak:?}"
    );
    assert!(
        p.level_for(attacker, end + 20_000).difficulty_bits > FLOOR,
        "still raised 20 s later"
    );
    // ...monotone on the way down, and it does come back.
    let mut prev = peak.difficulty_bits;
    let mut back_at = None;
    for s in 1..=300u64 {
        let l = p.level_for(attacker, end + s * 1000);
        assert!(l.difficulty_bits <= prev);
        prev = l.difficulty_bits;
        if back_at.is_none() && l.difficulty_bits == FLOOR {
            back_at = Some(s);
        }
    }
    let back_at = back_at.expect("back to the floor within 5 minutes");
    assert!(
        (30..=120).contains(&back_at),
        "back at the floor after {back_at} s"
    );
}

#[test]
fn an_ipv6_flood_is_counted_by_its_56() {
    let p = policy();
    let mut t = T0;
    for n in 0..400u32 {
        // Different /64s inside one /56.
        let ip: IpAddr = format!("2001:db8:0:{:x}::{:x}", n % 256, n)
            .parse()
            .unwrap();
        p.observe_challenge(network_prefix(ip), t);
        t += 5;
    }
    let inside: IpAddr = "2001:db8:0:ff::1".parse().unwrap();
    let outside: IpAddr = "2001:db8:0:100::1".parse().unwrap();
    assert!(p.level_for(network_prefix(inside), t).difficulty_bits > FLOOR);
    assert_eq!(
        p.level_for(network_prefix(outside), t).difficulty_bits,
        FLOOR
    );
}

#[test]
fn past_the_ceiling_adds_a_min_solve_age_not_work() {
    let p = policy();
    let a = v4(198, 51, 100, 1);
    for i in 0..20_000u64 {
        p.observe_challenge(a, T0 + i);
    }
    let l = p.level_for(a, T0 + 20_000);
    assert_eq!(l.difficulty_bits, 20);
    assert!(l.under_attack);
    assert_eq!(l.min_solve, Duration::from_secs(3));
    assert!(l.expected_hashes() <= 1 << 24);
    let spec = l.spec("drop", Duration::from_secs(300));
    assert_eq!(spec.min_solve, Duration::from_secs(3));
}

#[test]
fn global_pressure_raises_everyone_quickly_and_lowers_slowly() {
    let p = policy();
    let someone = v4(192, 0, 2, 1);
    let mut now = T0;
    // Join storm: 10,000 joins/s against 500 admissions/s, ticks of 1 s.
    let mut secs_to_ceiling = None;
    for s in 1..=20u64 {
        now += 1000;
        p.set_pressure(10_000.0, 500.0, now);
        if secs_to_ceiling.is_none() && p.current_level().difficulty_bits == 20 {
            secs_to_ceiling = Some(s);
        }
    }
    assert!(secs_to_ceiling.unwrap() <= 6);
    assert!(p.current_level().under_attack);
    assert!(p.level_for(someone, now).under_attack);
    // Storm over.
    let calm_from = now;
    let mut back = None;
    for s in 1..=600u64 {
        now += 1000;
        p.set_pressure(100.0, 500.0, now);
        if s == 10 {
            assert!(p.current_level().under_attack, "not lowered within 10 s");
        }
        if back.is_none() && p.current_level().difficulty_bits == FLOOR {
            back = Some((now - calm_from) / 1000);
        }
    }
    let back = back.unwrap();
    assert!(back >= 180, "came down in {back} s: too fast");
}
