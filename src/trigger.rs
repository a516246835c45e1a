//! Triggered operations and the domain's deferred work queue
//! (fi_trigger(3)).
//!
//! Work waits on a counter: it runs once the counter's success plus error
//! values reach its threshold. Two ways in:
//! - **Triggered operations** ([`Endpoint::triggered`]): an endpoint's
//!   data operation (receive, tagged receive, send, tagged send, RMA read
//!   or write, atomic, fetch and compare atomic) carrying a [`Trigger`];
//!   the C provider's FI_TRIGGER flag with an `fi_triggered_context`
//!   (FI_TRIGGER_THRESHOLD) maps onto it. Once issued it completes as the
//!   same call made then would (CQ entry, endpoint counter). Until it
//!   fires, fi_cancel of its context ([`Endpoint::cancel`]) takes it off
//!   the queue (an `FI_ECANCELED` error entry), and closing its endpoint
//!   drops it.
//! - **Deferred work** ([`Domain::queue_work`], [`Domain::cancel_work`],
//!   [`Domain::flush_work`]: `fi_control`'s FI_QUEUE_WORK, FI_CANCEL_WORK
//!   and FI_FLUSH_WORK): any of those operations, or a counter set or add,
//!   with a completion counter counted by one when the operation completes
//!   (its error value when it fails; for a receive: when its message has
//!   arrived, not when it is posted). The endpoint hears of it (CQ entry,
//!   endpoint counter) only with FI_COMPLETION in the operation's flags;
//!   counter operations change their target counter only.
//!
//! - **Chains** ([`Domain::queue_chain`]): deferred work requests run one
//!   after another, each once the one before ran and its own counter
//!   reached its threshold; one queue entry (and one id) for the whole
//!   chain, which waits on the counter of its next step and moves as it
//!   advances. Built under one acquisition of the domain lock; what
//!   [`crate::coll`] queues a collective's schedule as. A chain built
//!   once as a [`ChainTemplate`] lives in the queue state (`Triggers::kept`)
//!   and is re-armed in place at each [`Domain::queue_template`]: its
//!   steps are not copied, its counters stay bound by the template, and
//!   it goes back to its slot when it ran to its end or was cancelled.
//!
//! Work on one counter runs in the order of its thresholds, then of its
//! submission, also when the counter jumps past several thresholds at once;
//! work whose threshold is met at submission runs at once (after any
//! earlier work on that counter that is due).
//!
//! **Who fires it.** The progress pass ends with one relaxed load of the
//! domain's "work pending" flag (`TrigFlag`); only when it is set does it
//! look at the counters that have work waiting (one list per counter,
//! sorted by (threshold, submission)), comparing each one's value with the
//! threshold at the head of its list. So work fires after whatever moved
//! its counter: a completion counted in the pass, a peer's RMA on an
//! FI_RMA_EVENT counter (it rings our doorbell), a counter operation of
//! other work (chains run to their end in one pass), or the application's
//! own [`Counter::add`] / [`Counter::set`] (which fire due work at once
//! when the domain lock is free). With auto progress
//! ([`Domain::start_progress_thread`]) no call of the application is
//! needed: its thread's sleep re-checks the heads of the lists after it
//! announced itself on the doorbell, so every count that rings (a peer's,
//! an `add`) wakes it.
//!
//! **Receives** are posted when they fire, as the endpoint's call would
//! post them then: a message that arrived earlier waited as unexpected
//! and is matched at once. A deferred receive carries its reporting
//! (`Dw`) in the posted receive (`PostedRecv::dw`), so that its arrival
//! counts its completion counter; while one is posted, the endpoint's
//! inline fast path steps aside (`Matching::front_plain`) and its
//! receives complete through the general path that knows of it.
//!
//! **Re-entrancy.** Work runs inside the progress pass, under the domain
//! lock the pass holds: the operation bodies are the lock-free halves of
//! the endpoint's calls (`EpState::submit`, `rma::Initiator`), never the
//! calls themselves (which would take the lock again). A body that runs a
//! progress pass of its own (a send waiting for room) does not fire work
//! from it (the `firing` mark); the outer loop looks again once it is
//! back. An RMA to memory a peer serves through its mailbox waits for the
//! answer inside the pass, serving our own mailbox meanwhile as the
//! endpoint's call does, so two ranks firing RMA at each other both move.
//! Whichever call ran the pass (a counter or CQ read, a wait with a
//! timeout, an `add`) returns only once the peer served it: with manual
//! progress, a peer that work may still write to must keep progressing
//! until it knows that work completed (fi_trigger.c's rank 0 once slept
//! in read(2) for an answer while the last write of a chain was still on
//! its way to it, and both waited for ever).
//!
//! ```
//! use shmfab::{DeferredOp, DeferredWork, Fabric};
//! # std::env::set_var("SHMFAB_JOB_ID", format!("doctest-trig-{}", std::process::id()));
//! let dom = Fabric::open()?.domain()?;
//! let (go, done, out) = (dom.cntr_open()?, dom.cntr_open()?, dom.cntr_open()?);
//! // When `go` reaches 2, add 5 to `out`.
//! let w = DeferredWork { threshold: 2, triggering: &go, completion: None, op: DeferredOp::CntrAdd { cntr: &out, value: 5 } };
//! // SAFETY: a counter operation names no buffer.
//! unsafe { dom.queue_work(w)? };
//! go.add(1)?;
//! assert_eq!(out.read()?, 0);
//! go.add(1)?;
//! assert_eq!(out.read()?, 5);
//! # let _ = done;
//! # Ok::<(), shmfab::Error>(())
//! ```

use crate::atomic::{AtomicCall, AtomicOp, AtomicType};
use crate::cntr::Counter;
use crate::domain::{CtxSrc, Domain, DomainInner, DomainState};
use crate::engine::complete::{complete_send, count, set, unused_rx, Dw, Fail, SendDone, Val};
use crate::engine::matching::{Dest, PostedRecv};
use crate::engine::request::{Iov, Iovs, OpKind, Request, SEND_FLAGS};
use crate::ep::{Endpoint, RecvMsg, SendMsg};
use crate::error::{Error, ErrorKind, Result};
use crate::flags::*;
use crate::rma::{AtomicArgs, Initiator, Local, RmaIoc, RmaIov, RMA_FLAGS};
use std::collections::BTreeMap;
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A threshold trigger (FI_TRIGGER_THRESHOLD, `struct
/// fi_trigger_threshold`): the operation waits until the success plus
/// error values of `cntr` reach `threshold`.
#[derive(Clone, Copy)]
pub struct Trigger<'a> {
    /// The counter to watch (of the endpoint's domain).
    pub cntr: &'a Counter,
    /// The value it must reach.
    pub threshold: u64,
}

/// Queued deferred work, for [`Domain::cancel_work`] (the C provider keeps
/// it in the `fi_deferred_work`'s context).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkId(u64);

impl WorkId {
    /// The id as an integer (submission order: later work, larger id).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// The operation of a deferred work request (`enum fi_op_type` with its
/// `fi_op_*` struct). Buffers are read or written when the work fires,
/// not at submission (with FI_INJECT in the flags, the data to send is
/// copied at submission instead).
pub enum DeferredOp<'a> {
    /// FI_OP_RECV: [`Endpoint::recvmsg`], posted when the work fires
    /// (matching, from then on, as any receive posted at that moment: a
    /// message that arrived before waits as unexpected and is taken at
    /// once). Its completion counter counts when the message has arrived
    /// (the receive completed), not when it is posted. Flags:
    /// FI_COMPLETION; FI_MULTI_RECV and the probes are `-FI_ENOSYS`. An
    /// untagged receive on an endpoint bound to a shared receive queue is
    /// refused (`-FI_EINVAL`), as the endpoint's call refuses it. A
    /// directed source not in the AV when it fires completes it in error
    /// (`AddrNotAvail`).
    Recv {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The receive.
        msg: RecvMsg<'a, 'a>,
        /// Its flags.
        flags: u64,
    },
    /// FI_OP_TRECV: [`Endpoint::trecvmsg`], as `Recv`.
    Trecv {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The receive.
        msg: RecvMsg<'a, 'a>,
        /// Its flags.
        flags: u64,
    },
    /// FI_OP_SEND: [`Endpoint::sendmsg`].
    Send {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The send.
        msg: SendMsg<'a>,
        /// Its flags (those of `sendmsg`).
        flags: u64,
    },
    /// FI_OP_TSEND: [`Endpoint::tsendmsg`].
    Tsend {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The send.
        msg: SendMsg<'a>,
        /// Its flags.
        flags: u64,
    },
    /// FI_OP_WRITE: [`Endpoint::writemsg`].
    Write {
        /// The endpoint.
        ep: &'a Endpoint,
        /// Local segments.
        iov: &'a [IoSlice<'a>],
        /// Remote segments (same total).
        rma_iov: &'a [RmaIov],
        /// Target.
        dest: FiAddr,
        /// Operation context.
        context: usize,
        /// Remote CQ data (with FI_REMOTE_CQ_DATA).
        data: u64,
        /// Flags (those of `writemsg`).
        flags: u64,
    },
    /// FI_OP_READ: [`Endpoint::readmsg`].
    Read {
        /// The endpoint.
        ep: &'a Endpoint,
        /// Local segments to fill.
        iov: &'a mut [IoSliceMut<'a>],
        /// Remote segments (same total).
        rma_iov: &'a [RmaIov],
        /// Target.
        dest: FiAddr,
        /// Operation context.
        context: usize,
        /// Flags.
        flags: u64,
    },
    /// FI_OP_ATOMIC: [`Endpoint::atomicmsg`].
    Atomic {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The atomic.
        msg: AtomicMsg<'a>,
        /// Flags.
        flags: u64,
    },
    /// FI_OP_FETCH_ATOMIC: [`Endpoint::fetch_atomicmsg`].
    FetchAtomic {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The atomic.
        msg: AtomicMsg<'a>,
        /// The old values (as many bytes as `msg.buf` names).
        result: &'a mut [u8],
        /// Flags.
        flags: u64,
    },
    /// FI_OP_COMPARE_ATOMIC: [`Endpoint::compare_atomicmsg`].
    CompareAtomic {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The atomic.
        msg: AtomicMsg<'a>,
        /// The compare operands.
        compare: &'a [u8],
        /// The old values.
        result: &'a mut [u8],
        /// Flags.
        flags: u64,
    },
    /// shmfab's one local compute operation (no `fi_op_type`; for
    /// collectives built of deferred work, [`crate::coll`]): `dst[i] =
    /// op(dst[i], src[i])` element by element, with `op` one of FI_SUM,
    /// FI_PROD, FI_MIN, FI_MAX, FI_BOR, FI_BAND, FI_BXOR or
    /// FI_ATOMIC_WRITE (a copy) on the integer and floating types (bit
    /// operations on integers only). Plain loads and stores, no atomics:
    /// the buffers are the submitter's (one may be shared-heap memory a
    /// peer wrote before the counter that fires this moved; the counter's
    /// acquire load orders that write before this read). Runs in the
    /// firing pass, counts the completion counter by one, reports nothing
    /// else. Deferred work only (`Domain::queue_work`).
    Reduce {
        /// Element type.
        dt: AtomicType,
        /// Operation.
        op: AtomicOp,
        /// Operands (as many bytes as `dst`, a whole number of elements).
        src: &'a [u8],
        /// Accumulator, updated in place (may not overlap `src`).
        dst: &'a mut [u8],
    },
    /// FI_OP_CNTR_SET: sets the success value of `cntr` to `value`.
    CntrSet {
        /// The counter.
        cntr: &'a Counter,
        /// Its new value.
        value: u64,
    },
    /// FI_OP_CNTR_ADD: adds `value` to the success value of `cntr`.
    CntrAdd {
        /// The counter.
        cntr: &'a Counter,
        /// What to add.
        value: u64,
    },
}

