//! Open-loop hold load for `tests/bench/holds_knee.sh`: POSTs `{"qty":1}`
//! to one URL at a fixed offered rate over a fixed number of keep-alive
//! connections, each request with the next admission token of a file as its
//! bearer token, and reports latency measured from each request's intended
//! send time (corrected for coordinated omission).
//!
//! Usage: `open_loop URL TOKENS_FILE RATE SECONDS CONNECTIONS [THREADS]`
//!
//! Our own rather than `oha -q … --latency-correction`: oha sends the same
//! headers with every request, and a hold needs a visitor's token: one
//! visitor taking every hold would measure a visitor index of hundreds of
//! thousands of holds, not a sale (and installing oha is a long build).
//!
//! Each request is written as bytes made once per token, and each answer
//! read by httparse on the connection's own task (no HTTP client, no task
//! hop per request): the generator runs on the same cores as the gateway
//! and Redis, and what it spends per request is taken from them (it
//! prints that cost, `cpu_us`). With hyper's client it spent about half of
//! what the gateway spends per hold (README, "The knee of holds").
//!
//! Request `i` is due at `start + i / RATE`. Each connection takes the next
//! due request, waits for its time if it has not come (tokio's timer: up to
//! ~1 ms late, which counts in the latency), sends it and records
//! `answered - due` in an HDR histogram. When the server falls behind, due
//! times pile up and the latency of every late request includes its wait,
//! as a visitor's would. Requests still unsent 5 s after the last one was
//! due are not sent: each is recorded with `stop - due` (a lower bound of
//! the latency it would have seen) and counted as `unsent`.
//!
//! Prints one line:
//! `OPENLOOP offered=… seconds=… completed=… achieved=… p50_ms=… p99_ms=…
//! max_ms=… errors=… unsent=… statuses=201=…,409=… cpu_us=…`; achieved =
//! answers / (last answer - start), cpu_us = this process's own CPU (user +
//! system, from /proc/self/stat) per answer: on a machine whose cores the
//! generator shares with the server, what the load itself takes from them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// How long after the last due time a backlog is still sent.
const GRACE: Duration = Duration::from_secs(5);

struct Shared {
    authority: String,
    /// One whole request per token, written as it is.
    requests: Vec<Vec<u8>>,
    start: Instant,
    /// Nanoseconds between due times.
    gap_ns: f64,
    total: u64,
    stop: Instant,
    next: AtomicU64,
}

impl Shared {
    fn due(&self, i: u64) -> Instant {
        self.start + Duration::from_nanos((i as f64 * self.gap_ns) as u64)
    }
}

#[derive(Default)]
struct Tally {
    hist: Option<Histogram<u64>>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    unsent: u64,
    last: Option<Instant>,
}

fn histogram() -> Histogram<u64> {
    // microseconds, up to 10 minutes, 3 significant digits
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        eprintln!("usage: open_loop URL TOKENS_FILE RATE SECONDS CONNECTIONS [THREADS]");
        std::process::exit(64);
    }
    let threads: usize = args.get(5).map_or(2, |t| t.parse().expect("threads"));
    let cpu0 = cpu_ticks();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(&args, cpu0));
}

/// utime + stime of this process, in clock ticks (0 where /proc is not).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    n(11) + n(12)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
const TICKS_PER_S: f64 = 100.0;

async fn run(args: &[String], cpu0: u64) {
    let url: hyper::Uri = args[0].parse().expect("URL");
    assert_eq!(url.scheme_str(), Some("http"), "an http:// URL");
    let authority = url.authority().expect("URL with a host").to_string();
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    let body = b"{\"qty\":1}";
    let requests: Vec<Vec<u8>> = std::fs::read_to_string(&args[1])
        .expect("tokens file")
        .lines()
        .filter(|l| !l.is_empty())
        .map(|t| {
            let mut r = format!(
                "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n\
                 authorization: Bearer {t}\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            r.extend_from_slice(body);
            r
        })
        .collect();
    assert!(!requests.is_empty(), "no tokens in {}", args[1]);
    let rate: f64 = args[2].parse().expect("rate");
    let seconds: f64 = args[3].parse().expect("seconds");
    let conns: usize = args[4].parse().expect("connections");
    let total = (rate * seconds).round() as u64;
    // Connect first, so the schedule starts with every connection open.
    let mut streams = Vec::with_capacity(conns);
    for _ in 0..conns {
        streams.push(
            tokio::net::TcpStream::connect(&authority)
                .await
                .expect("connect"),
        );
    }
    let start = Instant::now() + Duration::from_millis(20);
    let shared = Arc::new(Shared {
        authority,
        requests,
        start,
        gap_ns: 1e9 / rate,
        total,
        stop: start + Duration::from_secs_f64(seconds) + GRACE,
        next: AtomicU64::new(0),
    });
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|s| tokio::spawn(connection(shared.clone(), s)))
        .collect();
    let mut all = Tally {
        hist: Some(histogram()),
        ..Tally::default()
    };
    for t in tasks {
        let t = t.await.expect("connection task");
        if let (Some(a), Some(h)) = (all.hist.as_mut(), t.hist.as_ref()) {
            a.add(h).expect("merge");
        }
        for (s, n) in t.statuses {
            *all.statuses.entry(s).or_default() += n;
        }
        all.errors += t.errors;
        all.unsent += t.unsent;
        all.last = all.last.max(t.last);
    }
    let h = all.hist.expect("histogram");
    let completed: u64 = all.statuses.values().sum();
    let elapsed = all
        .last
        .map_or(seconds, |l| l.duration_since(start).as_secs_f64());
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let statuses: Vec<String> = all
        .statuses
        .iter()
        .map(|(s, n)| format!("{s}={n}"))
        .collect();
    println!(
        "OPENLOOP offered={rate:.0} seconds={seconds} completed={completed} achieved={:.1} \
         p50_ms={:.3} p99_ms={:.3} max_ms={:.3} errors={} unsent={} statuses={} cpu_us={:.1}",
        completed as f64 / elapsed.max(1e-9),
        ms(0.5),
        ms(0.99),
        h.max() as f64 / 1000.0,
        all.errors,
        all.unsent,
        statuses.join(","),
        (cpu_ticks() - cpu0) as f64 / TICKS_PER_S * 1e6 / completed.max(1) as f64
    );
}

