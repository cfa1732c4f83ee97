//! The HTTPS listener (`[server.tls]`, `--tls-cert`/`--tls-key`) of the
//! real `sluice` binary: certificates made here (rcgen), real TLS peers
//! (curl, `openssl s_client`, a rustls client), a real origin behind.
//!
//! curl and openssl are needed: under `CI=true` a missing one fails the
//! test, otherwise it is skipped with a loud line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::client::TestClient;
use sluice_tests::origin::TestOrigin;
use sluice_tests::redis_server::free_port;
use sluice_tests::tls::{self, Leaf, TestCa};
use sluice_tests::visitor::Visitor;
use sluice_tests::{ADMIN_TOKEN, GatewayProcess, temp_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// === helpers ===

/// Whether `tool` runs; a failure under `CI=true`, else a loud skip.
fn have(tool: &str, what: &str) -> bool {
    let runs = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
        || Command::new(tool)
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
    if runs {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{tool} not found: CI=true requires it (apt-get install {tool})"
    );
    eprintln!("\n*** SKIPPED: {tool} not found; {what} did not run ***\n");
    false
}

/// `sluice serve` over HTTPS with `leaf`, in front of `origin`, with the
/// test admin token and `extra` flags.
fn https_gateway(
    ca: &TestCa,
    leaf: &Leaf,
    origin: &str,
    extra: &[&str],
    filter: Option<&str>,
) -> GatewayProcess {
    let (cert, key) = (leaf.cert.to_str().unwrap(), leaf.key.to_str().unwrap());
    let mut args = vec![
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--origin",
        origin,
        "--admin-token",
        ADMIN_TOKEN,
    ];
    args.extend_from_slice(extra);
    GatewayProcess::start_https(&args, &ca.https_client(), filter)
}

/// One metric sample of a gateway at `base` read through `client`.
async fn metric(client: &TestClient, base: &str, sample: &str) -> f64 {
    let res = client
        .get(
            &format!("{base}/metrics"),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let prefix = format!("{sample} ");
    res.text()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// The `Set-Cookie` values of an answer.
fn set_cookies(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// A config file with one easy room `default` guarding `/echo`, and more
/// TOML after it.
fn shop_config(more: &str) -> std::path::PathBuf {
    temp_file(
        "sluice.toml",
        &format!(
            "{more}\n[[rooms]]\nid = \"default\"\npaths = [\"/echo\"]\nrate_per_sec = 50\nburst = 50\n\
             puzzles = 1\ndifficulty_floor_bits = 2\ndifficulty_ceiling_bits = 4\n\
             join_limit_per_prefix_per_min = 0\nattack_min_solve = \"0s\"\n"
        ),
    )
}

/// Replaces a file's content in one step (write aside, rename), as a
/// certificate manager does.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

/// Waits (up to `limit`) until the gateway at `addr` presents `want` for
/// `localhost`.
async fn serves(addr: SocketAddr, ca: &TestCa, want: &Leaf, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(der) = tls::presented(addr, "localhost", ca).await
            && der == want.der
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// `openssl s_client` against `addr` with `args`; its output (stdout and
/// stderr), bounded in time (stdin closed: it ends after the handshake).
fn s_client(addr: SocketAddr, args: &[&str]) -> String {
    let connect = addr.to_string();
    let out = Command::new("timeout")
        .args(["10", "openssl", "s_client", "-connect", &connect])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// === protocols ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_gets_h2_and_http11_by_alpn() {
    if !have("curl", "the curl ALPN test") {
        return;
    }
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let leaf = ca.leaf(&["localhost", "127.0.0.1"]);
    let gw = https_gateway(&ca, &leaf, &origin.url(), &[], None);
    let url = format!("{}/_sluice/healthz", gw.url());
    for (flag, want) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-o", "/dev/null"])
            .args(["-w", "%{http_version} %{http_code}"])
            .args(["--cacert", ca.cert.to_str().unwrap(), flag, &url])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text,
            format!("{want} 200"),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Without the CA, curl refuses the certificate: it is really checked.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null", &url])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visitor_over_https_gets_host_prefixed_secure_cookies_and_reaches_the_origin() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let leaf = ca.leaf(&["localhost"]);
    // Two a second, no burst: the first visitor is admitted on joining,
    // the second waits in line.
    let config = temp_file(
        "sluice.toml",
        "[[rooms]]\nid = \"default\"\npaths = [\"/echo\"]\nrate_per_sec = 2\nburst = 1\n\
         puzzles = 1\ndifficulty_floor_bits = 2\ndifficulty_ceiling_bits = 4\n\
         join_limit_per_prefix_per_min = 0\nattack_min_solve = \"0s\"\n",
    );
    let gw = https_gateway(
        &ca,
        &leaf,
        &origin.url(),
        &["--config", config.to_str().unwrap()],
        None,
    );
    let client = ca.https_client();
    let base = gw.url();
    let mut first = Visitor::with_client(&base, "default", client.clone());
    let joined = first.join("/echo/item").await;
    assert_eq!(joined.status, 200, "{}", joined.text());
    assert_host_cookie(&joined.headers, "__Host-sluice_a_default=");
    let mut v = Visitor::with_client(&base, "default", client.clone());
    let joined = v.join("/echo/item").await;
    assert_eq!(joined.status, 201, "{}", joined.text());
    assert_host_cookie(&joined.headers, "__Host-sluice_q_default=");
    // Polled until admitted: the admission comes as a __Host- cookie too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let res = v.status().await;
        assert_eq!(res.status, 200, "{}", res.text());
        if res.json()["state"] == "admitted" {
            assert_host_cookie(&res.headers, "__Host-sluice_a_default=");
            break;
        }
        assert!(Instant::now() < deadline, "never admitted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let token = v.admission_token.clone().unwrap();
    // The admission cookie by its __Host- name reaches the origin, over h2
    // or HTTP/1.1, whichever ALPN settled.
    for name in ["__Host-sluice_a_default", "sluice_a_default"] {
        let res = client
            .get(
                &format!("{base}/echo/shop"),
                &[
                    ("cookie", &format!("{name}={token}")),
                    ("accept", "application/json"),
                ],
            )
            .await;
        assert_eq!(res.status, 200, "{name}: {}", res.text());
        assert_eq!(res.json()["path"], "/echo/shop", "{name}");
    }
    // The origin hears that the visitor came over https.
    let res = client
        .get(
            &format!("{base}/echo/shop"),
            &[
                ("cookie", &format!("__Host-sluice_a_default={token}")),
                ("accept", "application/json"),
            ],
        )
        .await;
    let headers = &res.json()["headers"];
    assert_eq!(headers["x-forwarded-proto"][0], "https", "{headers}");
}

/// The answer sets cookie `prefix…` with the flags of https.
fn assert_host_cookie(headers: &http::HeaderMap, prefix: &str) {
    let cookies = set_cookies(headers);
    let cookie = cookies
        .iter()
        .find(|c| c.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {cookies:?}"));
    for flag in ["Secure", "HttpOnly", "Path=/", "SameSite=Lax"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    assert!(!cookie.contains("Domain"), "{cookie}");
}

// === certificates ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_each_certificate_and_the_default_otherwise() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let default = ca.leaf(&["localhost"]);
    let a = ca.leaf(&["a.test"]);
    let b = ca.leaf(&["b.test", "*.wild.test"]);
    let config = temp_file(
        "sluice.toml",
        &format!(
            "[server.tls]\ncert = {:?}\nkey = {:?}\n\
             [[server.tls.sni]]\ncert = {:?}\nkey = {:?}\n\
             [[server.tls.sni]]\ncert = {:?}\nkey = {:?}\n",
            default.cert, default.key, a.cert, a.key, b.cert, b.key
        ),
    );
    let gw = GatewayProcess::start_https(
        &[
            "--origin",
            &origin.url(),
            "--config",
            config.to_str().unwrap(),
        ],
        &ca.https_client(),
        None,
    );
    for (name, want) in [
        ("a.test", &a),
        ("b.test", &b),
        ("x.wild.test", &b),
        ("localhost", &default),
        ("other.test", &default),
    ] {
        let got = tls::presented_unchecked(gw.addr, name).await.unwrap();
        assert!(got == want.der, "{name}: another certificate");
    }
    // The same seen by openssl, verifying each name against the CA.
    if have("openssl", "the openssl SNI check") {
        let ca_file = ca.cert.to_str().unwrap();
        for name in ["a.test", "b.test", "x.wild.test"] {
            let out = s_client(
                gw.addr,
                &[
                    "-servername",
                    name,
                    "-verify_hostname",
                    name,
                    "-CAfile",
                    ca_file,
                ],
            );
            assert!(out.contains("Verify return code: 0 (ok)"), "{name}: {out}");
        }
        let out = s_client(
            gw.addr,
            &[
                "-servername",
                "a.test",
                "-verify_hostname",
                "b.test",
                "-CAfile",
                ca_file,
            ],
        );
        assert!(!out.contains("Verify return code: 0 (ok)"), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_and_1_3_are_accepted_older_refused_and_min_1_3_holds() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let leaf = ca.leaf(&["localhost"]);
    let gw = https_gateway(&ca, &leaf, &origin.url(), &[], None);
    for v in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let tls = tls::connect(gw.addr, "localhost", ca.client_config(&[], &[v]))
            .await
            .unwrap_or_else(|e| panic!("{:?} refused: {e}", v.version));
        assert_eq!(tls.get_ref().1.protocol_version(), Some(v.version));
    }
    if have("openssl", "the TLS 1.0/1.1 refusal check") {
        for flag in ["-tls1", "-tls1_1"] {
            // The client's own floor lowered, so it really offers them.
            let out = s_client(gw.addr, &[flag, "-cipher", "DEFAULT@SECLEVEL=0"]);
            // The server answers with an alert; nothing is negotiated.
            assert!(
                out.contains("Cipher is (NONE)") && out.contains("alert"),
                "{flag} accepted: {out}"
            );
        }
        let out = s_client(gw.addr, &["-tls1_2"]);
        assert!(out.contains("TLSv1.2"), "{out}");
    }
    let config = temp_file("sluice.toml", "[server.tls]\nmin_version = \"1.3\"\n");
    let strict = https_gateway(
        &ca,
        &leaf,
        &origin.url(),
        &["--config", config.to_str().unwrap()],
        None,
    );
    let refused = tls::connect(
        strict.addr,
        "localhost",
        ca.client_config(&[], &[&rustls::version::TLS12]),
    )
    .await;
    assert!(refused.is_err(), "TLS 1.2 accepted with min_version 1.3");
    tls::connect(
        strict.addr,
        "localhost",
        ca.client_config(&[], &[&rustls::version::TLS13]),
    )
    .await
    .unwrap();
}

/// Files a gateway reads its certificate from, holding `first`'s.
fn live_files(ca: &TestCa, first: &Leaf) -> Leaf {
    let live = ca.leaf(&["localhost"]);
    replace(&live.cert, &first.cert_pem);
    replace(&live.key, &first.key_pem);
    live
}

/// Puts `leaf` in the `live` files.
fn install(live: &Leaf, leaf: &Leaf) {
    replace(&live.cert, &leaf.cert_pem);
    replace(&live.key, &leaf.key_pem);
}

/// ERROR lines of a failed TLS reload in a gateway's log.
fn reload_errors(gw: &GatewayProcess) -> usize {
    gw.log_lines()
        .iter()
        .filter(|l| l.contains("\"ERROR\"") && l.contains("TLS reload failed"))
        .count()
}

const BROKEN_KEY: &str = "-----BEGIN PRIVATE KEY-----\nYnJva2Vu\n-----END PRIVATE KEY-----\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificates_and_a_broken_one_keeps_the_old() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let first = ca.leaf(&["localhost"]);
    let live = live_files(&ca, &first);
    // No file check within the test: only the signal reloads.
    let config = temp_file("sluice.toml", "[server.tls]\nreload_check = \"1h\"\n");
    let gw = https_gateway(
        &ca,
        &live,
        &origin.url(),
        &["--config", config.to_str().unwrap()],
        Some("warn"),
    );
    let client = ca.https_client();
    assert!(serves(gw.addr, &ca, &first, Duration::from_secs(2)).await);
    let second = ca.leaf(&["localhost"]);
    install(&live, &second);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(serves(gw.addr, &ca, &first, Duration::from_secs(1)).await);
    gw.signal("HUP");
    assert!(
        serves(gw.addr, &ca, &second, Duration::from_secs(3)).await,
        "SIGHUP did not reload"
    );
    let ok = metric(
        &client,
        &gw.url(),
        "sluice_tls_reloads_total{result=\"ok\"}",
    )
    .await;
    assert_eq!(ok, 1.0);

    // A broken key, then a key that is not the certificate's: each SIGHUP
    // fails, is counted and logged at ERROR once, and the second
    // certificate keeps serving.
    replace(&live.key, BROKEN_KEY);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stranger = ca.leaf(&["localhost"]);
    replace(&live.key, &stranger.key_pem);
    gw.signal("HUP");
    let failed = "sluice_tls_reloads_total{result=\"failed\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&client, &gw.url(), failed).await < 2.0 {
        assert!(Instant::now() < deadline, "failed reloads not counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serves(gw.addr, &ca, &second, Duration::from_secs(1)).await);
    assert_eq!(reload_errors(&gw), 2, "one ERROR line per failed reload");
    let res = client
        .get(&format!("{}/_sluice/healthz", gw.url()), &[])
        .await;
    assert_eq!(res.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_change_reloads_without_a_signal_and_a_broken_file_fails_once() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let first = ca.leaf(&["localhost"]);
    let live = live_files(&ca, &first);
    let config = temp_file("sluice.toml", "[server.tls]\nreload_check = \"200ms\"\n");
    let gw = https_gateway(
        &ca,
        &live,
        &origin.url(),
        &["--config", config.to_str().unwrap()],
        Some("warn"),
    );
    let client = ca.https_client();
    assert!(serves(gw.addr, &ca, &first, Duration::from_secs(2)).await);
    let second = ca.leaf(&["localhost"]);
    install(&live, &second);
    assert!(
        serves(gw.addr, &ca, &second, Duration::from_secs(5)).await,
        "a file change did not reload"
    );
    // Broken: tried once (not at every check), the second kept.
    replace(&live.key, BROKEN_KEY);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let failed = "sluice_tls_reloads_total{result=\"failed\"}";
    assert_eq!(metric(&client, &gw.url(), failed).await, 1.0);
    assert_eq!(reload_errors(&gw), 1);
    assert!(serves(gw.addr, &ca, &second, Duration::from_secs(1)).await);
    // Mended: the next change reloads.
    let third = ca.leaf(&["localhost"]);
    install(&live, &third);
    assert!(serves(gw.addr, &ca, &third, Duration::from_secs(5)).await);
}

#[test]
fn a_bad_certificate_or_key_exits_64_naming_it() {
    let ca = TestCa::new();
    let good = ca.leaf(&["localhost"]);
    let other = ca.leaf(&["localhost"]);
    let garbage = temp_file("garbage.pem", "not a key at all\n");
    let missing = good.key.with_file_name("missing.key");
    let cases: [(&Path, &Path, &str); 4] = [
        (&good.cert, &missing, "server.tls.key"),
        (&good.cert, &garbage, "server.tls.key"),
        (&good.cert, &other.key, "server.tls.key"),
        (&garbage, &good.key, "server.tls.cert"),
    ];
    for (cert, key, field) in cases {
        let out = Command::new(sluice_tests::sluice_bin())
            .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .env_remove("SLUICE_CONFIG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{field}: {err}");
        assert!(err.contains(field), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        // check-config refuses the same file alike.
        let config = temp_file(
            "sluice.toml",
            &format!("[server.tls]\ncert = {cert:?}\nkey = {key:?}\n"),
        );
        let out = Command::new(sluice_tests::sluice_bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "check-config {field}: {err}");
        assert!(err.contains(field), "{err}");
    }
}

// === the plain listener beside ===

/// The tests that pick a port for the plain listener themselves, one at a
/// time: a port picked free is not bound until the gateway starts, so two
/// such tests picking at once may pick alike (both once failed together,
/// "exited before listening", in one run of many).
static PLAIN_PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_listener_redirects_to_https_but_lets_the_probes_through() {
    let _one_at_a_time = PLAIN_PORTS.lock().await;
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let leaf = ca.leaf(&["localhost"]);
    let plain = free_port();
    let config = temp_file(
        "sluice.toml",
        &format!("[server.tls]\nhttp_listen = \"127.0.0.1:{plain}\"\nredirect_to_https = true\n"),
    );
    let gw = https_gateway(
        &ca,
        &leaf,
        &origin.url(),
        &["--config", config.to_str().unwrap()],
        None,
    );
    let http = TestClient::new();
    let res = http
        .get(
            &format!("http://127.0.0.1:{plain}/a/./b?c=d&e"),
            &[("host", "Shop.Test:8080")],
        )
        .await;
    assert_eq!(res.status, 308);
    let port = gw.addr.port();
    assert_eq!(
        res.header("location"),
        Some(format!("https://shop.test:{port}/a/b?c=d&e").as_str())
    );
    assert_eq!(
        origin.requests(),
        0,
        "a redirected request reached the origin"
    );
    for probe in ["/_sluice/healthz", "/_sluice/readyz", "/_sluice/serving"] {
        let res = http
            .get(&format!("http://127.0.0.1:{plain}{probe}"), &[])
            .await;
        assert_eq!(res.status, 200, "{probe}");
    }
    // Following the redirect lands on the TLS listener.
    let res = ca
        .https_client()
        .get(&format!("https://localhost:{port}/echo/x"), &[])
        .await;
    assert_eq!(res.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_listener_serves_when_not_redirecting() {
    let _one_at_a_time = PLAIN_PORTS.lock().await;
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let leaf = ca.leaf(&["localhost"]);
    let plain = free_port();
    let config = shop_config(&format!(
        "[server.tls]\nhttp_listen = \"127.0.0.1:{plain}\"\nredirect_to_https = false\n"
    ));
    let _gw = https_gateway(
        &ca,
        &leaf,
        &origin.url(),
        &["--config", config.to_str().unwrap()],
        None,
    );
    let res = TestClient::new()
        .get(
            &format!("http://127.0.0.1:{plain}/echo/x"),
            &[("accept", "application/json")],
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // Over plain HTTP the cookie is the plain one, not Secure.
    let cookies = set_cookies(&res.headers);
    assert!(
        cookies
            .iter()
            .any(|c| c.starts_with("sluice_a_default=") && !c.contains("Secure")),
        "{cookies:?}"
    );
}

// === https said by a trusted proxy ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_https_gives_host_prefixed_cookies_an_untrusted_peers_does_not() {
    let origin = TestOrigin::start().await;
    for (trusted, want_host) in [(true, true), (false, false)] {
        let more = if trusted {
            "trusted_proxies = [\"127.0.0.1/32\"]\n"
        } else {
            ""
        };
        let config = shop_config(more);
        let gw = GatewayProcess::start(&[
            "--origin",
            &origin.url(),
            "--config",
            config.to_str().unwrap(),
        ]);
        // The idle room lets the first request through at once, setting
        // the admission cookie.
        let res = TestClient::new()
            .get(
                &format!("{}/echo/x", gw.url()),
                &[
                    ("x-forwarded-proto", "https"),
                    ("accept", "application/json"),
                ],
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        let cookies = set_cookies(&res.headers);
        let admission = cookies
            .iter()
            .find(|c| c.contains("sluice_a_default="))
            .unwrap_or_else(|| panic!("no admission cookie: {cookies:?}"));
        assert_eq!(
            admission.starts_with("__Host-sluice_a_default=") && admission.contains("Secure"),
            want_host,
            "trusted={trusted}: {admission}"
        );
    }
}

// === hostile clients ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_neither_panic_nor_block_the_others() {
    let origin = TestOrigin::start().await;
    let ca = TestCa::new();
    let leaf = ca.leaf(&["localhost"]);
    let config = temp_file("sluice.toml", "[timeouts]\nheader_read = \"1s\"\n");
    let mut gw = https_gateway(
        &ca,
        &leaf,
        &origin.url(),
        &["--config", config.to_str().unwrap()],
        Some("warn"),
    );
    let client = ca.https_client();
    let base = gw.url();
    let addr = gw.addr;

    // Plain HTTP to the TLS port: refused, closed, no answer hangs.
    let started = Instant::now();
    let text = sluice_tests::client::raw(
        addr,
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(!text.contains("HTTP/1.1 200"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(3), "not closed");

    // A truncated handshake: half a ClientHello, then the client goes.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&[
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ])
    .await
    .unwrap();
    drop(s);

    // Clients that never finish: silent, and stalled mid-ClientHello.
    let silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();

    // Meanwhile a real visitor is served at once.
    let t = Instant::now();
    let res = client.get(&format!("{base}/_sluice/healthz"), &[]).await;
    assert_eq!(res.status, 200);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());

    // The deadline (timeouts.header_read, 1 s) closes both.
    for (name, mut s) in [("silent", silent), ("stalled", stalled)] {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(4), s.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(_)) | Ok(Err(_))),
            "{name}: still open after the handshake deadline"
        );
    }
    let failures = metric(&client, &base, "sluice_tls_handshake_failures_total").await;
    assert!(failures >= 4.0, "{failures}");
    // Alive, serving, and no panic or ERROR for any of it.
    assert_eq!(
        client
            .get(&format!("{base}/_sluice/healthz"), &[])
            .await
            .status,
        200
    );
    let bad: Vec<String> = gw
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("panicked") || l.contains("\"ERROR\""))
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
    gw.signal("TERM");
    assert_eq!(gw.wait(Duration::from_secs(10)), Some(0));
}
