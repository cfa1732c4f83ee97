//! Holds sent together: the holds of one event that arrive while its
//! batcher's steps are on their way to Redis (at most [`MAX_IN_FLIGHT`])
//! go to it as one call of `hold.lua`'s mode `many` once one is back
//! (group commit; README, "Holds sent together").
//!
//! Nothing waits for a batch to fill: a hold that finds fewer steps on
//! their way is sent at once, alone, by the one-hold call it always was;
//! only holds that would have queued behind others on the store anyway are
//! gathered. The script makes each hold of a batch exactly as its own call
//! would have made it, one after the other, so what a batch changes is
//! the cost (Redis reads the event's settings and reaps once per batch)
//! and never an answer. Our own rather than a crate's: the batching is one
//! lock, a list and a task; what it must keep is the script's.
//!
//! When Redis does not answer a step (unreachable, timed out) the holds
//! that waited for it fail with it at once, nothing of theirs sent: they
//! would otherwise wait a second timeout for their own step, and a slow
//! store must never hold a request past one. A step is sent by a task of
//! its own, so a hold whose request is dropped never leaves the others
//! without a sender; its answer is dropped and its hold stands (it lapses
//! at its deadline), as when the request of a hold sent alone is dropped
//! after Redis took it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::{ReservationError, Result};

/// The most holds one step carries.
pub const MAX_BATCH: usize = 32;
/// The most steps of one batcher on their way at once: a hold that finds
/// fewer goes at once, so under load a hold waits for at most one step
/// before its own.
pub const MAX_IN_FLIGHT: usize = 2;
/// The most holds waiting for the steps on their way; more are sent alone
/// (a slow store must not make an unbounded list).
pub const MAX_WAITING: usize = 1024;

/// How a batcher's steps reach the store.
pub(crate) trait Step<T, A>: Send + Sync + 'static {
    /// One item alone: the call it would have made without batching.
    fn one(&self, item: &T) -> impl Future<Output = Result<A>> + Send;
    /// Several in one call: one answer each, in order; `Err` when the store
    /// gave no answer at all.
    fn many(&self, items: &[&T]) -> impl Future<Output = Result<Vec<Result<A>>>> + Send;
}

/// What batchers sent: `steps` store steps carrying `items` items, so
/// `items / steps` is the mean batch.
#[derive(Debug, Default)]
pub struct BatchStats {
    steps: AtomicU64,
    items: AtomicU64,
}

impl BatchStats {
    /// Store steps sent so far.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// Items (holds) those steps carried.
    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Relaxed)
    }
}

/// One event's holds (on one thread), gathered while a step is on its way.
pub(crate) struct Batcher<T, A> {
    inner: Mutex<Inner<T, A>>,
    stats: Arc<BatchStats>,
}

struct Inner<T, A> {
    in_flight: usize,
    waiting: Vec<Waiting<T, A>>,
}

struct Waiting<T, A> {
    item: T,
    answer: oneshot::Sender<Result<A>>,
}

impl<T, A> Batcher<T, A>
where
    T: Send + Sync + 'static,
    A: Send + 'static,
{
    pub(crate) fn new(stats: Arc<BatchStats>) -> Self {
        Batcher {
            inner: Mutex::new(Inner {
                in_flight: 0,
                waiting: Vec::new(),
            }),
            stats,
        }
    }

    /// Whether no step is on its way and nothing waits (a batcher that
    /// may be forgotten).
    pub(crate) fn idle(&self) -> bool {
        let inner = self.inner.lock();
        inner.in_flight == 0 && inner.waiting.is_empty()
    }

    /// `item`'s answer, sent alone or with those that arrive while this
    /// batcher's steps are on their way.
    pub(crate) async fn submit<S: Step<T, A>>(
        self: &Arc<Self>,
        step: &Arc<S>,
        item: T,
    ) -> Result<A> {
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut inner = self.inner.lock();
            if inner.waiting.len() >= MAX_WAITING {
                Err(item)
            } else {
                inner.waiting.push(Waiting { item, answer: tx });
                let start = inner.in_flight < MAX_IN_FLIGHT;
                if start {
                    inner.in_flight += 1;
                }
                Ok(start.then(|| inner.take()))
            }
        };
        match first {
            // too many waiting: alone, as before batching
            Err(item) => return step.one(&item).await,
            Ok(Some(batch)) => {
                let sender = Sender {
                    batcher: self.clone(),
                    done: false,
                };
                tokio::spawn(sender.send(step.clone(), batch));
            }
            Ok(None) => {}
        }
        rx.await.unwrap_or_else(|_| {
            Err(ReservationError::Protocol(
                "the hold's store step was dropped (the gateway is stopping)".into(),
            ))
        })
    }
}

impl<T, A> Inner<T, A> {
    /// The next batch: the first [`MAX_BATCH`] waiting, in arrival order.
    fn take(&mut self) -> Vec<Waiting<T, A>> {
        if self.waiting.len() <= MAX_BATCH {
            std::mem::take(&mut self.waiting)
        } else {
            self.waiting.drain(..MAX_BATCH).collect()
        }
    }
}

/// The task sending a batcher's steps until nobody waits. Dropped before
/// that (its runtime stopping), it leaves the batcher idle: the items it
/// held hear that their step was dropped, later ones start a new task.
struct Sender<T, A> {
    batcher: Arc<Batcher<T, A>>,
    done: bool,
}

impl<T, A> Sender<T, A>
where
    T: Send + Sync + 'static,
    A: Send + 'static,
{
    async fn send<S: Step<T, A>>(mut self, step: Arc<S>, mut batch: Vec<Waiting<T, A>>) {
        loop {
            let stats = &self.batcher.stats;
            stats.steps.fetch_add(1, Ordering::Relaxed);
            stats.items.fetch_add(batch.len() as u64, Ordering::Relaxed);
            let answers = if batch.len() == 1 {
                match step.one(&batch[0].item).await {
                    Err(e) if e.is_unavailable() => Err(e),
                    a => Ok(vec![a]),
                }
            } else {
                let items: Vec<&T> = batch.iter().map(|w| &w.item).collect();
                step.many(&items).await
            };
            let failed = match answers {
                Ok(answers) if answers.len() == batch.len() => {
                    for (w, a) in batch.into_iter().zip(answers) {
                        // a hold whose request was dropped no longer listens
                        let _ = w.answer.send(a);
                    }
                    None
                }
                Ok(answers) => {
                    let e = ReservationError::Protocol(format!(
                        "a step of {} holds answered {}",
                        batch.len(),
                        answers.len()
                    ));
                    for w in batch {
                        let _ = w.answer.send(Err(e.duplicate()));
                    }
                    None
                }
                Err(e) => {
                    for w in batch {
                        let _ = w.answer.send(Err(e.duplicate()));
                    }
                    Some(e)
                }
            };
            let mut inner = self.batcher.inner.lock();
            if let Some(e) = failed.filter(ReservationError::is_unavailable) {
                // Those that waited for this step would wait as long again
                // for their own: they fail now, with its error, nothing of
                // theirs sent.
                for w in inner.waiting.drain(..) {
                    let _ = w.answer.send(Err(e.duplicate()));
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

impl<T, A> Drop for Sender<T, A> {
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
