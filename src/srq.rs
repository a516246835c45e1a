//! Shared receive queues, as dat_srq_post_recv(3) and libfabric's shared
//! receive context: one queue of posted buffers that every endpoint bound to
//! it takes its receives from, whichever peer a message comes from.
//!
//! - An endpoint binds it for its untagged receives
//!   ([`crate::Endpoint::bind_srq`]), or for its untagged and/or tagged
//!   ones ([`crate::Endpoint::bind_srq_for`]); those kinds are then posted
//!   here only.
//! - The queue holds two `PostQueue`s (untagged, tagged; their slots
//!   compact forms of `PostedRecv`s), matched with the engine's own predicate and taken with its
//!   own `matching::take_at` (a multi-receive buffer is carved there): no second
//!   matcher. A message takes the first receive of its kind, in posting
//!   order, that accepts it (tag and ignore bits; source, if directed).
//! - A directed receive names an fi_addr, not a peer: endpoints sharing
//!   the queue may have different AVs, so each reads it in its own AV, the
//!   one its completions report sources in (a message whose source its AV
//!   lacks has source `FI_ADDR_NOTAVAIL` and takes no directed receive).
//!   A post names an fi_addr that some bound endpoint's AV holds.
//! - [`SharedRecvQueue::post_recv`] is non-blocking and allocation-free: the
//!   queue's room (its maximum, up to [`SRQ_MAX_IOV`] segments per buffer) is
//!   reserved when it is opened or resized (for tagged buffers, when an
//!   endpoint binds for them); a full queue gives `-FI_EAGAIN`.
//! - A message fills the buffer's segments in order: every front segment
//!   completely, at most one partly, the rest untouched.
//! - The completion goes to the receive CQ (and counter) of the endpoint that
//!   dequeued the buffer, with that endpoint's flags; its context is the
//!   cookie given at posting. Completions of one connection (sending
//!   endpoint to receiving endpoint) come in send order; there is no order
//!   between connections.
//! - A message that no posted receive accepts waits as an unexpected
//!   message of its endpoint (within the endpoint's budget; past it,
//!   back-pressure to the sender), and a later post takes it (`serve`:
//!   the bound endpoints round robin, each one's messages in arrival
//!   order). Peeks and claims ([`SharedRecvQueue::trecvmsg`]) look at the
//!   unexpected messages of every bound endpoint; a claim is held by the
//!   endpoint of its message.
//! - Low watermark: when a dequeue leaves fewer buffers posted than the
//!   watermark, one [`SrqEvent::LowWatermark`] is queued on the SRQ
//!   ([`SharedRecvQueue::read_event`], [`SharedRecvQueue::wait_event`]);
//!   [`SharedRecvQueue::set_low_watermark`] arms it again.
//! - An endpoint closed with buffers it dequeued but has not completed
//!   flushes them to its CQ as `FI_ECANCELED` error entries; one closed
//!   with [`crate::Endpoint::close_discard`] puts them back at the front
//!   of their queue instead, still posted, with their match fields.
//!   Closing the SRQ while endpoints are bound to it is `Busy`.

use crate::domain::{Domain, DomainInner, DomainState};
use crate::engine::complete::RxInfo;
use crate::engine::matching::{take_at, unused, Dest, Keys, MultiRecs, PostQueue, PostedRecv};
use crate::engine::request::{Iov, Iovs};
use crate::error::{Error, ErrorKind, Result};
use crate::flags::*;
use crate::RecvMsg;
use shm_layout::MAX_IOV;
use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a multi-receive buffer is refused where an endpoint without a
/// receive CQ takes (or would take) the SRQ's untagged receives.
pub(crate) const MULTI_NO_CQ: &str = "FI_MULTI_RECV reports a buffer's release in a receive CQ entry: every endpoint \
     taking the SRQ's untagged receives needs a receive CQ (a counter cannot report it)";

/// Whether endpoint `e`, bound to SRQ `id`, is enabled and takes its
/// untagged receives from it with no receive CQ (counters only): it
/// could not report a multi-receive buffer's release.
fn no_rx_cq(st: &DomainState, id: usize, e: usize) -> bool {
    st.eps.get(e).is_some_and(|x| x.enabled && x.matching.srq_for(false) == Some(id) && x.bind.rx_cq.is_none())
}

/// Most segments of one buffer posted to an SRQ.
pub const SRQ_MAX_IOV: usize = 16;
/// Largest SRQ (posted buffers).
pub const SRQ_MAX_DEPTH: usize = 1 << 20;

/// Attributes of a shared receive queue.
#[derive(Clone, Copy, Debug)]
pub struct SrqAttr {
    /// Most buffers posted at once (1..=[`SRQ_MAX_DEPTH`]).
    pub max_recv: usize,
    /// Low watermark (0: off); armed at open when non-zero.
    pub low_watermark: usize,
}

impl Default for SrqAttr {
    fn default() -> Self {
        SrqAttr { max_recv: 1024, low_watermark: 0 }
    }
}

/// What [`SharedRecvQueue::query`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqInfo {
    /// Buffers posted and not yet dequeued (untagged and tagged).
    pub posted: usize,
    /// Most buffers posted at once.
    pub max_recv: usize,
    /// The low watermark (0: off).
    pub low_watermark: usize,
    /// Whether the low-watermark event is armed.
    pub armed: bool,
    /// Endpoints bound.
    pub endpoints: usize,
}

/// An asynchronous event of an SRQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrqEvent {
    /// Fewer buffers than the low watermark were posted after a dequeue
    /// (the count then, and the watermark).
    LowWatermark {
        /// Buffers posted right after the dequeue that raised the event.
        posted: usize,
        /// The watermark crossed.
        low_watermark: usize,
    },
}

