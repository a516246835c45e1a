//! Collectives (after fi_collective(3)) built as schedules of deferred work:
//! once posted, a collective completes without the application's help
//! (with auto progress; with manual progress, in its progress calls).
//!
//! **Group.** [`CollGroup::join`] takes the members as fi_addrs of an
//! endpoint's AV (libfabric's AV set) and is collective over them: each
//! member allocates, per peer and per parity (two instances alternate), a
//! *slot region* in its shared heap ([`Domain::alloc_shared`]) with its own
//! remote-write counter, and sends the keys to that peer (tagged
//! messages on the endpoint, tag space `JOIN_TAG`). Then every
//! collective is non-blocking: [`CollGroup::allreduce`] and the others
//! queue the whole schedule as one chain of deferred work
//! ([`Domain::queue_chain`]) and return a [`CollOp`];
//! [`CollGroup::test`] / [`CollGroup::wait`] tell when it completed (a
//! counter bound at join counts each completion too).
//!
//! **Data movement.** A step is an RMA write from a local buffer into the
//! peer's slot region for us: on the shared heap it is one copy by the
//! writer, who then counts the region's remote-write counter at the target
//! and rings its doorbell; the target does no work for it. The target's
//! next step waits on that counter: work queued on counter `C[j]` (writes
//! from peer `j`) at the threshold "the m-th write from `j` arrived".
//! Local steps are [`DeferredOp::Reduce`] (a reduction or a copy between
//! two local buffers), queued behind the arrival they consume. Each
//! writer's writes to one target are issued in order and complete when
//! issued (heap path), so arrivals from one peer count in order.
//!
//! **Sequencing.** A rank's schedule is one chain: each step waits for
//! the one before it to have run and for its own trigger, the point the
//! schedule has reached (a counter and a threshold). The start is the
//! group's `done` counter at the instance number; waiting for peer `j`'s
//! next write moves the point to "`C[j]` counted every write from `j`
//! so far" (the group keeps the tally per counter: thresholds are
//! cumulative). The chain is one queue entry that moves from counter to
//! counter as it advances, so no token counts are needed to join the
//! local order and an arrival, and a schedule may wait on any peer in
//! any order. The plan runs once, under the domain lock, inside
//! `queue_chain`: a plan that fails (sizes over the slots) queues
//! nothing and leaves the group usable.
//!
//! **Kept schedules.** Barrier and allreduce up to 4 KiB
//! build their chain once per shape (operation, size, type, reduction)
//! and parity, as a [`crate::trigger::ChainTemplate`] with thresholds
//! relative to the instance (the start at 0, peer `j`'s counter at the
//! count of its writes within the instance) and their own buffer; each
//! instance copies the send data into that buffer and re-arms the chain
//! in place (it is the template's own, home in the domain's queue state
//! between instances: no copy, no counter binding) with the thresholds
//! moved by the instance number and the tally, and the final copy's
//! destination set to the caller's result ([`Domain::queue_template`]);
//! its first step, due at once, runs inside the post. No plan, check,
//! record or allocation per step. A group keeps at most 16 (the oldest
//! goes); they hold the group's counters, and the application's counter
//! given at join, bound until the group is dropped.
//!
//! **Direct path.** A barrier or allreduce up to 4 KiB on 2 members,
//! when no counter was given at join and no auto-progress thread runs,
//! is no deferred work at all: the post writes our contribution (a
//! barrier: 8 zero bytes) straight into the peer's slot region for us
//! ([`crate::rma::HeapDest`], resolved at the first such post: the heap
//! access, the copy and the peer's remote-write counter, no domain lock),
//! keeps it in the caller's result buffer, and the instance is complete
//! once our counter for the peer's writes reaches the tally: `test` and
//! `wait` look at that one word (no progress pass per poll) and then
//! reduce in the kept schedule's order (the lower member's value first),
//! so the two paths give the same bits and meet on the same slots,
//! counters and tally (a peer may take either). With 2 members our only
//! write goes at the post, so the peer never waits for our progress; what
//! is left is local and observable only through `test`/`wait` (no
//! counter to count), which complete it. With a counter, a progress
//! thread, or more members (whose later rounds need our progress in any
//! progress pass), the kept schedule is used. `done` counts direct
//! instances before the next deferred schedule is queued.
//!
//! **Reuse.** Instance `k` uses parity `k % 2` of every slot region and
//! counter; posting instance `k` first waits for instance `k - 1` (one
//! collective in flight per group). Every collective here has a result at
//! each member that depends on every member's contribution (broadcast and
//! reduce are built on allreduce for that reason), so a peer that writes
//! instance `k` data has seen our instance `k - 1` contribution, which we
//! sent after instance `k - 2` completed here: its slots are free.
//!
//! **Algorithms** (chosen by size and rank count in each call): barrier: dissemination
//! (⌈log2 P⌉ rounds). Allreduce up to [`RING_MIN`] bytes (or fewer
//! elements than ranks): recursive doubling, with the ranks above the
//! largest power of two folded in first and sent the result last; above
//! it: ring (reduce-scatter then allgather, 2(P-1) steps, each rank sending
//! 2(P-1)/P of the data). Allgather: Bruck-style dissemination (⌈log2 P⌉
//! rounds, blocks placed at their absolute position) up to [`RING_MIN`]
//! bytes of result, ring above. Reduce-scatter: recursive-doubling
//! allreduce then the own block up to [`RING_MIN`], the ring's
//! reduce-scatter half above. Alltoall: every pair directly (P-1 writes).
//! Broadcast: allreduce with FI_BOR on bytes where only the root
//! contributes; reduce: allreduce whose result only the root keeps (both
//! simple and correct, not bandwidth-optimal).
//!
//! **Failure.** A member that dies stops the others' schedules: `wait`
//! checks the members' processes every 20 ms and fails with `Io` (the
//! group's queued work is flushed; the group is then broken). A write that
//! fails (a peer's region closed) counts the group's error counter, and
//! `wait` fails with `Io` too.

pub mod reduce;

use crate::atomic::{AtomicOp, AtomicType};
use crate::av::AddressVector;
use crate::cntr::Counter;
use crate::cq::{CompletionQueue, CqDataEntry, CqEntry, CqFormat, CqMsgEntry, CqTaggedEntry};
use crate::domain::Domain;
use crate::ep::Endpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::flags::*;
use crate::mr::MemoryRegion;
use crate::rma::RmaIov;
use crate::trigger::{DeferredOp, DeferredWork, WorkChain};
use std::cell::{Cell, RefCell};
use std::io::IoSlice;
use std::time::{Duration, Instant};

/// Tags of the join's key exchange: this prefix, 28 bits naming the join
/// (a hash of the member list and how many joins of the same list came
/// before it, so groups of different members may be joined in any order
/// by the processes they share), the sender's index (16 bits).
pub const JOIN_TAG: u64 = 0x3C01 << 48;

/// Above this many bytes (of the vector reduced, or of the gathered
/// result), allreduce, reduce-scatter and allgather go round a ring; at or
/// below it, recursive doubling / dissemination (fewer steps, more bytes
/// per rank).
pub const RING_MIN: usize = 32 * 1024;

/// Allreduces of at most this many bytes keep their schedule built
/// (per group, shape and parity; a kept schedule holds its buffer).
const KEPT_MAX: usize = 4096;

/// Passes `wait` makes before it yields the CPU between passes (a
/// microsecond or two: a peer on another CPU answers a 2-rank barrier in
/// under half a microsecond; a yield with nothing else to run costs one
/// system call). When both ranks share one CPU, each wait costs about
/// this spin plus the switch: 64 passes gave 10-14 us medians there, 8
/// gave 5.6-7 us, with the same 0.37-0.48 us on two CPUs (paired 2-rank
/// runs on the loaded 2-vCPU VM, 2026-11-26).
const SPIN_PASSES: u32 = 8;

