//! Two-process benchmarks, shared by `shmfab bench`, the criterion benches
//! and `scripts/compare.sh`: ping-pong half round-trip, windowed streaming
//! bandwidth and message rate over shmfab; the raw floor (two processes
//! ping-ponging a payload through one shared page with a flag, nothing
//! else; above a page, through a shared buffer in pieces that the receiver
//! copies out as they land); and runners for the installed peers (Open
//! MPI's shared-memory BTL, and UCX's shared-memory transports under Open
//! MPI's pml ucx, both through the project's osu-style program;
//! libfabric's shm provider through fi_pingpong).
//!
//! A [`Link`] is the parent's end: it opens an endpoint, starts a peer
//! process (this same executable, which calls [`peer_main`] when
//! `SHMFAB_BENCH_PEER` is set) and learns its address from a hello message.

use shmfab::{
    AddressVector, CompletionQueue, CqAttr, CqTaggedEntry, Domain, Endpoint, Error, ErrorKind, Fabric, FiAddr, Result,
    FI_ADDR_UNSPEC, FI_RECV, FI_TRANSMIT,
};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the peer's environment: the parent's address, hex.
pub const PEER_ENV: &str = "SHMFAB_BENCH_PEER";
/// Set in the peer's environment: the CPU to bind to.
pub const CPU_ENV: &str = "SHMFAB_BENCH_CPU";

const T_HELLO: u64 = 1;
const T_CMD: u64 = 2;
const T_PING: u64 = 3;
const T_PONG: u64 = 4;
const T_BW: u64 = 5;
const T_ACK: u64 = 6;

const CMD_PINGPONG: u32 = 1;
const CMD_BW: u32 = 2;
const CMD_QUIT: u32 = 3;
const CMD_WAKE: u32 = 4;
const CMD_IDLE: u32 = 5;
const T_WAKE: u64 = 7;
const CMD_RMA_SETUP: u32 = 6;
const CMD_RMA_FILL: u32 = 7;
const CMD_RMA_CHECK: u32 = 8;
const CMD_FADD: u32 = 9;
const T_RMA: u64 = 8;

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the node.
pub fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time (user + system) of this process, in nanoseconds.
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Median of a sample.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// Largest message the benchmarks send.
pub const MAX_SIZE: usize = 8 << 20;

/// One measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figure {
    /// Message size in bytes.
    pub size: usize,
    /// Half round-trip in microseconds.
    pub half_rtt_us: Option<f64>,
    /// Streaming bandwidth in GB/s (10^9 bytes per second).
    pub bw_gbs: Option<f64>,
    /// Message rate in millions of messages per second.
    pub mmsgs: Option<f64>,
}

/// Largest CPU number [`bind_cpu`] takes (a `cpu_set_t` holds 1024).
pub const MAX_CPU: usize = libc::CPU_SETSIZE as usize - 1;

/// `SHMFAB_BENCH_CPU`, the CPU a benchmark peer binds to: unset, or 0 to
/// [`MAX_CPU`]; anything else is one line naming the variable and its range.
pub fn cpu_from_env() -> Result<Option<usize>> {
    shmfab::proto::parse_env(&shmfab::proto::process_env, CPU_ENV, 0, MAX_CPU as u64, shmfab::proto::Rule::Any)
}

/// Binds a peer to the CPU of `SHMFAB_BENCH_CPU`, if set. Err: the line to
/// print (the peer then exits with status 2).
fn bind_from_env() -> std::result::Result<(), String> {
    match cpu_from_env() {
        Ok(Some(cpu)) => bind_cpu(cpu),
        Ok(None) => {}
        Err(e) => return Err(e.detail().map_or_else(|| e.to_string(), str::to_string)),
    }
    Ok(())
}

/// Binds the calling thread to one CPU (best effort; a CPU above
/// [`MAX_CPU`] is ignored).
pub fn bind_cpu(cpu: usize) {
    if cpu > MAX_CPU {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it;
    // sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// CPUs online (not the calling thread's affinity, which binding narrows),
/// read once: sysconf reads a sysfs file each time.
pub fn ncpus() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        // SAFETY: sysconf only reads system configuration.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        if n > 0 {
            n as usize
        } else {
            1
        }
    })
}

/// Iterations for a size: about the same time per size.
pub fn iters_for(size: usize) -> usize {
    (400_000_000 / (size + 20_000)).clamp(20, 100_000)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}

struct Ends {
    ep: Endpoint,
    cq: CompletionQueue,
    av: AddressVector,
    dom: Domain,
    _fabric: Fabric,
}

fn open_ends() -> Result<Ends> {
    let fabric = Fabric::open()?;
    let dom = fabric.domain()?;
    let cq = dom.cq_open(&CqAttr { size: 8192, ..Default::default() })?;
    let av = dom.av_open()?;
    let ep = dom.endpoint()?;
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV)?;
    ep.bind_av(&av)?;
    ep.enable()?;
    Ok(Ends { ep, cq, av, dom, _fabric: fabric })
}

impl Ends {
    /// Spins on the CQ until `n` receive completions came (send
    /// completions are counted in `sends`). Errors out after 30 s.
    /// Returns the length of the last receive completion (only that: a
    /// whole entry copied out and back would lengthen the measured path).
    fn wait_recvs(&self, n: usize) -> Result<usize> {
        let mut got = 0;
        let mut last = 0;
        let mut e = [CqTaggedEntry::default(); 16];
        // The clock only once the wait is long (a read of it costs about
        // 37 ns on these VMs: not on every message's path).
        let mut t0: Option<Instant> = None;
        let mut spins = 0u32;
        while got < n {
            match self.cq.read(&mut e) {
                Ok(k) => {
                    for x in &e[..k] {
                        if x.flags & FI_RECV != 0 {
                            got += 1;
                            last = x.len;
                        }
                    }
                    spins = 0;
                }
                Err(x) if x.kind() == ErrorKind::Again => {
                    spins += 1;
                    if spins.is_multiple_of(4096) {
                        if t0.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(30) {
                            return Err(Error::with(ErrorKind::TimedOut, "benchmark peer stopped answering"));
                        }
                        if ncpus() < 2 {
                            std::thread::yield_now();
                        }
                    }
                }
                Err(x) if x.kind() == ErrorKind::Avail => {
                    let err = self.cq.readerr()?;
                    return Err(Error::with(ErrorKind::from_errno(err.err), format!("{:?}", err)));
                }
                Err(x) => return Err(x),
            }
        }
        Ok(last)
    }