/// In-domain state of an SRQ.
pub(crate) struct SrqState {
    max: usize,
    lw: usize,
    armed: bool,
    /// Posted receives: [untagged, tagged], in posting order. Their
    /// sources (directed receives) are fi_addrs, not peer indices: each
    /// bound endpoint reads them in its own AV.
    posted: [PostQueue; 2],
    /// Whether a directed receive may be in `posted[q]` (cleared when the
    /// queue empties): otherwise a message's source is not looked up.
    directed: [bool; 2],
    /// FI_OPT_MIN_MULTI_RECV of the queue's multi-receive buffers.
    min_multi_recv: usize,
    /// The queue's multi-receive buffers: their pieces, taken by any bound
    /// endpoint, are settled there when reported (the entry with
    /// FI_MULTI_RECV is the buffer's last, whichever endpoint writes it).
    pub multi: MultiRecs,
    events: VecDeque<SrqEvent>,
    /// Section indices of the endpoints bound (they hold their unexpected
    /// messages, which a new buffer serves first). As long as the SRQ's
    /// binding count in its table: each endpoint binds it once.
    pub eps: Vec<usize>,
    /// Where the last search for an unexpected message started (fairness
    /// between the endpoints).
    pub next_ep: usize,
    /// Segment lists of posted buffers with more than [`MAX_IOV`]
    /// segments, referenced by their `Iovs` until completion (boxes: their
    /// address does not move when the list grows, which an `Iovs` relies
    /// on).
    #[allow(clippy::vec_box)]
    ext: Vec<Box<[Iov; SRQ_MAX_IOV]>>,
    ext_free: Vec<u32>,
}

impl crate::table::Object for SrqState {
    const NAME: &'static str = "SRQ";
    const BOUND_BY: &'static str = "endpoints";
}

impl SrqState {
    fn new(attr: &SrqAttr) -> SrqState {
        let mut posted = [PostQueue::default(), PostQueue::default()];
        posted[0].reserve(attr.max_recv);
        SrqState {
            max: attr.max_recv,
            lw: attr.low_watermark,
            armed: attr.low_watermark > 0,
            posted,
            directed: [false; 2],
            min_multi_recv: 64,
            multi: MultiRecs::new(true),
            events: VecDeque::new(),
            eps: Vec::new(),
            next_ep: 0,
            ext: Vec::new(),
            ext_free: Vec::new(),
        }
    }

    /// Buffers posted (both queues).
    pub fn len(&self) -> usize {
        self.posted[0].len() + self.posted[1].len()
    }

    /// Whether a multi-receive buffer (they are untagged) is posted, or
    /// released with pieces outstanding: an endpoint without a receive CQ,
    /// which could not report its release, may not start taking from the
    /// queue then. Not only the posted ones: a piece that released its
    /// buffer comes back to the queue when the endpoint that holds it
    /// closes discarding ([`SrqState::give_back`]), and the rest of the
    /// buffer is posted again.
    pub fn holds_multi(&self) -> bool {
        self.multi.any_live()
    }

    /// An endpoint binds the SRQ for its tagged receives: room for them.
    pub fn reserve_tagged(&mut self) {
        self.posted[1].reserve(self.max);
    }

    /// Whether a receive of `tagged`'s queue may be directed.
    #[inline]
    pub fn directed(&self, tagged: bool) -> bool {
        self.directed[tagged as usize]
    }

    /// Appends a receive (`-FI_EAGAIN` when `max` are posted).
    fn push(&mut self, tagged: bool, r: PostedRecv) -> Result<()> {
        if self.len() >= self.max {
            return Err(Error::with(ErrorKind::Again, format!("all {} SRQ buffers are posted", self.max)));
        }
        self.directed[tagged as usize] |= r.src.is_some();
        self.posted[tagged as usize].push_back(r);
        Ok(())
    }

    /// Takes the first receive of `tagged`'s queue that a message of `len`
    /// bytes from the source fi_addr `src` (in the receiving endpoint's AV)
    /// with `tag` matches.
    #[inline]
    pub fn take_match(&mut self, tagged: bool, src: usize, tag: u64, len: usize) -> Option<Dest> {
        let i = self.posted[tagged as usize].iter().position(|r| r.accepts(tagged, src, tag))?;
        Some(self.take_at(tagged, i, len))
    }

    /// Takes receive `i` of `tagged`'s queue for a message of `len` bytes
    /// ([`take_at`]); a dequeue may raise the low-watermark event.
    fn take_at(&mut self, tagged: bool, i: usize, len: usize) -> Dest {
        let q = tagged as usize;
        let before = self.posted[q].len();
        let d = take_at(&mut self.posted[q], i, len, self.min_multi_recv, &mut self.multi);
        if self.posted[q].len() < before {
            if self.posted[q].len() == 0 {
                self.directed[q] = false;
            }
            if self.armed && self.len() < self.lw {
                self.armed = false;
                self.events.push_back(SrqEvent::LowWatermark { posted: self.len(), low_watermark: self.lw });
            }
        }
        d
    }

    /// The segments of a buffer being posted: inline up to [`MAX_IOV`],
    /// else in a list of the SRQ's, kept until the receive completes.
    fn iovs_of(&mut self, segs: &[Iov]) -> Iovs {
        if segs.len() <= MAX_IOV {
            let mut v = Iovs::default();
            v.v[..segs.len()].copy_from_slice(segs);
            v.n = segs.len();
            return v;
        }
        let slot = match self.ext_free.pop() {
            Some(s) => s as usize,
            None => {
                self.ext.push(Box::new([Iov::default(); SRQ_MAX_IOV]));
                self.ext.len() - 1
            }
        };
        let list = &mut self.ext[slot];
        list[..segs.len()].copy_from_slice(segs);
        // SAFETY-relevant invariant: the box stays in `ext` (its address
        // fixed) until `release` gets `slot` back, and the SRQ state
        // outlives every endpoint bound to it (close is Busy, a dropped
        // handle only orphans it), so the Iovs never dangles.
        Iovs::external(list.as_ptr(), segs.len(), slot)
    }

