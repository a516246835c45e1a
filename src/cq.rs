//! Completion queues as in fi_cq(3): formats context, msg, data and tagged;
//! `read`, `readfrom`, `readerr` with its error queue (`-FI_EAVAIL` while an
//! error waits), `strerror`, and the overrun state.
//!
//! A CQ is a process-local object of its domain; reading it drives the
//! domain's progress. Progress stops taking inbound messages while a receive
//! CQ holds `size` entries (back-pressure); entries that must be written
//! anyway (completions of work already done) may go past `size`, up to
//! a hard cap (four times `size`, at least `size + 64`); one more puts the CQ
//! in the overrun state, which is
//! fatal as the man page says: after the valid entries, reads return
//! `-FI_EOVERRUN`.
//!
//! Resource management (fi_domain(3), "Resource Management"; turned on for
//! a domain by [`Domain::set_resource_mgmt`](crate::Domain::set_resource_mgmt)
//! before its CQs open): a transmit that will write an entry later (queued,
//! or a rendezvous awaiting its peer) reserves one when it is posted, and a
//! transmit that completes at once needs room for its entry; with neither
//! there, the posting fails with `-FI_EAGAIN` (nothing is taken). The
//! reservation is given back when the entry (success or error) is written,
//! or when the endpoint closes with the transmit still outstanding.
//! Reservations count against `size` for postings only: receive
//! back-pressure compares the entries held with `size`, whatever is
//! reserved (the FIN or RTS that releases a reservation may be queued
//! behind the very message it would hold back: counting reservations
//! there hung endpoints whose sends and receives share a CQ). Receives
//! do not reserve (a posted receive may wait for a long time, and
//! reserving would cap the posted receives at the CQ's size): the receive
//! side keeps to back-pressure, and the message waits in the sender's ring
//! (retried internally, as the man page allows); remote CQ data waits in
//! the target's queue, then in its mailbox. A CQ of such a domain never
//! overruns: what goes past `size` anyway (completions of receives matched
//! while there was room whose data came later, error entries of cancels
//! and flushes) is held until read, not lost. Operations
//! without a success entry (an inject call, FI_SELECTIVE_COMPLETION without
//! FI_COMPLETION, and deferred or triggered work that asked for no entry)
//! reserve nothing, as the man page's restriction allows: their error
//! entries may go past `size` too. Fired deferred or triggered work with
//! an entry due reserves as any posting does, and waits (retried by the
//! trigger path) while the CQ is full.

use crate::error::{Error, ErrorKind, Result};
use crate::flags::{FiAddr, FI_ADDR_NOTAVAIL};
use std::collections::VecDeque;

/// Entry format of a CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CqFormat {
    /// Provider's choice: tagged.
    #[default]
    Unspec,
    /// `fi_cq_entry`.
    Context,
    /// `fi_cq_msg_entry`.
    Msg,
    /// `fi_cq_data_entry`.
    Data,
    /// `fi_cq_tagged_entry`.
    Tagged,
}

/// `struct fi_cq_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqEntry {
    /// Operation context.
    pub op_context: usize,
}

/// `struct fi_cq_msg_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqMsgEntry {
    /// Operation context.
    pub op_context: usize,
    /// Completion flags.
    pub flags: u64,
    /// Bytes received.
    pub len: usize,
}

/// `struct fi_cq_data_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqDataEntry {
    /// Operation context.
    pub op_context: usize,
    /// Completion flags.
    pub flags: u64,
    /// Bytes received.
    pub len: usize,
    /// Where the data went (multi-receive buffers).
    pub buf: usize,
    /// Remote CQ data.
    pub data: u64,
}

/// `struct fi_cq_tagged_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqTaggedEntry {
    /// Operation context.
    pub op_context: usize,
    /// Completion flags.
    pub flags: u64,
    /// Bytes received.
    pub len: usize,
    /// Where the data went (multi-receive buffers).
    pub buf: usize,
    /// Remote CQ data.
    pub data: u64,
    /// Received tag.
    pub tag: u64,
}

/// `struct fi_cq_err_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqErrEntry {
    /// Operation context.
    pub op_context: usize,
    /// Completion flags.
    pub flags: u64,
    /// Bytes delivered.
    pub len: usize,
    /// Receive buffer.
    pub buf: usize,
    /// Remote CQ data.
    pub data: u64,
    /// Tag.
    pub tag: u64,
    /// Bytes that did not fit (truncation).
    pub olen: usize,
    /// Positive fabric errno.
    pub err: i32,
    /// Provider errno (see [`strerror`]).
    pub prov_errno: i32,
    /// Error data owned by the CQ, valid until the next `readerr` on it:
    /// a NUL-terminated description, or (`FI_EADDRNOTAVAIL` with
    /// [`prov::UNKNOWN_SOURCE`]) the source's raw address.
    pub err_data: usize,
    /// Bytes of `err_data`.
    pub err_data_size: usize,
}

/// Provider error codes carried in `prov_errno`.
pub mod prov {
    /// The message was longer than the receive buffer.
    pub const TRUNCATED: i32 = 1;
    /// Single copy from the peer failed (bad address or peer gone).
    pub const CMA_FAULT: i32 = 2;
    /// The peer broke the protocol (bad index, length or order).
    pub const PROTOCOL: i32 = 3;
    /// The peer reported an error for this message.
    pub const REMOTE: i32 = 4;
    /// The peer died (or closed its endpoint) with the operation pending.
    pub const PEER_GONE: i32 = 5;
    /// The endpoint was closed before the receive completed (flushed).
    pub const FLUSHED: i32 = 6;
    /// The application cancelled the receive (fi_cancel).
    pub const CANCELED: i32 = 7;
    /// A peek (FI_PEEK) found no matching message.
    pub const NO_MSG: i32 = 8;
    /// The sender of a claimed message failed before it could be received.
    pub const CLAIM_LOST: i32 = 9;
    /// FI_SOURCE_ERR: the message came from an address not in the AV (the
    /// entry's error data is that address).
    pub const UNKNOWN_SOURCE: i32 = 10;
}

/// Text of a provider errno, as fi_cq_strerror gives it.
pub fn strerror(prov_errno: i32) -> &'static str {
    match prov_errno {
        prov::TRUNCATED => "message longer than the receive buffer: truncated",
        prov::CMA_FAULT => "single copy from the peer's memory failed",
        prov::PROTOCOL => "peer sent a malformed message",
        prov::REMOTE => "peer reported an error for this message",
        prov::PEER_GONE => "peer process died or closed its endpoint",
        prov::FLUSHED => "endpoint closed before the receive completed: flushed",
        prov::CANCELED => "receive cancelled by the application",
        prov::NO_MSG => "no message matched the peek",
        prov::CLAIM_LOST => "the claimed message was lost with its sender",
        prov::UNKNOWN_SOURCE => "message received from an address not in the address vector (error data: the address)",
        _ => "no provider error",
    }
}

