//! The `sluice` binary's command line: config checking and exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn check_config_accepts_a_valid_file() {
    let p = write(
        "ok.toml",
        r#"
listen = "127.0.0.1:9000"
origin = "http://127.0.0.1:3000"
trusted_proxies = ["10.0.0.0/8"]

[timeouts]
header_read = "5s"

[[rooms]]
id = "drop"
paths = ["/tickets"]
rate_per_sec = 200

[[events]]
id = "tour-2027"
room = "drop"
total = 50000
hold_ttl = "10m"
"#,
    );
    let out = sluice().arg("check-config").arg(&p).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

#[test]
fn a_bad_config_exits_64_with_one_line() {
    for (name, text, needle) in [
        (
            "unknown.toml",
            "listen = \"127.0.0.1:1\"\nfrobnicate = true\n",
            "frobnicate",
        ),
        (
            "duration.toml",
            "[timeouts]\nheader_read = \"often\"\n",
            "header_read",
        ),
        ("range.toml", "[[rooms]]\nid = \"a b\"\n", "rooms[0].id"),
        ("syntax.toml", "listen = \n", "config"),
    ] {
        let p = write(name, text);
        let out = sluice().arg("check-config").arg(&p).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
        // serve refuses the same file the same way, before listening
        let out = sluice()
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&p)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "serve {name}");
    }
    let out = sluice()
        .args(["check-config", "/nonexistent/sluice.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn flags_and_environment_are_validated_too() {
    let out = sluice()
        .args(["serve", "--origin", "ftp://nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let out = sluice()
        .args(["serve"])
        .env("SLUICE_REDIS_URL", "mysql://nope")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis"));
}

#[test]
fn keygen_writes_a_private_key_named_by_its_kid() {
    let dir = std::env::temp_dir().join(format!("sluice-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut kids = Vec::new();
    for _ in 0..2 {
        let out = sluice()
            .args(["keygen", "--out"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let kid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let file = dir.join(format!("{kid}.pk8"));
        assert!(file.is_file());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "key readable by others: {mode:o}");
        }
        kids.push(kid);
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    assert_ne!(kids[0], kids[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `check-config FILE` and `serve --config FILE` (on a free port) and
/// returns each one's exit code and stderr.
fn both_refuse(path: &std::path::Path) -> [(Option<i32>, String); 2] {
    let check = sluice().arg("check-config").arg(path).output().unwrap();
    let serve = sluice()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(path)
        .env("SLUICE_LOG", "error")
        .output()
        .unwrap();
    [check, serve].map(|o| {
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).trim_end().to_owned(),
        )
    })
}

/// A difficulty ceiling the work cap does not allow (16 puzzles × 2^21
/// hashes > 2^24) passed `check-config` and then made `serve` exit 1 when
/// it built the room: both now refuse it, exit 64, with the same line
/// (the difficulty policy's own words).
#[test]
fn check_config_and_serve_refuse_a_ceiling_past_the_work_cap_alike() {
    let p = write(
        "ceiling.toml",
        "[[rooms]]\nid = \"drop\"\npuzzles = 16\ndifficulty_floor_bits = 18\ndifficulty_ceiling_bits = 21\n",
    );
    let [(check_code, check_err), (serve_code, serve_err)] = both_refuse(&p);
    assert_eq!(check_code, Some(64), "{check_err}");
    assert_eq!(serve_code, Some(64), "{serve_err}");
    assert_eq!(check_err.lines().count(), 1, "{check_err}");
    assert_eq!(check_err, serve_err);
    assert!(
        check_err.contains("rooms[0].difficulty_ceiling_bits")
            && check_err.contains("max ceiling 20"),
        "{check_err}"
    );
}

/// What `serve` refused only after it had bound its listener (exit 1): a
/// Redis URL the client cannot parse, a keys directory it cannot load. Both
/// now refuse them before anything listens, exit 64, with the same line.
#[test]
fn check_config_and_serve_refuse_bad_urls_and_keys_alike() {
    let empty = std::env::temp_dir().join(format!("sluice-cli-nokeys-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    for (name, text, needle) in [
        (
            "port.toml",
            "redis = \"redis://127.0.0.1:99999/\"\n".to_owned(),
            "`redis`",
        ),
        (
            "nokeys.toml",
            "keys_dir = \"/nonexistent/sluice-keys\"\n".to_owned(),
            "`keys_dir`",
        ),
        (
            "emptykeys.toml",
            format!("keys_dir = {:?}\n", empty.to_str().unwrap()),
            "`keys_dir`",
        ),
        (
            "total.toml",
            "[[events]]\nid = \"big\"\ntotal = 9007199254740993\n".to_owned(),
            "2^53",
        ),
    ] {
        let p = write(name, &text);
        let [(check_code, check_err), (serve_code, serve_err)] = both_refuse(&p);
        assert_eq!(check_code, Some(64), "{name}: {check_err}");
        assert_eq!(serve_code, Some(64), "{name}: {serve_err}");
        assert_eq!(check_err.lines().count(), 1, "{name}: {check_err}");
        assert_eq!(check_err, serve_err, "{name}");
        assert!(check_err.contains(needle), "{name}: {check_err}");
    }
    let _ = std::fs::remove_dir_all(&empty);
}