/// An atomic operation's description (`struct fi_msg_atomic`).
#[derive(Clone, Copy)]
pub struct AtomicMsg<'a> {
    /// Datatype.
    pub dt: AtomicType,
    /// Operation.
    pub op: AtomicOp,
    /// Operands (empty for a fetching FI_ATOMIC_READ).
    pub buf: &'a [u8],
    /// Remote segments.
    pub rma_ioc: &'a [RmaIoc],
    /// Target.
    pub dest: FiAddr,
    /// Operation context.
    pub context: usize,
    /// Remote CQ data (with FI_REMOTE_CQ_DATA).
    pub data: u64,
}

/// A deferred work request (`struct fi_deferred_work`).
pub struct DeferredWork<'a> {
    /// The value `triggering` must reach (success plus error values).
    pub threshold: u64,
    /// The counter watched.
    pub triggering: &'a Counter,
    /// Counted by one when the operation completes (its error value when
    /// it fails). None for counter operations (which must not name one).
    pub completion: Option<&'a Counter>,
    /// What to do.
    pub op: DeferredOp<'a>,
}

/// The domain's "work pending" flag: the one word a progress pass looks at
/// (relaxed) before anything of this module, and the head threshold of
/// each counter's list, for the auto-progress thread's sleep ([`Watch`]).
/// Both written under the domain lock when the lists change; the flag is
/// read without it by [`Counter::add`]/[`Counter::set`] as a hint (a stale
/// false only defers firing to the next progress pass).
#[derive(Default)]
pub(crate) struct TrigFlag {
    pending: AtomicBool,
    /// (counter index, threshold at the head of its list), per armed
    /// counter.
    heads: Arc<std::sync::Mutex<Vec<(usize, u64)>>>,
}

impl TrigFlag {
    /// Whether work waits on some counter.
    #[inline(always)]
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Publishes the state of `t` (after it changed).
    fn publish(&self, t: &Triggers) {
        // Relaxed: written under the domain lock; see the type's docs.
        self.pending.store(!t.armed.is_empty(), Ordering::Relaxed);
        let mut h = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        h.clear();
        h.extend(t.armed.iter().filter_map(|&c| t.lists[c].first_key_value().map(|(&(th, _), _)| (c, th))));
    }

    /// A check of due work for a thread that holds no reference to the
    /// domain (the auto-progress thread's sleep), over `counters`.
    pub fn watch(&self, counters: &[shm_layout::Counter]) -> Watch {
        Watch { heads: self.heads.clone(), counters: counters.as_ptr(), n: counters.len() }
    }
}

/// See [`TrigFlag::watch`].
pub(crate) struct Watch {
    heads: Arc<std::sync::Mutex<Vec<(usize, u64)>>>,
    counters: *const shm_layout::Counter,
    n: usize,
}

// SAFETY: the counter table is atomics in a shared mapping; `due`'s
// contract says when it may be read.
unsafe impl Send for Watch {}

impl Watch {
    /// Whether work waiting on some counter is due: what the
    /// auto-progress thread re-checks after it announced its sleep, so a
    /// count whose doorbell ring found no sleeper yet is not slept through
    /// (the doorbell's fences order the two, as for inbound messages).
    ///
    /// # Safety
    /// The domain's region (its counter table) must still be mapped.
    pub unsafe fn due(&self) -> bool {
        let h = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        if h.is_empty() {
            return false;
        }
        // SAFETY: per the contract, the table of `n` counters is mapped.
        let counters = unsafe { std::slice::from_raw_parts(self.counters, self.n) };
        h.iter().any(|&(c, t)| counters.get(c).is_some_and(|x| t <= value(x)))
    }
}

/// What work does when it fires, with everything it needs kept (the
/// caller's buffers as raw segments, valid until completion by the
/// submission's contract).
#[derive(Clone)]
enum Op {
    /// A receive, posted when it fires (the source resolved then).
    Recv {
        tagged: bool,
        iovs: Iovs,
        src: FiAddr,
        context: usize,
        tag: u64,
        ignore: u64,
    },
    Msg {
        kind: OpKind,
        iovs: Iovs,
        dest: FiAddr,
        context: usize,
        tag: u64,
        data: u64,
    },
    Rma {
        kind: OpKind,
        segs: Few<(*mut u8, usize)>,
        rma_iov: Few<RmaIov>,
        dest: FiAddr,
        context: usize,
        data: Option<u64>,
    },
    Atomic {
        call: AtomicCall,
        dt: AtomicType,
        op: AtomicOp,
        buf: (*const u8, usize),
        compare: Option<(*const u8, usize)>,
        result: Option<(*mut u8, usize)>,
        iocs: Vec<RmaIoc>,
        dest: FiAddr,
        context: usize,
        data: Option<u64>,
    },
    Cntr {
        id: usize,
        value: u64,
        set: bool,
    },
    Reduce {
        dt: AtomicType,
        op: AtomicOp,
        src: *const u8,
        dst: *mut u8,
        len: usize,
    },
    /// A chain ([`Domain::queue_chain`], [`Domain::queue_template`]).
    /// The chain's own `trig` and place in the lists are those of its
    /// next step; it holds no counter of its own, only its steps' (a
    /// kept chain's are held by its template).
    Chain(Chain),
}

/// The steps of a chain and how far it got.
#[derive(Clone)]
struct Chain {
    /// (threshold, step) in order, each waiting on the step's `trig`.
    steps: Vec<(u64, Work)>,
    /// The next step to run (those before it ran).
    next: usize,
    /// The slot in [`Triggers::kept`] of a template's chain: re-armed in
    /// place by [`Domain::queue_template`], it goes back there when it
    /// ran to its end or was cancelled; its counters stay bound by the
    /// template (not per queueing). None: a chain queued once.
    kept: Option<usize>,
}

/// One item inline (the common case: a write of one segment), more on
/// the heap.
#[derive(Clone)]
enum Few<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Copy> Few<T> {
    fn new(s: &[T]) -> Self {
        match s {
            [one] => Few::One(*one),
            _ => Few::Many(s.to_vec()),
        }
    }
}

impl<T> std::ops::Deref for Few<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Few::One(t) => std::slice::from_ref(t),
            Few::Many(v) => v,
        }
    }
}

/// One piece of queued work.
#[derive(Clone)]
struct Work {
    id: u64,
    /// The endpoint (section index, generation) of a data operation.
    ep: Option<(usize, u32)>,
    /// The counter it waits on.
    trig: usize,
    /// Completion counter (deferred work).
    completion: Option<usize>,
    /// Deferred work (cancel and flush apply, completions per `Dw`); else
    /// a triggered operation of its endpoint.
    deferred: bool,
    /// The operation's flags.
    flags: u64,
    op: Op,
    /// The data copied at submission (FI_INJECT): the segments point here.
    _owned: Option<Box<[u8]>>,
}

// SAFETY: the raw segments name the submitter's buffers, which its
// (unsafe) submission promised valid until the work completes, from any
// thread that drives the domain; nothing else in Work is thread-bound.
unsafe impl Send for Work {}

/// The queued work of a domain (in [`DomainState`], under its lock).
#[derive(Default)]
pub(crate) struct Triggers {
    /// By counter index: the work waiting on it, by (threshold, id).
    /// Boxed: a chain moves between lists at every step it waits for,
    /// and a move of a box copies a pointer, not the work.
    lists: Vec<BTreeMap<(u64, u64), Box<Work>>>,
    /// The counters whose list is not empty.
    armed: Vec<usize>,
    /// Deferred work by id: its place (counter, threshold), for cancel.
    deferred: std::collections::HashMap<u64, (usize, u64), std::hash::BuildHasherDefault<IdHasher>>,
    /// The next work id (submission order).
    next: u64,
    /// Set while work fires: a progress pass run by a firing operation
    /// fires nothing (the firing loop looks again after it).
    firing: bool,
    /// Work that could not be issued at its last try (`-FI_EAGAIN`): the
    /// next pass retries it; sleepers nap briefly.
    blocked: bool,
    /// The chains of the live templates ([`ChainTemplate`]), by slot.
    kept: Vec<Kept>,
}

