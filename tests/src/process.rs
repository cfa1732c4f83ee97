//! Child processes that start processes of their own (a browser's
//! content processes, nginx's workers, chromedriver's Chromium): each is
//! started in a process group of its own ([`own_group`]) and ended with
//! the whole group ([`kill_group`]), so nothing outlives the test that
//! started it. Killing only the child leaves its children running,
//! reparented to init: a full run once left 60 Chromium processes and 14
//! nginx workers behind, holding CPU and ports.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// Makes `cmd` start in a process group of its own, whose id is the
/// child's pid; what the child starts stays in that group.
pub fn own_group(cmd: &mut Command) -> &mut Command {
    cmd.process_group(0)
}

/// Kills `child`'s process group (started with [`own_group`]) with
/// SIGKILL, then reaps `child`.
pub fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg("--")
        .arg(format!("-{}", child.id()))
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}
