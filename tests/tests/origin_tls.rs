//! https origins (issue 19): the real `sluice serve` in front of Debian's
//! real nginx serving HTTPS, with certificates made here by rcgen (a test
//! CA, a good leaf, an expired one, one for another host name, a
//! self-signed one) and one nginx server per case, each on its own
//! loopback port, logging `$server_port $connection $server_protocol
//! $ssl_server_name $host` per request.
//!
//! Under `CI=true` a missing nginx fails the test; elsewhere the nginx
//! tests say loudly that they were skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::client::{TestClient, body};
use sluice_tests::redis_server::free_port;
use sluice_tests::tls::{TestCa, self_signed};
use sluice_tests::{GatewayProcess, metric, sluice_bin, temp_file};

const NGINX: &str = "/usr/sbin/nginx";

/// The tests of this file one at a time: each picks free ports for nginx
/// and gateways before they bind them, and two tests picking at once
/// could pick alike.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The body every nginx server answers with.
const HELLO: &str = "hello from the https origin";

/// Certificates and keys, as PEM files in `dir`.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// A CA, and leaves for `localhost`: `good` (signed by the CA),
    /// `expired` (signed by the CA, ended yesterday), `wronghost` (signed
    /// by the CA for `other.example` only), `selfsigned` (its own issuer),
    /// copied from the tests' CA helper into `dir` as `NAME.crt`/`NAME.key`.
    fn make(dir: &Path) -> Certs {
        std::fs::create_dir_all(dir).unwrap();
        let ca = TestCa::new();
        std::fs::copy(&ca.cert, dir.join("ca.pem")).unwrap();
        let names = ["localhost", "127.0.0.1"];
        for (name, leaf) in [
            ("good", ca.leaf(&names)),
            ("expired", ca.expired_leaf(&names)),
            ("wronghost", ca.leaf(&["other.example"])),
            ("selfsigned", self_signed(&names)),
        ] {
            std::fs::write(dir.join(format!("{name}.crt")), &leaf.cert_pem).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), &leaf.key_pem).unwrap();
        }
        Certs {
            dir: dir.to_owned(),
        }
    }

    fn ca(&self) -> String {
        self.dir.join("ca.pem").to_str().unwrap().to_owned()
    }
}

/// The servers of the test nginx, one port each.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Site {
    /// The good certificate, HTTP/2 offered by ALPN.
    H2,
    /// The good certificate, HTTP/1.1 only.
    H1,
    Expired,
    WrongHost,
    SelfSigned,
    /// Plain HTTP on the port an `https://` URL names.
    PlainHttp,
    /// The good certificate, HTTP/2 offered, in front of a test origin
    /// (its echo, its bytes, its WebSocket).
    Front,
}

const SITES: [Site; 7] = [
    Site::H2,
    Site::H1,
    Site::Expired,
    Site::WrongHost,
    Site::SelfSigned,
    Site::PlainHttp,
    Site::Front,
];

/// nginx as a child process with its own prefix and logs; stopped when
/// dropped.
struct Nginx {
    child: Child,
    ports: Vec<(Site, u16)>,
    dir: PathBuf,
}

