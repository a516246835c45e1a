//! Triggered operations and the deferred work queue through libfabric's
//! C API between two processes: `tests/c/fi_trigger.c` (see its header),
//! built against the installed libfabric, run under a timeout with the
//! provider on `FI_PROVIDER_PATH`: with single copy as the kernel allows
//! it, with it forced off (`SHMFAB_CMA=0`: the target serves RMA through
//! its mailbox, so work fires inside progress passes on both sides), and
//! with FI_PROGRESS_AUTO domains.

mod common;

use common::{text, tool, wait, ShmDir};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

/// `fi_trigger`, built once for the tests of this file.
fn fi_trigger() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let bin = exe.parent().expect("target/<profile>/deps").join("fi_trigger");
        let src = common::root().join("fi/tests/c/fi_trigger.c");
        let out = std::process::Command::new("cc")
            .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
            .arg(&bin)
            .arg(&src)
            .arg("-lfabric")
            .output()
            .expect("cc (scripts/deps.sh installs gcc and libfabric-dev)");
        assert!(out.status.success(), "building {}:\n{}", src.display(), text(&out));
        bin
    })
}

/// Runs fi_trigger with `cma` as SHMFAB_CMA and `args`; its regions in a
/// directory of their own, which must be empty afterwards.
fn run(tag: &str, cma: &str, args: &[&str]) {
    let shm = ShmDir::new(tag);
    let child = tool(fi_trigger().to_str().expect("utf-8 path"), &shm)
        .env("SHMFAB_CMA", cma)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fi_trigger");
    let o = wait(child, Duration::from_secs(120), "fi_trigger");
    let t = text(&o);
    assert!(o.status.success() && t.contains("checks passed"), "fi_trigger (SHMFAB_CMA={cma} {args:?}) failed:\n{t}");
    let left: Vec<_> = std::fs::read_dir(&shm.0).expect("regions' directory").collect();
    assert!(left.is_empty(), "regions left behind: {left:?}");
}

#[test]
fn two_processes_single_copy() {
    run("trig-cma", "auto", &[]);
}

#[test]
fn two_processes_mailbox() {
    run("trig-nocma", "0", &[]);
}

#[test]
fn two_processes_auto_progress() {
    run("trig-auto", "0", &["auto"]);
}
