//! What the real-browser helpers share ([`crate::chromium`] over WebDriver,
//! [`crate::firefox`] over WebDriver BiDi): the rule for a missing browser,
//! one browser at a time, where screenshots go, and polling the page.
//!
//! A browser that is not installed is a loud `SKIPPED` line and a test that
//! returns early, except under `CI=true`, where it is a failure (as for
//! `redis-server`, [`crate::redis_server`]).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One browser at a time in a test binary: the machine has few cores, and
/// a proof-of-work measurement must not share them with another test's
/// browser.
pub static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `true` when none of `needed` (absolute paths) is missing. Otherwise
/// panics under `CI=true`, or prints the loud `SKIPPED` line for `test` and
/// answers `false`; `install` is the hint (`apt-get install …`).
pub fn installed(test: &str, needed: &[&str], install: &str) -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    installed_in(ci, test, needed, install)
}

fn installed_in(ci: bool, test: &str, needed: &[&str], install: &str) -> bool {
    let missing: Vec<&str> = needed
        .iter()
        .copied()
        .filter(|p| !Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    if ci {
        panic!("{missing:?} not found: CI=true requires them ({install})");
    }
    eprintln!("\n*** SKIPPED {test}: {missing:?} not found ({install}) ***\n");
    false
}

/// `target/browser-artifacts/<test>/`, created: the screenshots of a test.
pub fn artifacts_dir(test: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("browser-artifacts").join(test);
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// Polls `check` every 100 ms until it answers `Some`, or fails with
/// `what` after `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::installed_in;

    const NOWHERE: &str = "/nonexistent/sluice-test-browser";

    #[test]
    fn a_missing_browser_is_skipped_outside_ci() {
        assert!(!installed_in(false, "t", &[NOWHERE], "apt-get install x"));
        assert!(installed_in(false, "t", &["/"], "apt-get install x"));
    }

    #[test]
    #[should_panic(expected = "CI=true requires them (apt-get install x)")]
    fn a_missing_browser_fails_in_ci() {
        installed_in(true, "t", &["/", NOWHERE], "apt-get install x");
    }
}