    /// Buffers an endpoint dequeued and closed without filling (a close
    /// that discards, see `progress::flush_rx`), with their queue (tagged
    /// or not), go back to the front of it, in their order, still posted
    /// with their match fields: no completion is written for them. What
    /// is left of a multi-receive buffer whose releasing piece it took
    /// goes back as a multi-receive buffer (the same one, unreleased); a
    /// piece before that one is only dropped (the buffer is still posted,
    /// or its other pieces report its release). They may take the queue
    /// past its maximum for a while (posts are then refused until it
    /// drains). Returned: pieces whose buffer was released elsewhere and
    /// had no other piece outstanding, with FI_MULTI_RECV set: the caller
    /// reports them (an entry of the buffer's release is owed).
    pub fn give_back(&mut self, dests: &[(bool, Dest)]) -> Vec<(bool, Dest)> {
        let mut owed = Vec::new();
        for &(tagged, d) in dests.iter().rev() {
            let k = d.keys;
            // A piece's `multi_release`: its carve released the buffer.
            if k.multi != 0 && self.multi.give_back(k.multi, d.multi_release) {
                owed.push((tagged, Dest { multi_release: true, keys: Keys { multi: 0, ..k }, ..d }));
            }
            if k.multi != 0 && !d.multi_release {
                continue;
            }
            let iovs = if k.multi != 0 { Iovs::one(d.buf, d.cap) } else { d.iovs };
            let r = PostedRecv {
                ctx: d.ctx,
                iovs,
                src: k.src,
                tag: k.tag,
                ignore: k.ignore,
                multi: k.multi,
                moff: 0,
                cqe: k.cqe,
            };
            self.directed[tagged as usize] |= k.src.is_some();
            self.posted[tagged as usize].push_front(r);
        }
        owed
    }

    /// A completed (or flushed) receive gives back its segment list.
    #[inline]
    pub fn release(&mut self, iovs: &Iovs) {
        if let Some(slot) = iovs.ext_slot() {
            self.ext_free.push(slot as u32);
        }
    }

    /// Removes the first receive posted under `ctx` (untagged queue
    /// first), with its queue.
    fn cancel(&mut self, ctx: usize) -> Option<(bool, Dest)> {
        (0..2).find_map(|q| {
            let i = self.posted[q].iter().position(|r| r.ctx == ctx)?;
            let r = self.posted[q].remove(i).expect("index from position");
            Some((q == 1, unused(r, &mut self.multi)))
        })
    }
}

/// A shared receive queue (see the module docs).
pub struct SharedRecvQueue {
    pub(crate) dom: Arc<DomainInner>,
    pub(crate) id: usize,
    closed: std::sync::atomic::AtomicBool,
}

impl Domain {
    /// Opens a shared receive queue for up to `attr.max_recv` posted
    /// buffers, with its low watermark armed if non-zero.
    pub fn srq_open(&self, attr: &SrqAttr) -> Result<SharedRecvQueue> {
        check_depth(attr.max_recv)?;
        check_lw(attr.low_watermark, attr.max_recv)?;
        let mut st = self.inner.lock()?;
        let id = st.srqs.insert(SrqState::new(attr));
        Ok(SharedRecvQueue { dom: self.inner.clone(), id, closed: false.into() })
    }
}

/// The source fi_addr of peer `p` of endpoint `ep` as an SRQ receive
/// names it (only looked up when `directed`).
#[inline]
fn src_of(
    peers: &mut crate::engine::peers::Peers,
    avs: &crate::table::Slots<crate::av::AvState>,
    directed: bool,
    p: usize,
) -> usize {
    if directed {
        peers.src_addr(avs, p) as usize
    } else {
        usize::MAX
    }
}

/// Messages waiting unexpected at the endpoints bound to SRQ `id` for
/// `tagged`'s queue take the receives posted there that accept them. With
/// `last`, only the receive posted last is tried (the others accepted
/// none of the waiting messages when they were posted, and what arrived
/// since found them): after a post. Without, every receive (after a
/// give-back). Endpoints are visited round robin; at each, its messages
/// in arrival order, each delivered into the first receive accepting it,
/// so per-connection order holds.
pub(crate) fn serve(dom: &DomainInner, st: &mut DomainState, id: usize, tagged: bool, last: bool) -> Result<()> {
    let q = tagged as usize;
    let Some(s) = st.srqs.get(id) else { return Ok(()) };
    let n = s.eps.len();
    let start = if n == 0 { 0 } else { s.next_ep % n };
    let mut k = 0;
    while k < n {
        let Some(s) = st.srqs.get(id) else { return Ok(()) };
        if s.posted[q].len() == 0 {
            return Ok(());
        }
        let ei = s.eps[(start + k) % n];
        let waits = st.eps.get(ei).is_some_and(|e| {
            e.matching.srq_for(tagged) == Some(id) && !e.matching.closing && e.matching.has_unexp(tagged)
        });
        if !waits {
            k += 1;
            continue;
        }
        let took = dom.with_ep(st, ei, |ep, ctx| {
            let srq = ctx.srqs.get_mut(id).expect("checked above");
            let directed = srq.directed[q];
            let (avs, peers) = (ctx.avs, &mut ep.peers);
            let len = srq.posted[q].len();
            let first = if last { len - 1 } else { 0 };
            let queue = &srq.posted[q];
            let accepts = |src: usize, u: &crate::engine::matching::Unexp| {
                (first..len).any(|i| queue[i].accepts(tagged, src, u.tag))
            };
            let mut src_p = None;
            let Some(u) = ep.matching.take_unexp_with(
                tagged,
                |p| {
                    let s = src_of(peers, avs, directed, p);
                    src_p = Some(s);
                    s
                },
                accepts,
            ) else {
                return Ok(None);
            };
            // The source of the message taken (the last one looked up).
            let src = src_p.unwrap_or(usize::MAX);
            let i = (first..len).find(|&i| srq.posted[q][i].accepts(tagged, src, u.tag)).expect("accepted above");
            let mut d = srq.take_at(tagged, i, u.len);
            d.cqe |= !ep.bind.rx_sel;
            crate::progress::deliver_unexp(ep, ctx, u, d, tagged);
            Ok(Some(()))
        })?;
        match took {
            // This endpoint may hold more: look again.
            Some(()) => {
                if let Some(s) = st.srqs.get_mut(id) {
                    s.next_ep = (start + k + 1) % n;
                }
            }
            None => k += 1,
        }
    }
    Ok(())
}

