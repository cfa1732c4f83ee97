//! The load side of `tests/bench/streams.sh`: what one waiting visitor
//! costs a gateway when it streams its status rather than polls it.
//!
//! Usage: `stream_bench BASE_URL ROOM ADMIN_TOKEN GATEWAY_PID N WINDOW_SECONDS [STREAMS_PER_CONNECTION]`
//!
//! With `N` visitors waiting in a room that admits nobody (rate 0), in
//! this order:
//!
//! 1. joins them all (the room asks for almost no work), then each polls
//!    once, as the page does after its join;
//! 2. **polled**: every visitor polls at the `poll_after_ms` its last
//!    answer asked for, over a shared pool of keep-alive connections (the
//!    kindest case for polling: no connection set up per poll), and the
//!    gateway's CPU time (`/proc/PID/stat` utime + stime) is taken over
//!    `WINDOW_SECONDS`;
//! 3. **memory**: the gateway's RSS (`/proc/PID/status` `VmRSS`) before any
//!    stream, then at 10,000, 50,000 and 100,000 open idle streams (those
//!    of them at most `N`) and at `N`, each stream a raw connection from
//!    one of several loopback source addresses (127.0.0.2, .3, …; one
//!    address has about 28,000 ephemeral ports); with
//!    `STREAMS_PER_CONNECTION` above 1, the streams are requests on HTTP/2
//!    connections (prior knowledge), that many on each: a file descriptor
//!    per connection rather than per stream, so a host whose file limit
//!    is below N can still hold N streams open (what is then measured is a
//!    stream's cost without its own connection's);
//! 4. **pushed**: the gateway's CPU time over `WINDOW_SECONDS` while the
//!    same visitors wait streamed;
//! 5. **fan-out**: the room is paused through the admin API and the time
//!    until every stream has heard `paused` is taken, then resumed, until
//!    every stream has heard `waiting` again (a state change wakes every
//!    stream of the room at once: the widest fan-out there is).
//!
//! Prints one line per figure; no timing is asserted anywhere (the
//! script prints the ratios). A raw socket per stream rather than an HTTP
//! client keeps the load side's own memory and CPU small beside the
//! gateway's on a shared 2-core machine.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http::{Method, Request};
use sluice_tests::client::{TestClient, empty};
use sluice_tests::visitor::Visitor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Joins, polls and stream opens in flight at once.
const CONCURRENCY: usize = 64;
/// Streams per loopback source address (of about 28,000 ephemeral ports).
const PER_ADDRESS: usize = 20_000;
/// The longest the bench waits for a fan-out to reach every stream.
const FANOUT_LIMIT: Duration = Duration::from_secs(20);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (per_conn, args) = match args.as_slice() {
        [rest @ .., last] if rest.len() == 6 => (last.parse::<usize>()?.max(1), rest),
        all => (1, all),
    };
    let [base, room, admin, pid, n, window] = args else {
        anyhow::bail!(
            "usage: stream_bench BASE_URL ROOM ADMIN_TOKEN GATEWAY_PID N WINDOW_SECONDS [STREAMS_PER_CONNECTION]"
        );
    };
    let pid: u32 = pid.parse()?;
    let n: usize = n.parse()?;
    let window = Duration::from_secs_f64(window.parse()?);
    let clk_tck: f64 = std::env::var("CLK_TCK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100.0);
    let gw = Gateway { pid, clk_tck };
    let addr: SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .map_err(|e| anyhow::anyhow!("BASE_URL must be http://IP:PORT: {e}"))?;
    let client = TestClient::new();

    // 1. The crowd.
    let rss_start = gw.rss()?;
    let started = Instant::now();
    let visitors = join_all(&client, base, room, n).await?;
    println!(
        "joined    {n} visitors in {:.1} s ({:.0}/s)",
        started.elapsed().as_secs_f64(),
        n as f64 / started.elapsed().as_secs_f64()
    );
    let rss_joined = gw.rss()?;
    println!(
        "rss       {} before the joins, {} with {n} waiting (queue and token cache: {:.0} B per visitor)",
        kib(rss_start),
        kib(rss_joined),
        rss_joined.saturating_sub(rss_start) as f64 / n as f64
    );

    // 2. Polled.
    let polled = poll_phase(&client, base, room, &visitors, &gw, window).await?;
    drop(client);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 3. Memory.
    let hub = Arc::new(Hub::default());
    let rss_before = gw.rss()?;
    println!(
        "rss       {} before any stream (after the polls)",
        kib(rss_before)
    );
    let mut marks: Vec<usize> = [10_000, 50_000, 100_000]
        .into_iter()
        .filter(|&m| m < n)
        .collect();
    marks.push(n);
    let addresses = n.div_ceil(PER_ADDRESS).max(4);
    let mut opened_to = 0;
    let mut tasks = Vec::with_capacity(n);
    let gate = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let open_started = Instant::now();
    let mut per_stream = Vec::new();
    let mut h2 = None;
    let mut connections = 0usize;
    for m in marks {
        while opened_to < m {
            let token = visitors[opened_to].0.clone();
            let src = Ipv4Addr::new(127, 0, 0, 2 + (opened_to % addresses) as u8);
            let permit = gate.clone().acquire_owned().await?;
            if per_conn > 1 {
                if opened_to % per_conn == 0 {
                    h2 = Some(h2_connection(addr, src).await?);
                    connections += 1;
                }
                let send = h2.clone().expect("an HTTP/2 connection");
                tasks.push(tokio::spawn(stream_h2(
                    send,
                    addr,
                    room.clone(),
                    token,
                    hub.clone(),
                    permit,
                )));
            } else {
                connections += 1;
                tasks.push(tokio::spawn(stream(
                    addr,
                    src,
                    room.clone(),
                    token,
                    hub.clone(),
                    permit,
                )));
            }
            opened_to += 1;
        }
        while hub.opened.load(Ordering::Acquire) + hub.failed.load(Ordering::Acquire) < m {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Let the I/O settle (every first event written, the accept queue
        // empty) before reading the resident set.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let open = hub.opened.load(Ordering::Acquire);
        let rss = gw.rss()?;
        let per = rss.saturating_sub(rss_before) as f64 / open.max(1) as f64;
        per_stream.push(per);
        println!(
            "rss       {} with {open} idle streams: {per:.0} B per stream ({} refused or failed)",
            kib(rss),
            hub.failed.load(Ordering::Acquire)
        );
    }
    let open = hub.opened.load(Ordering::Acquire);
    println!(
        "opened    {open} streams on {connections} {} connections from {addresses} source addresses in {:.1} s",
        if per_conn > 1 { "HTTP/2" } else { "HTTP/1.1" },
        open_started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(open > 0, "no stream opened: see the gateway's log");

    // 4. Pushed.
    let events_before = hub.events.load(Ordering::Acquire);
    let bytes_before = hub.bytes.load(Ordering::Acquire);
    let cpu0 = gw.cpu_seconds()?;
    tokio::time::sleep(window).await;
    let pushed_cpu = gw.cpu_seconds()? - cpu0;
    let events = hub.events.load(Ordering::Acquire) - events_before;
    let bytes = hub.bytes.load(Ordering::Acquire) - bytes_before;
    let secs = window.as_secs_f64();
    println!(
        "pushed    {open} waiting streamed: gateway CPU {pushed_cpu:.2} s over {secs:.0} s ({:.1}% of a core), \
         {:.0} events and heartbeats/s, {:.0} B/s",
        pushed_cpu / secs * 100.0,
        events as f64 / secs,
        bytes as f64 / secs
    );

    // 5. Fan-out.
    let admin_client = TestClient::new();
    // This process, read the same way: on a shared machine the load's own
    // reading of every event is part of the time a fan-out takes.
    let own = Gateway {
        pid: std::process::id(),
        clk_tck: gw.clk_tck,
    };
    for (phase, paused, state) in [(1u8, true, "paused"), (2, false, "waiting")] {
        hub.arrivals.lock().expect("arrivals").clear();
        hub.phase.store(phase, Ordering::Release);
        let (gw_cpu0, load_cpu0) = (gw.cpu_seconds()?, own.cpu_seconds()?);
        let sent = Instant::now();
        let res = admin_client
            .call(
                Method::PATCH,
                &format!("{base}/_sluice/admin/rooms/{room}"),
                &[
                    ("authorization", &format!("Bearer {admin}")),
                    ("content-type", "application/json"),
                ],
                sluice_tests::client::body(format!("{{\"paused\":{paused}}}")),
            )
            .await;
        anyhow::ensure!(res.status == 200, "PATCH paused: {}", res.text());
        let answered = sent.elapsed();
        let open = hub.opened.load(Ordering::Acquire) - hub.ended.load(Ordering::Acquire);
        while hub.arrivals.lock().expect("arrivals").len() < open && sent.elapsed() < FANOUT_LIMIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (gw_cpu, load_cpu) = (gw.cpu_seconds()? - gw_cpu0, own.cpu_seconds()? - load_cpu0);
        let mut times: Vec<f64> = hub
            .arrivals
            .lock()
            .expect("arrivals")
            .iter()
            .map(|t| t.duration_since(sent).as_secs_f64() * 1000.0)
            .collect();
        times.sort_by(f64::total_cmp);
        let q = |p: f64| {
            times.get(((times.len() as f64 * p) as usize).min(times.len().saturating_sub(1)))
        };
        match (times.first(), q(0.5), q(0.99), times.last()) {
            (Some(first), Some(p50), Some(p99), Some(last)) => println!(
                "fanout    {state}: {} of {open} streams heard it; after the PATCH (answered in {:.0} ms): \
                 first {first:.0} ms, p50 {p50:.0} ms, p99 {p99:.0} ms, last {last:.0} ms (spread {:.0} ms); \
                 CPU meanwhile: gateway {:.0} ms, this load {:.0} ms",
                times.len(),
                answered.as_secs_f64() * 1000.0,
                last - first,
                gw_cpu * 1000.0,
                load_cpu * 1000.0
            ),
            _ => println!("fanout    {state}: no stream heard it within {FANOUT_LIMIT:?}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    hub.phase.store(0, Ordering::Release);

    println!(
        "summary   streams {open}; bytes per idle stream {}; CPU pushed/polled {:.2} ({pushed_cpu:.2} s / {:.2} s over {secs:.0} s)",
        per_stream
            .iter()
            .map(|p| format!("{p:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        pushed_cpu / polled.max(1e-9),
        polled
    );
    for t in tasks {
        t.abort();
    }
    Ok(())
}

/// A process (the gateway's, or this one), read from `/proc`.
struct Gateway {
    pid: u32,
    clk_tck: f64,
}

impl Gateway {
    /// Resident set, bytes.
    fn rss(&self) -> anyhow::Result<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kb = s
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| anyhow::anyhow!("no VmRSS for pid {}", self.pid))?;
        Ok(kb * 1024)
    }

    /// User and system CPU time so far, seconds.
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        // Fields after the command's closing parenthesis: state is field 3,
        // utime and stime fields 14 and 15.
        let rest = s
            .rsplit_once(')')
            .map(|(_, r)| r)
            .ok_or_else(|| anyhow::anyhow!("unreadable /proc/{}/stat", self.pid))?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
        Ok(ticks as f64 / self.clk_tck)
    }
}

fn kib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Joins `n` visitors; each one's queue token and the `poll_after_ms` of
/// its first poll.
async fn join_all(
    client: &TestClient,
    base: &str,
    room: &str,
    n: usize,
) -> anyhow::Result<Vec<(String, u64)>> {
    let joined: Vec<Option<(String, u64)>> = futures_util::stream::iter(0..n)
        .map(|_| async {
            let mut v = Visitor::with_client(base, room, client.clone());
            let res = v.join("/").await;
            if res.status != 201 {
                eprintln!("join: {} {}", res.status, res.text());
                return None;
            }
            let token = v.queue_token.clone()?;
            let res = v.status().await;
            let body = res.json();
            if body["state"] != "waiting" {
                eprintln!("first poll: {} {}", res.status, res.text());
                return None;
            }
            Some((token, body["poll_after_ms"].as_u64().unwrap_or(1_000)))
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let joined: Vec<(String, u64)> = joined.into_iter().flatten().collect();
    anyhow::ensure!(
        joined.len() == n,
        "only {} of {n} visitors joined and wait (the room must admit nobody)",
        joined.len()
    );
    Ok(joined)
}

/// Every visitor polling at its `poll_after_ms` for a while; the
/// gateway's CPU seconds over `window` once the polls are spread.
async fn poll_phase(
    client: &TestClient,
    base: &str,
    room: &str,
    visitors: &[(String, u64)],
    gw: &Gateway,
    window: Duration,
) -> anyhow::Result<f64> {
    let polls = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let url = format!("{base}/_sluice/rooms/{room}/status");
    // Settle for one longest interval, so the window sees the steady rate.
    let settle = Duration::from_millis(visitors.iter().map(|v| v.1).max().unwrap_or(1_000));
    let stop = Instant::now() + settle + window + Duration::from_secs(1);
    let tasks: Vec<_> = visitors
        .iter()
        .map(|(token, first)| {
            let (client, url, polls, failed) =
                (client.clone(), url.clone(), polls.clone(), failed.clone());
            let auth = format!("Bearer {token}");
            // Visitors joined at different moments: the first poll falls
            // anywhere within the interval asked.
            let mut next =
                Instant::now() + Duration::from_millis(rand::random_range(0..(*first).max(1)));
            tokio::spawn(async move {
                while next < stop {
                    tokio::time::sleep_until(next.into()).await;
                    let req = Request::builder()
                        .method(Method::GET)
                        .uri(&url)
                        .header("authorization", &auth)
                        .body(empty())
                        .expect("request");
                    let wait = match client.try_send(req).await {
                        Some(a) if a.status == 200 => {
                            polls.fetch_add(1, Ordering::Relaxed);
                            a.json()["poll_after_ms"].as_u64().unwrap_or(1_000)
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            1_000
                        }
                    };
                    next = Instant::now() + Duration::from_millis(wait);
                }
            })
        })
        .collect();
    tokio::time::sleep(settle).await;
    let (cpu0, polls0) = (gw.cpu_seconds()?, polls.load(Ordering::Relaxed));
    tokio::time::sleep(window).await;
    let cpu = gw.cpu_seconds()? - cpu0;
    let n = polls.load(Ordering::Relaxed) - polls0;
    let secs = window.as_secs_f64();
    for t in tasks {
        t.abort();
    }
    println!(
        "polled    {} waiting polling at poll_after_ms: gateway CPU {cpu:.2} s over {secs:.0} s ({:.1}% of a core), \
         {:.0} polls/s ({} failed)",
        visitors.len(),
        cpu / secs * 100.0,
        n as f64 / secs,
        failed.load(Ordering::Relaxed)
    );
    Ok(cpu)
}

/// What the streams tell the bench.
#[derive(Default)]
struct Hub {
    opened: AtomicUsize,
    failed: AtomicUsize,
    /// Streams the gateway ended.
    ended: AtomicUsize,
    /// Events and heartbeats received, and their bytes.
    events: AtomicU64,
    bytes: AtomicU64,
    /// 1: waiting for `paused`; 2: for `waiting` again; 0: neither.
    phase: AtomicU8,
    /// When each stream heard this phase's state.
    arrivals: std::sync::Mutex<Vec<Instant>>,
}

/// One idle stream on a raw connection from `src`: opens it, tells the
/// hub, then reads until the gateway ends it or the task is aborted.
async fn stream(
    gateway: SocketAddr,
    src: Ipv4Addr,
    room: String,
    token: String,
    hub: Arc<Hub>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let mut events = Events::new(hub, permit, true);
    let conn = async {
        let s = tokio::net::TcpSocket::new_v4()?;
        s.bind(SocketAddr::from((src, 0)))?;
        s.connect(gateway).await
    };
    let mut conn = match conn.await {
        Ok(c) => c,
        Err(e) => return events.fail(&format!("from {src}: connect: {e}")),
    };
    let req = format!(
        "GET /_sluice/rooms/{room}/status HTTP/1.1\r\nhost: {gateway}\r\naccept: text/event-stream\r\n\
         authorization: Bearer {token}\r\n\r\n"
    );
    drop(token);
    if let Err(e) = conn.write_all(req.as_bytes()).await {
        return events.fail(&format!("from {src}: write: {e}"));
    }
    drop(req);
    let mut buf = vec![0u8; 1024];
    loop {
        let n = match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return events.closed(),
            Ok(n) => n,
        };
        if events.feed(&buf[..n]).is_err() {
            return;
        }
    }
}

/// An HTTP/2 connection (prior knowledge) from `src`, on which streams are
/// opened as requests; its driver runs as a task of its own.
async fn h2_connection(
    gateway: SocketAddr,
    src: Ipv4Addr,
) -> anyhow::Result<hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>> {
    let s = tokio::net::TcpSocket::new_v4()?;
    s.bind(SocketAddr::from((src, 0)))?;
    let tcp = s.connect(gateway).await?;
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(hyper_util::rt::TokioIo::new(tcp))
            .await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("h2 connection from {src}: {e}");
        }
    });
    Ok(send)
}

/// One idle stream as a request on a shared HTTP/2 connection: opens it,
/// tells the hub, then reads until the gateway ends it or the task is
/// aborted.
async fn stream_h2(
    mut send: hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    gateway: SocketAddr,
    room: String,
    token: String,
    hub: Arc<Hub>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    use http_body_util::BodyExt;
    let mut events = Events::new(hub, permit, false);
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("http://{gateway}/_sluice/rooms/{room}/status"))
        .header("accept", "text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Empty::new())
        .expect("request");
    drop(token);
    if let Err(e) = send.ready().await {
        return events.fail(&format!("h2 connection not ready: {e}"));
    }
    let res = match send.send_request(req).await {
        Ok(res) => res,
        Err(e) => return events.fail(&format!("h2 request: {e}")),
    };
    drop(send);
    if res.status() != 200 {
        return events.fail(&format!("h2 answer {}", res.status()));
    }
    let mut body = res.into_body();
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref()
                    && events.feed(data).is_err()
                {
                    return;
                }
            }
            Some(Err(_)) | None => return events.closed(),
        }
    }
}

