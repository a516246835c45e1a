//! Triggered operations and the deferred work queue through libfabric's
//! C API between two processes: `tests/c/fi_trigger.c` (see its header),
//! built against the installed libfabric, run under a timeout with the
//! provider on `FI_PROVIDER_PATH`: with single copy as the kernel allows
//! it, with it forced off (`SHMFAB_CMA=0`: the target serves RMA through
//! its mailbox, so work fires inside progress passes on both sides), and
//! with FI_PROGRESS_AUTO domains.

mod common;

use std::time::Duration;

/// Runs fi_trigger with `cma` as SHMFAB_CMA and `args` ([`common::run_c`]).
fn run(tag: &str, cma: &str, args: &[&str]) {
    common::run_c("fi_trigger", tag, &[("SHMFAB_CMA", cma)], args, Duration::from_secs(120));
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
