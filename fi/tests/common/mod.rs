//! What the provider's tests share: the provider library named as
//! libfabric looks for it, a directory of their own for shmfab's regions
//! (removed whatever happens), and children run under a timeout.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("fi/ has a parent").to_path_buf()
}

/// The directory to put in FI_PROVIDER_PATH: `libshmfab-fi.so`, linked to
/// the cdylib cargo built beside this test's binary, in
/// target/<profile>/deps (the copy cargo puts in target/<profile> is
/// refreshed by `cargo build` only, not by `cargo test`).
pub fn provider_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let so = exe.parent().expect("target/<profile>/deps").join("libshmfab_fi.so");
        assert!(so.exists(), "{} was not built", so.display());
        let out =
            Command::new(root().join("scripts/fi-build.sh")).arg("--link").arg(&so).output().expect("run fi-build.sh");
        assert!(out.status.success(), "fi-build.sh --link: {}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
    })
    .clone()
}

/// A directory of this test's own for shmfab's regions, removed on drop.
pub struct ShmDir(pub PathBuf);

impl ShmDir {
    pub fn new(tag: &str) -> ShmDir {
        let d = PathBuf::from(format!("/dev/shm/shmfab-fi-test.{}.{tag}", std::process::id()));
        std::fs::create_dir_all(&d).expect("make the regions' directory");
        ShmDir(d)
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A libfabric tool with the provider on its path and `shm`'s regions in
/// `shm`.
pub fn tool(name: &str, shm: &ShmDir) -> Command {
    let mut c = Command::new(name);
    c.env("FI_PROVIDER_PATH", provider_dir()).env("SHMFAB_SHM_DIR", &shm.0).env_remove("FI_PROVIDER");
    c
}

/// Waits for a child at most `limit`, killing it then.
pub fn wait(mut c: Child, limit: Duration, what: &str) -> Output {
    let t = Instant::now();
    loop {
        if c.try_wait().expect("wait").is_some() {
            return c.wait_with_output().expect("output");
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let o = c.wait_with_output().expect("output");
            panic!(
                "{what} still ran after {limit:?}: killed\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Standard output and error of a finished child.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The C test program `fi/tests/c/<name>.c`, built once per test binary
/// (beside it, in target/<profile>/deps) against the installed libfabric.
pub fn c_program(name: &str) -> PathBuf {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    // Held while building: tests of one binary run in threads and would
    // otherwise build the same file at once.
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let exe = std::env::current_exe().expect("test binary path");
    let bin = exe.parent().expect("target/<profile>/deps").join(name);
    let src = root().join(format!("fi/tests/c/{name}.c"));
    let out = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(["-lfabric", "-lpthread"])
        .output()
        .expect("cc (scripts/deps.sh installs gcc and libfabric-dev)");
    assert!(out.status.success(), "building {}:\n{}", src.display(), text(&out));
    built.insert(name.to_string(), bin.clone());
    bin
}

/// Runs the C test program `name` (see [`c_program`]) with `env` and
/// `args`, its regions in a directory of its own (`tag`), under `limit`:
/// it must pass ("checks passed") and leave that directory empty.
pub fn run_c(name: &str, tag: &str, env: &[(&str, &str)], args: &[&str], limit: Duration) {
    use std::process::Stdio;
    let shm = ShmDir::new(tag);
    let bin = c_program(name);
    let mut cmd = tool(bin.to_str().expect("utf-8 path"), &shm);
    cmd.envs(env.iter().copied()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap_or_else(|e| panic!("run {name}: {e}"));
    let o = wait(child, limit, name);
    let t = text(&o);
    assert!(o.status.success() && t.contains("checks passed"), "{name} ({env:?} {args:?}) failed:\n{t}");
    let left: Vec<_> = std::fs::read_dir(&shm.0).expect("regions' directory").collect();
    assert!(left.is_empty(), "regions left behind: {left:?}");
}
