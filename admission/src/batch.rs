//! Joins sent together: [`QueueStore::join_once`] calls that arrive while
//! a batcher's steps are on their way to the store (at most
//! [`MAX_IN_FLIGHT`]) go to it as one [`QueueStore::join_once_many`] once
//! one is back (group commit, [`sluice_redis::batch`]).
//!
//! Nothing waits for a batch to fill: a join that finds fewer steps on
//! their way is sent at once; only joins that would have queued behind
//! others on the store anyway are gathered. At the opening of a sale, when
//! joins come thousands a second, the store reads and writes the room's
//! state once per batch instead of once per join (README, "Joins sent
//! together"). What a batch must keep (each join exactly as its own call
//! would make it) is the store's `join_once_many`.
//!
//! When the store does not answer a step (unreachable, timed out), the
//! joins that waited for it fail with it at once, their solutions unspent:
//! they would otherwise wait a second timeout for their own step, and a
//! slow store must never hold a join past one (SECURITY.md, "a slow store
//! never piles requests up").
//!
//! A batch is sent by a task of its own, so a join whose request is
//! dropped (its client went away) never leaves the others without a
//! sender; its answer is dropped, its place kept, as when the request of a
//! join sent alone is dropped after the store took it.

use std::sync::Arc;
use std::time::Duration;

pub use sluice_redis::batch::BatchStats;
use sluice_redis::batch::{Batcher, Step, StepError};

use crate::error::AdmissionError;
use crate::store::{JoinOnce, QueueStore, Result, Solution};

/// The most joins one store step carries.
pub const MAX_BATCH: usize = sluice_redis::batch::MAX_BATCH;
/// The most steps of one batcher on their way at once: a join that finds
/// fewer goes at once, so under load a join waits for at most one step
/// before its own rather than for a whole round trip of the store (the
/// opening surge's joins waited twice as long with one: README, "Joins
/// sent together").
pub const MAX_IN_FLIGHT: usize = 2;
/// The most joins waiting for the steps on their way; more are sent alone, as
/// before batching (a slow store must not make an unbounded list).
pub const MAX_WAITING: usize = sluice_redis::batch::MAX_WAITING;

/// One room's joins, gathered while a step is on its way.
pub struct JoinBatcher {
    batcher: Arc<Batcher<OwnedSolution, JoinOnce, AdmissionError>>,
    stats: Arc<BatchStats>,
}

impl Default for JoinBatcher {
    fn default() -> Self {
        JoinBatcher::new(Arc::default())
    }
}

/// A join waiting for the next step: its solution, owned.
struct OwnedSolution {
    id: [u8; 16],
    ttl: Duration,
    sub: String,
    spent: bool,
    lane: Option<u8>,
}

impl OwnedSolution {
    fn solution(&self) -> Solution<'_> {
        Solution {
            id: &self.id,
            ttl: self.ttl,
            sub: &self.sub,
            spent: self.spent,
            lane: self.lane,
        }
    }
}

/// How a room's batched joins reach its store.
struct JoinStep<S> {
    store: S,
    room: String,
}

impl<S> Step<OwnedSolution, JoinOnce, AdmissionError> for JoinStep<S>
where
    S: QueueStore + Send + Sync + 'static,
{
    async fn one(&self, item: &OwnedSolution) -> Result<JoinOnce> {
        self.store.join_once(&self.room, item.solution()).await
    }

    async fn many(&self, items: &[&OwnedSolution]) -> Result<Vec<Result<JoinOnce>>> {
        let solutions: Vec<Solution<'_>> = items.iter().map(|s| s.solution()).collect();
        self.store.join_once_many(&self.room, &solutions).await
    }
}

impl JoinBatcher {
    /// A batcher counting what it sends in `stats`.
    pub fn new(stats: Arc<BatchStats>) -> Self {
        JoinBatcher {
            batcher: Arc::new(Batcher::new(stats.clone(), MAX_IN_FLIGHT)),
            stats,
        }
    }

    /// What this batcher sent (shared with those given the same stats).
    pub fn stats(&self) -> &Arc<BatchStats> {
        &self.stats
    }

    /// Whether no step is on its way and no join waits.
    pub fn idle(&self) -> bool {
        self.batcher.idle()
    }

    /// [`QueueStore::join_once`] of `solution` at `room`, sent with the
    /// joins that arrive while the store is busy with others of this
    /// batcher.
    pub async fn join_once<S>(
        self: &Arc<Self>,
        store: &S,
        room: &str,
        solution: Solution<'_>,
    ) -> Result<JoinOnce>
    where
        S: QueueStore + Clone + Send + Sync + 'static,
    {
        let item = OwnedSolution {
            id: *solution.id,
            ttl: solution.ttl,
            sub: solution.sub.to_owned(),
            spent: solution.spent,
            lane: solution.lane,
        };
        self.batcher
            .submit(item, || JoinStep {
                store: store.clone(),
                room: room.to_owned(),
            })
            .await
    }
}

impl StepError for AdmissionError {
    /// The store did not answer (unreachable, timed out): the joins
    /// waiting for the next step would fare no better.
    fn unreachable(&self) -> bool {
        matches!(
            self,
            AdmissionError::Store(_) | AdmissionError::StoreTimeout(_)
        )
    }

