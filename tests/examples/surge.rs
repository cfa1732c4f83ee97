//! The opening surge of a sale for `tests/bench/surge.sh`: replays the
//! first seconds of a `sluice simulate` run (its `--csv` series) against a
//! gateway, second by second: each visitor the series says joined in a
//! second loads the waiting page without a cookie (the HTML, then the
//! static files it links, as a first visit does), fetches a challenge,
//! solves it (the real proof of work, natively) and joins; the series'
//! status polls of that second are spread over it, each with the queue
//! token of a visitor already in line, round robin.
//!
//! Usage: `surge URL ROOM PAGE_PATH SIM_CSV SECONDS [--bare]`
//!
//! `--bare` sends the same requests (the page's files named in
//! `SURGE_ASSETS`, comma-separated: the `assets=` of the gateway's run), kind for kind and in the same
//! pattern, to a server that answers anything (`bench_tools hello`): no
//! proof is solved, the join carries a body of the same shape, and a poll
//! uses a made-up token. That is the baseline the gateway's CPU per visitor
//! is compared with.
//!
//! A visitor the room admits at once (join answered 200) is counted as
//! admitted (`admitted_at_once`) and has no token to poll with: only
//! visitors in line (201) poll. A poll due while nobody is in line is not
//! sent and counts as `poll_skipped` (a room admitting everyone at once
//! has no polls); it never waits for a token.
//!
//! The page and its static files are asked for compressed (`br, gzip`), as
//! a browser asks; the JSON calls without (this tool reads their bodies
//! and does not decompress). Until a waiting page has named its files,
//! pages are asked for uncompressed too and read for their links.
//!
//! Bounded: at most 512 visitors and 256 polls in flight (beyond, the
//! schedule waits: the run gets longer, never heavier), every request
//! times out after 30 s, and the run stops at the hard stop (ten times
//! SECONDS, plus 60 s) whatever is left: the schedule stops issuing
//! (waiting for a slot or for a request's time included), the tasks still
//! running are aborted and the process exits without waiting for a proof
//! of work still being solved. `drained=false` then says so.
//! Requests go over one pooled HTTP/1.1 client (keep-alive connections,
//! as many as are in flight).
//!
//! Prints one line: `SURGE visitors=… joined=… queued=… admitted_at_once=…
//! failed=… seconds=… page=… asset=… challenge=… join=… poll=…
//! poll_failed=… poll_skipped=… drained=… ms_p50_p99=… assets=…` (`joined` = answered
//! 201 or 200).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{Method, Request};
use parking_lot::Mutex;
use serde_json::json;
use sluice_tests::client::{Answer, TestClient, body, empty};

const VISITORS_IN_FLIGHT: usize = 512;
const POLLS_IN_FLIGHT: usize = 256;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Counts {
    page: AtomicU64,
    asset: AtomicU64,
    challenge: AtomicU64,
    join: AtomicU64,
    poll: AtomicU64,
    poll_failed: AtomicU64,
    poll_skipped: AtomicU64,
    /// Latencies in ms per kind (page, challenge, solve, join, poll).
    lat: [Mutex<Vec<u32>>; 5],
    queued: AtomicU64,
    at_once: AtomicU64,
    failed: AtomicU64,
}

struct Run {
    client: TestClient,
    base: String,
    room: String,
    page_path: String,
    bare: bool,
    /// The static files the page links (from the first waiting page).
    assets: Mutex<Option<Vec<String>>>,
    tokens: Mutex<Vec<String>>,
    next_poll: AtomicUsize,
    counts: Counts,
}

async fn send(
    run: &Run,
    method: Method,
    path: &str,
    auth: Option<&str>,
    b: Option<String>,
) -> Option<Answer> {
    // The JSON calls ask for no compression (this tool does not
    // decompress, and reads the challenge and the queue token).
    let mut req = Request::builder()
        .method(method)
        .uri(format!("{}{path}", run.base));
    if path.starts_with("/_sluice/static/") {
        req = req.header("accept-encoding", "br, gzip");
    }
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let body = match b {
        Some(s) => {
            req = req.header("content-type", "application/json");
            body(s)
        }
        None => empty(),
    };
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        run.client.try_send(req.body(body).expect("request")),
    )
    .await
    .ok()
    .flatten()
}

/// The `/_sluice/static/…` links of a page.
fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in html.split('"').skip(1).step_by(2) {
        if part.starts_with("/_sluice/static/") && !out.iter().any(|l| l == part) {
            out.push(part.to_owned());
        }
    }
    out
}

