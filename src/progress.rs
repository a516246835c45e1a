//! The progress engine: one pass drains an endpoint's inbound rings and
//! overflow queue (bounded batch per ring), matches messages against posted
//! receives (or queues them as unexpected, within bounded memory), writes
//! completions and counter updates, and moves queued transmits forward. The
//! state it works on is the endpoint's owned parts ([`crate::engine`]).
//!
//! Everything read from shared memory is checked before use: a length,
//! index, offset or order that does not fit drops the message and fails the
//! receive it belonged to (`prov::PROTOCOL`); it never indexes out of bounds.
//!
//! Back-pressure: a pass stops reading a ring (leaving the message in place)
//! when the receive CQ is at its size or the unexpected-message budget is
//! spent; the ring then fills and the sender's inline sends queue up until
//! its transmit queue is full, when they return `-FI_EAGAIN`.

use crate::cma::{self, CmaError};
use crate::cq::prov;
use crate::domain::{Ctx, CtxSource};
use crate::engine::complete::{
    complete_rx_ok, complete_send, emit_rx, finish_rx, probe_entry, unused_rx, ActiveRecv, CntrKind, Fail, PendingRx,
    RxCur, RxInfo, RxOk, SplitRecv,
};
use crate::engine::inbound::InRing;
use crate::engine::matching::{Dest, Discard, PostedRecv, Unexp, UnexpBody};
use crate::engine::peers::Chan;
use crate::engine::tx::{local_ranges, Ctrl, TxState};
use crate::engine::EpState;
use crate::error::{Error, ErrorKind, Result};
use crate::proto::MAX_MSG_SIZE;
use crate::ring::{fits_cells, payload_capacity, piped_capacity, RingView};
use crate::sync::Ordering;
use shm_layout::wire::{self, CtrlKind, WireError};
use shm_layout::{hdr_flags, op, rts_flags, MsgHdr, CELL_PAYLOAD, MAX_IOV, OVF_PAYLOAD};

/// Messages taken from one ring or the overflow queue per pass.
const BATCH: usize = 64;

/// Inline messages of a stream taken from one ring per pass, at most. A
/// stream read 16 entries at a time (`shmfab bench msgrate`'s receiver,
/// as osu_mbw_mr's) then goes from the ring straight into each read's
/// array, a pass per read, instead of the first read's pass taking the
/// whole window and queueing what its array could not hold in the CQ, to
/// be copied out again by the reads after it (about 65 instructions more
/// per entry than one written straight into the array; a further pass
/// costs about 250: `examples/halftrip --stream`, 64 messages read 16 at
/// a time, 570 -> 538 instructions per message). What is left in the
/// ring is not held back: it stays ready, for the next pass and for a
/// sleeper's check. A read with a larger array pays a pass per 16
/// messages of a stream (about 15 instructions per message). The pool
/// path's messages (fragments of larger ones) count only towards
/// [`BATCH`]: with every message counted, 16 KiB streams lost 4-6% of
/// their bandwidth near (better in 3 of 14 paired rounds). Measured
/// (paired alternating rounds, each tagged with the raw floor just
/// before; against 64 messages per pass): `bench msgrate` 8 B near (raw
/// 0.03-0.07 us) better in 10 of 11, median +1.44 Mmsg/s (30.46 against
/// 28.70), far (raw 0.09-0.2) 8 of 12, +0.5 to +0.7; 16 KiB bandwidth 4
/// of 8 (median +0.05 GB/s); the 8 B ping-pong (a lone message, which
/// never reaches the count) 8 of 14, median -1 ns. Counting every
/// message, 32 instead of 16 was better in 7 of 12 rounds (+0.48), 16 in
/// 9 of 12 (+0.97).
const RING_BATCH: usize = 16;

/// What a handler did with a message.
#[derive(PartialEq, Eq)]
enum Flow {
    /// Consumed.
    Done,
    /// Not consumed: try again on a later pass.
    Stall,
    /// Not consumed: a piped message whose payload its sender is still
    /// writing (no work for a sleeper until it is whole: see
    /// `InRing::pipe_wait`).
    Wait,
}

/// The message id under which a piped message's matched receive waits in
/// its peer's receive order when the pass left it before its payload was
/// whole ([`take_piped`]). Senders number their messages from 1 and never
/// reach it; a broken peer that names it only breaks its own message.
pub(crate) const PIPE_ID: u64 = u64::MAX;

/// Polls of a piped message's progress that find nothing new before
/// [`pipe_copy`] gives up for this pass (its sender descheduled, stopped,
/// or dead): each one a load and a pause. The sender writes a 4 KiB piece
/// in well under a microsecond when it runs.
const PIPE_SPINS: u32 = 1024;

/// Where a message's payload is.
#[derive(Clone, Copy)]
enum Src<'a> {
    Ring(RingView, usize),
    Buf(&'a [u8]),
}

/// Where an inline message's payload is, for [`on_eager`] and what it
/// calls: a [`Src`] (a ring's message, or the overflow queue's), or a
/// whole piped message ([`Piped`]). Generic rather than one more `Src`
/// variant: the plain message's path, compiled for `Src`, stays as it was
/// (a third variant cost the message rate's path 5-8 instructions a
/// message by callgrind, in moves and its test).
trait Payload: Copy {
    fn cap(&self) -> usize;
    /// Caller keeps `off + dst.len() <= cap()`.
    fn read(&self, off: usize, dst: &mut [u8]);
}

impl Payload for Src<'_> {
    #[inline(always)]
    fn cap(&self) -> usize {
        Src::cap(self)
    }
    #[inline(always)]
    fn read(&self, off: usize, dst: &mut [u8]) {
        Src::read(self, off, dst)
    }
}

/// A whole piped message's payload: from the second cell of the message
/// at `0`, `1` bytes of room.
#[derive(Clone, Copy)]
struct Piped(RingView, usize);

impl Payload for Piped {
    #[inline(always)]
    fn cap(&self) -> usize {
        self.1
    }
    #[inline(always)]
    fn read(&self, off: usize, dst: &mut [u8]) {
        self.0.read_payload(CELL_PAYLOAD + off, dst)
    }
}

impl Src<'_> {
    fn cap(&self) -> usize {
        match self {
            Src::Ring(_, c) => *c,
            Src::Buf(b) => b.len(),
        }
    }
    /// Caller keeps `off + dst.len() <= cap()`.
    #[inline(always)]
    fn read(&self, off: usize, dst: &mut [u8]) {
        match self {
            Src::Ring(r, _) => r.read_payload(off, dst),
            Src::Buf(b) => crate::copy::copy_slice(dst, &b[off..off + dst.len()]),
        }
    }
    /// The payload's first bytes, as many as `buf` holds and the message
    /// has, for a decoder of [`wire`]. Inline: a call per pool fragment
    /// received.
    #[inline(always)]
    fn head<'b>(&self, buf: &'b mut [u8]) -> &'b [u8] {
        let n = buf.len().min(self.cap());
        self.read(0, &mut buf[..n]);
        &buf[..n]
    }
}

/// One progress pass over an endpoint. The rings are drained last but for
/// the transmit queues (which the messages handled may have fed): a
/// message found there completes the caller's read, and whatever the pass
/// does after it adds to that message's latency. Inlined into the domain's
/// pass (so into the CQ read): no call between the read and the message
/// (8 B half round trip 1.5-4 ns faster in two paired runs of 30 rounds;
/// 2 KiB more code).
#[inline(always)]
pub(crate) fn progress_ep(ep: &mut EpState, ctx: &mut impl CtxSource) {
    if let Some(claimed) = ep.inbound.new_claims(&ep.sec) {
        ep.inbound.accept_claims(&ep.sec, &mut ep.peers, claimed);
    }
    // After the claims: a peer found dead may have left messages in a ring
    // it just claimed (see Inbound::may_hold).
    ep.hk_left -= 1;
    if ep.hk_left == 0 {
        ctx.with(|ctx| housekeeping(ep, ctx));
    }
    // The overflow queue holds the messages of senders without a ring: no
    // order to keep with the rings'.
    if ep.sec.header().ovf_used.load(Ordering::Relaxed) != 0 {
        ctx.with(|ctx| drain_ovf(ep, ctx));
    }
    if ep.inbound.has_rings() {
        // Drained in place: while the pass is on, no handler reaches the
        // ring slots (see Inbound's invariants), so the ring being read is
        // not aliased by `ep`.
        let rings = ep.inbound.rings_for_pass();
        let mut bits = rings.mask();
        while bits != 0 {
            let s = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            // SAFETY: s is a set bit of the mask of this pass, not done
            // yet, and the reference ends with this iteration.
            let r = unsafe { rings.get(s) };
            // An empty ring costs one load here, not a call: the poll
            // loop's iteration, whose length delays the finding of a
            // message. Nothing to do for it: no message to take or hold
            // back, and its head was published by the pass that moved it
            // (drain_ring gives credit before it returns).
            if r.rx.ready() {
                drain_ring(ep, ctx, r);
            }
        }
        ep.inbound.pass_done();
    }
    if ep.tx.any_busy() {
        ctx.with(|ctx| ep.progress_tx(ctx));
    }
}

