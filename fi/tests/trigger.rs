//! Triggered operations and the deferred work queue through libfabric's
//! C API between two processes: `tests/c/fi_trigger.c` (see its header),
//! built against the installed libfabric, run under a timeout with the
//! provider on `FI_PROVIDER_PATH`: with single copy as the kernel allows
//! it, with it forced off (`SHMFAB_CMA=0`: the target serves RMA through
//! its mailbox, so work fires inside progress passes on both sides), and
//! with FI_PROGRESS_AUTO domains; and the ends of many short chains
//! (`chains N`).

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

/// The ends of chains many times over, single copy off: each short chain
/// ends with rank 1's last write into rank 0's memory, which only rank
/// 0's progress serves, still on its way when rank 0 may already wait for
/// rank 1's answer (made sure of in every 50th: that write goes 2 ms
/// late). The C program's rank 0 used to wait for answers in read(2)
/// alone: rank 1 then waited in that write for ever (the full program's
/// mailbox run hung about 1 run in 17; this one hung every time).
#[test]
fn chain_ends_mailbox() {
    common::run_c("fi_trigger", "trig-ends", &[("SHMFAB_CMA", "0")], &["chains", "600"], Duration::from_secs(60));
}
