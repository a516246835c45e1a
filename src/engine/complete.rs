//! Completion: what an endpoint is bound to (CQs by direction, counters by
//! kind), the one writer of counter values ([`count`], [`set`]), the
//! writing of completion entries, and the receives in progress per peer
//! with the order their completions must keep ([`PeerRx`]).

use super::matching::Dest;
use super::peers::Peers;
use super::request::OpKind;
use super::EpState;
use crate::cq::{prov, CqErrEntry, CqState, CqTaggedEntry, NO_SRC};
use crate::domain::Ctx;
use crate::error::ErrorKind;
use crate::flags::*;
use crate::notify::Signal;
use crate::sync::Ordering;
use shm_layout::hdr_flags;
use std::collections::VecDeque;

/// An error to report: kind, provider errno, text.
pub(crate) type Fail = (ErrorKind, i32, String);

/// The counters an endpoint binds, by the events they count (fi_cntr(3)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CntrKind {
    /// FI_SEND: completed sends.
    Send = 0,
    /// FI_RECV: completed receives.
    Recv = 1,
    /// FI_READ: completed reads (and fetching atomics).
    Read = 2,
    /// FI_WRITE: completed writes (and atomics).
    Write = 3,
    /// FI_REMOTE_READ: reads of our memory by peers.
    RemoteRead = 4,
    /// FI_REMOTE_WRITE: writes to our memory by peers.
    RemoteWrite = 5,
}

impl CntrKind {
    /// Every kind with its bind flag.
    pub const ALL: [(CntrKind, u64); 6] = [
        (CntrKind::Send, FI_SEND),
        (CntrKind::Recv, FI_RECV),
        (CntrKind::Read, FI_READ),
        (CntrKind::Write, FI_WRITE),
        (CntrKind::RemoteRead, FI_REMOTE_READ),
        (CntrKind::RemoteWrite, FI_REMOTE_WRITE),
    ];
}

/// Which value of a counter.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Val {
    Success,
    Error,
}

/// Adds `n` to a counter's success or error value: with [`set`], the only
/// writer of counter values, so triggered work can hook in here.
#[inline(always)]
pub(crate) fn count(c: &shm_layout::Counter, which: Val, n: u64) {
    let v = if which == Val::Success { &c.value.v } else { &c.err.v };
    // SYNC: pairs with the acquire loads in Counter::read/readerr/wait and
    // Domain::trywait_with.
    v.fetch_add(n, Ordering::Release);
}

/// Sets a counter's success or error value (see [`count`]).
#[inline]
pub(crate) fn set(c: &shm_layout::Counter, which: Val, n: u64) {
    let v = if which == Val::Success { &c.value.v } else { &c.err.v };
    // SYNC: pairs with the acquire loads in Counter::read/readerr/wait.
    v.store(n, Ordering::Release);
}

/// What an endpoint reports to. Set while the endpoint is being bound
/// (before enable); read by every completion.
pub(crate) struct Bindings {
    /// Transmit CQ, and whether it is selective (FI_SELECTIVE_COMPLETION).
    pub tx_cq: Option<usize>,
    pub tx_sel: bool,
    /// The transmit CQ has resource management on ([`CqState::rm`]): a
    /// transmit with an entry due checks its room ([`tx_room`]).
    pub tx_rm: bool,
    /// Receive CQ, and whether it is selective. Bound in the domain's CQ
    /// table (`Endpoint::bind_cq`) until the endpoint's bindings are
    /// released (`DomainState::unbind_ep`): while named here, its slot
    /// holds its state (a bound CQ is neither closed nor freed).
    pub rx_cq: Option<usize>,
    pub rx_sel: bool,
    /// Counters by [`CntrKind`].
    cntr: [Option<usize>; 6],
    /// Solicited wait: a receive completion signals a completion channel
    /// only if the message was sent solicited (errors always do).
    pub solicited_wait: bool,
    /// In a thread-safe domain with a counter bound, its doorbell: a count
    /// rings it, for a thread asleep in `Counter::wait` (or a wait set)
    /// that re-checked before it (as `CqState::wake`).
    pub wake: Option<std::ptr::NonNull<shm_layout::Doorbell>>,
}

// SAFETY: `wake` points into the domain's region, which outlives every
// endpoint state (both belong to the domain); the doorbell is all atomics.
unsafe impl Send for Bindings {}

impl Bindings {
    pub fn new() -> Bindings {
        Bindings {
            tx_cq: None,
            tx_sel: false,
            tx_rm: false,
            rx_cq: None,
            rx_sel: false,
            cntr: [None; 6],
            solicited_wait: false,
            wake: None,
        }
    }

    /// The counter bound for `k`.
    #[inline(always)]
    pub fn cntr(&self, k: CntrKind) -> Option<usize> {
        self.cntr[k as usize]
    }

