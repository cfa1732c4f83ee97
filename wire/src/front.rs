//! The client's side of HTTP/1.1 for the plainest request, the one most
//! traffic is: `GET` or `HEAD`, HTTP/1.1, origin-form target, no body, no
//! upgrade, no `Expect`, a `Connection` header of `keep-alive` or `close`
//! at most. Such a request is read here with `httparse` (as hyper reads
//! it), answered by the same service hyper's requests go to, and its
//! response written here, head and body into one buffer and out in one
//! write when the body is ready (`server.native_http1`, on by default).
//!
//! Anything else (a body, `Content-Length` or `Transfer-Encoding` at all,
//! an upgrade, HTTP/1.0, a head that does not parse, is too large or has
//! too many fields) is left unread where it is: the connection, with the
//! bytes read so far, goes to hyper's server for the rest of its life
//! ([`Outcome::Handoff`]), which answers it as it always has (400, 413,
//! 431...). So every request with a body, and every malformed one, meets
//! hyper's parser and framing rules: this path never decides where a body
//! ends, which is where request smuggling lives; it only declines.
//!
//! Why: behind hyper's server, every request crossed its dispatcher, a
//! body channel and its codec before and after the service; here the head
//! is parsed once into the `http::Request` the service wants, and the
//! answer written without a task switch or a body channel (21,959 → 20,329
//! instructions per proxied request, README "Measured").
//!
//! The response is written as hyper writes it: the same status line and
//! reason phrase, the headers in their order, `content-length` or
//! `transfer-encoding: chunked` chosen by the same rules, a `date` when the
//! answer has none, `connection: close` when the connection ends after it.
//! The differential test (`tests/tests/front.rs`) holds the two servers to
//! the same answers.

use std::cell::RefCell;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt as _;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::watch::ConnWatch;

/// At most this many header fields in a head read here (hyper's default);
/// a head with more goes to hyper, which applies `limits.max_headers`.
const MAX_FIELDS: usize = 100;
/// hyper's bound on a request target (414 past it, from hyper).
const MAX_TARGET: usize = u16::MAX as usize - 1;
/// Response bytes gathered before they are written.
const FLUSH_AT: usize = 64 * 1024;
/// A body chunk at least this large is written as it is, not copied.
const DIRECT_AT: usize = 16 * 1024;

/// The bounds a request head is held to (the gateway's
/// `limits.max_header_bytes` and `limits.max_headers`); past them, hyper
/// answers it.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of request line and header fields (default 64 KiB, as the
    /// gateway's `limits.max_header_bytes`).
    pub head_bytes: usize,
    /// Header fields (default 100, hyper's and the gateway's
    /// `limits.max_headers`).
    pub headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head_bytes: 64 * 1024,
            headers: MAX_FIELDS,
        }
    }
}

/// How a connection's time on this path ended.
#[derive(Debug)]
pub enum Outcome {
    /// The connection is over: either side closed it, it failed, or it
    /// was closed after a response (`Connection: close`, a drain).
    Closed,
    /// A request this path does not take: hyper is to serve the
    /// connection from here on, starting with these bytes, read already.
    Handoff(BytesMut),
}