/// Now and then: peers checked for life, a stuck overflow claim looked
/// at, gauges published.
#[cold]
#[inline(never)]
fn housekeeping(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    ep.passes = ep.passes.wrapping_add(ep.hk_from);
    ep.hk_left = crate::engine::HK_PERIOD;
    ep.hk_from = crate::engine::HK_PERIOD;
    let now = std::time::Instant::now();
    if now.duration_since(ep.last_check) >= ctx.cfg.peer_check {
        ep.last_check = now;
        check_peers(ep, ctx);
        if ep.sec.header().ovf_used.load(Ordering::Relaxed) != 0 {
            check_ovf_claim(ep, ctx, now);
        }
    }
    publish_gauges(ep, ctx);
}

/// Publishes what this endpoint holds for `shmfab inspect` (relaxed
/// stores to our own header line, now and then, not per message).
fn publish_gauges(ep: &EpState, ctx: &Ctx<'_>) {
    let h = ep.sec.header();
    let rx_active: usize = ep.peers.iter().map(|p| p.rx.active_count()).sum();
    h.tx_queued.store(ep.tx.outstanding() as u32, Ordering::Relaxed);
    let srq = ep.matching.srq.and_then(|s| ctx.srqs.get(s)).map_or(0, |q| q.len());
    h.rx_posted.store((ep.matching.posted_count() + srq) as u32, Ordering::Relaxed);
    h.unexpected.store(ep.matching.unexp_count() as u32, Ordering::Relaxed);
    h.rx_active.store(rx_active as u32, Ordering::Relaxed);
    h.passes.store(ep.passes as u64, Ordering::Relaxed);
}

/// Checks every peer we wait on; fails what is pending with dead ones.
fn check_peers(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    for p in 0..ep.peers.len() {
        if ep.peers[p].gone.is_some() || !(ep.pending_with(p) || ep.inbound.waits_on_pipe(p)) {
            continue;
        }
        if let Some(why) = ep.peers.gone_reason(ep.addr, ctx.regions, p) {
            // A piped message it never finished writing can never be
            // delivered: dropped (its receive, if matched, fails below).
            ep.stats.pipes_dropped += ep.inbound.drop_unfinished_pipes(p) as u64;
            // What it sent before going is delivered first: fail its
            // pending operations only once nothing of it is left in our
            // inbound queues (the overflow queue is shared: any entry there
            // defers the decision to the next check).
            if !ep.inbound.may_hold(&ep.sec, p) {
                fail_peer(ep, ctx, p, why);
            }
        }
    }
}

impl EpState {
    /// Our channel to peer `p` was taken from us (its endpoint closed, its
    /// section maybe reopened): fail everything pending with it, as for a
    /// dead peer, once nothing it sent is left in our inbound queues (else
    /// the next check does). Returns why, for the send that found it.
    pub(crate) fn chan_lost(&mut self, ctx: &mut Ctx<'_>, p: usize) -> String {
        if let Some(why) = &self.peers[p].gone {
            return why.to_string();
        }
        let who = crate::av::AddressVector::straddr(&self.peers[p].addr);
        let why =
            format!("peer {who} (pid {}) closed its endpoint: its ring slot is no longer ours", self.peers[p].pid);
        if !self.inbound.may_hold(&self.sec, p) {
            fail_peer(self, ctx, p, why.clone());
        }
        why
    }
}

/// The overflow queue is shared: a sender that died between claiming an
/// entry and publishing it would block every sender behind it for ever.
/// When the head has stayed claimed but unpublished for a peer-check
/// period, and the source its claimant wrote first names a peer that is
/// gone (process dead, domain or endpoint closed: none of which can happen
/// in the middle of a push), the entry is freed. A claimant that wrote no
/// source yet cannot be named, and is waited for.
fn check_ovf_claim(ep: &mut EpState, ctx: &mut Ctx<'_>, now: std::time::Instant) {
    let Some((pos, src)) = ep.inbound.ovf.blocked_head() else {
        ep.inbound.ovf_stuck = None;
        return;
    };
    match ep.inbound.ovf_stuck {
        Some((p, since)) if p == pos => {
            if now.duration_since(since) < ctx.cfg.peer_check || !src.is_plausible() {
                return;
            }
            let peer = ep.peers.index_of(src);
            if ep.peers.gone_reason(ep.addr, ctx.regions, peer).is_some() {
                ep.inbound.ovf.skip();
                ep.stats.ovf_skipped += 1;
                ep.inbound.ovf_stuck = None;
            }
        }
        _ => ep.inbound.ovf_stuck = Some((pos, now)),
    }
}

/// Fails everything pending with a peer that is gone. Messages it left in
/// our rings are still delivered by later passes; only what can never
/// complete fails.
fn fail_peer(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, why: String) {
    let fail = || (ErrorKind::Io, prov::PEER_GONE, why.clone());
    ep.peers[p].gone = Some(why.as_str().into());
    // Our sends to it, queued or in flight, in order.
    let ops = ep.tx.take_all(&mut ep.peers[p].tx);
    for op in ops {
        let err = if op.state == TxState::Done { op.err.clone() } else { Some(fail()) };
        complete_send(&ep.bind, ctx, op.done(), err);
    }
    // Receives whose data it was still sending.
    for (msg_id, cur) in ep.peers[p].rx.drain_parts() {
        match cur {
            RxCur::Active(a) => finish_active(ep, ctx, p, msg_id, a, Some(fail())),
            RxCur::Split(sp) => {
                let mut info = sp.info;
                info.delivered = 0;
                finish_rx(ep, ctx, p, msg_id, PendingRx { dest: sp.dest, info, err: Some(fail()) });
            }
            // Never complete: drop it.
            RxCur::Unexp { id, .. } => ep.matching.drop_unexp(id),
        }
    }
    // Unexpected rendezvous from it: the data is gone with it.
    ep.matching.drop_rts_from(p);
    // Receives directed at it.
    for (tagged, d) in ep.matching.take_directed(p) {
        let info = RxInfo { tagged, tag: 0, data: 0, hflags: 0, total: 0, delivered: 0 };
        finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: Some(fail()) });
    }
}

/// Reads up to [`BATCH`] messages ([`RING_BATCH`] inline ones) of ring
/// `r` (drained in place by [`progress_ep`]), which holds one at least
/// (its caller found it [`ready`](crate::ring::RingRx::ready)). The common
/// case of a ping-pong first ([`lone_inline`]), with no call on its way;
/// anything else by [`drain_general`], out of line. Inlined into the pass
/// (so into the CQ read) since the pass builds no context for it
/// ([`crate::domain::PassCtx`]): 568 -> 552 instructions per 8 B half
/// trip, 141 -> 128 per empty CQ read (out of line, before that, inlining
/// it had cost the empty read 5-21).
#[inline(always)]
fn drain_ring(ep: &mut EpState, ctx: &mut impl CtxSource, r: &mut InRing) {
    if !lone_inline::<false>(ep, ctx, r) {
        ctx.with(|ctx| drain_general(ep, ctx, r));
    }
}

/// Largest payload [`lone_inline`] takes (`SMALL`: from [`drain_general`]): four
/// cells' worth (224 bytes).
/// Its cell count may be more (a lap end: `crate::ring`). Session 19,
/// paired `scripts/ab.sh` against one cell, far (raw 8 B 0.19-0.20 us):
/// 64 B 0.346 -> 0.318 us (better in 9 of 10), 200 B 0.412 -> 0.377 (10
/// of 10), 8 B tied (+0.0005, 5 of 10).
const LONE_MAX: usize = payload_capacity(4);