    /// Sends, retrying on back-pressure; small messages go by inject.
    fn send(&self, buf: &[u8], to: FiAddr, tag: u64) -> Result<()> {
        loop {
            let r = if buf.len() <= shmfab::proto::INJECT_SIZE {
                self.ep.tinject(buf, to, tag)
            } else {
                // SAFETY: callers keep buf alive until a receive completion
                // that follows the send's, which implies the send finished
                // reading it (the peer answers only after receiving it).
                unsafe { self.ep.tsend(buf, to, tag, 0) }
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Again => self.dom.progress()?,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The parent's end of a two-process benchmark.
pub struct Link {
    ends: Ends,
    peer: FiAddr,
    /// The peer process we started (None when a launcher started it).
    child: Option<Child>,
    buf: Vec<u8>,
    /// The one-sided runs' state, after [`Link::rma_setup`].
    rma: Option<RmaSide>,
}

impl Link {
    /// Starts the peer (`exe` with `args`; it must call [`peer_main`] when
    /// [`PEER_ENV`] is set) and connects to it.
    pub fn spawn(exe: &std::path::Path, args: &[&str]) -> Result<Link> {
        let bind = ncpus() >= 2;
        if bind {
            bind_cpu(0);
        }
        let ends = open_ends()?;
        let mut cmd = Command::new(exe);
        cmd.args(args).env(PEER_ENV, hex(&ends.ep.getname().to_bytes())).stdin(Stdio::null());
        if bind {
            cmd.env(CPU_ENV, "1");
        }
        let child = cmd.spawn().map_err(|e| Error::with(ErrorKind::Io, format!("cannot start the peer: {e}")))?;
        let mut link = Link { ends, peer: 0, child: Some(child), buf: vec![0u8; MAX_SIZE], rma: None };
        let mut hello = [0u8; shm_layout::Address::SIZE];
        // SAFETY: hello lives until the completion read just below.
        unsafe { link.ends.ep.trecv(&mut hello, FI_ADDR_UNSPEC, T_HELLO, 0, 1)? };
        link.ends.wait_recvs(1)?;
        link.peer = link.ends.av.insert_bytes(&hello)?;
        Ok(link)
    }

    fn command(&self, kind: u32, size: usize, window: usize, iters: usize) -> Result<()> {
        let mut c = [0u8; 24];
        c[0..4].copy_from_slice(&kind.to_le_bytes());
        c[4..8].copy_from_slice(&(window as u32).to_le_bytes());
        c[8..16].copy_from_slice(&(size as u64).to_le_bytes());
        c[16..24].copy_from_slice(&(iters as u64).to_le_bytes());
        self.ends.send(&c, self.peer, T_CMD)
    }

    /// Ping-pong: mean half round-trip over `iters` round trips (after a
    /// tenth as many warm-up ones), in microseconds.
    pub fn pingpong(&mut self, size: usize, iters: usize) -> Result<f64> {
        let warm = (iters / 10).max(2);
        self.round_trips(size, warm)?;
        let d = self.round_trips(size, iters)?;
        Ok(d.as_secs_f64() * 1e6 / (2.0 * iters as f64))
    }

    /// Time of `n` round trips of `size` bytes each way.
    pub fn round_trips(&mut self, size: usize, n: usize) -> Result<Duration> {
        self.command(CMD_PINGPONG, size, 0, n)?;
        let mut rb = std::mem::take(&mut self.buf);
        let sb = payload(size);
        let t0 = Instant::now();
        let r = (|| {
            for _ in 0..n {
                // Send, then post the receive for the answer (as an
                // osu-style MPI_Send + MPI_Recv does): sending runs no
                // receive progress, so the pong still finds it posted.
                self.ends.send(&sb, self.peer, T_PING)?;
                // SAFETY: rb lives until the completion waited for just below.
                unsafe { self.ends.ep.trecv(&mut rb[..size], self.peer, T_PONG, 0, 2)? };
                let len = self.ends.wait_recvs(1)?;
                if len != size {
                    return Err(Error::with(ErrorKind::Io, format!("pong of {len} bytes for a {size}-byte ping")));
                }
            }
            Ok(())
        })();
        let el = t0.elapsed();
        self.buf = rb;
        r.map(|_| el)
    }

    /// Windowed streaming: `iters` windows of `window` messages of `size`,
    /// each window acknowledged by the peer. Returns (GB/s, Mmsg/s).
    pub fn stream(&mut self, size: usize, window: usize, iters: usize) -> Result<(f64, f64)> {
        self.windows(size, window, (iters / 10).max(1))?;
        let s = self.windows(size, window, iters)?.as_secs_f64();
        let msgs = (window * iters) as f64;
        Ok((msgs * size as f64 / s / 1e9, msgs / s / 1e6))
    }

    /// Time of `n` acknowledged windows of `window` messages of `size`.
    pub fn windows(&mut self, size: usize, window: usize, n: usize) -> Result<Duration> {
        self.command(CMD_BW, size, window, n)?;
        let sb = payload(size);
        let mut ack = [0u8; 4];
        let t0 = Instant::now();
        for _ in 0..n {
            // SAFETY: ack lives until its completion below.
            unsafe { self.ends.ep.trecv(&mut ack, self.peer, T_ACK, 0, 3)? };
            for _ in 0..window {
                self.ends.send(&sb, self.peer, T_BW)?;
            }
            self.ends.wait_recvs(1)?;
        }
        Ok(t0.elapsed())
    }

    /// Wake-up latency of a peer asleep in `sread`: microseconds from our
    /// send to the peer seeing the completion (one clock for both), one per
    /// try; the peer is given `gap` to fall asleep before each send.
    pub fn wakeups(&mut self, tries: usize, gap: Duration) -> Result<Vec<f64>> {
        self.command(CMD_WAKE, 8, 0, tries)?;
        let mut out = Vec::with_capacity(tries);
        let mut b = [0u8; 8];
        for _ in 0..tries {
            std::thread::sleep(gap);
            // SAFETY: b lives until the completion below.
            unsafe { self.ends.ep.trecv(&mut b, self.peer, T_PONG, 0, 2)? };
            let sent = mono_ns();
            self.ends.send(&[1u8; 8], self.peer, T_WAKE)?;
            self.ends.wait_recvs(1)?;
            let seen = u64::from_le_bytes(b);
            out.push(seen.saturating_sub(sent) as f64 / 1e3);
        }
        Ok(out)
    }

    /// CPU share (percent of one core) of a peer blocked in `sread` on an
    /// idle CQ for `period`.
    pub fn idle_cpu(&mut self, period: Duration) -> Result<f64> {
        let mut b = [0u8; 8];
        // SAFETY: b lives until the completion below.
        unsafe { self.ends.ep.trecv(&mut b, self.peer, T_PONG, 0, 2)? };
        self.command(CMD_IDLE, 0, 0, period.as_millis() as usize)?;
        let t0 = Instant::now();
        loop {
            match self.ends.cq.sread(&mut [CqTaggedEntry::default()], None, Some(Duration::from_secs(1))) {
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::Again && t0.elapsed() < period + Duration::from_secs(30) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(u64::from_le_bytes(b) as f64 / period.as_nanos() as f64 * 100.0)
    }

    /// Windows used by [`Link::stream`] for a size.
    pub fn window_for(size: usize) -> usize {
        if size >= 1 << 20 {
            16
        } else {
            64
        }
    }

    /// Stops the peer.
    pub fn quit(mut self) -> Result<()> {
        self.command(CMD_QUIT, 0, 0, 0)?;
        let t0 = Instant::now();
        let Some(child) = self.child.as_mut() else {
            // A launcher's rank: it exits by itself; let the command go out.
            while t0.elapsed() < Duration::from_millis(50) {
                self.ends.dom.progress()?;
            }
            return Ok(());
        };
        loop {
            self.ends.dom.progress()?;
            if let Some(st) = child.try_wait()? {
                return if st.success() {
                    Ok(())
                } else {
                    Err(Error::with(ErrorKind::Io, format!("benchmark peer exited with {st}")))
                };
            }
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                return Err(Error::with(ErrorKind::TimedOut, "benchmark peer did not exit"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Rank 0 of a two-rank job a launcher started (mpirun, shmfab run):
    /// the peer is rank 1, which calls [`serve_world`]; binding is the
    /// launcher's.
    pub fn with_world(w: &shmfab::World) -> Result<Link> {
        if w.size != 2 || w.rank != 0 {
            return Err(Error::with(ErrorKind::Inval, "benchmarks under a launcher need exactly 2 ranks"));
        }
        let ends = open_ends()?;
        w.ep.inject(&ends.ep.getname().to_bytes(), w.addr(1))?;
        let mut link = Link { ends, peer: 0, child: None, buf: vec![0u8; MAX_SIZE], rma: None };
        let mut hello = [0u8; shm_layout::Address::SIZE];
        // SAFETY: hello lives until the completion read just below.
        unsafe { link.ends.ep.trecv(&mut hello, FI_ADDR_UNSPEC, T_HELLO, 0, 1)? };
        link.ends.wait_recvs(1)?;
        link.peer = link.ends.av.insert_bytes(&hello)?;
        Ok(link)
    }
}

/// Rank 1 of a two-rank job: serves rank 0's [`Link::with_world`] until
/// told to quit.
pub fn serve_world(w: &shmfab::World) -> Result<()> {
    let mut addr = [0u8; shm_layout::Address::SIZE];
    // SAFETY: addr lives until the completion below.
    unsafe { w.ep.recv(&mut addr, w.addr(0), 77)? };
    match w.wait(77, None)? {
        Ok(_) => serve(&addr),
        Err(e) => Err(Error::with(ErrorKind::from_errno(e.err), "rank 0 did not send its address")),
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Deterministic payload of `size` bytes.
pub fn payload(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 7 + 3) as u8).collect()
}

/// The peer's side: serves commands from the parent until told to quit.
/// Returns the process exit code.
pub fn peer_main() -> i32 {
    if let Err(e) = bind_from_env() {
        eprintln!("shmfab bench peer: {e}");
        return 2;
    }
    match peer_loop() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shmfab bench peer: {e}");
            1
        }
    }
}

fn peer_loop() -> Result<()> {
    let addr = std::env::var(PEER_ENV)
        .ok()
        .and_then(|h| unhex(&h))
        .ok_or_else(|| Error::with(ErrorKind::Inval, format!("{PEER_ENV} is not a hex address")))?;
    serve(&addr)
}

/// The peer's loop: says hello to `addr`, then serves its commands.
fn serve(addr: &[u8]) -> Result<()> {
    let ends = open_ends()?;
    let parent = ends.av.insert_bytes(addr)?;
    ends.send(&ends.ep.getname().to_bytes(), parent, T_HELLO)?;
    // Separate receive and send buffers, as osu_latency has (echoing the
    // received buffer would also measure pulling it from the other core).
    let mut buf = vec![0u8; MAX_SIZE];
    let sbuf = payload(MAX_SIZE);
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut rma: Option<PeerRma> = None;
    loop {
        let mut c = [0u8; 24];
        // SAFETY: c lives until the completion below.
        unsafe { ends.ep.trecv(&mut c, parent, T_CMD, 0, 10)? };
        ends.wait_recvs(1)?;
        let kind = u32::from_le_bytes(c[0..4].try_into().unwrap());
        let window = u32::from_le_bytes(c[4..8].try_into().unwrap()) as usize;
        let size = u64::from_le_bytes(c[8..16].try_into().unwrap()) as usize;
        let iters = u64::from_le_bytes(c[16..24].try_into().unwrap()) as usize;
        if size > MAX_SIZE || window > 4096 {
            return Err(Error::with(ErrorKind::Inval, "command out of range"));
        }
        match kind {
            CMD_PINGPONG => {
                // The first receive is posted up front; each later one right
                // after answering, off the critical path.
                // SAFETY: buf lives until the completions below; sbuf is
                // never written, and outlives every send from it.
                unsafe { ends.ep.trecv(&mut buf[..size], parent, T_PING, 0, 11)? };
                for i in 0..iters {
                    // The answer has the ping's size, known from the
                    // command: the send does not wait on the completion's
                    // length, which is checked right after.
                    let len = ends.wait_recvs(1)?;
                    ends.send(&sbuf[..size], parent, T_PONG)?;
                    if len != size {
                        return Err(Error::with(
                            ErrorKind::Io,
                            format!("ping of {len} bytes for a {size}-byte ping-pong"),
                        ));
                    }
                    if i + 1 < iters {
                        // SAFETY: as above.
                        unsafe { ends.ep.trecv(&mut buf[..size], parent, T_PING, 0, 11)? };
                    }
                }
            }
            CMD_BW => {
                while bufs.len() < window {
                    bufs.push(Vec::new());
                }
                for b in bufs.iter_mut().take(window) {
                    b.resize(size, 0);
                }
                for _ in 0..iters {
                    for b in bufs.iter_mut().take(window) {
                        // SAFETY: the buffers live until the completions below.
                        unsafe { ends.ep.trecv(&mut b[..size], parent, T_BW, 0, 12)? };
                    }
                    ends.wait_recvs(window)?;
                    ends.send(&[0u8; 4], parent, T_ACK)?;
                }
            }
            CMD_WAKE => {
                // Block in sread (asleep on the doorbell) for each message,
                // then say when we saw it.
                let mut b = [0u8; 8];
                for _ in 0..iters {
                    // SAFETY: b lives until the completion below.
                    unsafe { ends.ep.trecv(&mut b, parent, T_WAKE, 0, 13)? };
                    let mut e = [CqTaggedEntry::default()];
                    loop {
                        match ends.cq.sread(&mut e, None, Some(Duration::from_secs(30))) {
                            Ok(_) if e[0].flags & FI_RECV != 0 => break,
                            Ok(_) => continue,
                            Err(x) => return Err(x),
                        }
                    }
                    let seen = mono_ns();
                    ends.send(&seen.to_le_bytes(), parent, T_PONG)?;
                }
            }
            CMD_IDLE => {
                // Block in sread on an idle CQ for `iters` ms; report the CPU
                // time that cost.
                let c0 = cpu_ns();
                let mut e = [CqTaggedEntry::default()];
                let r = ends.cq.sread(&mut e, None, Some(Duration::from_millis(iters as u64)));
                if !matches!(&r, Err(x) if x.kind() == ErrorKind::Again) {
                    return Err(Error::with(ErrorKind::Other, format!("idle sread returned {r:?}")));
                }
                let used = cpu_ns() - c0;
                ends.send(&used.to_le_bytes(), parent, T_PONG)?;
            }
            CMD_RMA_SETUP => {
                let r = PeerRma::new(&ends, size)?;
                let mut keys = [0u8; 16];
                keys[..8].copy_from_slice(&r.heap.key().to_le_bytes());
                keys[8..].copy_from_slice(&r.user_mr.key().to_le_bytes());
                rma = Some(r);
                ends.send(&keys, parent, T_RMA)?;
            }
            CMD_RMA_FILL | CMD_RMA_CHECK => {
                let r = rma.as_mut().ok_or_else(|| Error::with(ErrorKind::Inval, "RMA command before setup"))?;
                let mem = r.mem(window == 1);
                if size > r.len {
                    return Err(Error::with(ErrorKind::Inval, "RMA command out of range"));
                }
                let want = rma_pattern(size, iters as u64);
                let ok = if kind == CMD_RMA_FILL {
                    // SAFETY: the registration's memory, `size` bytes of
                    // it (checked above); the initiator reads it only
                    // after our answer below.
                    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), mem, size) };
                    true
                } else {
                    // SAFETY: as above; the initiator's writes completed
                    // before it sent this command.
                    unsafe { std::slice::from_raw_parts(mem, size) == &want[..] }
                };
                ends.send(&[u8::from(ok), 0, 0, 0], parent, T_RMA)?;
            }
            CMD_FADD => {
                let r = rma.as_mut().ok_or_else(|| Error::with(ErrorKind::Inval, "RMA command before setup"))?;
                // `window` 1: through a HeapTarget.
                let ok = r.fetch_adds(&ends, iters, window == 1)?;
                ends.send(&[u8::from(ok), 0, 0, 0], parent, T_RMA)?;
            }
            CMD_QUIT => return Ok(()),
            _ => return Err(Error::with(ErrorKind::Inval, format!("unknown command {kind}"))),
        }
    }
}

/// Largest message the raw floor moves through its page (one page less its
/// flags); larger ones go through a shared buffer in [`RAW_PIECE`] pieces.
pub const RAW_PAGE_MAX: usize = 4096 - 128;

/// The pieces of the raw floor above a page: the sender copies a piece into
/// the shared buffer and stores how much is there (release), the receiver
/// copies each piece out as it lands, so the two copies overlap, as in
/// shmfab's piped ring messages and the peers' fragments. 4 KiB: a C probe
/// of this hand-over (session 17) found 4 KiB pieces 13% faster than one
/// at 16 KiB and 2 KiB pieces 8% slower; session 21 (near, raw 8 B 0.043-0.050
/// us) timed 16 KiB in 4 KiB pieces at 1.96-2.05 us, in one piece 2.10-2.20,
/// and non-temporal stores (2.03-2.15), write-backs after the copy (3.1)
/// or the receiver's prefetches (1.95-1.97) gained nothing.
pub const RAW_PIECE: usize = 4096;

/// The raw floor: two processes ping-pong `size` bytes (up to
/// [`MAX_SIZE`]) through shared memory and nothing else: up to
/// [`RAW_PAGE_MAX`] bytes through one shared page with a flag each way in
/// the payload's first line; above it through a buffer per direction in
/// [`RAW_PIECE`] pieces, each published by a count (two copies,
/// overlapped: the floor of any two-copy protocol). Returns the half
/// round-trip in microseconds. `exe` is re-run as the peer with
/// `SHMFAB_RAW_PEER` set (it must call [`raw_peer_main`]). Every message
/// above a page carries its round's number in its first and last 8 bytes,
/// which both sides check.
pub fn raw_pingpong(exe: &std::path::Path, args: &[&str], size: usize, iters: usize) -> Result<f64> {
    if size > MAX_SIZE {
        return Err(Error::with(ErrorKind::Inval, format!("the raw floor moves at most {MAX_SIZE} bytes")));
    }
    let bind = ncpus() >= 2;
    if bind {
        bind_cpu(0);
    }
    let name =
        format!("{}{}.raw.{}", shmfab::internal::region::PREFIX, shmfab::internal::region::uid(), std::process::id());
    let page = RawPage::create_for(&name, size)?;
    let mut cmd = Command::new(exe);
    cmd.args(args).env("SHMFAB_RAW_PEER", &name).env("SHMFAB_RAW_SIZE", size.to_string());
    cmd.env("SHMFAB_RAW_ITERS", iters.to_string()).stdin(Stdio::null());
    if bind {
        cmd.env(CPU_ENV, "1");
    }
    let mut child = cmd.spawn().map_err(|e| Error::with(ErrorKind::Io, format!("cannot start the raw peer: {e}")))?;
    let mut src = payload(size);
    let mut dst = vec![0u8; size];
    let warm = iters / 10 + 1;
    let mut t0 = Instant::now();
    let mut ok = true;
    for i in 1..=(warm + iters) as u64 {
        if i == warm as u64 + 1 {
            t0 = Instant::now();
        }
        if size > RAW_PAGE_MAX {
            stamp(&mut src, i);
        }
        page.put(0, i, &src);
        if !page.take(1, i, &mut dst) || (size > RAW_PAGE_MAX && !stamped(&dst, i)) {
            ok = false;
            break;
        }
    }
    let el = t0.elapsed();
    let st = child.wait()?;
    drop(page);
    if !ok || !st.success() || dst != src {
        return Err(Error::with(ErrorKind::Io, "raw ping-pong failed"));
    }
    Ok(el.as_secs_f64() * 1e6 / (2.0 * iters as f64))
}

/// A raw futex wake between two processes, measured as [`Link::wakeups`]:
/// the peer sleeps in FUTEX_WAIT on a shared word; we store and FUTEX_WAKE;
/// it writes the time it woke. Microseconds, one per try.
pub fn raw_futex_wakeups(exe: &std::path::Path, args: &[&str], tries: usize, gap: Duration) -> Result<Vec<f64>> {
    let name = format!(
        "{}{}.rawfutex.{}",
        shmfab::internal::region::PREFIX,
        shmfab::internal::region::uid(),
        std::process::id()
    );
    let page = RawPage::create(&name)?;
    let mut cmd = Command::new(exe);
    cmd.args(args).env("SHMFAB_RAW_PEER", &name).env("SHMFAB_RAW_SIZE", "0").env("SHMFAB_RAW_MODE", "futex");
    cmd.env("SHMFAB_RAW_ITERS", tries.to_string()).stdin(Stdio::null());
    // Same placement as the shmfab measurement: us on CPU 0, the sleeper on
    // CPU 1 (a wake-up on the waker's own CPU would skip the cross-CPU
    // interrupt that dominates the cost).
    if ncpus() >= 2 {
        bind_cpu(0);
        cmd.env(CPU_ENV, "1");
    }
    let mut child = cmd.spawn().map_err(|e| Error::with(ErrorKind::Io, format!("cannot start the raw peer: {e}")))?;
    let mut out = Vec::with_capacity(tries);
    for i in 1..=tries as u64 {
        std::thread::sleep(gap);
        let sent = mono_ns();
        // SYNC: the peer's FUTEX_WAIT compares against the old value.
        page.word().store((i & 0xffff_ffff) as u32, std::sync::atomic::Ordering::Release);
        // SAFETY: FUTEX_WAKE on a word of our shared mapping.
        unsafe {
            libc::syscall(libc::SYS_futex, page.word().as_ptr(), libc::FUTEX_WAKE, 1, 0usize, 0usize, 0u32);
        }
        let mut t = [0u8; 8];
        if !page.take(1, i, &mut t) {
            let _ = child.kill();
            return Err(Error::with(ErrorKind::TimedOut, "raw futex peer did not answer"));
        }
        out.push(u64::from_le_bytes(t).saturating_sub(sent) as f64 / 1e3);
    }
    child.wait()?;
    Ok(out)
}

/// The raw floor of the two-rank fetch-add rate: two processes, one per
/// CPU, each doing `n` `lock xadd`s of 1 on one word of a shared page and
/// nothing else. Returns millions of fetch-adds per second for the two
/// together (from both being ready until both are done); checks the
/// word's final value. `exe` is re-run as the peer, as for
/// [`raw_pingpong`].
pub fn raw_fetch_adds(exe: &std::path::Path, args: &[&str], n: usize) -> Result<f64> {
    let name = format!(
        "{}{}.rawfadd.{}",
        shmfab::internal::region::PREFIX,
        shmfab::internal::region::uid(),
        std::process::id()
    );
    let page = RawPage::create(&name)?;
    let mut cmd = Command::new(exe);
    cmd.args(args).env("SHMFAB_RAW_PEER", &name).env("SHMFAB_RAW_SIZE", "0").env("SHMFAB_RAW_MODE", "fadd");
    cmd.env("SHMFAB_RAW_ITERS", n.to_string()).stdin(Stdio::null());
    if ncpus() >= 2 {
        bind_cpu(0);
        cmd.env(CPU_ENV, "1");
    }
    let mut child = cmd.spawn().map_err(|e| Error::with(ErrorKind::Io, format!("cannot start the raw peer: {e}")))?;
    let started = raw_fadd_side(&page, n);
    // The peer raised the ready count before its loop and the done count
    // after it: wait for its done.
    let done = page.fadd_words().2;
    let t_wait = Instant::now();
    while done.load(std::sync::atomic::Ordering::Acquire) < 2 {
        if t_wait.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::with(ErrorKind::TimedOut, "raw fetch-add peer did not finish"));
        }
        std::hint::spin_loop();
    }
    let el = started.map(|t| t.elapsed());
    let st = child.wait()?;
    let total = page.fadd_words().0.load(std::sync::atomic::Ordering::Acquire);
    let Some(el) = el.filter(|_| st.success() && total == 2 * n as u64) else {
        return Err(Error::with(ErrorKind::Io, format!("raw fetch-add: the word holds {total}, not {}", 2 * n)));
    };
    Ok(2.0 * n as f64 / el.as_secs_f64() / 1e6)
}

/// One side of [`raw_fetch_adds`]: says it is ready, waits for the other,
/// does its `n` fetch-adds, says it is done. Returns when both were
/// ready (None: the other never came).
fn raw_fadd_side(page: &RawPage, n: usize) -> Option<Instant> {
    use std::sync::atomic::Ordering::{AcqRel, Acquire};
    let (word, ready, done) = page.fadd_words();
    ready.fetch_add(1, AcqRel);
    let t0 = Instant::now();
    while ready.load(Acquire) < 2 {
        if t0.elapsed() > Duration::from_secs(10) {
            return None;
        }
        std::hint::spin_loop();
    }
    let start = Instant::now();
    for _ in 0..n {
        word.fetch_add(1, AcqRel);
    }
    // SYNC: release pairs with the acquire loads of `done` in
    // raw_fetch_adds, which then reads the word.
    done.fetch_add(1, AcqRel);
    Some(start)
}

/// The raw floor's peer side. Returns the exit code.
pub fn raw_peer_main() -> i32 {
    if let Err(e) = bind_from_env() {
        eprintln!("shmfab raw peer: {e}");
        return 2;
    }
    let get = |k: &str| std::env::var(k).ok();
    let (Some(name), Some(size), Some(iters)) =
        (get("SHMFAB_RAW_PEER"), get("SHMFAB_RAW_SIZE"), get("SHMFAB_RAW_ITERS"))
    else {
        return 2;
    };
    let (Ok(size), Ok(iters)) = (size.parse::<usize>(), iters.parse::<usize>()) else {
        return 2;
    };
    let Ok(page) = RawPage::open_for(&name, size) else {
        return 1;
    };
    if std::env::var("SHMFAB_RAW_MODE").as_deref() == Ok("fadd") {
        return if raw_fadd_side(&page, iters).is_some() { 0 } else { 1 };
    }
    if std::env::var("SHMFAB_RAW_MODE").as_deref() == Ok("futex") {
        for i in 1..=iters as u64 {
            let want = (i & 0xffff_ffff) as u32;
            loop {
                let v = page.word().load(std::sync::atomic::Ordering::Acquire);
                if v == want {
                    break;
                }
                // SAFETY: FUTEX_WAIT on a word of our shared mapping; it
                // returns at once if the word is no longer v.
                unsafe {
                    libc::syscall(libc::SYS_futex, page.word().as_ptr(), libc::FUTEX_WAIT, v, 0usize, 0usize, 0u32);
                }
            }
            page.put(1, i, &mono_ns().to_le_bytes());
        }
        return 0;
    }
    if size > MAX_SIZE {
        return 2;
    }
    let mut buf = vec![0u8; size];
    let warm = iters / 10 + 1;
    for i in 1..=(warm + iters) as u64 {
        if !page.take(0, i, &mut buf) || (size > RAW_PAGE_MAX && !stamped(&buf, i)) {
            return 1;
        }
        page.put(1, i, &buf);
    }
    0
}

/// Writes round `i` into the first and last 8 bytes of a raw floor message
/// (more than a page: both ends in different pieces).
fn stamp(m: &mut [u8], i: u64) {
    let n = m.len();
    m[..8].copy_from_slice(&i.to_le_bytes());
    m[n - 8..].copy_from_slice(&i.to_le_bytes());
}

/// Whether a raw floor message carries round `i` at both ends.
fn stamped(m: &[u8], i: u64) -> bool {
    let n = m.len();
    m[..8] == i.to_le_bytes() && m[n - 8..] == i.to_le_bytes()
}

/// Where a direction's payload starts: right after its flag, in the same
/// cache line, so a small message moves one line each way (with the
/// payload on a line of its own, the floor was about 20% higher here).
const RAW_PAYLOAD: usize = 8;

/// Where a direction's progress word lies in its page (messages above a
/// page): a line of its own, apart from the flag's.
const RAW_PROGRESS: usize = 64;

/// Two shared pages, one per direction: a (flag, payload) half each for
/// messages up to [`RAW_PAGE_MAX`]; for larger ones a progress word in each
/// page and, after the two pages, a buffer per direction of `cap` bytes.
struct RawPage {
    map: memmap2::MmapRaw,
    name: String,
    owner: bool,
    /// Bytes of each direction's buffer (0: messages fit the pages).
    cap: usize,
}

impl RawPage {
    fn create(name: &str) -> Result<RawPage> {
        Self::create_for(name, 0)
    }

    /// Each direction's buffer for messages of `size` bytes: none up to a
    /// page, else `size` rounded up to whole pages.
    fn cap_for(size: usize) -> usize {
        if size > RAW_PAGE_MAX {
            size.next_multiple_of(4096)
        } else {
            0
        }
    }

    fn create_for(name: &str, size: usize) -> Result<RawPage> {
        let cap = Self::cap_for(size);
        let fd = rustix::shm::open(
            name,
            rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::from_raw_mode(0o600),
        )?;
        // Unlinked on drop from here on, whatever fails next.
        let f = std::fs::File::from(fd);
        let unlink = || {
            let _ = rustix::shm::unlink(name);
        };
        let len = 8192 + 2 * cap;
        if let Err(e) = f.set_len(len as u64) {
            unlink();
            return Err(e.into());
        }
        match memmap2::MmapOptions::new().len(len).map_raw(&f) {
            Ok(map) => Ok(RawPage { map, name: name.to_string(), owner: true, cap }),
            Err(e) => {
                unlink();
                Err(e.into())
            }
        }
    }

    fn open_for(name: &str, size: usize) -> Result<RawPage> {
        let cap = Self::cap_for(size);
        let fd = rustix::shm::open(name, rustix::shm::OFlags::RDWR, rustix::fs::Mode::empty())?;
        let f = std::fs::File::from(fd);
        let len = 8192 + 2 * cap;
        if (f.metadata()?.len() as usize) < len {
            return Err(Error::with(ErrorKind::Inval, "the raw floor's mapping is smaller than its messages"));
        }
        let map = memmap2::MmapOptions::new().len(len).map_raw(&f)?;
        Ok(RawPage { map, name: name.to_string(), owner: false, cap })
    }

    /// A direction's progress word (messages above a page): the round's
    /// number in the high 32 bits, the bytes in place in the low 32.
    fn progress(&self, dir: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: offset dir * 4096 + 64 is inside the first 8 KiB of the
        // mapping and 8-aligned; no payload of a page message is used with it.
        unsafe { &*(self.map.as_mut_ptr().add(dir * 4096 + RAW_PROGRESS) as *const std::sync::atomic::AtomicU64) }
    }

    /// A direction's buffer (messages above a page).
    fn buffer(&self, dir: usize) -> *mut u8 {
        // SAFETY: the mapping holds the two pages and then two buffers of
        // `cap` bytes: dir < 2 stays inside it.
        unsafe { self.map.as_mut_ptr().add(8192 + dir * self.cap) }
    }

    /// The futex word (the futex mode moves no payload one way: the first
    /// page's payload area is free).
    fn word(&self) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: offset 32 is inside the mapping and 4-aligned; the futex
        // mode sends payloads only in direction 1 (the second page).
        unsafe { &*(self.map.as_mut_ptr().add(32) as *const std::sync::atomic::AtomicU32) }
    }

    /// The fetch-add mode's words, each on a line of its own: the word
    /// both sides add to, the ready count and the done count.
    fn fadd_words(
        &self,
    ) -> (&std::sync::atomic::AtomicU64, &std::sync::atomic::AtomicU64, &std::sync::atomic::AtomicU64) {
        // SAFETY: offsets 128, 192 and 256 are inside the mapping and
        // 8-aligned; the fetch-add mode uses no flag or payload.
        unsafe {
            let at = |o: usize| &*(self.map.as_mut_ptr().add(o) as *const std::sync::atomic::AtomicU64);
            (at(128), at(192), at(256))
        }
    }

    fn flag(&self, dir: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: offset dir * 4096 is inside the 8 KiB mapping and 8-aligned.
        unsafe { &*(self.map.as_mut_ptr().add(dir * 4096) as *const std::sync::atomic::AtomicU64) }
    }

    fn put(&self, dir: usize, seq: u64, data: &[u8]) {
        if self.cap > 0 {
            return self.put_pieces(dir, seq, data);
        }
        // SAFETY: the payload area starts RAW_PAYLOAD bytes into the
        // direction's page and data is at most 4096 - 128 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.as_mut_ptr().add(dir * 4096 + RAW_PAYLOAD),
                data.len(),
            )
        };
        // SYNC: publishes the payload to the acquire spin in take().
        self.flag(dir).store(seq, std::sync::atomic::Ordering::Release);
    }