/// One stream's bytes, read as event-stream lines: counts what the hub
/// counts and notes when this stream heard the phase's state.
struct Events {
    hub: Arc<Hub>,
    /// Held until the first event: the stream counts as opening until then.
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    line: Vec<u8>,
    /// Still in an HTTP/1 answer's head.
    head: bool,
    seen_phase: u8,
}

impl Events {
    fn new(hub: Arc<Hub>, permit: tokio::sync::OwnedSemaphorePermit, head: bool) -> Self {
        Events {
            hub,
            permit: Some(permit),
            line: Vec::new(),
            head,
            seen_phase: 0,
        }
    }

    fn fail(&self, why: &str) {
        if self.hub.failed.fetch_add(1, Ordering::AcqRel) < 5 {
            eprintln!("stream: {why}");
        }
    }

    /// The gateway ended the stream (or the connection went).
    fn closed(&self) {
        if self.permit.is_some() {
            self.fail("closed before its first event");
        } else {
            self.hub.ended.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Bytes as they came; `Err` when the answer was not a stream.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), ()> {
        let hub = &self.hub;
        hub.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        for &b in bytes {
            if b != b'\n' {
                if self.line.len() < 4096 {
                    self.line.push(b);
                }
                continue;
            }
            let l = std::mem::take(&mut self.line);
            if self.head {
                if l.starts_with(b"HTTP/1.1 ") && !l.starts_with(b"HTTP/1.1 200") {
                    self.fail(&String::from_utf8_lossy(&l));
                    return Err(());
                }
                self.head = l != b"\r";
                continue;
            }
            if l.starts_with(b":") || l.starts_with(b"data: ") {
                hub.events.fetch_add(1, Ordering::Relaxed);
            }
            if !l.starts_with(b"data: ") {
                continue;
            }
            if self.permit.take().is_some() {
                hub.opened.fetch_add(1, Ordering::AcqRel);
            }
            let phase = hub.phase.load(Ordering::Acquire);
            if phase > self.seen_phase {
                let want: &[u8] = if phase == 1 {
                    b"\"state\":\"paused\""
                } else {
                    b"\"state\":\"waiting\""
                };
                if l.windows(want.len()).any(|w| w == want) {
                    self.seen_phase = phase;
                    hub.arrivals.lock().expect("arrivals").push(Instant::now());
                }
            }
        }
        if self.line.capacity() > 4096 {
            self.line.shrink_to_fit();
        }
        Ok(())
    }
}
