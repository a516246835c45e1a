//! Multi-process test harness: a test re-executes its own binary as N ranks
//! (role chosen by environment variables), with a timeout; the ranks meet
//! through address files in a temp directory. After the ranks exit the
//! parent checks that they left no /dev/shm region behind, and removes any
//! (also when a rank failed or hung).
#![allow(dead_code)]

use shmfab::{
    AddressVector, CompletionQueue, CqAttr, CqErrEntry, CqTaggedEntry, Domain, Endpoint, ErrorKind, Fabric, FiAddr,
    FI_RECV, FI_TRANSMIT,
};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const RANK: &str = "SHMFAB_TEST_RANK";
const SIZE: &str = "SHMFAB_TEST_SIZE";
const DIR: &str = "SHMFAB_TEST_DIR";

/// One completion from `cq` (Err: an error completion) with its source,
/// driving progress and, after a few tries, sleeping on `dom`'s doorbell
/// between them; panics with `what` after `timeout`.
pub fn next_completion(
    dom: &Domain,
    cq: &CompletionQueue,
    timeout: Duration,
    what: &str,
) -> Result<(CqTaggedEntry, FiAddr), CqErrEntry> {
    let t0 = Instant::now();
    let mut spins = 0u32;
    loop {
        let mut e = [CqTaggedEntry::default()];
        let mut src = [0u64];
        match cq.readfrom(&mut e, &mut src) {
            Ok(_) => return Ok((e[0], src[0])),
            Err(x) if x.kind() == ErrorKind::Avail => return Err(cq.readerr().unwrap()),
            Err(x) if x.kind() == ErrorKind::Again => {}
            Err(x) => panic!("cq read: {x}"),
        }
        assert!(t0.elapsed() < timeout, "{what} in {timeout:?}");
        spins += 1;
        if spins > 200 {
            dom.wait(Some(Duration::from_millis(1)));
        }
    }
}

/// Runs `body` in `n` processes (ranks 0..n) of this test binary, with
/// `env` set for them; fails if any rank fails or the job outlives `timeout`.
/// In a rank, runs `body` and returns.
pub fn run(test: &str, n: usize, env: &[(&str, &str)], timeout: Duration, body: impl FnOnce(World)) {
    run_killing(test, n, env, timeout, &[], body)
}