/// One visitor: page, its files, challenge, proof, join.
async fn visitor(run: Arc<Run>) {
    let c = &run.counts;
    // Until a waiting page has named its files, pages are asked for
    // uncompressed (this tool does not decompress) and read for links.
    let learning = !run.bare && run.assets.lock().is_none();
    let t = Instant::now();
    let page = {
        let mut req = Request::builder()
            .uri(format!("{}{}", run.base, run.page_path))
            .header("accept", "text/html,application/xhtml+xml");
        if !learning {
            req = req.header("accept-encoding", "br, gzip");
        }
        req = req.header("accept-language", "en");
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            run.client.try_send(req.body(empty()).expect("request")),
        )
        .await
        .ok()
        .flatten()
    };
    c.page.fetch_add(1, Ordering::Relaxed);
    lat(&run, 0, t);
    let Some(page) = page else {
        c.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if learning {
        let found = links(&page.text());
        if !found.is_empty() {
            run.assets.lock().get_or_insert(found);
        }
    }
    let assets = run.assets.lock().clone().unwrap_or_default();
    for asset in &assets {
        c.asset.fetch_add(1, Ordering::Relaxed);
        let _ = send(&run, Method::GET, asset, None, None).await;
    }
    let challenge_path = format!("/_sluice/rooms/{}/challenge", run.room);
    let t = Instant::now();
    let ch = send(&run, Method::POST, &challenge_path, None, Some("{}".into())).await;
    lat(&run, 1, t);
    c.challenge.fetch_add(1, Ordering::Relaxed);
    let join_body = if run.bare {
        // The shape of a real join body (a challenge of ~200 characters,
        // one solution).
        json!({"challenge": "c".repeat(200), "solutions": ["0000000000000000"], "return_to": "/"})
    } else {
        let Some(ch) = ch.filter(|a| a.status == 200) else {
            c.failed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let v = ch.json();
        let challenge = v["challenge"].as_str().unwrap_or_default().to_owned();
        let k = v["puzzles"].as_u64().unwrap_or(1) as u8;
        let bits = v["difficulty_bits"].as_u64().unwrap_or(1) as u8;
        let chal = challenge.clone();
        let t = Instant::now();
        let solutions = tokio::task::spawn_blocking(move || sluice_pow::solve(&chal, k, bits, 1))
            .await
            .expect("solver");
        lat(&run, 2, t);
        json!({"challenge": challenge, "solutions": solutions, "return_to": run.page_path})
    };
    let join_path = format!("/_sluice/rooms/{}/join", run.room);
    let t = Instant::now();
    let joined = send(
        &run,
        Method::POST,
        &join_path,
        None,
        Some(join_body.to_string()),
    )
    .await;
    lat(&run, 3, t);
    c.join.fetch_add(1, Ordering::Relaxed);
    let Some(joined) = joined else {
        c.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let token = if run.bare {
        Some("q".repeat(200))
    } else {
        match joined.status.as_u16() {
            201 => {
                c.queued.fetch_add(1, Ordering::Relaxed);
                serde_json::from_slice::<serde_json::Value>(&joined.body)
                    .ok()
                    .and_then(|v| v["queue_token"].as_str().map(str::to_owned))
            }
            200 => {
                c.at_once.fetch_add(1, Ordering::Relaxed);
                None
            }
            _ => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    };
    if run.bare && joined.status.is_success() {
        c.queued.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(t) = token {
        run.tokens.lock().push(format!("Bearer {t}"));
    }
}

/// One status poll with the next queued visitor's token; with nobody in
/// line yet it is skipped (`poll_skipped`): nobody could send it. It never
/// waits for a token: a waiting poll would hold its slot, the schedule
/// would stop behind the full poll slots, and the visitors who would bring
/// tokens would never be sent (the hang this replay once had).
async fn poll(run: Arc<Run>) {
    let token = {
        let t = run.tokens.lock();
        if t.is_empty() {
            drop(t);
            run.counts.poll_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let i = run.next_poll.fetch_add(1, Ordering::Relaxed) % t.len();
        t[i].clone()
    };
    let path = format!("/_sluice/rooms/{}/status", run.room);
    let t = Instant::now();
    let ok = send(&run, Method::GET, &path, Some(&token), None)
        .await
        .is_some_and(|a| a.status.is_success());
    lat(&run, 4, t);
    run.counts.poll.fetch_add(1, Ordering::Relaxed);
    if !ok {
        run.counts.poll_failed.fetch_add(1, Ordering::Relaxed);
    }
}

fn lat(run: &Run, kind: usize, since: Instant) {
    let ms = since.elapsed().as_millis().min(u128::from(u32::MAX)) as u32;
    run.counts.lat[kind].lock().push(ms);
}

/// `p50/p99` of the latencies of one kind, in ms.
fn quantiles(v: &Mutex<Vec<u32>>) -> String {
    let mut v = v.lock().clone();
    if v.is_empty() {
        return "-".into();
    }
    v.sort_unstable();
    let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
    format!("{}/{}", q(0.5), q(0.99))
}

/// `(joined, polls)` per second, from `sluice simulate --csv`.
fn plan(csv: &str, seconds: usize) -> Vec<(u64, u64)> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("a CSV header").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no column {name} in the CSV"))
    };
    let (joined, polls) = (col("joined"), col("polls"));
    lines
        .take(seconds)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let num = |i: usize| f[i].parse::<f64>().expect("a number").round() as u64;
            (num(joined), num(polls))
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        eprintln!("usage: surge URL ROOM PAGE_PATH SIM_CSV SECONDS [--bare]");
        std::process::exit(64);
    }
    let seconds: usize = args[4].parse().expect("seconds");
    let schedule = plan(&std::fs::read_to_string(&args[3]).expect("CSV"), seconds);
    let total: u64 = schedule.iter().map(|(j, _)| j).sum();
    let started = Instant::now();
    let hard_stop = started + Duration::from_secs(10 * seconds as u64 + 60);
    let run = Arc::new(Run {
        client: TestClient::new(),
        base: args[0].clone(),
        room: args[1].clone(),
        page_path: args[2].clone(),
        bare: args.get(5).is_some_and(|a| a == "--bare"),
        assets: Mutex::new(None),
        tokens: Mutex::new(Vec::new()),
        next_poll: AtomicUsize::new(0),
        counts: Counts::default(),
    });
    if run.bare {
        // The bare server's page links nothing: fetch what the gateway's
        // page links (the script passes them), so the counts match.
        let list: Vec<String> = std::env::var("SURGE_ASSETS")
            .unwrap_or_default()
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        *run.assets.lock() = Some(list);
    }
    let visitors_gate = Arc::new(tokio::sync::Semaphore::new(VISITORS_IN_FLIGHT));
    let polls_gate = Arc::new(tokio::sync::Semaphore::new(POLLS_IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    // Both kinds of request of one second, interleaved evenly over it;
    // everything (the wait for a request's time, the wait for a slot)
    // gives way to the hard stop.
    let scheduled = tokio::time::timeout_at(hard_stop.into(), async {
        for (sec, (joins, polls)) in schedule.iter().enumerate() {
            let n = joins + polls;
            for i in 0..n {
                // Joins and polls by Bresenham: the polls spread among joins.
                let is_poll = (i + 1) * polls / n.max(1) != i * polls / n.max(1);
                let due = started + Duration::from_secs_f64(sec as f64 + i as f64 / n as f64);
                tokio::time::sleep_until(due.into()).await;
                let gate = if is_poll { &polls_gate } else { &visitors_gate };
                let permit = gate.clone().acquire_owned().await.expect("semaphore");
                let r = run.clone();
                tasks.spawn(async move {
                    if is_poll {
                        poll(r).await;
                    } else {
                        visitor(r).await;
                    }
                    drop(permit);
                });
            }
        }
    })
    .await
    .is_ok();
    let drained = scheduled
        && tokio::time::timeout_at(hard_stop.into(), async {
            while tasks.join_next().await.is_some() {}
        })
        .await
        .is_ok();
    tasks.abort_all();
    let elapsed = started.elapsed().as_secs_f64();
    let c = &run.counts;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let queued = g(&c.queued);
    let at_once = g(&c.at_once);
    println!(
        "SURGE visitors={total} joined={} queued={queued} admitted_at_once={at_once} failed={} \
         seconds={elapsed:.2} page={} asset={} challenge={} join={} poll={} poll_failed={} \
         poll_skipped={} drained={drained} ms_p50_p99=page:{},challenge:{},solve:{},join:{},poll:{} \
         assets={}",
        queued + at_once,
        g(&c.failed),
        g(&c.page),
        g(&c.asset),
        g(&c.challenge),
        g(&c.join),
        g(&c.poll),
        g(&c.poll_failed),
        g(&c.poll_skipped),
        quantiles(&c.lat[0]),
        quantiles(&c.lat[1]),
        quantiles(&c.lat[2]),
        quantiles(&c.lat[3]),
        quantiles(&c.lat[4]),
        run.assets.lock().clone().unwrap_or_default().join(","),
    );
    // Exit now: returning from main would wait for a proof of work still
    // being solved on the blocking pool (after the hard stop).
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}