    fn take(&self, dir: usize, seq: u64, out: &mut [u8]) -> bool {
        if self.cap > 0 {
            return self.take_pieces(dir, seq, out);
        }
        let t0 = Instant::now();
        let mut n = 0u32;
        while self.flag(dir).load(std::sync::atomic::Ordering::Acquire) != seq {
            n = n.wrapping_add(1);
            if n.is_multiple_of(65536) && t0.elapsed() > Duration::from_secs(10) {
                return false;
            }
            std::hint::spin_loop();
        }
        // SAFETY: as in put().
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(dir * 4096 + RAW_PAYLOAD), out.as_mut_ptr(), out.len())
        };
        true
    }

    /// A message above a page: [`RAW_PIECE`] bytes at a time into the
    /// direction's buffer, each followed by the count in place (round `seq`).
    fn put_pieces(&self, dir: usize, seq: u64, data: &[u8]) {
        debug_assert!(data.len() <= self.cap);
        let round = (seq & 0xffff_ffff) << 32;
        let buf = self.buffer(dir);
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(RAW_PIECE);
            // SAFETY: off + n <= data.len() <= cap: inside the direction's
            // buffer; the receiver reads these bytes only after the store
            // below (its acquire load), and the next message's only after
            // it answered this one.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(off), buf.add(off), n) };
            off += n;
            // SYNC: publishes the bytes up to `off` to the acquire load in
            // take_pieces.
            self.progress(dir).store(round | off as u64, std::sync::atomic::Ordering::Release);
        }
    }

    /// Takes a message above a page of round `seq`, copying each piece out
    /// as its count says it is in place; false after 10 s without it.
    fn take_pieces(&self, dir: usize, seq: u64, out: &mut [u8]) -> bool {
        let round = seq & 0xffff_ffff;
        let buf = self.buffer(dir);
        let t0 = Instant::now();
        let mut spins = 0u32;
        let mut got = 0usize;
        while got < out.len() {
            // SYNC: pairs with the release store in put_pieces.
            let w = self.progress(dir).load(std::sync::atomic::Ordering::Acquire);
            let upto = ((w & 0xffff_ffff) as usize).min(out.len());
            if w >> 32 != round || upto <= got {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(65536) && t0.elapsed() > Duration::from_secs(10) {
                    return false;
                }
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: got < upto <= out.len() <= cap: inside both the
            // buffer and `out`; the sender wrote these bytes before the
            // count that says so (acquired above).
            unsafe { std::ptr::copy_nonoverlapping(buf.add(got), out.as_mut_ptr().add(got), upto - got) };
            got = upto;
        }
        true
    }
}

