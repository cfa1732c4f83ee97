//! The origin side ([`sluice_wire::origin`] over [`sluice_wire::h1`])
//! against hyper's client: the same bytes, served over a real loopback
//! socket by a scripted origin, read by both; each must see the same
//! status, headers (hop-by-hop fields aside), body and trailers, or both
//! fail. A fixed list of answers first, then answers generated with
//! proptest from the pieces an origin's answer is made of (framing fields
//! that agree and disagree, informational heads, hop-by-hop fields,
//! chunked bodies with extensions and trailers, answers cut short), each
//! sent in a few pieces so that heads and bodies arrive partial.
//!
//! Left out of the generated answers: the places where the native reader
//! is stricter than hyper on purpose (a chunk-size line ending in a bare
//! LF, control characters in chunk extensions, chunk data not followed by
//! CRLF; see `h1`'s module docs), and `101` (never native: upgrades go
//! through hyper's client).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use sluice_wire::h1::encode_request_head;
use sluice_wire::origin::{self, Conn, Discard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An origin that answers each connection's first request head with
/// `pieces`, a millisecond or so apart, then closes the connection.
async fn scripted(pieces: Vec<Vec<u8>>, gap: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let pieces = Arc::new(pieces);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let pieces = pieces.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                for p in pieces.iter() {
                    if stream.write_all(p).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(gap).await;
                }
            });
        }
    });
    addr
}

/// What a client made of an answer: status, headers (sorted), body,
/// trailers; or that it failed (at the head or in the body).
#[derive(Debug, PartialEq)]
enum Seen {
    Answer(u16, Vec<(String, String)>, Vec<u8>, Vec<(String, String)>),
    Failed,
}

