//! The gateway's own HTTP/1.1 reader and writer (`server.native_http1`,
//! wire/src/front.rs) against hyper's server: the same bytes sent on one
//! connection to a gateway with it and to one without it must bring the
//! same answers (status lines, header lines in order, framing, bodies) and
//! the origin must see the same requests, whatever mix of plain requests,
//! requests with bodies, upgrades, malformed heads and pipelining the
//! connection carries. Dates and request ids, which differ by nature, are
//! normalised; chunked bodies are compared decoded (where chunks fall
//! depends on timing).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proptest::prelude::*;
use sluice_tests::origin::TestOrigin;
use sluice_tests::{TestGateway, hex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One answer as it came: its head's lines (date and ids normalised), how
/// its body was framed, and the body (decoded when chunked).
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    head: Vec<String>,
    framing: &'static str,
    body: String,
}

/// Both gateways, in front of one origin.
struct Pair {
    _origin: TestOrigin,
    native: TestGateway,
    hyper: TestGateway,
}

impl Pair {
    async fn start() -> Pair {
        let origin = TestOrigin::start().await;
        let gw = |native: bool| {
            TestGateway::builder()
                .origin(origin.url())
                .unguarded()
                .config(move |c| c.server.native_http1 = native)
                .spawn()
        };
        let native = gw(true).await;
        let hyper = gw(false).await;
        Pair {
            _origin: origin,
            native,
            hyper,
        }
    }

    /// `wire` sent in `pieces` writes to each gateway; the answers of both.
    async fn both(&self, pieces: &[Vec<u8>], methods: &[&str]) -> (Vec<Answer>, Vec<Answer>) {
        let a = exchange(self.native.addr, pieces, methods).await;
        let b = exchange(self.hyper.addr, pieces, methods).await;
        (a, b)
    }
}

/// Sends `pieces` (a short pause between them) on one connection, reads
/// until the gateway closes it (or 10 s), and splits what came into
/// answers (`methods`: the requests' methods in order, for HEAD).
async fn exchange(addr: std::net::SocketAddr, pieces: &[Vec<u8>], methods: &[&str]) -> Vec<Answer> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    for (i, p) in pieces.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if s.write_all(p).await.is_err() {
            break;
        }
    }
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    split(&got, methods)
}

/// The answers in `wire`, as far as they are whole.
fn split(wire: &[u8], methods: &[&str]) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut rest = wire;
    let mut i = 0;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut res = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(n)) = res.parse(rest) else {
            if !rest.is_empty() {
                out.push(Answer {
                    head: vec![format!("unparsed: {}", String::from_utf8_lossy(rest))],
                    framing: "",
                    body: String::new(),
                });
            }
            return out;
        };
        let code = res.code.unwrap_or(0);
        let mut head = vec![format!(
            "HTTP/1.{} {} {}",
            res.version.unwrap_or(9),
            code,
            res.reason.unwrap_or("")
        )];
        let (mut length, mut chunked) = (None, false);
        for h in res.headers.iter() {
            let value = String::from_utf8_lossy(h.value).into_owned();
            let name = h.name.to_ascii_lowercase();
            if name == "content-length" {
                length = value.trim().parse::<usize>().ok();
            }
            if name == "transfer-encoding" && value.contains("chunked") {
                chunked = true;
            }
            let value = if name == "date" {
                "D".to_owned()
            } else {
                value
            };
            head.push(format!("{name}: {value}"));
        }
        rest = &rest[n..];
        let method = methods.get(i).copied().unwrap_or("GET");
        if (100..200).contains(&code) {
            out.push(Answer {
                head,
                framing: "none",
                body: String::new(),
            });
            continue;
        }
        i += 1;
        let (framing, body): (&'static str, Vec<u8>) =
            if method == "HEAD" || code == 204 || code == 304 {
                ("none", Vec::new())
            } else if chunked {
                let mut body = Vec::new();
                loop {
                    let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                        return out;
                    };
                    let size = std::str::from_utf8(&rest[..eol])
                        .ok()
                        .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
                        .unwrap_or(usize::MAX);
                    if size == usize::MAX || rest.len() < eol + 2 + size + 2 {
                        return out;
                    }
                    rest = &rest[eol + 2..];
                    if size == 0 {
                        // No trailers are sent by either.
                        rest = &rest[2..];
                        break;
                    }
                    body.extend_from_slice(&rest[..size]);
                    rest = &rest[size + 2..];
                }
                ("chunked", body)
            } else if let Some(len) = length {
                if rest.len() < len {
                    return out;
                }
                let body = rest[..len].to_vec();
                rest = &rest[len..];
                ("length", body)
            } else {
                let body = rest.to_vec();
                rest = &[];
                ("close", body)
            };
        let mut head_text = head;
        let mut body = if body.len() > 4096 {
            // Large bodies: compared by hash.
            format!("{} bytes, sha256 {}", body.len(), hex(&sha256(&body)))
        } else {
            String::from_utf8_lossy(&body).into_owned()
        };
        for line in &mut head_text {
            *line = unid(line);
        }
        let unided = unid(&body);
        if unided != body {
            // The ids' counters may differ in width between the two
            // gateways (`…-ff` against `…-100`), and so the length of a
            // body that echoes one: compared without it.
            for line in &mut head_text {
                if line.starts_with("content-length:") {
                    *line = "content-length: (of a body with an id)".to_owned();
                }
            }
        }
        body = unided;
        out.push(Answer {
            head: head_text,
            framing,
            body,
        });
    }
}

