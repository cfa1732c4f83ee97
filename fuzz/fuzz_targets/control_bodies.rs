//! Every control endpoint that reads a body, driven in-process through the
//! gateway's router with arbitrary bytes: never a panic, never a 5xx.
//! The first byte picks the endpoint; the rest is the body. Holds carry a
//! valid admission token of the event's room and webhook bodies a valid
//! signature, so every body reaches its parser; the stock invariant of
//! `demo` must still hold afterwards.
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::body::Body;
use http::{Method, Request};
use libfuzzer_sys::fuzz_target;
use sluice_admission::{AdmitClaims, unix_now_s};
use sluice_gateway::app::{self, AppState};
use sluice_gateway::edge::client_ip::ClientInfo;
use sluice_gateway::config::{Config, RoomConfig};
use tower::ServiceExt;

const ADMIN: &str = "fuzz-admin-token-0123456789";

const WEBHOOK_SECRET: &str = "fuzz-webhook-secret-0123";

struct Fixture {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
    state: AppState,
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
            webhook_secret: Some(WEBHOOK_SECRET.into()),
            rooms: vec![RoomConfig {
                join_limit_per_prefix_per_min: 0,
                ..RoomConfig::default()
            }],
            ..Config::default()
        }
        .with_defaults();
        config.validate().expect("valid");
        let state = rt.block_on(AppState::new(config)).expect("state");
        let f = Fixture {
            app: app::build(state.clone()),
            state,
            rt,
        };
        // The stock of `demo` loads before any hold is fuzzed.
        while admin_event(&f)["ready"] != true {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        f
    })
}

#[derive(Clone, Copy)]
enum Auth {
    None,
    Admin,
    /// A fresh admission token of room `default` (the room of `demo`).
    Admitted,
    /// `Sluice-Signature` over the body with the webhook secret.
    Signed,
}

fn request(f: &Fixture, method: &str, path: &str, auth: Auth, body: &[u8]) -> Request<Body> {
    let mut b = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(path)
        .header("content-type", "application/json");
    match auth {
        Auth::None => {}
        Auth::Admin => b = b.header("authorization", format!("Bearer {ADMIN}")),
        Auth::Admitted => {
            let claims = AdmitClaims::new(
                "default",
                &sluice_admission::new_visitor_id(),
                0,
                unix_now_s(),
                std::time::Duration::from_secs(600),
            );
            let token = f.state.keyring().sign_admit(&claims).expect("sign");
            b = b.header("authorization", format!("Bearer {token}"));
        }
        Auth::Signed => {
            let sig = sluice_gateway::reserve::sign_webhook(
                WEBHOOK_SECRET.as_bytes(),
                unix_now_s(),
                body,
            );
            b = b.header("sluice-signature", sig);
        }
    }
    let mut req = b.body(Body::from(body.to_vec())).expect("request");
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
    // A direct client, as the server resolves one.
    req.extensions_mut()
        .insert(ClientInfo::resolve(peer, &http::HeaderMap::new(), &[]));
    req
}

fn admin_event(f: &Fixture) -> serde_json::Value {
    let req = request(f, "GET", "/_sluice/admin/events/demo", Auth::Admin, b"");
    f.rt.block_on(async {
        let res = f.app.clone().oneshot(req).await.expect("infallible");
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .expect("body");
        serde_json::from_slice(&bytes).expect("json")
    })
}

const ENDPOINTS: &[(&str, &str, Auth)] = &[
    ("POST", "/_sluice/rooms/default/join", Auth::None),
    ("POST", "/_sluice/rooms/default/challenge", Auth::None),
    ("PATCH", "/_sluice/admin/rooms/default", Auth::Admin),
    ("PUT", "/_sluice/admin/events/fuzz", Auth::Admin),
    ("POST", "/_sluice/events/demo/holds", Auth::Admitted),
    ("POST", "/_sluice/webhooks/payment", Auth::Signed),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (method, path, auth) = ENDPOINTS[pick as usize % ENDPOINTS.len()];
    let f = fixture();
    let req = request(f, method, path, auth, body);
    let (status, code) = f.rt.block_on(async {
        let res = f.app.clone().oneshot(req).await.expect("infallible");
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .expect("body");
        let code = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        (status, code)
    });
    assert!(
        status.as_u16() < 500,
        "{path}: {status} {code} for {:?}",
        String::from_utf8_lossy(body)
    );
    // The body reached its parser: the authorisation was accepted.
    assert!(
        !["not_admitted", "signature_invalid", "unauthorized"].contains(&code.as_str()),
        "{path}: {code}"
    );
    if matches!(auth, Auth::Admitted | Auth::Signed) {
        assert_eq!(admin_event(f)["invariant_holds"], true, "{path}");
    }
});