async fn seen<B>(res: Result<Response<B>, String>) -> Seen
where
    B: http_body::Body,
{
    let Ok(mut res) = res else {
        return Seen::Failed;
    };
    // What reaches the client: the proxy strips hop-by-hop fields from
    // hyper's answers; native answers come without them.
    sluice_wire::headers::strip_hop_by_hop(res.headers_mut());
    let status = res.status().as_u16();
    let list = |h: &http::HeaderMap| {
        let mut v: Vec<(String, String)> = h
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let headers = list(res.headers());
    match res.into_body().collect().await {
        Ok(c) => {
            let trailers = c.trailers().map(list).unwrap_or_default();
            Seen::Answer(status, headers, c.to_bytes().to_vec(), trailers)
        }
        Err(_) => Seen::Failed,
    }
}

fn request(method: Method) -> Request<()> {
    Request::builder()
        .method(method)
        .uri("/")
        .header("host", "origin")
        .body(())
        .unwrap()
}

async fn via_native(addr: &str, method: Method) -> Seen {
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut head = Vec::new();
    encode_request_head(&request(method.clone()), &mut head);
    let res = origin::exchange(Conn::new(stream, head), &method, &Arc::new(Discard)).await;
    seen(res.map_err(|f| f.error.to_string())).await
}

async fn via_hyper(addr: &str, method: Method) -> Seen {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = http1::handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = request(method).map(|()| http_body_util::Empty::new());
    seen(tx.send_request(req).await.map_err(|e| e.to_string())).await
}

/// Both clients on the same answer (each on a connection of its own).
async fn both(pieces: Vec<Vec<u8>>, method: Method, gap: Duration) -> (Seen, Seen) {
    let addr = scripted(pieces, gap).await;
    let native = tokio::time::timeout(Duration::from_secs(10), via_native(&addr, method.clone()))
        .await
        .expect("native: no hang");
    let hyper = tokio::time::timeout(Duration::from_secs(10), via_hyper(&addr, method))
        .await
        .expect("hyper: no hang");
    (native, hyper)
}

/// The native client reads every answer as hyper's client does: the
/// same status, headers, body and trailers, or a failure for both.
#[tokio::test]
async fn native_answers_are_hypers() {
    let cases: Vec<(&str, Method, Vec<&'static [u8]>)> = vec![
        ("length", Method::GET, vec![b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello"]),
        ("length in pieces", Method::GET, vec![b"HTTP/1.1 200 OK\r\ncont", b"ent-length: 11\r\n\r\nhel", b"lo world"]),
        ("chunked, trailers", Method::GET, vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n5\r\nhello\r\n", b"6;ext=1\r\n world\r\n0\r\nx-sum: 42\r\n\r\n"]),
        ("chunked, upper hex", Method::GET, vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n"]),
        ("close-delimited", Method::GET, vec![b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"the end"]),
        ("204 with a length", Method::GET, vec![b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n"]),
        ("304", Method::GET, vec![b"HTTP/1.1 304 Not Modified\r\netag: \"x\"\r\n\r\n"]),
        ("103 first", Method::GET, vec![b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]),
        ("HEAD", Method::HEAD, vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n"]),
        ("reason", Method::GET, vec![b"HTTP/1.1 200 Fine Thanks\r\ncontent-length: 0\r\n\r\n"]),
        ("cookies", Method::GET, vec![b"HTTP/1.1 200 OK\r\nset-cookie: a=1\r\nSet-Cookie: b=2\r\ncontent-length: 0\r\n\r\n"]),
        ("hop-by-hop", Method::GET, vec![b"HTTP/1.1 200 OK\r\nx-secret: 1\r\nConnection: keep-alive, X-Secret, close\r\nclose: c\r\nkeep-alive: timeout=5\r\nproxy-authenticate: Basic\r\nupgrade: h2c\r\nx-end: kept\r\ncontent-length: 2\r\n\r\nok"]),
        ("HTTP/1.0", Method::GET, vec![b"HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\nold"]),
        ("HTTP/1.0 to the end", Method::GET, vec![b"HTTP/1.0 200 OK\r\n\r\nold times"]),
        ("equal lengths", Method::GET, vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok"]),
        ("404 with a body", Method::DELETE, vec![b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\ngone"]),
        ("cut short", Method::GET, vec![b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel"]),
        ("chunks cut short", Method::GET, vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel"]),
        ("head cut short", Method::GET, vec![b"HTTP/1.1 200 OK\r\ncontent-len"]),
        ("differing lengths", Method::GET, vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok"]),
        ("bad length", Method::GET, vec![b"HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\nok"]),
        ("chunked in 1.0", Method::GET, vec![b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"]),
        ("not HTTP", Method::GET, vec![b"SSH-2.0-OpenSSH\r\n\r\n"]),
        ("nothing", Method::GET, vec![]),
    ];
    for (name, method, pieces) in cases {
        let pieces = pieces.into_iter().map(<[u8]>::to_vec).collect();
        let (native, hyper) = both(pieces, method, Duration::from_millis(3)).await;
        assert_eq!(native, hyper, "{name}");
    }
}

// === generated answers ===

/// An origin's answer, in the pieces it is built from.
#[derive(Clone, Debug)]
struct Answer {
    method: Method,
    early_hints: bool,
    http10: bool,
    status: u16,
    reason: &'static str,
    fields: Vec<Field>,
    body: Vec<u8>,
    chunk_sizes: Vec<usize>,
    chunk_ext: bool,
    trailers: bool,
    /// Where the answer is cut short (a fraction of its length), if it is.
    cut: Option<f64>,
    /// Where it is split into pieces on the wire (fractions).
    splits: Vec<f64>,
}

#[derive(Clone, Debug)]
enum Field {
    /// A field written as it is.
    Plain(&'static str),
    /// `Content-Length` with the body's length plus this (0: it agrees).
    Length(i64),
    /// `Content-Length: n, n`.
    LengthList,
    /// `Transfer-Encoding` with this value.
    Coding(&'static str),
}

impl Answer {
    /// Chunked framing is what the answer's last `Transfer-Encoding` says
    /// (its body is then written chunked; anything else is written as it
    /// is).
    fn chunked(&self) -> bool {
        self.fields
            .iter()
            .rev()
            .find_map(|f| match f {
                Field::Coding(c) => Some(c.trim_end().to_ascii_lowercase().ends_with("chunked")),
                _ => None,
            })
            .unwrap_or(false)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.early_hints {
            out.extend_from_slice(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n");
        }
        let version = if self.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        out.extend_from_slice(format!("{version} {} {}\r\n", self.status, self.reason).as_bytes());
        for f in &self.fields {
            let line = match f {
                Field::Plain(s) => (*s).to_owned(),
                Field::Length(d) => {
                    format!("content-length: {}", (self.body.len() as i64 + d).max(0))
                }
                Field::LengthList => format!("Content-Length: {0}, {0}", self.body.len()),
                Field::Coding(c) => format!("transfer-encoding: {c}"),
            };
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if self.chunked() {
            let mut rest = &self.body[..];
            let mut sizes = self.chunk_sizes.iter().cycle();
            while !rest.is_empty() {
                let n = (*sizes.next().unwrap_or(&7)).clamp(1, rest.len());
                out.extend_from_slice(format!("{n:x}").as_bytes());
                if self.chunk_ext {
                    out.extend_from_slice(b";name=\"v a\"");
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&rest[..n]);
                out.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            out.extend_from_slice(b"0\r\n");
            if self.trailers {
                out.extend_from_slice(b"x-sum: 42\r\nX-Two: 2\r\n");
            }
            out.extend_from_slice(b"\r\n");
        } else {
            out.extend_from_slice(&self.body);
        }
        if let Some(cut) = self.cut {
            let at = ((out.len() as f64) * cut) as usize;
            out.truncate(at.min(out.len()));
        }
        out
    }

    fn pieces(&self) -> Vec<Vec<u8>> {
        let bytes = self.bytes();
        let mut at: Vec<usize> = self
            .splits
            .iter()
            .map(|f| ((bytes.len() as f64) * f) as usize)
            .collect();
        at.push(bytes.len());
        at.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for to in at {
            if to > from {
                pieces.push(bytes[from..to].to_vec());
                from = to;
            }
        }
        pieces
    }
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "x-a: 1",
            "X-A: 2",
            "Set-Cookie: a=b; Path=/",
            "Connection: close",
            "Connection: keep-alive",
            "Connection: keep-alive, x-a",
            "connection: Upgrade, Close",
            "Keep-Alive: timeout=5",
            "Trailer: x-sum",
            "Proxy-Authenticate: Basic",
            "Upgrade: h2c",
            "etag: \"x\"",
            "content-length: abc",
            "content-length: +1",
            "content-length:",
        ])
        .prop_map(Field::Plain),
        3 => prop_oneof![4 => Just(0i64), 1 => -3i64..3].prop_map(Field::Length),
        1 => Just(Field::LengthList),
        2 => prop::sample::select(vec!["chunked", "Chunked", "gzip, chunked", "gzip", "chunked, gzip"])
            .prop_map(Field::Coding),
    ]
}

fn answer() -> impl Strategy<Value = Answer> {
    let head = (
        prop::sample::select(vec![Method::GET, Method::GET, Method::HEAD, Method::DELETE]),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.2),
        prop::sample::select(vec![200u16, 200, 201, 204, 206, 304, 404, 500, 599]),
        prop::sample::select(vec!["OK", "Fine Thanks", "", "Not Found"]),
        prop::collection::vec(field(), 0..6),
    );
    let body = (
        prop::collection::vec(any::<u8>(), 0..300),
        prop::collection::vec(1usize..64, 1..4),
        any::<bool>(),
        any::<bool>(),
        prop::option::weighted(0.25, 0.0f64..1.0),
        prop::collection::vec(0.0f64..1.0, 0..3),
    );
    (head, body).prop_map(
        |(
            (method, early_hints, http10, status, reason, fields),
            (body, chunk_sizes, chunk_ext, trailers, cut, splits),
        )| Answer {
            method,
            early_hints,
            http10,
            status,
            reason,
            fields,
            body,
            chunk_sizes,
            chunk_ext,
            trailers,
            cut,
            splits,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever an origin answers (in the shapes above): the native reader
    /// and hyper's client see the same answer, or both fail.
    #[test]
    fn generated_answers_are_read_as_hyper_reads_them(a in answer()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (native, hyper) = rt.block_on(both(a.pieces(), a.method.clone(), Duration::from_millis(1)));
        prop_assert_eq!(native, hyper, "{:?}", String::from_utf8_lossy(&a.bytes()));
    }
}