fn sha256(b: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(b).to_vec()
}

/// `text` with each request id a gateway gave (8 hex digits of its own, a
/// dash, a hex counter) written `ID`.
fn unid(text: &str) -> String {
    let b = text.as_bytes();
    let hexd = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied) = (0, 0);
    while i + 10 <= b.len() {
        let starts = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if starts && b[i..i + 8].iter().all(|&c| hexd(c)) && b[i + 8] == b'-' && hexd(b[i + 9]) {
            let mut end = i + 9;
            while end < b.len() && hexd(b[end]) {
                end += 1;
            }
            out.push_str(&text[copied..i]);
            out.push_str("ID");
            copied = end;
            i = end;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: shop.test\r\n{extra}\r\n").into_bytes()
}

const LAST: &str = "GET /echo/last HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n";

/// A named shape: what is written (piece by piece) and the methods of its
/// requests.
type Script = (&'static str, Vec<Vec<u8>>, Vec<&'static str>);

/// Fixed shapes.
fn scripts() -> Vec<Script> {
    let cat = |parts: &[&[u8]]| parts.concat();
    vec![
        ("plain get", vec![get("/echo/a?x=1&y=%20", ""), LAST.into()], vec!["GET", "GET"]),
        (
            "head",
            vec![
                b"HEAD /bytes/5000 HTTP/1.1\r\nHost: shop.test\r\n\r\n".to_vec(),
                b"HEAD /echo/h HTTP/1.1\r\nHost: shop.test\r\n\r\n".to_vec(),
                LAST.into(),
            ],
            vec!["HEAD", "HEAD", "GET"],
        ),
        (
            "pipelined in one write",
            vec![cat(&[
                &get("/echo/1", "X-A: 1\r\n"),
                &get("/bytes/100", ""),
                &get("/chunked", ""),
                &get("/status/204", ""),
                &get("/status/304", ""),
                &get("/status/599", ""),
                &get("/hop", ""),
                LAST.as_bytes(),
            ])],
            vec!["GET"; 8],
        ),
        (
            "large bodies",
            vec![cat(&[&get("/bytes/70000", ""), &get("/bytes/1048576", ""), LAST.as_bytes()])],
            vec!["GET"; 3],
        ),
        (
            "forwarding and forged headers",
            vec![
                get(
                    "/echo/f",
                    "X-Forwarded-For: 203.0.113.9\r\nSluice-Admission: forged\r\nSluice-Seq: 1\r\nX-Forwarded-Proto: https\r\nForwarded: for=1.2.3.4\r\nCookie: a=b\r\nCookie: c=d\r\nTE: trailers\r\nProxy-Authorization: x\r\nKeep-Alive: timeout=5\r\nX-Request-Id: given-by-client\r\n",
                ),
                LAST.into(),
            ],
            vec!["GET", "GET"],
        ),
        (
            "connection close midway",
            vec![cat(&[
                &get("/echo/1", ""),
                &get("/echo/2", "Connection: close\r\n"),
                &get("/echo/never", ""),
            ])],
            vec!["GET"; 3],
        ),
        (
            "connection keep-alive and a name hyper must see",
            vec![cat(&[
                &get("/echo/1", "Connection: keep-alive\r\n"),
                &get("/echo/2", "Connection: x-private\r\nX-Private: 1\r\n"),
                LAST.as_bytes(),
            ])],
            vec!["GET"; 3],
        ),
        (
            "a body midway hands the connection to hyper",
            vec![cat(&[
                &get("/echo/1", ""),
                b"POST /echo/post HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 5\r\n\r\nhello",
                &get("/echo/3", ""),
                LAST.as_bytes(),
            ])],
            vec!["GET", "POST", "GET", "GET"],
        ),
        (
            "get with content-length and with chunked body",
            vec![cat(&[
                b"GET /echo/cl HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 3\r\n\r\nabc",
                b"GET /echo/te HTTP/1.1\r\nHost: shop.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n",
                LAST.as_bytes(),
            ])],
            vec!["GET"; 3],
        ),
        (
            "smuggling: content-length and transfer-encoding",
            vec![cat(&[
                // hyper reads it as chunked and closes after it (nothing is
                // sent after it: bytes unread at a close would reset the
                // connection, and the answer with it).
                b"GET /echo/a HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            ])],
            vec!["GET"],
        ),
        (
            "smuggling: duplicate content-length",
            vec![cat(&[
                &get("/echo/first", ""),
                b"GET /echo/a HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 0\r\nContent-Length: 40\r\n\r\n",
            ])],
            vec!["GET"; 2],
        ),
        (
            "obs-fold and bad names",
            vec![cat(&[
                &get("/echo/ok", ""),
                b"GET /echo/fold HTTP/1.1\r\nHost: shop.test\r\nX-A: 1\r\n  continued\r\n\r\n",
            ])],
            vec!["GET"; 2],
        ),
        (
            "bad header name",
            vec![cat(&[&get("/echo/ok", ""), b"GET /echo/b HTTP/1.1\r\nHo st: x\r\n\r\n"])],
            vec!["GET"; 2],
        ),
        (
            "bare LF",
            vec![b"GET /echo/lf HTTP/1.1\nHost: shop.test\n\n".to_vec(), LAST.into()],
            vec!["GET"; 2],
        ),
        (
            "http/1.0",
            vec![cat(&[
                b"GET /echo/10 HTTP/1.0\r\nHost: shop.test\r\nConnection: keep-alive\r\n\r\n",
                b"GET /echo/10b HTTP/1.0\r\nHost: shop.test\r\n\r\n",
            ])],
            vec!["GET"; 2],
        ),
        (
            "absolute form and asterisk",
            vec![cat(&[
                b"GET http://other.test/echo/abs?q=1 HTTP/1.1\r\nHost: shop.test\r\n\r\n",
                b"OPTIONS * HTTP/1.1\r\nHost: shop.test\r\n\r\n",
                LAST.as_bytes(),
            ])],
            vec!["GET", "OPTIONS", "GET"],
        ),
        (
            "expect 100-continue",
            vec![
                b"POST /echo/e HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
                    .to_vec(),
                b"hi".to_vec(),
                LAST.into(),
            ],
            vec!["POST", "GET"],
        ),
        (
            "a head in pieces",
            vec![
                b"GET /echo/pie".to_vec(),
                b"ces HTTP/1.1\r\nHo".to_vec(),
                b"st: shop.test\r\nX-B: 2\r\n".to_vec(),
                b"\r\n".to_vec(),
                LAST.into(),
            ],
            vec!["GET"; 2],
        ),
        (
            "the gateway's own endpoints",
            vec![cat(&[
                &get("/_sluice/healthz", ""),
                &get("/_sluice/nope", ""),
                &get("/_sluice/openapi.json", ""),
                b"HEAD /_sluice/healthz HTTP/1.1\r\nHost: shop.test\r\n\r\n",
                b"DELETE /_sluice/healthz HTTP/1.1\r\nHost: shop.test\r\n\r\n",
                LAST.as_bytes(),
            ])],
            vec!["GET", "GET", "GET", "HEAD", "DELETE", "GET"],
        ),
        (
            "high bytes in a value and a raw space in the target",
            vec![cat(&[
                b"GET /echo/hi HTTP/1.1\r\nHost: shop.test\r\nX-Name: caf\xc3\xa9\r\n\r\n",
                b"GET /echo/a b HTTP/1.1\r\nHost: shop.test\r\n\r\n",
            ])],
            vec!["GET"; 2],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_answers_are_hypers_for_every_shape() {
    let pair = Pair::start().await;
    for (name, pieces, methods) in scripts() {
        let (native, hyper) = pair.both(&pieces, &methods).await;
        assert!(!hyper.is_empty(), "{name}: hyper answered nothing");
        assert_eq!(native, hyper, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_past_the_bounds_is_hypers_to_refuse() {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .unguarded()
        .config(|c| {
            c.limits.max_header_bytes = 2048;
            c.limits.max_headers = 10;
        })
        .spawn()
        .await;
    let many: String = (0..11).map(|i| format!("X-{i}: v\r\n")).collect();
    let long = format!("X-Long: {}\r\n", "a".repeat(3000));
    for (extra, want) in [
        (many.as_str(), 431),
        (long.as_str(), 431),
        ("X-Few: 1\r\n", 200),
    ] {
        let got = exchange(
            gw.addr,
            &[get("/echo/x", extra), LAST.into()],
            &["GET", "GET"],
        )
        .await;
        assert!(
            got[0].head[0].contains(&format!(" {want} ")),
            "{extra:.20}: {:?}",
            got[0].head
        );
    }
}

/// One request of a generated connection.
#[derive(Clone, Debug)]
struct Gen {
    method: &'static str,
    path: &'static str,
    query: Option<String>,
    fields: Vec<(String, String)>,
    body: Option<Vec<u8>>,
}

fn gen_request() -> impl Strategy<Value = Gen> {
    let method = prop::sample::select(vec!["GET", "GET", "GET", "HEAD", "POST", "OPTIONS"]);
    let path = prop::sample::select(vec![
        "/echo/g",
        "/bytes/0",
        "/bytes/17",
        "/bytes/20000",
        "/chunked",
        "/status/204",
        "/status/304",
        "/status/404",
        "/status/502",
        "/hop",
        "/_sluice/healthz",
        "/nope",
    ]);
    let query = prop::option::of("[a-z0-9=&%]{0,12}");
    let name = prop::sample::select(vec![
        "x-a",
        "X-Mixed-Case",
        "accept",
        "cookie",
        "user-agent",
        "x-forwarded-for",
        "forwarded",
        "sluice-admission",
        "te",
        "keep-alive",
        "connection",
        "host",
        "x-request-id",
    ]);
    let value = prop::sample::select(vec![
        "1",
        // (no `close`: a request sent after the gateway closed would reset
        // the connection and lose answers with it; the fixed shapes test it)
        "keep-alive",
        "trailers",
        "a=b; c=d",
        "198.51.100.7",
        "for=192.0.2.1",
        " spaced ",
        "",
        "x-a",
    ]);
    let fields = prop::collection::vec((name, value), 0..5);
    let body = prop::option::weighted(0.15, prop::collection::vec(any::<u8>(), 0..64));
    (method, path, query, fields, body).prop_map(|(method, path, query, fields, body)| Gen {
        method,
        path,
        query,
        fields: fields
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect(),
        body,
    })
}

fn encode(g: &Gen) -> Vec<u8> {
    let mut out = format!("{} {}", g.method, g.path);
    if let Some(q) = &g.query {
        out.push('?');
        out.push_str(q);
    }
    out.push_str(" HTTP/1.1\r\nHost: shop.test\r\n");
    for (n, v) in &g.fields {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    let mut bytes = out.into_bytes();
    if let Some(b) = &g.body {
        bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", b.len()).as_bytes());
        bytes.extend_from_slice(b);
    } else {
        bytes.extend_from_slice(b"\r\n");
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any connection of plain and other requests, pipelined or one by
    /// one: the same answers from both servers.
    #[test]
    fn any_connection_gets_hypers_answers(
        reqs in prop::collection::vec(gen_request(), 1..6),
        pipelined in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (native, hyper) = rt.block_on(async {
            let pair = PAIR.get_or_init(|| std::sync::Mutex::new(None));
            let addrs = {
                let mut slot = pair.lock().unwrap();
                if slot.is_none() {
                    *slot = Some(std::thread::spawn(start_pair_thread).join().unwrap());
                }
                *slot.as_ref().unwrap()
            };
            let mut pieces: Vec<Vec<u8>> = reqs.iter().map(encode).collect();
            pieces.push(LAST.into());
            if pipelined {
                pieces = vec![pieces.concat()];
            }
            let mut methods: Vec<&str> = reqs.iter().map(|g| g.method).collect();
            methods.push("GET");
            let a = exchange(addrs.0, &pieces, &methods).await;
            let b = exchange(addrs.1, &pieces, &methods).await;
            (a, b)
        });
        prop_assert!(!hyper.is_empty());
        prop_assert_eq!(native, hyper);
    }
}

/// The two gateways of the property, started once on a runtime of their
/// own that lives as long as the test binary.
static PAIR: std::sync::OnceLock<
    std::sync::Mutex<Option<(std::net::SocketAddr, std::net::SocketAddr)>>,
> = std::sync::OnceLock::new();

fn start_pair_thread() -> (std::net::SocketAddr, std::net::SocketAddr) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let pair = Pair::start().await;
            tx.send((pair.native.addr, pair.hyper.addr)).unwrap();
            // Served until the test binary exits.
            std::future::pending::<()>().await;
            drop(pair);
        });
    });
    rx.recv().unwrap()
}