/// As `run`, where the ranks in `killed` are expected to die by SIGKILL
/// (they kill themselves); the harness checks that the job left no region
/// behind (with `SHMFAB_REGIONS=named`, once the next start cleaned).
pub fn run_killing(
    test: &str,
    n: usize,
    env: &[(&str, &str)],
    timeout: Duration,
    killed: &[usize],
    body: impl FnOnce(World),
) {
    if let Ok(r) = std::env::var(RANK) {
        let rank: usize = r.parse().unwrap();
        let size: usize = std::env::var(SIZE).unwrap().parse().unwrap();
        let w = World::new(rank, size);
        body(w);
        // Proof for the parent that this rank ran the body (a test name
        // that matches no test would run nothing and exit 0).
        let dir = PathBuf::from(std::env::var(DIR).unwrap());
        std::fs::write(dir.join(format!("{rank}.done")), b"").unwrap();
        return;
    }
    let job = format!("t-{test}-{}-{}", std::process::id(), rand_suffix());
    let dir = std::env::temp_dir().join(&job);
    std::fs::create_dir_all(&dir).unwrap();
    let _guard = JobGuard { job: job.clone(), dir: dir.clone() };
    let exe = std::env::current_exe().unwrap();
    let mut kids: Vec<Child> = (0..n)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.args([test, "--exact", "--nocapture", "--test-threads=1", "-q"])
                .env(RANK, r.to_string())
                .env(SIZE, n.to_string())
                .env(DIR, &dir)
                .env("SHMFAB_JOB_ID", &job);
            for (k, v) in env {
                c.env(k, v);
            }
            let log = std::fs::File::create(dir.join(format!("{r}.log"))).unwrap();
            c.stdout(log.try_clone().unwrap()).stderr(log);
            c.spawn().expect("spawn rank")
        })
        .collect();
    let t0 = Instant::now();
    let mut status = vec![None; n];
    while status.iter().any(|s| s.is_none()) {
        for (i, k) in kids.iter_mut().enumerate() {
            if status[i].is_none() {
                if let Some(s) = k.try_wait().unwrap() {
                    status[i] = Some(s);
                }
            }
        }
        // A failed rank dooms the job: stop the others instead of waiting.
        use std::os::unix::process::ExitStatusExt;
        let failed = status
            .iter()
            .enumerate()
            .any(|(r, s)| s.is_some_and(|s| !(s.success() || killed.contains(&r) && s.signal() == Some(9))));
        if failed || t0.elapsed() > timeout {
            for k in kids.iter_mut() {
                let _ = k.kill();
            }
            for k in kids.iter_mut() {
                let _ = k.wait();
            }
            for r in 0..n {
                let log = std::fs::read_to_string(dir.join(format!("{r}.log"))).unwrap_or_default();
                eprintln!(
                    "----- rank {r} -----\n{}",
                    log.lines().filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join("\n")
                );
            }
            panic!(
                "{test}: {} after {:?}; rank status: {status:?}",
                if failed { "a rank failed" } else { "timed out" },
                t0.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    use std::os::unix::process::ExitStatusExt;
    for (r, s) in status.iter().enumerate() {
        let s = s.unwrap();
        if killed.contains(&r) {
            assert_eq!(s.signal(), Some(9), "{test}: rank {r} was to die by SIGKILL: {s:?}");
        } else {
            assert!(dir.join(format!("{r}.done")).exists(), "{test}: rank {r} exited without running the test body");
        }
    }
    let jh = shmfab::internal::region::job_hash(&job);
    // Nothing is left, killed ranks or not, with no clean: anonymous regions
    // go with the last process holding them (named ones, when a test asks
    // for them, are removed by the next start: `clean_dead`).
    let mut left = shmfab::internal::region::scan(Some(jh));
    let named = env.iter().any(|&(k, v)| k == "SHMFAB_REGIONS" && v == "named");
    if named && !killed.is_empty() {
        assert!(left.iter().all(|r| !r.alive), "{test}: live regions left: {left:?}");
        shmfab::internal::region::clean_dead(false);
        left = shmfab::internal::region::scan(Some(jh));
    }
    assert!(left.is_empty(), "{test}: the job left regions behind: {left:?}");
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64
}

/// Removes the job's regions and address files, even on panic.
pub struct JobGuard {
    pub job: String,
    pub dir: PathBuf,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        shmfab::internal::region::remove_job(shmfab::internal::region::job_hash(&self.job));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One rank's view: its objects and every rank's fi_addr.
pub struct World {
    pub rank: usize,
    pub size: usize,
    // Field order is drop order: endpoint before what it is bound to.
    pub ep: Endpoint,
    pub cq: CompletionQueue,
    pub av: AddressVector,
    pub dom: Domain,
    pub fabric: Fabric,
    pub addrs: Vec<FiAddr>,
    /// Completions read but not yet asked for, by context.
    pending: std::cell::RefCell<Vec<Result<(CqTaggedEntry, FiAddr), CqErrEntry>>>,
}

/// Context of the harness's barrier receives.
pub const BARRIER_CTX: usize = usize::MAX - 7;

impl World {
    fn new(rank: usize, size: usize) -> World {
        let fabric = Fabric::open().unwrap();
        let dom = fabric.domain().unwrap();
        let cq = dom.cq_open(&CqAttr { size: 4096, ..Default::default() }).unwrap();
        let av = dom.av_open().unwrap();
        let ep = dom.endpoint().unwrap();
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
        let dir = PathBuf::from(std::env::var(DIR).unwrap());
        let tmp = dir.join(format!("{rank}.tmp"));
        std::fs::write(&tmp, ep.getname().to_bytes()).unwrap();
        std::fs::rename(&tmp, dir.join(format!("{rank}.addr"))).unwrap();
        let t0 = Instant::now();
        let mut names = Vec::new();
        for r in 0..size {
            let p = dir.join(format!("{r}.addr"));
            loop {
                if let Ok(b) = std::fs::read(&p) {
                    names.push(shmfab::Address::from_bytes(&b).unwrap());
                    break;
                }
                assert!(t0.elapsed() < Duration::from_secs(30), "rank {r} never published its address");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let addrs = av.insert(&names).unwrap();
        World { rank, size, ep, cq, av, dom, fabric, addrs, pending: Default::default() }
    }

    /// Reads one completion, driving progress and sleeping on the doorbell
    /// between tries. Err(entry) for an error completion.
    pub fn next(&self) -> Result<CqTaggedEntry, CqErrEntry> {
        self.next_from().map(|(e, _)| e)
    }

    /// As `next`, with the source fi_addr.
    pub fn next_from(&self) -> Result<(CqTaggedEntry, FiAddr), CqErrEntry> {
        let any = !self.pending.borrow().is_empty();
        if any {
            return self.pending.borrow_mut().remove(0);
        }
        self.read_one()
    }

    fn read_one(&self) -> Result<(CqTaggedEntry, FiAddr), CqErrEntry> {
        next_completion(&self.dom, &self.cq, Duration::from_secs(60), &format!("rank {}: no completion", self.rank))
    }

    /// The completion (or error completion) of the operation with `ctx`;
    /// others read meanwhile are kept for later calls.
    pub fn wait_ctx(&self, ctx: usize) -> Result<(CqTaggedEntry, FiAddr), CqErrEntry> {
        let ctx_of = |r: &Result<(CqTaggedEntry, FiAddr), CqErrEntry>| match r {
            Ok((e, _)) => e.op_context,
            Err(e) => e.op_context,
        };
        let found = self.pending.borrow().iter().position(|r| ctx_of(r) == ctx);
        if let Some(i) = found {
            return self.pending.borrow_mut().remove(i);
        }
        loop {
            let r = self.read_one();
            if ctx_of(&r) == ctx {
                return r;
            }
            self.pending.borrow_mut().push(r);
        }
    }

    /// As `wait_ctx`, failing on an error completion.
    pub fn ok(&self, ctx: usize) -> CqTaggedEntry {
        self.wait_ctx(ctx).unwrap_or_else(|e| panic!("rank {}: error completion for ctx {ctx}: {e:?}", self.rank)).0
    }

    /// Retries `f` while it says -FI_EAGAIN, driving progress between tries.
    pub fn retry(&self, mut f: impl FnMut() -> shmfab::Result<()>) -> usize {
        let mut again = 0;
        let t0 = Instant::now();
        loop {
            match f() {
                Ok(()) => return again,
                Err(e) if e.kind() == ErrorKind::Again => {
                    again += 1;
                    self.dom.progress().unwrap();
                    if again % 64 == 0 {
                        self.dom.wait(Some(Duration::from_millis(1)));
                    }
                    assert!(t0.elapsed() < Duration::from_secs(60), "stuck on -FI_EAGAIN");
                }
                Err(e) => panic!("post failed: {e}"),
            }
        }
    }

    /// A barrier through messages (tag space above 1<<62 is the harness's).
    pub fn barrier(&self) {
        const T: u64 = 1 << 62;
        let mut b = [0u8; 1];
        if self.rank == 0 {
            for _ in 1..self.size {
                // SAFETY: b outlives the wait below.
                unsafe { self.ep.trecv(&mut b, shmfab::FI_ADDR_UNSPEC, T, 0, BARRIER_CTX).unwrap() };
                self.ok(BARRIER_CTX);
            }
            for r in 1..self.size {
                self.retry(|| self.ep.tinject(&[1], self.addrs[r], T + 1));
            }
        } else {
            self.retry(|| self.ep.tinject(&[1], self.addrs[0], T));
            // SAFETY: as above.
            unsafe { self.ep.trecv(&mut b, self.addrs[0], T + 1, 0, BARRIER_CTX).unwrap() };
            self.ok(BARRIER_CTX);
        }
    }

    /// Sends endpoint addresses to rank `to` (who calls `learn`).
    pub fn tell(&self, to: usize, addrs: &[shmfab::Address]) {
        let bytes: Vec<u8> = addrs.iter().flat_map(|a| a.to_bytes()).collect();
        self.retry(|| self.ep.inject(&bytes, self.addrs[to]));
    }

    /// Receives `n` endpoint addresses from rank `from` (who calls `tell`)
    /// and inserts them into the AV.
    pub fn learn(&self, from: usize, n: usize) -> Vec<FiAddr> {
        const CTX: usize = usize::MAX - 9;
        let mut b = vec![0u8; n * shmfab::Address::SIZE];
        // SAFETY: b lives until the completion waited for below.
        unsafe { self.ep.recv(&mut b, self.addrs[from], CTX).unwrap() };
        self.ok(CTX);
        b.chunks(shmfab::Address::SIZE).map(|c| self.av.insert_bytes(c).unwrap()).collect()
    }

    /// Number of completions read but not yet claimed.
    pub fn unclaimed(&self) -> usize {
        self.pending.borrow().len()
    }
}

/// Deterministic test payload.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `rounds` turns of a 2-rank ping-pong of `len`-byte messages (rank 0
/// sends first), each checked byte by byte (seeds from `seed0`); rank
/// `w.rank`'s counters before and after.
pub fn ping_pong(w: &World, len: usize, rounds: u64, seed0: u64) -> (shmfab::EpStats, shmfab::EpStats) {
    use shmfab::{SendMsg, FI_COMPLETION};
    let peer = w.addrs[1 - w.rank];
    let before = w.ep.stats().unwrap();
    let seed = |i: u64, from: usize| seed0 + i * 2 + from as u64;
    let send = |i: u64| {
        let m = pattern(len, seed(i, w.rank));
        let iov = [std::io::IoSlice::new(&m)];
        let sm = SendMsg { iov: &iov, dest: peer, context: 20, data: 0, tag: i };
        // SAFETY: m outlives the completion waited for below.
        w.retry(|| unsafe { w.ep.tsendmsg(&sm, FI_COMPLETION) });
        w.ok(20);
    };
    let recv = |i: u64| {
        let mut b = vec![0u8; len];
        // SAFETY: b outlives the completion waited for below.
        unsafe { w.ep.trecv(&mut b, peer, i, 0, 10).unwrap() };
        assert_eq!(w.ok(10).len, len);
        assert!(b == pattern(len, seed(i, 1 - w.rank)), "len {len} round {i}: bytes");
    };
    for i in 0..rounds {
        if w.rank == 0 {
            send(i);
            recv(i);
        } else {
            recv(i);
            send(i);
        }
    }
    (before, w.ep.stats().unwrap())
}

/// The job's folder (shared by the ranks of one test: marks one rank
/// leaves for another).
pub fn test_dir() -> PathBuf {
    PathBuf::from(std::env::var(DIR).unwrap())
}

/// Writes `name` in the test folder whole or not at all (a rank polling
/// for it never reads it half written).
pub fn put_file(name: &str, text: &str) {
    let dir = test_dir();
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// An endpoint on `dom` bound to a new CQ and AV, enabled.
pub fn open_endpoint(dom: &Domain) -> (CompletionQueue, AddressVector, Endpoint) {
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let ep = dom.endpoint().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    (cq, av, ep)
}

/// Two enabled endpoints of one domain, each bound to a CQ of its own and
/// to one AV holding both (`a0`, `a1`).
pub struct Two {
    // Field order is drop order: endpoints before what they are bound to.
    pub ep0: Endpoint,
    pub ep1: Endpoint,
    pub cq0: CompletionQueue,
    pub cq1: CompletionQueue,
    pub av: AddressVector,
    pub a0: FiAddr,
    pub a1: FiAddr,
}

/// `n` endpoints of `w`'s domain, each bound to `cq` (both directions),
/// `w`'s AV and `srq`, enabled.
pub fn srq_endpoints(w: &World, n: usize, cq: &CompletionQueue, srq: &shmfab::SharedRecvQueue) -> Vec<Endpoint> {
    (0..n)
        .map(|_| {
            let ep = w.dom.endpoint().unwrap();
            ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
            ep.bind_av(&w.av).unwrap();
            ep.bind_srq(srq).unwrap();
            ep.enable().unwrap();
            ep
        })
        .collect()
}

/// [`Two`] with default CQs.
pub fn two(dom: &Domain) -> Two {
    two_with(dom, &CqAttr::default())
}

/// [`Two`], ep0's CQ opened with `attr0`.
pub fn two_with(dom: &Domain, attr0: &CqAttr) -> Two {
    let cq0 = dom.cq_open(attr0).unwrap();
    let cq1 = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let (ep0, ep1) = (dom.endpoint().unwrap(), dom.endpoint().unwrap());
    ep0.bind_cq(&cq0, FI_TRANSMIT | FI_RECV).unwrap();
    ep1.bind_cq(&cq1, FI_TRANSMIT | FI_RECV).unwrap();
    for ep in [&ep0, &ep1] {
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
    }
    let a = av.insert(&[ep0.getname(), ep1.getname()]).unwrap();
    Two { ep0, ep1, cq0, cq1, av, a0: a[0], a1: a[1] }
}