impl Drop for RawPage {
    fn drop(&mut self) {
        if self.owner {
            let _ = rustix::shm::unlink(self.name.as_str());
        }
    }
}

/// Bytes one RMA run moves, about: its operations are this over the size.
const RMA_BYTES: usize = 128 << 20;

/// Operations of one RMA run of `size` bytes (the latency run, and the
/// streamed run after it); `rma_iters` in mpi_tests/osu_rma.c is the same.
pub fn rma_iters(size: usize) -> usize {
    (RMA_BYTES / size.max(1)).clamp(20, 100_000)
}

/// Operations of one streamed window, whose completions are then waited
/// for together (as one MPI_Win_flush after a window of MPI_Put).
pub const RMA_WINDOW: usize = 64;

/// Fetch-adds of each rank in the two-rank rate run (the one-rank latency
/// run does half as many); FADD_OPS in mpi_tests/osu_rma.c.
pub const FADD_OPS: usize = 200_000;

/// The data of the RMA checks: byte i is `i * 7 + 3 + seed` (`pattern` in
/// mpi_tests/osu_rma.c).
pub fn rma_pattern(size: usize, seed: u64) -> Vec<u8> {
    (0..size).map(|i| (i as u64).wrapping_mul(7).wrapping_add(3 + seed) as u8).collect()
}

/// One one-sided measurement: latency is the mean time of one operation
/// until it is complete (a put's data in the target's memory, a get's in
/// ours, a fetch-add's old value in ours), operations one after another;
/// bandwidth and rate come from a streamed run (windows of
/// [`RMA_WINDOW`] operations, then their completions).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RmaFigure {
    /// Bytes per operation.
    pub size: usize,
    /// Microseconds per operation, one at a time.
    pub latency_us: Option<f64>,
    /// Streaming bandwidth, GB/s (10^9 bytes per second).
    pub bw_gbs: Option<f64>,
    /// Millions of operations per second.
    pub mops: Option<f64>,
}

/// Which registration of the target an RMA run reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaMem {
    /// Memory from `Domain::alloc_shared`: a copy into the mapped heap.
    Heap,
    /// An ordinary buffer registered with `mr_reg`: single copy
    /// (process_vm_writev/readv), or the target's progress engine where
    /// single copy is off or refused.
    User,
}

/// The path that operations took, from the initiator's
/// [`shmfab::RmaStats`] before and after them: `heap`, `cma`, `mailbox`,
/// or `mixed`.
pub fn rma_path(before: shmfab::RmaStats, after: shmfab::RmaStats) -> &'static str {
    let d = (after.heap - before.heap, after.cma - before.cma, after.mailbox - before.mailbox);
    match d {
        (_, 0, 0) => "heap",
        (0, _, 0) => "cma",
        (0, 0, _) => "mailbox",
        _ => "mixed",
    }
}

/// Offset of the fetch-add word in the heap registration of a target set
/// up for `len` bytes: a line of its own after the data.
fn fadd_word(len: usize) -> u64 {
    (len.div_ceil(64) * 64) as u64
}