/// Where a template's chain is ([`Triggers::kept`]). Unboxed: a box
/// would be freed and made again at every re-arm (the chain moves out of
/// its slot into the lists and back); slots are few.
#[derive(Default)]
#[allow(clippy::large_enum_variant)]
enum Kept {
    /// No template has this slot.
    #[default]
    Free,
    /// Not queued: ready to be re-armed.
    Home(Box<Work>),
    /// Queued (in the lists, by this id) or running.
    Out(u64),
}

/// The hasher of work ids (distinct, sequential: their own hash; SipHash
/// was a visible part of queueing a collective).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Spread the low bits, which hashbrown takes the control byte
        // from the top of.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

impl Triggers {
    /// Whether work is held back for room (see `blocked`).
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// Whether work waiting on some counter is due now.
    pub fn due(&self, counters: &[shm_layout::Counter]) -> bool {
        self.armed.iter().any(|&c| self.lists[c].first_key_value().is_some_and(|((t, _), _)| *t <= value(&counters[c])))
    }

    fn insert(&mut self, w: impl Into<Box<Work>>, threshold: u64) {
        let w = w.into();
        let c = w.trig;
        if self.lists.len() <= c {
            self.lists.resize_with(c + 1, BTreeMap::new);
        }
        if self.lists[c].is_empty() {
            self.armed.push(c);
        }
        if w.deferred {
            self.deferred.insert(w.id, (c, threshold));
        }
        self.lists[c].insert((threshold, w.id), w);
    }

    fn remove(&mut self, c: usize, key: (u64, u64)) -> Option<Box<Work>> {
        let w = self.lists.get_mut(c)?.remove(&key)?;
        if self.lists[c].is_empty() {
            self.armed.retain(|&a| a != c);
            if self.armed.is_empty() {
                // Nothing left to retry (the blocked work was cancelled,
                // flushed, or ran).
                self.blocked = false;
            }
        }
        self.deferred.remove(&w.id);
        Some(w)
    }
}

/// The value a trigger compares: success plus error.
fn value(c: &shm_layout::Counter) -> u64 {
    // SYNC: pairs with the release writes in engine::complete::{count,
    // set} (and a peer's, for remote-event counters): what the completion
    // that moved the counter published is visible to the work it fires.
    c.value.v.load(Ordering::Acquire).wrapping_add(c.err.v.load(Ordering::Acquire))
}

/// Calls `f` with each counter a piece of work holds bound (so they
/// cannot close under it): its trigger, its completion counter, a counter
/// operation's target; a chain's, those of the steps it has left.
fn held(w: &Work, f: &mut impl FnMut(usize)) {
    if let Op::Chain(ch) = &w.op {
        if ch.kept.is_none() {
            for (_, s) in &ch.steps[ch.next..] {
                held(s, f);
            }
        }
        return;
    }
    f(w.trig);
    if let Some(c) = w.completion {
        f(c);
    }
    if let Op::Cntr { id, .. } = w.op {
        f(id);
    }
}

fn release(st: &mut DomainState, w: &Work) {
    held(w, &mut |c| st.cntrs.unbind(c));
}

/// Work taken off the lists without running to its end (cancelled,
/// flushed): its counters released; a template's chain goes back to its
/// slot.
fn retire(st: &mut DomainState, w: Box<Work>) {
    release(st, &w);
    if let Op::Chain(Chain { kept: Some(k), .. }) = &w.op {
        let k = *k;
        st.trig.kept[k] = Kept::Home(w);
    }
}

/// The counter of `c` in `dom`, checked open.
fn cntr_of(dom: &Arc<DomainInner>, st: &DomainState, c: &Counter) -> Result<usize> {
    if !Arc::ptr_eq(&c.dom, dom) {
        return Err(Error::with(ErrorKind::Inval, "counter of another domain"));
    }
    let id = c.live_id()?;
    if st.cntrs.get(id).is_none() {
        return Err(Error::with(ErrorKind::Inval, "counter is closed"));
    }
    Ok(id)
}

/// The endpoint of `ep` in `dom`, checked open and enabled: (index,
/// generation).
fn ep_of(dom: &Arc<DomainInner>, st: &DomainState, ep: &Endpoint) -> Result<(usize, u32)> {
    if !Arc::ptr_eq(&ep.dom, dom) {
        return Err(Error::with(ErrorKind::Inval, "endpoint of another domain"));
    }
    let generation = ep.getname().generation;
    match st.eps.get(ep.idx) {
        Some(s) if s.addr.generation == generation => {
            if !s.enabled {
                return Err(Error::with(ErrorKind::Inval, "endpoint is not enabled"));
            }
            Ok((ep.idx, generation))
        }
        _ => Err(Error::with(ErrorKind::Inval, "endpoint is closed")),
    }
}

fn bad_flags(flags: u64, allowed: u64) -> Result<()> {
    if flags & !allowed != 0 {
        return Err(Error::with(ErrorKind::BadFlags, format!("unsupported flags {:#x}", flags & !allowed)));
    }
    Ok(())
}

/// Copies `segs` into one owned buffer (FI_INJECT at submission).
fn copy_in(segs: &[(*mut u8, usize)]) -> Box<[u8]> {
    let mut v = Vec::with_capacity(segs.iter().map(|s| s.1).sum());
    for &(p, l) in segs {
        // SAFETY: the caller's segments, valid for reads for the call.
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(p, l) });
    }
    v.into_boxed_slice()
}

/// Checks an operation and makes it a piece of work (its endpoint's
/// state is checked by the caller); `deferred` for the work queue.
fn make(dom: &Arc<DomainInner>, st: &DomainState, op: DeferredOp<'_>, deferred: bool) -> Result<(Work, Option<usize>)> {
    let mk = |ep: Option<(usize, u32)>, flags: u64, op: Op, owned: Option<Box<[u8]>>| Work {
        id: 0,
        ep,
        trig: 0,
        completion: None,
        deferred,
        flags,
        op,
        _owned: owned,
    };
    let tagged = matches!(op, DeferredOp::Tsend { .. } | DeferredOp::Trecv { .. });
    let is_set = matches!(op, DeferredOp::CntrSet { .. });
    Ok(match op {
        DeferredOp::Recv { ep, mut msg, flags } | DeferredOp::Trecv { ep, mut msg, flags } => {
            (recv(dom, st, ep, tagged, &mut msg, flags, deferred)?, None)
        }
        DeferredOp::Send { ep, msg, flags } | DeferredOp::Tsend { ep, msg, flags } => {
            let e = ep_of(dom, st, ep)?;
            bad_flags(flags, SEND_FLAGS)?;
            if msg.iov.len() > shm_layout::MAX_IOV {
                return Err(Error::with(ErrorKind::Inval, format!("at most {} iov segments", shm_layout::MAX_IOV)));
            }
            let segs: Vec<(*mut u8, usize)> = msg.iov.iter().map(|s| (s.as_ptr() as *mut u8, s.len())).collect();
            let len: usize = segs.iter().map(|s| s.1).sum();
            if len > crate::proto::MAX_MSG_SIZE {
                return Err(Error::with(ErrorKind::MsgSize, format!("{len} bytes is over the message size limit")));
            }
            if flags & FI_INJECT != 0 && len > crate::proto::INJECT_SIZE {
                return Err(Error::with(
                    ErrorKind::MsgSize,
                    format!("inject takes at most {} bytes", crate::proto::INJECT_SIZE),
                ));
            }
            let owned = (flags & FI_INJECT != 0).then(|| copy_in(&segs));
            let mut iovs = Iovs::default();
            match &owned {
                Some(b) => {
                    iovs.v[0] = Iov { ptr: b.as_ptr() as usize, len: b.len() };
                    iovs.n = 1;
                }
                None => {
                    for (i, &(p, l)) in segs.iter().enumerate() {
                        iovs.v[i] = Iov { ptr: p as usize, len: l };
                    }
                    iovs.n = segs.len();
                }
            }
            let kind = if tagged { OpKind::Tagged } else { OpKind::Msg };
            let (dest, context, tag, data) = (msg.dest, msg.context, msg.tag, msg.data);
            (mk(Some(e), flags, Op::Msg { kind, iovs, dest, context, tag, data }, owned), None)
        }
        DeferredOp::Write { ep, iov, rma_iov, dest, context, data, flags } => {
            let e = ep_of(dom, st, ep)?;
            bad_flags(flags, RMA_FLAGS)?;
            crate::rma::rma_args(&Local::Out(iov), rma_iov, false)?;
            let segs: Few<(*mut u8, usize)> = match iov {
                [one] => Few::One((one.as_ptr() as *mut u8, one.len())),
                _ => Few::Many(iov.iter().map(|s| (s.as_ptr() as *mut u8, s.len())).collect()),
            };
            let owned = (flags & FI_INJECT != 0).then(|| copy_in(&segs));
            let segs = match &owned {
                Some(b) => Few::One((b.as_ptr() as *mut u8, b.len())),
                None => segs,
            };
            let data = (flags & FI_REMOTE_CQ_DATA != 0).then_some(data);
            let op = Op::Rma { kind: OpKind::Write, segs, rma_iov: Few::new(rma_iov), dest, context, data };
            (mk(Some(e), flags, op, owned), None)
        }
        DeferredOp::Read { ep, iov, rma_iov, dest, context, flags } => {
            let segs: Vec<(*mut u8, usize)> = iov.iter_mut().map(|s| (s.as_mut_ptr(), s.len())).collect();
            (read(dom, st, ep, segs, rma_iov, dest, context, flags, deferred)?, None)
        }
        DeferredOp::Atomic { ep, msg, flags } => {
            atomic(dom, st, ep, msg, None, None, flags, AtomicCall::Write, deferred)?
        }
        DeferredOp::FetchAtomic { ep, msg, result, flags } => {
            atomic(dom, st, ep, msg, None, Some(result), flags, AtomicCall::Fetch, deferred)?
        }
        DeferredOp::CompareAtomic { ep, msg, compare, result, flags } => {
            atomic(dom, st, ep, msg, Some(compare), Some(result), flags, AtomicCall::Compare, deferred)?
        }
        DeferredOp::CntrSet { cntr, value } | DeferredOp::CntrAdd { cntr, value } => {
            let id = cntr_of(dom, st, cntr)?;
            (mk(None, 0, Op::Cntr { id, value, set: is_set }, None), Some(id))
        }
        DeferredOp::Reduce { dt, op, src, dst } => {
            if !deferred {
                return Err(Error::with(ErrorKind::Inval, "a reduction is deferred work only"));
            }
            crate::coll::reduce::check(dt, op, src.len(), dst.len())?;
            let (s0, d0) = (src.as_ptr() as usize, dst.as_ptr() as usize);
            if s0 < d0 + dst.len() && d0 < s0 + src.len() {
                return Err(Error::with(ErrorKind::Inval, "a reduction's buffers overlap"));
            }
            let op = Op::Reduce { dt, op, src: src.as_ptr(), dst: dst.as_mut_ptr(), len: dst.len() };
            (mk(None, 0, op, None), None)
        }
    })
}