/// One keep-alive connection: takes due requests until none are left.
async fn connection(s: Arc<Shared>, stream: tokio::net::TcpStream) -> Tally {
    let mut t = Tally {
        hist: Some(histogram()),
        ..Tally::default()
    };
    let _ = stream.set_nodelay(true);
    let mut conn = Some(stream);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= s.total {
            break;
        }
        let due = s.due(i);
        let now = Instant::now();
        if now >= s.stop {
            // Past the hard stop: this request is never sent; it waited at
            // least this long.
            let waited = s.stop.saturating_duration_since(due);
            let h = t.hist.as_mut().expect("histogram");
            h.saturating_record(waited.as_micros().max(1) as u64);
            t.unsent += 1;
            continue;
        }
        if due > now {
            tokio::time::sleep_until(due.into()).await;
        }
        let tcp = match conn.as_mut() {
            Some(tcp) => tcp,
            None => match tokio::net::TcpStream::connect(&s.authority).await {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    buf.clear();
                    conn.insert(tcp)
                }
                Err(_) => {
                    t.errors += 1;
                    continue;
                }
            },
        };
        let request = &s.requests[(i as usize) % s.requests.len()];
        // Bounded: an answer that never comes is an error by the time
        // the backlog is given up on, never a hang.
        let answer =
            tokio::time::timeout_at((s.stop + GRACE).into(), exchange(tcp, request, &mut buf))
                .await
                .ok()
                .flatten();
        let done = Instant::now();
        match answer {
            Some(status) => {
                *t.statuses.entry(status).or_default() += 1;
                t.last = Some(done);
                let us = done.saturating_duration_since(due).as_micros().max(1) as u64;
                t.hist.as_mut().expect("histogram").saturating_record(us);
            }
            None => {
                t.errors += 1;
                conn = None;
            }
        }
    }
    t
}

/// Writes one request and reads its answer: the status, once the whole
/// body (`Content-Length` or chunked) is in; `None` on any error, a
/// malformed answer or one that asks to close (the caller reconnects).
/// Bytes past the answer stay in `buf` (an answer never has any here: one
/// request is in flight per connection).
async fn exchange(
    tcp: &mut tokio::net::TcpStream,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> Option<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    tcp.write_all(request).await.ok()?;
    loop {
        if let Some((status, len, close)) = answered(buf)? {
            buf.drain(..len);
            return (!close).then_some(status);
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        if tcp.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

/// `Some(Some((status, bytes, close)))` when `buf` starts with one whole
/// answer; `Some(None)` when more bytes are needed; `None` when it is
/// malformed. Parsed with httparse, the parser hyper itself uses.
fn answered(buf: &[u8]) -> Option<Option<(u16, usize, bool)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut headers);
    let head = match res.parse(buf).ok()? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Some(None),
    };
    let status = res.code?;
    let mut length = None;
    let mut chunked = false;
    let mut close = false;
    for h in res.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = Some(
                std::str::from_utf8(h.value)
                    .ok()?
                    .trim()
                    .parse::<usize>()
                    .ok()?,
            );
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = h.value.eq_ignore_ascii_case(b"close");
        }
    }
    let body = &buf[head..];
    if chunked {
        // chunk-size [; ext] CRLF data CRLF …, ending with a 0-size chunk
        // and the (empty here) trailer's CRLF
        let mut at = 0;
        loop {
            let Some(eol) = body[at..].windows(2).position(|w| w == b"\r\n") else {
                return Some(None);
            };
            let line = std::str::from_utf8(&body[at..at + eol]).ok()?;
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            at += eol + 2;
            if size == 0 {
                let Some(end) = body[at..].windows(2).position(|w| w == b"\r\n") else {
                    return Some(None);
                };
                // trailers are not expected: only the final CRLF
                return Some((end == 0).then_some((status, head + at + 2, close)));
            }
            if body.len() < at + size + 2 {
                return Some(None);
            }
            at += size + 2;
        }
    }
    let length = length.unwrap_or(0);
    if body.len() < length {
        return Some(None);
    }
    Some(Some((status, head + length, close)))
}