    /// Binds counter `id` for `k` (the caller checked it is free).
    pub fn bind_cntr(&mut self, k: CntrKind, id: usize) {
        self.cntr[k as usize] = Some(id);
    }

    /// Every counter bound (one per kind it counts).
    pub fn counters(&self) -> impl Iterator<Item = usize> + '_ {
        self.cntr.iter().flatten().copied()
    }

    /// Whether transmits can report anywhere (a CQ or the send counter).
    #[inline(always)]
    pub fn can_report_tx(&self) -> bool {
        self.tx_cq.is_some() || self.cntr(CntrKind::Send).is_some()
    }

    /// Whether receives can report anywhere.
    pub fn can_report_rx(&self) -> bool {
        self.rx_cq.is_some() || self.cntr(CntrKind::Recv).is_some()
    }

    /// Whether the receive CQ has room for another entry (back-pressure).
    #[inline]
    pub fn rx_room(&self, cqs: &crate::table::Slots<CqState>) -> bool {
        self.rx_cq.is_none_or(|c| cqs.get(c).is_none_or(|q| q.rx_room()))
    }

    /// Counts one completion of kind `k` on its counter, if bound.
    #[inline(always)]
    fn count(&self, counters: &[shm_layout::Counter], k: CntrKind, which: Val) {
        if let Some(c) = self.cntr(k) {
            count(&counters[c], which, 1);
            if let Some(db) = self.wake {
                crate::doorbell::ring_own(db);
            }
        }
    }

    /// How a receive completion signals an armed channel: solicited
    /// messages always; others not at all on a solicited-wait endpoint.
    #[inline]
    fn rx_signal(&self, hflags: u8) -> Signal {
        if hflags & hdr_flags::SOLICITED != 0 {
            Signal::Solicited
        } else if self.solicited_wait {
            Signal::Quiet
        } else {
            Signal::Normal
        }
    }
}

/// How an operation of the domain's deferred work queue (or a triggered
/// one) reports its completion, besides or instead of its endpoint
/// (fi_trigger(3)): its completion counter, counted by one (on the error
/// value for a failure), and whether the endpoint hears of it at all
/// (deferred work reports to its endpoint's CQ and counter only when asked
/// with FI_COMPLETION). [`Dw::NONE`] (an ordinary operation) is 0: one
/// test on the completion paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dw(u32);

impl Dw {
    /// An ordinary operation: its endpoint reports it.
    pub const NONE: Dw = Dw(0);
    const QUIET: u32 = 1 << 31;

    /// Completion counter `cntr` (an index of the domain's counter table,
    /// below 2^31), and `quiet`: no endpoint CQ entry or counter.
    pub fn new(cntr: Option<usize>, quiet: bool) -> Dw {
        Dw(cntr.map_or(0, |c| c as u32 + 1) | if quiet { Self::QUIET } else { 0 })
    }

    /// Whether this is an ordinary operation.
    #[inline(always)]
    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// Whether the endpoint hears nothing of the completion.
    pub fn quiet(self) -> bool {
        self.0 & Self::QUIET != 0
    }

    /// As an integer (0 for [`Dw::NONE`]), for a posted receive to keep.
    #[inline(always)]
    pub fn raw(self) -> u32 {
        self.0
    }

    /// Back from [`Dw::raw`].
    #[inline(always)]
    pub fn from_raw(v: u32) -> Dw {
        Dw(v)
    }

    /// The completion counter's index.
    pub fn cntr(self) -> Option<usize> {
        ((self.0 & !Self::QUIET) as usize).checked_sub(1)
    }
}

/// Counts a deferred operation's completion on its completion counter
/// (the success value, or the error value when it failed).
#[cold]
#[inline(never)]
fn count_deferred(b: &Bindings, counters: &[shm_layout::Counter], dw: Dw, failed: bool) {
    if let Some(c) = dw.cntr().and_then(|c| counters.get(c)) {
        count(c, if failed { Val::Error } else { Val::Success }, 1);
        if let Some(db) = b.wake {
            crate::doorbell::ring_own(db);
        }
    }
}

/// What a transmit's completion needs to know of it.
#[derive(Clone, Copy)]
pub(crate) struct SendDone {
    pub kind: OpKind,
    pub ctx: usize,
    pub tag: u64,
    /// Writes a CQ entry on success.
    pub cqe: bool,
    /// An inject call: no entry on success; an error entry with no
    /// context on error.
    pub silent: bool,
    /// Deferred work's reporting ([`Dw::NONE`] for an ordinary operation).
    pub dw: Dw,
    /// Holds a reservation in the transmit CQ (resource management, see
    /// [`tx_room`]), given back when its entry is written.
    pub rsv: bool,
}

