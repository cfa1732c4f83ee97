//! The deploy files run, on this machine, without a container engine:
//!
//! - the compose topology started natively: each service's command, env
//!   and files from `deploy/compose.yaml`, host names rewritten to loopback
//!   ports (Redis by `redis-server`, the gateways by the built `sluice`,
//!   Prometheus by Debian's `prometheus` with `deploy/prometheus.yml`);
//!   the demo shop answers through each gateway and Prometheus's `up` is 1
//!   for both, i.e. it authenticated to `/metrics`;
//! - the Kubernetes pod's user and files reproduced: the key Secret laid
//!   out as the kubelet lays it out (`..data` symlinks, `defaultMode`,
//!   group = `fsGroup`), `sluice serve` run as `runAsUser`/`runAsGroup`
//!   with the `fsGroup` as its supplementary group: it becomes ready; the
//!   old layout (0400, root's group, no `fsGroup`) fails to start;
//! - the systemd unit's static user reading `/etc/sluice` by its group, as
//!   the unit's header lays it out; a user outside that group (what
//!   `DynamicUser` was) cannot start;
//! - readiness keeps a gateway in the load balancer through a store outage
//!   (named in the body and in `sluice_store_up`) and fails it when it
//!   drains.
//!
//! Running as another user needs root (and `setpriv`): without it, and
//! outside CI, those tests say loudly that they were skipped. Under
//! `CI=true` a missing tool or privilege is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{PermissionsExt, chown, lchown, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::redis_server::{RedisServer, free_port};
use sluice_tests::sluice_bin;
use yaml_rust2::{Yaml, YamlLoader};

// === support ===

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether a test may go on: `ok`, or else a loud skip (a failure in CI).
fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    assert!(!ci(), "{what}: CI=true requires it");
    eprintln!("\n*** SKIPPED: {what}; this test did not run ***\n");
    false
}

fn found(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-deploy-{name}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn load_yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap();
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .remove(0)
}

/// A mapping with its `<<` merge key applied (yaml-rust2 keeps it as a key).
fn merged(node: &Yaml) -> Yaml {
    let Yaml::Hash(h) = node else {
        return node.clone();
    };
    let mut out = match h.get(&Yaml::String("<<".into())) {
        Some(Yaml::Hash(base)) => base.clone(),
        _ => Default::default(),
    };
    for (k, v) in h {
        if k.as_str() != Some("<<") {
            out.insert(k.clone(), v.clone());
        }
    }
    Yaml::Hash(out)
}