/// The most passes a wait for a direct-path instance ([`Direct`]) spins
/// before it yields: its pass is one load of a counter (a few ns, not a
/// progress pass). The spin adapts ([`CollGroup::spin`]) between
/// [`SPIN_PASSES`] and this: a peer on another CPU answers within it, and
/// a yield there only gives our CPU away (to another process of a loaded
/// machine, for a time slice); a peer that needs our CPU (both ranks on
/// one) is only let run by the yield, so waits that had to yield halve it.
const DIRECT_SPIN_MAX: u32 = 2048;

/// Options of [`CollGroup::join`].
#[derive(Clone, Copy, Debug)]
pub struct CollAttr {
    /// Bytes of each slot region: the most one peer writes to us in one
    /// collective (ring allreduce: about twice the vector; recursive
    /// doubling: the vector; allgather: half the result; alltoall: one
    /// block). Each member holds 2 (P-1) of them in its shared heap.
    pub slot_bytes: usize,
    /// How long `join` waits for the others.
    pub join_timeout: Duration,
}

impl Default for CollAttr {
    fn default() -> Self {
        CollAttr { slot_bytes: 256 * 1024, join_timeout: Duration::from_secs(60) }
    }
}

/// A posted collective, for [`CollGroup::test`] and [`CollGroup::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollOp {
    /// Instance number in the group (0, 1, ...).
    seq: u64,
}

/// The local state of an instance in flight: buffers its work reads and
/// writes (kept until it completed).
struct Inflight {
    seq: u64,
    _bufs: Vec<Vec<u8>>,
}

/// One peer's slot regions here (it writes into them) and its for us.
struct Peer {
    /// Our regions for this peer's writes, by parity; their counters.
    mine: [MemoryRegion; 2],
    /// Its regions for our writes, by parity (keys it sent at join).
    keys: [u64; 2],
}

/// A joined collective group (fi_join_collective's result): the members,
/// this rank's place, the slot regions and counters.
pub struct CollGroup<'a> {
    dom: &'a Domain,
    ep: &'a Endpoint,
    members: Vec<FiAddr>,
    pids: Vec<u32>,
    me: usize,
    attr: CollAttr,
    /// By member (None for us). Dropped before the counters below.
    peers: Vec<Option<Peer>>,
    /// Counters of the slot regions, by member and parity.
    arrivals: Vec<Option<[Counter; 2]>>,
    /// Writes expected so far from each peer, by member and parity:
    /// thresholds are cumulative.
    tally: RefCell<Vec<[u64; 2]>>,
    /// Counts completed instances (the start point of the next one).
    done: Counter,
    /// The value of `done` last read (instances known complete): a post
    /// whose previous instance is known complete waits for nothing.
    completed: Cell<u64>,
    /// Completion counter of every write: its error value says one failed.
    wr: Counter,
    user: Option<&'a Counter>,
    next: Cell<u64>,
    inflight: RefCell<Option<Inflight>>,
    broken: Cell<bool>,
    /// When `test` last checked the group's health.
    tested: Cell<Instant>,
    zero: Box<[u8; 8]>,
    other: RefCell<Vec<CqTaggedEntry>>,
    /// The vectors a [`Sched`] works in, kept between calls.
    scratch: RefCell<Scratch>,
    /// Schedules built once and re-armed (barrier, small allreduce), by
    /// shape and parity; the oldest goes past [`TEMPLATES`].
    templates: RefCell<Vec<(Shape, usize, Template)>>,
    /// The instance in flight on the direct path (see [`Direct`]).
    direct: Cell<Option<Direct>>,
    /// Passes a direct-path wait spins before it yields (adaptive: see
    /// [`DIRECT_SPIN_MAX`]).
    spin: Cell<u32>,
    /// Direct-path instances completed and not yet counted on `done`
    /// (counted before the next schedule of deferred work is queued,
    /// which starts from `done`; 0 while one is in flight).
    done_lag: Cell<u64>,
    /// What the direct path needs, made at its first post.
    plan: std::cell::OnceCell<DirectPlan>,
}

/// The direct path's fixed part ([`Direct`]), made at its first post.
struct DirectPlan {
    /// The peer's slot regions for us, by parity (None: not shared heap,
    /// the writes take the RMA calls' path).
    heap: Option<[crate::rma::HeapDest; 2]>,
    /// The index of `arrivals[peer][q]` in the domain's counter table, by
    /// parity `q`.
    cntr: [usize; 2],
}

/// An instance of a 2-member barrier or small allreduce on the direct
/// path: our one write went at the post; what is left (the peer's write
/// landed, then the local reduction) is done by the calls that look at
/// the instance ([`CollGroup::test`], [`CollGroup::wait`], the next post).
#[derive(Clone, Copy)]
struct Direct {
    seq: u64,
    /// The peer, and the parity of its slot region and counter.
    peer: usize,
    q: usize,
    /// The index of `arrivals[peer][q]` in the domain's counter table, and
    /// the value it reaches once the peer's write for this instance landed.
    cntr: usize,
    at: u64,
    /// An allreduce: its type, reduction, bytes and the caller's result
    /// buffer's address (holding our contribution since the post; an
    /// address, so the group stays `Send`). None: a barrier.
    red: Option<(AtomicType, AtomicOp, usize, usize)>,
}

/// Most schedules a group keeps built ([`CollGroup::templates`]).
const TEMPLATES: usize = 16;

/// What a kept schedule does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Barrier,
    Allreduce { len: usize, dt: AtomicType, op: AtomicOp },
}

/// A schedule built once ([`Domain::chain_template`]), thresholds
/// relative to the instance: steps waiting on `done` at 0, on a peer's
/// counter at the count of its writes within the instance.
struct Template {
    t: crate::trigger::ChainTemplate,
    /// Where each step waits (the start, or a peer's counter).
    at: Vec<At>,
    /// Writes from each member per instance (the tally's step).
    writes: Vec<u64>,
    /// The steps whose destination is the caller's result buffer.
    outs: Vec<usize>,
    /// The instance's buffers (the first one takes the send data).
    bufs: Vec<Vec<u8>>,
}

/// A schedule builder's per-member vectors (see [`Sched`]).
#[derive(Default)]
struct Scratch {
    out_off: Vec<usize>,
    in_off: Vec<usize>,
    tally: Vec<u64>,
}

/// Joins made in this process, by member list (its hash) and joining
/// member: the join's number among those of the same list by the same
/// endpoint, which every member counts alike (two members in one process
/// count theirs apart).
static JOINS: std::sync::Mutex<Vec<(u64, usize, u64)>> = std::sync::Mutex::new(Vec::new());

