//! Small tools for the bench scripts in `tests/bench/`:
//!
//! - `bench_tools hello PORT` — a bare hyper HTTP/1.1 server answering a
//!   constant body (the baseline a gateway is compared with);
//! - `bench_tools join URL ROOM` — solves a challenge, joins the room and
//!   prints the queue token (for status-poll load).

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
        _ => eprintln!("usage: bench_tools hello PORT | join URL ROOM"),
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