/// A directed SRQ receive's source: an fi_addr that the AV of some
/// endpoint bound for `tagged`'s receives holds (each endpoint reads it
/// in its own AV when a message arrives).
fn check_src(st: &DomainState, id: usize, tagged: bool, src: FiAddr) -> Result<usize> {
    let q = st.srqs.get(id).expect("checked by the caller");
    let known = q.eps.iter().any(|&e| {
        st.eps.get(e).is_some_and(|x| {
            x.matching.srq_for(tagged) == Some(id)
                && x.peers.av().and_then(|a| st.avs.get(a)).is_some_and(|av| av.lookup(src).is_some())
        })
    });
    if !known {
        return Err(Error::with(
            ErrorKind::AddrNotAvail,
            format!("source fi_addr {src} is in the address vector of no endpoint bound to the SRQ"),
        ));
    }
    Ok(src as usize)
}

fn check_depth(max: usize) -> Result<()> {
    if max == 0 || max > SRQ_MAX_DEPTH {
        return Err(Error::with(ErrorKind::Inval, format!("SRQ depth {max} is outside 1..={SRQ_MAX_DEPTH}")));
    }
    Ok(())
}

fn check_lw(lw: usize, max: usize) -> Result<()> {
    if lw > max {
        return Err(Error::with(ErrorKind::Inval, format!("low watermark {lw} is above the SRQ's maximum {max}")));
    }
    Ok(())
}

impl SharedRecvQueue {
    fn closed_err() -> Error {
        Error::with(ErrorKind::Inval, "shared receive queue is closed")
    }

