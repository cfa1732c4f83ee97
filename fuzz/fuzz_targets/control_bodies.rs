//! Every control endpoint that reads a body, driven in-process through the
//! gateway's router with arbitrary bytes: never a panic, never a 5xx.
//! The first byte picks the endpoint; the rest is the body.
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::body::Body;
use http::{Method, Request};
use libfuzzer_sys::fuzz_target;
use sluice_gateway::app::{self, AppState};
use sluice_gateway::client_ip::ClientInfo;
use sluice_gateway::config::{Config, RoomConfig};
use tower::ServiceExt;

const ADMIN: &str = "fuzz-admin-token-0123456789";

struct Fixture {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let config = Config {
            origin: Some("http://127.0.0.1:9".into()),
            admin_token: Some(ADMIN.into()),
            webhook_secret: Some("fuzz-webhook-secret-0123".into()),
            rooms: vec![RoomConfig {
                join_limit_per_prefix_per_min: 0,
                ..RoomConfig::default()
            }],
            ..Config::default()
        }
        .with_defaults();
        config.validate().expect("valid");
        let state = rt.block_on(AppState::new(config)).expect("state");
        Fixture {
            app: app::build(state),
            rt,
        }
    })
}

const ENDPOINTS: &[(&str, &str, bool)] = &[
    ("POST", "/_sluice/rooms/default/join", false),
    ("POST", "/_sluice/rooms/default/challenge", false),
    ("PATCH", "/_sluice/admin/rooms/default", true),
    ("PUT", "/_sluice/admin/events/fuzz", true),
    ("POST", "/_sluice/events/demo/holds", false),
    ("POST", "/_sluice/webhooks/payment", false),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (method, path, admin) = ENDPOINTS[pick as usize % ENDPOINTS.len()];
    let f = fixture();
    let mut b = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(path)
        .header("content-type", "application/json");
    if admin {
        b = b.header("authorization", format!("Bearer {ADMIN}"));
    }
    let mut req = b.body(Body::from(body.to_vec())).expect("request");
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
    req.extensions_mut().insert(ClientInfo {
        peer,
        ip: peer.ip(),
        peer_trusted: false,
        proto: "http",
    });
    let res = f.rt.block_on(f.app.clone().oneshot(req)).expect("infallible");
    assert!(
        res.status().as_u16() < 500,
        "{path}: {} for {:?}",
        res.status(),
        String::from_utf8_lossy(body)
    );
});