/// Resource management of a transmit about to be posted whose success
/// entry is due (the caller checked `b.tx_rm`): `reserve` takes an entry of
/// the transmit CQ for a transmit that completes later, else only checks
/// there is room for one written now. `-FI_EAGAIN`, having taken nothing,
/// when the CQ has no room (fi_domain(3): the posting fails rather than
/// overrun the CQ; reading the CQ makes room).
#[cold]
#[inline(never)]
pub(crate) fn tx_room(b: &Bindings, cqs: &mut crate::table::Slots<CqState>, reserve: bool) -> crate::Result<()> {
    let Some(cq) = b.tx_cq.and_then(|c| cqs.get_mut(c)) else {
        return Ok(());
    };
    let ok = if reserve { cq.reserve() } else { cq.has_room() };
    if ok {
        Ok(())
    } else {
        Err(crate::Error::AGAIN)
    }
}

/// Resource management of a one-sided operation (it completes before its
/// call returns): with an entry due (`cqe`) and resource management on,
/// `-FI_EAGAIN` unless the transmit CQ has room for it (see [`tx_room`]).
#[inline(always)]
pub(crate) fn rm_now(b: &Bindings, cqs: &mut crate::table::Slots<CqState>, cqe: bool) -> crate::Result<()> {
    if b.tx_rm && cqe {
        tx_room(b, cqs, false)
    } else {
        Ok(())
    }
}

/// Whether the transmit CQ has room for an entry written now (resource
/// management; the caller checked `b.tx_rm`): inlined on the send fast
/// path, where a call would cost the registers around it.
#[inline(always)]
pub(crate) fn tx_has_room(b: &Bindings, cqs: &crate::table::Slots<CqState>) -> bool {
    b.tx_cq.and_then(|c| cqs.get(c)).is_none_or(|q| q.has_room())
}

/// Gives back a transmit's reservation in the transmit CQ.
#[cold]
#[inline(never)]
fn release_tx(b: &Bindings, cqs: &mut crate::table::Slots<CqState>) {
    if let Some(cq) = b.tx_cq.and_then(|c| cqs.get_mut(c)) {
        cq.release(1);
    }
}

/// A transmit completed (or failed): its counter, and its CQ entry when
/// one is due (written in the room its reservation, if any, kept).
#[inline]
pub(crate) fn complete_send(b: &Bindings, ctx: &mut Ctx<'_>, op: SendDone, err: Option<Fail>) {
    if op.rsv {
        release_tx(b, ctx.cqs);
    }
    if !op.dw.is_none() {
        count_deferred(b, ctx.counters, op.dw, err.is_some());
        if op.dw.quiet() {
            return;
        }
    }
    if let Some(k) = op.kind.counter() {
        b.count(ctx.counters, k, if err.is_some() { Val::Error } else { Val::Success });
    }
    if err.is_none() && !op.cqe {
        return; // an inject call, or a send without FI_COMPLETION
    }
    let Some(cq) = b.tx_cq.and_then(|c| ctx.cqs.get_mut(c)) else {
        return;
    };
    let flags = op.kind.completion_flags();
    match err {
        // An inject call's error too (fi_endpoint(3): the transmit CQ is
        // there "in order that operations that complete in error may be
        // reported"), with no context: the call took none.
        Some((k, pe, detail)) => cq.push_err(
            CqErrEntry {
                op_context: if op.silent { 0 } else { op.ctx },
                flags,
                tag: op.tag,
                err: k.errno(),
                prov_errno: pe,
                ..Default::default()
            },
            detail,
        ),
        None if op.cqe => cq.push(CqTaggedEntry { op_context: op.ctx, flags, ..Default::default() }, NO_SRC),
        _ => {}
    }
}

/// A transmit completed without error, on the send fast path: as
/// [`complete_send`] with no error, inlined there (the counter, and for
/// an inject call nothing more), with the CQ entry out of line.
#[inline(always)]
pub(crate) fn complete_send_ok(b: &Bindings, src: &mut crate::domain::CtxSrc<'_>, op: SendDone) {
    if !op.dw.is_none() {
        count_deferred(b, src.counters(), op.dw, false);
        if op.dw.quiet() {
            return;
        }
    }
    if let Some(k) = op.kind.counter() {
        b.count(src.counters(), k, Val::Success);
    }
    if op.cqe {
        send_entry(b, &mut src.ctx(), op);
    }
}

/// The CQ entry of a transmit that completed without error.
#[inline(never)]
fn send_entry(b: &Bindings, ctx: &mut Ctx<'_>, op: SendDone) {
    if let Some(cq) = b.tx_cq.and_then(|c| ctx.cqs.get_mut(c)) {
        cq.push(CqTaggedEntry { op_context: op.ctx, flags: op.kind.completion_flags(), ..Default::default() }, NO_SRC);
    }
}

