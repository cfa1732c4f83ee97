//! A buyer of a sharded event who loses every race for the units pulled
//! to its home: a thief hooked onto the store takes them the moment
//! they land, before the buyer's next hold there. However often it
//! loses, the router's answer is a hold, or "sold out" only when nothing
//! is left, or "try again" ([`crate::ReservationError::Contended`]); never "sold out"
//! while units are there (the CI run of a09a853 caught that after twelve
//! lost rounds). And a buyer whose last units are in flight to its home
//! past its patient rounds: it waits for them to land and holds them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::{Harness, spec};
use crate::observed::{Call, Observed, Observer};
use crate::sharded::{
    ROUTER_ROUNDS, ROUTER_ROUNDS_MAX, Sharded, TransferIn, TransferOut, home_shard,
};
use crate::{EventId, HoldOutcome, Inventory, Result};

/// A thief at one shard: after each transfer lands there, while `steals`
/// lasts, a visitor of that home holds the units that landed (the buyer's
/// rivals, always one step ahead).
#[derive(Clone)]
struct Thief {
    watched: EventId,
    home: u32,
    shards: u32,
    steals: Arc<AtomicU32>,
    stolen: Arc<AtomicU64>,
    names: Arc<AtomicU64>,
}

impl Thief {
    /// A fresh visitor whose home is the watched shard.
    fn rival(&self) -> String {
        rival_of(self.home, self.shards, &self.names)
    }
}

/// A fresh visitor (numbered from `names`) whose home is shard `home`.
fn rival_of(home: u32, shards: u32, names: &AtomicU64) -> String {
    loop {
        let n = names.fetch_add(1, Ordering::Relaxed);
        let v = format!("rival-{n}");
        if home_shard(&v, shards) == home {
            return v;
        }
    }
}

/// `ev`: 80 units over `shards`, cart limit 4, behind a router whose
/// calls `observer` hears.
async fn observed_event<O: Observer + Clone>(
    h: &Harness,
    ev: &EventId,
    shards: u32,
    observer: &O,
) -> Sharded<Observed<crate::InventoryBackend, O>> {
    let s = Sharded::new(Observed {
        inner: h.inv.clone(),
        observer: observer.clone(),
    });
    s.set_sharded_stock(ev, &spec(80, 4, Duration::from_secs(600), 1), shards)
        .await
        .unwrap();
    s
}

/// Rivals of shard `k` hold every unit left there, one each (names from
/// `names`); returns how many.
async fn empty_shard(h: &Harness, ev: &EventId, k: u32, shards: u32, names: &AtomicU64) -> u64 {
    let mut emptied = 0;
    loop {
        let rival = rival_of(k, shards, names);
        match h
            .inv
            .hold_in_layout(&ev.shard(k), &rival, 1, None, shards)
            .await
            .unwrap()
        {
            HoldOutcome::Held(_) => emptied += 1,
            HoldOutcome::SoldOut { available: 0 } => return emptied,
            other => panic!("emptying shard {k}: {other:?}"),
        }
    }
}

impl Observer for Thief {
    async fn landed<I: Inventory>(
        &self,
        inner: &I,
        to: &EventId,
        qty: u64,
        landed: &TransferIn,
    ) -> Result<()> {
        if matches!(landed, TransferIn::Applied { .. })
            && *to == self.watched
            && self
                .steals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            let rival = self.rival();
            let q = u32::try_from(qty).expect("a cart's units");
            match inner
                .hold_in_layout(to, &rival, q, None, self.shards)
                .await?
            {
                HoldOutcome::Held(_) => {
                    self.stolen.fetch_add(qty, Ordering::SeqCst);
                }
                other => panic!("the rival's hold of {qty} landed units: {other:?}"),
            }
        }
        Ok(())
    }
}

