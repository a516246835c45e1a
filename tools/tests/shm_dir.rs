//! `shmfab clean`, `inspect` and `info` with `SHMFAB_SHM_DIR`: they look in
//! that directory, and an unusable setting is an error naming it.

use std::path::PathBuf;
mod common;
use common::{shmfab_env, text};
use std::process::Output;
use std::time::Duration;

/// Runs `shmfab args` with `SHMFAB_SHM_DIR=dir`, killing it after 30 s.
fn shmfab(dir: &str, args: &[&str]) -> Output {
    shmfab_env(args, &[("SHMFAB_SHM_DIR", dir)], Duration::from_secs(30))
}

/// A fresh directory under /dev/shm, removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn clean_inspect_and_info_use_the_shm_dir_setting() {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let dir = Dir(PathBuf::from(format!("/dev/shm/shmfab-test-tools-{}-{nanos}", std::process::id())));
    std::fs::create_dir(&dir.0).unwrap();
    let d = dir.0.to_str().unwrap();
    // A region of a dead owner there: magic set, no pid, nobody holds its lock.
    let name = format!("shmfab.{}.deadbeef.0000000000000001", rustix::process::getuid().as_raw());
    let mut hdr = vec![0u8; 4096];
    hdr[..8].copy_from_slice(&shm_layout::MAGIC.to_le_bytes());
    std::fs::write(dir.0.join(&name), &hdr).unwrap();
    let o = shmfab(d, &["inspect"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains(&format!("region {name} (pid 0 DEAD")), "{}", text(&o.stdout));
    let o = shmfab(d, &["info", "--ranks", "2"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains(&format!("{d}: ")) && out.contains("regions of this user: 1 (1 with dead owners)"), "{out}");
    let o = shmfab(d, &["clean"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains(&format!("removed {name}")), "{}", text(&o.stdout));
    assert!(!dir.0.join(&name).exists());
    // Unusable: an error naming the variable, and a failure status.
    let missing = format!("{d}/missing");
    for cmd in ["clean", "inspect"] {
        let o = shmfab(&missing, &[cmd]);
        assert_eq!(o.status.code(), Some(1), "{cmd}");
        assert!(text(&o.stderr).contains("SHMFAB_SHM_DIR="), "{cmd}: {}", text(&o.stderr));
    }
}