/// Facts about a received message needed for its completion.
#[derive(Clone, Copy)]
pub(crate) struct RxInfo {
    pub tagged: bool,
    pub tag: u64,
    pub data: u64,
    pub hflags: u8,
    pub total: usize,
    pub delivered: usize,
}

/// A receive completion waiting for earlier ones from the same peer.
pub(crate) struct PendingRx {
    pub dest: Dest,
    pub info: RxInfo,
    pub err: Option<Fail>,
}

/// A matched receive whose data is still arriving in chunks.
pub(crate) struct ActiveRecv {
    pub dest: Dest,
    pub total: usize,
    pub received: usize,
    pub tag: u64,
    pub data: u64,
    pub hflags: u8,
    /// A rendezvous the receiver chose to take through the pool
    /// ([`crate::proto::PathPick`]): when it asked, and the size class
    /// whose measure its time feeds.
    pub timed: Option<(std::time::Instant, usize)>,
    /// A rendezvous taken through the pool (CTS_BOUNCE) whose sender asked
    /// for a FIN (`rts_flags::FIN`: FI_DELIVERY_COMPLETE): it gets one once
    /// the data is in place and completes then. Other senders completed at
    /// their last chunk and get none.
    pub fin: bool,
}

impl ActiveRecv {
    /// A receive matched to the message of header `h`, `total` bytes, into
    /// `dest`, nothing received yet (not timed, no FIN asked).
    pub fn new(dest: Dest, total: usize, h: &shm_layout::MsgHdr) -> ActiveRecv {
        ActiveRecv { dest, total, received: 0, tag: h.tag, data: h.data, hflags: h.flags, timed: None, fin: false }
    }

    /// Facts for its completion, with `delivered` bytes in place.
    pub fn info(&self, delivered: usize) -> RxInfo {
        RxInfo {
            tagged: self.hflags & hdr_flags::TAGGED != 0,
            tag: self.tag,
            data: self.data,
            hflags: self.hflags,
            total: self.total,
            delivered,
        }
    }
}

/// A receive whose data the sender is writing in part (split single copy).
pub(crate) struct SplitRecv {
    pub dest: Dest,
    pub info: RxInfo,
    pub split: usize,
    pub want: usize,
    /// The sender's ranges, to read the rest ourselves if its write fails.
    pub remote: Vec<(u64, u64)>,
    /// Our own half failed: report this when the sender is done too.
    pub own_err: Option<Fail>,
}

/// A multi-part message arriving from a peer, by message id.
pub(crate) enum RxCur {
    Active(ActiveRecv),
    /// Not matched yet: its bytes collect in the unexpected message `id`.
    Unexp {
        id: u64,
        total: usize,
    },
    /// Split single copy: we read `[0, split)`, the sender writes
    /// `[split, want)`; completes on the sender's WDONE.
    Split(SplitRecv),
}

/// A place in a peer's receive order: message id (0: completed on
/// arrival), and its completion once written there.
pub(crate) type Ordered = (u64, Option<PendingRx>);

/// The receives in progress from one peer and the order their completions
/// keep. Invariant: every matched receive in progress (`Active`, `Split`)
/// has its place `(msg_id, None)` in `order`, taken when it was matched;
/// an unmatched one (`Unexp`) has none until it is matched; a completion
/// is written only when everything before it in `order` is.
pub(crate) struct PeerRx {
    /// Multi-part messages arriving, by message id.
    parts: Vec<(u64, RxCur)>,
    /// Matched receives in match order; a completion waits here until
    /// those before it are written (message id, or 0 for one that
    /// completed on arrival).
    order: VecDeque<Ordered>,
}

impl PeerRx {
    pub fn new() -> PeerRx {
        PeerRx { parts: Vec::new(), order: VecDeque::new() }
    }

    /// Whether no completion from this peer waits for an earlier one.
    #[inline(always)]
    pub fn in_order(&self) -> bool {
        self.order.is_empty()
    }

    /// Whether a new message from the peer may not take id `msg_id`: 0
    /// (the order's mark of a completion on arrival), the id of parked
    /// piped messages (`progress::PIPE_ID`), an id in progress,
    /// or one whose place in the order is still held (a sender never
    /// reuses an id; a peer that does would otherwise overwrite a held
    /// completion or leave a place nobody fills). Ids of unmatched
    /// messages waiting in the unexpected queue are not searched here (a
    /// duplicate among them only confuses that peer's own order).
    pub fn has(&self, msg_id: u64) -> bool {
        msg_id == 0
            || msg_id == crate::progress::PIPE_ID
            || self.parts.iter().any(|x| x.0 == msg_id)
            || self.order.iter().any(|x| x.0 == msg_id)
    }