/// Keeps [`CqFormatEntry`] to the entry types of this crate.
mod sealed {
    /// Implemented by the four entry types only.
    pub trait Sealed {}
    impl Sealed for super::CqEntry {}
    impl Sealed for super::CqMsgEntry {}
    impl Sealed for super::CqDataEntry {}
    impl Sealed for super::CqTaggedEntry {}
}

/// A CQ entry format usable with [`CompletionQueue::read`](crate::CompletionQueue::read):
/// [`CqEntry`], [`CqMsgEntry`], [`CqDataEntry`] and [`CqTaggedEntry`] only.
/// The read writes entries straight into the caller's array in the layout
/// of [`CqFormatEntry::FORMAT`], so the trait is sealed: a type of another
/// layout claiming a format would be written past (found in session 14's
/// review; a one-byte type claiming `Tagged` took 48-byte entries).
///
/// ```compile_fail
/// use shmfab::{cq::CqFormatEntry, CqFormat, CqTaggedEntry};
/// #[derive(Clone, Copy, Default)]
/// struct Tiny(u8);
/// impl CqFormatEntry for Tiny {
///     const FORMAT: CqFormat = CqFormat::Tagged;
///     fn from_full(_: &CqTaggedEntry) -> Self { Tiny(0) }
/// }
/// ```
pub trait CqFormatEntry: Copy + Default + sealed::Sealed {
    /// The format this type is.
    const FORMAT: CqFormat;
    /// Builds from the full entry.
    fn from_full(e: &CqTaggedEntry) -> Self;
}

impl CqFormatEntry for CqEntry {
    const FORMAT: CqFormat = CqFormat::Context;
    fn from_full(e: &CqTaggedEntry) -> Self {
        CqEntry { op_context: e.op_context }
    }
}
impl CqFormatEntry for CqMsgEntry {
    const FORMAT: CqFormat = CqFormat::Msg;
    fn from_full(e: &CqTaggedEntry) -> Self {
        CqMsgEntry { op_context: e.op_context, flags: e.flags, len: e.len }
    }
}
impl CqFormatEntry for CqDataEntry {
    const FORMAT: CqFormat = CqFormat::Data;
    fn from_full(e: &CqTaggedEntry) -> Self {
        CqDataEntry { op_context: e.op_context, flags: e.flags, len: e.len, buf: e.buf, data: e.data }
    }
}
impl CqFormatEntry for CqTaggedEntry {
    const FORMAT: CqFormat = CqFormat::Tagged;
    fn from_full(e: &CqTaggedEntry) -> Self {
        *e
    }
}

/// How a CQ's blocking reads wait (`fi_wait_obj`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitObj {
    /// FI_WAIT_NONE: no blocking reads (`sread` is refused).
    None,
    /// FI_WAIT_UNSPEC: the provider's choice: sleep on the domain's futex
    /// doorbell, which senders in other processes ring.
    #[default]
    Unspec,
    /// FI_WAIT_YIELD: poll, yielding the CPU between tries.
    Yield,
    /// FI_WAIT_MUTEX_COND: a mutex and condition variable
    /// ([`CompletionQueue::wait_mutex_cond`]) signalled when a completion
    /// may be there (after `Domain::trywait`, by the domain's bridge thread).
    MutexCond,
    /// FI_WAIT_POLLFD: as `Fd`, retrieved as a set of pollfds with a change
    /// index ([`CompletionQueue::wait_pollfd`]).
    PollFd,
    /// FI_WAIT_SET: waits go through the wait set the CQ belongs to
    /// ([`WaitSet`](crate::poll::WaitSet)); the CQ's own `sread` is refused.
    /// The set is named at open ([`WaitSet::cq_open`](crate::poll::WaitSet::cq_open):
    /// `cq_open` refuses `Set` with no set) or later by `add_cq`; a CQ the
    /// set lets go, or whose set is dropped, waits on its own again (`Unspec`).
    Set,
    /// FI_WAIT_FD: a file descriptor ([`CompletionQueue::wait_fd`]) that
    /// poll, select and epoll report readable when a completion may be
    /// there; use [`Domain::trywait`](crate::Domain::trywait) before
    /// blocking on it, as fi_poll(3) shows.
    Fd,
}

/// Wait condition of blocking reads (`fi_cq_wait_cond`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitCond {
    /// Any completion satisfies the wait.
    #[default]
    None,
    /// FI_CQ_COND_THRESHOLD: `sread`'s `cond` is the number of entries to
    /// wait for (a hint: a timeout returns what is there).
    Threshold,
}

/// CQ attributes.
#[derive(Clone, Copy, Debug, Default)]
pub struct CqAttr {
    /// Entries (0: provider default, 1024).
    pub size: usize,
    /// Entry format.
    pub format: CqFormat,
    /// Wait object for `sread`.
    pub wait_obj: WaitObj,
    /// Wait condition for `sread`.
    pub wait_cond: WaitCond,
}

/// The successful completions of a CQ, oldest first: a ring buffer whose
/// slots are written field by field (a queue that moves whole entries
/// copies them through the stack, re-reading wide what was just written
/// narrow: a store-forwarding stall on every completion).
#[derive(Default)]
pub(crate) struct EntryQueue {
    slots: Vec<(CqTaggedEntry, FiAddr)>,
    head: usize,
    len: usize,
}

impl EntryQueue {
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    pub fn push(&mut self, e: &CqTaggedEntry, src: FiAddr) {
        if self.len == self.slots.len() {
            self.grow();
        }
        let mut i = self.head + self.len;
        if i >= self.slots.len() {
            i -= self.slots.len();
        }
        let s = &mut self.slots[i];
        s.0.op_context = e.op_context;
        s.0.flags = e.flags;
        s.0.len = e.len;
        s.0.buf = e.buf;
        s.0.data = e.data;
        s.0.tag = e.tag;
        s.1 = src;
        self.len += 1;
    }

    #[inline]
    pub fn pop(&mut self) -> Option<(CqTaggedEntry, FiAddr)> {
        if self.len == 0 {
            return None;
        }
        let e = self.slots[self.head];
        self.head += 1;
        if self.head == self.slots.len() {
            self.head = 0;
        }
        self.len -= 1;
        Some(e)
    }

    /// Moves the `out.len()` oldest entries (the caller checked that many
    /// are held) into `out`, and their sources into `src` if given (as
    /// long as `out`): one pass with the position in a register, the
    /// count updated once.
    #[inline(always)]
    pub fn take_into<T: CqFormatEntry>(&mut self, out: &mut [T], mut src: Option<&mut [FiAddr]>) {
        let n = out.len();
        assert!(n <= self.len, "taking more entries than held");
        let cap = self.slots.len();
        let mut h = self.head;
        for (i, slot) in out.iter_mut().enumerate() {
            let (e, a) = &self.slots[h];
            *slot = T::from_full(e);
            if let Some(s) = src.as_deref_mut() {
                s[i] = *a;
            }
            h += 1;
            if h == cap {
                h = 0;
            }
        }
        self.head = h;
        self.len -= n;
    }