/// An endpoint and CQ of their own for the one-sided operations (the
/// tagged commands keep theirs), bound to the link's AV.
struct RmaEp {
    ep: Endpoint,
    cq: CompletionQueue,
    /// Where [`RmaEp::wait`] reads entries to, made once: an array of them
    /// zeroed on each wait was half the instructions of a measured 8 B put.
    entries: std::cell::RefCell<Vec<CqTaggedEntry>>,
}

impl RmaEp {
    fn open(ends: &Ends) -> Result<RmaEp> {
        let cq = ends.dom.cq_open(&CqAttr { size: 4 * RMA_WINDOW, ..Default::default() })?;
        let ep = ends.dom.endpoint()?;
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV)?;
        ep.bind_av(&ends.av)?;
        ep.enable()?;
        Ok(RmaEp { ep, cq, entries: std::cell::RefCell::new(vec![CqTaggedEntry::default(); RMA_WINDOW]) })
    }

    /// Waits for `n` completions (one-sided operations only come here);
    /// an error entry is the error. Errors out after 30 s, timed from the
    /// first 4096 empty reads: the clock is read only then, never on a
    /// wait whose completions are there (an RMA into the heap completes
    /// in its call). A clock read on every wait was about 37 ns of each
    /// measured 8 B put and fetch-add (Instant::now() here: 37 ns), which
    /// Open MPI's loop (MPI_Put, MPI_Win_flush) does not pay.
    fn wait(&self, n: usize) -> Result<()> {
        let mut got = 0;
        let mut e = self.entries.borrow_mut();
        let mut t0: Option<Instant> = None;
        let mut spins = 0u32;
        while got < n {
            match self.cq.read(&mut e[..(n - got).min(RMA_WINDOW)]) {
                Ok(k) => got += k,
                Err(x) if x.kind() == ErrorKind::Again => {
                    spins += 1;
                    if spins.is_multiple_of(4096)
                        && t0.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(30)
                    {
                        return Err(Error::with(ErrorKind::TimedOut, "RMA completions did not come"));
                    }
                }
                Err(x) if x.kind() == ErrorKind::Avail => {
                    let err = self.cq.readerr()?;
                    return Err(Error::with(ErrorKind::from_errno(err.err), format!("RMA error entry: {err:?}")));
                }
                Err(x) => return Err(x),
            }
        }
        Ok(())
    }

    /// `n` fetch-adds of 1 (u64, SUM) on the word at `off` of registration
    /// `key` of `dest`, each waited for. Ok(false) when the old values
    /// fetched do not rise strictly one after another (each must see the
    /// ones before it); `first` is what the first must be, when known.
    /// `handle`: through a [`shmfab::HeapTarget`] of the registration
    /// (resolved once, done when the call returns: no CQ read).
    fn fetch_adds(&self, dest: FiAddr, key: u64, off: u64, n: usize, first: Option<u64>, handle: bool) -> Result<bool> {
        let one = 1u64.to_ne_bytes();
        let mut old = [0u8; 8];
        let mut prev: Option<u64> = None;
        let mut ok = true;
        let h = if handle { Some(self.ep.heap_target(dest, key)?) } else { None };
        for i in 0..n {
            if let Some(h) = &h {
                h.fetch_atomic(shmfab::AtomicType::Uint64, shmfab::AtomicOp::Sum, &one, &mut old, off)?;
            } else {
                self.ep.fetch_atomic(
                    shmfab::AtomicType::Uint64,
                    shmfab::AtomicOp::Sum,
                    &one,
                    &mut old,
                    dest,
                    off,
                    key,
                    0,
                )?;
                self.wait(1)?;
            }
            let v = u64::from_ne_bytes(old);
            let exact = match (first, prev) {
                (Some(f), _) => v == f + i as u64,
                (None, Some(p)) => v > p,
                (None, None) => true,
            };
            ok &= exact;
            prev = Some(v);
        }
        Ok(ok)
    }
}

/// The target's side of the RMA runs: a heap registration (the data, then
/// the fetch-add word) and an ordinary registered buffer of the same
/// length.
struct PeerRma {
    heap: shmfab::MemoryRegion,
    /// Closed (on drop) before `user`, its memory, goes.
    user_mr: shmfab::MemoryRegion,
    user: Vec<u64>,
    len: usize,
    /// Our own endpoint for the fetch-adds of the two-rank run, and our
    /// own address in the AV.
    ep: Option<(RmaEp, FiAddr)>,
}

impl PeerRma {
    fn new(ends: &Ends, len: usize) -> Result<PeerRma> {
        let rw = shmfab::FI_REMOTE_READ | shmfab::FI_REMOTE_WRITE | shmfab::FI_READ | shmfab::FI_WRITE;
        let heap = ends.dom.alloc_shared(fadd_word(len) as usize + 64, rw)?;
        let mut user = vec![0u64; len.div_ceil(8).max(1)];
        // SAFETY: `user` outlives the registration: user_mr is dropped
        // (closed) first, by field order, and the Vec is never resized.
        let user_mr = unsafe { ends.dom.mr_reg(user.as_mut_ptr().cast(), len.max(1), rw)? };
        Ok(PeerRma { heap, user_mr, user, len, ep: None })
    }

    /// The start of the heap data (`user`: of the ordinary buffer).
    fn mem(&mut self, user: bool) -> *mut u8 {
        if user {
            self.user.as_mut_ptr().cast()
        } else {
            self.heap.as_ptr()
        }
    }

    /// Our half of a two-rank fetch-add run: `n` on our own word, through
    /// the same calls as the initiator's.
    fn fetch_adds(&mut self, ends: &Ends, n: usize, handle: bool) -> Result<bool> {
        if self.ep.is_none() {
            let me = ends.av.insert_bytes(&ends.ep.getname().to_bytes())?;
            self.ep = Some((RmaEp::open(ends)?, me));
        }
        let (ep, me) = self.ep.as_ref().expect("set above");
        ep.fetch_adds(*me, self.heap.key(), fadd_word(self.len), n, None, handle)
    }
}

/// The initiator's state of the RMA runs.
struct RmaSide {
    ep: RmaEp,
    /// The peer's heap and ordinary registrations.
    heap_key: u64,
    user_key: u64,
    len: usize,
    /// Fetch-adds done on the word so far (its value).
    fadds: u64,
}

impl Link {
    /// Has the peer register `len` bytes of shared heap and `len` bytes of
    /// ordinary memory for [`Link::rma_op`] and [`Link::fetch_add`] (sizes
    /// up to `len`; [`MAX_SIZE`] at most).
    pub fn rma_setup(&mut self, len: usize) -> Result<()> {
        let mut keys = [0u8; 16];
        // SAFETY: keys lives until the completion read just below.
        unsafe { self.ends.ep.trecv(&mut keys, self.peer, T_RMA, 0, 4)? };
        self.command(CMD_RMA_SETUP, len, 0, 0)?;
        self.ends.wait_recvs(1)?;
        let k = |i: usize| u64::from_le_bytes(keys[i..i + 8].try_into().expect("8 bytes"));
        let ep = RmaEp::open(&self.ends)?;
        self.rma = Some(RmaSide { ep, heap_key: k(0), user_key: k(8), len, fadds: 0 });
        Ok(())
    }

    /// Whether the first `size` bytes of the peer's `mem` hold
    /// [`rma_pattern`]`(size, seed)` (what [`Link::rma_op`] checks after
    /// its puts).
    pub fn rma_check(&mut self, mem: RmaMem, size: usize, seed: u64) -> Result<bool> {
        self.rma_ask(CMD_RMA_CHECK, mem, size, seed)
    }

    /// A command to the peer about its RMA memory, and its yes/no answer.
    fn rma_ask(&mut self, kind: u32, mem: RmaMem, size: usize, seed: u64) -> Result<bool> {
        let mut ans = [0u8; 4];
        // SAFETY: ans lives until the completion read just below.
        unsafe { self.ends.ep.trecv(&mut ans, self.peer, T_RMA, 0, 4)? };
        self.command(kind, size, usize::from(mem == RmaMem::User), seed as usize)?;
        self.ends.wait_recvs(1)?;
        Ok(ans[0] == 1)
    }

    /// Puts (`put`) or gets of `size` bytes at offset 0 of the peer's
    /// `mem`: `n` ([`rma_iters`] in the comparison) one at a time (the latency: each call, then its
    /// completion read from the CQ; the data is where it goes when the
    /// completion is there), then as many streamed. Checks the data: the
    /// peer compares its memory with the puts' pattern (`seed`), and the
    /// gets' data with the pattern the peer wrote first; a mismatch is an
    /// error. Returns the figure and the path the operations took
    /// ([`rma_path`]).
    pub fn rma_op(
        &mut self,
        put: bool,
        mem: RmaMem,
        size: usize,
        seed: u64,
        n: usize,
    ) -> Result<(RmaFigure, &'static str)> {
        let len = self.rma.as_ref().map_or(0, |r| r.len);
        if size == 0 || size > len {
            return Err(Error::with(ErrorKind::Inval, format!("RMA of {size} bytes: set up for 1 to {len}")));
        }
        let want = rma_pattern(size, seed);
        if !put && !self.rma_ask(CMD_RMA_FILL, mem, size, seed)? {
            return Err(Error::with(ErrorKind::Io, "the peer did not fill its memory"));
        }
        let r = self.rma.as_ref().expect("checked above");
        let key = if mem == RmaMem::Heap { r.heap_key } else { r.user_key };
        let mut got = vec![0u8; size];
        let n = n.max(1);
        let one = |i: usize, got: &mut [u8]| {
            if put {
                r.ep.ep.write(&want, self.peer, 0, key, i)
            } else {
                r.ep.ep.read(got, self.peer, 0, key, i)
            }
        };
        let s0 = self.ends.dom.rma_stats();
        let warm = n / 10 + 1;
        let mut t0 = Instant::now();
        for i in 0..warm + n {
            if i == warm {
                t0 = Instant::now();
            }
            one(i, &mut got)?;
            r.ep.wait(1)?;
        }
        let lat = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        if !put && got != want {
            return Err(Error::with(ErrorKind::Io, format!("get of {size} bytes brought other data")));
        }
        got.fill(0);
        let mut el = Duration::ZERO;
        for (todo, timed) in [(warm, false), (n, true)] {
            let t0 = Instant::now();
            let mut left = todo;
            while left > 0 {
                let k = left.min(RMA_WINDOW);
                for i in 0..k {
                    one(i, &mut got)?;
                }
                r.ep.wait(k)?;
                left -= k;
            }
            if timed {
                el = t0.elapsed();
            }
        }
        let path = rma_path(s0, self.ends.dom.rma_stats());
        if !put && got != want {
            return Err(Error::with(ErrorKind::Io, format!("streamed get of {size} bytes brought other data")));
        }
        if put && !self.rma_ask(CMD_RMA_CHECK, mem, size, seed)? {
            return Err(Error::with(ErrorKind::Io, format!("put of {size} bytes: the data did not arrive")));
        }
        let s = el.as_secs_f64();
        let fig = RmaFigure {
            size,
            latency_us: Some(lat),
            bw_gbs: Some(n as f64 * size as f64 / s / 1e9),
            mops: Some(n as f64 / s / 1e6),
        };
        Ok((fig, path))
    }

