//! A client connection whose writes cannot wait forever.
//!
//! A client that stops reading (a slow-read attack, a status stream whose
//! page froze) leaves the gateway's writes pending once the socket buffers
//! are full, and would keep its connection, its `max_connections` slot and
//! whatever it was answering for as long as it likes. [`WriteStall`] fails
//! a write (or flush, or shutdown) that has made no progress for
//! `timeouts.write_stall` with [`std::io::ErrorKind::TimedOut`]: the
//! connection ends and gives its slot back. Progress of any size resets the
//! clock, so a slow reader is not a stalled one.
//!
//! Our own rather than `tokio-io-timeout`: that one keeps two timers
//! inline in every connection (read and write, a couple of hundred bytes),
//! a third of an idle status stream's margin under its 4 KiB bound (README,
//! "Streams"); this keeps one pointer, boxes a timer while a write waits
//! and drops it once the write goes on (kept, a timer cost every stream
//! that ever waited about 300 B: measured, `tests/bench/streams.sh`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `S` with its writes bounded in time (see the module docs).
pub struct WriteStall<S> {
    inner: S,
    limit: Duration,
    /// The deadline of the write waiting now; `None` while none waits.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteStall<S> {
    /// `inner`, its writes failing after `limit` without progress
    /// (`Duration::ZERO`: never).
    pub fn new(inner: S, limit: Duration) -> Self {
        WriteStall {
            inner,
            limit,
            timer: None,
        }
    }

    /// A write could not go on: arms the deadline (once per wait) and says
    /// whether it has passed.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.limit.is_zero() {
            return Poll::Pending;
        }
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for timeouts.write_stall",
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The result of a write-side call: progress drops the deadline, a
    /// wait checks it.
    fn track<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.waiting(cx).map(Err),
            done => {
                self.timer = None;
                done
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStall<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.track(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.track(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.track(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.track(cx, r)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A peer that reads nothing: the write fails after the limit; one
    /// that reads slowly keeps it going, however long the whole takes.
    #[tokio::test]
    async fn a_write_without_progress_fails_and_slow_progress_does_not() {
        let limit = Duration::from_millis(300);
        let (a, mut b) = tokio::io::duplex(64);
        let mut w = WriteStall::new(a, limit);
        let body = vec![7u8; 1024];
        let reader = tokio::spawn(async move {
            // 64 bytes every 100 ms: the whole takes 1.6 s, never 300 ms idle
            let mut got = 0;
            let mut buf = [0u8; 64];
            while got < 1024 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                got += b.read(&mut buf).await.unwrap();
            }
            b
        });
        let start = Instant::now();
        w.write_all(&body).await.unwrap();
        assert!(start.elapsed() > limit * 3, "the slow read took its time");
        let _b = reader.await.unwrap();
        // now nobody reads: the buffer fills, and the write fails once the
        // limit has passed without progress
        let start = Instant::now();
        let err = w.write_all(&body).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let waited = start.elapsed();
        assert!(waited >= limit && waited < limit * 5, "{waited:?}");
        // a limit of zero never fails
        let (a, _b) = tokio::io::duplex(64);
        let mut w = WriteStall::new(a, Duration::ZERO);
        let stuck = tokio::time::timeout(limit * 3, w.write_all(&body)).await;
        assert!(stuck.is_err(), "still waiting");
    }
}