    /// Doubles the ring (at least 64 slots), oldest entry first.
    #[cold]
    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(64);
        let mut v = Vec::with_capacity(cap);
        while let Some(e) = self.pop() {
            v.push(e);
        }
        self.len = v.len();
        self.head = 0;
        v.resize(cap, (CqTaggedEntry::default(), 0));
        self.slots = v;
    }
}

/// The caller's entry array (and source array) of a read in progress.
/// While it has room, completions that the read's own progress pass
/// writes go there directly, in the CQ's format, instead of being queued
/// and copied out again. Open only inside [`CompletionQueue::read`] and
/// `readfrom`, under the domain lock, and only while nothing older waits in
/// the CQ (an error entry closes it: later entries queue behind it).
///
/// Closed, `cap` and `plain` are 0 (so no entry goes through `out` or
/// `src`, whatever they and `len` still hold: a close stores two words).
pub(crate) struct Sink {
    /// `cap` entries of the CQ's format.
    out: *mut u8,
    /// `cap` source addresses, or null.
    src: *mut FiAddr,
    cap: usize,
    len: usize,
    /// `cap` when the sink takes entries as they are (the CQ's format is
    /// the tagged one, and no source array), else 0: one compare of
    /// [`CqState::sink_write_plain`]. Cut with `cap`.
    plain: usize,
}

// SAFETY: the pointers are set only while the thread that owns them holds
// the domain lock in a read, and the sink is closed (nothing is written
// through them again) before that read returns.
unsafe impl Send for Sink {}

impl Sink {
    const CLOSED: Sink = Sink { out: std::ptr::null_mut(), src: std::ptr::null_mut(), cap: 0, len: 0, plain: 0 };

    /// Closes the sink; returns how many entries it took.
    #[inline(always)]
    fn close(&mut self) -> usize {
        self.cap = 0;
        self.plain = 0;
        self.len
    }
}

/// In-process state of a CQ.
pub(crate) struct CqState {
    /// Format fixed at open.
    pub format: CqFormat,
    /// Soft capacity.
    pub size: usize,
    /// `size` less the entries reserved by outstanding transmits (resource
    /// management): progress and postings see room while the entries held
    /// are below it. Invariant: `limit <= size`; equal to `size` when
    /// resource management is off (nothing reserves).
    limit: usize,
    /// Resource management is on (its domain's, fixed at open): postings
    /// reserve, and the CQ never overruns.
    rm: bool,
    /// Most entries held before the CQ overruns: four times `size`, and at
    /// least 64 more than it (`usize::MAX` with resource management: never).
    hard_cap: usize,
    /// Successful completions with their source fi_addr.
    pub entries: EntryQueue,
    /// Error completions with their error data.
    pub errors: VecDeque<(CqErrEntry, ErrData)>,
    /// Set once an entry was lost; fatal.
    pub overrun: bool,
    /// Keeps the last error's data alive for `err_data`: its first
    /// `last_err_len` bytes (a text is followed by a NUL).
    pub last_err: Vec<u8>,
    last_err_len: usize,
    pub wait_obj: WaitObj,
    pub wait_cond: WaitCond,
    /// The eventfd of an FD wait object.
    pub fd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Completion notification (channel, context, arming).
    pub notify: Option<crate::notify::Notify>,
    /// The mutex/condvar of a MutexCond wait object.
    pub cond: Option<std::sync::Arc<crate::fdwait::MutexCond>>,
    /// The read in progress's array, if open (see [`Sink`]).
    sink: Sink,
    /// Reads in a row that returned entries the CQ already held without a
    /// progress pass (see [`CompletionQueue::read`]); at most
    /// [`MAX_UNPROGRESSED`].
    unprogressed: u8,
    /// In a thread-safe domain, its doorbell: an entry queued by one
    /// thread's call or pass rings it, for a thread asleep on this CQ
    /// (`sread`, a wait set, the fd bridge) re-checked before that
    /// entry came. None with `Threading::Domain` (no other thread is in
    /// the domain during a call).
    pub wake: Option<std::ptr::NonNull<shm_layout::Doorbell>>,
}

// SAFETY: `wake` points into the domain's region, which outlives every CQ
// state (both belong to the domain); the doorbell is all atomics.
unsafe impl Send for CqState {}

impl crate::table::Object for CqState {
    const NAME: &'static str = "CQ";
    const BOUND_BY: &'static str = "endpoints, poll or wait sets";
}

impl CqState {
    pub fn new(attr: &CqAttr, rm: bool) -> CqState {
        let size = if attr.size == 0 { 1024 } else { attr.size };
        CqState {
            format: if attr.format == CqFormat::Unspec { CqFormat::Tagged } else { attr.format },
            size,
            limit: size,
            rm,
            hard_cap: if rm { usize::MAX } else { size.saturating_mul(4).max(size + 64) },
            entries: EntryQueue::default(),
            errors: VecDeque::new(),
            overrun: false,
            last_err: Vec::new(),
            last_err_len: 0,
            wait_obj: attr.wait_obj,
            wait_cond: attr.wait_cond,
            fd: None,
            notify: None,
            cond: None,
            sink: Sink::CLOSED,
            unprogressed: 0,
            wake: None,
        }
    }

    /// Most entries held before the CQ overruns (computed once: checked
    /// on every completion).
    pub fn hard_cap(&self) -> usize {
        self.hard_cap
    }

    /// Whether a transmit may be posted (resource management) or complete
    /// at once: the entries held and reserved are below `size`.
    #[inline]
    pub fn has_room(&self) -> bool {
        !self.overrun && self.entries.len() + self.errors.len() < self.limit
    }

    /// Whether progress may take another inbound message for this CQ: the
    /// entries held are below `size`. Reservations do not count here: the
    /// FIN or RTS that will release one may sit in a ring behind the
    /// message being held back, so counting them could stall a shared CQ
    /// for good with nothing to read. A reserved transmit's entry may then
    /// go past `size` when it is written: held, as a resource-managed CQ
    /// holds every entry, never lost (at most `size` plus the reserved).
    #[inline]
    pub fn rx_room(&self) -> bool {
        !self.overrun && self.entries.len() + self.errors.len() < self.size
    }

    /// Whether resource management is on for this CQ.
    #[inline(always)]
    pub fn rm(&self) -> bool {
        self.rm
    }

    /// Reserves an entry for an outstanding transmit if there is room
    /// ([`CqState::has_room`]); false, having taken nothing, if not.
    #[inline]
    pub fn reserve(&mut self) -> bool {
        if !self.has_room() {
            return false;
        }
        self.limit -= 1;
        true
    }

    /// Gives back `n` reservations (their entries were written, or their
    /// transmits dropped).
    #[inline]
    pub fn release(&mut self, n: usize) {
        // Releasing more than was reserved would be a bug on a completion
        // path: caught in tests, clamped (never wrapping) otherwise.
        debug_assert!(self.limit + n <= self.size, "released more than reserved");
        self.limit = self.limit.saturating_add(n).min(self.size);
    }

