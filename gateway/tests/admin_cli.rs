//! `sluice admin` against a running `sluice serve`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "cli-test-admin-token-0123";

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve() -> (Serve, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-token",
            TOKEN,
        ])
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Reads the first line and closes the pipe: the gateway must live on
    // through its next line of banner (it once died of EPIPE there).
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("listening"));
    drop(lines);
    let url = format!("http://127.0.0.1:{port}");
    (Serve(child), url)
}

fn admin(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["admin", "--url", url, "--token", TOKEN])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn admin_ok(url: &str, args: &[&str]) -> String {
    // the stores need a tick before the first answer
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ok, out, err) = admin(url, args);
        if ok {
            return out;
        }
        assert!(Instant::now() < deadline, "{args:?}: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_admin_cli_reads_and_changes_rooms_and_events() {
    let (_serve, url) = serve();
    let rooms = admin_ok(&url, &["rooms"]);
    assert!(rooms.lines().next().unwrap().starts_with("room"), "{rooms}");
    assert!(rooms.contains("default"), "{rooms}");

    let out = admin_ok(&url, &["room", "default", "set", "rate=300", "paused=true"]);
    assert!(out.contains("rate_per_sec") && out.contains("300"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&admin_ok(&url, &["--json", "room", "default"])).unwrap();
    assert_eq!(json["rate_per_sec"], 300.0);
    assert_eq!(json["paused"], true);

    let events = admin_ok(&url, &["events"]);
    assert!(events.contains("demo"), "{events}");
    let out = admin_ok(&url, &["--json", "event", "demo", "set", "total=500"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"], 500);
    assert_eq!(v["version"], 2, "version is the current one plus one");
    assert_eq!(v["invariant_holds"], true);

    // errors are one clear line and a failure status
    let (ok, _, err) = admin(&url, &["room", "default", "set", "rate=-5"]);
    assert!(!ok);
    assert!(err.contains("invalid_setting"), "{err}");
    let (ok, _, err) = admin(&url, &["room", "nope"]);
    assert!(!ok);
    assert!(err.contains("room_not_found"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "admin",
            "--url",
            &url,
            "--token",
            "wrong-token-wrong-token",
            "rooms",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unauthorized"));
}

/// `--json` after the subcommand (and after `set`'s pairs) is the same
/// flag as before it: the API's JSON, never a `key=value` pair.
#[test]
fn json_is_accepted_after_the_subcommand_too() {
    let (_serve, url) = serve();
    let before: serde_json::Value =
        serde_json::from_str(&admin_ok(&url, &["--json", "room", "default"])).unwrap();
    let after: serde_json::Value =
        serde_json::from_str(&admin_ok(&url, &["room", "default", "--json"])).unwrap();
    assert_eq!(after["rate_per_sec"], before["rate_per_sec"]);
    assert!(after.get("frontier").is_some(), "{after}");

    let rooms: serde_json::Value =
        serde_json::from_str(&admin_ok(&url, &["rooms", "--json"])).unwrap();
    assert!(rooms["rooms"].is_array(), "{rooms}");
    let events: serde_json::Value =
        serde_json::from_str(&admin_ok(&url, &["events", "--json"])).unwrap();
    assert!(events["events"].is_array(), "{events}");

    let set: serde_json::Value = serde_json::from_str(&admin_ok(
        &url,
        &["room", "default", "set", "rate=250", "--json"],
    ))
    .unwrap();
    assert_eq!(set["rate_per_sec"], 250.0);
    let set: serde_json::Value = serde_json::from_str(&admin_ok(
        &url,
        &["event", "demo", "set", "total=400", "--json"],
    ))
    .unwrap();
    assert_eq!(set["total"], 400);

    // Without it, still the table.
    let table = admin_ok(&url, &["rooms"]);
    assert!(table.lines().next().unwrap().starts_with("room"), "{table}");
    assert!(serde_json::from_str::<serde_json::Value>(&table).is_err());
}