    /// Fetch-adds (8 bytes, u64 SUM) on the word in the peer's shared
    /// heap: the latency of ours alone (`n / 2`, one at a time, the peer
    /// idle), then the rate of both processes at once (`n` each, the peer
    /// on its own word through the same calls), in millions per second for
    /// the two together; `n` is [`FADD_OPS`] in the comparison. Checks
    /// that each fetched value follows the one before and the word's final
    /// value (read with an atomic read) counts every fetch-add.
    ///
    /// `handle`: both ranks through a [`shmfab::HeapTarget`] (the
    /// registration resolved once; each fetch-add done when its call
    /// returns, no CQ read), else through `fetch_atomic` and a CQ read.
    pub fn fetch_add(&mut self, n: usize, handle: bool) -> Result<(RmaFigure, &'static str)> {
        let Some(r) = self.rma.as_ref() else {
            return Err(Error::with(ErrorKind::Inval, "fetch-add before rma_setup"));
        };
        let (key, off) = (r.heap_key, fadd_word(r.len));
        let each = n.max(2);
        let n = each / 2;
        let warm = n / 10 + 1;
        let s0 = self.ends.dom.rma_stats();
        let first = r.fadds;
        if !r.ep.fetch_adds(self.peer, key, off, warm, Some(first), handle)? {
            return Err(Error::with(ErrorKind::Io, "fetch-add: values out of sequence"));
        }
        let t0 = Instant::now();
        let ok = r.ep.fetch_adds(self.peer, key, off, n, Some(first + warm as u64), handle)?;
        let lat = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        if !ok {
            return Err(Error::with(ErrorKind::Io, "fetch-add: values out of sequence"));
        }
        let mut total = first + (warm + n) as u64;
        let mut el = Duration::ZERO;
        for (k, timed) in [(each / 10 + 1, false), (each, true)] {
            let mut ans = [0u8; 4];
            // SAFETY: ans lives until the completion read below.
            unsafe { self.ends.ep.trecv(&mut ans, self.peer, T_RMA, 0, 4)? };
            let t0 = Instant::now();
            self.command(CMD_FADD, 0, usize::from(handle), k)?;
            let r = self.rma.as_ref().expect("checked above");
            let ours = r.ep.fetch_adds(self.peer, key, off, k, None, handle)?;
            self.ends.wait_recvs(1)?;
            if timed {
                el = t0.elapsed();
            }
            if !ours || ans[0] != 1 {
                return Err(Error::with(ErrorKind::Io, "fetch-add of two ranks: values out of sequence"));
            }
            total += 2 * k as u64;
        }
        let r = self.rma.as_mut().expect("checked above");
        let mut v = [0u8; 8];
        r.ep.ep.fetch_atomic(
            shmfab::AtomicType::Uint64,
            shmfab::AtomicOp::Read,
            &[],
            &mut v,
            self.peer,
            off,
            key,
            0,
        )?;
        r.ep.wait(1)?;
        if u64::from_ne_bytes(v) != total {
            return Err(Error::with(
                ErrorKind::Io,
                format!("fetch-add: the word holds {}, {total} were done", u64::from_ne_bytes(v)),
            ));
        }
        r.fadds = total;
        let path = rma_path(s0, self.ends.dom.rma_stats());
        let fig = RmaFigure {
            size: 8,
            latency_us: Some(lat),
            bw_gbs: None,
            mops: Some(2.0 * each as f64 / el.as_secs_f64() / 1e6),
        };
        Ok((fig, path))
    }
}

/// 8-byte operations on the peer's shared heap in the forms a one-sided
/// MPI layer over libfabric uses to complete them (`MPI_Put` then
/// `MPI_Win_flush`: the data is in the target's memory when the flush
/// returns), one at a time, microseconds each. Every shmfab RMA call is
/// done when it returns (its data is where it goes), so `fi_inject_write`'s
/// return already means delivered; the others count their completions on
/// a transmit counter (no CQ), waited for by reading it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlushForms {
    /// `inject_write` (no completion to wait for).
    pub put_inject_us: f64,
    /// `write`, then the counter read until it counts it.
    pub put_cntr_us: f64,
    /// `read`, then the counter.
    pub get_cntr_us: f64,
    /// `fetch_atomic` (u64 SUM), then the counter.
    pub fadd_cntr_us: f64,
    /// [`shmfab::HeapTarget::write`] (the registration resolved once;
    /// done when the call returns).
    pub put_handle_us: f64,
    /// [`shmfab::HeapTarget::fetch_atomic`] (u64 SUM).
    pub fadd_handle_us: f64,
}

impl Link {
    /// Measures [`FlushForms`], `n` operations of each (after a tenth as
    /// many warm-up ones), with their data checked: the puts' pattern in
    /// the peer's heap, the gets' data, the fetched values rising one by
    /// one.
    pub fn rma_flush_forms(&mut self, n: usize, seed: u64) -> Result<FlushForms> {
        let Some(r) = self.rma.as_ref() else {
            return Err(Error::with(ErrorKind::Inval, "flush forms before rma_setup"));
        };
        let (key, off, peer) = (r.heap_key, fadd_word(r.len), self.peer);
        let n = n.max(1);
        let warm = n / 10 + 1;
        let mut out = FlushForms::default();
        let timed = |f: &mut dyn FnMut(usize) -> Result<()>| -> Result<f64> {
            for i in 0..warm {
                f(i)?;
            }
            let t0 = Instant::now();
            for i in 0..n {
                f(warm + i)?;
            }
            Ok(t0.elapsed().as_secs_f64() * 1e6 / n as f64)
        };
        let want = rma_pattern(8, seed);
        out.put_inject_us = timed(&mut |_| r.ep.ep.inject_write(&want, peer, 0, key))?;
        if !self.rma_ask(CMD_RMA_CHECK, RmaMem::Heap, 8, seed)? {
            return Err(Error::with(ErrorKind::Io, "inject puts: the data did not arrive"));
        }
        let r = self.rma.as_ref().expect("checked above");
        let want = rma_pattern(8, seed + 2);
        {
            let h = r.ep.ep.heap_target(peer, key)?;
            out.put_handle_us = timed(&mut |_| h.write(0, &want))?;
        }
        if !self.rma_ask(CMD_RMA_CHECK, RmaMem::Heap, 8, seed + 2)? {
            return Err(Error::with(ErrorKind::Io, "handle puts: the data did not arrive"));
        }
        let r = self.rma.as_ref().expect("checked above");
        let cntr = self.ends.dom.cntr_open()?;
        let ep = self.ends.dom.endpoint()?;
        ep.bind_cntr(&cntr, shmfab::FI_SEND | FI_RECV | shmfab::FI_WRITE | shmfab::FI_READ)?;
        ep.bind_av(&self.ends.av)?;
        ep.enable()?;
        let t0 = Instant::now();
        let wait = |k: usize| -> Result<()> {
            let mut spins = 0u32;
            while cntr.read()? < k as u64 {
                spins += 1;
                if spins.is_multiple_of(4096) {
                    if cntr.readerr()? != 0 {
                        return Err(Error::with(ErrorKind::Io, "an RMA failed (the counter's error count)"));
                    }
                    if t0.elapsed() > Duration::from_secs(60) {
                        return Err(Error::with(ErrorKind::TimedOut, "RMA completions did not come"));
                    }
                }
            }
            Ok(())
        };
        let want = rma_pattern(8, seed + 1);
        out.put_cntr_us = timed(&mut |i| {
            ep.write(&want, peer, 0, key, 0)?;
            wait(i + 1)
        })?;
        let mut got = [0u8; 8];
        out.get_cntr_us = timed(&mut |i| {
            ep.read(&mut got, peer, 0, key, 0)?;
            wait(warm + n + i + 1)
        })?;
        if got[..] != want[..] {
            return Err(Error::with(ErrorKind::Io, "counted gets brought other data"));
        }
        let first = r.fadds;
        let (one, mut old) = (1u64.to_ne_bytes(), [0u8; 8]);
        let mut in_order = true;
        out.fadd_cntr_us = timed(&mut |i| {
            ep.fetch_atomic(shmfab::AtomicType::Uint64, shmfab::AtomicOp::Sum, &one, &mut old, peer, off, key, 0)?;
            wait(2 * (warm + n) + i + 1)?;
            in_order &= u64::from_ne_bytes(old) == first + i as u64;
            Ok(())
        })?;
        if !in_order {
            return Err(Error::with(ErrorKind::Io, "counted fetch-adds: values out of sequence"));
        }
        let first = first + (warm + n) as u64;
        let h = r.ep.ep.heap_target(peer, key)?;
        let mut in_order = true;
        out.fadd_handle_us = timed(&mut |i| {
            h.fetch_atomic(shmfab::AtomicType::Uint64, shmfab::AtomicOp::Sum, &one, &mut old, off)?;
            in_order &= u64::from_ne_bytes(old) == first + i as u64;
            Ok(())
        })?;
        drop(h);
        if !in_order {
            return Err(Error::with(ErrorKind::Io, "handle fetch-adds: values out of sequence"));
        }
        self.rma.as_mut().expect("checked above").fadds = first + (warm + n) as u64;
        Ok(out)
    }
}

/// Open MPI's one-sided figures, from mpi_tests/osu_rma.c.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MpiRma {
    /// MPI_Put by size.
    pub put: Vec<RmaFigure>,
    /// MPI_Get by size.
    pub get: Vec<RmaFigure>,
    /// MPI_Fetch_and_op: latency of one rank, rate of two.
    pub fadd: RmaFigure,
    /// The osc component that ran (`rdma`, `sm`, ...).
    pub osc: String,
}

/// Runs the project's one-sided MPI program (`bin`, mpi_tests/osu_rma.c
/// built with mpicc) under `mpirun -np 2` over the vader BTL, with osc
/// component `osc` (None: the one Open MPI picks; which one that was is
/// read from its verbose output: osc rdma and pt2pt say "<name> component
/// destroying window", osc sm says nothing).
pub fn openmpi_rma(bin: &std::path::Path, sizes: &[usize], osc: Option<&str>) -> Result<MpiRma> {
    let list = sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "-np",
        "2",
        "--allow-run-as-root",
        "--bind-to",
        "core",
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "self,vader",
    ]);
    match osc {
        Some(o) => cmd.args(["--mca", "osc", o]),
        None => cmd.args(["--mca", "osc_base_verbose", "100"]),
    };
    cmd.arg(bin).arg(&list);
    let out = output_within(cmd, MPI_LIMIT)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(l) = stdout.lines().find(|l| l.starts_with("error ")) {
        return Err(Error::with(ErrorKind::Io, format!("osu_rma: {l}")));
    }
    if !out.status.success() {
        return Err(Error::with(ErrorKind::Io, mpirun_reason(&String::from_utf8_lossy(&out.stderr))));
    }
    let mut r = parse_rma(&stdout, sizes);
    if r.put.iter().all(|f| f.latency_us.is_none()) || r.fadd.mops.is_none() {
        return Err(Error::with(ErrorKind::Io, "osu_rma printed no figures"));
    }
    r.osc = match osc {
        Some(o) => o.to_string(),
        None => osc_named(&String::from_utf8_lossy(&out.stderr)),
    };
    Ok(r)
}