/// Serves plain requests on `io` until one is not plain (handed off, with
/// the bytes read) or the connection ends. `answer` answers each request;
/// `watch` is told when a request is being answered and when the
/// connection is idle again (its header deadline); once `stopping` says
/// so, an idle connection is closed and a busy one closed after its
/// response.
///
/// The request's body is `Q::default()` (these requests have none); the
/// response's body `B` is written as hyper's server would write it.
pub async fn serve<S, Q, B, A, F>(
    io: &mut S,
    limits: Limits,
    watch: &ConnWatch,
    stopping: impl Fn() -> bool,
    mut answer: A,
) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin,
    Q: Default,
    B: Body<Data = Bytes> + Default + Unpin,
    B::Error: std::fmt::Display,
    A: FnMut(Request<Q>) -> F,
    F: Future<Output = Response<B>>,
{
    let mut buf = BytesMut::with_capacity(8192);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let (req, asked_close) = loop {
            if !buf.is_empty() {
                match parse_head(&mut buf, limits) {
                    Head::Plain { req, close } => break (req, close),
                    Head::Other => return Outcome::Handoff(buf),
                    Head::Partial => {}
                }
            }
            // Between requests, a stopping gateway closes the connection
            // (as hyper's graceful shutdown closes an idle one).
            let idle = buf.is_empty();
            if !read_more(io, &mut buf, || idle && stopping()).await {
                return Outcome::Closed;
            }
        };
        watch.busy();
        let head_only = req.method() == Method::HEAD;
        let res = answer(req).await;
        let close = asked_close || stopping();
        let kept = write_response(io, &mut out, &mut buf, res, head_only, close).await;
        watch.idle();
        if out.capacity() > 4 * FLUSH_AT {
            out = Vec::with_capacity(4096);
        }
        match kept {
            Some(true) => {}
            Some(false) => {
                let _ = io.shutdown().await;
                return Outcome::Closed;
            }
            None => return Outcome::Closed,
        }
    }
}

/// Reads more bytes into `buf`: false once the peer has closed, the read
/// failed, or `stop` said so before any byte came.
async fn read_more<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    stop: impl Fn() -> bool,
) -> bool {
    std::future::poll_fn(|cx| {
        if stop() {
            return Poll::Ready(false);
        }
        crate::h1::reserve(buf, 4096);
        match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf) {
            Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(false),
            Poll::Ready(Ok(_)) => Poll::Ready(true),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// A request head at the front of the buffer.
// Returned once per request and matched at once: boxing the request would
// cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Head<Q> {
    /// Not all of it is in yet.
    Partial,
    /// A plain request, taken out of the buffer, and whether its client
    /// asked to close the connection after the answer.
    Plain { req: Request<Q>, close: bool },
    /// Anything else, left in the buffer for hyper.
    Other,
}

/// Parses the request head at the front of `buf` (RFC 9112 §3, by
/// `httparse`, as hyper does), taking it out only when it is plain.
fn parse_head<Q: Default>(buf: &mut BytesMut, limits: Limits) -> Head<Q> {
    // Offsets of each header's name and value in the head.
    let mut fields = [[0u32; 4]; MAX_FIELDS];
    let mut raw = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut parsed = httparse::Request::new(&mut []);
    let (len, count, method, target) = {
        let bytes: &[u8] = buf;
        let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
            &mut parsed,
            bytes,
            &mut raw,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            // Past the bound with no end in sight: hyper answers 431.
            Ok(httparse::Status::Partial) if bytes.len() >= limits.head_bytes => {
                return Head::Other;
            }
            Ok(httparse::Status::Partial) => return Head::Partial,
            Err(_) => return Head::Other,
        };
        if len > limits.head_bytes
            || parsed.headers.len() > limits.headers
            || parsed.version != Some(1)
        {
            return Head::Other;
        }
        let method = match parsed.method {
            Some("GET") => Method::GET,
            Some("HEAD") => Method::HEAD,
            _ => return Head::Other,
        };
        let Some(path) = parsed
            .path
            .filter(|p| p.starts_with('/') && p.len() <= MAX_TARGET)
        else {
            return Head::Other;
        };
        let base = bytes.as_ptr() as usize;
        // Within a head of at most `limits.head_bytes`, checked above.
        #[allow(clippy::cast_possible_truncation)]
        let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        for (slot, h) in fields.iter_mut().zip(parsed.headers.iter()) {
            let (n, v) = (offset(h.name.as_bytes()), offset(h.value));
            #[allow(clippy::cast_possible_truncation)]
            let lens = (h.name.len() as u32, h.value.len() as u32);
            *slot = [n, n + lens.0, v, v + lens.1];
        }
        let t = offset(path.as_bytes()) as usize;
        (len, parsed.headers.len(), method, t..t + path.len())
    };

    let head = buf.split_to(len).freeze();
    match plain_request(&head, &fields[..count], method, target) {
        Some((req, close)) => Head::Plain { req, close },
        None => {
            // Put back as it came, for hyper (rare: a field this path does
            // not take, or a target `http` refuses).
            let mut back = BytesMut::with_capacity(head.len() + buf.len());
            back.extend_from_slice(&head);
            back.extend_from_slice(buf);
            *buf = back;
            Head::Other
        }
    }
}

/// The request of a parsed head, unless one of its fields is for hyper.
fn plain_request<Q: Default>(
    head: &Bytes,
    fields: &[[u32; 4]],
    method: Method,
    target: std::ops::Range<usize>,
) -> Option<(Request<Q>, bool)> {
    let uri = Uri::from_maybe_shared(head.slice(target)).ok()?;
    // Room for the request id the gateway adds.
    let mut headers = HeaderMap::with_capacity(fields.len() + 1);
    let mut close = false;
    for f in fields {
        let [n0, n1, v0, v1] = f.map(|x| x as usize);
        let name = HeaderName::from_bytes(&head[n0..n1]).ok()?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1)).ok()?;
        if name == header::CONNECTION {
            let v = value.as_bytes().trim_ascii();
            if v.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if !v.eq_ignore_ascii_case(b"keep-alive") {
                return None;
            }
        } else if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
            || name == header::EXPECT
        {
            return None;
        }
        headers.append(name, value);
    }
    let mut req = Request::new(Q::default());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    Some((req, close))
}