    /// The message `msg_id` in progress.
    pub fn get_mut(&mut self, msg_id: u64) -> Option<&mut RxCur> {
        self.parts.iter_mut().find(|x| x.0 == msg_id).map(|x| &mut x.1)
    }

    /// Takes message `msg_id` out of progress (its place in the order, if
    /// matched, stays until [`finish_rx`] fills it).
    pub fn take(&mut self, msg_id: u64) -> Option<RxCur> {
        let k = self.parts.iter().position(|x| x.0 == msg_id)?;
        Some(self.parts.swap_remove(k).1)
    }

    /// Puts a message taken with [`PeerRx::take`] back in progress.
    pub fn put_back(&mut self, msg_id: u64, cur: RxCur) {
        self.parts.push((msg_id, cur));
    }

    /// A matched receive starts (its data arrives later): it takes its
    /// place in the order.
    pub fn start_matched(&mut self, msg_id: u64, cur: RxCur) {
        debug_assert!(!matches!(cur, RxCur::Unexp { .. }));
        self.parts.push((msg_id, cur));
        self.order.push_back((msg_id, None));
    }

    /// An unmatched message starts arriving (into unexpected message `id`).
    pub fn start_unexp(&mut self, msg_id: u64, id: u64, total: usize) {
        self.parts.push((msg_id, RxCur::Unexp { id, total }));
    }

    /// The unmatched message `msg_id` is matched while still arriving: the
    /// rest goes to `a`, and it takes its place in the order.
    pub fn matched(&mut self, msg_id: u64, a: ActiveRecv) {
        if let Some(x) = self.parts.iter_mut().find(|x| x.0 == msg_id) {
            x.1 = RxCur::Active(a);
            self.order.push_back((msg_id, None));
        }
    }

    /// Whether a matched receive from this peer is still being fed.
    pub fn feeding(&self) -> bool {
        self.parts.iter().any(|x| !matches!(x.1, RxCur::Unexp { .. }))
    }

    /// Matched receives in progress (for `shmfab inspect`).
    pub fn active_count(&self) -> usize {
        self.parts.iter().filter(|x| !matches!(x.1, RxCur::Unexp { .. })).count()
    }

    /// Whether a split copy from this peer is in progress.
    pub fn splitting(&self) -> bool {
        self.parts.iter().any(|x| matches!(x.1, RxCur::Split(_)))
    }

    /// Takes every message in progress (the peer failed).
    pub fn drain_parts(&mut self) -> Vec<(u64, RxCur)> {
        self.parts.drain(..).collect()
    }

    /// Takes everything (the endpoint closes): the order, and the parts.
    pub fn drain_all(&mut self) -> (Vec<Ordered>, Vec<(u64, RxCur)>) {
        (self.order.drain(..).collect(), self.parts.drain(..).collect())
    }
}

/// A receive from `p` is complete: write it now, or after the receives
/// matched before it from the same peer (`key` is its message id if it was
/// started with [`PeerRx::start_matched`] or [`PeerRx::matched`], else 0).
pub(crate) fn finish_rx(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, key: u64, pr: PendingRx) {
    if pr.info.total >= ctx.cfg.cma_min && ctx.cfg.cma_min > 0 {
        stream_sample(ep, ctx, p, &pr.info);
    }
    let order = &mut ep.peers[p].rx.order;
    if key == 0 && order.is_empty() {
        emit_rx(ep, ctx, p, &pr.dest, &pr.info, pr.err);
        return;
    }
    if key != 0 && order.front().is_some_and(|x| x.0 == key) {
        // The oldest (the common case: one message at a time from this
        // peer): written now, not moved into its place and out again.
        order.pop_front();
        emit_rx(ep, ctx, p, &pr.dest, &pr.info, pr.err);
    } else {
        // The slot still empty: a key may have a filled slot before it
        // (piped messages parked one after the other, all under
        // progress::PIPE_ID), which must keep its completion.
        match order.iter_mut().find(|x| key != 0 && x.0 == key && x.1.is_none()) {
            Some(slot) => slot.1 = Some(pr),
            None => order.push_back((0, Some(pr))),
        }
    }
    while ep.peers[p].rx.order.front().is_some_and(|x| x.1.is_some()) {
        let (_, pr) = ep.peers[p].rx.order.pop_front().expect("front checked");
        let pr = pr.expect("checked");
        emit_rx(ep, ctx, p, &pr.dest, &pr.info, pr.err);
    }
}

/// A bit of [`RxInfo::hflags`] that no sender sets (`hdr_flags` has
/// bits 0-3): a stream message read by single copy, sampled at the read
/// (its STREAM bit then cleared). Set by a peer, it only keeps its
/// messages out of the stream measure.
pub(crate) const STREAM_SAMPLED: u8 = 0x80;