    fn duplicate(&self) -> Self {
        use AdmissionError as E;
        match self {
            E::Store(s) => E::Store(s.clone()),
            E::StoreTimeout(d) => E::StoreTimeout(*d),
            E::Protocol(s) => E::Protocol(s.clone()),
            E::RoomNotFound(r) => E::RoomNotFound(r.clone()),
            E::Closed(r) => E::Closed(r.clone()),
            E::Full(r) => E::Full(r.clone()),
            E::LaneNotFound(r) => E::LaneNotFound(r.clone()),
            E::InvalidRoomId(r) => E::InvalidRoomId(r.clone()),
            E::NotReplicated { wanted, acked } => E::NotReplicated {
                wanted: *wanted,
                acked: *acked,
            },
            other => E::Store(other.to_string()),
        }
    }

    fn dropped() -> Self {
        AdmissionError::Store("the join's store step was dropped (the gateway is stopping)".into())
    }

    fn miscounted(sent: usize, answered: usize) -> Self {
        AdmissionError::Protocol(format!("a step of {sent} joins answered {answered}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::MemoryQueueStore;
    use crate::settings::RoomSettings;
    use std::collections::HashSet;

    fn solution<'a>(id: &'a [u8; 16], sub: &'a str) -> Solution<'a> {
        Solution {
            id,
            ttl: Duration::from_secs(60),
            sub,
            spent: false,
            lane: None,
        }
    }

    async fn room(store: &MemoryQueueStore, room: &str) {
        let s = RoomSettings {
            rate_per_sec: 0.0,
            burst: 1.0,
            ..Default::default()
        };
        store.configure(room, &s).await.unwrap();
    }

    /// Many joins at once through one batcher, each solution sent by three
    /// callers: every solution buys one place, its other callers get that
    /// place's note, and no place is handed out twice; some steps carried
    /// more than one join.
    #[tokio::test(flavor = "current_thread")]
    async fn joins_at_once_each_get_their_own_place() {
        let store = MemoryQueueStore::new(Arc::new(crate::SystemClock));
        room(&store, "r").await;
        let batcher = Arc::new(JoinBatcher::default());
        let mut tasks = Vec::new();
        for i in 0..200u8 {
            for caller in 0..3 {
                let (b, st) = (batcher.clone(), store.clone());
                tasks.push(tokio::spawn(async move {
                    let id = [i; 16];
                    let sub = format!("v-{i}-{caller}");
                    (i, b.join_once(&st, "r", solution(&id, &sub)).await.unwrap())
                }));
            }
        }
        let mut seqs = HashSet::new();
        let mut bought = std::collections::HashMap::new();
        let mut replays = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (i, JoinOnce::Joined(j)) => {
                    assert!(seqs.insert(j.seq), "seq {} twice", j.seq);
                    assert!(
                        bought.insert(i, j.seq).is_none(),
                        "solution {i} bought twice"
                    );
                }
                (i, JoinOnce::Replayed { note }) => replays.push((i, note)),
            }
        }
        assert_eq!(bought.len(), 200);
        assert_eq!(replays.len(), 400);
        for (i, note) in replays {
            let seq = bought[&i];
            match note {
                None => assert_eq!(seq, 1, "only the place admitted at once has no note"),
                Some(n) => assert!(n.starts_with(&format!("{seq}:")), "{n} for seq {seq}"),
            }
        }
        let snap = store.snapshot("r").await.unwrap();
        assert_eq!((snap.tail, snap.joins_total), (200, 200));
        assert!(batcher.idle(), "idle once all are answered");
        let stats = batcher.stats();
        assert_eq!(stats.items(), 600);
        assert!(stats.steps() < 100, "{} steps for 600 joins", stats.steps());
    }

    /// A join whose caller went away still takes its place, and those
    /// sent with it are answered.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_join_leaves_no_one_unanswered() {
        let store = MemoryQueueStore::new(Arc::new(crate::SystemClock));
        room(&store, "r").await;
        let batcher = Arc::new(JoinBatcher::default());
        let mut kept = Vec::new();
        for i in 0..20u8 {
            let (b, st) = (batcher.clone(), store.clone());
            let t = tokio::spawn(async move {
                let id = [i; 16];
                b.join_once(&st, "r", solution(&id, "v")).await
            });
            if i % 2 == 0 {
                t.abort();
            } else {
                kept.push(t);
            }
        }
        for t in kept {
            assert!(matches!(t.await.unwrap(), Ok(JoinOnce::Joined(_))));
        }
        // later joins find the batcher working
        let id = [99u8; 16];
        assert!(matches!(
            batcher.join_once(&store, "r", solution(&id, "v")).await,
            Ok(JoinOnce::Joined(_))
        ));
    }

    /// A step that fails fails each join it carried, with the store's
    /// error; the batcher goes on.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_step_fails_each_of_its_joins() {
        let store = MemoryQueueStore::new(Arc::new(crate::SystemClock));
        let batcher = Arc::new(JoinBatcher::default());
        let mut tasks = Vec::new();
        for i in 0..10u8 {
            let (b, st) = (batcher.clone(), store.clone());
            tasks.push(tokio::spawn(async move {
                let id = [i; 16];
                b.join_once(&st, "none", solution(&id, "v")).await
            }));
        }
        for t in tasks {
            assert!(matches!(
                t.await.unwrap(),
                Err(AdmissionError::RoomNotFound(_))
            ));
        }
        room(&store, "none").await;
        let id = [1u8; 16];
        assert!(matches!(
            batcher.join_once(&store, "none", solution(&id, "v")).await,
            Ok(JoinOnce::Joined(_))
        ));
    }
}
