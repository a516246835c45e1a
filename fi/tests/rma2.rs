//! RMA and atomics between two processes through libfabric's C API:
//! `tests/c/fi_rma2.c` (see its header), built against the installed
//! libfabric and the provider's `include/shmfab_ext.h`, run under a
//! timeout with the provider on `FI_PROVIDER_PATH`: with single copy as
//! the kernel allows it, with it forced off (`SHMFAB_CMA=0`: malloc'd
//! memory is reached through the target's progress, the mailbox), with
//! the kernel's refusal simulated (`SHMFAB_CMA=fail`: the fallback), and
//! with FI_PROGRESS_AUTO domains.

mod common;

use common::{text, tool, wait, ShmDir};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

/// `fi_rma2`, built once for the tests of this file.
fn fi_rma2() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let bin = exe.parent().expect("target/<profile>/deps").join("fi_rma2");
        let src = common::root().join("fi/tests/c/fi_rma2.c");
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

/// Runs fi_rma2 with `cma` as SHMFAB_CMA and `args`; its regions in a
/// directory of their own, which must be empty afterwards.
fn run(tag: &str, cma: &str, args: &[&str]) {
    let shm = ShmDir::new(tag);
    let child = tool(fi_rma2().to_str().expect("utf-8 path"), &shm)
        .env("SHMFAB_CMA", cma)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fi_rma2");
    let o = wait(child, Duration::from_secs(240), "fi_rma2");
    let t = text(&o);
    assert!(o.status.success() && t.contains("checks passed"), "fi_rma2 (SHMFAB_CMA={cma} {args:?}) failed:\n{t}");
    let left: Vec<_> = std::fs::read_dir(&shm.0).expect("regions' directory").collect();
    assert!(left.is_empty(), "regions left behind: {left:?}");
}

#[test]
fn two_processes_single_copy() {
    run("rma2-cma", "auto", &[]);
}

#[test]
fn two_processes_single_copy_off() {
    run("rma2-nocma", "0", &[]);
}

#[test]
fn two_processes_single_copy_refused() {
    run("rma2-cmafail", "fail", &[]);
}

#[test]
fn two_processes_auto_progress() {
    run("rma2-auto", "0", &["auto"]);
}
