//! RMA and atomics between two processes through libfabric's C API:
//! `tests/c/fi_rma2.c` (see its header), built against the installed
//! libfabric and the provider's `include/shmfab_ext.h`, run under a
//! timeout with the provider on `FI_PROVIDER_PATH`: with single copy as
//! the kernel allows it, with it forced off (`SHMFAB_CMA=0`: malloc'd
//! memory is reached through the target's progress, the mailbox), with
//! the kernel's refusal simulated (`SHMFAB_CMA=fail`: the fallback), and
//! with FI_PROGRESS_AUTO domains.

mod common;

use std::time::Duration;

/// Runs fi_rma2 with `cma` as SHMFAB_CMA and `args` ([`common::run_c`]).
fn run(tag: &str, cma: &str, args: &[&str]) {
    common::run_c("fi_rma2", tag, &[("SHMFAB_CMA", cma)], args, Duration::from_secs(240));
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