/// The common case of [`drain_ring`], done without its general records:
/// the ring's next message is an inline one of one cell (`SMALL`: of at
/// most [`LONE_MAX`] bytes, in more cells, from [`drain_general`]) from a peer not
/// broken and with nothing earlier waiting to complete, the oldest posted
/// receive takes it whole ([`Matching::front_plain`]) and wants an entry,
/// no receive counter is bound, and the open sink of the read running this
/// pass takes the entry as it is ([`CqState::sink_plain_room`]). Each of
/// these is decided before anything changes: false, having changed
/// nothing, when one fails ([`drain_general`] then takes the ring as it
/// always did). What it does is what [`drain_general`] would (the same
/// steps, in the same order): the general path's calls out of line (a bad
/// message's report, a handler, the general match) kept values spilled to
/// the stack across the whole of it (about 40 moves), and none is needed
/// here.
///
/// [`Matching::front_plain`]: crate::engine::matching::Matching::front_plain
/// [`CqState::sink_plain_room`]: crate::cq::CqState::sink_plain_room
#[inline(always)]
fn lone_inline<const SMALL: bool>(ep: &mut EpState, ctx: &mut impl CtxSource, r: &mut InRing) -> bool {
    let peer = r.peer;
    // SAFETY: a ring's peer is an index the peer table gave
    // (Inbound::accept_claims, by index_of).
    let pr = unsafe { ep.peers.get_unchecked_mut(peer) };
    if pr.broken || !pr.rx.in_order() {
        return false;
    }
    let (h, ncells) = r.rx.current();
    let len = h.len as usize;
    if SMALL {
        // (A cell count of 0, a broken peer's, fails the first test.)
        if !fits_cells(len, ncells) || h.op != op::EAGER || len > LONE_MAX {
            return false;
        }
    } else if ncells != 1 || h.op != op::EAGER || len > payload_capacity(1) {
        return false;
    }
    // The CQ's checks before the match (3 instructions fewer than after it,
    // by the register allocation; first of all, 5 more).
    if ep.bind.cntr(CntrKind::Recv).is_some() {
        return false;
    }
    let Some(c) = ep.bind.rx_cq else {
        return false;
    };
    // SAFETY: a receive CQ in the bindings is bound, so live (see
    // `Bindings::rx_cq`).
    let q = unsafe { ctx.cqs().get_live_mut(c) };
    if !q.sink_plain_room() {
        return false;
    }
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    let Some((op_context, seg, true)) = ep.matching.front_plain(tagged, peer, h.tag, len) else {
        return false;
    };
    // As drain_general: the peer speaks (our next push to it may be an
    // answer); the message is copied, its receive taken, its entry written.
    // SAFETY: as for `pr` above.
    unsafe { ep.peers.get_unchecked_mut(peer) }.heard = true;
    // SAFETY: the posted receive's buffer, valid and writable until its
    // completion (the posting contract; never null: the API's segments are
    // slices, and the C provider makes an empty one of a {NULL, 0} iovec);
    // len <= its length (front_plain) and <= the payload of the message's
    // cells (checked above).
    debug_assert!(len <= seg.len && seg.ptr != 0);
    let dst = unsafe { std::slice::from_raw_parts_mut(seg.ptr as *mut u8, len) };
    r.rx.view().read_payload(0, dst);
    ep.matching.pop_front(tagged);
    let ok =
        RxOk { op_context, buf: seg.ptr, len, tagged, hflags: h.flags, data: h.data, tag: h.tag, multi_release: false };
    // SAFETY: sink_plain_room said so just above; the copy into the
    // receive's buffer and the pop changed nothing of the CQ.
    unsafe { q.sink_put_plain(&ok.entry()) };
    ep.stats.rx_ring += 1;
    // The pass's first message: the credit is given below, as drain_general
    // does.
    r.rx.advance(ncells);
    r.held = if r.rx.ready() { ctx.with(|ctx| drain_more(ep, ctx, r, peer, 1)) } else { false };
    r.rx.release_credit();
    ep.inbound.flush_freed();
    true
}

/// [`drain_ring`] in general. Each message is handled through a copy of
/// its place ([`RingView`]). The first message is taken here, the rest (a
/// stream: a ping-pong's message comes alone) by [`drain_more`], out of
/// line: the one message's path then keeps fewer values live (no counts
/// of the loop, no fetch ahead).
#[inline(never)]
fn drain_general(ep: &mut EpState, ctx: &mut Ctx<'_>, r: &mut InRing) {
    // A message of more than one cell (up to LONE_MAX bytes, or a lap
    // end) the lone way, here out of line: the one-cell path's tests stay
    // as they were (the four-cell test inline cost the 8 B half trip 18
    // instructions by `scripts/profile.sh`, and a call to it from the pass
    // the empty CQ read 8).
    if lone_inline::<true>(ep, ctx, r) {
        return;
    }
    let peer = r.peer;
    // SAFETY: a ring's peer is an index the peer table gave
    // (Inbound::accept_claims, by index_of).
    let pr = unsafe { ep.peers.get_unchecked_mut(peer) };
    if pr.broken {
        r.held = true; // never read again: no work for a sleeper
        return;
    }
    // The peer speaks: our next push to it may be an answer.
    pr.heard = true;
    let held = match take_one(ep, ctx, r, peer, false) {
        Step::Stop(held) => held,
        Step::Next(_) if !r.rx.ready() => false,
        Step::Next(eager) => drain_more(ep, ctx, r, peer, eager as usize),
    };
    r.held = held;
    r.rx.release_credit();
    ep.inbound.flush_freed();
}

/// What [`take_one`] did.
enum Step {
    /// Stop reading this ring in this pass: whether it is held (the
    /// message stays for a later pass: back-pressure).
    Stop(bool),
    /// Consumed; whether it was an inline message.
    Next(bool),
}

/// Reads and handles the message at the head of ring `r` (published: the
/// caller found it ready), and consumes it unless it stays. `ahead`: a
/// stream, fetch the next cells early and give credit when due (see
/// `RingRx::consume`); not for the pass's first message, whose caller
/// gives the credit.
#[inline(always)]
fn take_one(ep: &mut EpState, ctx: &mut Ctx<'_>, r: &mut InRing, peer: usize, ahead: bool) -> Step {
    let (h, ncells) = r.rx.current();
    if ncells == 0 {
        // A cell count that does not fit the ring: we cannot find the
        // next message, so this peer's ring is dead to us.
        bad(ep, ctx, peer, None, "cell count out of range");
        ep.peers[peer].broken = true;
        return Step::Stop(false);
    }
    if h.op == op::PIPED {
        // Its own step, out of line. The test costs the message rate's
        // path about 6 instructions a message by callgrind (`halftrip
        // --stream`, 471 -> 477), the pool's 64 KiB half trip about 45;
        // every other place tried cost one of them more (the ring passed
        // to a call on a path that joins the inline one's made it reload
        // the ring; all other kinds out of line, 40 a pool fragment).
        return piped_step(ep, ctx, r, peer, &{ h }, ncells, ahead);
    }
    let src = Src::Ring(r.rx.view(), payload_capacity(ncells));
    // The call out of line gets copies, so that the header and place
    // stay in registers on the inline path (see on_eager).
    let eager = h.op == op::EAGER;
    let flow = if eager { on_eager(ep, ctx, peer, &h, &src) } else { handle(ep, ctx, peer, &{ h }, &{ src }) };
    if flow == Flow::Stall {
        ep.stats.stalls += 1;
        return Step::Stop(true);
    }
    ep.stats.rx_ring += 1;
    step_past(r, ncells, ahead);
    Step::Next(eager)
}

/// Moves past a message taken from ring `r`: `ahead`, in a stream (see
/// `RingRx::consume`); else the pass's first message, whose credit
/// drain_ring gives at its end, whatever follows.
#[inline(always)]
fn step_past(r: &mut InRing, ncells: usize, ahead: bool) {
    if ahead {
        r.rx.consume(ncells, true);
    } else {
        r.rx.advance(ncells);
    }
}

/// [`take_one`] for a piped message ([`take_piped`]): consumed when done,
/// else stopped on (held back by a stall, or waiting for its sender).
#[inline(never)]
fn piped_step(
    ep: &mut EpState,
    ctx: &mut Ctx<'_>,
    r: &mut InRing,
    peer: usize,
    h: &MsgHdr,
    ncells: usize,
    ahead: bool,
) -> Step {
    match take_piped(ep, ctx, r, peer, h, ncells) {
        Flow::Done => {}
        Flow::Stall => {
            ep.stats.stalls += 1;
            return Step::Stop(true);
        }
        Flow::Wait => return Step::Stop(false),
    }
    ep.stats.rx_ring += 1;
    step_past(r, ncells, ahead);
    // An inline message: it counts towards RING_BATCH.
    Step::Next(true)
}

