//! The origin's side of HTTP/1.1 for the proxy's usual request, one with no
//! body: the request head written straight from the `http::Request`, the
//! response head parsed with `httparse`, and the response body's framing
//! (RFC 9112 §6) decoded here, in the task of the downstream connection
//! ([`crate::origin`] drives the exchange on a connection).
//!
//! Why not hyper's client for these: it drives each upstream connection in
//! a task of its own, so every request crosses two channels (the request
//! in, the response head out) and its body a third, with a wake-up on each
//! side of each; with hyper's server in front, the connection's two codecs
//! cost about as much as the rest of the gateway. Here the downstream task
//! writes the request and reads the answer itself. Requests with a body
//! (which must be written while the answer may already be coming) and
//! upgrades still go through hyper's client (the gateway's
//! `proxy::upstream`).
//!
//! What it accepts from an origin is what hyper's client accepts, decided
//! the same way (differential tests hold the two to it: `tests/origin.rs`
//! in this crate, over a real loopback socket, on a fixed list of answers
//! and on generated ones), but for a few places where it is stricter
//! because a misread here would desynchronise a pooled connection:
//! - a chunk-size line must end in CRLF and its extensions hold no control
//!   characters; a chunk's data must end in CRLF;
//! - `Transfer-Encoding` beside `Content-Length` is read as chunked (as
//!   hyper does) but the connection is not reused;
//! - bytes after the end of a response leave the connection unreused.
//!
//! The hop-by-hop fields of a response head (and any its `Connection`
//! names) are not kept in the head it hands on: they describe the
//! connection to the origin, and the proxy would take them out anyway.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};

/// At most this many header fields in a response head (hyper's default).
pub const MAX_HEADERS: usize = 100;
/// At most this many bytes of response head (hyper's default buffer).
pub const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// At most this many bytes in a chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4096;
/// At most this many bytes of trailer fields.
const MAX_TRAILER_BYTES: usize = 64 * 1024;

/// Why an origin's answer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Reading or writing the connection failed.
    #[error("origin connection: {0}")]
    Io(#[from] std::io::Error),
    /// The origin closed the connection before its response was over.
    #[error("the origin closed the connection before the end of its response")]
    Closed,
    /// The origin's bytes are not an HTTP/1.1 response.
    #[error("malformed response from the origin: {0}")]
    Malformed(&'static str),
}

/// How the body of a response is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the origin closes the connection.
    Eof,
}

/// A response head read from the origin.
#[derive(Debug)]
pub enum Parsed {
    /// More bytes are needed.
    Partial,
    /// An informational (1xx) response, skipped; the final one follows.
    Informational,
    /// The final response head, its body's framing, and whether the
    /// connection may carry another request once the body is read.
    Final {
        /// Status, version, headers (and a reason phrase that is not the
        /// status's usual one, as hyper keeps it, in the extensions).
        head: Response<()>,
        /// How its body ends.
        framing: Framing,
        /// HTTP/1.1 without `Connection: close` (or 1.0 with keep-alive).
        keep_alive: bool,
    },
}

