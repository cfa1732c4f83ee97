//! The conformance suite against the in-memory store (virtual time).

#![allow(clippy::unwrap_used)]

use proptest::test_runner::{Config, TestRunner};
use sluice_reservation::conformance::{self, Harness, model};

async fn harness() -> Option<Harness> {
    Some(Harness::memory())
}

sluice_reservation::conformance_tests!(harness());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_10k_attempts_100_tickets_20_times() {
    let h = Harness::memory();
    for _ in 0..20 {
        let r = conformance::race(&h, 100, 10_000, 2_000).await;
        assert_eq!(r.held_units, 100);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_race_with_three_reapers() {
    let h = Harness::memory();
    for _ in 0..5 {
        conformance::expiry_race(&h, 200).await;
    }
}

#[test]
fn model_based_property() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&model::memory_case(), |(spec, ops)| {
            let h = Harness::memory();
            rt.block_on(model::run_case(&h, &spec, &ops))
                .map_err(proptest::test_runner::TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn restore_property() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h = Harness::memory();
    let mut runner = TestRunner::new(Config {
        cases: 500,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&conformance::loss::record_case(), |case| {
            rt.block_on(conformance::loss::restore_property_case(&h, &case))
                .map_err(proptest::test_runner::TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn categories_property() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h = Harness::memory();
    let mut runner = TestRunner::new(Config {
        cases: 1_000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&conformance::categories::cat_case(40), |(case, ops)| {
            rt.block_on(conformance::categories::run_cat_case(&h, &case, &ops))
                .map_err(proptest::test_runner::TestCaseError::fail)
        })
        .unwrap();
}
