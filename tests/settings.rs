//! Bad `SHMFAB_*` settings, as a user sets them in the environment: each
//! case runs in a child process of this test binary (so the tests do not
//! race on the process environment, and a crash is seen as one), which
//! reports what `Fabric::open` or `World::init` returned. Every case must
//! end in an `Inval` error naming the variable and its range: no panic, no
//! signal, no silent default.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Set in the child: which call to make.
const CASE: &str = "SHMFAB_SETTINGS_CASE";

/// In the child: makes the call, prints what it returned, exits.
fn child_side() {
    let Ok(case) = std::env::var(CASE) else { return };
    let r = match case.as_str() {
        "fabric" => shmfab::Fabric::open().map(|_| ()),
        _ => shmfab::World::init().map(|_| ()),
    };
    match r {
        Ok(()) => println!("RESULT ok"),
        Err(e) => println!("RESULT {:?}: {}", e.kind(), e.detail().unwrap_or_default()),
    }
    std::process::exit(0);
}

/// Runs test `name` of this binary again as a child with `env` and the case
/// set, killing it after 60 s, and removes any region of its job.
fn child(name: &str, case: &str, env: &[(&str, &str)]) -> Output {
    let job = format!("settings-{name}-{}", std::process::id());
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .env("SHMFAB_JOB_ID", &job)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = c.wait_with_output().unwrap();
    let hash = format!(".{:08x}.", shmfab::internal::region::job_hash(&job));
    for e in std::fs::read_dir("/dev/shm").into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().contains(&hash) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    out
}

/// The child's report, after checking that it ended normally.
fn result(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "the child crashed ({:?}):\n{out}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    out.lines()
        .find_map(|l| l.split_once("RESULT ").map(|x| x.1))
        .unwrap_or_else(|| panic!("no result in:\n{out}"))
        .to_string()
}

#[test]
fn rx_size_zero_is_refused_at_fabric_open() {
    child_side();
    // Was: clamped to 1 without a word (an all-to-all then hung).
    let o = child("rx_size_zero_is_refused_at_fabric_open", "fabric", &[("SHMFAB_RX_SIZE", "0")]);
    assert_eq!(result(&o), "Inval: SHMFAB_RX_SIZE=0: must be an integer from 1 to 1048576");
}

#[test]
fn a_bad_geometry_variable_is_refused_at_fabric_open() {
    child_side();
    // Was: the geometry fell back to the defaults, dropping RING_SLOTS too.
    let env = [("SHMFAB_RING_SLOTS", "1"), ("SHMFAB_RING_CELLS", "1000")];
    let o = child("a_bad_geometry_variable_is_refused_at_fabric_open", "fabric", &env);
    assert_eq!(result(&o), "Inval: SHMFAB_RING_CELLS=1000: must be a power of two from 128 to 1048576");
}

#[test]
fn a_boot_timeout_that_overflows_is_refused_not_a_panic() {
    child_side();
    // Was: `Instant + Duration` overflowed, a panic in World::init.
    let env = [("SHMFAB_RANK", "0"), ("SHMFAB_SIZE", "1"), ("SHMFAB_BOOT_TIMEOUT", "18446744073709551615")];
    let o = child("a_boot_timeout_that_overflows_is_refused_not_a_panic", "world", &env);
    assert_eq!(result(&o), "Inval: SHMFAB_BOOT_TIMEOUT=18446744073709551615: must be an integer from 1 to 86400");
}

#[test]
fn a_job_size_that_wraps_is_refused_not_a_crash() {
    child_side();
    // Was: the boot region's size (size x 64) wrapped: SIGSEGV.
    let env = [("SHMFAB_RANK", "0"), ("SHMFAB_SIZE", "288230376151711745")];
    let o = child("a_job_size_that_wraps_is_refused_not_a_crash", "world", &env);
    assert_eq!(result(&o), "Inval: SHMFAB_SIZE=288230376151711745: must be an integer from 1 to 65536");
}

#[test]
fn valid_settings_still_open() {
    child_side();
    let env = [("SHMFAB_RX_SIZE", "1"), ("SHMFAB_RING_CELLS", "4k"), ("SHMFAB_BOOT_TIMEOUT", "86400")];
    let o = child("valid_settings_still_open", "world", &env);
    assert_eq!(result(&o), "ok");
}
