//! The two deadlines of one HTTP/1 client connection, kept with one timer
//! for the connection instead of one per request:
//!
//! - **the request head** (`timeouts.header_read`): the client has that
//!   long to send a head, counted from the connection's opening or from the
//!   end of the previous response (so an idle keep-alive connection is
//!   closed too), never while a request is being answered;
//! - **the origin's response head** (`timeouts.upstream_response`): while
//!   the proxy waits for it ([`ConnWatch::origin_wait`]).
//!
//! [`ConnWatch::enforce`] runs in a task of its own beside the connection's
//! and sleeps until the nearer deadline, never longer than the shorter
//! timeout, so a wait or an idle spell that starts while it sleeps is
//! looked at in time (a busy connection costs a wake-up every
//! `timeouts.header_read` at most). A connection that will close after
//! the response it is sending, which is long-lived and proxies nothing (an
//! event stream), needs neither deadline: [`ConnWatch::release`] ends the
//! watch, and with it the task and its timer, for the rest of the stream;
//! serving a request costs a few clock reads and atomic stores. hyper's own
//! header timeout, and a `tokio::time::timeout` per request, each register
//! and cancel a timer per request (about a twentieth of the gateway's
//! instructions per proxied request between them).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;

/// No deadline of that kind is running.
const NONE: u64 = u64::MAX;

/// The deadlines of one connection (shared by its task, its service and the
/// task that enforces them).
pub struct ConnWatch {
    opened: Instant,
    /// Milliseconds after `opened` when the connection last became idle, or
    /// [`NONE`] while a request is being answered.
    idle_since_ms: AtomicU64,
    /// Milliseconds after `opened` when the proxy began waiting for the
    /// origin's response head, or [`NONE`].
    origin_since_ms: AtomicU64,
    /// The origin's deadline passed for the wait that is running.
    origin_late: AtomicBool,
    /// The task waiting for the origin.
    waiter: AtomicWaker,
    /// No deadline is kept any more ([`ConnWatch::release`]).
    released: AtomicBool,
    /// The task enforcing the deadlines, woken by a release.
    enforcer: AtomicWaker,
}

/// Why [`ConnWatch::enforce`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforced {
    /// The connection was idle for the header timeout with no request
    /// head: close it.
    HeadTimeout,
    /// The watch was released: the connection closes after its response
    /// and needs no deadline until then.
    Released,
}

impl Default for ConnWatch {
    fn default() -> Self {
        ConnWatch {
            opened: Instant::now(),
            idle_since_ms: AtomicU64::new(0),
            origin_since_ms: AtomicU64::new(NONE),
            origin_late: AtomicBool::new(false),
            waiter: AtomicWaker::new(),
            released: AtomicBool::new(false),
            enforcer: AtomicWaker::new(),
        }
    }
}

impl ConnWatch {
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.opened).as_millis()).unwrap_or(NONE - 1)
    }

    /// A request head is in: no head deadline until its response is over.
    pub fn busy(&self) {
        self.idle_since_ms.store(NONE, Ordering::Release);
    }

    /// The response is over (its body finished or dropped): the next head
    /// is due within the header timeout.
    pub fn idle(&self) {
        self.idle_since_ms
            .store(self.ms(Instant::now()), Ordering::Release);
    }

    /// The proxy waits for the origin from `since`: the wait completes when
    /// the response timeout has passed; it ends when dropped.
    pub fn origin_wait(&self, since: Instant) -> OriginWait<'_> {
        self.origin_late.store(false, Ordering::Release);
        self.origin_since_ms
            .store(self.ms(since), Ordering::Release);
        OriginWait { watch: self }
    }

    /// Ends the watch: [`ConnWatch::enforce`] returns
    /// [`Enforced::Released`] at once. Only for a connection that is
    /// answering its last request with a response that proxies nothing
    /// (it sends `connection: close`, so no request head follows, and no
    /// origin is waited for).
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.enforcer.wake();
    }

    /// Completes when the connection has been idle for `header_read` with
    /// no request head (the connection is to be closed:
    /// [`Enforced::HeadTimeout`]) or the watch is released; meanwhile tells
    /// a proxied request that waited `upstream_response` for the origin.
    pub async fn enforce(&self, header_read: Duration, upstream_response: Duration) -> Enforced {
        let to_ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(NONE - 1);
        let (head_ms, origin_ms) = (to_ms(header_read), to_ms(upstream_response).max(1));
        // Never asleep longer than either timeout, so that a wait or an
        // idle spell that begins while asleep is looked at by its deadline.
        let nap = head_ms.min(origin_ms).max(1);
        loop {
            let now = self.ms(Instant::now());
            let mut wake = now.saturating_add(nap);
            let since = self.origin_since_ms.load(Ordering::Acquire);
            if since != NONE {
                let deadline = since.saturating_add(origin_ms);
                if now >= deadline {
                    // Once per wait: a new one has another start.
                    if self
                        .origin_since_ms
                        .compare_exchange(since, NONE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.origin_late.store(true, Ordering::Release);
                        self.waiter.wake();
                    }
                } else {
                    wake = wake.min(deadline);
                }
            }
            let idle = self.idle_since_ms.load(Ordering::Acquire);
            if idle != NONE {
                let deadline = idle.saturating_add(head_ms);
                if now >= deadline {
                    return Enforced::HeadTimeout;
                }
                wake = wake.min(deadline);
            }
            let at = self.opened + Duration::from_millis(wake);
            let nap = std::pin::pin!(tokio::time::sleep_until(at.into()));
            if let futures_util::future::Either::Right(_) =
                futures_util::future::select(nap, Released { watch: self }).await
            {
                return Enforced::Released;
            }
        }
    }
}

