//! The provider through libfabric's C API: `tests/c/fi_api.c`, built
//! against the installed libfabric, checks the objects' calls and their
//! error codes (see its header), and runs a two-process exchange, under
//! a timeout with the provider on `FI_PROVIDER_PATH`.

mod common;

use common::{text, tool, wait, ShmDir};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// `fi_api`, built once for the tests of this file.
fn fi_api() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let bin = exe.parent().expect("target/<profile>/deps").join("fi_api");
        let src = common::root().join("fi/tests/c/fi_api.c");
        let out = Command::new("cc")
            .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
            .arg(&bin)
            .arg(&src)
            .args(["-lfabric", "-lpthread"])
            .output()
            .expect("cc (scripts/deps.sh installs gcc and libfabric-dev)");
        assert!(out.status.success(), "building {}:\n{}", src.display(), text(&out));
        bin
    })
}

#[test]
fn c_program_checks_the_calls_and_their_errors() {
    let shm = ShmDir::new("c-api");
    let child = tool(fi_api().to_str().expect("utf-8 path"), &shm)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fi_api");
    let o = wait(child, Duration::from_secs(120), "fi_api");
    let t = text(&o);
    assert!(o.status.success() && t.contains("checks passed"), "fi_api failed:\n{t}");
    let left: Vec<_> = std::fs::read_dir(&shm.0).expect("regions' directory").collect();
    assert!(left.is_empty(), "regions left behind: {left:?}");
}

/// A process that exits with an FI_PROGRESS_AUTO domain open: libfabric's
/// destructor unloads the provider while the domain's progress thread
/// runs, which must not crash it (the provider is linked `-z nodelete`).
/// The crash was a race (about 1 run in 40 before the fix): 60 runs.
#[test]
fn exit_with_an_auto_progress_domain_open_does_not_crash() {
    let shm = ShmDir::new("exit-auto");
    for run in 0..60 {
        let child = tool(fi_api().to_str().expect("utf-8 path"), &shm)
            .arg("exit-auto")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run fi_api exit-auto");
        let o = wait(child, Duration::from_secs(30), "fi_api exit-auto");
        assert!(o.status.success(), "run {run}: fi_api exit-auto ended with {}:\n{}", o.status, text(&o));
    }
}
