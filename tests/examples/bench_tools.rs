//! Small tools for the bench scripts in `tests/bench/`:
//!
//! - `bench_tools hello PORT` — a bare hyper HTTP/1.1 server answering a
//!   constant body (the baseline a gateway is compared with);
//! - `bench_tools join URL ROOM` — solves a challenge, joins the room and
//!   prints the queue token (for status-poll load);
//! - `bench_tools joins URL ROOM SECONDS CONCURRENCY` — visitors that each
//!   fetch a challenge, solve it and join, over and over, for SECONDS;
//!   prints joins per second and the latency of a whole join.

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
        _ => eprintln!(
            "usage: bench_tools hello PORT | join URL ROOM | joins URL ROOM SECONDS CONCURRENCY"
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
