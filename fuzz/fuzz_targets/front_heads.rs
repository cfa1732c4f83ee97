//! The gateway's own HTTP/1.1 reader (`sluice_wire::front`) fed any
//! bytes as a client's, its answers echoing what it read: never a panic or
//! a hang; only plain requests (GET or HEAD, no framing fields) are
//! answered; what it hands to hyper is exactly the bytes it did not take.
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use http::{Method, Request, Response, header};
use libfuzzer_sys::fuzz_target;
use sluice_wire::front::{self, Limits, Outcome};
use sluice_wire::watch::ConnWatch;
use tokio::io::AsyncWriteExt;

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    rt().block_on(async {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        client.write_all(data).await.expect("write");
        client.shutdown().await.expect("shutdown");
        let limits = Limits {
            head_bytes: 1024,
            headers: 16,
        };
        let watch = ConnWatch::default();
        let taken = std::cell::Cell::new(0usize);
        let answer = |req: Request<Body>| {
            assert!(matches!(*req.method(), Method::GET | Method::HEAD));
            for name in [header::CONTENT_LENGTH, header::TRANSFER_ENCODING, header::UPGRADE, header::EXPECT] {
                assert!(!req.headers().contains_key(name));
            }
            taken.set(taken.get() + 1);
            std::future::ready(Response::new(Body::from(req.uri().to_string())))
        };
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            front::serve(&mut server, limits, &watch, || false, answer),
        )
        .await
        .expect("no hang");
        if let Outcome::Handoff(rest) = out {
            assert!(data.ends_with(&rest), "handed off bytes it was not given");
            assert!(!rest.is_empty());
        }
    });
});
