//! Collectives through libfabric's C API between processes:
//! `tests/c/fi_coll.c` (see its header), built against the installed
//! libfabric, run under a timeout with the provider on
//! `FI_PROVIDER_PATH`, with 2, 3 and 4 ranks (3: not a power of two),
//! with FI_PROGRESS_AUTO domains, and under valgrind.

mod common;

use std::time::Duration;

/// Runs fi_coll with `args` ([`common::run_c`]).
fn run(tag: &str, args: &[&str]) {
    common::run_c("fi_coll", tag, &[], args, Duration::from_secs(180));
}

#[test]
fn two_ranks() {
    run("coll-2", &["2"]);
}

#[test]
fn three_ranks() {
    run("coll-3", &["3"]);
}

#[test]
fn four_ranks() {
    run("coll-4", &["4"]);
}

#[test]
fn three_ranks_auto_progress() {
    run("coll-3-auto", &["3", "auto"]);
}

/// Under valgrind's memcheck (3 ranks; every child is checked, fork
/// follows): no invalid access or use of undefined values in the
/// provider's collective paths. Skipped, saying so, when valgrind is not
/// installed (`scripts/deps.sh profile` installs it).
#[test]
fn three_ranks_under_valgrind() {
    use std::process::Stdio;
    if std::process::Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("valgrind not installed: skipped");
        return;
    }
    let shm = common::ShmDir::new("coll-vg");
    let bin = common::c_program("fi_coll");
    let mut cmd = common::tool("valgrind", &shm);
    cmd.args(["-q", "--error-exitcode=9"]).arg(&bin).arg("3").stdout(Stdio::piped()).stderr(Stdio::piped());
    let o = common::wait(cmd.spawn().expect("run valgrind"), Duration::from_secs(300), "fi_coll under valgrind");
    let t = common::text(&o);
    assert!(o.status.success() && t.contains("checks passed") && !t.contains("=="), "fi_coll under valgrind:\n{t}");
    let left: Vec<_> = std::fs::read_dir(&shm.0).expect("regions' directory").collect();
    assert!(left.is_empty(), "regions left behind: {left:?}");
}