    /// Runs `f` on the SRQ's state under the domain lock.
    fn with<R>(&self, f: impl FnOnce(&mut crate::domain::DomainState) -> Result<R>) -> Result<R> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Self::closed_err());
        }
        let mut st = self.dom.lock()?;
        if st.srqs.get(self.id).is_none() {
            return Err(Self::closed_err());
        }
        f(&mut st)
    }

    /// dat_srq_post_recv: posts an untagged buffer of up to
    /// [`SRQ_MAX_IOV`] segments, from any source; `cookie` comes back as
    /// the completion's `op_context` (it need not be unique). `-FI_EAGAIN`
    /// when `max_recv` buffers are posted. A message already waiting at a
    /// bound endpoint takes the buffer at once. Its completion writes an
    /// entry unless the receiving endpoint's receive CQ is bound with
    /// FI_SELECTIVE_COMPLETION (see [`SharedRecvQueue::recvmsg`]).
    ///
    /// # Safety
    /// The segments must stay valid and untouched until the buffer's
    /// completion (success, error or flush) is read.
    pub unsafe fn post_recv(&self, iov: &mut [IoSliceMut<'_>], cookie: usize) -> Result<()> {
        let m = &mut RecvMsg { iov, src: FI_ADDR_UNSPEC, context: cookie, tag: 0, ignore: 0 };
        // SAFETY: the caller's contract.
        unsafe { self.recvmsg(m, 0) }
    }

    /// Posts a one-segment buffer.
    ///
    /// # Safety
    /// As [`SharedRecvQueue::post_recv`].
    pub unsafe fn post(&self, buf: &mut [u8], cookie: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.post_recv(&mut [IoSliceMut::new(buf)], cookie) }
    }

    /// fi_recvmsg on a shared receive context: an untagged buffer.
    /// - `m.src`: FI_ADDR_UNSPEC, or a directed receive: it takes only
    ///   messages whose source is at that fi_addr in the AV of the
    ///   endpoint that receives them (each bound endpoint reads it in its
    ///   own AV, as the completion's source is; `-FI_EADDRNOTAVAIL` when no
    ///   bound endpoint's AV holds it).
    /// - Flags: FI_COMPLETION (an entry is written if given, or if the
    ///   receiving endpoint's receive CQ is not bound with
    ///   FI_SELECTIVE_COMPLETION; errors always are), FI_MULTI_RECV
    ///   (one segment, carved by the messages of every bound endpoint in
    ///   arrival order, 8-byte aligned, released when less than
    ///   [`SharedRecvQueue::set_min_multi_recv`] bytes remain; the
    ///   buffer's last completion, whichever endpoint writes it, has
    ///   FI_MULTI_RECV: that message's, or, when an earlier piece is
    ///   still arriving then, that piece's). That entry is how the buffer
    ///   comes back, so every endpoint taking the SRQ's untagged receives
    ///   needs a receive CQ: `-FI_ENOCQ` while an enabled one has counters
    ///   only (and such an endpoint is not enabled while one is posted,
    ///   or released with pieces still to report: [`crate::Endpoint::enable`]).
    ///   A cancel reports it at the first endpoint bound with a receive
    ///   CQ (`-FI_ENOCQ` when endpoints are bound and none has one).
    ///   `-FI_EAGAIN` when 2^20 - 1 multi-receive buffers are posted or
    ///   released with pieces still to be reported (progress frees them).
    ///
    /// # Safety
    /// As [`SharedRecvQueue::post_recv`] (for FI_MULTI_RECV: until the
    /// completion with FI_MULTI_RECV).
    pub unsafe fn recvmsg(&self, m: &mut RecvMsg<'_, '_>, flags: u64) -> Result<()> {
        if flags & !(FI_COMPLETION | FI_MULTI_RECV) != 0 {
            return Err(Error::with(
                ErrorKind::BadFlags,
                format!("unsupported SRQ receive flags {:#x}", flags & !(FI_COMPLETION | FI_MULTI_RECV)),
            ));
        }
        self.post_any(m, flags & FI_MULTI_RECV != 0, false, flags & FI_COMPLETION != 0)
    }

    /// fi_trecvmsg on a shared receive context: a tagged buffer for the
    /// endpoints bound with FI_TAGGED ([`crate::Endpoint::bind_srq_for`]),
    /// matching tags equal outside `m.ignore`, in posting order; `m.src`
    /// as for [`SharedRecvQueue::recvmsg`]. Flags: FI_COMPLETION, and the
    /// probes of [`crate::Endpoint::trecvmsg`] (FI_PEEK, FI_CLAIM,
    /// FI_DISCARD), over the unexpected messages of every endpoint bound:
    /// a peek's entry (found) goes to the CQ of the endpoint holding the
    /// message, `-FI_ENOMSG` (none) to that of the first endpoint bound
    /// for tagged receives; a claim is held by that endpoint, and the
    /// FI_CLAIM receive of its context, posted here, delivers it there.
    ///
    /// # Safety
    /// As [`SharedRecvQueue::post_recv`].
    pub unsafe fn trecvmsg(&self, m: &mut RecvMsg<'_, '_>, flags: u64) -> Result<()> {
        const PROBE: u64 = FI_PEEK | FI_CLAIM | FI_DISCARD;
        if flags & PROBE != 0 && flags & !(FI_COMPLETION | PROBE) == 0 {
            return self.probe(m, flags);
        }
        if flags & !FI_COMPLETION != 0 {
            return Err(Error::with(
                ErrorKind::BadFlags,
                format!("unsupported SRQ tagged receive flags {:#x}", flags & !FI_COMPLETION),
            ));
        }
        self.post_any(m, false, true, flags & FI_COMPLETION != 0)
    }

    /// fi_trecv on a shared receive context (see
    /// [`SharedRecvQueue::trecvmsg`]).
    ///
    /// # Safety
    /// As [`SharedRecvQueue::post_recv`].
    pub unsafe fn trecv(&self, buf: &mut [u8], src: FiAddr, tag: u64, ignore: u64, cookie: usize) -> Result<()> {
        let m = &mut RecvMsg { iov: &mut [IoSliceMut::new(buf)], src, context: cookie, tag, ignore };
        // SAFETY: the caller's contract.
        unsafe { self.trecvmsg(m, 0) }
    }

    /// FI_OPT_MIN_MULTI_RECV of the SRQ's multi-receive buffers (default
    /// 64; 0 counts as 1: a buffer is released when full).
    pub fn set_min_multi_recv(&self, n: usize) -> Result<()> {
        self.with(|st| {
            st.srqs.get_mut(self.id).expect("checked").min_multi_recv = n;
            Ok(())
        })
    }

    /// Checks and posts a buffer, then serves the messages waiting for it.
    fn post_any(&self, m: &mut RecvMsg<'_, '_>, multi: bool, tagged: bool, completion: bool) -> Result<()> {
        let iov = &mut *m.iov;
        if iov.is_empty() || iov.len() > SRQ_MAX_IOV {
            return Err(Error::with(
                ErrorKind::Inval,
                format!("an SRQ buffer has 1..={SRQ_MAX_IOV} segments, got {}", iov.len()),
            ));
        }
        if multi && iov.len() != 1 {
            return Err(Error::with(ErrorKind::Inval, "FI_MULTI_RECV takes one buffer"));
        }
        let mut segs = [Iov::default(); SRQ_MAX_IOV];
        for (d, s) in segs.iter_mut().zip(iov.iter_mut()) {
            *d = Iov { ptr: s.as_mut_ptr() as usize, len: s.len() };
        }
        let segs = &segs[..iov.len()];
        let (src_fi, tag, ignore, ctx) = (m.src, m.tag, m.ignore, m.context);
        let (dom, id) = (&self.dom, self.id);
        self.with(|st| {
            let src = if src_fi == FI_ADDR_UNSPEC { None } else { Some(check_src(st, id, tagged, src_fi)?) };
            if multi && st.srqs.get(id).expect("checked").eps.iter().any(|&e| no_rx_cq(st, id, e)) {
                return Err(Error::with(ErrorKind::NoCq, MULTI_NO_CQ));
            }
            let q = st.srqs.get_mut(id).expect("checked");
            // The record first: its refusal leaves no segment list taken.
            let multi = if multi { q.multi.open()? } else { 0 };
            let iovs = q.iovs_of(segs);
            let r = PostedRecv { ctx, iovs, src, tag, ignore, multi, moff: 0, cqe: completion };
            if let Err(e) = q.push(tagged, r) {
                q.release(&iovs);
                q.multi.close(multi);
                return Err(e);
            }
            serve(dom, st, id, tagged, true)
        })
    }

    /// A peek or claim (see [`SharedRecvQueue::trecvmsg`]).
    fn probe(&self, m: &mut RecvMsg<'_, '_>, flags: u64) -> Result<()> {
        let (peek, claim, discard) = (flags & FI_PEEK != 0, flags & FI_CLAIM != 0, flags & FI_DISCARD != 0);
        if !(peek || claim) || (peek && claim && discard) {
            return Err(Error::with(
                ErrorKind::BadFlags,
                "a peek or claim is FI_PEEK, FI_PEEK | FI_CLAIM, FI_PEEK | FI_DISCARD, FI_CLAIM or FI_CLAIM | FI_DISCARD",
            ));
        }
        let (src_fi, tag, ignore, context) = (m.src, m.tag, m.ignore, m.context);
        if claim && context == 0 {
            return Err(Error::with(ErrorKind::Inval, "FI_CLAIM needs a context: the one its message is claimed with"));
        }
        // A peek copies no data, and a discard takes none.
        let iovs = if peek || discard {
            Iovs::default()
        } else {
            if m.iov.is_empty() || m.iov.len() > MAX_IOV {
                return Err(Error::with(ErrorKind::Inval, format!("a claim takes 1..={MAX_IOV} segments")));
            }
            let mut v = Iovs::default();
            for (d, s) in v.v.iter_mut().zip(m.iov.iter_mut()) {
                *d = Iov { ptr: s.as_mut_ptr() as usize, len: s.len() };
            }
            v.n = m.iov.len();
            v
        };
        let (dom, id) = (&self.dom, self.id);
        self.with(|st| {
            // The endpoints bound for tagged receives, in binding order.
            let eps: Vec<usize> = st.srqs.get(id).expect("checked").eps.clone();
            let tagged_eps: Vec<usize> = eps
                .into_iter()
                .filter(|&e| st.eps.get(e).is_some_and(|x| x.matching.srq_for(true) == Some(id)))
                .collect();
            let Some(&first) = tagged_eps.first() else {
                return Err(Error::with(ErrorKind::Inval, "no endpoint is bound to the SRQ for tagged receives"));
            };
            if st.eps.get(first).is_some_and(|e| e.bind.rx_cq.is_none()) {
                return Err(Error::with(
                    ErrorKind::NoCq,
                    "peeks and claims report through a receive CQ: none is bound",
                ));
            }
            let holder =
                tagged_eps.iter().copied().find(|&e| st.eps.get(e).is_some_and(|x| x.matching.claims(context)));
            if !peek {
                let Some(e) = holder else {
                    return Err(Error::with(
                        ErrorKind::Inval,
                        "no message is claimed with this context (no FI_PEEK | FI_CLAIM with it, or already received)",
                    ));
                };
                let completion = flags & FI_COMPLETION != 0;
                return dom.with_ep(st, e, |ep, ctx| {
                    let cqe = completion || !ep.bind.rx_sel;
                    let d =
                        Dest { ctx: context, iovs, cap: iovs.total(), buf: iovs.v[0].ptr, cqe, ..Default::default() };
                    crate::progress::claimed_rx(ep, ctx, d, discard)
                });
            }
            if claim && holder.is_some() {
                return Err(Error::with(ErrorKind::Inval, "this context already holds a claimed message"));
            }
            let src = if src_fi == FI_ADDR_UNSPEC { None } else { Some(check_src(st, id, true, src_fi)?) };
            // What has arrived is seen (a peek does not wait).
            dom.progress(st);
            let r = PostedRecv { ctx: context, iovs, src, tag, ignore, multi: 0, moff: 0, cqe: true };
            for &e in &tagged_eps {
                let found = dom.with_ep(st, e, |ep, ctx| {
                    let (avs, peers) = (ctx.avs, &mut ep.peers);
                    let directed = r.src.is_some();
                    let Some(u) = ep.matching.find_free_with(true, &r, |p| src_of(peers, avs, directed, p)) else {
                        return Ok(false);
                    };
                    let (uid, p) = (u.id, u.peer);
                    let info = RxInfo {
                        tagged: true,
                        tag: u.tag,
                        data: u.data,
                        hflags: u.hflags,
                        total: u.len,
                        delivered: u.len,
                    };
                    crate::engine::complete::probe_entry(ep, ctx, r.ctx, Ok((p, info)));
                    if claim {
                        ep.matching.claim(uid, r.ctx);
                    } else if discard {
                        crate::progress::discard_unexp(ep, uid);
                    }
                    Ok(true)
                })?;
                if found {
                    return Ok(());
                }
            }
            dom.with_ep(st, first, |ep, ctx| {
                let why = "no unexpected message matches the peek".to_string();
                crate::engine::complete::probe_entry(
                    ep,
                    ctx,
                    r.ctx,
                    Err((ErrorKind::NoMsg, crate::cq::prov::NO_MSG, why)),
                );
                Ok(())
            })
        })
    }

    /// fi_cancel on a shared receive context: the first buffer still
    /// posted whose cookie is `cookie` (untagged ones first) leaves the
    /// queue and completes as an `FI_ECANCELED` error entry in the receive
    /// CQ (and counter) of the first endpoint bound for its kind (tagged
    /// or not; for a multi-receive buffer, the first with a receive CQ,
    /// where its release can be reported), as libfabric's shared receive
    /// contexts report it (the SRQ has no CQ of its own). Returns whether
    /// one was found: a buffer
    /// already dequeued completes as usual (a multi-receive buffer still
    /// posted is cancelled for what is left of it: its entry has
    /// FI_MULTI_RECV unless pieces of it are still arriving, the last of
    /// which then has it), and with no such endpoint bound there is nowhere to
    /// report, so nothing is cancelled.
    pub fn cancel(&self, cookie: usize) -> Result<bool> {
        let (dom, id) = (&self.dom, self.id);
        self.with(|st| {
            let q = st.srqs.get(id).expect("checked");
            let kind = (0..2).find(|&k| q.posted[k].iter().any(|r| r.ctx == cookie));
            let Some(kind) = kind else { return Ok(false) };
            let tagged = kind == 1;
            // A multi-receive buffer's entry carries its release: only an
            // endpoint with a receive CQ can write it.
            let multi = q.posted[kind].iter().find(|r| r.ctx == cookie).is_some_and(|r| r.multi != 0);
            // Endpoints bound that take this kind from the SRQ; the first
            // that can write the entry reports it.
            let takes = |e: &&usize| st.eps.get(**e).filter(|x| x.matching.srq_for(tagged) == Some(id));
            let bound = |e: &usize| takes(&e).is_some_and(|x| !multi || x.bind.rx_cq.is_some());
            let Some(ei) = q.eps.iter().copied().find(bound) else {
                // Endpoints take this queue (not yet enabled: a counter-only
                // one is refused while the buffer is here), but none has a
                // receive CQ for the buffer's release: it stays posted.
                if multi && q.eps.iter().any(|e| takes(&e).is_some()) {
                    return Err(Error::with(
                        ErrorKind::NoCq,
                        "a multi-receive buffer's cancellation is reported with its release, on a receive CQ: \
                         no endpoint bound to this SRQ has one (the buffer stays posted)",
                    ));
                }
                return Ok(false);
            };
            let q = st.srqs.get_mut(id).expect("checked");
            let (tagged, d) = q.cancel(cookie).expect("found above");
            q.release(&d.iovs);
            dom.with_ep(st, ei, |ep, ctx| {
                let why = (ErrorKind::Canceled, crate::cq::prov::CANCELED, "receive cancelled".to_string());
                crate::engine::complete::unused_rx(&ep.bind, ctx, &d, tagged, why);
                Ok(true)
            })
        })
    }

    /// dat_srq_query: posted count, maximum, low watermark (after a progress
    /// pass, so the count is current).
    pub fn query(&self) -> Result<SrqInfo> {
        let dom = &self.dom;
        self.with(|st| {
            dom.progress(st);
            let q = st.srqs.get(self.id).expect("checked");
            Ok(SrqInfo {
                posted: q.len(),
                max_recv: q.max,
                low_watermark: q.lw,
                armed: q.armed,
                endpoints: q.eps.len(),
            })
        })
    }

    /// dat_srq_resize: a new maximum, grown or shrunk; never below the
    /// buffers posted now (`Busy`) or the low watermark (`Inval`). Memory
    /// for the new room is reserved here (a shrink keeps what it had).
    pub fn resize(&self, max_recv: usize) -> Result<()> {
        check_depth(max_recv)?;
        self.with(|st| {
            let q = st.srqs.get_mut(self.id).expect("checked");
            if max_recv < q.len() {
                return Err(Error::with(
                    ErrorKind::Busy,
                    format!("{} buffers are posted: cannot shrink the SRQ to {max_recv}", q.len()),
                ));
            }
            check_lw(q.lw, max_recv)?;
            q.max = max_recv;
            q.posted[0].reserve(max_recv);
            if q.posted[1].capacity() > 0 {
                q.reserve_tagged();
            }
            Ok(())
        })
    }

    /// dat_srq_set_lw: sets the low watermark and arms its event (0 turns
    /// it off). If fewer buffers than `lw` are posted already, the event
    /// comes with the next dequeue.
    pub fn set_low_watermark(&self, lw: usize) -> Result<()> {
        self.with(|st| {
            let q = st.srqs.get_mut(self.id).expect("checked");
            check_lw(lw, q.max)?;
            q.lw = lw;
            q.armed = lw > 0;
            Ok(())
        })
    }

    /// The next event, after a progress pass; `-FI_EAGAIN` if none.
    pub fn read_event(&self) -> Result<SrqEvent> {
        let dom = &self.dom;
        self.with(|st| {
            if st.srqs.get(self.id).expect("checked").events.is_empty() {
                dom.progress(st);
            }
            st.srqs.get_mut(self.id).expect("checked").events.pop_front().ok_or(Error::AGAIN)
        })
    }

    /// Waits up to `timeout` (None: forever) for an event, driving progress
    /// and sleeping on the domain's doorbell between passes (in slices of
    /// at most 10 ms, so an event raised by the domain's progress thread is
    /// seen too); `-FI_EAGAIN` on timeout.
    pub fn wait_event(&self, timeout: Option<Duration>) -> Result<SrqEvent> {
        let deadline = crate::domain::deadline(timeout);
        let dom = Domain { inner: self.dom.clone() };
        loop {
            match self.read_event() {
                Err(e) if e.kind() == ErrorKind::Again => {}
                r => return r,
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Error::AGAIN);
            }
            let slice = Duration::from_millis(10);
            dom.wait_for(Some(left.map_or(slice, |l| l.min(slice))), || false);
        }
    }

    /// Closes the SRQ: `Busy` while endpoints are bound. Buffers still
    /// posted are returned to the caller (no completion).
    pub fn close(&self) -> Result<()> {
        let mut st = self.dom.lock()?;
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        st.srqs.close(self.id)?;
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for SharedRecvQueue {
    fn drop(&mut self) {
        if self.close().is_err() {
            let Ok(mut st) = self.dom.lock() else { return };
            st.srqs.orphan(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(q: &mut SrqState, segs: &[(usize, usize)], ctx: usize) -> PostedRecv {
        let v: Vec<Iov> = segs.iter().map(|&(ptr, len)| Iov { ptr, len }).collect();
        PostedRecv { ctx, iovs: q.iovs_of(&v), cqe: true, ..Default::default() }
    }

    fn post(q: &mut SrqState, segs: &[(usize, usize)], ctx: usize) {
        let r = recv(q, segs, ctx);
        q.push(false, r).unwrap();
    }

    #[test]
    fn low_watermark_fires_once_per_arming() {
        let mut q = SrqState::new(&SrqAttr { max_recv: 8, low_watermark: 3 });
        for c in 0..5 {
            post(&mut q, &[(0x1000, 8)], c);
        }
        let any = usize::MAX;
        assert!(q.take_match(false, any, 0, 8).is_some()); // 4 left
        assert!(q.take_match(false, any, 0, 8).is_some()); // 3 left: not below
        assert!(q.events.is_empty());
        assert!(q.take_match(false, any, 0, 8).is_some()); // 2 left: below
        assert_eq!(q.events.pop_front(), Some(SrqEvent::LowWatermark { posted: 2, low_watermark: 3 }));
        assert!(q.take_match(false, any, 0, 8).is_some());
        assert!(q.events.is_empty(), "fires once per arming");
        q.armed = true;
        assert!(q.take_match(false, any, 0, 8).is_some());
        assert_eq!(q.events.len(), 1);
        assert!(q.take_match(false, any, 0, 8).is_none());
    }

    #[test]
    fn many_segments_go_external_and_come_back() {
        let mut q = SrqState::new(&SrqAttr { max_recv: 4, low_watermark: 0 });
        let segs: Vec<(usize, usize)> = (0..16).map(|i| (0x10000 + i * 0x100, i + 1)).collect();
        post(&mut q, &segs, 7);
        post(&mut q, &segs[..3], 8);
        let d = q.take_match(false, usize::MAX, 0, 1).unwrap();
        assert_eq!(d.ctx, 7);
        assert_eq!(d.iovs.segs().len(), 16);
        assert_eq!(d.iovs.segs()[15].len, 16);
        assert_eq!(d.cap, (1..=16).sum::<usize>());
        assert_eq!(d.iovs.ext_slot(), Some(0));
        let d2 = q.take_match(false, usize::MAX, 0, 1).unwrap();
        assert_eq!((d2.iovs.segs().len(), d2.iovs.ext_slot(), d2.cap), (3, None, 6));
        q.release(&d.iovs);
        post(&mut q, &segs, 9);
        let d3 = q.take_match(false, usize::MAX, 0, 1).unwrap();
        assert_eq!(d3.iovs.ext_slot(), Some(0), "slot reused");
        assert_eq!(q.ext.len(), 1);
    }

    /// Tagged, directed (by fi_addr) and multi-receive buffers, matched in
    /// posting order; a full queue refuses; what a closing endpoint took
    /// goes back with its match fields.
    #[test]
    fn tagged_directed_multi_and_give_back() {
        let mut q = SrqState::new(&SrqAttr { max_recv: 4, low_watermark: 0 });
        q.reserve_tagged();
        let mut r = recv(&mut q, &[(0x1000, 64)], 1);
        (r.tag, r.ignore, r.src) = (0x50, 0x0f, Some(3));
        q.push(true, r).unwrap();
        let mut r = recv(&mut q, &[(0x2000, 64)], 2);
        r.tag = 0x50;
        q.push(true, r).unwrap();
        assert!(q.directed(true) && !q.directed(false));
        // From fi_addr 2: the directed one is skipped.
        assert_eq!(q.take_match(true, 2, 0x50, 8).unwrap().ctx, 2);
        assert!(q.take_match(true, 2, 0x50, 8).is_none());
        assert!(q.take_match(true, 3, 0x61, 8).is_none(), "tag outside the ignore bits");
        let d = q.take_match(true, 3, 0x5f, 8).unwrap();
        assert_eq!((d.ctx, d.keys.src, d.keys.tag, d.keys.ignore), (1, Some(3), 0x50, 0x0f));
        assert!(!q.directed(true), "cleared when the queue empties");
        // Given back, it matches as before, first in its queue.
        q.give_back(&[(true, d)]);
        assert!(q.directed(true));
        assert!(q.take_match(true, 2, 0x50, 8).is_none());
        assert_eq!(q.take_match(true, 3, 0x50, 8).unwrap().ctx, 1);
        // A multi-receive buffer: carved, released below the minimum.
        q.min_multi_recv = 32;
        let mut m = recv(&mut q, &[(0x4000, 100)], 9);
        m.multi = q.multi.open().unwrap();
        q.push(false, m).unwrap();
        let a = q.take_match(false, usize::MAX, 0, 30).unwrap();
        assert_eq!((a.buf, a.cap, a.multi_release), (0x4000, 100, false));
        let b = q.take_match(false, usize::MAX, 0, 40).unwrap();
        assert_eq!((b.buf, b.multi_release), (0x4000 + 32, true), "68 bytes left after it: 28 < 32");
        assert_eq!(q.len(), 0);
        // Given back: a part before the last is dropped, the last part's
        // remainder is posted again as the same multi-receive buffer.
        assert!(q.give_back(&[(false, a), (false, b)]).is_empty(), "no flag owed: the buffer is posted again");
        assert_eq!(q.len(), 1);
        let c = q.take_match(false, usize::MAX, 0, 8).unwrap();
        assert_eq!((c.ctx, c.buf, c.cap, c.keys.multi), (9, 0x4000 + 32, 68, m.multi));
        assert_eq!(q.len(), 1, "60 bytes left: still posted");
        for k in 0..3 {
            post(&mut q, &[(0x1000, 8)], k);
        }
        let full = recv(&mut q, &[(0x1000, 8)], 5);
        assert_eq!(q.push(true, full).unwrap_err().kind(), ErrorKind::Again, "the maximum counts both queues");
        // Cancelled with `c` outstanding: `c` will carry the flag.
        let (_, x) = q.cancel(9).unwrap();
        assert!(!x.multi_release);
        assert!(q.multi.settle(c.keys.multi), "the last report");
    }

    /// A counter-only endpoint may not start taking the queue while a
    /// multi-receive buffer could come back to it: posted, or released
    /// with a piece outstanding (given back when its endpoint closes
    /// discarding, the rest is posted again).
    #[test]
    fn holds_multi_while_a_released_buffer_has_pieces_out() {
        let mut q = SrqState::new(&SrqAttr { max_recv: 4, low_watermark: 0 });
        assert!(!q.holds_multi());
        q.min_multi_recv = 32;
        let mut m = recv(&mut q, &[(0x4000, 64)], 9);
        m.multi = q.multi.open().unwrap();
        q.push(false, m).unwrap();
        assert!(q.holds_multi(), "posted");
        let a = q.take_match(false, usize::MAX, 0, 40).unwrap();
        assert!(a.multi_release && q.len() == 0, "24 bytes left: released");
        assert!(q.holds_multi(), "released, its piece outstanding");
        assert!(q.give_back(&[(false, a)]).is_empty());
        assert!(q.holds_multi() && q.len() == 1, "posted again");
        let a = q.take_match(false, usize::MAX, 0, 40).unwrap();
        assert!(q.multi.settle(a.keys.multi), "its one piece reported: the flag");
        assert!(!q.holds_multi(), "the record is freed with the flag");
    }
}