/// The receive half of [`make`] (`tagged` for FI_OP_TRECV).
fn recv(
    dom: &Arc<DomainInner>,
    st: &DomainState,
    ep: &Endpoint,
    tagged: bool,
    msg: &mut RecvMsg<'_, '_>,
    flags: u64,
    deferred: bool,
) -> Result<Work> {
    let e = ep_of(dom, st, ep)?;
    bad_flags(flags, FI_COMPLETION | FI_MULTI_RECV | FI_PEEK | FI_CLAIM | FI_DISCARD)?;
    if flags & !FI_COMPLETION != 0 {
        return Err(Error::with(
            ErrorKind::NoSys,
            "a triggered or deferred receive takes no FI_MULTI_RECV, FI_PEEK, FI_CLAIM or FI_DISCARD",
        ));
    }
    if msg.iov.len() > shm_layout::MAX_IOV {
        return Err(Error::with(ErrorKind::Inval, format!("at most {} iov segments", shm_layout::MAX_IOV)));
    }
    let state = st.eps.get(e.0).expect("checked open by ep_of");
    if state.matching.srq_for(tagged).is_some() {
        return Err(Error::with(
            ErrorKind::Inval,
            "the endpoint takes these receives from its shared receive queue: post there",
        ));
    }
    let mut iovs = Iovs::default();
    for (i, s) in msg.iov.iter_mut().enumerate() {
        iovs.v[i] = Iov { ptr: s.as_mut_ptr() as usize, len: s.len() };
    }
    iovs.n = msg.iov.len();
    let (src, context, tag, ignore) = (msg.src, msg.context, msg.tag, msg.ignore);
    let tag = if tagged { tag } else { 0 };
    let ignore = if tagged { ignore } else { 0 };
    let op = Op::Recv { tagged, iovs, src, context, tag, ignore };
    Ok(Work { id: 0, ep: Some(e), trig: 0, completion: None, deferred, flags, op, _owned: None })
}

/// The read half of [`make`]: `segs` to fill.
#[allow(clippy::too_many_arguments)]
fn read(
    dom: &Arc<DomainInner>,
    st: &DomainState,
    ep: &Endpoint,
    segs: Vec<(*mut u8, usize)>,
    rma_iov: &[RmaIov],
    dest: FiAddr,
    context: usize,
    flags: u64,
    deferred: bool,
) -> Result<Work> {
    let e = ep_of(dom, st, ep)?;
    bad_flags(flags, RMA_FLAGS & !FI_REMOTE_CQ_DATA & !FI_INJECT)?;
    crate::rma::rma_args(&Local::OutRaw(&segs), rma_iov, false)?;
    let op =
        Op::Rma { kind: OpKind::Read, segs: Few::new(&segs), rma_iov: Few::new(rma_iov), dest, context, data: None };
    Ok(Work { id: 0, ep: Some(e), trig: 0, completion: None, deferred, flags, op, _owned: None })
}

/// The atomic half of [`make`].
#[allow(clippy::too_many_arguments)]
fn atomic(
    dom: &Arc<DomainInner>,
    st: &DomainState,
    ep: &Endpoint,
    m: AtomicMsg<'_>,
    compare: Option<&[u8]>,
    result: Option<&mut [u8]>,
    flags: u64,
    call: AtomicCall,
    deferred: bool,
) -> Result<(Work, Option<usize>)> {
    let e = ep_of(dom, st, ep)?;
    bad_flags(flags, RMA_FLAGS)?;
    let data = (flags & FI_REMOTE_CQ_DATA != 0).then_some(m.data);
    let result = result.map(|r| (r.as_mut_ptr(), r.len()));
    // Checked as the call checks them (a result slice of the right length
    // stands in for the caller's).
    let mut probe = vec![0u8; result.map_or(0, |r| r.1)];
    let args = AtomicArgs {
        call,
        dt: m.dt,
        op: m.op,
        buf: m.buf,
        compare,
        result: result.map(|_| &mut probe[..]),
        dest: m.dest,
        iocs: m.rma_ioc,
        context: m.context,
        data,
        flags,
        silent: false,
    };
    crate::rma::atomic_args(&args)?;
    // FI_INJECT: the operands (and compares) are copied now.
    let owned = (flags & FI_INJECT != 0).then(|| {
        let mut v = m.buf.to_vec();
        v.extend_from_slice(compare.unwrap_or_default());
        v.into_boxed_slice()
    });
    let (buf, compare) = match &owned {
        Some(b) => {
            let n = m.buf.len();
            (((b.as_ptr()), n), compare.map(|c| (b[n..].as_ptr(), c.len())))
        }
        None => ((m.buf.as_ptr(), m.buf.len()), compare.map(|c| (c.as_ptr(), c.len()))),
    };
    let op = Op::Atomic {
        call,
        dt: m.dt,
        op: m.op,
        buf,
        compare,
        result,
        iocs: m.rma_ioc.to_vec(),
        dest: m.dest,
        context: m.context,
        data,
    };
    Ok((Work { id: 0, ep: Some(e), trig: 0, completion: None, deferred, flags, op, _owned: owned }, None))
}

/// Queues `w` on counter `trig` at `threshold` (binding its counters), and
/// fires what is due on that counter at once.
fn queue(dom: &DomainInner, st: &mut DomainState, mut w: Box<Work>, threshold: u64) -> Result<u64> {
    w.id = st.trig.next;
    bind_held(st, &w)?;
    st.trig.next += 1;
    let (id, c) = (w.id, w.trig);
    st.trig.insert(w, threshold);
    dom.trig.publish(&st.trig);
    if threshold <= value(&dom.counters()[c]) {
        fire(dom, st);
    }
    Ok(id)
}

/// Queues chain `w` (its id the next one) at `threshold` of its `trig`;
/// if it is due and no earlier work on that counter is (blocked work, or
/// none), runs it at once instead, without a trip through the lists.
fn run_or_queue(dom: &DomainInner, st: &mut DomainState, w: Box<Work>, threshold: u64) -> Result<u64> {
    let trig = w.trig;
    let counters = dom.counters();
    let now = value(&counters[trig]);
    // Due, and no earlier work on its counter is (blocked work, or
    // none): it runs at once, without a trip through the lists.
    let first = threshold <= now
        && !st.trig.firing
        && st.trig.lists.get(trig).is_none_or(|l| l.first_key_value().is_none_or(|((t, _), _)| *t > now));
    if !first {
        return queue(dom, st, w, threshold);
    }
    bind_held(st, &w)?;
    st.trig.next += 1;
    let id = w.id;
    st.trig.firing = true;
    let fired = run_chain(dom, st, w);
    st.trig.firing = false;
    let rang = match fired {
        Fired::Done { cntr_op } => cntr_op,
        Fired::Moved { w, threshold, cntr_op } => {
            st.trig.insert(w, threshold);
            cntr_op
        }
        Fired::Again(w, at) => {
            st.trig.insert(w, at.expect("a chain's step"));
            st.trig.blocked = true;
            false
        }
    };
    dom.trig.publish(&st.trig);
    // What its steps counted (counter operations, completion
    // counters) may have made other work due, as in `fire`'s loop;
    // whoever sleeps on a counter it moved must hear of it.
    if st.trig.due(counters) {
        fire(dom, st);
    }
    if rang {
        crate::doorbell::ring(&dom.region.header().doorbell);
    }
    Ok(id)
}

/// Binds the counters `w` holds (see [`held`]), all or none: a counter
/// closed meanwhile is refused before anything is queued, and none of
/// them closes while the work waits.
fn bind_held(st: &mut DomainState, w: &Work) -> Result<()> {
    let mut bound = 0usize;
    let mut failed = None;
    held(w, &mut |c| {
        if failed.is_none() {
            match st.cntrs.bind(c) {
                Ok(_) => bound += 1,
                Err(e) => failed = Some(e),
            }
        }
    });
    if let Some(e) = failed {
        let mut k = 0;
        held(w, &mut |c| {
            if k < bound {
                st.cntrs.unbind(c);
                k += 1;
            }
        });
        return Err(e);
    }
    Ok(())
}

