//! Joins sent together: [`QueueStore::join_once`] calls that arrive while
//! a batcher's steps are on their way to the store (at most
//! [`MAX_IN_FLIGHT`]) go to it as one [`QueueStore::join_once_many`] once
//! one is back (group commit).
//!
//! Nothing waits for a batch to fill: a join that finds fewer steps on
//! their way is sent at once; only joins that would have queued behind
//! others on the store anyway are gathered. At the opening of a sale, when
//! joins come thousands a second, the store reads and writes the room's
//! state once per batch instead of once per join (README, "Joins sent
//! together"). Our own rather than a crate's: the batching is one lock,
//! a list and a task, and what it must keep (each join exactly as its own
//! call would make it) is the store's `join_once_many`.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::AdmissionError;
use crate::store::{JoinOnce, QueueStore, Result, Solution};

/// The most joins one store step carries.
pub const MAX_BATCH: usize = 32;
/// The most steps of one batcher on their way at once: a join that finds
/// fewer goes at once, so under load a join waits for at most one step
/// before its own rather than for a whole round trip of the store (the
/// opening surge's joins waited twice as long with one: README, "Joins
/// sent together").
pub const MAX_IN_FLIGHT: usize = 2;
/// The most joins waiting for the steps on their way; more are sent alone, as
/// before batching (a slow store must not make an unbounded list).
pub const MAX_WAITING: usize = 1024;

/// One room's joins, gathered while a step is on its way.
#[derive(Default)]
pub struct JoinBatcher {
    inner: Mutex<Inner>,
    stats: Arc<BatchStats>,
}

/// What batchers sent, counted across those sharing it (a room's, one per
/// thread): `steps` store steps, `joins` joins in them, so `joins / steps`
/// is the mean batch.
#[derive(Debug, Default)]
pub struct BatchStats {
    steps: AtomicU64,
    joins: AtomicU64,
}

impl BatchStats {
    /// Store steps sent so far.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// Joins those steps carried.
    pub fn joins(&self) -> u64 {
        self.joins.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Inner {
    /// Steps on their way (their tasks send those waiting).
    in_flight: usize,
    waiting: Vec<Waiting>,
}

/// A join waiting for the next step, and where its answer goes.
struct Waiting {
    id: [u8; 16],
    ttl: Duration,
    sub: String,
    spent: bool,
    lane: Option<u8>,
    answer: oneshot::Sender<Result<JoinOnce>>,
}

impl Waiting {
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

impl JoinBatcher {
    /// A batcher counting what it sends in `stats`.
    pub fn new(stats: Arc<BatchStats>) -> Self {
        JoinBatcher {
            inner: Mutex::default(),
            stats,
        }
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
        let (tx, rx) = oneshot::channel();
        let waiting = Waiting {
            id: *solution.id,
            ttl: solution.ttl,
            sub: solution.sub.to_owned(),
            spent: solution.spent,
            lane: solution.lane,
            answer: tx,
        };
        // the batch to send, when this join found the batcher idle
        let first = {
            let mut inner = self.inner.lock();
            if inner.waiting.len() >= MAX_WAITING {
                None
            } else {
                inner.waiting.push(waiting);
                let start = inner.in_flight < MAX_IN_FLIGHT;
                if start {
                    inner.in_flight += 1;
                }
                Some(start.then(|| inner.take()))
            }
        };
        match first {
            // too many waiting: alone, as before batching
            None => return store.join_once(room, solution).await,
            Some(Some(batch)) => {
                let sender = Sender {
                    batcher: self.clone(),
                    done: false,
                };
                tokio::spawn(sender.send(store.clone(), room.to_owned(), batch));
            }
            Some(None) => {}
        }
        rx.await.unwrap_or_else(|_| {
            Err(AdmissionError::Store(
                "the join's store step was dropped (the gateway is stopping)".into(),
            ))
        })
    }
}

impl Inner {
    /// The next batch: the first [`MAX_BATCH`] waiting, in arrival order.
    fn take(&mut self) -> Vec<Waiting> {
        if self.waiting.len() <= MAX_BATCH {
            std::mem::take(&mut self.waiting)
        } else {
            self.waiting.drain(..MAX_BATCH).collect()
        }
    }
}

/// The task sending a batcher's steps until nobody waits. Dropped before
/// that (its runtime stopping), it leaves the batcher idle: the joins it
/// held hear that their step was dropped, later ones start a new task.
struct Sender {
    batcher: Arc<JoinBatcher>,
    done: bool,
}

impl Sender {
    async fn send<S: QueueStore>(mut self, store: S, room: String, mut batch: Vec<Waiting>) {
        loop {
            let stats = &self.batcher.stats;
            stats.steps.fetch_add(1, Ordering::Relaxed);
            stats.joins.fetch_add(batch.len() as u64, Ordering::Relaxed);
            let step = if batch.len() == 1 {
                // alone: the one-join step, as before batching; a refusal
                // is this join's own answer, not the step's failure
                match store.join_once(&room, batch[0].solution()).await {
                    Err(e) if unreachable(&e) => Err(e),
                    a => Ok(vec![a]),
                }
            } else {
                let solutions: Vec<Solution<'_>> = batch.iter().map(Waiting::solution).collect();
                store.join_once_many(&room, &solutions).await
            };
            let (answers, failed) = match step {
                Ok(answers) => (answers, None),
                Err(e) => (batch.iter().map(|_| Err(for_each(&e))).collect(), Some(e)),
            };
            for (w, a) in batch.into_iter().zip(answers) {
                // a join whose request was dropped no longer listens
                let _ = w.answer.send(a);
            }
            let mut inner = self.batcher.inner.lock();
            if let Some(e) = failed.filter(unreachable) {
                // Those that waited for this step would wait as long again
                // for their own: they fail now, with its error, their
                // solutions unspent (nothing of theirs was sent), as a
                // join sent alone fails within the store's timeout.
                for w in inner.waiting.drain(..) {
                    let _ = w.answer.send(Err(for_each(&e)));
                }
            }
            if inner.waiting.is_empty() {
                inner.in_flight -= 1;
                self.done = true;
                return;
            }
            batch = inner.take();
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if !self.done {
            let mut inner = self.batcher.inner.lock();
            inner.in_flight -= 1;
            if inner.in_flight == 0 {
                // their senders dropped: each hears its step was dropped
                inner.waiting.clear();
            }
        }
    }
}

/// The store did not answer (unreachable, timed out): the joins waiting
/// for the next step would fare no better.
fn unreachable(e: &AdmissionError) -> bool {
    matches!(
        e,
        AdmissionError::Store(_) | AdmissionError::StoreTimeout(_)
    )
}

/// A failed step's error, for each join it carried.
fn for_each(e: &AdmissionError) -> AdmissionError {
    use AdmissionError as E;
    match e {
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
        assert_eq!(
            batcher.inner.lock().in_flight,
            0,
            "idle once all are answered"
        );
        let stats = &batcher.stats;
        assert_eq!(stats.joins(), 600);
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