/// A piped inline message at the head of ring `r` ([`op::PIPED`]:
/// published before its payload, which its sender writes piece by piece,
/// storing the count written after each; see [`crate::ring`]).
///
/// - Whole already (its progress has reached its length): handled as any
///   inline message ([`on_eager`]).
/// - Not whole, and a posted receive matches it: the receive is taken now
///   and each piece copied into it as it lands, while the sender writes
///   the next ([`pipe_copy`]); the message completes in this pass unless
///   its progress stops moving for [`PIPE_SPINS`] polls (the sender
///   descheduled, stopped or dead). Then the receive waits in the peer's
///   receive order under [`PIPE_ID`] (as a pool message's matched receive
///   does), `InRing::pipe_active` set, and later passes copy on from where
///   it stopped.
/// - Not whole and unexpected: left for a later pass, which takes it
///   whole.
///
/// Until it is whole the message stays at the ring's head (`Flow::Wait`:
/// `InRing::pipe_wait`, so that a sleeper is not kept awake by it; its
/// sender rings the doorbell after the last piece, as after any push). A
/// sender that dies before the last piece leaves it there for good:
/// [`check_peers`] drops it, and fails the receive as it fails the rest.
/// The length, the cell count and the progress word are the peer's: the
/// length is checked against the cells, the progress clamped to the
/// length, and a progress that never arrives only leaves the message
/// waiting.
#[inline(never)]
fn take_piped(ep: &mut EpState, ctx: &mut Ctx<'_>, r: &mut InRing, p: usize, h: &MsgHdr, ncells: usize) -> Flow {
    let view = r.rx.view();
    let len = h.len as usize;
    if std::mem::take(&mut r.pipe_active) {
        return pipe_resume(ep, ctx, r, p, view);
    }
    let cap = piped_capacity(ncells);
    if len > cap {
        r.pipe_wait = false;
        bad(ep, ctx, p, None, "piped length beyond its cells");
        return Flow::Done;
    }
    if view.progress() >= len as u64 {
        r.pipe_wait = false;
        let flow = on_eager(ep, ctx, p, h, &Piped(view, cap));
        if flow == Flow::Done {
            ep.stats.rx_piped += 1;
        }
        return flow;
    }
    r.pipe_wait = true;
    if !ep.bind.rx_room(ctx.cqs) {
        return Flow::Stall;
    }
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    let Some(d) = ep.take_match(ctx, tagged, p, h.tag, len) else {
        // Unexpected: queued once whole, by a later pass.
        return Flow::Wait;
    };
    let mut a = ActiveRecv::new(d, len, h);
    if !pipe_copy(&view, &mut a, PIPE_SPINS) {
        start_active(ep, p, PIPE_ID, a);
        r.pipe_active = true;
        return Flow::Wait;
    }
    r.pipe_wait = false;
    // Whole: complete as eager_match_or_queue does.
    let info = a.info(len.min(a.dest.cap));
    if ep.peers[p].rx.in_order() {
        emit_rx(ep, ctx, p, &a.dest, &info, None);
    } else {
        finish_rx(ep, ctx, p, 0, PendingRx { dest: a.dest, info, err: None });
    }
    ep.stats.rx_piped += 1;
    Flow::Done
}

/// [`take_piped`] for a message whose matched receive a pass left under
/// [`PIPE_ID`]: copies on; completes it when whole.
fn pipe_resume(ep: &mut EpState, ctx: &mut Ctx<'_>, r: &mut InRing, p: usize, view: RingView) -> Flow {
    let Some(RxCur::Active(a)) = ep.peers[p].rx.get_mut(PIPE_ID) else {
        // Its receive was failed meanwhile (a broken peer's message named
        // PIPE_ID): the message has no receive left; dropped whole.
        if view.progress() >= r.rx.current().0.len as u64 {
            r.pipe_wait = false;
            return Flow::Done;
        }
        r.pipe_active = true;
        return Flow::Wait;
    };
    // Waited for only while pieces come: a pass that finds none since the
    // last one looks once and leaves (a sender stopped for good would
    // otherwise cost every pass PIPE_SPINS polls: 26 us each, measured).
    let moved = view.progress().min(a.total as u64) as usize > a.received;
    if !pipe_copy(&view, a, if moved { PIPE_SPINS } else { 0 }) {
        r.pipe_active = true;
        return Flow::Wait;
    }
    r.pipe_wait = false;
    let Some(RxCur::Active(a)) = ep.peers[p].rx.take(PIPE_ID) else { unreachable!("found above") };
    finish_active(ep, ctx, p, PIPE_ID, a, None);
    ep.stats.rx_piped += 1;
    Flow::Done
}

/// Copies the pieces of the piped message at `view` that have landed
/// into `a`'s receive, from `a.received` on, and waits for more while
/// they keep coming: true once the whole message is in; false when its
/// progress has not moved for `spins` polls (what is in stays, and
/// `a.received` says how far). Bytes past the receive's capacity are not
/// copied (the completion reports the truncation).
fn pipe_copy(view: &RingView, a: &mut ActiveRecv, spins: u32) -> bool {
    let mut idle = 0u32;
    loop {
        // The peer's count: clamped to the length the cells were checked
        // against.
        let done = (view.progress().min(a.total as u64)) as usize;
        if done > a.received {
            let from = a.received;
            let to = done.min(a.dest.cap);
            if from < to {
                a.dest.iovs.scatter(from, to - from, |o, dst| view.read_payload(CELL_PAYLOAD + from + o, dst));
            }
            a.received = done;
            idle = 0;
        }
        if a.received == a.total {
            return true;
        }
        idle += 1;
        if idle > spins {
            return false;
        }
        crate::sync::idle_pause();
    }
}

/// The messages of ring `r` after the first ([`drain_ring`]), which are
/// published (`inline` of them so far inline ones); returns whether the
/// ring is held.
#[inline(never)]
fn drain_more(ep: &mut EpState, ctx: &mut Ctx<'_>, r: &mut InRing, peer: usize, mut inline: usize) -> bool {
    // A stream (a lone message, a ping-pong's, never gets here): at most
    // RING_BATCH of its inline messages per pass.
    if inline == RING_BATCH {
        return false;
    }
    for _ in 1..BATCH {
        // Each message found by the check at the end of the loop (the
        // first, by the caller's); from the second in a row on, a stream:
        // fetch ahead.
        match take_one(ep, ctx, r, peer, true) {
            Step::Stop(held) => return held,
            Step::Next(eager) => {
                if !r.rx.ready() {
                    break;
                }
                if eager {
                    inline += 1;
                    if inline == RING_BATCH {
                        break;
                    }
                }
            }
        }
    }
    false
}

fn drain_ovf(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    ep.inbound.ovf_held = false;
    for _ in 0..BATCH {
        let Some(m) = ep.inbound.ovf.peek() else {
            if ep.inbound.ovf_stuck.is_none() {
                if let Some((pos, _)) = ep.inbound.ovf.blocked_head() {
                    // Claimed, not published: a sender mid-push, or one
                    // that died there (check_ovf_claim decides).
                    ep.inbound.ovf_stuck = Some((pos, std::time::Instant::now()));
                }
            }
            break;
        };
        ep.inbound.ovf_stuck = None;
        if !m.src.is_plausible() {
            ep.inbound.ovf.commit();
            continue;
        }
        let p = ep.peers.index_of(m.src);
        if ep.peers[p].broken {
            ep.inbound.ovf.commit();
            continue;
        }
        if handle(ep, ctx, p, &m.hdr, &Src::Buf(&m.payload[..OVF_PAYLOAD])) == Flow::Stall {
            ep.stats.stalls += 1;
            ep.inbound.ovf_held = true;
            break;
        }
        ep.stats.rx_ovf += 1;
        ep.inbound.ovf.commit();
    }
    ep.inbound.flush_freed();
}

fn handle(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    match h.op {
        op::EAGER => on_eager(ep, ctx, p, h, src),
        op::BOUNCE_HDR => on_bounce_hdr(ep, ctx, p, h, src),
        op::CHUNK => on_chunk(ep, ctx, p, h, src),
        op::RTS => on_rts(ep, ctx, p, h, src),
        op::CTS_BOUNCE => on_cts(ep, p, h),
        op::FIN => on_fin(ep, ctx, p, h),
        op::CTS_WRITE => on_cts_write(ep, ctx, p, h, src),
        op::WDONE => on_wdone(ep, ctx, p, h),
        _ => {
            bad(ep, ctx, p, None, "unknown message kind");
            Flow::Done
        }
    }
}