/// Writes the head of a request without a body: request line in origin
/// form, the headers as they are (lowercase names, as hyper writes them),
/// and `content-length: 0` where hyper would add it (a method other than
/// GET or HEAD that has no `Content-Length` of its own).
pub fn encode_request_head<B>(req: &Request<B>, out: &mut Vec<u8>) {
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD)
        && !req.headers().contains_key(header::CONTENT_LENGTH)
    {
        out.extend_from_slice(b"content-length: 0\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Parses a response head at the front of `buf`, taking it out of `buf`
/// when complete. `method` is the request's (HEAD answers have no body).
///
/// One piece on purpose: the framing rules of RFC 9112 §6 in the order
/// they apply (1xx, status without body, Transfer-Encoding, Content-Length,
/// close-delimited), each deciding from what the rules before it left, as
/// hyper's client reads them (the differential test holds the two equal).
pub fn parse_response(buf: &mut BytesMut, method: &Method) -> Result<Parsed, WireError> {
    // Offsets of each header's name and value in the head.
    let mut fields = [[0u32; 4]; MAX_HEADERS];
    let mut raw = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    let (len, code, version, reason, count) = {
        let bytes: &[u8] = buf;
        let len = match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut res, bytes, &mut raw)
        {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                if bytes.len() >= MAX_HEAD_BYTES {
                    return Err(WireError::Malformed("response head too large"));
                }
                return Ok(Parsed::Partial);
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(WireError::Malformed("too many response header fields"));
            }
            Err(_) => return Err(WireError::Malformed("invalid response head")),
        };
        if len > MAX_HEAD_BYTES {
            return Err(WireError::Malformed("response head too large"));
        }
        let base = bytes.as_ptr() as usize;
        let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        for (slot, h) in fields.iter_mut().zip(res.headers.iter()) {
            let (n, v) = (offset(h.name.as_bytes()), offset(h.value));
            *slot = [n, n + h.name.len() as u32, v, v + h.value.len() as u32];
        }
        let reason = res.reason.unwrap_or("");
        (
            len,
            res.code.unwrap_or(0),
            res.version.unwrap_or(1),
            // Kept only when it is not the status's usual phrase.
            StatusCode::from_u16(res.code.unwrap_or(0))
                .ok()
                .filter(|s| s.canonical_reason() != Some(reason))
                .map(|_| Bytes::copy_from_slice(reason.as_bytes())),
            res.headers.len(),
        )
    };
    let status =
        StatusCode::from_u16(code).map_err(|_| WireError::Malformed("invalid status code"))?;
    let head_bytes = buf.split_to(len).freeze();
    match code {
        101 => {
            return Err(WireError::Malformed(
                "101 Switching Protocols without an upgrade",
            ));
        }
        100..=199 => return Ok(Parsed::Informational),
        _ => {}
    }
    let version = if version == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };

    // Room for the header the gateway adds to every answer (its request id).
    let mut headers = HeaderMap::with_capacity(count + 1);
    let mut keep_alive = version == Version::HTTP_11;
    let mut saw_close = false;
    let (mut has_te, mut te_chunked, mut has_cl) = (false, false, false);
    // Names `Connection` lists besides the usual tokens (rare).
    let mut named: Vec<HeaderName> = Vec::new();
    for f in &fields[..count] {
        let [n0, n1, v0, v1] = f.map(|x| x as usize);
        let name = HeaderName::from_bytes(&head_bytes[n0..n1])
            .map_err(|_| WireError::Malformed("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(head_bytes.slice(v0..v1))
            .map_err(|_| WireError::Malformed("invalid header value"))?;
        if name == header::CONNECTION {
            // Once any `Connection` line asks to close, a later keep-alive
            // does not undo it.
            if saw_close || has_token(&value, "close") {
                saw_close = true;
                keep_alive = false;
            } else if !keep_alive {
                keep_alive = has_token(&value, "keep-alive");
            }
            named.extend(connection_names(&value));
        } else if name == header::TRANSFER_ENCODING {
            has_te = true;
            // The last coding of the last line decides.
            te_chunked = last_coding_is_chunked(&value);
        } else if name == header::CONTENT_LENGTH {
            has_cl = true;
        }
        // Hop-by-hop fields end here: they describe this connection, not
        // the answer the client gets.
        if !crate::headers::is_hop_by_hop(name.as_str()) {
            headers.append(name, value);
        }
    }
    for name in named {
        headers.remove(name);
    }

    let framing = framing(
        status, version, method, &headers, has_te, te_chunked, has_cl,
    )?;
    if framing == Framing::Eof || (has_te && has_cl) {
        keep_alive = false;
    }
    let mut head = Response::new(());
    *head.status_mut() = status;
    *head.version_mut() = version;
    *head.headers_mut() = headers;
    if let Some(reason) = reason.and_then(|r| hyper::ext::ReasonPhrase::try_from(r).ok()) {
        head.extensions_mut().insert(reason);
    }
    Ok(Parsed::Final {
        head,
        framing,
        keep_alive,
    })
}

/// RFC 9112 §6.3, as hyper's client decides it (`has_te`, `has_cl`: the
/// head has `Transfer-Encoding`, `Content-Length`; `te_chunked`: its last
/// coding is chunked).
fn framing(
    status: StatusCode,
    version: Version,
    method: &Method,
    headers: &HeaderMap,
    has_te: bool,
    te_chunked: bool,
    has_cl: bool,
) -> Result<Framing, WireError> {
    if matches!(status.as_u16(), 204 | 304) || *method == Method::HEAD {
        return Ok(Framing::Empty);
    }
    if has_te {
        if version == Version::HTTP_10 {
            return Err(WireError::Malformed(
                "Transfer-Encoding in an HTTP/1.0 response",
            ));
        }
        return Ok(if te_chunked {
            Framing::Chunked
        } else {
            Framing::Eof
        });
    }
    if has_cl {
        return content_length(headers)
            .map(Framing::Length)
            .ok_or(WireError::Malformed("invalid Content-Length"));
    }
    Ok(Framing::Eof)
}

/// The one length every `Content-Length` value (and list element) states;
/// `None` when one is not a plain decimal number or two differ.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        // The usual value: one number.
        if let Some(n) = decimal(value.as_bytes()) {
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
            continue;
        }
        for part in value.to_str().ok()?.split(',') {
            let n = decimal(part.trim().as_bytes())?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        }
    }
    length
}

