//! Collectives through libfabric's C API between processes:
//! `tests/c/fi_coll.c` (see its header), built against the installed
//! libfabric, run under a timeout with the provider on
//! `FI_PROVIDER_PATH`, with 2, 3 and 4 ranks (3: not a power of two),
//! and with FI_PROGRESS_AUTO domains.

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
