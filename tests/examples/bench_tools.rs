//! Small tools for the bench scripts in `tests/bench/`:
//!
//! - `bench_tools hello PORT` — a bare hyper HTTP/1.1 server answering a
//!   constant body (the baseline a gateway is compared with);
//! - `bench_tools join URL ROOM` — solves a challenge, joins the room and
//!   prints the queue token (for status-poll load);
//! - `bench_tools joins URL ROOM SECONDS CONCURRENCY` — visitors that each
//!   fetch a challenge, solve it and join, over and over, for SECONDS;
//!   prints joins per second and the latency of a whole join;
//! - `bench_tools presolve URL ROOM N CONCURRENCY OUT` — fetches N
//!   challenges and solves each (real proofs of work, as cheap as the room
//!   asks), writing one join body per line to OUT: the joins of
//!   `tests/bench/joins.sh`, sent by wrk (`tests/bench/joins.lua`) so the
//!   timed phase is joins only;
//! - `bench_tools sign SECONDS` — in-process: ed25519-dalek's own
//!   `SigningKey::sign` of a queue token's signing input against the
//!   gateway's whole token signing (`Keyring::sign_queue`: claims to JSON,
//!   base64url, the signature), each per second on one thread.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_tests::visitor::Visitor;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("hello") => hello(args[2].parse().expect("port")).await,
        Some("join") => {
            let mut v = Visitor::new(&args[2], &args[3]);
            let res = v.join("/").await;
            assert!(res.status.is_success(), "{}", res.text());
            println!(
                "{}",
                v.queue_token
                    .expect("a queue token: is the room admitting at once?")
            );
        }
        Some("joins") => {
            joins(
                &args[2],
                &args[3],
                args[4].parse().expect("seconds"),
                args[5].parse().expect("concurrency"),
            )
            .await
        }
        Some("presolve") => {
            presolve(
                &args[2],
                &args[3],
                args[4].parse().expect("n"),
                args[5].parse().expect("concurrency"),
                &args[6],
            )
            .await
        }
        Some("sign") => sign(args[2].parse().expect("seconds")),
        _ => eprintln!(
            "usage: bench_tools hello PORT | join URL ROOM | joins URL ROOM SECONDS CONCURRENCY \
             | presolve URL ROOM N CONCURRENCY OUT | sign SECONDS"
        ),
    }
}

async fn hello(port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    loop {
        let (stream, _) = listener.accept().await.expect("accept");
        tokio::spawn(async move {
            let svc = service_fn(|_req| async {
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                    b"{\"state\":\"waiting\",\"position\":1}",
                ))))
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Closed-loop join load: `concurrency` visitors, each joining again as soon
/// as its last join is answered, until `seconds` have passed.
async fn joins(url: &str, room: &str, seconds: f64, concurrency: usize) {
    let started = std::time::Instant::now();
    let deadline = started + std::time::Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (url, room) = (url.to_owned(), room.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut v = Visitor::new(&url, &room);
            let (mut ok, mut failed, mut latencies) = (0u64, 0u64, Vec::new());
            while std::time::Instant::now() < deadline {
                let t = std::time::Instant::now();
                let res = v.join("/").await;
                // 201: a place in line; 200: admitted at once (the room's
                // burst, before anyone waits)
                if matches!(res.status.as_u16(), 200 | 201) {
                    ok += 1;
                    latencies.push(t.elapsed().as_secs_f64());
                } else {
                    failed += 1;
                }
            }
            (ok, failed, latencies)
        }));
    }
    let (mut ok, mut failed, mut latencies) = (0u64, 0u64, Vec::new());
    for t in tasks {
        let (o, f, l) = t.await.expect("join task");
        ok += o;
        failed += f;
        latencies.extend(l);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let p99 = latencies
        .get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    println!(
        "{:.1} {:.2} {ok} {failed}",
        ok as f64 / elapsed,
        p99 * 1000.0
    );
}

/// Fetches `n` challenges of `room` (`concurrency` at a time) and solves
/// them, writing one join body per line to `out`; prints on stdout the
/// seconds spent fetching and solving and the difficulty seen.
async fn presolve(url: &str, room: &str, n: usize, concurrency: usize, out: &str) {
    use futures_util::StreamExt;
    use std::io::Write;
    let started = std::time::Instant::now();
    let bodies: Vec<(String, u8)> = futures_util::stream::iter(0..n)
        .map(|_| async {
            let v = Visitor::new(url, room);
            let c = v.challenge().await;
            assert_eq!(c.status, 200, "challenge: {}", c.text());
            let c = c.json();
            let challenge = c["challenge"].as_str().expect("challenge").to_owned();
            let k = c["puzzles"].as_u64().expect("puzzles") as u8;
            let bits = c["difficulty_bits"].as_u64().expect("bits") as u8;
            assert_eq!(c["min_solve_ms"], 0, "the bench room asks for no wait");
            let solutions = sluice_pow::solve(&challenge, k, bits, 1);
            let body = serde_json::json!({"challenge": challenge, "solutions": solutions});
            (body.to_string(), bits)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut f = std::io::BufWriter::new(std::fs::File::create(out).expect("out file"));
    let mut max_bits = 0;
    for (b, bits) in &bodies {
        writeln!(f, "{b}").expect("write");
        max_bits = max_bits.max(*bits);
    }
    f.flush().expect("flush");
    println!("{:.2} {max_bits}", started.elapsed().as_secs_f64());
}

/// Signatures per second on one thread: ed25519-dalek's `SigningKey::sign`
/// of a queue token's signing input, and the gateway's whole queue token
/// signing; prints `raw_per_s token_per_s`.
fn sign(seconds: f64) {
    use ed25519_dalek::Signer as _;
    use std::hint::black_box;
    use std::time::{Duration, Instant};
    let ring = sluice_admission::Keyring::ephemeral();
    let claims = || {
        let mut c = sluice_admission::QueueClaims::new(
            "default",
            &sluice_admission::new_visitor_id(),
            123_456,
            1_764_000_000_000,
            1_764_000_000,
            Duration::from_secs(3600),
        );
        c.ret = Some("/".into());
        c
    };
    let token = ring.sign_queue(&claims()).expect("sign");
    let input = token.rsplit_once('.').expect("a JWS").0.as_bytes().to_vec();
    let key = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let per_s = |f: &mut dyn FnMut()| {
        for _ in 0..200 {
            f();
        }
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed().as_secs_f64() < seconds {
            for _ in 0..100 {
                f();
            }
            n += 100;
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    let raw = per_s(&mut || {
        black_box(key.sign(black_box(&input)));
    });
    let tokens = per_s(&mut || {
        black_box(ring.sign_queue(&claims()).expect("sign"));
    });
    println!("{raw:.0} {tokens:.0}");
}
