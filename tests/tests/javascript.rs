//! The browser-side JavaScript tests (`node --test static/test/`), run as
//! part of the Rust suite so one command runs everything: the worker's
//! SHA-256 and leading-zero count against vectors from the Rust verifier.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn node_tests_of_the_browser_solver_pass() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let available = Command::new("node")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !available {
        if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
            panic!("node not found: CI=true requires it (apt-get install nodejs)");
        }
        eprintln!(
            "\n*** SKIPPED: node not found; the browser solver's JavaScript tests did not run ***\n"
        );
        return;
    }
    let out = Command::new("node")
        .args(["--test", "static/test/"])
        .current_dir(&root)
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "node --test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