impl Nginx {
    /// Starts it, or `None` (a loud SKIPPED line) when nginx is missing
    /// outside CI. `backend` (`host:port`) is the origin behind
    /// [`Site::Front`].
    fn start(test: &str, backend: Option<std::net::SocketAddr>) -> Option<Nginx> {
        if !Path::new(NGINX).exists() {
            let msg = format!("{NGINX} not found");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}: CI=true requires it (apt-get install nginx-light)");
            }
            eprintln!("\n*** SKIPPED: {msg}; the https origin test {test} did not run ***\n");
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "sluice-origin-tls-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let certs = Certs::make(&dir.join("certs"));
        // A port picked free may be taken by another test's server before
        // nginx binds it: nginx then exits without its pid file (written
        // once every socket is bound), and is started again on others.
        for _ in 0..5 {
            let ports = distinct_ports();
            let servers: String = ports
                .iter()
                .map(|(site, port)| server_block(*site, *port, &certs.dir, backend))
                .collect();
            std::fs::write(dir.join("nginx.conf"), nginx_conf(&dir, &servers)).unwrap();
            let _ = std::fs::remove_file(dir.join("nginx.pid"));
            let mut child = sluice_tests::process::own_group(&mut Command::new(NGINX))
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(dir.join("nginx.conf"))
                .args(["-g", "daemon off;"])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start nginx");
            let deadline = Instant::now() + Duration::from_secs(10);
            while !dir.join("nginx.pid").exists() {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "nginx did not start: {}",
                    std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            if child.try_wait().unwrap().is_none() {
                return Some(Nginx { child, ports, dir });
            }
            eprintln!("nginx could not bind its ports; again on others");
        }
        panic!(
            "nginx did not start: {}",
            std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default()
        );
    }

    fn port(&self, site: Site) -> u16 {
        self.ports.iter().find(|(s, _)| *s == site).unwrap().1
    }

    /// `https://localhost:PORT` of a site.
    fn url(&self, site: Site) -> String {
        format!("https://localhost:{}", self.port(site))
    }

    fn ca(&self) -> String {
        self.dir.join("certs/ca.pem").to_str().unwrap().to_owned()
    }

    /// The access log lines of a site: (connection number, protocol, SNI,
    /// host asked for).
    fn requests(&self, site: Site) -> Vec<(u64, String, String, String)> {
        let port = self.port(site).to_string();
        std::fs::read_to_string(self.dir.join("logs/access.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.len() == 5 && f[0] == port).then(|| {
                    (
                        f[1].parse().unwrap(),
                        f[2].to_owned(),
                        f[3].to_owned(),
                        f[4].to_owned(),
                    )
                })
            })
            .collect()
    }
}

/// A free port for each site, no two alike.
fn distinct_ports() -> Vec<(Site, u16)> {
    let mut ports: Vec<(Site, u16)> = Vec::new();
    for site in SITES {
        let port = loop {
            let p = free_port();
            if ports.iter().all(|(_, q)| *q != p) {
                break p;
            }
        };
        ports.push((site, port));
    }
    ports
}

/// The whole nginx configuration, its files under `dir`.
fn nginx_conf(dir: &Path, servers: &str) -> String {
    let d = dir.display();
    format!(
        "worker_processes 1;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/logs/error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
           log_format probe '$server_port $connection $server_protocol $ssl_server_name $host';\n\
           access_log {d}/logs/access.log probe;\n\
           client_body_temp_path {d}/client_body;\n\
           proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi;\n\
           scgi_temp_path {d}/scgi;\n\
           keepalive_requests 1000;\n\
           {servers}\n\
         }}\n"
    )
}