/// Completes once the watch is released.
struct Released<'a> {
    watch: &'a ConnWatch,
}

impl Future for Released<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let w = self.watch;
        if w.released.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        w.enforcer.register(cx.waker());
        // Again after registering: a release in between is not missed.
        if w.released.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// A wait for the origin's response head ([`ConnWatch::origin_wait`]):
/// completes when the response timeout has passed.
pub struct OriginWait<'a> {
    watch: &'a ConnWatch,
}

impl Future for OriginWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let w = self.watch;
        if w.origin_late.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        w.waiter.register(cx.waker());
        // Read again after registering: a deadline that passed in between
        // is not missed.
        if w.origin_late.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for OriginWait<'_> {
    fn drop(&mut self) {
        self.watch.origin_since_ms.store(NONE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    // Real time, short timeouts; the bounds only say "not before the
    // deadline, and not at some much later tick".

    #[tokio::test]
    async fn a_quiet_connection_is_closed_after_the_header_timeout() {
        let w = ConnWatch::default();
        let started = Instant::now();
        let why = w
            .enforce(Duration::from_millis(200), Duration::from_secs(30))
            .await;
        assert_eq!(why, Enforced::HeadTimeout);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(199), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[tokio::test]
    async fn a_busy_connection_is_kept_and_a_late_origin_is_told_once() {
        let w = std::sync::Arc::new(ConnWatch::default());
        w.busy();
        let dog = {
            let w = w.clone();
            tokio::spawn(async move {
                w.enforce(Duration::from_millis(100), Duration::from_millis(300))
                    .await;
            })
        };
        // Busy for many header timeouts: never closed.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(!dog.is_finished());
        // A wait for the origin that starts now is told after 300 ms.
        let started = Instant::now();
        w.origin_wait(started).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(299), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        // A wait that ends in time is never told, and the next one starts
        // afresh.
        let wait = w.origin_wait(Instant::now());
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(wait);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!w.origin_late.load(Ordering::Acquire));
        let started = Instant::now();
        let on_time =
            tokio::time::timeout(Duration::from_millis(150), w.origin_wait(started)).await;
        assert!(on_time.is_err(), "told too early");
        // Idle: closed after the header timeout.
        w.idle();
        tokio::time::timeout(Duration::from_secs(5), dog)
            .await
            .expect("closed once idle")
            .unwrap();
    }

    /// A release ends the watch at once, however far its deadlines are, and
    /// whether it comes while the watch sleeps or before it starts.
    #[tokio::test]
    async fn a_release_ends_the_watch_at_once() {
        let w = std::sync::Arc::new(ConnWatch::default());
        w.busy();
        let dog = {
            let w = w.clone();
            tokio::spawn(async move {
                w.enforce(Duration::from_secs(60), Duration::from_secs(60))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!dog.is_finished());
        w.release();
        let why = tokio::time::timeout(Duration::from_secs(5), dog)
            .await
            .expect("released at once")
            .unwrap();
        assert_eq!(why, Enforced::Released);

        let early = ConnWatch::default();
        early.release();
        let why = tokio::time::timeout(
            Duration::from_secs(5),
            early.enforce(Duration::from_secs(60), Duration::from_secs(60)),
        )
        .await
        .expect("released before it started");
        assert_eq!(why, Enforced::Released);
    }
}
