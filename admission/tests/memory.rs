//! The conformance suite and property tests on the memory store, in
//! virtual time.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluice_admission::conformance::Harness;
use sluice_admission::{Clock, ManualClock, MemoryQueueStore, QueueStore, RoomSettings};

struct MemHarness {
    clock: ManualClock,
    store: MemoryQueueStore,
}

impl Harness for MemHarness {
    type Store = MemoryQueueStore;
    fn store(&self) -> MemoryQueueStore {
        self.store.clone()
    }
    async fn elapse(&self, d: Duration) {
        self.clock.advance(d);
    }
    fn real_time(&self) -> bool {
        false
    }
    async fn lose_state(&mut self) {
        // a new, empty store on the same clock
        self.clock.advance_ms(1);
        let fresh = MemoryQueueStore::new(Arc::new(self.clock.clone()));
        self.store = fresh;
    }
}

async fn harness() -> Option<MemHarness> {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = MemoryQueueStore::new(Arc::new(clock.clone()));
    Some(MemHarness { clock, store })
}

sluice_admission::conformance_tests!(harness());

#[derive(Clone, Debug)]
enum Op {
    Elapse(u64),
    Join,
    Advance,
    Claim(u64),
    Start(u8),
    End(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..700).prop_map(Op::Elapse),
        4 => Just(Op::Join),
        2 => Just(Op::Advance),
        2 => (0u64..200).prop_map(Op::Claim),
        1 => (0u8..8).prop_map(Op::Start),
        1 => (0u8..8).prop_map(Op::End),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Random runs in virtual time: seqs unique and increasing, the
    /// frontier never moves back nor passes the tail, and admissions over
    /// any window stay within rate × window + burst + refunds (+1).
    #[test]
    fn memory_store_invariants(
        rate in 0.5f64..100.0,
        burst in 1.0f64..20.0,
        max_active in proptest::option::of(1u64..10),
        claim_ms in 1_000u64..5_000,
        ops in proptest::collection::vec(op(), 1..250),
    ) {
        let clock = ManualClock::new(0);
        let store = MemoryQueueStore::new(Arc::new(clock.clone()));
        let s = RoomSettings {
            rate_per_sec: rate,
            burst,
            max_active,
            claim_window: Duration::from_millis(claim_ms),
            ..Default::default()
        };
        let room = "p";
        futures_lite_block_on(store.configure(room, &s)).unwrap();
        let mut last_seq = 0;
        // (time of the last credit sync, admitted total, refunded total)
        // after each op: credit is ≤ burst right after a sync (join or
        // advance), so windows are measured from there
        let mut hist: Vec<(u64, u64, u64)> = vec![(0, 0, 0)];
        let mut frontier = 0;
        let mut sync_ms = 0;
        for op in ops {
            if matches!(op, Op::Join | Op::Advance) {
                sync_ms = clock.now_ms();
            }
            match op {
                Op::Elapse(ms) => clock.advance_ms(ms),
                Op::Join => {
                    let j = store.join_now(room).unwrap();
                    prop_assert!(j.seq > last_seq);
                    last_seq = j.seq;
                }
                Op::Advance => { store.advance_now(room).unwrap(); }
                Op::Claim(seq) => { futures_lite_block_on(store.claim(room, seq)).unwrap(); }
                Op::Start(i) => {
                    futures_lite_block_on(store.session_start(room, &format!("s{i}"), Duration::from_secs(3))).unwrap();
                }
                Op::End(i) => { futures_lite_block_on(store.session_end(room, &format!("s{i}"))).unwrap(); }
            }
            let snap = futures_lite_block_on(store.snapshot(room)).unwrap();
            prop_assert!(snap.frontier >= frontier);
            prop_assert!(snap.frontier <= snap.tail);
            frontier = snap.frontier;
            hist.push((sync_ms, snap.admitted_total, snap.refunded_total));
        }
        for i in 0..hist.len() {
            for j in i + 1..hist.len() {
                let (t0, a0, r0) = hist[i];
                let (t1, a1, r1) = hist[j];
                let bound = rate * (t1 - t0) as f64 / 1000.0 + burst + (r1 - r0) as f64 + 1.0;
                prop_assert!(((a1 - a0) as f64) <= bound, "{} admitted in {} ms", a1 - a0, t1 - t0);
            }
        }
    }
}

/// The memory store's futures are ready at once: poll them without a runtime.
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("memory store future was pending"),
    }
}
