//! The provider through libfabric's C API: `tests/c/fi_api.c`, built
//! against the installed libfabric, checks the objects' calls and their
//! error codes (see its header), and runs a two-process exchange, under
//! a timeout with the provider on `FI_PROVIDER_PATH`.

mod common;

use common::{text, tool, wait, ShmDir};
use std::process::Stdio;
use std::time::Duration;

#[test]
fn c_program_checks_the_calls_and_their_errors() {
    common::run_c("fi_api", "c-api", &[], &[], Duration::from_secs(120));
}

/// A process that exits with an FI_PROGRESS_AUTO domain open: libfabric's
/// destructor unloads the provider while the domain's progress thread
/// runs, which must not crash it (the provider is linked `-z nodelete`).
/// The crash was a race (about 1 run in 40 before the fix): 60 runs.
#[test]
fn exit_with_an_auto_progress_domain_open_does_not_crash() {
    let shm = ShmDir::new("exit-auto");
    for run in 0..60 {
        let child = tool(common::c_program("fi_api").to_str().expect("utf-8 path"), &shm)
            .arg("exit-auto")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run fi_api exit-auto");
        let o = wait(child, Duration::from_secs(30), "fi_api exit-auto");
        assert!(o.status.success(), "run {run}: fi_api exit-auto ended with {}:\n{}", o.status, text(&o));
    }
}