    /// Entries reserved by outstanding transmits.
    pub fn reserved(&self) -> usize {
        self.size - self.limit
    }

    /// Whether the next successful entry needs its source address: it will
    /// be queued (a `readfrom` may ask for it later), or the open sink has
    /// a source array. A plain read that takes it directly does not.
    #[inline(always)]
    pub fn wants_src(&self) -> bool {
        self.sink.len >= self.sink.cap || !self.sink.src.is_null()
    }

    /// Writes a successful entry straight into the open sink if that is
    /// all it needs: the sink has room and takes tagged entries with no
    /// source array (one compare, see `Sink::plain`), and no completion
    /// channel is attached. Returns whether it did.
    #[inline(always)]
    pub fn sink_write_plain(&mut self, e: &CqTaggedEntry) -> bool {
        if self.sink.len >= self.sink.plain || self.notify.is_some() {
            return false;
        }
        let k = &mut self.sink;
        // SAFETY: plain > len, so the sink is open on the caller's array of
        // `cap >= plain` tagged entries (open_sink), alive and exclusively
        // ours until the read that opened it closes it.
        unsafe { (k.out as *mut CqTaggedEntry).add(k.len).write(*e) };
        k.len += 1;
        true
    }

    /// Whether [`CqState::sink_write_plain`] would take an entry now
    /// (then [`CqState::sink_put_plain`] writes it). Implies
    /// [`CqState::rx_room`]: a sink opens only on a CQ that holds nothing
    /// and is not overrun, and while it takes entries none are queued.
    #[inline(always)]
    pub fn sink_plain_room(&self) -> bool {
        let room = self.sink.len < self.sink.plain && self.notify.is_none();
        debug_assert!(!room || self.rx_room());
        room
    }

    /// Writes a successful entry into the open sink, as
    /// [`CqState::sink_write_plain`] does when it returns true.
    ///
    /// # Safety
    /// [`CqState::sink_plain_room`] said so, and the CQ did not change since.
    #[inline(always)]
    pub unsafe fn sink_put_plain(&mut self, e: &CqTaggedEntry) {
        let k = &mut self.sink;
        debug_assert!(k.len < k.plain && k.plain <= k.cap);
        // SAFETY: plain > len (the caller's contract), so the sink is open
        // on the caller's array of `cap >= plain` tagged entries
        // (open_sink), alive and exclusively ours until the read that
        // opened it closes it.
        unsafe { (k.out as *mut CqTaggedEntry).add(k.len).write(*e) };
        k.len += 1;
    }

    /// Whether a completion's signal matters: a completion channel is
    /// attached.
    #[inline(always)]
    pub fn notifies(&self) -> bool {
        self.notify.is_some()
    }

    #[inline(always)]
    pub fn push(&mut self, e: CqTaggedEntry, src: FiAddr) {
        self.push_ext(e, src, crate::notify::Signal::Normal)
    }

    /// As `push`, signalling an armed channel as `sig` says. Inlined so the
    /// entry is built in its queue slot (not built on the stack field by
    /// field and re-read wide: a store-forwarding stall).
    #[inline(always)]
    pub fn push_ext(&mut self, e: CqTaggedEntry, src: FiAddr, sig: crate::notify::Signal) {
        if self.sink.len < self.sink.cap {
            // The reader is this call's caller: nobody to wake.
            self.sink_write(&e, src);
        } else {
            self.queue(e, src);
            if let Some(db) = self.wake {
                crate::doorbell::ring_own(db);
            }
        }
        if let Some(n) = self.notify.as_mut() {
            n.on_completion(sig);
        }
    }

    /// Queues a successful entry (or overruns).
    #[inline(always)]
    fn queue(&mut self, e: CqTaggedEntry, src: FiAddr) {
        if self.overrun || self.entries.len() + self.errors.len() >= self.hard_cap() {
            self.overrun = true;
            return;
        }
        self.entries.push(&e, src);
    }

    /// Writes an entry into the open sink, which has room.
    #[inline(always)]
    pub fn sink_write(&mut self, e: &CqTaggedEntry, src: FiAddr) {
        let k = &mut self.sink;
        debug_assert!(k.len < k.cap);
        // SAFETY: the sink was opened on the caller's array of `cap` entries
        // of this CQ's format (checked in open_sink), alive and exclusively
        // ours until the read that opened it closes it; len < cap.
        unsafe {
            match self.format {
                CqFormat::Context => (k.out as *mut CqEntry).add(k.len).write(CqEntry::from_full(e)),
                CqFormat::Msg => (k.out as *mut CqMsgEntry).add(k.len).write(CqMsgEntry::from_full(e)),
                CqFormat::Data => (k.out as *mut CqDataEntry).add(k.len).write(CqDataEntry::from_full(e)),
                CqFormat::Tagged | CqFormat::Unspec => (k.out as *mut CqTaggedEntry).add(k.len).write(*e),
            }
            if !k.src.is_null() {
                k.src.add(k.len).write(src);
            }
        }
        k.len += 1;
    }

    /// Whether this read may return the entries the CQ holds without a
    /// progress pass first: it holds successful entries and no error, and
    /// fewer than [`MAX_UNPROGRESSED`] reads in a row did so (then the
    /// count starts again, and this read runs the pass). The entries are
    /// complete already; a pass would only add later ones behind them.
    /// The bound keeps the engine moving for a caller whose CQ is never
    /// empty when it reads (an RMA to the shared heap completes in its
    /// call): its peers' messages and mailbox requests wait at most that
    /// many reads.
    #[inline]
    fn take_unprogressed(&mut self) -> bool {
        if self.entries.is_empty() || !self.errors.is_empty() || self.unprogressed >= MAX_UNPROGRESSED {
            self.unprogressed = 0;
            return false;
        }
        self.unprogressed += 1;
        true
    }

    /// Whether `out` (and `src`) are arguments [`CqState::read`] takes:
    /// the CQ's format, one entry at least, a source per entry.
    #[inline(always)]
    fn args_fit<T: CqFormatEntry>(&self, out: &[T], src: Option<&[FiAddr]>) -> bool {
        T::FORMAT == self.format && !out.is_empty() && src.is_none_or(|s| s.len() >= out.len())
    }

    /// No entry, no error entry, not overrun: one test of the three
    /// words or'ed (a test and a branch each, apart).
    #[inline(always)]
    fn holds_nothing(&self) -> bool {
        (self.entries.len() | self.errors.len() | self.overrun as usize) == 0
    }

    /// Opens the sink on `out` (and `src`) if a read may take entries
    /// straight from progress: arguments valid for [`CqState::read`] and
    /// nothing waiting in the CQ (nor overrun). Returns whether it did.
    fn open_sink<T: CqFormatEntry>(&mut self, out: &mut [T], src: Option<&mut [FiAddr]>) -> bool {
        if !self.args_fit(out, src.as_deref()) || !self.holds_nothing() {
            return false;
        }
        // The format is T's (args_fit): known at compile time, as is
        // whether a source array came.
        let plain = src.is_none() && T::FORMAT == CqFormat::Tagged;
        self.sink = Sink {
            out: out.as_mut_ptr() as *mut u8,
            src: src.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            cap: out.len(),
            len: 0,
            plain: if plain { out.len() } else { 0 },
        };
        true
    }