/// Whether holding `more` unexpected bytes from peer `p` is refused (the
/// ring then stalls: back-pressure). Never refused while we wait on `p`
/// itself (a matched receive whose data it is sending, or a send of ours
/// awaiting its FIN or CTS): what we wait for may sit behind this message
/// in the same ring, so refusing would deadlock. The overshoot is bounded
/// by what fits in that ring and the pool ahead of it.
fn unexp_full(ep: &EpState, ctx: &Ctx<'_>, p: usize, more: usize) -> bool {
    ep.matching.over_budget(ctx.cfg, more) && !ep.waiting_on(p)
}

/// An inline message: checked, then the common case ([`eager_to_front`])
/// inlined into the ring's drain loop, the rest out of line.
#[inline(always)]
fn on_eager(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &impl Payload) -> Flow {
    let len = h.len as usize;
    if len > src.cap() {
        bad(ep, ctx, p, None, "inline length beyond its cells");
        return Flow::Done;
    }
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    if let Some(flow) = eager_to_front(ep, ctx, p, h, src, len, tagged) {
        return flow;
    }
    if !ep.bind.rx_room(ctx.cqs) {
        return Flow::Stall;
    }
    // Copies for the call out of line, made on this path only: the
    // originals, used by inlined code alone, stay in registers.
    eager_match_or_queue(ep, ctx, p, &{ *h }, &{ *src }, len, tagged)
}

/// [`on_eager`] past the fast path: matching in general, or queueing as
/// unexpected.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn eager_match_or_queue(
    ep: &mut EpState,
    ctx: &mut Ctx<'_>,
    p: usize,
    h: &MsgHdr,
    src: &impl Payload,
    len: usize,
    tagged: bool,
) -> Flow {
    // Matched by reference: moving the Dest out of the Option would copy
    // bytes just written by narrow stores (a store-forwarding stall).
    let m = ep.take_match(ctx, tagged, p, h.tag, len);
    match &m {
        Some(d) => {
            let n = d.iovs.scatter(0, len.min(d.cap), |o, dst| src.read(o, dst));
            let info = RxInfo { tagged, tag: h.tag, data: h.data, hflags: h.flags, total: len, delivered: n };
            if ep.peers[p].rx.in_order() {
                // Nothing earlier from this peer pending: complete in place.
                emit_rx(ep, ctx, p, d, &info, None);
            } else {
                finish_rx(ep, ctx, p, 0, PendingRx { dest: *d, info, err: None });
            }
        }
        None => {
            if unexp_full(ep, ctx, p, len) {
                return Flow::Stall;
            }
            let mut v = ep.matching.spare_buf(len);
            src.read(0, &mut v);
            let body = UnexpBody::Data { v, received: len, msg_id: 0 };
            ep.matching
                .queue_unexp(tagged, Unexp { id: 0, peer: p, tag: h.tag, data: h.data, hflags: h.flags, len, body });
        }
    }
    Flow::Done
}

/// The common case of an inline message, done without the general
/// matching records: the oldest posted receive (one segment, not
/// multi-receive, not from an SRQ) matches it and holds it whole, and
/// nothing earlier from this peer waits to complete. The receive CQ is
/// looked up once, for its room and for the entry. None, having done
/// nothing, when that is not the case; `Stall` when the CQ is full.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn eager_to_front(
    ep: &mut EpState,
    ctx: &mut Ctx<'_>,
    p: usize,
    h: &MsgHdr,
    src: &impl Payload,
    len: usize,
    tagged: bool,
) -> Option<Flow> {
    // SAFETY: p is the index of the peer that sent the message, which
    // the peer table gave (drain_ring's ring peer, drain_ovf's index_of).
    if !unsafe { ep.peers.get_unchecked_mut(p) }.rx.in_order() {
        return None;
    }
    let (op_context, seg, cqe) = ep.matching.front_plain(tagged, p, h.tag, len)?;
    let mut cq = None;
    if let Some(c) = ep.bind.rx_cq {
        // SAFETY: a receive CQ in the bindings is bound, so live (see
        // `Bindings::rx_cq`).
        let q = unsafe { ctx.cqs.get_live_mut(c) };
        if !q.rx_room() {
            return Some(Flow::Stall);
        }
        cq = Some(q);
    }
    // SAFETY: the posted receive's buffer, valid and writable until its
    // completion (the posting contract; never null, as in lone_inline);
    // len <= its length.
    debug_assert!(len <= seg.len && seg.ptr != 0);
    let dst = unsafe { std::slice::from_raw_parts_mut(seg.ptr as *mut u8, len) };
    src.read(0, dst);
    ep.matching.pop_front(tagged);
    let ok =
        RxOk { op_context, buf: seg.ptr, len, tagged, hflags: h.flags, data: h.data, tag: h.tag, multi_release: false };
    complete_rx_ok(&ep.bind, &mut ep.peers, ctx.counters, ctx.avs, cq, p, &ok, cqe);
    Some(Flow::Done)
}

/// Starts a matched multi-part receive: its data arrives in chunks.
fn start_active(ep: &mut EpState, p: usize, msg_id: u64, a: ActiveRecv) {
    ep.peers[p].rx.start_matched(msg_id, RxCur::Active(a));
}

fn on_bounce_hdr(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    let mut b = [0u8; wire::BounceHdr::WIRE];
    let bh = match wire::BounceHdr::decode(src.head(&mut b), MAX_MSG_SIZE as u64) {
        Ok(bh) => bh,
        Err(e) => {
            bad(ep, ctx, p, None, e.what());
            return Flow::Done;
        }
    };
    let (msg_id, total) = (bh.msg_id, bh.total as usize);
    if ep.peers[p].rx.has(msg_id) {
        bad(ep, ctx, p, None, "bad bounce header");
        return Flow::Done;
    }
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    match ep.take_match(ctx, tagged, p, h.tag, total) {
        Some(dest) => {
            start_active(ep, p, msg_id, ActiveRecv::new(dest, total, h));
        }
        None => {
            // The data will be copied out of the pool as it arrives
            // (counted in the unexpected budget chunk by chunk).
            let body = UnexpBody::Data { v: Vec::new(), received: 0, msg_id };
            let u = Unexp { id: 0, peer: p, tag: h.tag, data: h.data, hflags: h.flags, len: total, body };
            let id = ep.matching.queue_unexp(tagged, u);
            ep.peers[p].rx.start_unexp(msg_id, id, total);
        }
    }
    Flow::Done
}

fn on_chunk(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    let pool = &ep.inbound.pool;
    let mut b = [0u8; wire::Chunk::WIRE];
    let c = match wire::Chunk::decode(h, src.head(&mut b), pool.len(), pool.chunk_size()) {
        Ok(c) => c,
        Err(e) => {
            if let WireError::ChunkLen { index, .. } = e {
                pool.free(index);
            }
            // The message fails once its chunk could be read.
            bad(ep, ctx, p, (!matches!(e, WireError::Short { .. })).then_some(h.tag), e.what());
            return Flow::Done;
        }
    };
    let (idx, msg_id, off, len) = (c.index, c.msg_id, c.offset as usize, c.len as usize);
    // A run of chunks back to back, inside the pool (Chunk::decode).
    let run = c.run(pool.chunk_size());
    let chunk = pool.chunk(idx).expect("index checked by Chunk::decode");
    // SAFETY: the run lies in our pool (Chunk::decode: index + run <= the
    // pool's chunks, len <= run * chunk_size); the sender filled its len
    // bytes before publishing the message (RingTx::publish's release
    // store, acquired by RingRx::ready) and gave the chunks up by doing so.
    let bytes = unsafe { std::slice::from_raw_parts(chunk as *const u8, len) };
    // One look-up of the message (not a check, then a second search).
    let Some(cur) = ep.peers[p].rx.get_mut(msg_id) else {
        ep.inbound.pool.free_run(idx, run);
        bad(ep, ctx, p, None, "chunk for no message in progress");
        return Flow::Done;
    };
    match cur {
        RxCur::Split(_) => {
            pool.free_run(idx, run);
            bad(ep, ctx, p, None, "chunk for a message being copied directly");
        }
        RxCur::Active(a) => {
            if off != a.received || off + len > a.total {
                pool.free_run(idx, run);
                bad(ep, ctx, p, Some(msg_id), "chunk out of order");
                return Flow::Done;
            }
            if off < a.dest.cap {
                let n = (a.dest.cap - off).min(len);
                a.dest.iovs.scatter(off, n, |o, dst| crate::copy::copy_slice(dst, &bytes[o..o + dst.len()]));
            }
            ep.inbound.release_run(idx, run);
            a.received += len;
            if a.received == a.total {
                let Some(RxCur::Active(a)) = ep.peers[p].rx.take(msg_id) else { unreachable!("matched above") };
                finish_active(ep, ctx, p, msg_id, a, None);
            }
        }
        RxCur::Unexp { id, total } => {
            let (id, total) = (*id, *total);
            if unexp_full(ep, ctx, p, len) {
                return Flow::Stall; // chunks stay in the pool and the message in the ring
            }
            let ok = ep.matching.append_unexp(id, off, bytes, total);
            ep.inbound.release_run(idx, run);
            match ok {
                Some(true) => {
                    ep.peers[p].rx.take(msg_id);
                }
                Some(false) => {}
                None => bad(ep, ctx, p, Some(msg_id), "chunk out of order"),
            }
        }
    }
    Flow::Done
}

