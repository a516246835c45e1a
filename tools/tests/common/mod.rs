//! What the command's tests share: running `shmfab` with a time limit.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `shmfab args` with the variables `env` set, killing it after `limit`.
pub fn shmfab_env(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shmfab"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = c.kill();
            panic!("shmfab {args:?} ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    c.wait_with_output().unwrap()
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