    pub fn push_err(&mut self, e: CqErrEntry, detail: String) {
        self.push_err_data(e, ErrData::Text(detail))
    }

    /// As `push_err`, with raw error data (FI_SOURCE_ERR's address).
    pub fn push_err_data(&mut self, e: CqErrEntry, detail: impl Into<ErrData>) {
        let detail = detail.into();
        // Entries after this one queue behind it, as reads must see them.
        // (Open, len <= cap; closed, both stay 0.)
        self.sink.cap = self.sink.cap.min(self.sink.len);
        self.sink.plain = self.sink.plain.min(self.sink.len);
        if self.overrun || self.entries.len() + self.errors.len() >= self.hard_cap() {
            self.overrun = true;
            return;
        }
        self.errors.push_back((e, detail));
        if let Some(db) = self.wake {
            crate::doorbell::ring_own(db);
        }
        if let Some(n) = self.notify.as_mut() {
            n.on_completion(crate::notify::Signal::Solicited);
        }
    }

    /// fi_cq_read(from): entries in `out`, sources in `src` if given.
    pub fn read<T: CqFormatEntry>(&mut self, out: &mut [T], src: Option<&mut [FiAddr]>) -> Result<usize> {
        if T::FORMAT != self.format {
            return Err(Error::with(
                ErrorKind::Inval,
                format!("CQ format is {:?}, read asked for {:?}", self.format, T::FORMAT),
            ));
        }
        if let Some(s) = &src {
            if s.len() < out.len() {
                return Err(Error::with(ErrorKind::Inval, "src_addr needs as many entries as count"));
            }
        }
        if out.is_empty() {
            return Err(Error::with(ErrorKind::Inval, "count must be at least 1"));
        }
        if !self.errors.is_empty() {
            return Err(Error::new(ErrorKind::Avail));
        }
        let n = out.len().min(self.entries.len());
        if n == 0 {
            return Err(if self.overrun { Error::new(ErrorKind::Overrun) } else { Error::AGAIN });
        }
        self.entries.take_into(&mut out[..n], src.map(|s| &mut s[..n]));
        Ok(n)
    }

    /// [`CqState::read`] of a CQ that holds entries and no error
    /// ([`CqState::take_unprogressed`] said so): with valid arguments,
    /// the take without the read's checks again (callgrind, rma_ops: a
    /// put and its CQ read 678 -> 662 instructions). Out of line, so that the empty
    /// poll's path stays as it was (196 instructions per empty read, 745
    /// per 8 B half trip); inline in `read_impl` it saved 48 a read but
    /// cost the empty read and the half trip 3 each.
    #[inline(never)]
    fn read_held<T: CqFormatEntry>(&mut self, out: &mut [T], src: Option<&mut [FiAddr]>) -> Result<usize> {
        if self.args_fit(out, src.as_deref()) {
            let n = out.len().min(self.entries.len());
            self.entries.take_into(&mut out[..n], src.map(|s| &mut s[..n]));
            return Ok(n);
        }
        self.read(out, src)
    }

    /// fi_cq_readerr.
    pub fn readerr(&mut self) -> Result<CqErrEntry> {
        let Some((mut e, detail)) = self.errors.pop_front() else {
            return Err(if self.overrun { Error::new(ErrorKind::Overrun) } else { Error::AGAIN });
        };
        (self.last_err, self.last_err_len) = match detail {
            ErrData::Text(t) => {
                let mut v = t.replace('\0', " ").into_bytes();
                let n = v.len();
                v.push(0);
                (v, n)
            }
            ErrData::Raw(v) => {
                let n = v.len();
                (v, n)
            }
        };
        e.err_data = self.last_err.as_ptr() as usize;
        e.err_data_size = self.last_err_len;
        Ok(e)
    }

    /// The last error's data, for [`CqErrEntry::err_data`].
    pub fn last_err_data(&self) -> &[u8] {
        &self.last_err[..self.last_err_len]
    }

    /// Text of the last error read, for [`CqErrEntry::err_data`].
    pub fn last_err_text(&self) -> String {
        String::from_utf8_lossy(self.last_err_data()).into_owned()
    }
}

/// The error data of an error entry: a text (NUL-terminated where
/// `err_data` points), or raw bytes (FI_SOURCE_ERR's source address).
pub(crate) enum ErrData {
    Text(String),
    Raw(Vec<u8>),
}

impl From<String> for ErrData {
    fn from(t: String) -> ErrData {
        ErrData::Text(t)
    }
}

impl From<Vec<u8>> for ErrData {
    fn from(v: Vec<u8>) -> ErrData {
        ErrData::Raw(v)
    }
}

/// Source address placeholder for entries with no source.
pub(crate) const NO_SRC: FiAddr = FI_ADDR_NOTAVAIL;

/// A completion queue.
pub struct CompletionQueue {
    pub(crate) dom: std::sync::Arc<crate::domain::DomainInner>,
    pub(crate) id: usize,
    closed: std::sync::atomic::AtomicBool,
    /// Set by `signal` (any thread), taken by a blocked `sread`.
    signaled: std::sync::atomic::AtomicBool,
    /// The eventfd of an FD wait object (also in the state).
    fd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

impl crate::Domain {
    /// Opens a CQ (fi_cq_open).
    pub fn cq_open(&self, attr: &CqAttr) -> Result<CompletionQueue> {
        if attr.size > 1 << 24 {
            return Err(Error::with(ErrorKind::Inval, "CQ size above 16M entries"));
        }
        if attr.wait_obj == WaitObj::Set {
            return Err(Error::with(
                ErrorKind::Inval,
                "FI_WAIT_SET names its wait set: open the CQ with WaitSet::cq_open (or add it with WaitSet::add_cq)",
            ));
        }
        let mut st = self.inner.lock()?;
        let mut s = CqState::new(attr, st.rm);
        if self.inner.threading == crate::Threading::Safe {
            s.wake = Some(std::ptr::NonNull::from(&self.inner.region.header().doorbell));
        }
        if matches!(attr.wait_obj, WaitObj::Fd | WaitObj::PollFd | WaitObj::MutexCond) {
            let mut b = self.inner.bridge.lock().unwrap_or_else(|p| p.into_inner());
            let b = b.get_or_insert_with(|| crate::fdwait::Bridge::start(&self.inner.region.header().doorbell));
            if attr.wait_obj == WaitObj::MutexCond {
                let c = std::sync::Arc::new(crate::fdwait::MutexCond::default());
                b.add_cond(c.clone());
                s.cond = Some(c);
            } else {
                let fd = crate::fdwait::eventfd()?;
                b.add(fd.clone());
                s.fd = Some(fd);
            }
        }
        let fd = s.fd.clone();
        let id = st.cqs.insert(s);
        Ok(CompletionQueue { dom: self.inner.clone(), id, closed: false.into(), signaled: false.into(), fd })
    }
}

/// Most reads in a row that return held entries without a progress pass
/// (see [`CqState::take_unprogressed`]).
const MAX_UNPROGRESSED: u8 = 8;

/// A read that found nothing ends with a pause ([`crate::sync::idle_pause`]).
#[inline(always)]
fn idle_hint<T>(r: Result<T>) -> Result<T> {
    if r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Again) {
        crate::sync::idle_pause();
    }
    r
}