/// A message of a pick class ([`crate::proto::pick_class`]) from `p`
/// completed (its data in place): a sample of its stream's rate if its
/// sender flagged it part of one (by two copies: those read by single copy
/// were sampled at the read, [`STREAM_SAMPLED`]), else the end of any
/// stream (the next sample would span this message).
#[inline(never)]
fn stream_sample(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, info: &RxInfo) {
    let sp = &mut ep.peers[p].stream_pick;
    match crate::proto::pick_class(ctx.cfg, info.total) {
        _ if info.hflags & STREAM_SAMPLED != 0 => {}
        Some(c) if info.hflags & hdr_flags::STREAM != 0 => {
            sp.sample(c, false, info.total, crate::proto::ticks());
        }
        _ => sp.interrupt(),
    }
}

/// A receive that completed without error, for [`complete_rx_ok`].
pub(crate) struct RxOk {
    pub op_context: usize,
    pub buf: usize,
    pub len: usize,
    pub tagged: bool,
    pub hflags: u8,
    pub data: u64,
    pub tag: u64,
    pub multi_release: bool,
}

impl RxOk {
    /// Its CQ entry.
    #[inline(always)]
    pub(crate) fn entry(&self) -> CqTaggedEntry {
        let has_data = self.hflags & hdr_flags::REMOTE_CQ_DATA != 0;
        CqTaggedEntry {
            op_context: self.op_context,
            flags: rx_flags(self.tagged, self.hflags, self.multi_release),
            len: self.len,
            buf: self.buf,
            data: if has_data { self.data } else { 0 },
            tag: if self.tagged { self.tag } else { 0 },
        }
    }
}

/// Completion flags of a receive.
#[inline]
fn rx_flags(tagged: bool, hflags: u8, multi_release: bool) -> u64 {
    let mut flags = FI_RECV | if tagged { FI_TAGGED } else { FI_MSG };
    if hflags & hdr_flags::REMOTE_CQ_DATA != 0 {
        flags |= FI_REMOTE_CQ_DATA;
    }
    if multi_release {
        flags |= FI_MULTI_RECV;
    }
    flags
}

/// A successful receive: the receive counter, and the CQ entry when one is
/// asked for (`entry`) in `cq` (the endpoint's receive CQ, looked up by
/// the caller). Shared by the general path ([`emit_rx`]) and the inline
/// fast path; inlined, so `ok` is never a struct re-read from memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn complete_rx_ok(
    b: &Bindings,
    peers: &mut Peers,
    counters: &[shm_layout::Counter],
    avs: &crate::table::Slots<crate::av::AvState>,
    cq: Option<&mut CqState>,
    p: usize,
    ok: &RxOk,
    entry: bool,
) {
    b.count(counters, CntrKind::Recv, Val::Success);
    if !entry {
        return;
    }
    let Some(cq) = cq else {
        return;
    };
    let e = ok.entry();
    // The read that runs this pass takes it, wanting no source, and no
    // channel waits for a signal: the common case, with one look at the CQ.
    if cq.sink_write_plain(&e) {
        return;
    }
    // Each only if it will be used.
    let src = if cq.wants_src() { peers.src_addr(avs, p) } else { FI_ADDR_NOTAVAIL };
    let sig = if cq.notifies() { b.rx_signal(ok.hflags) } else { Signal::Normal };
    cq.push_ext(e, src, sig);
}

/// FI_SOURCE_ERR (fi_cq(3)): a message received whole from a source the
/// AV does not hold completes as an `FI_EADDRNOTAVAIL` error entry with
/// the entry's fields, its error data the source's raw address (which
/// `fi_av_insert` takes). Only `emit_rx` completes receives of such an
/// endpoint (`Matching::front_plain` is off for it).
#[cold]
#[inline(never)]
fn unknown_source(cq: &mut CqState, addr: crate::Address, ok: &RxOk) {
    let t = ok.entry();
    let e = CqErrEntry {
        op_context: t.op_context,
        flags: t.flags,
        len: t.len,
        buf: t.buf,
        data: t.data,
        tag: t.tag,
        err: ErrorKind::AddrNotAvail.errno(),
        prov_errno: prov::UNKNOWN_SOURCE,
        ..Default::default()
    };
    cq.push_err_data(e, addr.to_bytes().to_vec());
}

/// A piece of the multi-receive buffer `id` (an SRQ's if its id says so,
/// else the endpoint's own) is reported: whether its entry carries
/// FI_MULTI_RECV ([`super::matching::MultiRecs::settle`]).
#[cold]
#[inline(never)]
fn settle_multi(ep: &mut EpState, ctx: &mut Ctx<'_>, id: u32) -> bool {
    if id & super::matching::MultiRecs::SRQ == 0 {
        return ep.matching.multi.settle(id);
    }
    ep.matching.srq.and_then(|s| ctx.srqs.get_mut(s)).is_some_and(|q| q.multi.settle(id))
}