/// Parsed request to send.
struct Rts {
    msg_id: u64,
    iovs: Vec<(u64, u64)>,
    /// Single copy offered (`rts_flags::CMA`).
    cma: bool,
    /// A FIN wanted also after data through the pool (`rts_flags::FIN`).
    fin: bool,
}

fn on_rts(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    let malformed = |ep: &mut EpState, ctx: &mut Ctx<'_>| {
        bad(ep, ctx, p, None, "malformed request to send");
        Flow::Done
    };
    let mut b = [0u8; wire::Rts::MAX_WIRE];
    let Ok(r) = wire::Rts::decode(src.head(&mut b), MAX_MSG_SIZE as u64) else {
        return malformed(ep, ctx);
    };
    let (msg_id, total, fl) = (r.msg_id, r.total as usize, r.flags);
    let iovs: Vec<(u64, u64)> = r.iovs().iter().map(|v| (v.addr, v.len)).collect();
    if ep.peers[p].rx.has(msg_id) {
        return malformed(ep, ctx);
    }
    if !ep.bind.rx_room(ctx.cqs) {
        return Flow::Stall;
    }
    let rts = Rts { msg_id, iovs, cma: fl & rts_flags::CMA != 0, fin: fl & rts_flags::FIN != 0 };
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    match ep.take_match(ctx, tagged, p, h.tag, total) {
        Some(d) => {
            let info = RxInfo { tagged, tag: h.tag, data: h.data, hflags: h.flags, total, delivered: 0 };
            rendezvous(ep, ctx, p, d, info, rts);
        }
        None => {
            if unexp_full(ep, ctx, p, 0) {
                return Flow::Stall;
            }
            let body = UnexpBody::Rts { msg_id, iovs: rts.iovs, cma: rts.cma, fin: rts.fin };
            let u = Unexp { id: 0, peer: p, tag: h.tag, data: h.data, hflags: h.flags, len: total, body };
            ep.matching.queue_unexp(tagged, u);
        }
    }
    Flow::Done
}

/// A matched rendezvous: read the data by single copy if the sender offered
/// it and the kernel lets us; else ask for it through the pool.
fn rendezvous(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, d: Dest, mut info: RxInfo, rts: Rts) {
    if let Err(e) = ep.ensure_connected(ctx, p) {
        let f = (ErrorKind::Io, prov::CMA_FAULT, format!("cannot reach the sender to fetch its message: {e}"));
        finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: Some(f) });
        return;
    }
    let try_cma = rts.cma && !ep.peers[p].cma_refused && ctx.cfg.cma != crate::proto::CmaMode::Off;
    // A single copy whose two buffers sit in the slow band of the kernel's
    // copy (crate::copy: 4-5x slower) goes through the pool instead, whose
    // two copies we make ourselves.
    let local = if try_cma { local_ranges(&d, 0, usize::MAX) } else { Vec::new() };
    let aliased = try_cma && {
        let dst: Vec<(u64, u64)> = local.iter().map(|&(a, l)| (a as u64, l as u64)).collect();
        crate::copy::ranges_in_band(&rts.iovs, &dst)
    };
    if aliased {
        ep.stats.cma_aliased += 1;
    }
    // In the band where either path may win, the one measured faster with
    // this peer lately (and now and then the other, to keep both measures
    // fresh as the CPUs move).
    let want = info.total.min(d.cap);
    let class = if try_cma && !aliased { crate::proto::pick_class(ctx.cfg, want) } else { None };
    // A stream's message (flagged by its sender) is picked for by the
    // stream's rate, and measured by it (proto::StreamPick), not by its
    // own copy.
    let stream = info.hflags & hdr_flags::STREAM != 0 && class.is_some();
    let peer = &mut ep.peers[p];
    let pick = class.map(|c| if stream { &mut peer.stream_pick.pick[c] } else { &mut peer.pick[c] });
    let (pool_pick, explored, sure) = pick.map_or((false, false, false), |k| {
        let pool = k.use_pool();
        (pool, pool && k.explored(), pool && !stream && k.pool_sure())
    });
    if try_cma && !aliased && !pool_pick {
        let on_ring = matches!(ep.peers[p].chan, Some(Chan::Ring(_)));
        // The sender's half goes in one CTS_WRITE of at most MAX_IOV ranges.
        let fits = d.iovs.n <= MAX_IOV;
        if ep.peers[p].cma_worked && on_ring && fits && want >= ctx.cfg.split_min.max(8192) {
            split_copy(ep, ctx, p, d, info, rts, want);
            return;
        }
        let peer = &mut ep.peers[p];
        let t0 = class.filter(|_| !stream).map(|_| std::time::Instant::now());
        match cma::read(peer.pid, &local, &rts.iovs, ctx.cfg.cma) {
            Ok(n) => {
                if let (Some(c), Some(t0)) = (class, t0) {
                    peer.pick[c].record(false, t0.elapsed(), want);
                }
                if let (Some(c), true) = (class, stream) {
                    // Sampled here, as single copy (finish_rx samples
                    // the flagged messages left, all of two copies).
                    peer.stream_pick.sample(c, true, want, crate::proto::ticks());
                    info.hflags = info.hflags & !hdr_flags::STREAM | crate::engine::complete::STREAM_SAMPLED;
                }
                info.delivered = n;
                peer.cma_worked = true;
                ep.stats.cma_reads += 1;
                finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: None });
                ep.queue_ctrl(p, Ctrl::new(CtrlKind::Fin, rts.msg_id, 0));
                return;
            }
            Err(CmaError::Refused(_)) => peer.cma_refused = true,
            Err(CmaError::Fault(e)) => {
                let f = cma_fail(&peer.addr, peer.pid, e);
                finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: Some(f) });
                ep.queue_ctrl(p, Ctrl::new(CtrlKind::Fin, rts.msg_id, ErrorKind::Io.errno() as u32));
                return;
            }
        }
    }
    if info.total == 0 {
        finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: None });
        ep.queue_ctrl(p, Ctrl::new(CtrlKind::Fin, rts.msg_id, 0));
        return;
    }
    if pool_pick {
        ep.stats.pool_picked += 1;
    } else {
        ep.stats.cma_fallbacks += 1;
    }
    let status = if explored {
        wire::CTS_BOUNCE_EXPLORE
    } else if sure {
        wire::CTS_BOUNCE_SURE
    } else if aliased || pool_pick {
        wire::CTS_BOUNCE_THIS_ONE
    } else {
        0
    };
    let timed = if pool_pick && !stream { class.map(|c| (std::time::Instant::now(), c)) } else { None };
    let a = ActiveRecv {
        dest: d,
        total: info.total,
        received: 0,
        tag: info.tag,
        data: info.data,
        hflags: info.hflags,
        timed,
        // Only a sender that asked waits for it (delivery complete): the
        // others complete at their last chunk.
        fin: rts.fin,
    };
    start_active(ep, p, rts.msg_id, a);
    ep.queue_ctrl(p, Ctrl::new(CtrlKind::CtsBounce, rts.msg_id, status));
}

fn cma_fail(peer_addr: &shm_layout::Address, pid: i32, e: i32) -> Fail {
    (
        ErrorKind::Io,
        prov::CMA_FAULT,
        format!(
            "single copy with {} (pid {pid}) failed: {}",
            crate::av::AddressVector::straddr(peer_addr),
            std::io::Error::from_raw_os_error(e)
        ),
    )
}