/// The domain lock, held while a CQ's sink is open; closes the sink when
/// dropped (see [`CompletionQueue::read`]).
struct SinkOpen<'a> {
    st: crate::sync::DomainGuard<'a, crate::domain::DomainState>,
    id: usize,
    /// Closed already (the drop has nothing left to do).
    closed: bool,
}

impl SinkOpen<'_> {
    /// Closes the sink; returns how many entries it took.
    #[inline(always)]
    fn close(&mut self) -> usize {
        self.closed = true;
        self.st.cqs.get_mut(self.id).map_or(0, |c| c.sink.close())
    }
}

impl Drop for SinkOpen<'_> {
    #[inline]
    fn drop(&mut self) {
        if !self.closed {
            self.close();
        }
    }
}

impl CompletionQueue {
    fn with<R>(&self, progress: bool, f: impl FnOnce(&mut CqState) -> Result<R>) -> Result<R> {
        let mut st = self.dom.lock()?;
        if progress {
            self.dom.progress(&mut st);
        }
        // Checked under the lock, as in read_impl: checked before it, a
        // close from another thread in between freed the slot (the lookup
        // panicked) or let another CQ take it (the call then acted on
        // that CQ; session 14's review).
        f(self.state_in(&mut st.cqs)?)
    }

    /// This CQ's state in `cqs` (the domain's, under its lock), or Inval
    /// if the handle is closed. The handle's mark decides, not the slot: a
    /// closed handle's slot may hold a CQ opened since (session 14's
    /// review), and `close` sets the mark under the lock.
    pub(crate) fn state_in<'a>(&self, cqs: &'a mut crate::table::Slots<CqState>) -> Result<&'a mut CqState> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "CQ is closed"));
        }
        cqs.get_mut(self.id).ok_or_else(|| Error::with(ErrorKind::Inval, "CQ is closed"))
    }

    /// fi_cq_read: drives progress, then returns up to `out.len()` entries;
    /// `-FI_EAGAIN` when none, `-FI_EAVAIL` while an error entry waits.
    pub fn read<T: CqFormatEntry>(&self, out: &mut [T]) -> Result<usize> {
        self.read_impl(out, None)
    }

    /// fi_cq_readfrom: as `read`, with each entry's source address
    /// (FI_ADDR_NOTAVAIL when the source is not in the bound AV).
    pub fn readfrom<T: CqFormatEntry>(&self, out: &mut [T], src: &mut [FiAddr]) -> Result<usize> {
        self.read_impl(out, Some(src))
    }

    /// `read` and `readfrom`: when the CQ holds nothing, the progress pass
    /// writes this read's entries straight into `out` (see [`Sink`]); when
    /// it holds entries, they are returned without a pass, up to
    /// [`MAX_UNPROGRESSED`] reads in a row (see
    /// [`CqState::take_unprogressed`]): an RMA into the shared heap, whose
    /// entry is there when its call returns, then costs no pass to read
    /// (fetch-add + CQ read 945 -> 816 instructions, measured by the RMA
    /// work of session 12).
    #[inline(always)]
    fn read_impl<T: CqFormatEntry>(&self, out: &mut [T], mut src: Option<&mut [FiAddr]>) -> Result<usize> {
        let mut st = self.dom.lock()?;
        // Read under the lock: `close` frees the state and sets the mark
        // under it, so the CQ is open and its state live while the lock is
        // held (the lookups below need no test).
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "CQ is closed"));
        }
        // SAFETY: the CQ is open (checked above under the lock), so its
        // slot holds its state.
        let c = unsafe { st.cqs.get_live_mut(self.id) };
        if !c.open_sink(out, src.as_deref_mut()) {
            if c.take_unprogressed() {
                return c.read_held(out, src);
            }
            self.dom.progress(&mut st);
            // SAFETY: as for `c` (a pass opens and closes no CQ).
            return idle_hint(unsafe { st.cqs.get_live_mut(self.id) }.read(out, src));
        }
        // The guard closes the sink however progress ends (a panic must not
        // leave it pointing at this call's arrays), before the lock goes.
        let mut g = SinkOpen { st, id: self.id, closed: false };
        self.dom.progress(&mut g.st);
        // Closed here, with the one lookup of the CQ that the rest uses.
        g.closed = true;
        // SAFETY: as above: the lock is still held, and a progress pass
        // neither opens nor closes CQs (it holds their slots, not the
        // table).
        let c = unsafe { g.st.cqs.get_live_mut(self.id) };
        let n = c.sink.close();
        if n > 0 {
            return Ok(n);
        }
        if c.holds_nothing() {
            // Nothing came and nothing waits: the common empty poll, which
            // skips the CQ's own read.
            crate::sync::idle_pause();
            return Err(Error::AGAIN);
        }
        idle_hint(c.read(out, src))
    }

    /// fi_cq_sread: as `read`, but waits (without spinning, with the
    /// Unspec wait object) until a completion is there, or, with
    /// FI_CQ_COND_THRESHOLD, until `cond` entries are (at most `out.len()`;
    /// `-FI_EINVAL` above the CQ's size, which it never holds). `timeout`:
    /// `None` waits forever, `Some(d)` at most `d` (`Some(Duration::ZERO)`:
    /// one try). `-FI_EAGAIN` on timeout or when `signal` interrupts.
    pub fn sread<T: CqFormatEntry>(
        &self,
        out: &mut [T],
        cond: Option<usize>,
        timeout: Option<std::time::Duration>,
    ) -> Result<usize> {
        self.sread_impl(out, None, cond, timeout)
    }

    /// fi_cq_sreadfrom: `sread` with source addresses.
    pub fn sreadfrom<T: CqFormatEntry>(
        &self,
        out: &mut [T],
        src: &mut [FiAddr],
        cond: Option<usize>,
        timeout: Option<std::time::Duration>,
    ) -> Result<usize> {
        self.sread_impl(out, Some(src), cond, timeout)
    }

    fn sread_impl<T: CqFormatEntry>(
        &self,
        out: &mut [T],
        mut src: Option<&mut [FiAddr]>,
        cond: Option<usize>,
        timeout: Option<std::time::Duration>,
    ) -> Result<usize> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let (wait_obj, wait_cond, size) = self.with(false, |c| Ok((c.wait_obj, c.wait_cond, c.size)))?;
        if wait_obj == WaitObj::None || wait_obj == WaitObj::Set {
            return Err(Error::with(
                ErrorKind::Inval,
                format!("CQ wait object is {wait_obj:?}: its own blocking reads are not allowed"),
            ));
        }
        let want = match wait_cond {
            WaitCond::Threshold => cond.unwrap_or(1).clamp(1, out.len().max(1)),
            WaitCond::None => 1,
        };
        if want > size {
            // Back-pressure keeps the CQ at `size` entries: a threshold
            // above it would be waited for forever.
            return Err(Error::with(
                ErrorKind::Inval,
                format!("sread threshold {want} is above the CQ's size {size}: it can never be reached"),
            ));
        }
        let deadline = crate::domain::deadline(timeout);
        loop {
            if self.signaled.swap(false, AcqRel) {
                return Err(Error::with(ErrorKind::Again, "interrupted by cq_signal"));
            }
            let timed_out = deadline.is_some_and(|d| std::time::Instant::now() >= d);
            let ready = self.with(true, |c| {
                let n = c.entries.len();
                if !c.errors.is_empty() || c.overrun || n >= want || (timed_out && n > 0) {
                    c.read(out, src.as_deref_mut()).map(Some)
                } else {
                    Ok(None)
                }
            })?;
            if let Some(n) = ready {
                return Ok(n);
            }
            if timed_out {
                return Err(Error::AGAIN);
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            match wait_obj {
                WaitObj::Yield => std::thread::yield_now(),
                _ => {
                    let dom = crate::Domain { inner: self.dom.clone() };
                    // The re-check before sleeping also looks at the CQ:
                    // entries made by another thread (the progress
                    // thread) must not be slept through.
                    let ready = || {
                        self.signaled.load(Acquire)
                            || self
                                .with(false, |c| Ok(!c.errors.is_empty() || c.overrun || c.entries.len() >= want))
                                .unwrap_or(true)
                    };
                    dom.wait_for(left, ready);
                }
            }
        }
    }

    /// FI_GETWAIT for an FD wait object: the fd to poll (readable when a
    /// completion may be there; call `Domain::trywait` before blocking).
    pub fn wait_fd(&self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.with(false, |c| {
            c.fd.as_ref().map(|f| f.as_raw_fd()).ok_or_else(|| {
                Error::with(ErrorKind::NoSys, format!("CQ wait object is {:?}, not Fd: no fd to retrieve", c.wait_obj))
            })
        })
    }

    /// fi_cq_signal: wakes a thread blocked in `sread` on this CQ (from any
    /// thread, whatever the domain's threading); it returns `-FI_EAGAIN`.
    /// An FD wait object's fd becomes readable.
    pub fn signal(&self) -> Result<()> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "CQ is closed"));
        }
        // SYNC: the flag is published before the doorbell bump that wakes
        // the sleeper; pairs with the acquire swap in sread_impl.
        self.signaled.store(true, std::sync::atomic::Ordering::Release);
        crate::doorbell::wake_all(&self.dom.region.header().doorbell);
        if let Some(fd) = &self.fd {
            crate::fdwait::poke(fd);
        }
        Ok(())
    }

    /// fi_cq_readerr: the next error entry; its `err_data` stays valid until
    /// the next `readerr`.
    pub fn readerr(&self) -> Result<CqErrEntry> {
        self.with(false, |c| c.readerr())
    }

    /// fi_cq_readerr into the caller's error-data buffer (fi_cq(3), API
    /// 1.5 on): the next error entry, with as much of its error text as
    /// fits copied into `data` while the CQ is held, so that another
    /// thread's `readerr` cannot replace the text during the copy. Returns
    /// the entry (its `err_data` still names the CQ's own copy) and the
    /// bytes copied.
    pub fn readerr_into(&self, data: &mut [u8]) -> Result<(CqErrEntry, usize)> {
        self.with(false, |c| {
            let e = c.readerr()?;
            let text = c.last_err_data();
            let n = text.len().min(data.len());
            data[..n].copy_from_slice(&text[..n]);
            Ok((e, n))
        })
    }

    /// The text of the last error entry read (what `err_data` points at).
    pub fn last_error_text(&self) -> Result<String> {
        self.with(false, |c| Ok(c.last_err_text()))
    }

    /// fi_cq_strerror.
    pub fn strerror(&self, prov_errno: i32) -> &'static str {
        strerror(prov_errno)
    }

    /// FI_GETWAIT for FI_WAIT_MUTEX_COND: the mutex (holding a generation)
    /// and condvar signalled when a completion may be there.
    pub fn wait_mutex_cond(&self) -> Result<std::sync::Arc<crate::fdwait::MutexCond>> {
        self.with(false, |c| {
            c.cond.clone().ok_or_else(|| {
                Error::with(ErrorKind::NoSys, format!("CQ wait object is {:?}, not MutexCond", c.wait_obj))
            })
        })
    }

    /// FI_GETWAIT for FI_WAIT_POLLFD (struct fi_wait_pollfd): fills `fds`
    /// and sets `nfds` to the number of fds; returns the change index (it
    /// changes when the set of fds does). `-FI_ETOOSMALL` with `nfds` set to
    /// the number needed when `fds` is too short.
    pub fn wait_pollfd(&self, fds: &mut [libc::pollfd], nfds: &mut usize) -> Result<u64> {
        use std::os::fd::AsRawFd;
        self.with(false, |c| {
            let fd = match (&c.fd, c.wait_obj) {
                (Some(f), WaitObj::PollFd) => f.as_raw_fd(),
                _ => {
                    return Err(Error::with(
                        ErrorKind::NoSys,
                        format!("CQ wait object is {:?}, not PollFd", c.wait_obj),
                    ))
                }
            };
            *nfds = 1;
            if fds.is_empty() {
                return Err(Error::with(ErrorKind::TooSmall, "fi_wait_pollfd needs room for 1 fd"));
            }
            fds[0] = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // One eventfd for the CQ's life: the set never changes.
            Ok(1)
        })
    }

    /// FI_GETWAITOBJ: the wait object in force.
    pub fn wait_obj(&self) -> Result<WaitObj> {
        self.with(false, |c| Ok(c.wait_obj))
    }

    /// Entries reserved by this CQ's outstanding transmits (resource
    /// management, see [`Domain::set_resource_mgmt`](crate::Domain::set_resource_mgmt)):
    /// they count against its size until their completions are written.
    /// Always 0 without resource management.
    pub fn reserved(&self) -> Result<usize> {
        self.with(false, |c| Ok(c.reserved()))
    }

    /// The entry format in force.
    pub fn format(&self) -> Result<CqFormat> {
        self.with(false, |c| Ok(c.format))
    }

    /// Closes the CQ; `Busy` while endpoints are bound to it.
    pub fn close(&self) -> Result<()> {
        let mut st = self.dom.lock()?;
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let c = st.cqs.close(self.id)?;
        if let Some(n) = c.notify {
            n.chan_detached();
        }
        let cond = c.cond;
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(b) = self.dom.bridge.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            if let Some(fd) = &self.fd {
                b.remove(fd);
            }
            if let Some(c) = &cond {
                b.remove_cond(c);
            }
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if self.close().is_err() {
            let Ok(mut st) = self.dom.lock() else { return };
            st.cqs.orphan(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(ctx: usize) -> CqTaggedEntry {
        CqTaggedEntry { op_context: ctx, flags: 1, len: 2, buf: 3, data: 4, tag: 5 }
    }

    #[test]
    fn format_is_checked_and_entries_convert() {
        let mut cq = CqState::new(&CqAttr { size: 4, format: CqFormat::Msg, ..Default::default() }, false);
        cq.push(full(9), 7);
        let mut t = [CqTaggedEntry::default(); 1];
        assert_eq!(cq.read(&mut t, None).unwrap_err().kind(), ErrorKind::Inval);
        let mut m = [CqMsgEntry::default(); 2];
        let mut src = [0u64; 2];
        assert_eq!(cq.read(&mut m, Some(&mut src)).unwrap(), 1);
        assert_eq!(m[0], CqMsgEntry { op_context: 9, flags: 1, len: 2 });
        assert_eq!(src[0], 7);
        assert_eq!(cq.read(&mut m, None).unwrap_err().kind(), ErrorKind::Again);
    }

    #[test]
    fn error_entry_blocks_reads_until_readerr() {
        let mut cq = CqState::new(&CqAttr::default(), false);
        cq.push(full(1), NO_SRC);
        cq.push_err(CqErrEntry { op_context: 2, err: 265, olen: 10, ..Default::default() }, "peer X".into());
        let mut t = [CqTaggedEntry::default(); 4];
        assert_eq!(cq.read(&mut t, None).unwrap_err().kind(), ErrorKind::Avail);
        let e = cq.readerr().unwrap();
        assert_eq!((e.op_context, e.err, e.olen), (2, 265, 10));
        // SAFETY: err_data points at the CQ's NUL-terminated buffer.
        let s = unsafe { std::ffi::CStr::from_ptr(e.err_data as *const libc::c_char) };
        assert_eq!(s.to_str().unwrap(), "peer X");
        assert_eq!(e.err_data_size, 6);
        assert_eq!(cq.read(&mut t, None).unwrap(), 1);
        assert_eq!(cq.readerr().unwrap_err().kind(), ErrorKind::Again);
    }

    #[test]
    fn entry_queue_keeps_order_across_wrap_and_growth() {
        let mut q = EntryQueue::default();
        let e = |i: usize| CqTaggedEntry { op_context: i, tag: i as u64 * 3, ..Default::default() };
        let mut next_out = 0;
        let mut next_in = 0;
        // Interleave pushes and pops so the ring wraps, then grows while wrapped.
        for round in 0..6 {
            for _ in 0..(40 + round * 30) {
                q.push(&e(next_in), next_in as u64 + 1);
                next_in += 1;
            }
            for _ in 0..(30 + round * 10) {
                let (x, src) = q.pop().unwrap();
                assert_eq!((x.op_context, x.tag, src), (next_out, next_out as u64 * 3, next_out as u64 + 1));
                next_out += 1;
            }
            assert_eq!(q.len(), next_in - next_out);
        }
        while let Some((x, _)) = q.pop() {
            assert_eq!(x.op_context, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert!(q.is_empty());
    }

    #[test]
    fn take_into_moves_the_oldest_across_the_wrap() {
        let mut q = EntryQueue::default();
        let e = |i: usize| CqTaggedEntry { op_context: i, len: i + 7, ..Default::default() };
        // 64 slots, head moved to 50: the next 30 entries wrap.
        for i in 0..50 {
            q.push(&e(i), i as u64);
        }
        let mut drop = vec![CqEntry::default(); 50];
        q.take_into(&mut drop, None);
        assert!(q.is_empty());
        for i in 50..80 {
            q.push(&e(i), i as u64 + 100);
        }
        let mut out = vec![CqMsgEntry::default(); 20];
        let mut src = vec![0u64; 20];
        q.take_into(&mut out, Some(&mut src));
        for (k, (x, a)) in out.iter().zip(&src).enumerate() {
            assert_eq!((x.op_context, x.len, *a), (50 + k, 57 + k, 150 + k as u64));
        }
        assert_eq!(q.len(), 10);
        let mut rest = vec![CqEntry::default(); 10];
        q.take_into(&mut rest, None);
        assert_eq!(rest.iter().map(|x| x.op_context).collect::<Vec<_>>(), (70..80).collect::<Vec<_>>());
        assert!(q.is_empty() && q.pop().is_none());
    }

    #[test]
    fn reservations_count_against_the_size() {
        let mut cq = CqState::new(&CqAttr { size: 3, format: CqFormat::Context, ..Default::default() }, true);
        assert!(cq.rm());
        assert!(cq.reserve() && cq.reserve());
        assert_eq!(cq.reserved(), 2);
        cq.push(full(1), NO_SRC);
        assert!(!cq.has_room(), "two reserved and one held fill a CQ of 3");
        assert!(!cq.reserve(), "no room: nothing taken");
        assert_eq!(cq.reserved(), 2);
        // A reserved transmit completes: its entry takes its room.
        cq.release(1);
        cq.push(full(2), NO_SRC);
        assert!(!cq.has_room());
        let mut out = [CqEntry::default(); 8];
        assert_eq!(cq.read(&mut out, None).unwrap(), 2);
        assert!(cq.has_room() && cq.reserve());
        cq.release(2);
        assert_eq!(cq.reserved(), 0);
        // Entries written past the size anyway are held, never an overrun.
        for i in 0..1000 {
            cq.push(full(i), NO_SRC);
        }
        assert!(!cq.overrun);
        let mut out = vec![CqEntry::default(); 2000];
        assert_eq!(cq.read(&mut out, None).unwrap(), 1000);
        assert_eq!(out[999].op_context, 999);
    }

    #[test]
    fn overrun_after_valid_entries() {
        let mut cq = CqState::new(&CqAttr { size: 2, format: CqFormat::Context, ..Default::default() }, false);
        assert!(cq.has_room());
        for i in 0..cq.hard_cap() {
            cq.push(full(i), NO_SRC);
        }
        assert!(!cq.has_room());
        assert!(!cq.overrun);
        cq.push(full(999), NO_SRC);
        assert!(cq.overrun);
        let mut out = vec![CqEntry::default(); 1000];
        let n = cq.read(&mut out, None).unwrap();
        assert_eq!(n, cq.hard_cap());
        assert_eq!(out[n - 1].op_context, n - 1, "valid entries kept, the lost one not");
        assert_eq!(cq.read(&mut out, None).unwrap_err().kind(), ErrorKind::Overrun);
        assert_eq!(cq.readerr().unwrap_err().kind(), ErrorKind::Overrun);
    }
}
