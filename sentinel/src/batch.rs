//! Group commit of store steps: the calls that arrive while a batcher's
//! steps are on their way to the store (at most its bound, two by
//! default) go to it together, as one step, once one is back. The queue
//! store's joins (`sluice_admission::batch`) and the reservation store's
//! holds (`sluice_reservation::batch`) are sent this way; what a batch
//! must keep (each call exactly as its own would be) is the store's
//! script, the batching is only when to send. Our own rather than a
//! crate's: it is one lock, a list and a task.
//!
//! Nothing waits for a batch to fill: a call that finds fewer steps than
//! the bound on their way is sent at once; only calls that would have
//! queued behind others on the store anyway are gathered.
//!
//! When the store does not answer a step (unreachable, timed out), the
//! calls that waited for it fail with it at once, nothing of theirs sent:
//! they would otherwise wait a second timeout for their own step, and a
//! slow store must never hold a request past one.
//!
//! A step is sent by a task of its own, so a call whose request is
//! dropped (its client went away) never leaves the others without a
//! sender; its answer is dropped, what the store did for it stands, as
//! when the request of a call sent alone is dropped after the store took
//! it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// The most calls one step carries.
pub const MAX_BATCH: usize = 32;
/// The most calls waiting for the steps on their way; more are sent alone,
/// as without batching (a slow store must not make an unbounded list).
pub const MAX_WAITING: usize = 1024;

/// How a batcher's steps reach the store.
pub trait Step<T, A, E>: Send + Sync + 'static {
    /// One call alone: the call it would have made without batching. A
    /// refusal is the call's own answer; only an error for which
    /// [`StepError::unreachable`] holds is the step's failure.
    fn one(&self, item: &T) -> impl Future<Output = Result<A, E>> + Send;
    /// Several in one step: one answer each, in order; `Err` when the
    /// store gave no answer at all.
    fn many(&self, items: &[&T]) -> impl Future<Output = Result<Vec<Result<A, E>>, E>> + Send;
}

/// The store errors a batcher hands out.
pub trait StepError: Sized + Send + 'static {
    /// The store did not answer (unreachable, timed out): the calls
    /// waiting for the next step would fare no better.
    fn unreachable(&self) -> bool;
    /// The same error again, for each call of a failed step.
    fn duplicate(&self) -> Self;
    /// The step was dropped before it answered (the runtime stopping).
    fn dropped() -> Self;
    /// A step of `sent` calls answered `answered` times.
    fn miscounted(sent: usize, answered: usize) -> Self;
}

/// What batchers sent: `steps` store steps carrying `items` calls, so
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

    /// Calls those steps carried.
    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Relaxed)
    }
}

/// One stream of calls (a room's joins, an event's holds, on one thread),
/// gathered while a step is on its way.
pub struct Batcher<T, A, E> {
    inner: Mutex<Inner<T, A, E>>,
    stats: Arc<BatchStats>,
    max_in_flight: usize,
}

struct Inner<T, A, E> {
    /// Steps on their way (their tasks send those waiting).
    in_flight: usize,
    waiting: Vec<Waiting<T, A, E>>,
}

/// A call waiting for the next step, and where its answer goes.
struct Waiting<T, A, E> {
    item: T,
    answer: oneshot::Sender<Result<A, E>>,
}

impl<T, A, E> Batcher<T, A, E>
where
    T: Send + Sync + 'static,
    A: Send + 'static,
    E: StepError,
{
    /// A batcher with at most `max_in_flight` steps on their way (at
    /// least 1), counting what it sends in `stats`.
    pub fn new(stats: Arc<BatchStats>, max_in_flight: usize) -> Self {
        Batcher {
            inner: Mutex::new(Inner {
                in_flight: 0,
                waiting: Vec::new(),
            }),
            stats,
            max_in_flight: max_in_flight.max(1),
        }
    }

    /// Whether no step is on its way and nothing waits (a batcher that
    /// may be forgotten).
    pub fn idle(&self) -> bool {
        let inner = self.inner.lock();
        inner.in_flight == 0 && inner.waiting.is_empty()
    }

    /// `item`'s answer, sent alone or with the calls that arrive while
    /// this batcher's steps are on their way. `step` makes the sender;
    /// it is called only when this call starts a step.
    pub async fn submit<S: Step<T, A, E>>(
        self: &Arc<Self>,
        item: T,
        step: impl FnOnce() -> S,
    ) -> Result<A, E> {
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut inner = self.inner.lock();
            if inner.waiting.len() >= MAX_WAITING {
                Err(item)
            } else {
                inner.waiting.push(Waiting { item, answer: tx });
                let start = inner.in_flight < self.max_in_flight;
                if start {
                    inner.in_flight += 1;
                }
                Ok(start.then(|| inner.take()))
            }
        };
        match first {
            // too many waiting: alone, as without batching
            Err(item) => return step().one(&item).await,
            Ok(Some(batch)) => {
                let sender = Sender {
                    batcher: self.clone(),
                    done: false,
                };
                tokio::spawn(sender.send(step(), batch));
            }
            Ok(None) => {}
        }
        rx.await.unwrap_or_else(|_| Err(E::dropped()))
    }
}

impl<T, A, E> Inner<T, A, E> {
    /// The next batch: the first [`MAX_BATCH`] waiting, in arrival order.
    fn take(&mut self) -> Vec<Waiting<T, A, E>> {
        if self.waiting.len() <= MAX_BATCH {
            std::mem::take(&mut self.waiting)
        } else {
            self.waiting.drain(..MAX_BATCH).collect()
        }
    }
}

/// The task sending a batcher's steps until nobody waits. Dropped before
/// that (its runtime stopping), it leaves the batcher idle: the calls it
/// held hear that their step was dropped, later ones start a new task.
struct Sender<T, A, E> {
    batcher: Arc<Batcher<T, A, E>>,
    done: bool,
}

impl<T, A, E> Sender<T, A, E>
where
    T: Send + Sync + 'static,
    A: Send + 'static,
    E: StepError,
{
    async fn send<S: Step<T, A, E>>(mut self, step: S, mut batch: Vec<Waiting<T, A, E>>) {
        loop {
            let stats = &self.batcher.stats;
            stats.steps.fetch_add(1, Ordering::Relaxed);
            stats.items.fetch_add(batch.len() as u64, Ordering::Relaxed);
            let answers = if batch.len() == 1 {
                // alone: the one-call step, as without batching; a refusal
                // is this call's own answer, not the step's failure
                match step.one(&batch[0].item).await {
                    Err(e) if e.unreachable() => Err(e),
                    a => Ok(vec![a]),
                }
            } else {
                let items: Vec<&T> = batch.iter().map(|w| &w.item).collect();
                step.many(&items).await
            };
            let failed = match answers {
                Ok(answers) if answers.len() == batch.len() => {
                    for (w, a) in batch.into_iter().zip(answers) {
                        // a call whose request was dropped no longer listens
                        let _ = w.answer.send(a);
                    }
                    None
                }
                Ok(answers) => {
                    let e = E::miscounted(batch.len(), answers.len());
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
            if let Some(e) = failed.filter(StepError::unreachable) {
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

impl<T, A, E> Drop for Sender<T, A, E> {
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