/// Split single copy of a large matched rendezvous: ask the sender to write
/// `[split, want)` into our buffer (CTS_WRITE, pushed at once) and read
/// `[0, split)` ourselves meanwhile, so both cores copy. The receive
/// completes when the sender's WDONE says its half is in place.
#[allow(clippy::too_many_arguments)]
fn split_copy(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, d: Dest, info: RxInfo, rts: Rts, want: usize) {
    let split = (want / 2) & !4095;
    let theirs = local_ranges(&d, split, want - split);
    let ranges = theirs.iter().map(|&(a, l)| wire::IovRange { addr: a as u64, len: l as u64 });
    let cw = wire::CtsWrite::new(rts.msg_id, split as u64, ranges).expect("at most MAX_IOV: checked by rendezvous");
    let mut pl = [0u8; wire::CtsWrite::MAX_WIRE];
    let (hdr, n) = cw.encode(&mut pl).expect("buffer sized for any CTS_WRITE");
    ep.queue_ctrl(p, Ctrl { hdr, payload: pl[..n].to_vec() });
    ep.progress_peer_tx(ctx, p);
    if let Some(why) = &ep.peers[p].gone {
        // The push found the sender's endpoint closed (chan_lost ->
        // fail_peer, when nothing of it was left in our inbound queues,
        // as for an RTS matched from the unexpected queue): what was
        // pending with it failed then, and no WDONE will come. Started,
        // this receive would wait for one until our close; it fails now,
        // as fail_peer fails the others.
        let err = (ErrorKind::Io, prov::PEER_GONE, why.to_string());
        finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: Some(err) });
        return;
    }
    let mine = local_ranges(&d, 0, split);
    let peer = &mut ep.peers[p];
    let own_err = match cma::read(peer.pid, &mine, &cma::sub_ranges(&rts.iovs, 0, split), ctx.cfg.cma) {
        Ok(_) => None,
        Err(CmaError::Refused(e)) | Err(CmaError::Fault(e)) => Some(cma_fail(&peer.addr, peer.pid, e)),
    };
    ep.stats.cma_reads += 1;
    ep.stats.split_copies += 1;
    let sr = SplitRecv { dest: d, info, split, want, remote: rts.iovs, own_err };
    ep.peers[p].rx.start_matched(rts.msg_id, RxCur::Split(sr));
    // No FIN yet: if the sender's write fails we still read its buffer, so
    // its send may complete only after WDONE (on_wdone sends the FIN).
}

/// Sender side of a split copy: write the asked part of our message into
/// the receiver's buffer, then say so.
fn on_cts_write(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    let msg_id = h.tag;
    let mut b = [0u8; wire::CtsWrite::MAX_WIRE];
    let parsed = wire::CtsWrite::decode(h, src.head(&mut b)).ok();
    let ranges: Vec<(u64, u64)> = parsed.iter().flat_map(|c| c.ranges()).map(|r| (r.addr, r.len)).collect();
    let local = parsed.and_then(|c| ep.send_ranges(p, msg_id, c.offset as usize, c.total() as usize));
    let status = match local {
        Some(local) => match cma::write(ep.peers[p].pid, &local, &ranges, ctx.cfg.cma) {
            Ok(_) => 0,
            Err(CmaError::Refused(e)) | Err(CmaError::Fault(e)) => e as u32,
        },
        None => ErrorKind::Io.errno() as u32,
    };
    ep.queue_ctrl(p, Ctrl::new(CtrlKind::Wdone, msg_id, status));
    Flow::Done
}

/// Receiver side: the sender's half is in place (or failed: then read it
/// ourselves); the split receive completes.
fn on_wdone(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr) -> Flow {
    let Ok(c) = wire::Control::decode(h) else {
        return Flow::Done;
    };
    if !matches!(ep.peers[p].rx.get_mut(c.msg_id), Some(RxCur::Split(_))) {
        return Flow::Done;
    }
    let Some(RxCur::Split(mut s)) = ep.peers[p].rx.take(c.msg_id) else { unreachable!("matched above") };
    if c.status != 0 && s.own_err.is_none() {
        let rest = local_ranges(&s.dest, s.split, s.want - s.split);
        let peer = &ep.peers[p];
        if let Err(CmaError::Refused(e)) | Err(CmaError::Fault(e)) =
            cma::read(peer.pid, &rest, &cma::sub_ranges(&s.remote, s.split, s.want - s.split), ctx.cfg.cma)
        {
            s.own_err = Some(cma_fail(&peer.addr, peer.pid, e));
        }
    }
    let mut info = s.info;
    info.delivered = if s.own_err.is_some() { 0 } else { s.want };
    let status = if s.own_err.is_some() { ErrorKind::Io.errno() as u32 } else { 0 };
    finish_rx(ep, ctx, p, c.msg_id, PendingRx { dest: s.dest, info, err: s.own_err });
    // Done with the sender's buffer: its send may complete.
    ep.queue_ctrl(p, Ctrl::new(CtrlKind::Fin, c.msg_id, status));
    Flow::Done
}

fn on_cts(ep: &mut EpState, p: usize, h: &MsgHdr) -> Flow {
    let Ok(c) = wire::Control::decode(h) else {
        return Flow::Done;
    };
    let explore = c.status == wire::CTS_BOUNCE_EXPLORE;
    let sure = c.status == wire::CTS_BOUNCE_SURE;
    let this_one = explore || sure || c.status == wire::CTS_BOUNCE_THIS_ONE;
    let run = match (explore, sure) {
        (true, _) => 0,
        (_, true) => crate::engine::tx::EAGER_RUN_SURE,
        _ => crate::engine::tx::EAGER_RUN,
    };
    if ep.tx.bounce_requested(&mut ep.peers[p], p, c.msg_id, this_one, run) && !this_one {
        // We offered single copy and the receiver could not use it: stop
        // offering it to this peer (and use the no-CMA thresholds). Not
        // when it asked for this one message only (its buffer's placement).
        ep.peers[p].cma_refused = true;
    }
    Flow::Done
}

fn on_fin(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr) -> Flow {
    let Ok(c) = wire::Control::decode(h) else {
        return Flow::Done;
    };
    let who = crate::av::AddressVector::straddr(&ep.peers[p].addr);
    if let Some(op) = ep.peers[p].tx.awaiting(c.msg_id) {
        op.state = TxState::Done;
        let (pick, hflags, read) = (op.pick, op.hflags, c.status == 0 && !op.deliver);
        if c.status != 0 {
            let k = ErrorKind::from_errno(c.status as i32);
            op.err = Some((k, prov::REMOTE, format!("{who} failed to take the message: {}", k.message())));
        }
        if read {
            // Read by single copy (a FIN without a CTS_BOUNCE before it:
            // only FI_DELIVERY_COMPLETE sends get one after the pool).
            crate::engine::tx::stream_read(&mut ep.peers[p].tx, pick, hflags);
        }
        ep.retire(ctx, p);
    }
    Flow::Done
}

fn finish_active(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, msg_id: u64, a: ActiveRecv, err: Option<Fail>) {
    let info = a.info(a.received.min(a.total).min(a.dest.cap));
    if let (Some((t0, c)), None) = (a.timed, &err) {
        ep.peers[p].pick[c].record(true, t0.elapsed(), a.total.min(a.dest.cap));
    }
    let status = if err.is_some() { ErrorKind::Io.errno() as u32 } else { 0 };
    finish_rx(ep, ctx, p, msg_id, PendingRx { dest: a.dest, info, err });
    if a.fin && ep.peers[p].gone.is_none() {
        // The data of a rendezvous is in place (or will never be): a send
        // with FI_DELIVERY_COMPLETE completes at this FIN.
        ep.queue_ctrl(p, Ctrl::new(CtrlKind::Fin, msg_id, status));
    }
}

/// A peer sent something that does not parse: drop it and fail the
/// multi-part message it belonged to, if known.
fn bad(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, msg_id: Option<u64>, what: &str) {
    let who = crate::av::AddressVector::straddr(&ep.peers[p].addr);
    let Some(m) = msg_id else { return };
    let Some(cur) = ep.peers[p].rx.take(m) else {
        return;
    };
    match cur {
        RxCur::Active(a) => {
            let f = (ErrorKind::Io, prov::PROTOCOL, format!("{who}: {what}"));
            finish_active(ep, ctx, p, m, a, Some(f));
        }
        RxCur::Unexp { id, .. } => ep.matching.drop_unexp(id),
        // The sender may still be writing into that buffer: only its WDONE
        // may complete the receive.
        split @ RxCur::Split(_) => ep.peers[p].rx.put_back(m, split),
    }
}