/// How the body of a response is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// This many bytes (`content-length`), none for no body.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// Writes `res` to `io` as hyper's server would, `close` adding
/// `connection: close`; `read` is the connection's read buffer, given back
/// with `out` while the body waits ([`release`]). `Some(keep)`: the response went out whole and the
/// connection may carry another (`keep`) or is to be closed; `None`: it
/// failed midway (the client went, or the body broke) and the connection is
/// unusable.
///
/// One piece on purpose: it mirrors hyper's server writer step by step
/// (status line, fields, framing rules, date, body) in the order the bytes
/// go out, in one buffer, and is held to hyper by the differential test;
/// split, the framing decisions would be spread over functions that share
/// every local.
async fn write_response<S, B>(
    io: &mut S,
    out: &mut Vec<u8>,
    read: &mut BytesMut,
    res: Response<B>,
    head_only: bool,
    mut close: bool,
) -> Option<bool>
where
    S: AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Default + Unpin,
    B::Error: std::fmt::Display,
{
    let (parts, mut body) = res.into_parts();
    out.clear();
    // Given back while an earlier body waited: taken again at its size.
    out.reserve(4096);
    let mut status = parts.status;
    let mut headers = &parts.headers;
    let none = HeaderMap::new();
    if status.is_informational() {
        // hyper answers a 1xx from a service as a bare 500; none of the
        // gateway's do (upgrades never come this way).
        status = StatusCode::INTERNAL_SERVER_ERROR;
        headers = &none;
        body = B::default();
        close = true;
    }
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    if status == StatusCode::OK && reason.is_none() {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        match reason {
            Some(r) => out.extend_from_slice(r.as_bytes()),
            None => out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
        }
        out.extend_from_slice(b"\r\n");
    }

    let bodiless_status = matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    // hyper's `can_have_body` (and `can_chunked`), `can_have_content_length`.
    let can_body = !head_only && !bodiless_status;
    let can_length = !bodiless_status;
    let empty = body.is_end_stream();
    let known = body.size_hint().exact();
    let mut framing = None;
    let (mut wrote_date, mut says_close, mut wants_chunked) = (false, false, false);
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH {
            if framing.is_some() {
                // One length is written; a repeat adds nothing.
                continue;
            }
            if empty && !head_only {
                // hyper drops it and writes `content-length: 0` below.
                continue;
            }
            // No body to send (HEAD, 204, 304): written as it is.
            let len = if !can_body { Some(0) } else { None };
            let len = match len.or(if empty { None } else { known }) {
                Some(n) => n,
                None => match std::str::from_utf8(value.as_bytes())
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                {
                    Some(n) => n,
                    // hyper refuses to send such a head: the connection ends.
                    None => return None,
                },
            };
            framing = Some(Framing::Length(len));
        } else if name == header::TRANSFER_ENCODING {
            // The framing is this writer's to choose (a service's codings
            // other than chunked are not kept, none of the gateway's sets
            // one).
            wants_chunked = true;
            continue;
        } else if name == header::CONNECTION {
            says_close |= crate::h1::has_token(value, "close");
        } else if name == header::DATE {
            wrote_date = true;
        }
        put_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if close && !says_close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    close |= says_close;
    let framing = match framing {
        Some(f) => f,
        None if wants_chunked && can_body => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
        None => match (empty, known) {
            (true, _) | (false, Some(0)) => {
                if can_length && !head_only {
                    out.extend_from_slice(b"content-length: 0\r\n");
                }
                Framing::Length(0)
            }
            (false, Some(n)) => {
                if can_length {
                    out.extend_from_slice(b"content-length: ");
                    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                    out.extend_from_slice(b"\r\n");
                    Framing::Length(n)
                } else {
                    Framing::Length(0)
                }
            }
            (false, None) if can_body => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
            (false, None) => Framing::Length(0),
        },
    };
    let framing = if can_body {
        framing
    } else {
        Framing::Length(0)
    };
    if !wrote_date {
        out.extend_from_slice(b"date: ");
        put_date(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    // The head is written: its fields are not kept for as long as the body
    // takes (an event stream's, hours).
    drop(parts);

    if framing == Framing::Length(0) {
        // HEAD, 204, 304, an empty body: whatever the body holds is not
        // the client's.
        drop(body);
        io.write_all(out).await.ok()?;
        return Some(!close);
    }
    write_body(io, out, read, body, framing).await?;
    Some(!close)
}

/// Writes the body after the head in `out`; `None` if it did not go out
/// whole (the length not met or exceeded, the body or the client failed).
async fn write_body<S, B>(
    io: &mut S,
    out: &mut Vec<u8>,
    read: &mut BytesMut,
    mut body: B,
    framing: Framing,
) -> Option<()>
where
    S: AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut left = match framing {
        Framing::Length(n) => n,
        Framing::Chunked => u64::MAX,
    };
    loop {
        // A frame that is ready joins the buffer; while one is awaited, the
        // buffer goes out (the client gets what there is).
        let frame = match body.frame().now_or_never() {
            Some(f) => f,
            None => {
                if !out.is_empty() {
                    io.write_all(out).await.ok()?;
                    out.clear();
                }
                release(out, read);
                body.frame().await
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "response body failed; closing the connection");
                return None;
            }
            // Trailers are not sent (hyper sends them only to a client that
            // asked with `TE: trailers`, which this path does not take).
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        if data.is_empty() {
            continue;
        }
        let len = data.len() as u64;
        // Exactly what this frame needs after a release, not a doubling
        // from nothing.
        out.reserve(data.len().min(DIRECT_AT) + 16);
        if framing == Framing::Chunked {
            put_hex(out, len);
            out.extend_from_slice(b"\r\n");
        } else if len > left {
            tracing::debug!("response body longer than its content-length; closing the connection");
            return None;
        } else {
            left -= len;
        }
        if data.len() >= DIRECT_AT {
            io.write_all(out).await.ok()?;
            out.clear();
            io.write_all(&data).await.ok()?;
        } else {
            out.extend_from_slice(&data);
        }
        if framing == Framing::Chunked {
            out.extend_from_slice(b"\r\n");
        }
        if out.len() >= FLUSH_AT {
            io.write_all(out).await.ok()?;
            out.clear();
        }
        if framing != Framing::Chunked && left == 0 {
            break;
        }
    }
    match framing {
        Framing::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
        Framing::Length(_) if left != 0 => {
            tracing::debug!(
                "response body shorter than its content-length; closing the connection"
            );
            if !out.is_empty() {
                let _ = io.write_all(out).await;
            }
            return None;
        }
        Framing::Length(_) => {}
    }
    if !out.is_empty() {
        io.write_all(out).await.ok()?;
        out.clear();
    }
    Some(())
}

/// Gives back the connection's buffers while a body waits for its next
/// frame: such a wait may be long (an event stream waits minutes between
/// events), and every open connection would keep 12 KiB for nothing
/// (issue 21: an idle status stream costs at most 4 KiB of the gateway's
/// memory, `tests/bench/streams.sh`). The read buffer only when it holds
/// nothing (a pipelined request stays); both are taken again, at the size
/// needed, by the next write or read. Costs a free and an allocation per
/// wait, against the write to the socket that comes with each.
fn release(out: &mut Vec<u8>, read: &mut BytesMut) {
    if out.capacity() > 0 {
        *out = Vec::new();
    }
    if read.is_empty() && read.capacity() > 0 {
        *read = BytesMut::new();
    }
}

fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn put_hex(out: &mut Vec<u8>, n: u64) {
    use std::io::Write as _;
    let _ = write!(out, "{n:X}");
}

/// The current time as an HTTP date, formatted once a second per thread.
fn put_date(out: &mut Vec<u8>) {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != secs {
            *at = secs;
            *text = httpdate::fmt_http_date(now);
        }
        out.extend_from_slice(text.as_bytes());
    });
}