/// Digits only (no sign, no space), without overflow.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

fn last_coding_is_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// `token` among the comma-separated tokens of `value`, case aside.
#[inline]
pub fn has_token(value: &HeaderValue, token: &str) -> bool {
    let v = value.as_bytes();
    // The usual value is one token.
    if !v.contains(&b',') {
        return v.trim_ascii().eq_ignore_ascii_case(token.as_bytes());
    }
    value
        .to_str()
        .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// The header names a `Connection` value lists, but for `keep-alive` and
/// `upgrade`, hop-by-hop names that go anyway (`close` is kept: a field of
/// that name goes too, as in [`crate::headers::strip_hop_by_hop`]).
fn connection_names(value: &HeaderValue) -> impl Iterator<Item = HeaderName> + '_ {
    value
        .to_str()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case("keep-alive")
                && !t.eq_ignore_ascii_case("upgrade")
        })
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
}

/// What the chunked decoder made of the bytes it had.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// Body data.
    Data(Bytes),
    /// Not enough bytes yet.
    More,
    /// The last chunk and the trailer section were read (the trailers,
    /// when there were any).
    End(Option<HeaderMap>),
}

/// The decoder of a chunked body (RFC 9112 §7.1), fed from the front of a
/// buffer.
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// Expecting the trailer section (after the last chunk).
    Trailers,
    /// Over.
    Done,
}

impl Chunked {
    /// Decodes from the front of `buf`, taking what it used out of it.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(Decoded::End(None)),
                ChunkState::Size => {
                    let Some(lf) = buf.iter().take(MAX_CHUNK_LINE).position(|&b| b == b'\n') else {
                        if buf.len() >= MAX_CHUNK_LINE {
                            return Err(WireError::Malformed("chunk-size line too long"));
                        }
                        return Ok(Decoded::More);
                    };
                    let size = chunk_size(&buf[..lf])?;
                    buf.advance(lf + 1);
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(WireError::Malformed("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let mut fields = [httparse::EMPTY_HEADER; 32];
                    match httparse::parse_headers(buf, &mut fields) {
                        Ok(httparse::Status::Complete((len, fields))) => {
                            let mut trailers = HeaderMap::with_capacity(fields.len());
                            for f in fields {
                                let name = HeaderName::from_bytes(f.name.as_bytes())
                                    .map_err(|_| WireError::Malformed("invalid trailer name"))?;
                                let value = HeaderValue::from_bytes(f.value)
                                    .map_err(|_| WireError::Malformed("invalid trailer value"))?;
                                trailers.append(name, value);
                            }
                            buf.advance(len);
                            self.state = ChunkState::Done;
                            return Ok(Decoded::End((!trailers.is_empty()).then_some(trailers)));
                        }
                        Ok(httparse::Status::Partial) => {
                            if buf.len() >= MAX_TRAILER_BYTES {
                                return Err(WireError::Malformed("trailer section too large"));
                            }
                            return Ok(Decoded::More);
                        }
                        Err(_) => return Err(WireError::Malformed("invalid trailer section")),
                    }
                }
            }
        }
    }

    /// The last chunk and its trailers were read.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

/// A chunk-size line without its LF: 1 to 16 hex digits, optional
/// whitespace, optional `;` extensions (ignored; no control characters but
/// HTAB), then CR.
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let bad = WireError::Malformed("invalid chunk-size line");
    let Some((&b'\r', line)) = line.split_last() else {
        return Err(bad);
    };
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(bad);
    }
    let mut size = 0u64;
    for &b in &line[..digits] {
        // At most 16 digits: never overflows.
        size = (size << 4) | u64::from((b as char).to_digit(16).unwrap_or(0));
    }
    let rest = &line[digits..];
    let rest = &rest[rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count()..];
    match rest.first() {
        None => Ok(size),
        Some(b';')
            if rest
                .iter()
                .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80) =>
        {
            Ok(size)
        }
        _ => Err(bad),
    }
}