/// The join's identity in its tags (28 bits): the members' addresses in
/// order, and how many joins of that same list member `me` made before.
fn join_id(names: &[crate::Address], me: usize) -> u64 {
    // FNV-1a over the addresses' bytes: the same in every process.
    let mut key = 0xcbf2_9ce4_8422_2325u64;
    for b in names.iter().flat_map(|a| a.to_bytes()) {
        key = (key ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let mut j = JOINS.lock().unwrap_or_else(|p| p.into_inner());
    let n = match j.iter_mut().find(|e| e.0 == key && e.1 == me) {
        Some(e) => {
            e.2 += 1;
            e.2
        }
        None => {
            j.push((key, me, 0));
            0
        }
    };
    key.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 36
}

/// Contexts of the join's receives (local only): a fresh range per join.
static JOIN_CTX: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl<'a> CollGroup<'a> {
    /// fi_join_collective: joins the group of `members` (fi_addrs in
    /// `av`, the AV bound to `ep`; this endpoint among them, every member
    /// listing them in the same order), collectively. `cq` is the CQ
    /// bound to `ep` for receives: the join reads it for the key
    /// exchange (in any entry format); completions of other operations it
    /// reads meanwhile are kept, as full entries with the fields the
    /// CQ's format lacks 0, for [`CollGroup::take_other_completions`].
    /// `cntr`, if given,
    /// is counted by one as each collective completes (and stays bound,
    /// so cannot close, until the group is dropped).
    pub fn join(
        dom: &'a Domain,
        ep: &'a Endpoint,
        av: &AddressVector,
        cq: &CompletionQueue,
        members: &[FiAddr],
        cntr: Option<&'a Counter>,
        attr: CollAttr,
    ) -> Result<CollGroup<'a>> {
        let n = members.len();
        if n == 0 || n > 1 << 16 {
            return Err(Error::with(ErrorKind::Inval, "a group has 1 to 65536 members"));
        }
        if attr.slot_bytes < 64 || attr.slot_bytes > 1 << 30 {
            return Err(Error::with(ErrorKind::Inval, "slot_bytes is 64 B to 1 GiB"));
        }
        let myname = ep.getname();
        let mut names = Vec::with_capacity(n);
        for &m in members {
            names.push(av.lookup(m)?);
        }
        let me = match names.iter().position(|a| *a == myname) {
            Some(i) => i,
            None => return Err(Error::with(ErrorKind::Inval, "this endpoint is not a member")),
        };
        for (i, a) in names.iter().enumerate() {
            if names[..i].contains(a) {
                return Err(Error::with(ErrorKind::Inval, format!("member {i} is listed twice")));
            }
        }
        let gid = join_id(&names, me);
        let slot = attr.slot_bytes.next_multiple_of(64);
        let mut peers = Vec::with_capacity(n);
        let mut arrivals = Vec::with_capacity(n);
        for j in 0..n {
            if j == me {
                peers.push(None);
                arrivals.push(None);
                continue;
            }
            let c = [dom.cntr_open()?, dom.cntr_open()?];
            let r = [dom.alloc_shared(slot, FI_REMOTE_WRITE)?, dom.alloc_shared(slot, FI_REMOTE_WRITE)?];
            r[0].bind_counter(&c[0], FI_REMOTE_WRITE)?;
            r[1].bind_counter(&c[1], FI_REMOTE_WRITE)?;
            peers.push(Some(Peer { mine: r, keys: [0; 2] }));
            arrivals.push(Some(c));
        }
        // Key exchange: a receive per peer (exact tag), then our keys.
        let tag = |from: usize| JOIN_TAG | gid << 20 | from as u64;
        let ctx0 =
            0xC011_0000_0000usize + (JOIN_CTX.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xffff) * (1 << 17);
        let mut bufs = vec![[0u8; 16]; n];
        // Receives posted and not yet completed (cancelled on failure).
        let mut left = vec![false; n];
        let res = (|| -> Result<Vec<CqTaggedEntry>> {
            for (j, b) in bufs.iter_mut().enumerate() {
                if j != me {
                    let mut m = crate::ep::RecvMsg {
                        iov: &mut [std::io::IoSliceMut::new(b)],
                        src: members[j],
                        context: ctx0 + j,
                        tag: tag(j),
                        ignore: 0,
                    };
                    // FI_COMPLETION: an entry even on a CQ bound with
                    // FI_SELECTIVE_COMPLETION.
                    // SAFETY: `bufs` outlives the receives: they complete
                    // below, or are cancelled (`left`) before we return.
                    unsafe { ep.trecvmsg(&mut m, FI_COMPLETION)? };
                    left[j] = true;
                }
            }
            let t0 = Instant::now();
            for j in 0..n {
                if j == me {
                    continue;
                }
                let p = peers[j].as_ref().expect("a peer");
                let mut msg = [0u8; 16];
                msg[..8].copy_from_slice(&p.mine[0].key().to_le_bytes());
                msg[8..].copy_from_slice(&p.mine[1].key().to_le_bytes());
                loop {
                    match ep.tinject(&msg, members[j], tag(me)) {
                        Ok(()) => break,
                        Err(e) if e.kind() == ErrorKind::Again && t0.elapsed() < attr.join_timeout => {
                            dom.progress()?;
                            std::thread::yield_now();
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            let mut other = Vec::new();
            let mut e = [CqTaggedEntry::default(); 8];
            let mut checked = Instant::now();
            // A context-format CQ gives no length to check.
            let has_len = cq.format()? != CqFormat::Context;
            while left.iter().any(|&l| l) {
                match read_any(cq, &mut e) {
                    Ok(k) => {
                        for x in &e[..k] {
                            match x.op_context.checked_sub(ctx0) {
                                Some(j) if j < n && left[j] => {
                                    left[j] = false;
                                    if has_len && x.len != 16 {
                                        return Err(Error::with(ErrorKind::Io, format!("member {j} sent a bad join")));
                                    }
                                }
                                _ => other.push(*x),
                            }
                        }
                        continue;
                    }
                    Err(er) if er.kind() == ErrorKind::Again => {}
                    Err(er) if er.kind() == ErrorKind::Avail => {
                        let ee = cq.readerr()?;
                        return Err(Error::with(ErrorKind::Io, format!("an error completion during the join: {ee:?}")));
                    }
                    Err(er) => return Err(er),
                }
                if checked.elapsed() > Duration::from_millis(20) {
                    checked = Instant::now();
                    if let Some(j) = (0..n).find(|&j| left[j] && !crate::atomic::pid_alive(names[j].pid)) {
                        return Err(Error::with(ErrorKind::Io, format!("member {j} died during the join")));
                    }
                }
                if t0.elapsed() > attr.join_timeout {
                    return Err(Error::with(ErrorKind::TimedOut, "members missing at the join"));
                }
                dom.wait(Some(Duration::from_millis(1)));
            }
            Ok(other)
        })();
        let other = match res {
            Ok(o) => o,
            Err(e) => {
                for (j, &l) in left.iter().enumerate() {
                    if l {
                        let _ = ep.cancel(ctx0 + j);
                    }
                }
                return Err(e);
            }
        };
        for j in 0..n {
            if let Some(p) = peers[j].as_mut() {
                let b = &bufs[j];
                p.keys =
                    [u64::from_le_bytes(b[..8].try_into().unwrap()), u64::from_le_bytes(b[8..].try_into().unwrap())];
            }
        }
        Ok(CollGroup {
            dom,
            ep,
            members: members.to_vec(),
            pids: names.iter().map(|a| a.pid).collect(),
            me,
            attr: CollAttr { slot_bytes: slot, ..attr },
            peers,
            arrivals,
            tally: RefCell::new(vec![[0; 2]; n]),
            done: dom.cntr_open()?,
            completed: Cell::new(0),
            wr: dom.cntr_open()?,
            user: cntr,
            next: Cell::new(0),
            inflight: RefCell::new(None),
            broken: Cell::new(false),
            tested: Cell::new(Instant::now()),
            zero: Box::new([0; 8]),
            other: RefCell::new(other),
            scratch: RefCell::new(Scratch::default()),
            templates: RefCell::new(Vec::new()),
            direct: Cell::new(None),
            done_lag: Cell::new(0),
            spin: Cell::new(DIRECT_SPIN_MAX),
            plan: std::cell::OnceCell::new(),
        })
    }

    /// Completions of other operations the join read from the CQ.
    pub fn take_other_completions(&self) -> Vec<CqTaggedEntry> {
        std::mem::take(&mut self.other.borrow_mut())
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// This endpoint's index among the members.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Whether `op` completed (drives progress once). `Io` if the group
    /// broke (see [`CollGroup::wait`]): the members and the writes are
    /// checked at most every 20 ms (a poll loop calls this back to back;
    /// the check costs a system call per member).
    pub fn test(&self, op: CollOp) -> Result<bool> {
        self.owner_check()?;
        if self.done_past(op.seq)? {
            return Ok(true);
        }
        if self.direct.get().is_some_and(|d| d.seq <= op.seq) {
            // The direct path's poll is one load and moves nothing else:
            // the pass this call promises (the domain's other traffic,
            // which a peer may wait on before it posts), then a second
            // look.
            self.dom.progress()?;
            if self.done_past(op.seq)? {
                return Ok(true);
            }
        }
        if self.broken.get() || self.tested.get().elapsed() >= Duration::from_millis(20) {
            self.tested.set(Instant::now());
            self.check_health()?;
        }
        Ok(false)
    }

    /// Waits until `op` completed, or `timeout` (`TimedOut`), driving
    /// progress: a few passes back to back (a peer on another CPU
    /// answers within them), then until 500 µs a yield of the
    /// CPU between passes (a peer that shares our CPU can run: a spin
    /// would hold the CPU it needs), then passes with sleeps
    /// on the domain's doorbell (1 ms at most) between them. A member
    /// that died, or a write that failed, makes it `Io` within about 20 ms
    /// (the group's queued work is flushed; later calls fail at once).
    pub fn wait(&self, op: CollOp, timeout: Option<Duration>) -> Result<()> {
        self.owner_check()?;
        // Done already: no clock read (two cost as much as the pass).
        if self.done_past(op.seq)? {
            return Ok(());
        }
        let direct = self.direct.get().is_some();
        let spin = if direct { self.spin.get() } else { SPIN_PASSES };
        // The clock is read every `every` passes only, the first time
        // then (it cost a quarter of a polling loop of progress passes,
        // and more than a direct pass, which is one load).
        let every = if direct { 256 } else { 16 };
        let mut clock: Option<(Instant, Instant)> = None;
        let mut polls = 0u32;
        loop {
            if self.done_past(op.seq)? {
                if direct {
                    // Found while spinning: spin as long again (or
                    // longer); found only after yields: spin less.
                    let s = if polls <= spin { (spin * 2).min(DIRECT_SPIN_MAX) } else { (spin / 2).max(SPIN_PASSES) };
                    self.spin.set(s);
                }
                return Ok(());
            }
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(every)
                || clock
                    .get_or_insert_with(|| {
                        let now = Instant::now();
                        (now, now)
                    })
                    .0
                    .elapsed()
                    < Duration::from_micros(500)
            {
                if polls > spin {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            let (t0, checked) = clock.as_mut().expect("read above");
            let t0 = *t0;
            if self.broken.get() {
                self.check_health()?;
            }
            if checked.elapsed() >= Duration::from_millis(20) {
                *checked = Instant::now();
                self.check_health()?;
            }
            if timeout.is_some_and(|t| t0.elapsed() >= t) {
                return Err(Error::with(ErrorKind::TimedOut, format!("collective {} not complete", op.seq)));
            }
            match self.direct.get() {
                Some(d) => {
                    // The direct path's polls drive no progress: the
                    // domain's other work moves on here, at this pace.
                    self.dom.progress()?;
                    let c = &self.dom.inner.counters()[d.cntr];
                    // Rechecked after the sleep is announced: the peer's
                    // write rings the doorbell (count_remote) after counting.
                    self.dom.wait_for(Some(Duration::from_millis(1)), || value(c) >= d.at);
                }
                None => self.dom.wait(Some(Duration::from_millis(1))),
            }
        }
    }

    /// Whether the next barrier or allreduce of `len` bytes takes the
    /// direct path ([`Direct`]): 2 members (our one write goes at the
    /// post, so the peer never waits for our progress), no counter to
    /// count at completion and no auto-progress thread (nothing but our
    /// own calls would then complete it: with either, the schedule is
    /// deferred work, which any progress pass fires).
    fn direct_ok(&self, len: usize) -> bool {
        self.size() == 2
            && self.user.is_none()
            && len <= self.attr.slot_bytes
            // Only a Safe domain can run one (no lock to ask otherwise).
            && (self.dom.inner.threading != crate::sync::Threading::Safe
                || self.dom.inner.progress_thread.lock().is_ok_and(|t| t.is_none()))
    }

    /// Posts a 2-member barrier (`red` None: 8 zero bytes sent) or
    /// allreduce (`send`, the result to `red`'s buffer) on the direct
    /// path: one write of `send` to the peer's slot region for us now, as
    /// the kept schedule's first step would make it (same slot, counter
    /// and tally), then what is left is [`CollGroup::direct_poll`]'s.
    fn post_direct(&self, send: &[u8], red: Option<(AtomicType, AtomicOp, *mut u8)>) -> Result<CollOp> {
        let seq = self.begin_post()?;
        let q = (seq % 2) as usize;
        let peer = 1 - self.me;
        let dest = self.members[peer];
        let plan = match self.plan.get() {
            Some(p) => p,
            None => {
                let slot = self.attr.slot_bytes as u64;
                let p = self.peers[peer].as_ref().expect("a peer");
                let heap = (|| {
                    let d0 = self.ep.heap_dest(dest, p.keys[0], slot).ok().flatten()?;
                    let d1 = self.ep.heap_dest(dest, p.keys[1], slot).ok().flatten()?;
                    Some([d0, d1])
                })();
                let a = self.arrivals[peer].as_ref().expect("a peer");
                let cntr = [a[0].live_id()?, a[1].live_id()?];
                self.plan.get_or_init(|| DirectPlan { heap, cntr })
            }
        };
        // The domain lock before anything is issued: it refuses a thread
        // that is not the owner of a Threading::Domain domain (`Inval`, the
        // group intact), and it keeps the heap write's access alone on
        // our record in the peer's file (one access at a time per
        // initiating domain: another thread's RMA of a Safe domain would
        // share it, and the peer could then close a registration under
        // that RMA's copy).
        let g = self.dom.inner.lock()?;
        let issued = match &plan.heap {
            // The heap: one copy and the peer's counter, by us.
            Some(d) => {
                let r = d[q].write(&self.dom.inner, &g, 0, send);
                drop(g);
                r
            }
            None => {
                drop(g);
                let key = self.peers[peer].as_ref().expect("a peer").keys[q];
                let wr = self.wr.live_id()?;
                let iov = [IoSlice::new(send)];
                let rma = [RmaIov { addr: 0, len: send.len(), key }];
                let ini = crate::rma::Initiator { dom: &self.dom.inner, idx: self.ep.index() };
                // As the chain's write step: quiet, counted on `wr` (its
                // error value when the write fails after issue:
                // `check_health` sees it).
                let dw = crate::engine::complete::Dw::new(Some(wr), true);
                let local = crate::rma::Local::Out(&iov);
                self.ep.with_state(|ep, ctx| {
                    let w = crate::engine::request::OpKind::Write;
                    ini.rma_body(ep, ctx, w, &local, &rma, dest, 0, None, 0, true, dw)
                })
            }
        };
        if let Err(e) = issued {
            // Refused at issue: the peer will not hear from us.
            self.fail();
            return Err(Error::with(ErrorKind::Io, format!("the collective's write was refused: {e}")));
        }
        let at = {
            let mut t = self.tally.borrow_mut();
            t[peer][q] += 1;
            t[peer][q]
        };
        let red = red.map(|(dt, op, out)| {
            // Our contribution waits in the result buffer (the caller's
            // until completion); `send` may be reused once we return.
            if send.len() == 8 {
                // SAFETY: `out` holds 8 bytes (checked by the caller);
                // unaligned, the whole value read before it is written.
                unsafe { out.cast::<u64>().write_unaligned(send.as_ptr().cast::<u64>().read_unaligned()) };
            } else {
                // SAFETY: `out` holds `send.len()` bytes (checked by the
                // caller); `copy` allows the two to overlap.
                unsafe { std::ptr::copy(send.as_ptr(), out, send.len()) };
            }
            (dt, op, send.len(), out as usize)
        });
        // In flight as `direct` (`inflight` is None: `begin_post`).
        self.direct.set(Some(Direct { seq, peer, q, cntr: plan.cntr[q], at, red }));
        self.next.set(seq + 1);
        Ok(CollOp { seq })
    }

    /// The domain's threading contract for a call that may poll the
    /// direct path (which takes no lock to poll): a Threading::Domain
    /// domain refuses other threads. Once per call (the group cannot
    /// change threads during one), not per poll; nothing to check without
    /// a direct instance (the schedule's polls lock the domain).
    fn owner_check(&self) -> Result<()> {
        if self.direct.get().is_some() {
            drop(self.dom.inner.lock()?);
        }
        Ok(())
    }

    /// Completes the direct instance in flight if the peer's write landed
    /// (one load of our counter): the reduction in the order the kept
    /// schedule uses (the lower member's value first, so both get the
    /// same bits), then `done` counted (later schedules start from it).
    fn direct_poll(&self) -> Result<bool> {
        let Some(d) = self.direct.get() else { return Ok(false) };
        if value(&self.dom.inner.counters()[d.cntr]) < d.at {
            return Ok(false);
        }
        if let Some((dt, op, len, out)) = d.red {
            let slot = self.peers[d.peer].as_ref().expect("a peer").mine[d.q].as_ptr();
            // SAFETY: `slot` is our slot region for the peer (at least
            // `len` bytes: checked by `direct_ok`), whose write of this
            // instance landed (the counter's acquire load above) and which
            // writes nothing more there before we post again; `out` is
            // the caller's result buffer of `len` bytes, valid until
            // completion by the contract of `allreduce`. They do not
            // overlap (shared heap and the caller's memory).
            let (theirs, ours) = unsafe {
                (std::slice::from_raw_parts_mut(slot, len), std::slice::from_raw_parts_mut(out as *mut u8, len))
            };
            if d.peer > self.me {
                reduce::apply(dt, op, theirs, ours);
            } else {
                reduce::apply(dt, op, ours, theirs);
                ours.copy_from_slice(theirs);
            }
        }
        self.direct.set(None);
        self.completed.set(d.seq + 1);
        self.done_lag.set(self.done_lag.get() + 1);
        Ok(true)
    }

    /// Whether instance `seq` completed (a progress pass, unless already
    /// known).
    fn done_past(&self, seq: u64) -> Result<bool> {
        if self.completed.get() > seq {
            return Ok(true);
        }
        if self.direct.get().is_some() {
            return self.direct_poll();
        }
        let d = self.done.read()? + self.done_lag.get();
        self.completed.set(d);
        Ok(d > seq)
    }

    /// `Io` (and the group's work flushed) if a member died or a write
    /// failed.
    fn check_health(&self) -> Result<()> {
        let why = if self.broken.get() {
            Some("the group broke earlier".to_string())
        } else if self.wr.readerr()? > 0 {
            Some("a write to a member failed".to_string())
        } else {
            (0..self.size())
                .find(|&j| j != self.me && !crate::atomic::pid_alive(self.pids[j]))
                .map(|j| format!("member {j} (pid {}) died", self.pids[j]))
        };
        match why {
            None => Ok(()),
            Some(w) => {
                self.fail();
                Err(Error::with(ErrorKind::Io, w))
            }
        }
    }

    fn fail(&self) {
        if self.broken.replace(true) {
            return;
        }
        self.flush();
    }

    fn flush(&self) {
        let _ = self.dom.flush_work(Some(&self.done));
        for c in self.arrivals.iter().flatten().flatten() {
            let _ = self.dom.flush_work(Some(c));
        }
    }

    /// The start of every post: refused once the group broke; waits for
    /// the instance in flight (one at a time per group); the new
    /// instance's sequence number.
    fn begin_post(&self) -> Result<u64> {
        if self.broken.get() {
            return Err(Error::with(ErrorKind::Io, "the group broke earlier"));
        }
        if let Some(d) = self.direct.get() {
            // A direct instance in flight (`inflight` is None then).
            self.wait(CollOp { seq: d.seq }, None)?;
            return Ok(self.next.get());
        }
        let prev = self.inflight.borrow().as_ref().map(|f| f.seq);
        if let Some(s) = prev.filter(|&s| self.completed.get() <= s) {
            self.wait(CollOp { seq: s }, None)?;
        }
        *self.inflight.borrow_mut() = None;
        Ok(self.next.get())
    }

    /// Counts on `done` the direct-path instances that completed since
    /// the last schedule of deferred work (which start from it).
    fn count_lag(&self) -> Result<()> {
        let lag = self.done_lag.get();
        if lag > 0 {
            self.done.add(lag)?;
            self.done_lag.set(0);
        }
        Ok(())
    }

    /// Posts one instance of `plan`: once the instance in flight
    /// completed, the plan is built and queued as one chain of deferred
    /// work ([`Domain::queue_chain`], one acquisition of the domain lock);
    /// a plan that fails (sizes over the slots) queues nothing and leaves
    /// the group usable.
    fn post<'g>(&'g self, plan: impl FnOnce(&mut Sched<'g, 'a, '_, '_>) -> Result<()>) -> Result<CollOp> {
        let seq = self.begin_post()?;
        self.count_lag()?;
        // SAFETY: the buffers the steps name are the instance's (kept in
        // `inflight` until it completed, or flushed first on failure and
        // drop) or the caller's, valid until completion by the contract
        // of the collective's call.
        let (_, (sc, bufs)) = unsafe {
            self.dom.queue_chain(|c| {
                let mut s = Sched::new(self, seq, c);
                plan(&mut s)?;
                s.finish()
            })
        }?;
        let q = (seq % 2) as usize;
        for (t, &n) in self.tally.borrow_mut().iter_mut().zip(&sc.tally) {
            t[q] = n;
        }
        *self.scratch.borrow_mut() = sc;
        self.next.set(seq + 1);
        *self.inflight.borrow_mut() = Some(Inflight { seq, _bufs: bufs });
        Ok(CollOp { seq })
    }

    /// Posts one instance of a schedule kept built for `shape` (built by
    /// `plan` the first time, per parity): `send` goes to its first
    /// buffer, the steps the plan wrote to the caller's buffer write to
    /// `out` instead. No check, record or allocation per step.
    fn post_kept<'g>(
        &'g self,
        shape: Shape,
        send: &[u8],
        out: *mut u8,
        plan: impl FnOnce(&mut Sched<'g, 'a, '_, '_>) -> Result<()>,
    ) -> Result<CollOp> {
        let seq = self.begin_post()?;
        self.count_lag()?;
        let q = (seq % 2) as usize;
        let mut kept = self.templates.borrow_mut();
        let i = match kept.iter().position(|(sh, p, _)| *sh == shape && *p == q) {
            Some(i) => i,
            None => {
                let mut made = None;
                let t = self.dom.chain_template(|c| {
                    let mut s = Sched::new(self, seq, c);
                    s.relative();
                    plan(&mut s)?;
                    let (sc, bufs, at, outs) = s.finish_kept()?;
                    made = Some((sc.tally, bufs, at, outs));
                    Ok(())
                })?;
                let (writes, bufs, at, outs) = made.expect("built");
                if kept.len() >= TEMPLATES {
                    kept.remove(0);
                }
                kept.push((shape, q, Template { t, at, writes, outs, bufs }));
                kept.len() - 1
            }
        };
        let k = &mut kept[i].2;
        if let Some(b) = k.bufs.first_mut() {
            b[..send.len()].copy_from_slice(send);
        }
        let one;
        let many: Vec<(usize, *mut u8)>;
        let dst = if k.outs.len() <= 1 {
            one = k.outs.first().map(|&st| (st, out));
            one.as_slice()
        } else {
            many = k.outs.iter().map(|&st| (st, out)).collect();
            &many[..]
        };
        let base = self.tally.borrow();
        let at = &k.at;
        // SAFETY: the template's buffers are kept with it (the instance
        // two back, which used them, completed before the one in flight
        // started), the zero word is the group's, `out` the caller's,
        // valid until completion by the contract of the collective's call.
        unsafe {
            self.dom.queue_template(
                &k.t,
                |st, th| match at[st] {
                    At::Done(_) => th + seq,
                    At::Peer(j, _) => th + base[j][q],
                },
                dst,
            )
        }?;
        drop(base);
        for (t, w) in self.tally.borrow_mut().iter_mut().zip(&k.writes) {
            t[q] += w;
        }
        self.next.set(seq + 1);
        *self.inflight.borrow_mut() = Some(Inflight { seq, _bufs: Vec::new() });
        Ok(CollOp { seq })
    }

    /// fi_barrier: completes once every member entered it.
    pub fn barrier(&self) -> Result<CollOp> {
        if self.direct_ok(8) {
            return self.post_direct(&self.zero[..], None);
        }
        let (n, me) = (self.size(), self.me);
        let z = self.zero.as_ptr();
        self.post_kept(Shape::Barrier, &[], std::ptr::null_mut(), |s| {
            let mut d = 1;
            while d < n {
                s.write((me + d) % n, &[(z, 8)])?;
                s.arrive((me + n - d) % n, 8)?;
                d *= 2;
            }
            Ok(())
        })
    }

    /// fi_allreduce: `recv = op(send of every member)`, element-wise,
    /// on `dt` (sum, prod, min, max on integers and floats; bor, band,
    /// bxor on integers).
    ///
    /// # Safety
    /// `recv` must stay valid and unused until the collective completed
    /// (`send` is copied at the call).
    pub unsafe fn allreduce(&self, send: &[u8], recv: &mut [u8], dt: AtomicType, op: AtomicOp) -> Result<CollOp> {
        check_red(dt, op, send.len())?;
        if recv.len() != send.len() {
            return Err(Error::with(ErrorKind::Inval, "allreduce: send and receive differ in length"));
        }
        let out = recv.as_mut_ptr();
        if send.len() <= KEPT_MAX && self.direct_ok(send.len()) {
            return self.post_direct(send, Some((dt, op, out)));
        }
        let plan = |s: &mut Sched<'_, 'a, '_, '_>| {
            let acc = s.buf_with(|| send.to_vec());
            s.allreduce(acc, send.len(), dt, op)?;
            s.copy_out(acc, out, send.len())
        };
        if send.len() <= KEPT_MAX {
            self.post_kept(Shape::Allreduce { len: send.len(), dt, op }, send, out, plan)
        } else {
            self.post(plan)
        }
    }

    /// fi_reduce: as allreduce, the result at `root` only (`recv` is
    /// ignored elsewhere and may be empty there).
    ///
    /// # Safety
    /// As [`CollGroup::allreduce`].
    pub unsafe fn reduce(
        &self,
        send: &[u8],
        recv: &mut [u8],
        root: usize,
        dt: AtomicType,
        op: AtomicOp,
    ) -> Result<CollOp> {
        check_red(dt, op, send.len())?;
        self.check_root(root)?;
        if self.me == root && recv.len() != send.len() {
            return Err(Error::with(ErrorKind::Inval, "reduce: the root's receive differs in length"));
        }
        let (out, me) = (recv.as_mut_ptr(), self.me);
        self.post(|s| {
            let acc = s.buf_with(|| send.to_vec());
            s.allreduce(acc, send.len(), dt, op)?;
            if me == root {
                s.copy_out(acc, out, send.len())?;
            }
            Ok(())
        })
    }

    /// fi_broadcast: `buf` at every member becomes the root's.
    ///
    /// # Safety
    /// `buf` must stay valid and unused until the collective completed.
    pub unsafe fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<CollOp> {
        self.check_root(root)?;
        if buf.is_empty() {
            return Err(Error::with(ErrorKind::Inval, "broadcast of nothing"));
        }
        let (len, me) = (buf.len(), self.me);
        let p = buf.as_mut_ptr();
        self.post(|s| {
            let acc = s.buf_with(|| {
                if me == root {
                    // SAFETY: the caller's buffer, valid for the call.
                    unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
                } else {
                    vec![0; len]
                }
            });
            s.allreduce(acc, len, AtomicType::Uint8, AtomicOp::Bor)?;
            s.copy_out(acc, p, len)
        })
    }

    /// fi_allgather: `recv` (members × `send.len()` bytes) gets every
    /// member's `send`, in member order.
    ///
    /// # Safety
    /// As [`CollGroup::allreduce`].
    pub unsafe fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<CollOp> {
        let (n, b, me) = (self.size(), send.len(), self.me);
        if b == 0 || recv.len() != n * b {
            return Err(Error::with(ErrorKind::Inval, "allgather: a block per member, not empty"));
        }
        let out = recv.as_mut_ptr();
        self.post(|s| {
            let acc = s.buf_with(|| {
                let mut v = vec![0; n * b];
                v[me * b..][..b].copy_from_slice(send);
                v
            });
            if n * b <= RING_MIN || n == 1 {
                s.bruck(acc, b)?;
            } else {
                s.ring_allgather(acc, &blocks(n, b))?;
            }
            s.copy_out(acc, out, n * b)
        })
    }

    /// fi_reduce_scatter: `send` is members × `recv.len()` bytes; member
    /// `i` gets block `i` of the reduction.
    ///
    /// # Safety
    /// As [`CollGroup::allreduce`].
    pub unsafe fn reduce_scatter(&self, send: &[u8], recv: &mut [u8], dt: AtomicType, op: AtomicOp) -> Result<CollOp> {
        let (n, b, me) = (self.size(), recv.len(), self.me);
        check_red(dt, op, b)?;
        if send.len() != n * b {
            return Err(Error::with(ErrorKind::Inval, "reduce_scatter: send holds a block per member"));
        }
        let out = recv.as_mut_ptr();
        self.post(|s| {
            let acc = s.buf_with(|| send.to_vec());
            if n * b <= RING_MIN || n == 1 {
                s.allreduce(acc, n * b, dt, op)?;
            } else {
                s.ring_reduce_scatter(acc, &blocks(n, b), dt, op)?;
            }
            let mine = s.ptr(acc).wrapping_add(me * b);
            s.copy_raw(mine, out, b)
        })
    }

    /// fi_alltoall: block `j` of `send` goes to member `j`, landing in
    /// block `me` of its `recv` (blocks of `send.len() / members` bytes).
    ///
    /// # Safety
    /// As [`CollGroup::allreduce`].
    pub unsafe fn alltoall(&self, send: &[u8], recv: &mut [u8]) -> Result<CollOp> {
        let (n, me) = (self.size(), self.me);
        if send.is_empty() || !send.len().is_multiple_of(n) || recv.len() != send.len() {
            return Err(Error::with(ErrorKind::Inval, "alltoall: equal blocks per member, both buffers alike"));
        }
        let b = send.len() / n;
        let out = recv.as_mut_ptr();
        self.post(|s| {
            let src = s.buf_with(|| send.to_vec());
            let p = s.ptr(src);
            // SAFETY: the caller's buffer, valid for the call.
            unsafe { std::slice::from_raw_parts_mut(out.add(me * b), b) }.copy_from_slice(&send[me * b..][..b]);
            for d in 1..n {
                let j = (me + d) % n;
                s.write(j, &[(p.wrapping_add(j * b), b)])?;
            }
            for d in 1..n {
                let j = (me + n - d) % n;
                let at = s.arrive(j, b)?;
                s.copy_raw(at, out.wrapping_add(j * b), b)?;
            }
            Ok(())
        })
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::with(ErrorKind::Inval, format!("root {root} is not a member")));
        }
        Ok(())
    }
}

impl Drop for CollGroup<'_> {
    fn drop(&mut self) {
        // Work still queued names our buffers and counters: none runs now.
        self.flush();
    }
}

/// Reads entries of `cq` in whatever format it has, as full entries (the
/// fields its format lacks are 0): the join takes its own and keeps the
/// others for [`CollGroup::take_other_completions`].
fn read_any(cq: &CompletionQueue, out: &mut [CqTaggedEntry; 8]) -> Result<usize> {
    let full = |op_context, flags, len, buf, data| CqTaggedEntry { op_context, flags, len, buf, data, tag: 0 };
    match cq.format()? {
        CqFormat::Context => {
            let mut e = [CqEntry::default(); 8];
            let k = cq.read(&mut e)?;
            for (o, x) in out.iter_mut().zip(&e[..k]) {
                *o = full(x.op_context, 0, 0, 0, 0);
            }
            Ok(k)
        }
        CqFormat::Msg => {
            let mut e = [CqMsgEntry::default(); 8];
            let k = cq.read(&mut e)?;
            for (o, x) in out.iter_mut().zip(&e[..k]) {
                *o = full(x.op_context, x.flags, x.len, 0, 0);
            }
            Ok(k)
        }
        CqFormat::Data => {
            let mut e = [CqDataEntry::default(); 8];
            let k = cq.read(&mut e)?;
            for (o, x) in out.iter_mut().zip(&e[..k]) {
                *o = full(x.op_context, x.flags, x.len, x.buf, x.data);
            }
            Ok(k)
        }
        _ => cq.read(out),
    }
}

fn check_red(dt: AtomicType, op: AtomicOp, len: usize) -> Result<()> {
    if op == AtomicOp::Write || !reduce::supported(dt, op) {
        return Err(Error::with(ErrorKind::NoSys, format!("no reduction {op:?} on {dt:?}")));
    }
    if len == 0 || !len.is_multiple_of(dt.size()) {
        return Err(Error::with(ErrorKind::Inval, format!("a whole, nonzero number of {}-byte elements", dt.size())));
    }
    Ok(())
}

/// `n` blocks of `b` bytes: (offset, length) of each.
fn blocks(n: usize, b: usize) -> Vec<(usize, usize)> {
    (0..n).map(|i| (i * b, b)).collect()
}

/// `n` chunks of a vector of `len` bytes in `es`-byte elements, as even
/// as whole elements allow.
fn chunks(n: usize, len: usize, es: usize) -> Vec<(usize, usize)> {
    let count = len / es;
    (0..n).map(|i| (i * count / n * es, ((i + 1) * count / n - i * count / n) * es)).collect()
}

/// Where an instance's chain has got to: the start (the group's `done`
/// counter at the instance number) or peer `j`'s counter at a threshold.
#[derive(Clone, Copy)]
enum At {
    Done(u64),
    Peer(usize, u64),
}

/// Builds one instance's schedule on one rank, as a chain of steps.
struct Sched<'g, 'a, 'c, 's> {
    g: &'g CollGroup<'a>,
    c: &'c mut WorkChain<'s>,
    q: usize,
    at: At,
    /// By member: bytes written so far to each peer's slot region for
    /// us (`out_off`), bytes received so far in our slot region of each
    /// peer (`in_off`), writes expected from each peer on parity `q` so
    /// far, cumulative (`tally`: the group's once the chain is queued).
    sc: Scratch,
    bufs: Vec<Vec<u8>>,
    /// Building a kept schedule: where each step waits, and the steps
    /// writing the caller's result (see [`Template`]).
    kept: Option<(Vec<At>, Vec<usize>)>,
}

impl<'g, 'a, 'c, 's> Sched<'g, 'a, 'c, 's> {
    fn new(g: &'g CollGroup<'a>, seq: u64, c: &'c mut WorkChain<'s>) -> Self {
        let n = g.size();
        let q = (seq % 2) as usize;
        let mut sc = g.scratch.take();
        sc.out_off.clear();
        sc.out_off.resize(n, 0);
        sc.in_off.clear();
        sc.in_off.resize(n, 0);
        sc.tally.clear();
        sc.tally.extend(g.tally.borrow().iter().map(|t| t[q]));
        Sched { g, c, q, at: At::Done(seq), sc, bufs: Vec::new(), kept: None }
    }

    /// Builds a kept schedule instead: thresholds relative to the
    /// instance (see [`Template`]), each step's point logged.
    fn relative(&mut self) {
        self.at = At::Done(0);
        self.sc.tally.iter_mut().for_each(|t| *t = 0);
        self.kept = Some((Vec::new(), Vec::new()));
    }

    /// A buffer of the instance, made by `f`.
    fn buf_with(&mut self, f: impl FnOnce() -> Vec<u8>) -> usize {
        self.bufs.push(f());
        self.bufs.len() - 1
    }

    fn ptr(&mut self, b: usize) -> *mut u8 {
        self.bufs[b].as_mut_ptr()
    }

    /// Appends `op` to the chain, at the chain's point.
    fn queue<'x>(&mut self, op: DeferredOp<'x>, completion: Option<&'x Counter>) -> Result<()>
    where
        'g: 'x,
    {
        let g = self.g;
        let (cntr, threshold) = match self.at {
            At::Done(t) => (&g.done, t),
            At::Peer(j, t) => (&g.arrivals[j].as_ref().expect("a peer")[self.q], t),
        };
        if let Some((at, _)) = &mut self.kept {
            at.push(self.at);
        }
        self.c.push(DeferredWork { threshold, triggering: cntr, completion, op })
    }

    /// Writes `segs` (local) to peer `j`'s slot region for us.
    fn write(&mut self, j: usize, segs: &[(*const u8, usize)]) -> Result<()> {
        let len: usize = segs.iter().map(|s| s.1).sum();
        let off = self.sc.out_off[j];
        if off + len > self.g.attr.slot_bytes {
            return Err(too_big(self.g.attr.slot_bytes));
        }
        self.sc.out_off[j] += len;
        let key = self.g.peers[j].as_ref().expect("a peer").keys[self.q];
        // At most 2 segments (Bruck's wrapped run): no allocation.
        assert!(segs.len() <= 2, "a write of 1 or 2 segments");
        let mut iov = [IoSlice::new(&[]), IoSlice::new(&[])];
        for (v, &(p, l)) in iov.iter_mut().zip(segs) {
            // SAFETY: the segments are valid for the instance (see `post`).
            *v = IoSlice::new(unsafe { std::slice::from_raw_parts(p, l) });
        }
        let iov = &iov[..segs.len()];
        let rma = [RmaIov { addr: off as u64, len, key }];
        let op = DeferredOp::Write {
            ep: self.g.ep,
            iov,
            rma_iov: &rma,
            dest: self.g.members[j],
            context: 0,
            data: 0,
            flags: 0,
        };
        let g = self.g;
        self.queue(op, Some(&g.wr))
    }

    /// Moves the chain to "the next `len` bytes from peer `j` arrived"
    /// (the chain's next step waits for `j`'s next write: its counter
    /// counts only `j`'s writes); returns where they are.
    fn arrive(&mut self, j: usize, len: usize) -> Result<*mut u8> {
        let off = self.sc.in_off[j];
        if off + len > self.g.attr.slot_bytes {
            return Err(too_big(self.g.attr.slot_bytes));
        }
        self.sc.in_off[j] += len;
        self.sc.tally[j] += 1;
        self.at = At::Peer(j, self.sc.tally[j]);
        let r = &self.g.peers[j].as_ref().expect("a peer").mine[self.q];
        Ok(r.as_ptr().wrapping_add(off))
    }

    /// `dst = op(dst, src)` at the chain's point.
    fn reduce(&mut self, src: *const u8, dst: *mut u8, len: usize, dt: AtomicType, op: AtomicOp) -> Result<()> {
        // SAFETY: both valid for the instance (see `queue`), disjoint
        // (a slot region and a local buffer, or two buffers).
        let (s, d) = unsafe { (std::slice::from_raw_parts(src, len), std::slice::from_raw_parts_mut(dst, len)) };
        self.queue(DeferredOp::Reduce { dt, op, src: s, dst: d }, None)
    }

    fn copy_raw(&mut self, src: *const u8, dst: *mut u8, len: usize) -> Result<()> {
        self.reduce(src, dst, len, AtomicType::Uint8, AtomicOp::Write)
    }

    /// Copies buffer `b` to the caller's result `dst`.
    fn copy_out(&mut self, b: usize, dst: *mut u8, len: usize) -> Result<()> {
        let n = self.c.len();
        if let Some((_, outs)) = &mut self.kept {
            outs.push(n);
        }
        let p = self.ptr(b);
        self.copy_raw(p, dst, len)
    }

    /// Allreduce of buffer `b` (`len` bytes) in place.
    fn allreduce(&mut self, b: usize, len: usize, dt: AtomicType, op: AtomicOp) -> Result<()> {
        let n = self.g.size();
        if n == 1 {
            return Ok(());
        }
        if len <= RING_MIN || len / dt.size() < n {
            self.recursive_doubling(b, len, dt, op)
        } else {
            let c = chunks(n, len, dt.size());
            self.ring_reduce_scatter(b, &c, dt, op)?;
            self.ring_allgather(b, &c)
        }
    }

    fn recursive_doubling(&mut self, b: usize, len: usize, dt: AtomicType, op: AtomicOp) -> Result<()> {
        let (n, me) = (self.g.size(), self.g.me);
        let acc = self.ptr(b);
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        if me >= p2 {
            // Folded in: give our data to me - p2, get the result back.
            self.write(me - p2, &[(acc, len)])?;
            let at = self.arrive(me - p2, len)?;
            return self.copy_raw(at, acc, len);
        }
        if me + p2 < n {
            let at = self.arrive(me + p2, len)?;
            self.reduce(at, acc, len, dt, op)?;
        }
        let mut d = 1;
        while d < p2 {
            let partner = me ^ d;
            self.write(partner, &[(acc, len)])?;
            let at = self.arrive(partner, len)?;
            // Both partners combine in the same order (lower rank's value
            // first), so floating-point results agree bit for bit.
            if partner < me {
                // acc = partner's ⊕ ours: fold ours into theirs, copy back.
                self.reduce(acc, at, len, dt, op)?;
                self.copy_raw(at, acc, len)?;
            } else {
                self.reduce(at, acc, len, dt, op)?;
            }
            d *= 2;
        }
        if me + p2 < n {
            self.write(me + p2, &[(acc, len)])?;
        }
        Ok(())
    }

    /// The ring's reduce-scatter half: afterwards chunk `me` of `b` holds
    /// the reduction of every member's chunk `me`.
    fn ring_reduce_scatter(&mut self, b: usize, c: &[(usize, usize)], dt: AtomicType, op: AtomicOp) -> Result<()> {
        let (n, me) = (self.g.size(), self.g.me);
        let acc = self.ptr(b);
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        for s in 0..n - 1 {
            let (so, sl) = c[(me + 2 * n - s - 1) % n];
            self.write(right, &[(acc.wrapping_add(so), sl)])?;
            let (ro, rl) = c[(me + 2 * n - s - 2) % n];
            let at = self.arrive(left, rl)?;
            self.reduce(at, acc.wrapping_add(ro), rl, dt, op)?;
        }
        Ok(())
    }

    /// The ring's allgather half: chunk `i` of `b` is final at member `i`;
    /// afterwards every chunk is, everywhere.
    fn ring_allgather(&mut self, b: usize, c: &[(usize, usize)]) -> Result<()> {
        let (n, me) = (self.g.size(), self.g.me);
        let acc = self.ptr(b);
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        for t in 0..n - 1 {
            let (so, sl) = c[(me + n - t) % n];
            self.write(right, &[(acc.wrapping_add(so), sl)])?;
            let (ro, rl) = c[(me + 2 * n - t - 1) % n];
            let at = self.arrive(left, rl)?;
            self.copy_raw(at, acc.wrapping_add(ro), rl)?;
        }
        Ok(())
    }

    /// Bruck-style allgather of blocks of `bs` bytes in `b` (our block in
    /// place): round k sends the 2^k blocks we hold from ours on to
    /// member me - 2^k and places those of member me + 2^k.
    fn bruck(&mut self, b: usize, bs: usize) -> Result<()> {
        let (n, me) = (self.g.size(), self.g.me);
        let acc = self.ptr(b);
        // The blocks from `first`, `cnt` of them, wrapping: 1 or 2 runs.
        let runs = |first: usize, cnt: usize| -> Vec<(usize, usize)> {
            let a = cnt.min(n - first);
            let mut v = vec![(first * bs, a * bs)];
            if cnt > a {
                v.push((0, (cnt - a) * bs));
            }
            v
        };
        let mut d = 1;
        while d < n {
            let cnt = d.min(n - d);
            let segs: Vec<(*const u8, usize)> =
                runs(me, cnt).into_iter().map(|(o, l)| (acc.wrapping_add(o) as *const u8, l)).collect();
            self.write((me + n - d) % n, &segs)?;
            let at = self.arrive((me + d) % n, cnt * bs)?;
            let mut from = 0;
            for (o, l) in runs((me + d) % n, cnt) {
                self.copy_raw(at.wrapping_add(from), acc.wrapping_add(o), l)?;
                from += l;
            }
            d *= 2;
        }
        Ok(())
    }

    /// Ends the schedule: the instance counts `done` (and the user's
    /// counter) once everything before ran. Returns the vectors (with
    /// the tally) and the buffers, for the group once the chain is
    /// queued.
    fn finish(mut self) -> Result<(Scratch, Vec<Vec<u8>>)> {
        let g = self.g;
        if let Some(u) = g.user {
            self.queue(DeferredOp::CntrAdd { cntr: u, value: 1 }, None)?;
        }
        self.queue(DeferredOp::CntrAdd { cntr: &g.done, value: 1 }, None)?;
        Ok((self.sc, self.bufs))
    }
}

impl Sched<'_, '_, '_, '_> {
    /// [`Sched::finish`] of a kept schedule: also where each step waits
    /// and the steps writing the caller's result.
    #[allow(clippy::type_complexity)]
    fn finish_kept(mut self) -> Result<(Scratch, Vec<Vec<u8>>, Vec<At>, Vec<usize>)> {
        let g = self.g;
        if let Some(u) = g.user {
            self.queue(DeferredOp::CntrAdd { cntr: u, value: 1 }, None)?;
        }
        self.queue(DeferredOp::CntrAdd { cntr: &g.done, value: 1 }, None)?;
        let (at, outs) = self.kept.take().expect("a kept schedule");
        Ok((self.sc, self.bufs, at, outs))
    }
}

/// The value a trigger compares (success plus error) of a counter of
/// ours, without a progress pass.
fn value(c: &shm_layout::Counter) -> u64 {
    // SYNC: pairs with the release counts of a write that landed
    // (mr::count_remote, at the writer): its data is visible here.
    c.value
        .v
        .load(std::sync::atomic::Ordering::Acquire)
        .wrapping_add(c.err.v.load(std::sync::atomic::Ordering::Acquire))
}

fn too_big(slot: usize) -> Error {
    Error::with(
        ErrorKind::MsgSize,
        format!("more than the group's {slot}-byte slot from one peer: join with a larger CollAttr::slot_bytes"),
    )
}