/// Writes a finished receive's completion (success, truncation or error).
/// A piece of a multi-receive buffer is settled here: its entry has
/// FI_MULTI_RECV when it is the buffer's last report.
#[inline]
pub(crate) fn emit_rx(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, d: &Dest, i: &RxInfo, err: Option<Fail>) {
    if d.iovs.ext_slot().is_some() {
        if let Some(q) = ep.matching.srq.and_then(|s| ctx.srqs.get_mut(s)) {
            q.release(&d.iovs);
        }
    }
    let multi_release = if d.keys.multi != 0 { settle_multi(ep, ctx, d.keys.multi) } else { d.multi_release };
    let err = err.or_else(|| {
        (i.total > d.cap).then(|| {
            (
                ErrorKind::Trunc,
                prov::TRUNCATED,
                format!(
                    "message of {} bytes from {} truncated to the {}-byte receive buffer",
                    i.total,
                    crate::av::AddressVector::straddr(&ep.peers[p].addr),
                    d.cap
                ),
            )
        })
    });
    let Some((k, pe, detail)) = err else {
        if !d.dw.is_none() {
            // Deferred work's receive: its completion counter; its
            // endpoint hears of it only if it asked (FI_COMPLETION).
            count_deferred(&ep.bind, ctx.counters, d.dw, false);
            if d.dw.quiet() {
                return;
            }
        }
        let ok = RxOk {
            op_context: d.ctx,
            buf: d.buf,
            len: i.delivered,
            tagged: i.tagged,
            hflags: i.hflags,
            data: i.data,
            tag: i.tag,
            multi_release,
        };
        let entry = d.cqe || multi_release;
        if ep.matching.source_err() && entry && ep.peers.src_addr(ctx.avs, p) == FI_ADDR_NOTAVAIL {
            if let Some(cq) = ep.bind.rx_cq.and_then(|c| ctx.cqs.get_mut(c)) {
                ep.bind.count(ctx.counters, CntrKind::Recv, Val::Success);
                return unknown_source(cq, ep.peers[p].addr, &ok);
            }
        }
        let cq = ep.bind.rx_cq.and_then(|c| ctx.cqs.get_mut(c));
        complete_rx_ok(&ep.bind, &mut ep.peers, ctx.counters, ctx.avs, cq, p, &ok, entry);
        return;
    };
    rx_error(&ep.bind, ctx, d, i, multi_release, (k, pe, detail));
}

/// The completion of a peek, or of a discard (FI_DISCARD), on a tagged
/// receive: `Ok((p, info))` for a message from peer `p`, written with
/// `info.delivered` as its length, NULL as its buffer, and its tag, data
/// and source; `Err` an error entry (a peek that found nothing). Always
/// written to the receive CQ (whatever FI_SELECTIVE_COMPLETION says: the
/// entry is the operation's only result); no counter counts, since no data
/// moved.
pub(crate) fn probe_entry(
    ep: &mut EpState,
    ctx: &mut Ctx<'_>,
    op_context: usize,
    r: std::result::Result<(usize, RxInfo), Fail>,
) {
    let Some(cq) = ep.bind.rx_cq.and_then(|c| ctx.cqs.get_mut(c)) else {
        return;
    };
    match r {
        Ok((p, i)) => {
            let src = ep.peers.src_addr(ctx.avs, p);
            let e = CqTaggedEntry {
                op_context,
                flags: rx_flags(true, i.hflags, false),
                len: i.delivered,
                buf: 0,
                data: if i.hflags & hdr_flags::REMOTE_CQ_DATA != 0 { i.data } else { 0 },
                tag: i.tag,
            };
            cq.push_ext(e, src, Signal::Normal);
        }
        Err((k, pe, detail)) => cq.push_err(
            CqErrEntry { op_context, flags: FI_RECV | FI_TAGGED, err: k.errno(), prov_errno: pe, ..Default::default() },
            detail,
        ),
    }
}

/// A receive that never took a message ends (cancelled, or flushed when
/// its endpoint closes): its error entry, `err` saying why.
pub(crate) fn unused_rx(b: &Bindings, ctx: &mut Ctx<'_>, d: &Dest, tagged: bool, err: Fail) {
    let info = RxInfo { tagged, tag: 0, data: 0, hflags: 0, total: 0, delivered: 0 };
    rx_error(b, ctx, d, &info, d.multi_release, err);
}

