//! Forward-auth (`GET /_sluice/auth`) behind Debian's real nginx, running
//! `deploy/forward-auth/nginx.conf` as shipped (its two upstreams and its
//! port swapped for the test's), in front of the test origin, with an
//! in-process gateway beside it; and the endpoint asked directly with
//! hostile descriptions of the original request.
//!
//! Rooms: `busy` guards `/echo/busy` and is paused (nobody passes without
//! an admission; `/echo/busy/robots.txt` is a bypass); `idle` guards
//! `/echo/idle` with credit to spare (a passthrough); `/echo/free` is no
//! room's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::client::{Answer, TestClient};
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::free_port;
use sluice_tests::{TestGateway, admin_patch, easy_room};

const NGINX: &str = "/usr/sbin/nginx";

/// nginx as a child process with its own prefix, pid, logs and temp paths;
/// stopped when dropped.
struct Nginx {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Nginx {
    /// Runs the shipped config against `sluice` and `origin`, or `None`
    /// (a loud SKIPPED line) when nginx is missing outside CI.
    fn start(sluice: std::net::SocketAddr, origin: &str) -> Option<Nginx> {
        if !Path::new(NGINX).exists() {
            let msg = format!("{NGINX} not found");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}: CI=true requires it (apt-get install nginx-light)");
            }
            eprintln!(
                "\n*** SKIPPED: {msg}; the forward-auth tests behind nginx did not run ***\n"
            );
            return None;
        }
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "sluice-forward-auth-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/forward-auth/nginx.conf"),
        )
        .unwrap();
        let origin_addr = origin.trim_start_matches("http://").trim_end_matches('/');
        let site = shipped
            .replace("server 127.0.0.1:8080;", &format!("server {sluice};"))
            .replace("server 127.0.0.1:3000;", &format!("server {origin_addr};"))
            .replace("listen 80;", &format!("listen 127.0.0.1:{port};"));
        assert_ne!(site, shipped);
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/logs/error.log warn;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n\
               access_log off;\n\
               client_body_temp_path {d}/client_body;\n\
               proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n\
               uwsgi_temp_path {d}/uwsgi;\n\
               scgi_temp_path {d}/scgi;\n\
               {site}\n\
             }}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = sluice_tests::process::own_group(&mut Command::new(NGINX))
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nginx");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not listen: {}",
                std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Nginx { child, port, dir })
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The master's group: its workers end with it.
        sluice_tests::process::kill_group(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Site {
    origin: TestOrigin,
    gw: TestGateway,
    client: TestClient,
}

async fn site() -> Site {
    let origin = TestOrigin::start().await;
    let gw = TestGateway::builder()
        .origin(origin.url())
        .config(|c| {
            c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            let mut busy = easy_room("busy", 1.0, 1.0, &["/echo/busy"]);
            busy.bypass_paths = vec!["/echo/busy/robots.txt".into()];
            c.rooms = vec![busy, easy_room("idle", 100.0, 100.0, &["/echo/idle"])];
        })
        .spawn()
        .await;
    let res = admin_patch(&gw.url(), "busy", json!({"paused": true})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    Site {
        origin,
        gw,
        client: TestClient::new(),
    }
}

impl Site {
    /// An admission to `room`, signed with the gateway's keys.
    fn admission(&self, room: &str) -> String {
        self.admission_issued(room, sluice_gateway::app::now_s())
    }

    /// An admission to `room` issued at `iat` for the room's session
    /// length (600 s).
    fn admission_issued(&self, room: &str, iat: u64) -> String {
        let claims = sluice_admission::AdmitClaims::new(
            room,
            &sluice_admission::new_visitor_id(),
            1,
            iat,
            Duration::from_secs(600),
        );
        self.gw.state().keyring().sign_admit(&claims).unwrap()
    }

    /// `GET /_sluice/auth` straight to the gateway.
    async fn auth(&self, query: &str, headers: &[(&str, &str)]) -> Answer {
        self.client
            .get(&format!("{}/_sluice/auth{query}", self.gw.url()), headers)
            .await
    }
}

/// The headers the origin received (the echo's JSON).
fn origin_saw(res: &Answer) -> Value {
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["headers"].clone()
}

const BROWSER: (&str, &str) = ("accept", "text/html,application/xhtml+xml");

#[tokio::test]
async fn behind_nginx_the_waiting_room_the_admitted_and_the_unguarded() {
    let s = site().await;
    let Some(nginx) = Nginx::start(s.gw.addr, &s.origin.url()) else {
        return;
    };
    let before = s.origin.requests();

    // An unadmitted browser: the waiting page, through nginx's error_page.
    // (The room's `waiting_status` is 200; a refusal from /_sluice/auth is
    // never 2xx, which Envoy and Traefik would read as "pass".)
    let res = s
        .client
        .get(&nginx.url("/echo/busy/x?y=1"), &[BROWSER])
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert!(
        res.header("content-type").unwrap().starts_with("text/html"),
        "{:?}",
        res.headers
    );
    assert!(res.text().contains("<html"), "{}", res.text());
    assert_eq!(res.header("cache-control"), Some("no-store"));
    // Any other client: sluice's 503, as a guarded path in-path gives.
    let res = s.client.get(&nginx.url("/echo/busy/x"), &[]).await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["code"], "waiting_room_active");
    assert!(res.header("retry-after").is_some());
    // A forged admission is no admission.
    let res = s
        .client
        .get(
            &nginx.url("/echo/busy/x"),
            &[("sluice-admission", "forged")],
        )
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(s.origin.requests(), before, "the origin was reached");

    // Admitted, by bearer and by cookie: the origin sees the admission,
    // and only it (a forged header is replaced).
    let token = s.admission("busy");
    let bearer = format!("Bearer {token}");
    let cookie = format!("sluice_a_busy={token}");
    for headers in [
        vec![
            ("authorization", bearer.as_str()),
            ("sluice-admission", "forged"),
        ],
        vec![("cookie", cookie.as_str()), BROWSER],
    ] {
        let res = s.client.get(&nginx.url("/echo/busy/x"), &headers).await;
        let saw = origin_saw(&res);
        assert_eq!(saw["sluice-admission"], json!([token]), "{saw}");
    }

    // A bypass path and a path no room guards pass; a forged admission
    // never reaches the origin.
    for path in ["/echo/busy/robots.txt", "/echo/free/x"] {
        let res = s
            .client
            .get(&nginx.url(path), &[("sluice-admission", "forged")])
            .await;
        let saw = origin_saw(&res);
        assert!(saw.get("sluice-admission").is_none(), "{path}: {saw}");
        assert!(res.header("set-cookie").is_none(), "{path}");
    }

    // A spelling of the guarded path is guarded: nginx sends the target as
    // the visitor wrote it, sluice reads it in its canonical form.
    for path in [
        "//echo/busy/x",
        "/./echo/busy/x",
        "/%65cho/busy/x",
        "/echo/free/../busy/x",
    ] {
        let res = s.client.get(&nginx.url(path), &[]).await;
        assert!(
            res.status == 503 || res.status == 400,
            "{path}: {} {}",
            res.status,
            res.text()
        );
        if res.status == 503 {
            assert_eq!(res.json()["code"], "waiting_room_active", "{path}");
        }
    }
}

#[tokio::test]
async fn behind_nginx_a_passthrough_sets_the_admission_cookie() {
    let s = site().await;
    let Some(nginx) = Nginx::start(s.gw.addr, &s.origin.url()) else {
        return;
    };
    let res = s.client.get(&nginx.url("/echo/idle/x"), &[]).await;
    let saw = origin_saw(&res);
    let token = saw["sluice-admission"][0].as_str().expect("an admission");
    let cookie = res.header("set-cookie").expect("the admission cookie");
    assert!(
        cookie.starts_with(&format!("sluice_a_idle={token}")),
        "{cookie}"
    );
    // The cookie admits the next request.
    let pair = cookie.split(';').next().unwrap().to_owned();
    let res = s
        .client
        .get(&nginx.url("/echo/idle/y"), &[("cookie", pair.as_str())])
        .await;
    assert_eq!(origin_saw(&res)["sluice-admission"][0], json!(token));
}

#[tokio::test]
async fn the_endpoint_itself() {
    let s = site().await;
    // nginx's mode: a refusal is 401, whoever asks.
    for accept in ["text/html", "application/json"] {
        let res = s
            .auth(
                "?mode=nginx",
                &[("x-original-uri", "/echo/busy/x"), ("accept", accept)],
            )
            .await;
        assert_eq!(res.status, 401, "{}", res.text());
        assert_eq!(res.json()["code"], "waiting_room_active");
        assert_eq!(res.header("cache-control"), Some("no-store"));
    }
    // Without the mode, a browser gets the page, never with a 2xx status.
    let res = s
        .auth("", &[("x-original-uri", "/echo/busy/x"), BROWSER])
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert!(res.header("content-type").unwrap().starts_with("text/html"));
    assert!(res.text().contains("<html"));
    // Envoy's and Traefik's headers; the room's own answer.
    let res = s
        .auth(
            "",
            &[
                ("x-forwarded-uri", "/echo/busy/x"),
                ("x-forwarded-method", "POST"),
                ("x-forwarded-host", "shop.example"),
                ("x-forwarded-proto", "https"),
            ],
        )
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["code"], "waiting_room_active");
    // Admitted: 200, empty, the admission to copy.
    let token = s.admission("busy");
    let res = s
        .auth(
            "?mode=nginx",
            &[
                ("x-original-uri", "/echo/busy/x"),
                ("authorization", &format!("Bearer {token}")),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(res.body.is_empty());
    assert_eq!(res.header("sluice-admission"), Some(token.as_str()));
    // Envoy's form: the original method and target behind the prefix; the
    // describing headers are not read there.
    let envoy = |path: &str| format!("{}/_sluice/auth{path}", s.gw.url());
    let res = s
        .client
        .call(
            http::Method::POST,
            &envoy("/echo/busy/x?mode=nginx"),
            &[("x-forwarded-uri", "/echo/free"), ("content-length", "0")],
            sluice_tests::client::empty(),
        )
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["code"], "waiting_room_active");
    let res = s
        .client
        .get(
            &envoy("/echo/busy/x"),
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("sluice-admission"), Some(token.as_str()));
    let res = s.client.get(&envoy("/echo/free/x"), &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = s.client.get(&envoy("/echo%2Fbusy/x"), &[]).await;
    assert_eq!(res.status, 400, "{}", res.text());
    // The site's root, asked Envoy's way, is no room's here.
    let res = s.client.get(&envoy("/"), &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    // An admission past half its life is renewed, as in-path: the new
    // token for the origin and the cookie for the visitor.
    let old = s.admission_issued("busy", sluice_gateway::app::now_s() - 400);
    let res = s
        .auth(
            "?mode=nginx",
            &[
                ("x-original-uri", "/echo/busy/x"),
                ("cookie", &format!("sluice_a_busy={old}")),
            ],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let renewed = res.header("sluice-admission").unwrap().to_owned();
    assert_ne!(renewed, old);
    let cookie = res.header("set-cookie").expect("the renewed cookie");
    assert!(
        cookie.starts_with(&format!("sluice_a_busy={renewed};")),
        "{cookie}"
    );
    // Unguarded, a bypass, the gateway's own paths: 200, nothing to copy.
    for uri in ["/echo/free", "/echo/busy/robots.txt", "/_sluice/healthz"] {
        let res = s.auth("?mode=nginx", &[("x-original-uri", uri)]).await;
        assert_eq!(res.status, 200, "{uri}: {}", res.text());
        assert!(res.header("sluice-admission").is_none(), "{uri}");
    }
    // Spellings of the guarded path are guarded.
    for uri in [
        "//echo/busy/x",
        "/./echo/busy/x",
        "/%65cho/busy/x",
        "/ECHO/../echo/busy",
    ] {
        let res = s.auth("?mode=nginx", &[("x-original-uri", uri)]).await;
        assert_eq!(res.status, 401, "{uri}: {}", res.text());
    }
}

#[tokio::test]
async fn hostile_descriptions_are_malformed_never_500() {
    let s = site().await;
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("no target", vec![]),
        ("empty target", vec![("x-original-uri", "")]),
        (
            "not origin form",
            vec![("x-original-uri", "http://evil/echo/busy")],
        ),
        ("no slash", vec![("x-original-uri", "echo/busy")]),
        ("garbage", vec![("x-original-uri", "/echo busy/x")]),
        ("star", vec![("x-original-uri", "*")]),
        ("encoded slash", vec![("x-original-uri", "/echo%2Fbusy/x")]),
        ("above the root", vec![("x-original-uri", "/../echo/busy")]),
        (
            "above the root, encoded",
            vec![("x-forwarded-uri", "/%2e%2e/echo/busy")],
        ),
        ("backslash", vec![("x-original-uri", "/echo\\busy")]),
        (
            "two targets",
            vec![
                ("x-original-uri", "/echo/free"),
                ("x-original-uri", "/echo/busy"),
            ],
        ),
        (
            "two hosts",
            vec![
                ("x-original-uri", "/echo/busy"),
                ("x-forwarded-host", "a.example"),
                ("x-forwarded-host", "b.example"),
            ],
        ),
        (
            "a bad host",
            vec![
                ("x-original-uri", "/echo/busy"),
                ("x-forwarded-host", "a b/c"),
            ],
        ),
        (
            "a bad method",
            vec![
                ("x-original-uri", "/echo/busy"),
                ("x-original-method", "G(T"),
            ],
        ),
        (
            "CONNECT",
            vec![
                ("x-original-uri", "/echo/busy"),
                ("x-original-method", "CONNECT"),
            ],
        ),
        ("a bad mode", vec![("x-original-uri", "/echo/busy")]),
    ];
    for (what, headers) in cases {
        let query = if what == "a bad mode" {
            "?mode=envoy"
        } else {
            "?mode=nginx"
        };
        let res = s.auth(query, &headers).await;
        assert_eq!(res.status, 400, "{what}: {} {}", res.status, res.text());
        assert_eq!(res.json()["code"], "malformed_request", "{what}");
    }
    // Generated targets (printable ASCII, weighted to the characters that
    // matter to paths): an answer of the contract, never a 5xx other than
    // the waiting room's 503.
    use rand::RngExt as _;
    let alphabet = b"/./%2fF5eE.;?#\\ab:@!$&'()*+,=~-_";
    let mut rng = rand::rng();
    for _ in 0..300 {
        let len = rng.random_range(1..24);
        let mut target: String = (0..len)
            .map(|_| {
                if rng.random_bool(0.8) {
                    alphabet[rng.random_range(0..alphabet.len())] as char
                } else {
                    rng.random_range(0x20u8..0x7f) as char
                }
            })
            .collect();
        if rng.random_bool(0.7) {
            target.insert_str(0, "/echo/busy");
        }
        let res = s.auth("?mode=nginx", &[("x-original-uri", &target)]).await;
        assert!(
            [200, 400, 401].contains(&res.status.as_u16()),
            "{target:?}: {} {}",
            res.status,
            res.text()
        );
        let res = s.auth("", &[("x-forwarded-uri", &target)]).await;
        assert!(
            [200, 400, 503].contains(&res.status.as_u16()),
            "{target:?}: {} {}",
            res.status,
            res.text()
        );
        if res.status == 503 {
            assert_eq!(res.json()["code"], "waiting_room_active", "{target:?}");
        }
    }
    // Two Host headers on the sub-request itself: the edge refuses it.
    let res = s
        .auth(
            "?mode=nginx",
            &[
                ("x-original-uri", "/echo/busy"),
                ("host", "a.example"),
                ("host", "b.example"),
            ],
        )
        .await;
    assert_eq!(res.status, 400, "{}", res.text());
    assert_eq!(res.json()["code"], "malformed_request");
}

/// Issue 19's operational hygiene: an expected answer (503
/// `waiting_room_active` to a client that is not a browser, in-path and
/// through forward-auth) is not an ERROR line; on sale day every such
/// visitor gets one. The real `sluice serve`, its JSON log read back.
#[tokio::test]
async fn an_expected_503_is_not_logged_at_error() {
    let origin = TestOrigin::start().await;
    let config = sluice_tests::temp_file(
        "sluice.toml",
        "[[rooms]]\nid = \"default\"\npaths = [\"/\"]\nopens_at = \"2099-01-01T00:00:00Z\"\n",
    );
    let gw = sluice_tests::GatewayProcess::start_logged(
        &[
            "--origin",
            &origin.url(),
            "--config",
            config.to_str().unwrap(),
        ],
        "warn",
    );
    let client = TestClient::new();
    for _ in 0..5 {
        let res = client.get(&format!("{}/echo/x", gw.url()), &[]).await;
        assert_eq!(res.status, 503, "{}", res.text());
        assert_eq!(res.json()["code"], "waiting_room_active");
        let res = client
            .get(
                &format!("{}/_sluice/auth", gw.url()),
                &[("x-original-uri", "/echo/x")],
            )
            .await;
        assert_eq!(res.status, 503, "{}", res.text());
    }
    // A moment for the log lines of those requests to be read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let errors: Vec<String> = gw
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("\"level\":\"ERROR\""))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
}
