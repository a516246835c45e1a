//! Liveness of peers as the kernel sees it: a child that exited but is not
//! reaped yet (a zombie) is dead to its parent, which may be the very
//! process waiting for it; a region's owner is alive while it lives,
//! whatever pid its header says (PID namespaces); and regions can live in
//! another directory than /dev/shm (`SHMFAB_SHM_DIR`).

mod common;
use shmfab::{ErrorKind, Fabric};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// In a child: the folder where it publishes its address.
const CHILD: &str = "SHMFAB_LIVENESS_CHILD";

/// Whether `pid` is a zombie (state Z in /proc/PID/stat).
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s[s.rfind(')')? + 1..].split_whitespace().next().map(|st| st == "Z"))
        .unwrap_or(false)
}

/// Re-executes this test binary as a child running `test` with `env`.
fn spawn_child(test: &str, dir: &Path, job: &str, env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([test, "--exact", "--nocapture", "--test-threads=1", "-q"]).env(CHILD, dir).env("SHMFAB_JOB_ID", job);
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().expect("spawn child")
}

/// In a child: opens a domain and an endpoint, publishes the address, and
/// exits at once without closing anything (as a crash would: its region
/// stays, marked ready).
fn child_publishes_and_exits(dir: &Path) -> ! {
    let fabric = Fabric::open().unwrap();
    let dom = fabric.domain().unwrap();
    let (_cq, _av, ep) = common::open_endpoint(&dom);
    std::fs::write(dir.join("addr.tmp"), ep.getname().to_bytes()).unwrap();
    std::fs::rename(dir.join("addr.tmp"), dir.join("addr")).unwrap();
    // No destructor runs: the region is neither marked closing nor unlinked.
    std::process::exit(0)
}