fn strings(node: &Yaml) -> Vec<String> {
    node.as_vec()
        .map(|v| {
            v.iter()
                .map(|s| match s {
                    Yaml::String(s) => s.clone(),
                    other => format!("{}", other.as_i64().unwrap()),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One HTTP/1.0 GET on loopback (no keep-alive, no chunking): the status
/// and body, or None when nothing answered.
fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Polls `check` until it gives a value or `limit` passes.
fn until<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Children killed when the test ends, each logging into a file.
#[derive(Debug, Default)]
struct Procs(Vec<(String, Child, PathBuf)>);

impl Procs {
    fn spawn(&mut self, name: &str, mut cmd: Command, logs: &Path) {
        let log = logs.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        cmd.stdout(file.try_clone().unwrap()).stderr(file);
        // the test's own settings must not leak into the services
        for (k, _) in std::env::vars() {
            if k.starts_with("SLUICE_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start: {e}"));
        self.0.push((name.to_owned(), child, log));
    }

    /// Every child's log, for a failure's message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for (name, _, log) in &self.0 {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {name}:\n"));
            for l in tail.iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_ready(port: u16, procs: &Procs) {
    let ready = until(Duration::from_secs(30), || {
        http_get(port, "/_sluice/serving", &[]).filter(|(s, _)| *s == 200)
    });
    assert!(
        ready.is_some(),
        "the gateway on {port} never became ready:\n{}",
        procs.logs()
    );
}

/// An admission cookie for `room` signed by the newest key in `keys`.
fn admission_cookie(keys: &Path, room: &str) -> String {
    let ring = sluice_admission::Keyring::load_dir(keys).unwrap();
    let claims = sluice_admission::AdmitClaims::new(
        room,
        &sluice_admission::new_visitor_id(),
        1,
        sluice_gateway::app::now_s(),
        Duration::from_secs(600),
    );
    format!("sluice_a_{room}={}", ring.sign_admit(&claims).unwrap())
}

fn keygen(dir: &Path) {
    let out = Command::new(sluice_bin())
        .arg("keygen")
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// === compose ===

/// The compose file's services, turned into processes on loopback.
struct Topology {
    deploy: PathBuf,
    tmp: PathBuf,
    compose: Yaml,
    /// service → its loopback port.
    ports: HashMap<String, u16>,
    /// `${VAR}` values the compose file reads from `.env`.
    vars: HashMap<String, String>,
}

impl Topology {
    fn new() -> Topology {
        let deploy = deploy();
        let compose = load_yaml(&deploy.join("compose.yaml"));
        let ports = compose["services"]
            .as_hash()
            .unwrap()
            .keys()
            .map(|k| (k.as_str().unwrap().to_owned(), free_port()))
            .collect();
        let vars = [
            "SLUICE_ADMIN_TOKEN",
            "SLUICE_POW_SECRET",
            "SLUICE_WEBHOOK_SECRET",
        ]
        .iter()
        .map(|k| {
            (
                k.to_string(),
                format!("{}-{:016x}", k.to_lowercase(), rand::random::<u64>()),
            )
        })
        .collect();
        Topology {
            deploy,
            tmp: temp_dir("compose"),
            compose,
            ports,
            vars,
        }
    }

    fn service(&self, name: &str) -> Yaml {
        merged(&self.compose["services"][name])
    }

    /// The port a service listens on inside its container.
    fn container_port(&self, name: &str) -> u16 {
        let svc = self.service(name);
        if let Some(p) = strings(&svc["ports"]).first() {
            return p.rsplit(':').next().unwrap().parse().unwrap();
        }
        let image = svc["image"].as_str().unwrap_or("");
        assert!(image.starts_with("redis:"), "{name}: which port?");
        6379
    }

    /// `${VAR}`, `${VAR:?message}` and `${VAR:-default}` from `.env`.
    fn interpolate(&self, s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let end = rest[i..].find('}').unwrap() + i;
            let inner = &rest[i + 2..end];
            let name = inner.split([':', '-', '?']).next().unwrap();
            out.push_str(
                self.vars
                    .get(name)
                    .unwrap_or_else(|| panic!("${{{name}}}?")),
            );
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    /// Container paths of a service → files here: its volumes (`./keys`
    /// made by `sluice keygen` as the compose file's header says; named
    /// volumes as fresh directories) and its secrets (`/run/secrets/NAME`).
    fn paths(&self, name: &str) -> Vec<(String, PathBuf)> {
        let svc = self.service(name);
        let mut out = Vec::new();
        for v in strings(&svc["volumes"]) {
            let mut parts = v.split(':');
            let (src, dst) = (parts.next().unwrap(), parts.next().unwrap());
            let host = if src == "./keys" {
                let keys = self.tmp.join("keys");
                if !keys.exists() {
                    keygen(&keys);
                }
                keys
            } else if let Some(rel) = src.strip_prefix("./") {
                self.deploy.join(rel)
            } else {
                let dir = self.tmp.join(format!("volume-{src}"));
                std::fs::create_dir_all(&dir).unwrap();
                dir
            };
            out.push((dst.to_owned(), host));
        }
        for secret in strings(&svc["secrets"]) {
            let var = self.compose["secrets"][secret.as_str()]["environment"]
                .as_str()
                .unwrap_or_else(|| panic!("secret {secret}: from which variable?"));
            let file = self.tmp.join(format!("secret-{secret}"));
            std::fs::write(&file, &self.vars[var]).unwrap();
            out.push((format!("/run/secrets/{secret}"), file));
        }
        out.sort_by_key(|(c, _)| std::cmp::Reverse(c.len()));
        out
    }

    /// A value as the service sees it, with host names and container paths
    /// made loopback ports and files here.
    fn rewrite(&self, s: &str, paths: &[(String, PathBuf)]) -> String {
        let mut s = self.interpolate(s);
        for (svc, port) in &self.ports {
            let from = format!("{svc}:{}", self.container_port(svc));
            s = s.replace(&from, &format!("127.0.0.1:{port}"));
        }
        for (container, host) in paths {
            s = s.replace(container, host.to_str().unwrap());
        }
        s
    }

    fn command(&self, name: &str, paths: &[(String, PathBuf)]) -> Vec<String> {
        strings(&self.service(name)["command"])
            .iter()
            .map(|a| self.rewrite(a, paths))
            .collect()
    }

    fn start_redis(&self, name: &str, procs: &mut Procs) {
        let paths = self.paths(name);
        let args = self.command(name, &paths);
        assert_eq!(args[0], "redis-server");
        let data = paths
            .iter()
            .find(|(c, _)| c == "/data")
            .map(|(_, h)| h.clone())
            .unwrap();
        let mut cmd = Command::new("redis-server");
        cmd.args(&args[1..])
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.ports[name].to_string())
            .arg("--dir")
            .arg(data);
        procs.spawn(name, cmd, &self.tmp);
    }

    fn start_gateway(&self, name: &str, procs: &mut Procs) {
        let paths = self.paths(name);
        let svc = self.service(name);
        let mut cmd = Command::new(sluice_bin());
        cmd.args(self.command(name, &paths));
        let env = svc["environment"].as_hash().unwrap();
        assert!(
            env.contains_key(&Yaml::String("SLUICE_LISTEN".into())),
            "{name}: the compose file says where the gateway listens"
        );
        for (k, v) in env {
            let (k, v) = (k.as_str().unwrap(), v.as_str().unwrap());
            let v = if k == "SLUICE_LISTEN" {
                assert!(v.ends_with(&format!(":{}", self.container_port(name))));
                format!("127.0.0.1:{}", self.ports[name])
            } else {
                self.rewrite(v, &paths)
            };
            cmd.env(k, v);
        }
        procs.spawn(name, cmd, &self.tmp);
    }

    fn start_prometheus(&self, name: &str, procs: &mut Procs) {
        let mut paths = self.paths(name);
        // its config: deploy/prometheus.yml with host names and files made
        // local, and a shorter scrape interval (a bounded test)
        let config = paths
            .iter_mut()
            .find(|(c, _)| c.ends_with("prometheus.yml"))
            .expect("prometheus.yml mounted");
        let text = std::fs::read_to_string(&config.1).unwrap();
        let copy = self.tmp.join("prometheus.yml");
        config.1 = copy.clone();
        let text = self
            .rewrite(&text, &paths)
            .replace("scrape_interval: 5s", "scrape_interval: 1s");
        std::fs::write(&copy, text).unwrap();
        let storage = self.tmp.join("prometheus-data");
        let mut cmd = Command::new("prometheus");
        for arg in self.command(name, &paths) {
            match arg.split_once('=') {
                Some(("--storage.tsdb.path", _)) => {
                    cmd.arg(format!("--storage.tsdb.path={}", storage.display()))
                }
                _ => cmd.arg(arg),
            };
        }
        cmd.arg(format!(
            "--web.listen-address=127.0.0.1:{}",
            self.ports[name]
        ));
        procs.spawn(name, cmd, &self.tmp);
    }
}

/// Prometheus's `up` for each instance of job `sluice`.
fn prometheus_up(port: u16) -> HashMap<String, String> {
    let Some((200, body)) = http_get(port, "/api/v1/query?query=up", &[]) else {
        return HashMap::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["metric"]["job"] == "sluice")
        .map(|r| {
            (
                r["metric"]["instance"].as_str().unwrap_or("").to_owned(),
                r["value"][1].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_compose_topology_runs_natively_with_the_demo_shop_and_an_authenticated_prometheus() {
    if !require(found("redis-server"), "redis-server not found")
        || !require(
            found("prometheus"),
            "prometheus not found (apt-get install prometheus)",
        )
    {
        return;
    }
    let topo = Topology::new();
    let mut procs = Procs::default();
    let mut gateways = Vec::new();
    let mut prometheus = None;
    let services: Vec<String> = topo.ports.keys().cloned().collect();
    for kind in ["redis:", "sluice:", "prom/prometheus:", "grafana/"] {
        for name in &services {
            let image = topo.service(name)["image"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            if !image.starts_with(kind) {
                continue;
            }
            match kind {
                "redis:" => topo.start_redis(name, &mut procs),
                "sluice:" => {
                    topo.start_gateway(name, &mut procs);
                    gateways.push(name.clone());
                }
                "prom/prometheus:" => {
                    topo.start_prometheus(name, &mut procs);
                    prometheus = Some(topo.ports[name]);
                }
                _ => eprintln!(
                    "note: {name} ({image}) is not run here: its provisioning is checked by gateway/tests/deploy.rs"
                ),
            }
        }
    }
    assert_eq!(gateways.len(), 2, "two gateways in compose.yaml");
    let keys = topo.tmp.join("keys");
    for name in &gateways {
        let port = topo.ports[name];
        wait_ready(port, &procs);
        // the demo shop, through the gateway, for an admitted visitor
        let cookie = admission_cookie(&keys, "default");
        let page = http_get(port, "/", &[("cookie", &cookie), ("accept", "text/html")]);
        let (status, body) = page.unwrap();
        assert_eq!(status, 200, "{name}: {body}\n{}", procs.logs());
        assert!(
            body.contains("Welcome to the demo shop"),
            "{name} answered another page: {body}"
        );
    }
    let prom = prometheus.expect("a prometheus service");
    let want: Vec<String> = gateways
        .iter()
        .map(|g| format!("127.0.0.1:{}", topo.ports[g]))
        .collect();
    let up = until(Duration::from_secs(40), || {
        let up = prometheus_up(prom);
        want.iter()
            .all(|i| up.get(i).is_some_and(|v| v == "1"))
            .then_some(up)
    });
    assert!(
        up.is_some(),
        "prometheus: up = {:?} (want 1 for {want:?}); targets: {:?}\n{}",
        prometheus_up(prom),
        http_get(prom, "/api/v1/targets", &[]),
        procs.logs()
    );
    let _ = std::fs::remove_dir_all(&topo.tmp);
}

// === the Kubernetes pod and the systemd unit: users and file modes ===

/// Owner, group and mode of a laid-out file or directory.
#[derive(Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
    dir_mode: u32,
    file_mode: u32,
}

fn own(path: &Path, o: Owner, mode: u32) {
    chown(path, Some(o.uid), Some(o.gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The key files of `keys` laid out as the kubelet lays out a Secret
/// volume at `volume`: a timestamped directory holding the files, `..data`
/// pointing at it, and one symlink per key through `..data`.
fn secret_volume(keys: &Path, volume: &Path, o: Owner) {
    let stamp = "..2026_01_01_00_00_00.000000001";
    let data = volume.join(stamp);
    std::fs::create_dir_all(&data).unwrap();
    symlink(stamp, volume.join("..data")).unwrap();
    lchown(volume.join("..data"), Some(o.uid), Some(o.gid)).unwrap();
    for entry in std::fs::read_dir(keys).unwrap() {
        let name = entry.unwrap().file_name();
        let file = data.join(&name);
        std::fs::copy(keys.join(&name), &file).unwrap();
        own(&file, o, o.file_mode);
        let link = volume.join(&name);
        symlink(Path::new("..data").join(&name), &link).unwrap();
        lchown(&link, Some(o.uid), Some(o.gid)).unwrap();
    }
    own(&data, o, o.dir_mode);
    own(volume, o, o.dir_mode);
}

/// `sluice ARGS` as `uid`/`gid` with these supplementary groups, through
/// `setpriv`.
fn as_user(uid: u32, gid: u32, groups: &[u32], args: &[String]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"));
    if groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        cmd.arg(format!("--groups={}", list.join(",")));
    }
    cmd.arg("--").arg(sluice_bin()).args(args);
    cmd
}

/// Runs a gateway and answers it, running, once ready; when it did not
/// become ready, its exit and log say why.
fn ready_or_exit(cmd: Command, port: u16, tmp: &Path, name: &str) -> Result<Procs, String> {
    let mut procs = Procs::default();
    procs.spawn(name, cmd, tmp);
    let outcome = until(Duration::from_secs(30), || {
        if http_get(port, "/_sluice/serving", &[]).is_some_and(|(s, _)| s == 200) {
            return Some(Ok(()));
        }
        match procs.0[0].1.try_wait() {
            Ok(Some(status)) => Some(Err(format!("exited with {status}"))),
            _ => None,
        }
    });
    match outcome {
        Some(Ok(())) => Ok(procs),
        Some(Err(e)) => Err(format!("{e}\n{}", procs.logs())),
        None => Err(format!("neither ready nor exited\n{}", procs.logs())),
    }
}

fn may_switch_users() -> bool {
    require(is_root(), "running as another uid needs root")
        && require(found("setpriv"), "setpriv not found (util-linux)")
}

/// `defaultMode` as Kubernetes reads it (YAML 1.1: a leading 0 is octal;
/// yaml-rust2 would read the digits as decimal).
fn default_mode(deployment_text: &str) -> u32 {
    let raw = deployment_text
        .split("defaultMode:")
        .nth(1)
        .expect("the key Secret has a defaultMode")
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap();
    if raw.len() > 1 && raw.starts_with('0') {
        u32::from_str_radix(raw, 8).unwrap()
    } else {
        raw.parse().unwrap()
    }
}

/// The pod of `deploy/k8s`: its args, env and files, with paths and host
/// names made local.
struct Pod {
    tmp: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    uid: u32,
    gid: u32,
    fs_group: u32,
    mode: u32,
    keys_mount: String,
}

impl Pod {
    fn read(redis: &str) -> Pod {
        let k8s = deploy().join("k8s");
        let text = std::fs::read_to_string(k8s.join("deployment.yaml")).unwrap();
        let dep = load_yaml(&k8s.join("deployment.yaml"));
        let spec = &dep["spec"]["template"]["spec"];
        let sc = &spec["securityContext"];
        let container = &spec["containers"][0];
        let mounts = container["volumeMounts"].as_vec().unwrap();
        let mount = |vol: &str| {
            mounts
                .iter()
                .find(|m| m["name"].as_str() == Some(vol))
                .and_then(|m| m["mountPath"].as_str())
                .unwrap()
                .to_owned()
        };
        let tmp = temp_dir("pod");
        let config = tmp.join("sluice.toml");
        let cm = load_yaml(&k8s.join("configmap.yaml"));
        std::fs::write(&config, cm["data"]["sluice.toml"].as_str().unwrap()).unwrap();
        let keys_mount = mount("keys");
        let keys_here = tmp.join("keys").to_str().unwrap().to_owned();
        let config_mount = mount("config");
        let args = strings(&container["args"])
            .into_iter()
            .map(|a| {
                a.replace(&config_mount, config.to_str().unwrap())
                    .replace(&keys_mount, &keys_here)
            })
            .collect();
        let secret = load_yaml(&k8s.join("secret.yaml"));
        let env = secret["stringData"]
            .as_hash()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let (k, v) = (k.as_str().unwrap(), v.as_str().unwrap());
                let v = if k == "SLUICE_REDIS_URL" { redis } else { v };
                (k.to_owned(), v.to_owned())
            })
            .collect();
        let id = |node: &Yaml| u32::try_from(node.as_i64().unwrap()).unwrap();
        Pod {
            args,
            env,
            uid: id(&sc["runAsUser"]),
            gid: id(&sc["runAsGroup"]),
            fs_group: id(&sc["fsGroup"]),
            mode: default_mode(&text),
            keys_mount: keys_here,
            tmp,
        }
    }

    /// `sluice serve` as the pod runs it, on a loopback port (the pod's
    /// listen address and origin are the cluster's).
    fn command(&self, port: u16, groups: &[u32]) -> Command {
        let mut cmd = as_user(self.uid, self.gid, groups, &self.args);
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("SLUICE_LISTEN", format!("127.0.0.1:{port}"))
            .env("SLUICE_ORIGIN", format!("http://127.0.0.1:{}", free_port()));
        cmd
    }
}

#[test]
fn the_k8s_pod_user_reads_its_key_secret_and_the_old_layout_could_not() {
    if !may_switch_users() {
        return;
    }
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let pod = Pod::read(&redis.url());
    let staged = pod.tmp.join("staged-keys");
    keygen(&staged);
    // as the kubelet mounts it with fsGroup: files root:fsGroup, defaultMode
    let fixed = Owner {
        uid: 0,
        gid: pod.fs_group,
        dir_mode: 0o2755,
        file_mode: pod.mode,
    };
    assert_eq!(pod.mode & 0o040, 0o040, "the group must read the keys");
    assert_eq!(pod.mode & 0o007, 0, "nobody else may");
    secret_volume(&staged, Path::new(&pod.keys_mount), fixed);
    let port = free_port();
    let running = ready_or_exit(pod.command(port, &[pod.fs_group]), port, &pod.tmp, "pod")
        .unwrap_or_else(|e| panic!("the pod as deploy/k8s runs it: {e}"));
    // it signs with the Secret's key, not an ephemeral one
    let kid = std::fs::read_dir(&staged).unwrap().next().unwrap().unwrap();
    let kid = kid.path().file_stem().unwrap().to_str().unwrap().to_owned();
    let (_, jwks) = http_get(port, "/_sluice/jwks.json", &[]).unwrap();
    assert!(jwks.contains(&kid), "{jwks}");
    drop(running);

    // the old layout: 0400, root's group, no fsGroup
    std::fs::remove_dir_all(&pod.keys_mount).unwrap();
    let old = Owner {
        uid: 0,
        gid: 0,
        dir_mode: 0o755,
        file_mode: 0o400,
    };
    secret_volume(&staged, Path::new(&pod.keys_mount), old);
    let port = free_port();
    let err = ready_or_exit(pod.command(port, &[]), port, &pod.tmp, "old-pod")
        .expect_err("the old layout must not start");
    assert!(err.contains("Permission denied"), "{err}");
    let _ = std::fs::remove_dir_all(&pod.tmp);
}

/// A unit setting's value (`Key=value`), the last one given.
fn unit_value(unit: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    unit.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{key}= is not set"))
        .to_owned()
}

#[test]
fn the_systemd_unit_user_reads_etc_sluice_by_its_group_and_a_dynamic_user_could_not() {
    if !may_switch_users() {
        return;
    }
    let unit = std::fs::read_to_string(deploy().join("sluice.service")).unwrap();
    assert!(
        !unit.contains("DynamicUser=yes"),
        "a dynamic user cannot read the keys"
    );
    assert_eq!(unit_value(&unit, "User"), "sluice");
    assert_eq!(unit_value(&unit, "Group"), "sluice");
    // /etc/sluice as the unit's header lays it out, for a stand-in uid and
    // gid of the `sluice` user (this machine has none)
    let (uid, gid) = (10002, 10002);
    let tmp = temp_dir("unit");
    let etc = tmp.join("etc-sluice");
    let group = Owner {
        uid: 0,
        gid,
        dir_mode: 0o750,
        file_mode: 0o440,
    };
    std::fs::create_dir_all(&etc).unwrap();
    own(&etc, group, 0o750);
    std::fs::copy(
        deploy().join("sluice.example.toml"),
        etc.join("sluice.toml"),
    )
    .unwrap();
    own(&etc.join("sluice.toml"), group, 0o640);
    keygen(&etc.join("keys"));
    for entry in std::fs::read_dir(etc.join("keys")).unwrap() {
        own(&entry.unwrap().path(), group, 0o440);
    }
    own(&etc.join("keys"), group, 0o750);
    let args = |line: &str| -> Vec<String> {
        let line = line.replace("/etc/sluice", etc.to_str().unwrap());
        let mut words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        assert!(words.remove(0).ends_with("/sluice"));
        words
    };
    let check = as_user(uid, gid, &[], &args(&unit_value(&unit, "ExecStartPre")))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let run = |uid: u32, gid: u32, name: &str| {
        let port = free_port();
        let mut cmd = as_user(uid, gid, &[], &args(&unit_value(&unit, "ExecStart")));
        cmd.env("SLUICE_LISTEN", format!("127.0.0.1:{port}"));
        ready_or_exit(cmd, port, &tmp, name)
    };
    run(uid, gid, "unit").unwrap_or_else(|e| panic!("the unit's user: {e}"));
    // a user outside the group, as DynamicUser= was (uid from its range)
    let err = run(61184, 61184, "dynamic-user").expect_err("a stranger must not start");
    assert!(err.contains("Permission denied"), "{err}");
    let _ = std::fs::remove_dir_all(&tmp);
}

// === readiness ===

#[tokio::test]
async fn readiness_survives_a_store_outage_and_fails_while_draining() {
    use sluice_gateway::config::{FailurePolicy, RoomConfig};
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let gw = sluice_tests::TestGateway::builder()
        .redis(redis.url())
        .origin(format!("http://127.0.0.1:{}", free_port()))
        .config(|c| {
            c.rooms = vec![
                RoomConfig {
                    id: "closed".into(),
                    paths: vec!["/a".into()],
                    ..Default::default()
                },
                RoomConfig {
                    id: "open".into(),
                    paths: vec!["/b".into()],
                    failure_policy: FailurePolicy::Open,
                    ..Default::default()
                },
            ];
        })
        .spawn()
        .await;
    let client = sluice_tests::client::TestClient::new();
    let readyz = format!("{}/_sluice/serving", gw.url());
    let strict = format!("{}/_sluice/readyz", gw.url());
    assert_eq!(client.get(&strict, &[]).await.status, 200);
    let ready = client.get(&readyz, &[]).await;
    assert_eq!(ready.status, 200);
    assert!(
        ready.json().get("store_unavailable").is_none(),
        "{}",
        ready.text()
    );
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let res = client.get(&readyz, &[]).await;
        assert_eq!(
            res.status,
            200,
            "a store outage fails readiness: {}",
            res.text()
        );
        let down = res.json()["store_unavailable"].clone();
        if down == serde_json::json!(["closed", "open"]) {
            assert_eq!(res.json()["status"], "ready");
            // API.md's readiness says the store is away.
            let res = client.get(&strict, &[]).await;
            assert_eq!(res.status, 503, "{}", res.text());
            assert_eq!(res.json()["status"], "store_unavailable");
            assert_eq!(res.json()["rooms"], serde_json::json!(["closed", "open"]));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the outage is not reported: {}",
            res.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for room in ["closed", "open"] {
        let up =
            sluice_tests::metric(&gw.url(), &format!("sluice_store_up{{room=\"{room}\"}}")).await;
        assert_eq!(up, 0.0, "{room}");
    }
    gw.state().begin_shutdown();
    for probe in [&readyz, &strict] {
        let res = client.get(probe, &[]).await;
        assert_eq!(res.status, 503, "{probe}");
        assert_eq!(res.json()["status"], "draining", "{probe}");
    }
}