/// The osc component Open MPI's verbose output names (`rdma component
/// destroying window`), or `sm?` when none does (osc sm prints nothing).
fn osc_named(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| {
            let i = l.find(" component destroying window")?;
            l[..i].rsplit(' ').next().map(str::to_string)
        })
        .unwrap_or_else(|| "sm?".to_string())
}

/// The figures in osu_rma's output (`put_lat|put_bw|put_mops|get_...
/// SIZE VALUE`, `fadd_lat 8 US`, `fadd_rate 8 MOPS`), one per size asked
/// for.
fn parse_rma(stdout: &str, sizes: &[usize]) -> MpiRma {
    let none: Vec<RmaFigure> = sizes.iter().map(|&size| RmaFigure { size, ..Default::default() }).collect();
    let mut r = MpiRma {
        put: none.clone(),
        get: none,
        fadd: RmaFigure { size: 8, ..Default::default() },
        ..Default::default()
    };
    for line in stdout.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() != 3 {
            continue;
        }
        let (Ok(size), Ok(v)) = (w[1].parse::<usize>(), w[2].parse::<f64>()) else {
            continue;
        };
        let Some((op, what)) = w[0].split_once('_') else { continue };
        let f = match op {
            "put" => r.put.iter_mut().find(|f| f.size == size),
            "get" => r.get.iter_mut().find(|f| f.size == size),
            "fadd" => Some(&mut r.fadd),
            _ => None,
        };
        if let Some(f) = f {
            match what {
                "lat" => f.latency_us = Some(v),
                "bw" => f.bw_gbs = Some(v),
                "mops" | "rate" => f.mops = Some(v),
                _ => {}
            }
        }
    }
    r
}

/// Longest an osu-style MPI run may take before it is stopped (a whole
/// run of the default sizes takes a few seconds).
const MPI_LIMIT: Duration = Duration::from_secs(300);

/// Runs the project's osu-style MPI program (`bin`, built with mpicc) under
/// `mpirun -np 2` over Open MPI's shared-memory BTL (pml ob1, BTL vader)
/// and parses its output lines `kind size value`.
pub fn openmpi(bin: &std::path::Path, sizes: &[usize]) -> Result<Vec<Figure>> {
    let mca = ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"];
    run_osu(bin, sizes, &mca, &[])
}

/// Runs the osu-style program as [`openmpi`] does, but over UCX: Open MPI's
/// pml ucx with UCX's shared-memory transports only (`UCX_TLS=sm,self`).
/// Open MPI 4.1 lets pml ucx run only over the network transports it
/// lists in `pml_ucx_tls` and `pml_ucx_devices` (without a network it
/// says "PML ucx cannot be selected"), so both are set to `any`. Check
/// [`ucx_present`] first; a failure's error is one line, the reason.
pub fn ucx(bin: &std::path::Path, sizes: &[usize]) -> Result<Vec<Figure>> {
    let mca =
        ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any", "-x", "UCX_TLS"];
    run_osu(bin, sizes, &mca, &[("UCX_TLS", "sm,self"), ("UCX_WARN_UNUSED_ENV_VARS", "n")])
}

/// Whether Open MPI here has the pml ucx component (`ompi_info` lists
/// `MCA pml: ucx`). Err: why UCX cannot be measured, one line.
pub fn ucx_present() -> std::result::Result<(), String> {
    let out = Command::new("ompi_info")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ompi_info, is Open MPI installed? {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if lists_pml_ucx(&text) {
        Ok(())
    } else {
        Err("this Open MPI has no pml ucx component: ompi_info does not list it".into())
    }
}

/// Whether `ompi_info`'s output lists the pml ucx component.
fn lists_pml_ucx(ompi_info: &str) -> bool {
    ompi_info.lines().any(|l| {
        let l = l.trim();
        l.strip_prefix("MCA pml:").is_some_and(|rest| rest.trim_start().starts_with("ucx "))
    })
}

/// Why mpirun failed, in one line, from its stderr: Open MPI's own words
/// where it says which component could not be used, else its first line
/// that says something (not a rule of dashes).
fn mpirun_reason(stderr: &str) -> String {
    let lines = || stderr.lines().map(str::trim).filter(|l| !l.is_empty() && !l.chars().all(|c| c == '-'));
    if let Some(l) = lines().find(|l| l.contains("cannot be selected")) {
        // "[host:pid] PML ucx cannot be selected": drop the process tag.
        let l = l.find("] ").map_or(l, |i| &l[i + 2..]);
        return format!("mpirun: {l}");
    }
    let first = lines().next().unwrap_or("no message");
    let mut one: String = first.chars().take(200).collect();
    if one.len() < first.len() {
        one.push_str("...");
    }
    format!("mpirun: {one}")
}

/// Runs `mpirun -np 2 [mca...] bin SIZES` with `env` added, within
/// [`MPI_LIMIT`], and parses the figures it prints.
fn run_osu(bin: &std::path::Path, sizes: &[usize], mca: &[&str], env: &[(&str, &str)]) -> Result<Vec<Figure>> {
    let list = sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", "2", "--allow-run-as-root", "--bind-to", "core"]).args(mca).arg(bin).arg(&list);
    cmd.envs(env.iter().copied());
    let out = output_within(cmd, MPI_LIMIT)?;
    if !out.status.success() {
        return Err(Error::with(ErrorKind::Io, mpirun_reason(&String::from_utf8_lossy(&out.stderr))));
    }
    let figs = parse_osu(&String::from_utf8_lossy(&out.stdout), sizes);
    if figs.iter().all(|f| f.half_rtt_us.is_none()) {
        return Err(Error::with(ErrorKind::Io, "mpirun printed no figures"));
    }
    Ok(figs)
}

/// The figures in the osu-style program's output (`lat|bw|rate SIZE VALUE`
/// lines; others are ignored), one per size asked for.
fn parse_osu(stdout: &str, sizes: &[usize]) -> Vec<Figure> {
    let mut figs: Vec<Figure> = sizes.iter().map(|&size| Figure { size, ..Default::default() }).collect();
    for line in stdout.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() != 3 {
            continue;
        }
        let (Ok(size), Ok(v)) = (w[1].parse::<usize>(), w[2].parse::<f64>()) else {
            continue;
        };
        if let Some(f) = figs.iter_mut().find(|f| f.size == size) {
            match w[0] {
                "lat" => f.half_rtt_us = Some(v),
                "bw" => f.bw_gbs = Some(v),
                "rate" => f.mmsgs = Some(v),
                _ => {}
            }
        }
    }
    figs
}

/// Runs `cmd` with stdin closed and its output captured, in a process
/// group of its own; after `limit` the group is stopped (SIGTERM, so that
/// mpirun stops its ranks; SIGKILL to the whole group 5 s later, and once
/// more when the child is gone, for ranks that outlived mpirun) and the run
/// is an error.
fn output_within(mut cmd: Command, limit: Duration) -> Result<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let name = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Its own group, whose id is its pid: a stopped run's ranks are
    // signalled with it even when mpirun is gone first.
    cmd.process_group(0);
    let mut child = cmd.spawn().map_err(|e| Error::with(ErrorKind::NoEnt, format!("cannot run {name}: {e}")))?;
    // Readers of the pipes: a grandchild left behind can hold a pipe open
    // after the child is gone, so they are waited for only so long.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            let _ = tx.send(v);
        });
        rx
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let t0 = Instant::now();
    let mut stopped = None;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        match stopped {
            None if t0.elapsed() > limit => {
                // SAFETY: kill(2) on the process group our own child leads
                // (process_group(0) above); the child is not yet reaped, so
                // the group id cannot have been reused.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM) };
                stopped = Some(Instant::now());
            }
            Some(t) if t.elapsed() > Duration::from_secs(5) => {
                // SAFETY: as above, the group of our unreaped child.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if stopped.is_some() {
        // Ranks that outlived a stopped mpirun would spin on, measured
        // against by every later run. The child is reaped, so its pid
        // could in principle be reused, but not as a process group id
        // while members of the group live; with none left this finds
        // nothing (ESRCH).
        // SAFETY: kill(2) with a negative pid only sends a signal.
        unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    }
    let grace = Duration::from_secs(5);
    let (stdout, stderr) = (out.recv_timeout(grace).unwrap_or_default(), err.recv_timeout(grace).unwrap_or_default());
    if stopped.is_some() {
        return Err(Error::with(ErrorKind::TimedOut, format!("{name} took more than {} s: stopped", limit.as_secs())));
    }
    Ok(std::process::Output { status, stdout, stderr })
}

/// Runs fi_pingpong for one size over libfabric's shm provider, or over
/// shmfab's provider (`libshmfab-fi.so` in `shmfab_dir`, given to libfabric
/// as FI_PROVIDER_PATH); returns its usec/xfer (elapsed / iterations / 2,
/// a half round-trip).
pub fn fi_pingpong(size: usize, iters: usize, shmfab_dir: Option<&std::path::Path>) -> Result<f64> {
    let port = 20000 + (std::process::id() % 20000) as u16;
    let prov = if shmfab_dir.is_some() { "shmfab" } else { "shm" };
    let base = |cpu: &str, port_flag: &str| {
        let mut c = Command::new("taskset");
        c.args(["-c", cpu, "fi_pingpong", "-p", prov, "-e", "rdm", "-I", &iters.to_string(), "-S", &size.to_string()]);
        if let Some(d) = shmfab_dir {
            c.env("FI_PROVIDER_PATH", d);
        }
        c.args([port_flag, &port.to_string()]);
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let mut server =
        base("0", "-B").spawn().map_err(|e| Error::with(ErrorKind::NoEnt, format!("cannot run fi_pingpong: {e}")))?;
    std::thread::sleep(Duration::from_millis(300));
    // The server may not listen yet on a loaded machine: the client's
    // "Connection refused" is tried again while the server waits.
    let mut client = base("1", "-P").arg("127.0.0.1").output();
    for _ in 0..5 {
        let refused = client.as_ref().is_ok_and(|o| String::from_utf8_lossy(&o.stderr).contains("Connection refused"));
        if !refused || !matches!(server.try_wait(), Ok(None)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        client = base("1", "-P").arg("127.0.0.1").output();
    }
    stop_gently(&mut server);
    let out = client?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Header: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() >= 8 && parse_fi_size(w[0]) == Some(size) {
            if let Ok(v) = w[6].parse::<f64>() {
                return Ok(v);
            }
        }
    }
    Err(Error::with(
        ErrorKind::Io,
        format!("no result from fi_pingpong: {text} {}", String::from_utf8_lossy(&out.stderr)),
    ))
}

/// Lets a finished fi_pingpong server exit by itself (it removes its
/// shared-memory region, `/dev/shm/PID:0:0`, 16 MiB, on the way out; killed
/// at once, it left one behind in most runs), then SIGTERM, then SIGKILL.
fn stop_gently(child: &mut Child) {
    let t0 = Instant::now();
    let mut termed = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => {}
        }
        let waited = t0.elapsed();
        if !termed && waited > Duration::from_secs(2) {
            // SAFETY: kill(2) on the pid of our own child, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            termed = true;
        }
        if waited > Duration::from_secs(4) {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// fi_pingpong's size column: `8`, `1k`, `4m`.
fn parse_fi_size(s: &str) -> Option<usize> {
    let (n, m) = match s.as_bytes().last()? {
        b'k' => (&s[..s.len() - 1], 1 << 10),
        b'm' => (&s[..s.len() - 1], 1 << 20),
        b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<usize>().ok().map(|n| n * m)
}

/// One collective latency figure, as examples/coll_bench.rs and
/// mpi_tests/osu_coll.c print it (`barrier ranks=N latency_us=US ...`,
/// `allreduce ranks=N size=S latency_us=US ...`): the mean over ranks of
/// each rank's mean time of one call.
#[derive(Clone, Debug, PartialEq)]
pub struct CollFigure {
    /// `barrier` or `allreduce`.
    pub op: String,
    /// Ranks in the job.
    pub ranks: usize,
    /// Bytes reduced (0 for a barrier).
    pub size: usize,
    /// Microseconds a call.
    pub latency_us: f64,
}

/// The figures in a collective benchmark's output: lines starting with
/// `barrier ` or `allreduce ` that give `ranks=` and `latency_us=`
/// (other lines, and lines with a field that does not parse, are left out).
pub fn parse_coll(stdout: &str) -> Vec<CollFigure> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let op = words.next().filter(|w| *w == "barrier" || *w == "allreduce")?;
            let (mut ranks, mut size, mut lat) = (None, Some(0), None);
            for w in words {
                let (k, v) = w.split_once('=')?;
                match k {
                    "ranks" => ranks = Some(v.parse().ok()?),
                    "size" => size = Some(v.parse().ok()?),
                    "latency_us" => lat = Some(v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0)?),
                    _ => {}
                }
            }
            Some(CollFigure { op: op.to_string(), ranks: ranks?, size: size?, latency_us: lat? })
        })
        .collect()
}