/// Waits up to 30 s for the child's address.
fn child_address(dir: &Path, child: &mut Child) -> shmfab::Address {
    let t0 = Instant::now();
    loop {
        if let Ok(b) = std::fs::read(dir.join("addr")) {
            return shmfab::Address::from_bytes(&b).unwrap();
        }
        assert!(child.try_wait().unwrap().is_none() || dir.join("addr").exists(), "the child failed");
        assert!(t0.elapsed() < Duration::from_secs(30), "the child never published its address");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Removes the test's folder and the child's job's regions, even on panic.
struct Cleanup {
    dir: PathBuf,
    job: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        shmfab::internal::region::remove_job(shmfab::internal::region::job_hash(&self.job));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unique(test: &str) -> (PathBuf, String) {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let job = format!("t-{test}-{}-{nanos}", std::process::id());
    let dir = std::env::temp_dir().join(&job);
    std::fs::create_dir_all(&dir).unwrap();
    (dir, job)
}

#[test]
fn a_receive_from_an_unreaped_child_fails() {
    if let Ok(dir) = std::env::var(CHILD) {
        child_publishes_and_exits(Path::new(&dir));
    }
    let (dir, job) = unique("zombie");
    let _clean = Cleanup { dir: dir.clone(), job: job.clone() };
    let fabric = Fabric::open().unwrap();
    let dom = fabric.domain().unwrap();
    let (cq, av, ep) = common::open_endpoint(&dom);
    let mut child = spawn_child("a_receive_from_an_unreaped_child_fails", &dir, &job, &[]);
    let peer = av.insert(&[child_address(&dir, &mut child)]).unwrap()[0];
    // The child exits; we do not reap it (yet): it is a zombie.
    let t0 = Instant::now();
    while !is_zombie(child.id()) {
        assert!(t0.elapsed() < Duration::from_secs(30), "the child never exited");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut b = [0u8; 8];
    // SAFETY: b lives until the completion below.
    unsafe { ep.recv(&mut b, peer, 5).unwrap() };
    let t1 = Instant::now();
    let e = common::next_completion(&dom, &cq, Duration::from_secs(10), "a receive from a zombie never failed")
        .expect_err("a receive from a dead child must fail");
    // Within a few peer-check periods (100 ms by default).
    assert!(t1.elapsed() < Duration::from_secs(2), "failed only after {:?}", t1.elapsed());
    assert_eq!(e.err, ErrorKind::Io.errno());
    assert_eq!(e.op_context, 5);
    assert!(cq.last_error_text().unwrap().contains("died"), "{:?}", cq.last_error_text());
    // Still not reaped when the receive failed.
    assert!(is_zombie(child.id()));
    assert!(child.wait().unwrap().success());
}

/// In a child: creates a region whose header names an owner that does not
/// exist here (as an owner in another PID namespace would), publishes its
/// name, and exits without removing it once told to.
fn child_foreign_owner(dir: &Path, bogus: bool) -> ! {
    use shmfab::internal::region::{job_hash, Backing, Region};
    // Named: the way ranks in different PID namespaces reach each other.
    let job = job_hash(&shmfab::internal::region::job_id());
    let r = Region::create(job, &shm_layout::EpGeometry::DEFAULT, 1, 1, Backing::Named).unwrap();
    if bogus {
        // SAFETY: our own fresh region; the parent only reads it.
        unsafe {
            let h = r.base() as *mut shm_layout::RegionHeader;
            std::ptr::addr_of_mut!((*h).owner_pid).write(0x3fff_fff0);
            std::ptr::addr_of_mut!((*h).owner_start_time).write(1);
        }
    }
    std::fs::write(dir.join("name.tmp"), r.name()).unwrap();
    std::fs::rename(dir.join("name.tmp"), dir.join("name")).unwrap();
    let t0 = Instant::now();
    while !dir.join("go").exists() {
        if !dir.exists() {
            // The parent failed and cleaned up.
            std::process::exit(1);
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "never told to go");
        std::thread::sleep(Duration::from_millis(2));
    }
    // Dies without closing: the region stays, its lock goes.
    std::process::exit(0)
}

#[test]
fn a_live_owner_with_a_foreign_pid_is_alive_and_a_dead_one_is_cleaned() {
    if let Ok(dir) = std::env::var(CHILD) {
        child_foreign_owner(Path::new(&dir), true);
    }
    let (dir, job) = unique("foreign");
    let _clean = Cleanup { dir: dir.clone(), job: job.clone() };
    let child = spawn_child("a_live_owner_with_a_foreign_pid_is_alive_and_a_dead_one_is_cleaned", &dir, &job, &[]);
    foreign_owner_is_alive_until_it_dies(&dir, &job, child);
}

#[test]
fn a_live_owner_in_another_pid_namespace_is_alive() {
    if let Ok(dir) = std::env::var(CHILD) {
        child_foreign_owner(Path::new(&dir), false);
    }
    // A real PID namespace (needs root, or user namespaces, and unshare(1)).
    let usable = Command::new("unshare")
        .args(["-p", "-f", "-m", "--mount-proc", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !usable {
        eprintln!("skipped: `unshare -p -f -m --mount-proc` is not permitted here");
        return;
    }
    let (dir, job) = unique("pidns");
    let _clean = Cleanup { dir: dir.clone(), job: job.clone() };
    let child = Command::new("unshare")
        .args(["-p", "-f", "-m", "--mount-proc", "--kill-child"])
        .arg(std::env::current_exe().unwrap())
        .args(["a_live_owner_in_another_pid_namespace_is_alive", "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(CHILD, &dir)
        .env("SHMFAB_JOB_ID", &job)
        .spawn()
        .expect("spawn unshare");
    foreign_owner_is_alive_until_it_dies(&dir, &job, child);
}

/// The parent's side of the two tests above: the child's region is alive
/// (to a scan, a clean and a peer) while the child lives, though its
/// header names no live process here; dead and cleaned once it exits.
fn foreign_owner_is_alive_until_it_dies(dir: &Path, job: &str, mut child: Child) {
    use shmfab::internal::region::{clean_dead, job_hash, owner_alive, scan, Region, RegionId};
    let t0 = Instant::now();
    let name = loop {
        if let Ok(n) = std::fs::read_to_string(dir.join("name")) {
            break n;
        }
        assert!(child.try_wait().unwrap().is_none(), "the child failed");
        assert!(t0.elapsed() < Duration::from_secs(30), "the child never published its region");
        std::thread::sleep(Duration::from_millis(2));
    };
    let path = Path::new(shmfab::internal::region::SHM_DIR).join(&name);
    let jh = job_hash(job);
    // Alive: scanned as alive, left alone by a clean, alive to a peer.
    let found = scan(Some(jh));
    assert!(found.len() == 1 && found[0].alive, "{found:?}");
    assert!(clean_dead(false).iter().all(|d| d.name != name));
    assert!(path.exists(), "a clean removed a live region");
    let peer = Region::attach(&RegionId::from_name(&name).unwrap()).unwrap();
    let (pid, start) = peer.owner();
    assert!(!owner_alive(pid, start), "pid {pid} is alive here: not a foreign owner");
    assert!(peer.alive());
    // Dead once its owner is gone (and reaped or not).
    std::fs::write(dir.join("go"), b"").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!peer.alive());
    // Dead, or already removed by a clean of any process starting a domain.
    assert!(scan(Some(jh)).iter().all(|r| !r.alive));
    clean_dead(false);
    assert!(!path.exists(), "a dead owner's region stays");
}

/// A fresh directory under /dev/shm for `SHMFAB_SHM_DIR`, removed on drop.
struct ShmDir(PathBuf);

impl ShmDir {
    fn new(test: &str) -> ShmDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let d = PathBuf::from(format!("/dev/shm/shmfab-test-{test}-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&d).unwrap();
        ShmDir(d)
    }

    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// In a 2-rank job: a message each way, then rank 1 kills itself; rank 0
/// returns once a receive from rank 1 has failed.
fn talk_then_lose_rank_1(w: &common::World) {
    let peer = w.addrs[1 - w.rank];
    let mut b = [0u8; 5];
    // SAFETY: b lives until the completion below.
    unsafe { w.ep.trecv(&mut b, peer, 7, 0, 7).unwrap() };
    w.retry(|| w.ep.tinject(b"hello", peer, 7));
    assert_eq!((w.ok(7).len, &b), (5, b"hello"));
    w.barrier();
    if w.rank == 1 {
        // SAFETY: kill on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!("SIGKILL");
    }
    let mut b = [0u8; 1];
    // SAFETY: b lives until the completion below.
    unsafe { w.ep.recv(&mut b, peer, 9).unwrap() };
    w.wait_ctx(9).expect_err("a receive from a dead rank must fail");
}

#[test]
fn regions_live_in_the_shm_dir_setting_and_are_cleaned_there() {
    // The directory is the parent's (ranks re-run this function).
    let dir = std::env::var_os("SHMFAB_TEST_RANK").is_none().then(|| ShmDir::new("dir"));
    let d = dir.as_ref().map(|d| d.0.to_str().unwrap().to_string()).unwrap_or_default();
    let env = [("SHMFAB_SHM_DIR", d.as_str()), ("SHMFAB_PEER_CHECK_MS", "20"), ("SHMFAB_REGIONS", "named")];
    common::run_killing(
        "regions_live_in_the_shm_dir_setting_and_are_cleaned_there",
        2,
        &env,
        Duration::from_secs(60),
        &[1],
        |w| {
            let dir = PathBuf::from(std::env::var("SHMFAB_SHM_DIR").unwrap());
            let mine = w.dom.region_name();
            assert!(dir.join(mine).exists(), "{mine} is not in {dir:?}");
            assert!(!Path::new("/dev/shm").join(mine).exists(), "{mine} is in /dev/shm");
            // Rank 1 dies: its region is dead, and a clean removes it from
            // the directory (and only it).
            talk_then_lose_rank_1(&w);
            let all = shmfab::internal::region::scan(None);
            assert_eq!(all.len(), 2, "{all:?}");
            assert!(all.iter().all(|r| r.alive == (r.name == mine)), "{all:?}");
            let dead = shmfab::internal::region::clean_dead(false);
            assert_eq!(dead.len(), 1, "{dead:?}");
            let left: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(left, vec![mine]);
        },
    );
    if let Some(dir) = dir {
        assert_eq!(dir.files(), Vec::<String>::new(), "regions left in {d}");
    }
}

#[test]
fn anonymous_regions_live_in_the_shm_dir_setting_and_leave_nothing_there() {
    let dir = std::env::var_os("SHMFAB_TEST_RANK").is_none().then(|| ShmDir::new("anon"));
    let d = dir.as_ref().map(|d| d.0.to_str().unwrap().to_string()).unwrap_or_default();
    let env = [("SHMFAB_SHM_DIR", d.as_str()), ("SHMFAB_PEER_CHECK_MS", "20")];
    common::run_killing(
        "anonymous_regions_live_in_the_shm_dir_setting_and_leave_nothing_there",
        2,
        &env,
        Duration::from_secs(60),
        &[1],
        |w| {
            use std::os::unix::fs::MetadataExt;
            let dir = PathBuf::from(std::env::var("SHMFAB_SHM_DIR").unwrap());
            let files = || std::fs::read_dir(&dir).unwrap().count();
            assert_eq!(files(), 0, "anonymous regions have no name");
            // The region is on the directory's file system all the same.
            let mine = w.ep.getname();
            let link = std::fs::read_link(format!("/proc/self/fd/{}", mine.fd)).unwrap();
            assert!(link.starts_with(&dir), "{link:?} is not in {dir:?}");
            let dev = std::fs::metadata(format!("/proc/self/fd/{}", mine.fd)).unwrap().dev();
            assert_eq!(dev, std::fs::metadata(&dir).unwrap().dev());
            talk_then_lose_rank_1(&w);
            // Rank 1's region is still mapped here (dead), ours alive;
            // there is nothing to clean, and nothing in the directory.
            let all = shmfab::internal::region::scan(None);
            assert_eq!(all.len(), 2, "{all:?}");
            assert!(all.iter().all(|r| !r.named && r.alive == (r.name == w.dom.region_name())), "{all:?}");
            assert!(shmfab::internal::region::clean_dead(false).is_empty());
            assert_eq!(files(), 0);
        },
    );
    if let Some(dir) = dir {
        assert_eq!(dir.files(), Vec::<String>::new(), "regions left in {d}");
    }
}

#[test]
fn an_unusable_shm_dir_setting_is_an_error_naming_it() {
    if std::env::var_os(CHILD).is_some() {
        let e = Fabric::open().and_then(|f| f.domain().map(|_| ())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Inval, "{e}");
        assert!(e.to_string().contains("SHMFAB_SHM_DIR"), "{e}");
        std::process::exit(0);
    }
    let (dir, job) = unique("baddir");
    let _clean = Cleanup { dir: dir.clone(), job: job.clone() };
    let missing = dir.join("missing");
    let env = [("SHMFAB_SHM_DIR", missing.to_str().unwrap())];
    let mut child = spawn_child("an_unusable_shm_dir_setting_is_an_error_naming_it", &dir, &job, &env);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the child hung");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(status.success(), "{status:?}");
}