/// Fires the due work of every counter, in (threshold, submission) order
/// per counter, until none is due (chains included). Out of line: the
/// progress pass calls it only when its flag says work is pending.
#[cold]
#[inline(never)]
pub(crate) fn fire(dom: &DomainInner, st: &mut DomainState) {
    if st.trig.firing {
        return;
    }
    st.trig.firing = true;
    st.trig.blocked = false;
    let counters = dom.counters();
    let (mut rang, mut touched) = (false, false);
    loop {
        let mut any = false;
        let mut i = 0;
        while i < st.trig.armed.len() {
            let c = st.trig.armed[i];
            while let Some((&(t, id), _)) = st.trig.lists[c].first_key_value() {
                if t > value(&counters[c]) {
                    break;
                }
                let w = st.trig.remove(c, (t, id)).expect("the head just seen");
                touched = true;
                let fired = match w.op {
                    Op::Chain(_) => run_chain(dom, st, w),
                    _ => run(dom, st, w),
                };
                match fired {
                    Fired::Done { cntr_op } => {
                        any = true;
                        rang |= cntr_op;
                    }
                    Fired::Moved { w, threshold, cntr_op } => {
                        // A chain ran up to a step not due yet: it waits
                        // there (its `trig` is that step's counter).
                        st.trig.insert(w, threshold);
                        any = true;
                        rang |= cntr_op;
                    }
                    Fired::Again(w, at) => {
                        // No room to issue it: it keeps its place (a
                        // chain: at the step that could not go); the
                        // next pass tries again, and later work on this
                        // counter waits behind it.
                        st.trig.insert(w, at.unwrap_or(t));
                        st.trig.blocked = true;
                        break;
                    }
                }
            }
            // `remove` may have taken counter `c` out of `armed` (its list
            // emptied) and `insert` put it back at the end: go on from the
            // same place unless `c` is still here.
            if st.trig.armed.get(i) == Some(&c) {
                i += 1;
            }
        }
        if !any {
            break;
        }
    }
    st.trig.firing = false;
    if touched {
        dom.trig.publish(&st.trig);
    }
    if rang {
        // Counter operations: wake whoever sleeps on one of our counters.
        crate::doorbell::ring(&dom.region.header().doorbell);
    }
}

enum Fired {
    /// Ran (or failed, reported): `cntr_op` for a counter operation.
    Done { cntr_op: bool },
    /// A chain ran some steps (`cntr_op`: a counter operation among them)
    /// and waits for the next one: put it back at its `trig` and
    /// `threshold`.
    Moved { w: Box<Work>, threshold: u64, cntr_op: bool },
    /// Could not be issued for lack of room (`-FI_EAGAIN`): put it back
    /// at its `trig` and where it was (a chain: this threshold).
    Again(Box<Work>, Option<u64>),
}

/// Runs the steps of chain `w` (found due) one after another while each
/// one's counter reached its threshold, under the domain lock. In place:
/// the steps stay where they are, `next` moves. A template's chain that
/// ran to its end goes back to its slot.
fn run_chain(dom: &DomainInner, st: &mut DomainState, mut w: Box<Work>) -> Fired {
    let counters = dom.counters();
    let mut cntr_op = false;
    let Op::Chain(ch) = &mut w.op else { unreachable!("a chain") };
    while let Some((t, s)) = ch.steps.get(ch.next) {
        let (t, trig) = (*t, s.trig);
        if t > value(&counters[trig]) {
            w.trig = trig;
            return Fired::Moved { w, threshold: t, cntr_op };
        }
        match run_step(dom, st, s) {
            Step::Done { cntr_op: c } => {
                cntr_op |= c;
                if ch.kept.is_none() {
                    release(st, s);
                }
                ch.next += 1;
            }
            Step::Again => {
                // No room: the chain waits at this step, due now.
                w.trig = trig;
                return Fired::Again(w, Some(t));
            }
        }
    }
    if let Some(k) = ch.kept {
        st.trig.kept[k] = Kept::Home(w);
    }
    Fired::Done { cntr_op }
}

/// What [`run_step`] did.
enum Step {
    /// Ran (or failed, reported): `cntr_op` for a counter operation.
    Done { cntr_op: bool },
    /// No room to issue it (`-FI_EAGAIN`): nothing done.
    Again,
}

/// Runs one piece of work (not a chain), under the domain lock; what it
/// holds is released if it ran.
fn run(dom: &DomainInner, st: &mut DomainState, w: Box<Work>) -> Fired {
    match run_step(dom, st, &w) {
        Step::Done { cntr_op } => {
            release(st, &w);
            Fired::Done { cntr_op }
        }
        Step::Again => Fired::Again(w, None),
    }
}