/// Room for at least `min` more bytes at the end of `buf`.
#[inline]
pub fn reserve(buf: &mut BytesMut, min: usize) {
    if buf.capacity() - buf.len() < min {
        buf.reserve(min);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn parse(bytes: &[u8], method: &Method) -> Result<Parsed, WireError> {
        let mut buf = BytesMut::from(bytes);
        parse_response(&mut buf, method)
    }

    fn final_head(bytes: &[u8], method: &Method) -> (Response<()>, Framing, bool) {
        match parse(bytes, method).unwrap() {
            Parsed::Final {
                head,
                framing,
                keep_alive,
            } => (head, framing, keep_alive),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn request_heads_are_origin_form_with_lowercase_names() {
        let req = Request::get("/a/b?c=d")
            .header("Host", "shop.example")
            .header("X-Many", "1")
            .header("x-many", "2")
            .body(())
            .unwrap();
        let mut out = Vec::new();
        encode_request_head(&req, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /a/b?c=d HTTP/1.1\r\nhost: shop.example\r\nx-many: 1\r\nx-many: 2\r\n\r\n"
        );
        // A bodiless POST says so, as hyper's client does; one that already
        // states its length keeps it.
        for (method, has_cl, want) in [
            (Method::POST, false, true),
            (Method::DELETE, false, true),
            (Method::HEAD, false, false),
            (Method::POST, true, false),
        ] {
            let mut b = Request::builder().method(method.clone()).uri("/");
            if has_cl {
                b = b.header("content-length", "0");
            }
            let mut out = Vec::new();
            encode_request_head(&b.body(()).unwrap(), &mut out);
            let text = String::from_utf8(out).unwrap();
            assert_eq!(
                text.matches("content-length: 0\r\n").count(),
                usize::from(want || has_cl),
                "{method} {text}"
            );
        }
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let get = Method::GET;
        let cases: &[(&[u8], Framing, bool)] = &[
            (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", Framing::Length(5), true),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n", Framing::Length(5), true),
            (b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n", Framing::Length(5), true),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", Framing::Chunked, true),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\n\r\n", Framing::Chunked, true),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", Framing::Eof, false),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n", Framing::Chunked, false),
            (b"HTTP/1.1 200 OK\r\n\r\n", Framing::Eof, false),
            (b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", Framing::Empty, true),
            (b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n", Framing::Empty, true),
            (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n", Framing::Length(5), false),
            (b"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nconnection: Upgrade, Close\r\ncontent-length: 0\r\n\r\n", Framing::Length(0), false),
            (b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\n", Framing::Length(5), false),
            (b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\n", Framing::Length(5), true),
        ];
        for (bytes, framing, keep) in cases {
            let (_, f, k) = final_head(bytes, &get);
            assert_eq!(
                (f, k),
                (*framing, *keep),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
        let (_, f, _) = final_head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            &Method::HEAD,
        );
        assert_eq!(f, Framing::Empty);
    }

    #[test]
    fn bad_heads_are_errors() {
        for bytes in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0x5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length:\r\n\r\n",
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nx: a\rb\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"garbage\r\n\r\n",
        ] {
            assert!(
                parse(bytes, &Method::GET).is_err(),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        let head = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(parse(head.as_bytes(), &Method::GET).is_err());
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert!(
            parse(huge.as_bytes(), &Method::GET).is_err(),
            "an endless head is refused"
        );
    }

    #[test]
    fn hop_by_hop_fields_are_not_kept() {
        let (head, framing, keep) = final_head(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, x-private\r\nx-private: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nProxy-Authenticate: Basic\r\nTrailer: x-sum\r\nx-end: kept\r\n\r\n",
            &Method::GET,
        );
        let names: Vec<&str> = head.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-end"]);
        // They were read before they went.
        assert_eq!((framing, keep), (Framing::Chunked, true));
    }

    #[test]
    fn partial_and_informational_heads() {
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\ncontent-le", &Method::GET),
            Ok(Parsed::Partial)
        ));
        let mut buf = BytesMut::from(&b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"[..]);
        assert!(matches!(
            parse_response(&mut buf, &Method::GET),
            Ok(Parsed::Informational)
        ));
        let Ok(Parsed::Final { head, framing, .. }) = parse_response(&mut buf, &Method::GET) else {
            panic!()
        };
        assert_eq!(head.status(), 200);
        assert_eq!(framing, Framing::Length(2));
        assert_eq!(&buf[..], b"ok", "the body is left in the buffer");
    }

    #[test]
    fn headers_and_reason_phrases_are_kept() {
        let (head, _, _) = final_head(
            b"HTTP/1.1 200 Fine Thanks\r\nX-A: 1\r\nx-a: 2\r\nSet-Cookie: a=b; Path=/\r\ncontent-length: 0\r\n\r\n",
            &Method::GET,
        );
        let a: Vec<_> = head.headers().get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert_eq!(head.headers()["set-cookie"], "a=b; Path=/");
        let reason = head.extensions().get::<hyper::ext::ReasonPhrase>().unwrap();
        assert_eq!(reason.as_bytes(), b"Fine Thanks");
        let (head, _, _) = final_head(
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            &Method::GET,
        );
        assert!(
            head.extensions()
                .get::<hyper::ext::ReasonPhrase>()
                .is_none()
        );
    }

    /// The data, the trailers, and what followed the body.
    type Decoding = (Vec<u8>, Option<HeaderMap>, Vec<u8>);

    /// Decodes `wire` fed in pieces of the given sizes: the data, the
    /// trailers, or the first error.
    fn decode_in_pieces(wire: &[u8], pieces: &[usize]) -> Result<Decoding, WireError> {
        let mut dec = Chunked::default();
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut fed = 0;
        let mut sizes = pieces.iter().copied().cycle();
        loop {
            match dec.decode(&mut buf)? {
                Decoded::Data(d) => data.extend_from_slice(&d),
                Decoded::End(trailers) => {
                    // What follows the body: left in the buffer, or not fed yet.
                    let mut rest = buf.to_vec();
                    rest.extend_from_slice(&wire[fed..]);
                    return Ok((data, trailers, rest));
                }
                Decoded::More => {
                    if fed == wire.len() {
                        return Err(WireError::Closed);
                    }
                    let n = sizes.next().unwrap_or(1).clamp(1, wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_and_trailers() {
        let wire = b"5\r\nhello\r\n7;name=\"v a\"\r\n, world\r\nA \r\n0123456789\r\n0\r\nx-sum: abc\r\nX-Two: 2\r\n\r\nNEXT";
        let (data, trailers, rest) = decode_in_pieces(wire, &[1]).unwrap();
        assert_eq!(data, b"hello, world0123456789");
        let trailers = trailers.unwrap();
        assert_eq!(trailers["x-sum"], "abc");
        assert_eq!(trailers["x-two"], "2");
        assert_eq!(rest, b"NEXT", "the next response's bytes stay");
        let (data, trailers, _) = decode_in_pieces(b"0\r\n\r\n", &[100]).unwrap();
        assert!(data.is_empty() && trailers.is_none());
    }

    #[test]
    fn bad_chunked_bodies_are_errors() {
        for wire in [
            &b"5\nhello\r\n0\r\n\r\n"[..], // bare LF
            b"5\r\nhelloX\r\n0\r\n\r\n",   // data longer than said
            b"5\r\nhel\r\n0\r\n\r\n",      // shorter
            b"g\r\nhello\r\n0\r\n\r\n",    // not hex
            b"\r\nhello\r\n0\r\n\r\n",     // no digits
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"11111111111111111\r\n",          // 17 digits
            b"5;a\x01b\r\nhello\r\n0\r\n\r\n", // control character in an extension
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
        ] {
            assert!(
                decode_in_pieces(wire, &[3]).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let long = format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE));
        assert!(decode_in_pieces(long.as_bytes(), &[64]).is_err());
        // Truncated: the decoder asks for more, the caller sees the close.
        assert!(matches!(
            decode_in_pieces(b"5\r\nhel", &[2]),
            Err(WireError::Closed)
        ));
    }

    proptest! {
        /// Any body, in any chunks, with or without trailers, cut into any
        /// pieces on the wire, decodes to itself.
        #[test]
        fn chunked_round_trip(
            body in proptest::collection::vec(any::<u8>(), 0..2000),
            cuts in proptest::collection::vec(1usize..300, 1..12),
            pieces in proptest::collection::vec(1usize..64, 1..8),
            upper in any::<bool>(),
            ext in any::<bool>(),
            trailer in any::<bool>(),
        ) {
            let mut wire = Vec::new();
            let mut rest = &body[..];
            let mut sizes = cuts.iter().cycle();
            while !rest.is_empty() {
                let n = (*sizes.next().unwrap()).min(rest.len());
                let size = if upper { format!("{n:X}") } else { format!("{n:x}") };
                wire.extend_from_slice(size.as_bytes());
                if ext { wire.extend_from_slice(b" ;x=y"); }
                wire.extend_from_slice(b"\r\n");
                wire.extend_from_slice(&rest[..n]);
                wire.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            wire.extend_from_slice(b"0\r\n");
            if trailer { wire.extend_from_slice(b"x-t: 1\r\n"); }
            wire.extend_from_slice(b"\r\n");
            let (data, trailers, left) = decode_in_pieces(&wire, &pieces).unwrap();
            prop_assert_eq!(data, body);
            prop_assert_eq!(trailers.is_some(), trailer);
            prop_assert!(left.is_empty());
        }
    }
}