/// Runs a collective benchmark (`cmd`: `shmfab run ... coll_bench` or
/// `mpirun ... osu_coll`) within the MPI time limit; its figures, or why
/// there are none.
pub fn run_coll(cmd: Command) -> Result<Vec<CollFigure>> {
    let out = output_within(cmd, MPI_LIMIT)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(l) = stdout.lines().chain(stderr.lines()).find(|l| l.starts_with("error ")) {
        return Err(Error::with(ErrorKind::Io, l.to_string()));
    }
    if !out.status.success() {
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
        return Err(Error::with(ErrorKind::Io, format!("{} ({})", out.status, last.trim())));
    }
    let figs = parse_coll(&stdout);
    if figs.is_empty() {
        return Err(Error::with(ErrorKind::Io, "no collective figures printed"));
    }
    Ok(figs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_floor_hands_messages_over_in_pieces() {
        // Two mappings of one region in one process, a thread each way:
        // every message of 60 rounds, at sizes of one piece and a bit,
        // several, and several and a bit, arrives whole and in order.
        for size in [RAW_PAGE_MAX + 1, RAW_PIECE * 3, RAW_PIECE * 5 + 17] {
            let name = format!(
                "{}{}.rawtest.{}.{size}",
                shmfab::internal::region::PREFIX,
                shmfab::internal::region::uid(),
                std::process::id()
            );
            let a = RawPage::create_for(&name, size).unwrap();
            let b = RawPage::open_for(&name, size).unwrap();
            assert!(RawPage::open_for(&name, size + 4096).is_err(), "a mapping smaller than the messages is refused");
            let echo = std::thread::spawn(move || {
                let mut m = vec![0u8; size];
                for i in 1..=60u64 {
                    assert!(b.take(0, i, &mut m), "round {i}");
                    assert!(stamped(&m, i), "round {i}");
                    assert_eq!(m[8..size - 8], payload(size)[8..size - 8], "round {i}");
                    b.put(1, i, &m);
                }
            });
            let mut src = payload(size);
            let mut back = vec![0u8; size];
            for i in 1..=60u64 {
                stamp(&mut src, i);
                a.put(0, i, &src);
                assert!(a.take(1, i, &mut back), "round {i}");
                assert_eq!(back, src, "round {i}");
            }
            echo.join().unwrap();
            drop(a);
            assert!(RawPage::open_for(&name, size).is_err(), "the owner unlinks it");
        }
    }

    #[test]
    fn fi_pingpong_sizes_parse() {
        assert_eq!(parse_fi_size("8"), Some(8));
        assert_eq!(parse_fi_size("1k"), Some(1024));
        assert_eq!(parse_fi_size("4m"), Some(4 << 20));
        assert_eq!(parse_fi_size("x"), None);
    }

    #[test]
    fn osu_output_parses_by_size_and_kind() {
        let out = "lat 8 0.15\nbw 8 0.02\nrate 8 9.5\nlat 16384 2.5\nnoise line\nlat 99 1.0\nbw 16384 x\n";
        let f = parse_osu(out, &[8, 16384, 65536]);
        assert_eq!(f[0], Figure { size: 8, half_rtt_us: Some(0.15), bw_gbs: Some(0.02), mmsgs: Some(9.5) });
        assert_eq!(f[1], Figure { size: 16384, half_rtt_us: Some(2.5), ..Default::default() });
        assert_eq!(f[2], Figure { size: 65536, ..Default::default() });
    }

    #[test]
    fn collective_figures_are_read_from_either_program() {
        let out = "barrier ranks=4 latency_us=6.814 median_us=6.490 post_median_us=1.2\n\
                   allreduce ranks=4 size=1048576 latency_us=814.550 median_us=795.343\n\
                   allreduce-overlap ranks=4 size=1048576 pure_us=1.0 total_us=2.0\n\
                   allreduce ranks=x size=8 latency_us=1.0\n\
                   allreduce ranks=2 size=8 latency_us=nan\n\
                   allreduce ranks=2 size=8\n";
        let f = parse_coll(out);
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0], CollFigure { op: "barrier".into(), ranks: 4, size: 0, latency_us: 6.814 });
        assert_eq!(f[1], CollFigure { op: "allreduce".into(), ranks: 4, size: 1 << 20, latency_us: 814.55 });
    }

    #[test]
    fn ucx_presence_and_failures_read_as_one_line() {
        let info = "                 MCA osc: ucx (MCA v2.1.0, API v3.0.0, Component v4.1.4)\n\
                    \x20                MCA pml: ucx (MCA v2.1.0, API v2.0.0, Component v4.1.4)\n";
        assert!(lists_pml_ucx(info));
        assert!(!lists_pml_ucx("                 MCA osc: ucx (MCA v2.1.0)\n   MCA pml: ob1 (MCA v2.1.0)\n"));
        assert!(!lists_pml_ucx("   MCA pml: ucxfoo (x)\n"));
        let err = "[vm:06994] common_ucx.c:337 support level is none\n\
                   --------------------------------------------------------------------------\n\
                   No components were able to be opened in the pml framework.\n\
                   [vm:06994] PML ucx cannot be selected\n";
        assert_eq!(mpirun_reason(err), "mpirun: PML ucx cannot be selected");
        let err = "------\n\nmpirun was unable to launch the specified application\n";
        assert_eq!(mpirun_reason(err), "mpirun: mpirun was unable to launch the specified application");
        assert_eq!(mpirun_reason(""), "mpirun: no message");
        assert!(mpirun_reason(&"x".repeat(500)).ends_with("..."));
    }

    #[test]
    fn a_run_past_its_limit_is_stopped() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo started; exec sleep 30"]);
        let t0 = Instant::now();
        let e = output_within(c, Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        // A grandchild that ignores SIGTERM and outlives its parent (as
        // ranks spinning under SCHED_FIFO outlived a stopped mpirun) is
        // stopped with the group.
        let pidfile = std::env::temp_dir().join(format!("shmfab-within-{}", std::process::id()));
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!("sh -c 'trap \"\" TERM; echo $$ > {}; exec sleep 60' & sleep 60", pidfile.display()));
        let e = output_within(c, Duration::from_millis(500)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        let pid: libc::pid_t = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        let _ = std::fs::remove_file(&pidfile);
        let gone = (0..100).any(|_| {
            // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
            let alive = unsafe { libc::kill(pid, 0) } == 0
                && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
            if alive {
                std::thread::sleep(Duration::from_millis(50));
            }
            !alive
        });
        assert!(gone, "the grandchild {pid} outlived the stopped run");
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = output_within(c, Duration::from_secs(30)).unwrap();
        assert_eq!((o.status.code(), &o.stdout[..], &o.stderr[..]), (Some(3), &b"out\n"[..], &b"err\n"[..]));
        let e = output_within(Command::new("/nonexistent/mpirun"), Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("cannot run /nonexistent/mpirun"), "{e}");
    }

    #[test]
    fn a_finished_server_is_let_exit_before_it_is_signalled() {
        use std::io::Read;
        // Exits by itself after 300 ms (as fi_pingpong's server after the
        // last pong): it is not killed first, so it gets to say so.
        let mut c = Command::new("sh");
        let mut child = c.args(["-c", "sleep 0.3; echo clean"]).stdout(Stdio::piped()).spawn().unwrap();
        stop_gently(&mut child);
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert_eq!(out, "clean\n");
        // One that would run on is stopped, within seconds.
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let t0 = Instant::now();
        stop_gently(&mut child);
        assert!(child.try_wait().unwrap().is_some() && t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn osu_rma_output_parses_and_names_its_osc_component() {
        let out = "put_lat 8 0.1\nput_bw 8 0.3\nput_mops 8 40\nget_lat 8 0.2\nget_lat 64 0.25\n\
                   put_lat 99 1\nfadd_lat 8 0.19\nfadd_rate 8 5.5\nnoise\nfoo_lat 8 1\n";
        let r = parse_rma(out, &[8, 64]);
        assert_eq!(r.put[0], RmaFigure { size: 8, latency_us: Some(0.1), bw_gbs: Some(0.3), mops: Some(40.0) });
        assert_eq!(r.put[1], RmaFigure { size: 64, ..Default::default() });
        assert_eq!((r.get[0].latency_us, r.get[1].latency_us), (Some(0.2), Some(0.25)));
        assert_eq!(r.fadd, RmaFigure { size: 8, latency_us: Some(0.19), bw_gbs: None, mops: Some(5.5) });
        assert_eq!(osc_named("[vm:11402] rdma component destroying window with id 3\n"), "rdma");
        assert_eq!(osc_named("[vm:1] mca: base: close: unloading component monitoring\n"), "sm?");
    }

    #[test]
    fn rma_iterations_and_patterns() {
        assert_eq!((rma_iters(8), rma_iters(4 << 20), rma_iters(64 << 10)), (100_000, 32, 2048));
        assert_eq!(rma_pattern(3, 0), [3, 10, 17]);
        assert_ne!(rma_pattern(64, 1), rma_pattern(64, 2));
        let s = |heap, cma, mailbox| shmfab::RmaStats { heap, cma, mailbox };
        assert_eq!(rma_path(s(1, 2, 3), s(5, 2, 3)), "heap");
        assert_eq!(rma_path(s(1, 2, 3), s(1, 4, 3)), "cma");
        assert_eq!(rma_path(s(1, 2, 3), s(1, 2, 4)), "mailbox");
        assert_eq!(rma_path(s(1, 2, 3), s(2, 3, 3)), "mixed");
    }

    #[test]
    fn hex_round_trips() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert!(unhex("zz").is_none());
    }

    #[test]
    fn iterations_shrink_with_size() {
        assert!(iters_for(8) > iters_for(1 << 20));
        assert!(iters_for(8 << 20) >= 20);
    }
}