/// One nginx `server` of a site.
fn server_block(
    site: Site,
    port: u16,
    certs: &Path,
    backend: Option<std::net::SocketAddr>,
) -> String {
    let c = certs.display();
    let (listen, cert) = match site {
        Site::H2 => (format!("listen 127.0.0.1:{port} ssl http2;"), "good"),
        Site::H1 => (format!("listen 127.0.0.1:{port} ssl;"), "good"),
        Site::Expired => (format!("listen 127.0.0.1:{port} ssl;"), "expired"),
        Site::WrongHost => (format!("listen 127.0.0.1:{port} ssl;"), "wronghost"),
        Site::SelfSigned => (format!("listen 127.0.0.1:{port} ssl;"), "selfsigned"),
        Site::PlainHttp => (format!("listen 127.0.0.1:{port};"), ""),
        Site::Front => (format!("listen 127.0.0.1:{port} ssl http2;"), "good"),
    };
    let tls = if cert.is_empty() {
        String::new()
    } else {
        format!("ssl_certificate {c}/{cert}.crt; ssl_certificate_key {c}/{cert}.key;")
    };
    let locations = match (site, backend) {
        (Site::Front, Some(b)) => format!(
            "client_max_body_size 0; proxy_request_buffering off; proxy_buffering off; \
             location /ws {{ proxy_pass http://{b}; proxy_http_version 1.1; \
               proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; }} \
             location / {{ proxy_pass http://{b}; proxy_http_version 1.1; }}"
        ),
        _ => format!("location / {{ default_type text/plain; return 200 \"{HELLO}\\n\"; }}"),
    };
    format!("server {{ {listen} server_name localhost; {tls} {locations} }}\n")
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The master's group: its workers end with it.
        sluice_tests::process::kill_group(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A config whose only room guards `/queue`: every other path is proxied.
fn unguarded_config(extra: &str) -> PathBuf {
    temp_file(
        "sluice.toml",
        &format!("[[rooms]]\nid = \"default\"\npaths = [\"/queue\"]\n{extra}"),
    )
}

/// `sluice serve` in front of `origin`, its JSON log kept (warn and up).
fn gateway(origin: &str, extra_args: &[&str], config_extra: &str) -> GatewayProcess {
    let config = unguarded_config(config_extra);
    let mut args = vec![
        "--origin",
        origin,
        "--config",
        config.to_str().unwrap(),
        "--admin-token",
        sluice_tests::ADMIN_TOKEN,
    ];
    args.extend_from_slice(extra_args);
    GatewayProcess::start_logged(&args, "warn")
}

/// The log lines of handshake failures.
fn tls_failure_lines(gw: &GatewayProcess) -> Vec<String> {
    gw.log_lines()
        .into_iter()
        .filter(|l| l.contains("\"code\":\"origin_tls_failed\""))
        .collect()
}

#[tokio::test]
async fn a_verified_origin_is_proxied_over_h2_and_h1_and_its_connections_are_reused() {
    let _serial = SERIAL.lock().await;
    let Some(nginx) = Nginx::start("a_verified_origin_is_proxied", None) else {
        return;
    };
    let ca = nginx.ca();
    let client = TestClient::new();
    for (site, protocol) in [(Site::H2, "HTTP/2.0"), (Site::H1, "HTTP/1.1")] {
        let gw = gateway(&nginx.url(site), &["--origin-ca", &ca], "");
        for i in 0..10 {
            let res = client.get(&format!("{}/page/{i}?q=1", gw.url()), &[]).await;
            assert_eq!(res.status, 200, "{site:?}: {}", res.text());
            assert_eq!(res.text().trim(), HELLO);
        }
        // A request with a body takes the same connections.
        let res = client
            .call(
                http::Method::POST,
                &format!("{}/form", gw.url()),
                &[("content-type", "text/plain")],
                body("a body"),
            )
            .await;
        assert_eq!(res.status, 200, "{site:?}: {}", res.text());
        assert_eq!(res.text().trim(), HELLO);

        // nginx writes its access log line after each answer.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let seen = nginx.requests(site);
        assert_eq!(seen.len(), 11, "{site:?}: {seen:?}");
        // The client's Host is kept (`proxy.preserve_host`), as `Host`
        // over HTTP/1.1 and as `:authority` over HTTP/2; SNI is the
        // origin URL's host (`localhost`; nginx's `$host` drops the port).
        let host = gw.addr.ip().to_string();
        assert!(
            seen.iter()
                .all(|(_, p, sni, h)| p == protocol && sni == "localhost" && *h == host),
            "{site:?}: every request over {protocol}, SNI localhost, host {host}: {seen:?}"
        );
        let mut connections: Vec<u64> = seen.iter().map(|(c, _, _, _)| *c).collect();
        connections.sort_unstable();
        connections.dedup();
        // One client connection lands on one I/O thread, whose pool
        // carries the requests; at most one more for its first races.
        assert!(
            connections.len() <= 2,
            "{site:?}: 11 requests took {} TLS connections: {seen:?}",
            connections.len()
        );
        assert_eq!(
            metric(&gw.url(), "sluice_upstream_errors_total{kind=\"tls\"}").await,
            0.0
        );
        assert!(tls_failure_lines(&gw).is_empty());
    }
}

#[tokio::test]
async fn bad_certificates_and_a_plain_peer_are_502_origin_tls_failed_logged_once_each() {
    let _serial = SERIAL.lock().await;
    let Some(nginx) = Nginx::start("bad_certificates_are_502_origin_tls_failed", None) else {
        return;
    };
    let ca = nginx.ca();
    let client = TestClient::new();
    for (site, cause) in [
        (Site::Expired, "certificate expired"),
        (Site::WrongHost, "not valid for the origin's host name"),
        (Site::SelfSigned, "unknown issuer"),
        (Site::PlainHttp, "protocol error"),
    ] {
        let gw = gateway(&nginx.url(site), &["--origin-ca", &ca], "");
        let n = 12;
        for i in 0..n {
            let res = client.get(&format!("{}/x/{i}", gw.url()), &[]).await;
            assert_eq!(res.status, 502, "{site:?}: {}", res.text());
            assert_eq!(res.json()["code"], "origin_tls_failed", "{site:?}");
            assert!(
                res.header("content-type")
                    .unwrap()
                    .starts_with("application/problem+json")
            );
        }
        assert_eq!(
            metric(&gw.url(), "sluice_upstream_errors_total{kind=\"tls\"}").await,
            f64::from(n),
            "{site:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let lines = tls_failure_lines(&gw);
        assert_eq!(lines.len(), 1, "{site:?}: one line per cause: {lines:#?}");
        assert!(lines[0].contains(cause), "{site:?}: {}", lines[0]);
        assert!(nginx.requests(site).is_empty() || site == Site::PlainHttp);
    }

    // A TCP failure on an https URL keeps its own code: a port bound
    // without listening (refused, and held so no other test takes it).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = format!("https://127.0.0.1:{}", held.local_addr().unwrap().port());
    let gw = gateway(&closed, &["--origin-ca", &ca], "");
    let res = client.get(&format!("{}/x", gw.url()), &[]).await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert_eq!(res.json()["code"], "origin_unreachable");
    assert!(tls_failure_lines(&gw).is_empty());
}

#[tokio::test]
async fn the_system_roots_do_not_trust_a_private_ca() {
    let _serial = SERIAL.lock().await;
    let Some(nginx) = Nginx::start("the_system_roots_do_not_trust_a_private_ca", None) else {
        return;
    };
    // No --origin-ca: verified against the system's roots, which do not
    // know the test CA.
    let gw = gateway(&nginx.url(Site::H2), &[], "");
    let res = TestClient::new().get(&format!("{}/x", gw.url()), &[]).await;
    assert_eq!(res.status, 502, "{}", res.text());
    assert_eq!(res.json()["code"], "origin_tls_failed");
}

#[tokio::test]
async fn insecure_skip_verify_passes_a_self_signed_origin_and_says_so() {
    let _serial = SERIAL.lock().await;
    let Some(nginx) = Nginx::start("insecure_skip_verify", None) else {
        return;
    };
    let gw = gateway(
        &nginx.url(Site::SelfSigned),
        &[],
        "[proxy]\ninsecure_skip_verify = true\n",
    );
    let res = TestClient::new().get(&format!("{}/x", gw.url()), &[]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.text().trim(), HELLO);
    assert_eq!(metric(&gw.url(), "sluice_origin_tls_insecure").await, 1.0);
    let warned: Vec<String> = gw
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("\"level\":\"WARN\"") && l.contains("insecure_skip_verify"))
        .collect();
    assert_eq!(warned.len(), 1, "{:#?}", gw.log_lines());
    assert!(warned[0].contains("NOT verified"), "{}", warned[0]);
}

/// Through an HTTP/2 origin: a streamed upload and download arrive whole,
/// the forwarding headers arrive, and a WebSocket (which takes an
/// HTTP/1.1 connection of its own) echoes.
#[tokio::test]
async fn an_https_origin_carries_bodies_headers_and_websockets() {
    let _serial = SERIAL.lock().await;
    let origin = sluice_tests::origin::TestOrigin::start().await;
    let Some(nginx) = Nginx::start("an_https_origin_carries", Some(origin.addr)) else {
        return;
    };
    let gw = gateway(&nginx.url(Site::Front), &["--origin-ca", &nginx.ca()], "");
    let client = TestClient::new();

    let res = client
        .get(&format!("{}/echo/a?b=1", gw.url()), &[("x-custom", "kept")])
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let echo = res.json();
    assert_eq!(echo["path"], "/echo/a");
    assert_eq!(echo["headers"]["x-custom"][0], "kept", "{echo}");
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "http", "{echo}");

    let upload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let sha = sluice_tests::hex(&<sha2::Sha256 as sha2::Digest>::digest(&upload));
    let res = client
        .call(
            http::Method::POST,
            &format!("{}/echo/upload", gw.url()),
            &[("content-type", "application/octet-stream")],
            body(upload),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["body_bytes"], 3_000_000);
    assert_eq!(res.json()["body_sha256"], sha.as_str());

    let res = client
        .get(&format!("{}/bytes/2000000", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.body.len(), 2_000_000);
    let got = sluice_tests::hex(&<sha2::Sha256 as sha2::Digest>::digest(&res.body));
    assert_eq!(Some(got.as_str()), res.header("x-body-sha256"));

    {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let (mut ws, res) = tokio_tungstenite::connect_async(format!("ws://{}/ws", gw.addr))
            .await
            .expect("websocket handshake through the gateway and nginx");
        assert_eq!(res.status(), 101);
        for i in 0..3 {
            let msg = format!("hello {i}");
            ws.send(Message::text(msg.clone())).await.unwrap();
            let echoed = tokio::time::timeout(Duration::from_secs(5), ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(echoed.into_text().unwrap().as_str(), msg);
        }
        ws.close(None).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = nginx.requests(Site::Front);
    assert!(
        seen.iter().filter(|r| r.1 == "HTTP/2.0").count() >= 3,
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|r| r.1 == "HTTP/1.1"),
        "the WebSocket over HTTP/1.1: {seen:?}"
    );
}

/// `sluice serve` with `args`: its exit code and stderr, within 20 s.
fn serve_fails(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(sluice_bin())
        .arg("serve")
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .args(args)
        .env_remove("SLUICE_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (None, "still running after 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_missing_or_garbage_origin_ca_is_refused_before_listening() {
    let _serial = SERIAL.blocking_lock();
    let dir = std::env::temp_dir().join(format!(
        "sluice-origin-ca-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.pem");
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "this is no certificate\n").unwrap();
    for ca in [&missing, &garbage] {
        let (code, err) = serve_fails(&[
            "--origin",
            "https://localhost:1",
            "--origin-ca",
            ca.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(64), "{err}");
        assert!(
            err.contains("proxy.origin_ca") && err.contains("--origin-ca"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");

        // check-config reads the same key from the file.
        let config = temp_file(
            "sluice.toml",
            &format!(
                "origin = \"https://localhost:1\"\n[proxy]\norigin_ca = \"{}\"\n",
                ca.display()
            ),
        );
        let out = Command::new(sluice_bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{err}");
        assert!(err.contains("proxy.origin_ca"), "{err}");
    }
    // Verifying against a CA and verifying nothing: which one was meant?
    let certs = Certs::make(&dir.join("certs"));
    let config = temp_file(
        "sluice.toml",
        &format!(
            "origin = \"https://localhost:1\"\n[proxy]\norigin_ca = \"{}\"\ninsecure_skip_verify = true\n",
            certs.ca()
        ),
    );
    let out = Command::new(sluice_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("proxy.insecure_skip_verify"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
