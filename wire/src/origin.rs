//! One exchange with the origin on a native HTTP/1.1 connection ([`Conn`]):
//! the request head written, the response head read ([`exchange`]), and
//! the response body read from the connection as the downstream side polls
//! it ([`OriginBody`]), in the task of the downstream connection. The
//! codec itself is [`crate::h1`]; keeping connections between exchanges is
//! the caller's ([`Pool`]: the gateway's `proxy::upstream` keeps one pool
//! per I/O thread).
//!
//! A connection goes back to its pool only after a clean end: the body read
//! to its end, the origin did not ask to close, and nothing but this
//! response came on it. A body dropped before its end, a body that fails,
//! or an origin that sent more than its response takes the connection
//! with it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Method, Response};
use http_body::Frame;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::h1::{self, Chunked, Decoded, Framing, Parsed, WireError};

/// A native connection to the origin: the socket, the bytes read from it
/// and not used yet, and the buffer its request heads are written in.
pub struct Conn<S = TcpStream> {
    /// The connection.
    pub stream: S,
    /// Read from `stream` and not used yet (empty between exchanges on a
    /// connection that may be reused).
    pub read: BytesMut,
    /// The request head to write (kept between exchanges for its memory).
    pub write: Vec<u8>,
}

impl<S> Conn<S> {
    /// A fresh connection whose first request head is `head`.
    pub fn new(stream: S, head: Vec<u8>) -> Conn<S> {
        Conn {
            stream,
            read: BytesMut::with_capacity(8192),
            write: head,
        }
    }
}

impl Conn<TcpStream> {
    /// Whether an idle connection can carry a request: the origin has
    /// neither closed it nor sent anything since its last response (either
    /// leaves it unusable). Costs a system call only when the event loop
    /// has seen the socket become readable.
    pub fn still_open(&self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.stream.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
        }
    }
}

/// Where a connection goes once an exchange on it ended cleanly.
pub trait Pool<S>: Send + Sync {
    /// Keeps `conn` (or drops it, closing it) for a later request.
    fn checkin(&self, conn: Conn<S>);
}

/// A pool that keeps nothing: each connection closes after its exchange.
#[derive(Clone, Copy, Debug, Default)]
pub struct Discard;

impl<S> Pool<S> for Discard {
    fn checkin(&self, _conn: Conn<S>) {}
}

/// A native exchange that failed: why, whether the origin answered nothing
/// at all (so a kept connection had closed), and the request head to send
/// again.
#[derive(Debug)]
pub struct Failed {
    /// Why.
    pub error: WireError,
    /// Not a byte of answer came (the request may be sent again on a fresh
    /// connection when its method is idempotent).
    pub unanswered: bool,
    /// The request head that was sent.
    pub head: Vec<u8>,
}

/// Writes the request head in `conn.write` and reads the response head;
/// the body is read afterwards, as it is polled. `method` is the
/// request's (a HEAD answer has no body). When the body is over and the
/// connection can carry another request, it goes to `pool`.
pub async fn exchange<S, P>(
    mut conn: Conn<S>,
    method: &Method,
    pool: &Arc<P>,
) -> Result<Response<OriginBody<S, P>>, Failed>
where
    S: AsyncRead + AsyncWrite + Unpin,
    P: Pool<S>,
{
    let failed = |error: WireError, unanswered: bool, conn: Conn<S>| Failed {
        error,
        unanswered,
        head: conn.write,
    };
    if let Err(e) = conn.stream.write_all(&conn.write).await {
        return Err(failed(e.into(), true, conn));
    }
    let mut answered = false;
    loop {
        match h1::parse_response(&mut conn.read, method) {
            Err(e) => return Err(failed(e, false, conn)),
            Ok(Parsed::Informational) => answered = true,
            Ok(Parsed::Final {
                head,
                framing,
                keep_alive,
            }) => {
                let state = match framing {
                    Framing::Empty | Framing::Length(0) => State::Done,
                    Framing::Length(n) => State::Length(n),
                    Framing::Chunked => State::Chunked(Chunked::default()),
                    Framing::Eof => State::Eof,
                };
                let mut body = OriginBody {
                    conn: Some(conn),
                    state,
                    keep_alive,
                    pool: pool.clone(),
                };
                if body.state == State::Done {
                    body.finish();
                }
                return Ok(head.map(|()| body));
            }
            Ok(Parsed::Partial) => {
                answered |= !conn.read.is_empty();
                h1::reserve(&mut conn.read, 4096);
                let read = std::future::poll_fn(|cx| {
                    tokio_util::io::poll_read_buf(Pin::new(&mut conn.stream), cx, &mut conn.read)
                })
                .await;
                match read {
                    Ok(0) => return Err(failed(WireError::Closed, !answered, conn)),
                    Ok(_) => {}
                    Err(e) => return Err(failed(e.into(), !answered, conn)),
                }
            }
        }
    }
}

/// Where a native response body is.
#[derive(Debug, PartialEq)]
enum State {
    /// This many bytes left.
    Length(u64),
    Chunked(Chunked),
    /// Until the origin closes.
    Eof,
    /// Over.
    Done,
}

impl PartialEq for Chunked {
    fn eq(&self, other: &Self) -> bool {
        self.is_done() == other.is_done()
    }
}

/// The body of a native response, read from the origin's connection as the
/// downstream side polls it. Read to its end on a connection that may carry
/// another request, it puts the connection back in its [`Pool`]; dropped
/// before, it closes it.
pub struct OriginBody<S, P> {
    conn: Option<Conn<S>>,
    state: State,
    keep_alive: bool,
    pool: Arc<P>,
}

impl<S, P> OriginBody<S, P>
where
    S: AsyncRead + Unpin,
    P: Pool<S>,
{
    /// The body is over: the connection goes back to the pool when it can
    /// carry another request and nothing but this response came on it.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take()
            && self.keep_alive
            && conn.read.is_empty()
        {
            self.pool.checkin(conn);
        }
    }

    /// Reads more from the origin; `Ok(false)` when it closed.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, WireError>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(Ok(false));
        };
        h1::reserve(&mut conn.read, 16 * 1024);
        match std::task::ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut conn.stream),
            cx,
            &mut conn.read
        )) {
            Ok(0) => Poll::Ready(Ok(false)),
            Ok(_) => Poll::Ready(Ok(true)),
            Err(e) => Poll::Ready(Err(e.into())),
        }
    }
}

impl<S, P> http_body::Body for OriginBody<S, P>
where
    S: AsyncRead + Unpin,
    P: Pool<S>,
{
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Length(left) => {
                    if !conn.read.is_empty() {
                        let n = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(conn.read.len());
                        let data = conn.read.split_to(n).freeze();
                        *left -= n as u64;
                        if *left == 0 {
                            this.finish();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                State::Chunked(dec) => match dec.decode(&mut conn.read) {
                    Err(e) => {
                        this.conn = None;
                        return Poll::Ready(Some(Err(e)));
                    }
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::End(trailers)) => {
                        this.finish();
                        return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
                    }
                    Ok(Decoded::More) => {}
                },
                State::Eof => {
                    if !conn.read.is_empty() {
                        let data = conn.read.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
            // Nothing buffered that the body can use: read more.
            match std::task::ready!(this.poll_fill(cx)) {
                Ok(true) => {}
                Ok(false) if this.state == State::Eof => {
                    this.state = State::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(false) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(WireError::Closed)));
                }
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.state {
            State::Length(n) => http_body::SizeHint::with_exact(n),
            State::Done => http_body::SizeHint::with_exact(0),
            _ => http_body::SizeHint::default(),
        }
    }
}