/// A connection handed to hyper: the bytes read already, then the socket.
pub struct Prefixed<S> {
    pre: BytesMut,
    io: S,
}

impl<S> Prefixed<S> {
    /// `io`, read from `pre` first.
    pub fn new(pre: BytesMut, io: S) -> Prefixed<S> {
        Prefixed { pre, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pre.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.pre.len().min(buf.remaining());
        buf.put_slice(&self.pre[..n]);
        self.pre.advance(n);
        if self.pre.is_empty() {
            // Its memory back.
            self.pre = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures_util::StreamExt as _;
    use http_body::Body as _;
    use http_body::Frame;
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::{Full, StreamBody};
    use proptest::prelude::*;
    use tokio::io::AsyncReadExt;

    /// The body type of these tests (the gateway's is axum's).
    type Body = UnsyncBoxBody<Bytes, std::io::Error>;

    fn full(data: impl Into<Bytes>) -> Body {
        Full::new(data.into())
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    fn from_stream(
        s: impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    ) -> Body {
        StreamBody::new(s.map(|r| r.map(Frame::data))).boxed_unsync()
    }

    const LIMITS: Limits = Limits {
        head_bytes: 8192,
        headers: 100,
    };

    fn classify(bytes: &[u8]) -> (&'static str, BytesMut) {
        let mut buf = BytesMut::from(bytes);
        let kind = match parse_head::<Body>(&mut buf, LIMITS) {
            Head::Partial => "partial",
            Head::Other => "other",
            Head::Plain { close: true, .. } => "plain+close",
            Head::Plain { .. } => "plain",
        };
        (kind, buf)
    }

    #[test]
    fn only_plain_heads_are_taken_and_the_rest_is_left_as_it_came() {
        let cases: &[(&[u8], &str)] = &[
            (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "plain"),
            (b"HEAD /x?y=1 HTTP/1.1\r\nHost: a\r\n\r\n", "plain"),
            (
                b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
                "plain+close",
            ),
            (
                b"GET / HTTP/1.1\r\nConnection:  Keep-Alive \r\n\r\n",
                "plain",
            ),
            (
                b"GET / HTTP/1.1\r\nConnection: keep-alive, x-a\r\n\r\n",
                "other",
            ),
            (
                b"GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
                "other",
            ),
            (b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "other"),
            (
                b"GET / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
                "other",
            ),
            (b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", "other"),
            (b"POST / HTTP/1.1\r\nHost: a\r\n\r\n", "other"),
            (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", "other"),
            (b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", "other"),
            (b"GET / HTTP/1.0\r\nHost: a\r\n\r\n", "other"),
            (b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", "other"),
            (b"GET / HTTP/1.1\r\nX Y: a\r\n\r\n", "other"),
            (b"GET / HTTP/1.1\r\nHost: a\r\n", "partial"),
            (b"GET / HT", "partial"),
            (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "other"),
        ];
        for (bytes, want) in cases {
            let (kind, rest) = classify(bytes);
            assert_eq!(kind, *want, "{}", String::from_utf8_lossy(bytes));
            if !kind.starts_with("plain") {
                assert_eq!(&rest[..], *bytes, "left as it came");
            } else {
                assert!(rest.is_empty());
            }
        }
        // Past the bounds: hyper's to refuse (431).
        let tight = Limits {
            head_bytes: 64,
            headers: 2,
        };
        let mut long = BytesMut::from(&b"GET / HTTP/1.1\r\nX: "[..]);
        long.extend_from_slice(&[b'a'; 80]);
        assert!(matches!(parse_head::<Body>(&mut long, tight), Head::Other));
        let mut many = BytesMut::from(&b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"[..]);
        assert!(matches!(parse_head::<Body>(&mut many, tight), Head::Other));
    }

    #[test]
    fn a_plain_head_becomes_the_request_hyper_would_make() {
        let mut buf = BytesMut::from(
            &b"GET /p/a%20th?q=1&r HTTP/1.1\r\nHost: shop.test\r\nX-Two: 1\r\nx-two: 2\r\nCookie: a=b\r\n\r\nGET /next"[..],
        );
        let Head::Plain { req, close } = parse_head::<Body>(&mut buf, LIMITS) else {
            panic!("not plain");
        };
        assert!(!close);
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.uri().path(), "/p/a%20th");
        assert_eq!(req.uri().query(), Some("q=1&r"));
        let two: Vec<_> = req.headers().get_all("x-two").iter().collect();
        assert_eq!(two, ["1", "2"]);
        assert_eq!(req.headers()["host"], "shop.test");
        assert_eq!(req.headers().len(), 4);
        assert!(req.body().is_end_stream());
        // The next request's first bytes stay.
        assert_eq!(&buf[..], b"GET /next");
    }

    proptest! {
        /// Whatever the bytes: a head is taken whole or not at all.
        #[test]
        fn a_head_is_taken_whole_or_left_untouched(
            lines in prop::collection::vec(
                prop::sample::select(vec![
                    "GET / HTTP/1.1", "HEAD /a?b HTTP/1.1", "GET /x HTTP/1.0", "POST / HTTP/1.1",
                    "Host: a", "Connection: close", "Connection: keep-alive", "Content-Length: 3",
                    "Transfer-Encoding: chunked", "X: y", " folded", "Bad Name: v", "",
                    "Upgrade: h2c", "abc", "GET / HTTP/1.1\r\nHost: b",
                ]),
                0..8,
            ),
            tail in prop::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut bytes = lines.join("\r\n").into_bytes();
            bytes.extend_from_slice(&tail);
            let mut buf = BytesMut::from(&bytes[..]);
            match parse_head::<Body>(&mut buf, LIMITS) {
                Head::Plain { req, .. } => {
                    let taken = bytes.len() - buf.len();
                    prop_assert_eq!(&bytes[taken..], &buf[..]);
                    prop_assert!(bytes[..taken].ends_with(b"\r\n\r\n") || bytes[..taken].ends_with(b"\n\n"));
                    prop_assert!(matches!(*req.method(), Method::GET | Method::HEAD));
                    for name in [header::CONTENT_LENGTH, header::TRANSFER_ENCODING, header::UPGRADE] {
                        prop_assert!(!req.headers().contains_key(name));
                    }
                }
                Head::Partial | Head::Other => prop_assert_eq!(&buf[..], &bytes[..]),
            }
        }
    }

    async fn read_all(client: &mut tokio::io::DuplexStream) -> String {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.read_to_end(&mut got),
        )
        .await;
        String::from_utf8_lossy(&got).into_owned()
    }

    fn echo_path(req: Request<Body>) -> std::future::Ready<Response<Body>> {
        std::future::ready(Response::new(full(req.uri().path().to_owned())))
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order_then_handed_off_with_their_bytes() {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        client
            .write_all(b"GET /1 HTTP/1.1\r\n\r\nHEAD /2 HTTP/1.1\r\n\r\nGET /3 HTTP/1.1\r\n\r\nPOST /4 HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
            .await
            .unwrap();
        let watch = ConnWatch::default();
        let out = serve(&mut server, LIMITS, &watch, || false, echo_path).await;
        let Outcome::Handoff(rest) = out else {
            panic!("not handed off: {out:?}");
        };
        assert_eq!(
            &rest[..],
            b"POST /4 HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"
        );
        drop(server);
        let text = read_all(&mut client).await;
        let answers: Vec<&str> = text.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
        assert_eq!(answers.len(), 3, "{text}");
        assert!(answers[0].contains("content-length: 2\r\n") && answers[0].ends_with("\r\n\r\n/1"));
        // HEAD: the length it would have, no body.
        assert!(answers[1].contains("content-length: 2\r\n") && answers[1].ends_with("\r\n\r\n"));
        assert!(answers[2].ends_with("\r\n\r\n/3"));
        assert!(text.contains("date: "));
    }

    #[tokio::test]
    async fn close_asked_or_a_stop_ends_the_connection_after_the_answer() {
        // The client asks.
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        client
            .write_all(b"GET /1 HTTP/1.1\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let watch = ConnWatch::default();
        let out = serve(&mut server, LIMITS, &watch, || false, echo_path).await;
        assert!(matches!(out, Outcome::Closed));
        drop(server);
        let text = read_all(&mut client).await;
        assert!(
            text.contains("connection: close\r\n") && text.ends_with("/1"),
            "{text}"
        );
        assert!(!text.contains("never"));

        // The gateway stops: an idle connection closes at once, unanswered.
        let (_client, mut server) = tokio::io::duplex(1 << 16);
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            serve(&mut server, LIMITS, &watch, || true, echo_path),
        )
        .await
        .unwrap();
        assert!(matches!(out, Outcome::Closed));
    }

    #[tokio::test]
    async fn streamed_bodies_are_chunked_and_a_short_one_closes_the_connection() {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        client
            .write_all(b"GET /stream HTTP/1.1\r\n\r\nGET /short HTTP/1.1\r\n\r\nGET /after HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let watch = ConnWatch::default();
        let answer = |req: Request<Body>| {
            let path = req.uri().path().to_owned();
            async move {
                let big = Bytes::from(vec![b'x'; 40_000]);
                let pieces = vec![Bytes::from_static(b"ab"), big, Bytes::from_static(b"cd")];
                if path == "/stream" {
                    let s =
                        futures_util::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>));
                    Response::new(from_stream(s))
                } else {
                    // Claims 10 bytes, has 3.
                    let mut r = Response::new(from_stream(futures_util::stream::iter([Ok::<
                        _,
                        std::io::Error,
                    >(
                        Bytes::from_static(b"abc"),
                    )])));
                    r.headers_mut()
                        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
                    r
                }
            }
        };
        let out = serve(&mut server, LIMITS, &watch, || false, answer).await;
        assert!(matches!(out, Outcome::Closed));
        drop(server);
        let text = read_all(&mut client).await;
        let (first, second) =
            text.split_at(text.find("HTTP/1.1 200 OK\r\ncontent-length: 10").unwrap());
        assert!(
            first.contains("transfer-encoding: chunked\r\n"),
            "{first:.200}"
        );
        let body = &first[first.find("\r\n\r\n").unwrap() + 4..];
        assert!(body.starts_with("2\r\nab\r\n9C40\r\nxxx"));
        assert!(body.ends_with("\r\n2\r\ncd\r\n0\r\n\r\n"));
        // The short body: what there was, then the connection ended
        // (the client sees it incomplete), and `/after` never answered.
        assert!(second.ends_with("\r\n\r\nabc"), "{second}");
    }

    #[tokio::test]
    async fn prefixed_reads_the_bytes_given_then_the_stream() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b" world").await.unwrap();
        drop(client);
        let mut p = Prefixed::new(BytesMut::from(&b"hello"[..]), server);
        let mut got = String::new();
        p.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "hello world");
    }
}
