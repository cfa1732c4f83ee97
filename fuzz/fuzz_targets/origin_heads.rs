//! The origin side of the wire code (`sluice_wire::origin::exchange` over
//! `sluice_wire::h1`) fed any bytes as an origin's answer: never a panic or
//! a hang, a body never longer than what the origin sent, none for HEAD.
//!
//! The first byte picks the request's method (its low bit: HEAD or GET)
//! and how many bytes the origin's connection gives at each read (the
//! rest of it, 0 meaning all at once), so partial heads, chunk-size lines
//! and trailers are reached; the rest is the answer.
#![no_main]

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::Method;
use http_body_util::BodyExt as _;
use libfuzzer_sys::fuzz_target;
use sluice_wire::origin::{self, Conn, Discard};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// An origin's connection: gives `data` `step` bytes at a read, then the
/// end; takes whatever is written.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    step: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self
            .step
            .min(self.data.len() - self.at)
            .min(buf.remaining());
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, answer)) = data.split_first() else {
        return;
    };
    let method = if first & 1 == 1 {
        Method::HEAD
    } else {
        Method::GET
    };
    let step = match usize::from(first >> 1) {
        0 => usize::MAX,
        n => n,
    };
    let conn = Conn::new(
        Trickle {
            data: answer.to_vec(),
            at: 0,
            step,
        },
        b"GET / HTTP/1.1\r\nhost: origin\r\n\r\n".to_vec(),
    );
    rt().block_on(async {
        let read = async {
            let Ok(res) = origin::exchange(conn, &method, &Arc::new(Discard)).await else {
                return;
            };
            if let Ok(body) = res.into_body().collect().await {
                let body = body.to_bytes();
                assert!(body.len() <= answer.len(), "a body longer than the answer");
                assert!(method != Method::HEAD || body.is_empty(), "a body for HEAD");
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("no hang");
    });
});