/// A receive's error: the receive counter's error value, and the error
/// entry in the receive CQ (with FI_MULTI_RECV if `multi_release`).
fn rx_error(b: &Bindings, ctx: &mut Ctx<'_>, d: &Dest, i: &RxInfo, multi_release: bool, (k, pe, detail): Fail) {
    if !d.dw.is_none() {
        // As in `emit_rx`, on the error value.
        count_deferred(b, ctx.counters, d.dw, true);
        if d.dw.quiet() {
            return;
        }
    }
    b.count(ctx.counters, CntrKind::Recv, Val::Error);
    let Some(cq) = b.rx_cq.and_then(|c| ctx.cqs.get_mut(c)) else {
        return;
    };
    cq.push_err(
        CqErrEntry {
            op_context: d.ctx,
            flags: rx_flags(i.tagged, i.hflags, multi_release),
            len: i.delivered,
            buf: d.buf,
            data: if i.hflags & hdr_flags::REMOTE_CQ_DATA != 0 { i.data } else { 0 },
            tag: if i.tagged { i.tag } else { 0 },
            olen: i.total.saturating_sub(d.cap),
            err: k.errno(),
            prov_errno: pe,
            ..Default::default()
        },
        detail,
    );
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn counters_move_only_by_count_and_set() {
        // SAFETY: Counter is two atomic words (with padding); all zeroes is
        // a valid value of it.
        let c: shm_layout::Counter = unsafe { std::mem::zeroed() };
        count(&c, Val::Success, 2);
        count(&c, Val::Error, 1);
        assert_eq!((c.value.v.load(Ordering::Relaxed), c.err.v.load(Ordering::Relaxed)), (2, 1));
        set(&c, Val::Success, 7);
        set(&c, Val::Error, 0);
        assert_eq!((c.value.v.load(Ordering::Relaxed), c.err.v.load(Ordering::Relaxed)), (7, 0));
    }

    #[test]
    fn completion_flags_and_counters_come_from_the_kind() {
        assert_eq!(OpKind::Msg.completion_flags(), FI_SEND | FI_MSG);
        assert_eq!(OpKind::Tagged.completion_flags(), FI_SEND | FI_TAGGED);
        assert_eq!(OpKind::Read.completion_flags(), FI_RMA | FI_READ);
        assert_eq!(OpKind::Write.completion_flags(), FI_RMA | FI_WRITE);
        assert_eq!(OpKind::FetchAtomic.completion_flags(), FI_ATOMIC | FI_READ);
        assert_eq!(OpKind::Msg.counter(), Some(CntrKind::Send));
        assert_eq!(OpKind::Write.counter(), Some(CntrKind::Write));
        assert_eq!(OpKind::CompareAtomic.counter(), Some(CntrKind::Read));
        assert_eq!(OpKind::CntrAdd.counter(), None);
        let mut b = Bindings::new();
        b.bind_cntr(CntrKind::RemoteWrite, 3);
        assert_eq!(b.cntr(CntrKind::RemoteWrite), Some(3));
        assert_eq!(b.counters().collect::<Vec<_>>(), vec![3]);
        assert!(!b.can_report_tx());
    }

    #[test]
    fn a_peer_cannot_reuse_an_id_the_order_holds() {
        let mut rx = PeerRx::new();
        assert!(rx.has(0), "id 0 marks completions on arrival");
        assert!(!rx.has(7));
        let d = Dest { cqe: true, ..Default::default() };
        let a = ActiveRecv { dest: d, total: 100, received: 0, tag: 0, data: 0, hflags: 0, timed: None, fin: false };
        rx.start_matched(7, RxCur::Active(a));
        assert!(rx.has(7), "in progress");
        assert!(rx.take(7).is_some());
        assert!(rx.has(7), "out of progress, its place in the order still held");
        assert!(!rx.has(8));
    }

    #[test]
    fn receive_order_is_kept_per_peer() {
        let mut rx = PeerRx::new();
        assert!(rx.in_order());
        rx.start_unexp(5, 1, 100);
        assert!(rx.in_order(), "an unmatched message has no place yet");
        assert!(!rx.feeding());
        let d = Dest { cqe: true, ..Default::default() };
        rx.matched(
            5,
            ActiveRecv { dest: d, total: 100, received: 10, tag: 0, data: 0, hflags: 0, timed: None, fin: false },
        );
        assert!(!rx.in_order());
        assert!(rx.feeding());
        assert_eq!(rx.active_count(), 1);
        assert!(matches!(rx.take(5), Some(RxCur::Active(_))));
        assert!(rx.get_mut(5).is_none(), "out of progress");
        assert!(rx.has(5), "its id still held by its place");
        let (order, parts) = rx.drain_all();
        assert_eq!((order.len(), parts.len()), (1, 0), "its place stays until it completes");
    }
}