/// A buyer whose home is empty asks for 2 units of an event of 80 over 8
/// shards, and loses the units pulled home to a rival each time, for
/// `ROUTER_ROUNDS` + 8 steals (past where the router used to give up),
/// then for ever (until the rivals have bought everything). The first
/// sale ends in the buyer's hold; the second in "sold out" once the
/// rivals hold everything. Nothing is oversold or left in transit.
pub async fn sharded_a_buyer_who_always_loses(h: &Harness) {
    for steals in [ROUTER_ROUNDS + 8, u32::MAX] {
        let ev = h.event("loser");
        let shards = 8;
        let buyer = "the-unlucky-one";
        let home = home_shard(buyer, shards);
        let thief = Thief {
            watched: ev.shard(home),
            home,
            shards,
            steals: Arc::new(AtomicU32::new(0)),
            stolen: Arc::default(),
            names: Arc::default(),
        };
        let s = observed_event(h, &ev, shards, &thief).await;
        // Rivals of the same home empty it first.
        assert_eq!(empty_shard(h, &ev, home, shards, &thief.names).await, 10);
        thief.steals.store(steals, Ordering::SeqCst);
        let answer = match s.hold(&ev, buyer, 2, None).await {
            // "Try again": nothing held, nothing told falsely.
            Err(crate::ReservationError::Contended { .. }) => HoldOutcome::NotReady,
            answer => answer.unwrap(),
        };
        let st = s.read(&ev).await.unwrap().expect("the event");
        let stolen = thief.stolen.load(Ordering::SeqCst);
        let bought = if matches!(answer, HoldOutcome::Held(_)) {
            2
        } else {
            0
        };
        let sold = 10 + stolen + bought;
        assert!(st.invariant_holds, "{st:#?}");
        assert_eq!(
            (st.held, st.in_transit, st.available),
            (sold, 0, Some(80 - sold)),
            "{answer:?} after {stolen} units stolen: {st:#?}"
        );
        if steals == u32::MAX {
            // Rivals take all they can (2 units a round: 35 rounds, within
            // the router's 48); the buyer is told the truth once they have.
            assert!(
                matches!(answer, HoldOutcome::SoldOut { available: 0 }),
                "{answer:?} after {stolen} units stolen: {st:#?}"
            );
            assert_eq!((stolen, st.available), (70, Some(0)), "{st:#?}");
        } else {
            // The rivals stop after their steals: the buyer gets its cart.
            assert!(
                stolen >= 2 * u64::from(ROUTER_ROUNDS),
                "each of the first rounds lost its units: {stolen} stolen"
            );
            const { assert!(ROUTER_ROUNDS + 8 < ROUTER_ROUNDS_MAX) };
            assert!(
                matches!(answer, HoldOutcome::Held(ref v) if v.qty == 2),
                "{answer:?} after {stolen} units stolen: {st:#?}"
            );
        }
    }
}

/// Counts the router's holds and wakes `lander` at the `at`-th.
#[derive(Clone)]
struct Patience {
    holds: Arc<AtomicU32>,
    at: u32,
    lander: Arc<tokio::sync::Notify>,
}

impl Observer for Patience {
    fn before(&self, call: Call) {
        if call == Call::Hold && self.holds.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            self.lander.notify_one();
        }
    }
}

/// The last 2 units of an event of 80 over 8 shards are in flight to a
/// buyer's home (moved out of a neighbour, not landed yet: a live buyer's
/// pull its task has not finished), every other unit held by rivals. The
/// buyer asks for 2; the transfer lands only once the buyer is past its
/// `ROUTER_ROUNDS` patient rounds. It holds its cart: never "sold out"
/// (the units were never sold), and not "try again" either, which the
/// router answered on its 13th round before it waited for transits (the
/// CI run of 9d91b21 caught that in `sharded_last_units_race`).
pub async fn sharded_a_transfer_in_flight_lands_for_a_buyer_past_its_patience(h: &Harness) {
    let ev = h.event("inflight");
    let shards = 8;
    let buyer = "the-patient-one";
    let home = home_shard(buyer, shards);
    let (at_home, from) = (ev.shard(home), ev.shard((home + 1) % shards));
    let patience = Patience {
        holds: Arc::default(),
        at: ROUTER_ROUNDS + 2,
        lander: Arc::default(),
    };
    let s = observed_event(h, &ev, shards, &patience).await;
    assert!(matches!(
        h.inv
            .transfer_out(&from, &at_home, "in-flight", 2)
            .await
            .unwrap(),
        TransferOut::Moved { qty: 2, .. }
    ));
    // Rivals of each home hold every unit left there.
    let names = AtomicU64::new(0);
    for k in 0..shards {
        empty_shard(h, &ev, k, shards, &names).await;
    }
    let st = s.read(&ev).await.unwrap().expect("the event");
    assert_eq!((st.held, st.in_transit, st.available), (78, 2, Some(0)));
    let lander = {
        let (inv, wake) = (h.inv.clone(), patience.lander.clone());
        let (from, to) = (from.clone(), at_home.clone());
        tokio::spawn(async move {
            wake.notified().await;
            inv.transfer_in(&to, &from, "in-flight", 2).await.unwrap();
            inv.transfer_done(&from, "in-flight").await.unwrap();
        })
    };
    let answer = s.hold(&ev, buyer, 2, None).await;
    let holds = patience.holds.load(Ordering::SeqCst);
    // The mover finishes (its transfer landed and done) before the counts
    // are read; woken here too if the buyer gave up before waking it.
    patience.lander.notify_one();
    lander.await.unwrap();
    assert!(
        matches!(answer, Ok(HoldOutcome::Held(ref v)) if v.qty == 2),
        "{answer:?} after {holds} holds at home"
    );
    assert!(holds >= ROUTER_ROUNDS + 2, "{holds} holds at home");
    let st = s.read(&ev).await.unwrap().expect("the event");
    assert!(st.invariant_holds, "{st:#?}");
    assert_eq!(
        (st.held, st.in_transit, st.available),
        (80, 0, Some(0)),
        "{st:#?}"
    );
}