/// Longest an endpoint's close waits for senders still writing into its
/// receive buffers (split single copies).
const CLOSE_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The endpoint closes: waits (bounded by [`CLOSE_DRAIN`], and only for
/// live peers) for split copies the senders are writing into our buffers,
/// then writes every matched receive in per-peer order: those complete but
/// held for order as they are, the others as `FI_ECANCELED` (flushed). SRQ
/// buffers the endpoint dequeued are thereby reported exactly once. Last,
/// every receive still posted completes as `FI_ECANCELED` too, so the
/// application knows which buffers are free again.
///
/// With `discard` (fi_endpoint(3)'s fi_close: outstanding operations are
/// dropped without completions), the endpoint's own unfinished receives,
/// matched or still posted, are dropped silently, and the SRQ buffers it
/// dequeued but did not fill go back to the front of their SRQ, still
/// posted there (they were posted to the SRQ, which stays open); receives
/// that completed and were only held for order are written as usual. A
/// multi-receive piece cannot go back to a buffer already released (by
/// another piece): if it was that buffer's last outstanding piece, the
/// buffer's release is reported here, as an `FI_ECANCELED` entry with
/// FI_MULTI_RECV.
pub(crate) fn flush_rx(ep: &mut EpState, ctx: &mut Ctx<'_>, discard: bool) {
    ep.matching.closing = true;
    let t0 = std::time::Instant::now();
    let splitting = |ep: &EpState| ep.peers.iter().any(|p| p.gone.is_none() && p.rx.splitting());
    while splitting(ep) && t0.elapsed() < CLOSE_DRAIN {
        progress_ep(ep, ctx);
        std::thread::yield_now();
    }
    let cancel = || (ErrorKind::Canceled, prov::FLUSHED, "endpoint closed before the receive completed".to_string());
    // SRQ buffers given back (discard), in dequeue order per peer.
    let mut back = Vec::new();
    for p in 0..ep.peers.len() {
        let (order, mut parts) = ep.peers[p].rx.drain_all();
        for (key, pend) in order {
            let pr = match pend {
                Some(pr) => pr,
                None => match parts.iter().position(|x| x.0 == key).map(|k| parts.swap_remove(k).1) {
                    Some(RxCur::Active(a)) => PendingRx { dest: a.dest, info: a.info(0), err: Some(cancel()) },
                    Some(RxCur::Split(sp)) => {
                        PendingRx { dest: sp.dest, info: RxInfo { delivered: 0, ..sp.info }, err: Some(cancel()) }
                    }
                    _ => continue,
                },
            };
            // Unfinished, with discard: an SRQ buffer (every receive of a
            // kind the endpoint takes from its SRQ is one) goes back, the
            // endpoint's own receive is dropped.
            if discard && pr.err.as_ref().is_some_and(|e| e.1 == prov::FLUSHED) {
                if ep.matching.srq_for(pr.info.tagged).is_some() {
                    back.push((pr.info.tagged, pr.dest));
                }
                continue;
            }
            emit_rx(ep, ctx, p, &pr.dest, &pr.info, pr.err);
        }
    }
    if let Some(q) = ep.matching.srq.and_then(|s| ctx.srqs.get_mut(s)) {
        // A piece whose multi-receive buffer was released elsewhere, and
        // was its last outstanding one: the buffer's release is reported
        // here (the application would otherwise never learn it is free).
        for (tagged, d) in q.give_back(&back) {
            unused_rx(&ep.bind, ctx, &d, tagged, cancel());
        }
    }
    // Then the receives still posted, unmatched: their buffers are free
    // (dropped silently with discard).
    for (tagged, d) in ep.matching.take_all_posted() {
        if !discard {
            unused_rx(&ep.bind, ctx, &d, tagged, cancel());
        }
    }
}

/// Delivers an unexpected message to a receive posted for it.
pub(crate) fn deliver_unexp(ep: &mut EpState, ctx: &mut Ctx<'_>, u: Unexp, d: Dest, tagged: bool) {
    let info = RxInfo { tagged, tag: u.tag, data: u.data, hflags: u.hflags, total: u.len, delivered: 0 };
    match u.body {
        UnexpBody::Data { v, received, msg_id } => {
            let n = d.iovs.scatter(0, v.len().min(d.cap), |o, dst| crate::copy::copy_slice(dst, &v[o..o + dst.len()]));
            ep.matching.recycle_buf(v);
            if received == u.len {
                finish_rx(ep, ctx, u.peer, 0, PendingRx { dest: d, info: RxInfo { delivered: n, ..info }, err: None });
            } else {
                // Still arriving: the rest goes straight to the receive.
                let a = ActiveRecv {
                    dest: d,
                    total: u.len,
                    received,
                    tag: u.tag,
                    data: u.data,
                    hflags: u.hflags,
                    timed: None,
                    fin: false,
                };
                ep.peers[u.peer].rx.matched(msg_id, a);
            }
        }
        UnexpBody::Rts { msg_id, iovs, cma, fin } => {
            rendezvous(ep, ctx, u.peer, d, info, Rts { msg_id, iovs, cma, fin })
        }
        UnexpBody::Lost => {
            let why = "the sender of the claimed message failed before it could be received".to_string();
            finish_rx(
                ep,
                ctx,
                u.peer,
                0,
                PendingRx { dest: d, info, err: Some((ErrorKind::Io, prov::CLAIM_LOST, why)) },
            );
        }
    }
}

/// A peek (FI_PEEK, tagged receives): the first unexpected message that
/// `r` accepts and nobody holds is reported in a completion of context
/// `r.ctx` (its length, tag, remote CQ data and source; no data is copied:
/// the entry's buf is NULL), then, with `claim`, reserved for the FI_CLAIM
/// receive of that context, or with `discard`, dropped. When none is
/// found, an `-FI_ENOMSG` error entry. The caller ran a pass first, so
/// that what has arrived is seen; a bounce message still arriving is
/// found too, with its full length.
pub(crate) fn peek(ep: &mut EpState, ctx: &mut Ctx<'_>, r: &PostedRecv, claim: bool, discard: bool) {
    let Some(u) = ep.matching.find_free(true, r) else {
        let why = "no unexpected message matches the peek".to_string();
        probe_entry(ep, ctx, r.ctx, Err((ErrorKind::NoMsg, prov::NO_MSG, why)));
        return;
    };
    let (id, p) = (u.id, u.peer);
    let info = RxInfo { tagged: true, tag: u.tag, data: u.data, hflags: u.hflags, total: u.len, delivered: u.len };
    probe_entry(ep, ctx, r.ctx, Ok((p, info)));
    if claim {
        ep.matching.claim(id, r.ctx);
    } else if discard {
        discard_unexp(ep, id);
    }
}

/// The FI_CLAIM receive of context `d.ctx`: the message an earlier peek
/// claimed with that context is delivered into `d` as if `d` had been
/// posted for it (a bounce message still arriving completes when its last
/// chunk comes; a rendezvous is read from the sender now), or with
/// `discard` dropped, completing with length 0. `-FI_EINVAL` when the
/// context holds no claim (never claimed, or already received).
pub(crate) fn claimed_rx(ep: &mut EpState, ctx: &mut Ctx<'_>, d: Dest, discard: bool) -> Result<()> {
    let Some(id) = ep.matching.unclaim(d.ctx) else {
        return Err(Error::with(
            ErrorKind::Inval,
            "no message is claimed with this context (no FI_PEEK | FI_CLAIM with it, or already received)",
        ));
    };
    if discard {
        let u = ep.matching.get(id).expect("a claimed message stays queued until received");
        let info = RxInfo { tagged: true, tag: u.tag, data: u.data, hflags: u.hflags, total: u.len, delivered: 0 };
        probe_entry(ep, ctx, d.ctx, Ok((u.peer, info)));
        discard_unexp(ep, id);
        return Ok(());
    }
    let u = ep.matching.take(id).expect("a claimed message stays queued until received");
    deliver_unexp(ep, ctx, u, d, true);
    Ok(())
}

/// Drops the unexpected message `id` (FI_DISCARD): its buffer is
/// recycled, a rendezvous's sender gets its FIN (its send completes:
/// nobody will read its buffer), and a bounce message still arriving
/// leaves with its last chunk.
pub(crate) fn discard_unexp(ep: &mut EpState, id: u64) {
    let Some(Discard::Gone(u)) = ep.matching.discard(id) else {
        return;
    };
    match u.body {
        UnexpBody::Data { v, .. } => ep.matching.recycle_buf(v),
        UnexpBody::Rts { msg_id, .. } => {
            if ep.peers[u.peer].gone.is_none() {
                ep.queue_ctrl(u.peer, Ctrl::new(CtrlKind::Fin, msg_id, 0));
            }
        }
        UnexpBody::Lost => {}
    }
}