/// Runs one piece of work (not a chain), under the domain lock, without
/// releasing what it holds (the caller does).
fn run_step(dom: &DomainInner, st: &mut DomainState, w: &Work) -> Step {
    let counters = dom.counters();
    if let Op::Cntr { id, value, set: is_set } = w.op {
        if is_set {
            set(&counters[id], Val::Success, value);
        } else {
            count(&counters[id], Val::Success, value);
        }
        return Step::Done { cntr_op: true };
    }
    if let Op::Reduce { dt, op, src, dst, len } = w.op {
        // SAFETY: the submitter's buffers, valid and not overlapping (checked
        // at submission) until the work completes, by the contract of
        // `queue_work`.
        let (s, d) = unsafe { (std::slice::from_raw_parts(src, len), std::slice::from_raw_parts_mut(dst, len)) };
        crate::coll::reduce::apply(dt, op, s, d);
        if let Some(c) = w.completion {
            count(&counters[c], Val::Success, 1);
        }
        return Step::Done { cntr_op: w.completion.is_some() };
    }
    // Deferred work reports to its endpoint only with FI_COMPLETION.
    let quiet = w.deferred && w.flags & FI_COMPLETION == 0;
    let dw = if w.deferred { Dw::new(w.completion, quiet) } else { Dw::NONE };
    let (idx, generation) = w.ep.expect("data operations name their endpoint");
    let ptr = match st.eps.get(idx) {
        Some(e) if e.addr.generation == generation => e.ptr(),
        _ => {
            // The endpoint closed while the work waited: it fails (on the
            // completion counter; the endpoint's CQ is gone).
            if let Some(c) = w.completion {
                count(&counters[c], Val::Error, 1);
            }
            return Step::Done { cntr_op: false };
        }
    };
    let res = {
        let mut src = CtxSrc::new(dom, st);
        // SAFETY: as in ep.rs's `with_ep_src!`: the endpoint is open (its
        // slot holds this generation, checked above under the lock we
        // hold), and neither the context source nor anything made from it
        // reaches the endpoint slots, so this is the only reference.
        let ep = unsafe { &mut *ptr.as_ptr() };
        let ini = Initiator { dom, idx };
        let res = match &w.op {
            &Op::Recv { tagged, iovs, src: src_fi, context, tag, ignore } => {
                // Deferred work asks for its entry with FI_COMPLETION; a
                // triggered receive follows its endpoint's rule.
                let cqe = w.flags & FI_COMPLETION != 0 || (!w.deferred && !ep.bind.rx_sel);
                match post_recv(ep, &mut src, tagged, iovs, src_fi, context, tag, ignore, cqe, dw) {
                    Err(e) if e.kind() == ErrorKind::Again => return Step::Again,
                    // Reported (or posted).
                    _ => Ok(()),
                }
            }
            Op::Msg { kind, iovs, dest, context, tag, data } => {
                let r = Request {
                    kind: *kind,
                    one: iovs.v[0],
                    iov: Some(iovs),
                    dest: *dest,
                    context: *context,
                    tag: *tag,
                    data: *data,
                    flags: w.flags,
                    silent: quiet,
                    dw,
                };
                ep.submit(&mut src, &r)
            }
            Op::Rma { kind, segs, rma_iov, dest, context, data } => {
                let local = if *kind == OpKind::Write {
                    Local::OutRaw(segs)
                } else {
                    Local::In(segs.iter().copied().collect())
                };
                let flags = w.flags & !FI_INJECT;
                ini.rma_body(ep, &mut src.ctx(), *kind, &local, rma_iov, *dest, *context, *data, flags, quiet, dw)
            }
            Op::Atomic { call, dt, op, buf, compare, result, iocs, dest, context, data } => {
                // SAFETY: the submitter's buffers (or our copy), valid
                // until the work completes by the submission's contract.
                let (buf, compare, result) = unsafe {
                    (
                        std::slice::from_raw_parts(buf.0, buf.1),
                        compare.map(|c| std::slice::from_raw_parts(c.0, c.1)),
                        result.map(|r| std::slice::from_raw_parts_mut(r.0, r.1)),
                    )
                };
                let a = AtomicArgs {
                    call: *call,
                    dt: *dt,
                    op: *op,
                    buf,
                    compare,
                    result,
                    dest: *dest,
                    iocs,
                    context: *context,
                    data: *data,
                    flags: w.flags & !FI_INJECT,
                    silent: quiet,
                };
                ini.atomic_body(ep, &mut src.ctx(), a, dw)
            }
            Op::Cntr { .. } | Op::Reduce { .. } | Op::Chain(_) => unreachable!("handled above"),
        };
        match res {
            Err(e) if e.kind() == ErrorKind::Again => return Step::Again,
            Err(e) => {
                // Refused when issued (an address not in the AV, ...): an
                // error completion, as for a failure after issue.
                let (kind, context, tag) = match &w.op {
                    Op::Msg { kind, context, tag, .. } => (*kind, *context, *tag),
                    Op::Rma { kind, context, .. } => (*kind, *context, 0),
                    Op::Atomic { call, context, .. } => (atomic_kind(*call), *context, 0),
                    Op::Recv { .. } | Op::Cntr { .. } | Op::Reduce { .. } | Op::Chain(_) => {
                        unreachable!("handled above")
                    }
                };
                let done = SendDone { kind, ctx: context, tag, cqe: true, silent: false, dw, rsv: false };
                complete_send(&ep.bind, &mut src.ctx(), done, Some((e.kind(), 0, e.to_string())));
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    };
    let _ = res;
    Step::Done { cntr_op: false }
}

/// Posts a fired receive on `ep` as its call would (the unexpected
/// messages it accepts are taken now), with `dw` (deferred work's
/// reporting). `-FI_EAGAIN` when the endpoint's receive queue is full
/// (nothing done: the work retries); a source not in the AV completes it
/// in error here (`Err` too, reported).
#[allow(clippy::too_many_arguments)]
fn post_recv(
    ep: &mut crate::engine::EpState,
    src: &mut CtxSrc<'_>,
    tagged: bool,
    iovs: Iovs,
    src_fi: FiAddr,
    context: usize,
    tag: u64,
    ignore: u64,
    cqe: bool,
    dw: Dw,
) -> Result<()> {
    let peer = if src_fi == FI_ADDR_UNSPEC {
        None
    } else {
        match ep.peers.of_with(|| src.avs(), src_fi) {
            Ok(p) => Some(p),
            Err(_) => {
                let d = recv_dest(iovs, context, cqe, dw);
                let why = format!("source fi_addr {src_fi} is not in the address vector");
                unused_rx(&ep.bind, &mut src.ctx(), &d, tagged, (ErrorKind::AddrNotAvail, 0, why.clone()));
                return Err(Error::with(ErrorKind::AddrNotAvail, why));
            }
        }
    };
    // Its reporting rides in `moff` (see `PostedRecv::dw`).
    let r = PostedRecv { ctx: context, iovs, src: peer, tag, ignore, multi: 0, moff: dw.raw() as usize, cqe };
    ep.matching.post_deferred(tagged, r, src.cfg().rx_size)?;
    if ep.matching.has_unexp(tagged) {
        crate::ep::match_unexp(ep, &mut src.ctx(), tagged);
    }
    Ok(())
}

/// Where a receive not posted (refused when fired, cancelled) would have
/// delivered: for its error completion.
fn recv_dest(iovs: Iovs, context: usize, cqe: bool, dw: Dw) -> Dest {
    Dest {
        ctx: context,
        iovs,
        cap: iovs.total(),
        buf: iovs.v[0].ptr,
        multi_release: false,
        cqe,
        dw,
        ..Default::default()
    }
}

/// Reports the cancel of triggered operation `w` (not fired, taken off
/// the lists) of endpoint `ep`: an `FI_ECANCELED` error completion, as
/// fi_cancel(3) gives (the endpoint's CQ and counter, as an error of the
/// operation would).
fn report_cancel(ep: &mut crate::engine::EpState, ctx: &mut crate::domain::Ctx<'_>, w: &Work, why: Fail) {
    let (kind, context, tag) = match &w.op {
        &Op::Recv { tagged, iovs, context, .. } => {
            let d = recv_dest(iovs, context, true, Dw::NONE);
            unused_rx(&ep.bind, ctx, &d, tagged, why);
            return;
        }
        Op::Msg { kind, context, tag, .. } => (*kind, *context, *tag),
        Op::Rma { kind, context, .. } => (*kind, *context, 0),
        Op::Atomic { call, context, .. } => (atomic_kind(*call), *context, 0),
        Op::Cntr { .. } | Op::Reduce { .. } | Op::Chain(_) => return,
    };
    let done = SendDone { kind, ctx: context, tag, cqe: true, silent: false, dw: Dw::NONE, rsv: false };
    complete_send(&ep.bind, ctx, done, Some(why));
}

impl Work {
    /// The operation context of a data operation.
    fn context(&self) -> Option<usize> {
        match &self.op {
            Op::Recv { context, .. }
            | Op::Msg { context, .. }
            | Op::Rma { context, .. }
            | Op::Atomic { context, .. } => Some(*context),
            Op::Cntr { .. } | Op::Reduce { .. } | Op::Chain(_) => None,
        }
    }
}

/// Takes the triggered operations (not deferred work) of endpoint `idx`
/// (open, generation `generation`) off the lists for which `pick` says
/// so (at most `most`), releasing their counters; in (counter,
/// threshold, submission) order. (The boxes are those of the lists,
/// kept as they are.)
#[allow(clippy::vec_box)]
fn take_triggered(
    dom: &DomainInner,
    st: &mut DomainState,
    idx: usize,
    generation: u32,
    most: usize,
    pick: impl Fn(&Work) -> bool,
) -> Vec<Box<Work>> {
    let mut keys = Vec::new();
    'lists: for &c in &st.trig.armed {
        for (&k, w) in &st.trig.lists[c] {
            if !w.deferred && w.ep == Some((idx, generation)) && pick(w) {
                keys.push((c, k));
                if keys.len() == most {
                    break 'lists;
                }
            }
        }
    }
    let out: Vec<Box<Work>> = keys.into_iter().map(|(c, k)| st.trig.remove(c, k).expect("just seen")).collect();
    for w in &out {
        release(st, w);
    }
    if !out.is_empty() {
        dom.trig.publish(&st.trig);
    }
    out
}

impl Endpoint {
    /// fi_cancel of a triggered operation of this endpoint that has not
    /// fired: the first (by counter, threshold, submission) whose context
    /// is `context` is taken off the queue (it never runs) and completes
    /// as an `FI_ECANCELED` error entry (its endpoint's CQ, and its
    /// endpoint counter's error value). Whether one was found.
    pub(crate) fn cancel_triggered(&self, context: usize) -> Result<bool> {
        let dom = &self.dom;
        if !dom.trig.pending() {
            return Ok(false);
        }
        let mut st = dom.lock()?;
        let generation = self.getname().generation;
        if st.eps.get(self.idx).is_none_or(|e| e.addr.generation != generation) {
            return Ok(false);
        }
        let Some(w) = take_triggered(dom, &mut st, self.idx, generation, 1, |w| w.context() == Some(context)).pop()
        else {
            return Ok(false);
        };
        let why = (ErrorKind::Canceled, crate::cq::prov::CANCELED, "triggered operation cancelled".to_string());
        dom.with_ep(&mut st, self.idx, |ep, ctx| {
            report_cancel(ep, ctx, &w, why);
            Ok(true)
        })
    }
}

/// Endpoint `idx` closes: its triggered operations not fired are taken
/// off the queue and never run (their counters released). Receives among
/// them are flushed as the endpoint's posted receives are (an
/// `FI_ECANCELED` entry), unless `discard`; the others are dropped without
/// completions, as its queued sends are. Deferred work that names the
/// endpoint stays: it fails when it fires (on its completion counter).
pub(crate) fn ep_closing(dom: &DomainInner, st: &mut DomainState, idx: usize, discard: bool) {
    if !dom.trig.pending() {
        return;
    }
    let Some(generation) = st.eps.get(idx).map(|e| e.addr.generation) else {
        return;
    };
    let ws = take_triggered(dom, st, idx, generation, usize::MAX, |_| true);
    if discard {
        return;
    }
    let _ = dom.with_ep(st, idx, |ep, ctx| {
        for w in ws.iter().filter(|w| matches!(w.op, Op::Recv { .. })) {
            let why = (
                ErrorKind::Canceled,
                crate::cq::prov::FLUSHED,
                "endpoint closed before the receive was posted".to_string(),
            );
            report_cancel(ep, ctx, w, why);
        }
        Ok(())
    });
}

fn atomic_kind(call: AtomicCall) -> OpKind {
    match call {
        AtomicCall::Write => OpKind::Atomic,
        AtomicCall::Fetch => OpKind::FetchAtomic,
        AtomicCall::Compare => OpKind::CompareAtomic,
    }
}

/// Fires due work after the application changed a counter (`add`, `set`):
/// nothing unless work is pending; skipped when the lock is not ours to
/// take now (another thread's domain, a call in progress): the next
/// progress pass fires it then.
pub(crate) fn after_app_change(dom: &DomainInner) {
    if dom.trig.pending() {
        if let Ok(mut st) = dom.lock() {
            fire(dom, &mut st);
        }
    }
}

impl Domain {
    /// FI_QUEUE_WORK: queues `w` on the domain's deferred work queue; it
    /// runs once `w.triggering` (success plus error values) reaches
    /// `w.threshold` (at once if it has). The objects it names are checked
    /// first (counters and endpoint of this domain and open, the endpoint
    /// enabled, flags, sizes); then what shmfab cannot defer (a
    /// multi-receive buffer, a peek or claim) is `-FI_ENOSYS`. The counters
    /// it names cannot close while it waits (`Busy`). A receive's
    /// completion counter counts when its message has arrived; it must stay
    /// open until then (as a fired send's until the send completes).
    ///
    /// # Safety
    /// The buffers the operation names must stay valid (and those it sends
    /// from unchanged) until it completes or is cancelled; they are read
    /// or written when it fires (with FI_INJECT, the data to send is
    /// copied now).
    pub unsafe fn queue_work(&self, w: DeferredWork<'_>) -> Result<WorkId> {
        let dom = &self.inner;
        let mut st = dom.lock()?;
        let trig = cntr_of(dom, &st, w.triggering)?;
        let completion = w.completion.map(|c| cntr_of(dom, &st, c)).transpose()?;
        let cntr_op = matches!(w.op, DeferredOp::CntrSet { .. } | DeferredOp::CntrAdd { .. });
        if cntr_op && completion.is_some() {
            return Err(Error::with(ErrorKind::Inval, "counter operations take no completion counter"));
        }
        let (mut work, _) = make(dom, &st, w.op, true)?;
        work.trig = trig;
        work.completion = completion;
        queue(dom, &mut st, Box::new(work), w.threshold).map(WorkId)
    }

    /// Queues a *chain* of deferred work, built by `build` under one
    /// acquisition of the domain lock: the steps run one after another,
    /// each once the step before it ran (completed when issued: heap
    /// writes, counter operations and reductions do) and its own
    /// `triggering` counter reached its `threshold`. A schedule of many
    /// steps costs one queue entry, moved from counter to counter as the
    /// chain advances, instead of one per step (and no token counts to
    /// join a step to the one before). Each step is checked as
    /// [`Domain::queue_work`] checks it, when pushed; if `build` or a
    /// push fails, nothing is queued. The chain is one piece of deferred
    /// work: [`Domain::cancel_work`] of its id cancels the steps not yet
    /// run; [`Domain::flush_work`] by counter takes it when its next step
    /// waits on that counter. Steps already due run before this returns.
    /// `build` must not call the domain (its lock is held): only
    /// [`WorkChain::push`].
    ///
    /// # Safety
    /// As [`Domain::queue_work`], for the buffers of every step.
    pub unsafe fn queue_chain<R>(&self, build: impl FnOnce(&mut WorkChain<'_>) -> Result<R>) -> Result<(WorkId, R)> {
        let dom = &self.inner;
        let mut st = dom.lock()?;
        let mut c = WorkChain { dom, st: &st, steps: Vec::with_capacity(8) };
        let r = build(&mut c)?;
        let steps = c.steps;
        let Some(&(threshold, ref first)) = steps.first() else {
            return Err(Error::with(ErrorKind::Inval, "an empty chain"));
        };
        let trig = first.trig;
        let w = Box::new(Work {
            id: st.trig.next,
            ep: None,
            trig,
            completion: None,
            deferred: true,
            flags: 0,
            op: Op::Chain(Chain { steps, next: 0, kept: None }),
            _owned: None,
        });
        run_or_queue(dom, &mut st, w, threshold).map(|id| (WorkId(id), r))
    }

    /// Builds a chain as [`Domain::queue_chain`] does (each step checked)
    /// without queueing it: a [`ChainTemplate`] that
    /// [`Domain::queue_template`] re-arms and queues again and again with
    /// its thresholds moved, without checking, building or copying the
    /// steps again. The counters the steps name stay bound (they cannot
    /// close) while the template lives.
    pub fn chain_template(&self, build: impl FnOnce(&mut WorkChain<'_>) -> Result<()>) -> Result<ChainTemplate> {
        let dom = &self.inner;
        let mut st = dom.lock()?;
        let mut c = WorkChain { dom, st: &st, steps: Vec::with_capacity(8) };
        build(&mut c)?;
        let steps = c.steps;
        if steps.is_empty() {
            return Err(Error::with(ErrorKind::Inval, "an empty chain"));
        }
        let rel: Vec<u64> = steps.iter().map(|s| s.0).collect();
        let reduce: Vec<Option<usize>> = steps
            .iter()
            .map(|s| match s.1.op {
                Op::Reduce { dst, .. } => Some(dst as usize),
                _ => None,
            })
            .collect();
        let mut w = Box::new(Work {
            id: 0,
            ep: None,
            trig: 0,
            completion: None,
            deferred: true,
            flags: 0,
            op: Op::Chain(Chain { steps, next: 0, kept: None }),
            _owned: None,
        });
        // Bound once, for the template's life (a kept chain's `held` is
        // empty: queueing it binds nothing).
        bind_held(&mut st, &w)?;
        let slot = match st.trig.kept.iter().position(|k| matches!(k, Kept::Free)) {
            Some(i) => i,
            None => {
                st.trig.kept.push(Kept::Free);
                st.trig.kept.len() - 1
            }
        };
        let Op::Chain(ch) = &mut w.op else { unreachable!("a chain") };
        ch.kept = Some(slot);
        st.trig.kept[slot] = Kept::Home(w);
        Ok(ChainTemplate { dom: dom.clone(), slot, rel, reduce })
    }

    /// Re-arms `t`'s chain in place and queues it ([`Domain::queue_chain`]),
    /// step `i` (in push order) at threshold `threshold(i, t_i)` where
    /// `t_i` is the threshold it was built with, and the destination of
    /// each reduction step `i` in `dst` replaced by the pointer given
    /// (same length). The chain is the template's own (no copy, no
    /// binding): `Busy` while the previous queueing has not run to its
    /// end (cancel or flush it to re-arm it earlier). Steps due run
    /// before this returns.
    ///
    /// # Safety
    /// As [`Domain::queue_work`], for the buffers of every step (those
    /// the template was built with, and the ones in `dst`).
    pub unsafe fn queue_template(
        &self,
        t: &ChainTemplate,
        threshold: impl Fn(usize, u64) -> u64,
        dst: &[(usize, *mut u8)],
    ) -> Result<WorkId> {
        let dom = &self.inner;
        if !Arc::ptr_eq(&t.dom, dom) {
            return Err(Error::with(ErrorKind::Inval, "a template of another domain"));
        }
        if dst.iter().any(|d| t.reduce.get(d.0).is_none_or(|r| r.is_none())) {
            return Err(Error::with(ErrorKind::Inval, "only a reduction's destination can be replaced"));
        }
        let mut st = dom.lock()?;
        let id = st.trig.next;
        let mut w = match std::mem::replace(&mut st.trig.kept[t.slot], Kept::Out(id)) {
            Kept::Home(w) => w,
            other => {
                st.trig.kept[t.slot] = other;
                return Err(Error::with(ErrorKind::Busy, "the template's chain is still queued"));
            }
        };
        let Op::Chain(ch) = &mut w.op else { unreachable!("a chain") };
        ch.next = 0;
        for (i, ((th, s), (&r, &built))) in ch.steps.iter_mut().zip(t.rel.iter().zip(&t.reduce)).enumerate() {
            *th = threshold(i, r);
            if let (Op::Reduce { dst: d, .. }, Some(built)) = (&mut s.op, built) {
                // The destination given for this queueing, else as built.
                *d = dst.iter().find(|d| d.0 == i).map_or(built as *mut u8, |d| d.1);
            }
        }
        let (th, trig) = (ch.steps[0].0, ch.steps[0].1.trig);
        w.trig = trig;
        w.id = id;
        run_or_queue(dom, &mut st, w, th).map(WorkId)
    }

    /// FI_CANCEL_WORK: takes queued work off the queue; it never runs.
    /// `Ok(false)` if it is no longer queued (it ran, or was cancelled or
    /// flushed).
    pub fn cancel_work(&self, id: WorkId) -> Result<bool> {
        let mut st = self.inner.lock()?;
        let Some(&(c, t)) = st.trig.deferred.get(&id.0) else { return Ok(false) };
        let w = st.trig.remove(c, (t, id.0)).expect("indexed work is queued");
        retire(&mut st, w);
        self.inner.trig.publish(&st.trig);
        Ok(true)
    }

    /// FI_FLUSH_WORK: cancels every queued work request, or (with
    /// `triggering`) those waiting on that counter; returns how many.
    /// Triggered operations of endpoints are not deferred work: they stay.
    pub fn flush_work(&self, triggering: Option<&Counter>) -> Result<usize> {
        let dom = &self.inner;
        let mut st = dom.lock()?;
        let only = triggering.map(|c| cntr_of(dom, &st, c)).transpose()?;
        let mut keys: Vec<(usize, (u64, u64))> = st
            .trig
            .deferred
            .iter()
            .filter(|(_, (c, _))| only.is_none_or(|o| o == *c))
            .map(|(&id, &(c, t))| (c, (t, id)))
            .collect();
        keys.sort_unstable();
        for &(c, k) in &keys {
            let w = st.trig.remove(c, k).expect("indexed work is queued");
            retire(&mut st, w);
        }
        dom.trig.publish(&st.trig);
        Ok(keys.len())
    }

    /// Deferred work and triggered operations queued (not yet fired).
    pub fn queued_work(&self) -> Result<usize> {
        let st = self.inner.lock()?;
        Ok(st.trig.lists.iter().map(|l| l.len()).sum())
    }
}

/// The steps of a chain being built ([`Domain::queue_chain`]).
pub struct WorkChain<'s> {
    dom: &'s Arc<DomainInner>,
    st: &'s DomainState,
    /// (threshold, step), in order.
    steps: Vec<(u64, Work)>,
}

impl WorkChain<'_> {
    /// Appends `w` as the chain's next step, checked as
    /// [`Domain::queue_work`] checks it (the safety contract of
    /// [`Domain::queue_chain`] covers its buffers).
    pub fn push(&mut self, w: DeferredWork<'_>) -> Result<()> {
        let (dom, st) = (self.dom, self.st);
        let trig = cntr_of(dom, st, w.triggering)?;
        let completion = w.completion.map(|c| cntr_of(dom, st, c)).transpose()?;
        let cntr_op = matches!(w.op, DeferredOp::CntrSet { .. } | DeferredOp::CntrAdd { .. });
        if cntr_op && completion.is_some() {
            return Err(Error::with(ErrorKind::Inval, "counter operations take no completion counter"));
        }
        let (mut work, _) = make(dom, st, w.op, true)?;
        work.trig = trig;
        work.completion = completion;
        self.steps.push((w.threshold, work));
        Ok(())
    }

    /// Steps pushed so far.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether no step was pushed.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

/// A chain built once and queued many times ([`Domain::chain_template`],
/// [`Domain::queue_template`]). The chain itself lives in the domain's
/// queue state (slot `slot` of `Triggers::kept`), home between queueings,
/// so that re-arming it copies nothing. Dropping the template cancels the
/// chain if queued and releases its counters.
pub struct ChainTemplate {
    dom: Arc<DomainInner>,
    /// Its chain's slot in `Triggers::kept`.
    slot: usize,
    /// The thresholds the steps were built with, in push order.
    rel: Vec<u64>,
    /// The destination each reduction step was built with (None: not a
    /// reduction; only those may be replaced per queueing).
    reduce: Vec<Option<usize>>,
}

impl Drop for ChainTemplate {
    fn drop(&mut self) {
        let Ok(mut st) = self.dom.lock() else { return };
        let mut w = match std::mem::take(&mut st.trig.kept[self.slot]) {
            Kept::Home(w) => w,
            Kept::Out(id) => {
                // Queued: it never runs now.
                let Some(&(c, t)) = st.trig.deferred.get(&id) else { return };
                let w = st.trig.remove(c, (t, id)).expect("indexed work is queued");
                self.dom.trig.publish(&st.trig);
                w
            }
            Kept::Free => return,
        };
        // Every step's counters, bound at build (not per queueing).
        let Op::Chain(ch) = &mut w.op else { unreachable!("a chain") };
        ch.kept = None;
        ch.next = 0;
        release(&mut st, &w);
    }
}

/// An endpoint's data operations with a [`Trigger`]
/// ([`Endpoint::triggered`]). Each queues the operation until the
/// trigger's counter reaches its threshold; it then completes as the call
/// made at that moment would (a CQ entry per the endpoint's completion
/// rules, its endpoint counter). Arguments are checked at submission.
pub struct Triggered<'a> {
    ep: &'a Endpoint,
    trig: Trigger<'a>,
}

impl Endpoint {
    /// This endpoint's operations with `trigger` (FI_TRIGGER with an
    /// `fi_triggered_context` of type FI_TRIGGER_THRESHOLD).
    pub fn triggered<'a>(&'a self, trigger: Trigger<'a>) -> Triggered<'a> {
        Triggered { ep: self, trig: trigger }
    }
}

impl Triggered<'_> {
    fn submit(&self, op: DeferredOp<'_>) -> Result<()> {
        self.submit_with(|dom, st| make(dom, st, op, false).map(|w| w.0))
    }

    fn submit_with(&self, make: impl FnOnce(&Arc<DomainInner>, &DomainState) -> Result<Work>) -> Result<()> {
        let dom = &self.ep.dom;
        let mut st = dom.lock()?;
        let trig = cntr_of(dom, &st, self.trig.cntr)?;
        let mut w = make(dom, &st)?;
        // A triggered operation reports as its call would: its endpoint
        // must be able to.
        let ep = st.eps.get(self.ep.idx).expect("checked open by make");
        if matches!(w.op, Op::Recv { .. }) {
            if !ep.bind.can_report_rx() {
                return Err(Error::with(ErrorKind::NoCq, "no receive CQ or receive counter bound"));
            }
        } else {
            let needs_cq = !ep.bind.tx_sel || w.flags & FI_COMPLETION != 0;
            if needs_cq && !ep.bind.can_report_tx() {
                return Err(Error::with(ErrorKind::NoCq, "no transmit CQ or counter bound"));
            }
        }
        w.trig = trig;
        queue(dom, &mut st, Box::new(w), self.trig.threshold).map(|_| ())
    }

    /// [`Endpoint::recvmsg`], triggered: posted when the counter reaches
    /// the threshold (a message that arrived before waits as unexpected
    /// until then), then completing as that receive would. Flags:
    /// FI_COMPLETION (others as [`DeferredOp::Recv`] says). fi_cancel
    /// ([`Endpoint::cancel`]) of its context takes it off the queue before
    /// it fires, and cancels the posted receive after.
    ///
    /// # Safety
    /// The buffers must stay valid and untouched until the receive
    /// completes (or is cancelled).
    pub unsafe fn recvmsg(&self, mut m: RecvMsg<'_, '_>, flags: u64) -> Result<()> {
        self.submit_with(|dom, st| recv(dom, st, self.ep, false, &mut m, flags, false))
    }

    /// [`Endpoint::trecvmsg`], triggered (as [`Triggered::recvmsg`]).
    ///
    /// # Safety
    /// As [`Triggered::recvmsg`].
    pub unsafe fn trecvmsg(&self, mut m: RecvMsg<'_, '_>, flags: u64) -> Result<()> {
        self.submit_with(|dom, st| recv(dom, st, self.ep, true, &mut m, flags, false))
    }

    /// [`Endpoint::sendmsg`], triggered.
    ///
    /// # Safety
    /// The iov buffers must stay valid and unchanged until the send
    /// completes (with FI_INJECT: they are copied now).
    pub unsafe fn sendmsg(&self, m: SendMsg<'_>, flags: u64) -> Result<()> {
        self.submit(DeferredOp::Send { ep: self.ep, msg: m, flags })
    }

    /// [`Endpoint::tsendmsg`], triggered.
    ///
    /// # Safety
    /// As [`Triggered::sendmsg`].
    pub unsafe fn tsendmsg(&self, m: SendMsg<'_>, flags: u64) -> Result<()> {
        self.submit(DeferredOp::Tsend { ep: self.ep, msg: m, flags })
    }

    /// [`Endpoint::writemsg`], triggered.
    ///
    /// # Safety
    /// The local buffers must stay valid and unchanged until the write
    /// completes (with FI_INJECT: they are copied now).
    pub unsafe fn writemsg(
        &self,
        iov: &[IoSlice<'_>],
        rma_iov: &[RmaIov],
        dest: FiAddr,
        context: usize,
        data: u64,
        flags: u64,
    ) -> Result<()> {
        self.submit(DeferredOp::Write { ep: self.ep, iov, rma_iov, dest, context, data, flags })
    }

    /// [`Endpoint::readmsg`], triggered.
    ///
    /// # Safety
    /// The local buffers must stay valid and untouched until the read
    /// completes.
    pub unsafe fn readmsg(
        &self,
        iov: &mut [IoSliceMut<'_>],
        rma_iov: &[RmaIov],
        dest: FiAddr,
        context: usize,
        flags: u64,
    ) -> Result<()> {
        let segs: Vec<(*mut u8, usize)> = iov.iter_mut().map(|s| (s.as_mut_ptr(), s.len())).collect();
        self.submit_with(|dom, st| read(dom, st, self.ep, segs, rma_iov, dest, context, flags, false))
    }

    /// [`Endpoint::atomicmsg`], triggered.
    ///
    /// # Safety
    /// The operands must stay valid and unchanged until the atomic
    /// completes (with FI_INJECT: they are copied now).
    pub unsafe fn atomicmsg(&self, m: AtomicMsg<'_>, flags: u64) -> Result<()> {
        self.submit(DeferredOp::Atomic { ep: self.ep, msg: m, flags })
    }

    /// [`Endpoint::fetch_atomicmsg`], triggered.
    ///
    /// # Safety
    /// As [`Triggered::atomicmsg`]; `result` must stay valid and untouched
    /// until the atomic completes.
    pub unsafe fn fetch_atomicmsg(&self, m: AtomicMsg<'_>, result: &mut [u8], flags: u64) -> Result<()> {
        self.submit(DeferredOp::FetchAtomic { ep: self.ep, msg: m, result, flags })
    }

    /// [`Endpoint::compare_atomicmsg`], triggered.
    ///
    /// # Safety
    /// As [`Triggered::fetch_atomicmsg`], for `compare` too.
    pub unsafe fn compare_atomicmsg(
        &self,
        m: AtomicMsg<'_>,
        compare: &[u8],
        result: &mut [u8],
        flags: u64,
    ) -> Result<()> {
        self.submit(DeferredOp::CompareAtomic { ep: self.ep, msg: m, compare, result, flags })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn work(id: u64, trig: usize, deferred: bool) -> Work {
        Work {
            id,
            ep: None,
            trig,
            completion: None,
            deferred,
            flags: 0,
            op: Op::Cntr { id: 0, value: 1, set: false },
            _owned: None,
        }
    }

    /// The lists keep (threshold, submission) order; a counter is armed
    /// exactly while its list holds work; only deferred work is indexed
    /// for cancel; `due` compares the head with success plus error.
    #[test]
    fn lists_order_arm_and_index() {
        let mut t = Triggers::default();
        t.insert(work(0, 2, true), 5);
        t.insert(work(1, 2, false), 3);
        t.insert(work(2, 2, true), 3);
        t.insert(work(3, 0, true), 1);
        assert_eq!(t.armed, [2, 0]);
        let order: Vec<u64> = t.lists[2].values().map(|w| w.id).collect();
        assert_eq!(order, [1, 2, 0], "threshold, then submission");
        assert_eq!(t.deferred.len(), 3, "triggered operations are not indexed for cancel");
        // SAFETY: a counter is atomics only; all zero is a valid value.
        let counters: Vec<shm_layout::Counter> = (0..3).map(|_| unsafe { std::mem::zeroed() }).collect();
        assert!(!t.due(&counters));
        counters[2].value.v.store(2, Ordering::Relaxed);
        assert!(!t.due(&counters));
        counters[2].err.v.store(1, Ordering::Relaxed);
        assert!(t.due(&counters), "errors count towards the threshold");
        t.blocked = true;
        assert!(t.remove(2, (3, 1)).is_some());
        assert!(t.remove(2, (3, 1)).is_none(), "removed twice");
        t.remove(2, (3, 2)).unwrap();
        t.remove(2, (5, 0)).unwrap();
        assert_eq!(t.armed, [0]);
        assert!(t.blocked, "work is left");
        t.remove(0, (1, 3)).unwrap();
        assert!(t.armed.is_empty() && t.deferred.is_empty());
        assert!(!t.blocked, "nothing left to retry");
    }

    #[test]
    fn dw_encodes_counter_and_quiet() {
        assert!(Dw::NONE.is_none() && Dw::new(None, false).is_none());
        let d = Dw::new(Some(0), true);
        assert!(!d.is_none() && d.quiet());
        assert_eq!(d.cntr(), Some(0));
        let d = Dw::new(Some(41), false);
        assert_eq!((d.cntr(), d.quiet()), (Some(41), false));
        let d = Dw::new(None, true);
        assert_eq!((d.is_none(), d.cntr(), d.quiet()), (false, None, true));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::engine::complete::{count, Val};
    use loom::sync::Arc;
    use shm_layout::{Counter, Doorbell, PaddedU64};

    /// A peer's count on a counter that work waits on (the release add,
    /// then the doorbell's ring, as `mr::count_remote` does) against the
    /// auto-progress thread going to sleep (announce, then `Watch::due`):
    /// the thread never sleeps through the count (a lost wake-up shows as
    /// a model that never ends).
    #[test]
    fn loom_a_count_that_makes_work_due_wakes_the_sleeper() {
        loom::model(|| {
            let db = Arc::new(Doorbell {
                futex: crate::sync::AtomicU32::new(0),
                sleepers: crate::sync::AtomicU32::new(0),
                watchers: crate::sync::AtomicU32::new(0),
            });
            let c = Arc::new(Counter {
                value: PaddedU64 { v: crate::sync::AtomicU64::new(0) },
                err: PaddedU64 { v: crate::sync::AtomicU64::new(0) },
            });
            // Work waits on counter 0 at threshold 1 (the heads are
            // published before the sleeper looks, under the domain lock).
            let heads = std::sync::Arc::new(std::sync::Mutex::new(vec![(0usize, 1u64)]));
            let watch = Watch { heads, counters: &*c, n: 1 };
            let (d2, c2) = (db.clone(), c.clone());
            let peer = loom::thread::spawn(move || {
                count(&c2, Val::Success, 1);
                crate::doorbell::ring(&d2);
            });
            // SAFETY: the counter lives in `c`, alive for the model.
            while !unsafe { watch.due() } {
                // SAFETY: as above.
                crate::doorbell::wait(&db, || unsafe { watch.due() }, None);
            }
            peer.join().unwrap();
        });
    }
}
