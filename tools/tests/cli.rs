//! The `shmfab` command as a script or a user runs it: help, usage errors
//! (status 2), `info`, and `bench` with its JSON (no progress line when
//! stderr is not a terminal).

mod common;
use common::{shmfab_env, text};
use std::process::Output;
use std::time::Duration;

/// Runs `shmfab args`, killing it after `limit`.
fn shmfab(args: &[&str], limit: Duration) -> Output {
    shmfab_env(args, &[], limit)
}

#[test]
fn help_lists_every_command_and_usage_errors_exit_2() {
    let o = shmfab(&["--help"], Duration::from_secs(10));
    assert!(o.status.success());
    let help = text(&o.stdout);
    for c in ["run", "bench", "compare", "inspect", "clean", "info"] {
        assert!(help.contains(&format!("\n  {c} ")), "{c} missing from:\n{help}");
    }
    let o = shmfab(&["bench", "--sizes", "64k,18014398509481984k"], Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("too large"), "{}", text(&o.stderr));
    let o = shmfab(&[], Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2), "no command: usage");
}

#[test]
fn info_shows_layout_topology_and_memory() {
    let o = shmfab(&["info", "--ranks", "2,8", "--buf", "8k"], Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for want in ["layout version", "topology (hwloc)", "buffers of 8192 B"] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
}

#[test]
fn bench_writes_its_figures_as_json_and_no_progress_to_a_pipe() {
    let json = std::env::temp_dir().join(format!("shmfab-cli-{}.json", std::process::id()));
    let o =
        shmfab(&["bench", "pingpong", "--sizes", "8,1k", "--json", json.to_str().unwrap()], Duration::from_secs(120));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(o.stderr.is_empty(), "stderr is not a terminal: {}", text(&o.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(rows.len(), 2);
    for (r, size) in rows.iter().zip([8, 1024]) {
        assert_eq!(r["size"], size);
        assert_eq!(r["system"], "shmfab");
        assert!(r["half_rtt_us"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        assert!(r["bw_gbs"].is_null() && r["mmsgs"].is_null(), "{r}");
    }
    // The table on stdout: one row per size, half round trip in column 2.
    let out = text(&o.stdout);
    let last = out.lines().last().unwrap();
    assert_eq!(last.split_whitespace().next(), Some("1024"), "{out}");
}

#[test]
fn inspect_of_a_job_that_does_not_exist_fails() {
    // Was: "no regions for job ..." and status 0.
    let job = format!("no-such-job-{}", std::process::id());
    let o = shmfab(&["inspect", &job], Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("no such job is running"), "{}", text(&o.stderr));
}

#[test]
fn numbers_that_wrap_are_refused() {
    // Was: accepted, and memory per rank computed with wrapped products.
    let o = shmfab(&["info", "--buf", "18446744073709551615"], Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("a buffer holds 1 to 1073741824 bytes"), "{}", text(&o.stderr));
    let o = shmfab(&["info", "--ranks", "65536", "--depth", "1073741824", "--buf", "1m"], Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("would not fit in 64 bits"), "{}", text(&o.stderr));
    let o = shmfab(&["bench", "--sizes", "18014398509481984k"], Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn bench_checks_its_json_path_before_running() {
    // Was: the benchmark ran, then its figures were lost to the bad path.
    let bad = format!("/nonexistent-{}/figures.json", std::process::id());
    let o = shmfab(&["bench", "pingpong", "--sizes", "8", "--json", &bad], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains(&format!("--json {bad}: cannot write it")), "{}", text(&o.stderr));
    assert!(!text(&o.stdout).contains("half RTT"), "it ran first:\n{}", text(&o.stdout));
    let o = shmfab(&["compare", "--sizes", "8", "--json", "/"], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("--json /: cannot write it"), "{}", text(&o.stderr));
}

#[test]
fn bad_settings_are_one_line_and_status_2() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let o = shmfab_env(args, env, Duration::from_secs(60));
        assert_eq!(o.status.code(), Some(2), "{args:?} {env:?}: {}{}", text(&o.stdout), text(&o.stderr));
        text(&o.stderr)
    };
    // Was: clamped to 1 without a word.
    assert_eq!(
        run(&["info"], &[("SHMFAB_RX_SIZE", "0")]),
        "shmfab: SHMFAB_RX_SIZE=0: must be an integer from 1 to 1048576\n"
    );
    // Was: ignored where the peer gets its CPU from us (2 CPUs or more),
    // a panic in CPU_SET where it inherits the variable.
    assert_eq!(
        run(&["bench", "pingpong", "--sizes", "8"], &[("SHMFAB_BENCH_CPU", "100000")]),
        "shmfab: SHMFAB_BENCH_CPU=100000: must be an integer from 0 to 1023\n"
    );
    // The peer side itself (as `bench` starts it).
    let env = [("SHMFAB_BENCH_PEER", "00"), ("SHMFAB_BENCH_CPU", "100000")];
    let e = run(&[], &env);
    assert_eq!(e, "shmfab bench peer: SHMFAB_BENCH_CPU=100000: must be an integer from 0 to 1023\n");
    // Was: ignored (10 s).
    assert_eq!(
        run(&["bench", "wakeup"], &[("SHMFAB_IDLE_SECS", "ten")]),
        "shmfab: SHMFAB_IDLE_SECS=ten: must be an integer from 1 to 3600\n"
    );
}

#[test]
fn the_raw_floor_moves_every_size() {
    // Up to a page through the page, above it in pieces (5000: two, the
    // second partial; 300 KiB: 75), each message stamped with its round
    // and checked by both processes.
    let o = shmfab(&["bench", "raw", "--sizes", "8,5000,300k", "--iters", "200"], Duration::from_secs(120));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for size in [8, 5000, 307200] {
        let line = out.lines().find(|l| l.starts_with(&format!("raw {size} B "))).unwrap_or_else(|| panic!("{out}"));
        let us: f64 = line.split_whitespace().nth(6).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"));
        assert!(us > 0.0 && us.is_finite(), "{line}");
    }
    let o = shmfab(&["bench", "raw", "--sizes", "9m"], Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2), "above the bench's sizes: a usage error");
}
