//! The progress engine: one pass drains an endpoint's inbound rings and
//! overflow queue (bounded batch per ring), matches messages against posted
//! receives (or queues them as unexpected, within bounded memory), writes
//! completions and counter updates, and moves queued transmits forward.
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
use crate::cq::{prov, CqErrEntry, CqTaggedEntry, NO_SRC};
use crate::domain::Ctx;
use crate::ep::{
    ActiveRecv, Chan, Ctrl, Dest, EpState, Fail, InRing, Peer, PendingRx, RxCur, RxInfo, SplitRecv, TxOp, TxState,
    Unexp, UnexpBody,
};
use crate::error::ErrorKind;
use crate::flags::*;
use crate::notify::Signal;
use crate::proto::{Proto, MAX_MSG_SIZE};
use crate::ring::{payload_capacity, RingRx, RingView};
use crate::sync::Ordering;
use shm_layout::{hdr_flags, op, rts_flags, MsgHdr, MAX_IOV, OVF_PAYLOAD};

/// Messages taken from one ring per pass.
const BATCH: usize = 64;

/// What a handler did with a message.
#[derive(PartialEq, Eq)]
enum Flow {
    /// Consumed.
    Done,
    /// Not consumed: try again on a later pass.
    Stall,
}

/// Where a message's payload is.
#[derive(Clone, Copy)]
enum Src<'a> {
    Ring(RingView, usize),
    Buf(&'a [u8]),
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
            Src::Buf(b) => dst.copy_from_slice(&b[off..off + dst.len()]),
        }
    }
    fn u64_at(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        u64::from_le_bytes(b)
    }
    fn u32_at(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        self.read(off, &mut b);
        u32::from_le_bytes(b)
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
pub(crate) fn progress_ep(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    // SYNC: pairs with the release fetch_or in Section::claim_ring; makes
    // the slot's address visible.
    let claimed = ep.sec.header().claimed.load(Ordering::Acquire);
    if claimed != ep.claimed_seen {
        accept_claims(ep, claimed);
    }
    // After the claims: a peer found dead may have left messages in a ring
    // it just claimed (see left_in_queues).
    ep.passes = ep.passes.wrapping_add(1);
    if ep.passes.is_multiple_of(256) || ep.check_now {
        housekeeping(ep, ctx);
    }
    // The overflow queue holds the messages of senders without a ring: no
    // order to keep with the rings'.
    if ep.sec.header().ovf_used.load(Ordering::Relaxed) != 0 {
        drain_ovf(ep, ctx);
    }
    let mut bits = ep.claimed_seen;
    if bits != 0 {
        // Out of the endpoint while it is drained (no handler touches
        // them): the ring being read is then a local the handlers cannot
        // alias, kept in registers instead of re-fetched per message.
        let mut rings = std::mem::take(&mut ep.rings);
        ep.rings_out = true;
        while bits != 0 {
            let s = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(r) = rings.get_mut(s).and_then(Option::as_mut) {
                drain_ring(ep, ctx, r);
            }
        }
        ep.rings = rings;
        ep.rings_out = false;
    }
    if !ep.busy.is_empty() {
        progress_tx(ep, ctx);
    }
}

/// Now and then: peers checked for life, a stuck overflow claim looked
/// at, gauges published.
#[cold]
#[inline(never)]
fn housekeeping(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    ep.check_now = false;
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
    let rx_active: usize =
        ep.peers.iter().map(|p| p.rx_parts.iter().filter(|x| !matches!(x.1, RxCur::Unexp { .. })).count()).sum();
    h.tx_queued.store(ep.tx_outstanding as u32, Ordering::Relaxed);
    let srq = ep.srq.and_then(|s| ctx.srqs[s].as_ref()).map_or(0, |q| q.len());
    h.rx_posted.store((ep.posted[0].len() + ep.posted[1].len() + srq) as u32, Ordering::Relaxed);
    h.unexpected.store((ep.unexp[0].len() + ep.unexp[1].len()) as u32, Ordering::Relaxed);
    h.rx_active.store(rx_active as u32, Ordering::Relaxed);
    h.passes.store(ep.passes as u64, Ordering::Relaxed);
}

/// Whether we have anything pending with peer `p`.
fn pending_with(ep: &EpState, p: usize) -> bool {
    let peer = &ep.peers[p];
    !peer.txq.is_empty()
        || peer.inflight.iter().any(|op| op.state != TxState::Done)
        || peer.rx_parts.iter().any(|x| !matches!(x.1, RxCur::Unexp { .. }))
        || ep.posted.iter().flatten().any(|r| r.src == Some(p))
}

/// Whether peer `p` may still have messages in our inbound queues (its
/// ring, or the shared overflow queue, where any entry counts, or a ring
/// claimed since the last pass looked, which may be its). While the rings
/// are out being drained (a handler asks), the answer is yes: the caller
/// decides again at the next check.
fn left_in_queues(ep: &EpState, p: usize) -> bool {
    ep.rings_out
        || ep.rings.iter().flatten().any(|r| r.peer == p && r.rx.ready())
        || ep.ovf.ready()
        || ep.sec.header().claimed.load(Ordering::Acquire) != ep.claimed_seen
}

/// Checks every peer we wait on; fails what is pending with dead ones.
fn check_peers(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    for p in 0..ep.peers.len() {
        if ep.peers[p].gone.is_some() || !pending_with(ep, p) {
            continue;
        }
        if let Some(why) = peer_gone(ep, ctx, p) {
            // What it sent before going is delivered first: fail its
            // pending operations only once nothing of it is left in our
            // inbound queues (the overflow queue is shared: any entry there
            // defers the decision to the next check).
            if !left_in_queues(ep, p) {
                fail_peer(ep, ctx, p, why);
            }
        }
    }
}

/// Why peer `p` can no longer answer, if it cannot: its process died (pid
/// and start time), its region is closing, or its endpoint closed.
fn peer_gone(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize) -> Option<String> {
    let addr = ep.peers[p].addr;
    let who = crate::av::AddressVector::straddr(&addr);
    if ep.peers[p].region.is_none() {
        // Never mapped (we only received from it): map it now to look.
        if let Err(e) = ep.connect(ctx, p) {
            // Its region or endpoint no longer exists: unlinked by its
            // owner, or by the next start after its owner died.
            if e.kind() == ErrorKind::AddrNotAvail {
                return Some(format!("peer {who} is gone (its process died or closed its domain or endpoint): {e}"));
            }
            return Some(format!("peer {who} cannot be reached: {e}"));
        }
    }
    let region = ep.peers[p].region.as_ref()?;
    let (pid, start) = region.owner();
    if !crate::region::owner_alive(pid, start) {
        return Some(format!("peer {who} (pid {pid}) died"));
    }
    if region.header().state.load(Ordering::Acquire) != shm_layout::state::READY {
        return Some(format!("peer {who} (pid {pid}) closed its domain"));
    }
    match crate::domain::Section::of(region, addr.ep_index) {
        Ok(sec) if sec.open_at(addr.generation) => None,
        _ => Some(format!("peer {who} (pid {pid}) closed its endpoint")),
    }
}

/// Our channel to peer `p` was taken from us (its endpoint closed, its
/// section maybe reopened): fail everything pending with it, as for a dead
/// peer, once nothing it sent is left in our inbound queues (else the next
/// check does). Returns why, for the send that found it.
pub(crate) fn chan_lost(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize) -> String {
    if let Some(why) = &ep.peers[p].gone {
        return why.clone();
    }
    let who = crate::av::AddressVector::straddr(&ep.peers[p].addr);
    let why = format!("peer {who} (pid {}) closed its endpoint: its ring slot is no longer ours", ep.peers[p].pid);
    if !left_in_queues(ep, p) {
        fail_peer(ep, ctx, p, why.clone());
    }
    why
}

/// The overflow queue is shared: a sender that died between claiming an
/// entry and publishing it would block every sender behind it for ever.
/// When the head has stayed claimed but unpublished for a peer-check
/// period, and the source its claimant wrote first names a peer that is
/// gone (process dead, domain or endpoint closed: none of which can happen
/// in the middle of a push), the entry is freed. A claimant that wrote no
/// source yet cannot be named, and is waited for.
fn check_ovf_claim(ep: &mut EpState, ctx: &mut Ctx<'_>, now: std::time::Instant) {
    let Some((pos, src)) = ep.ovf.blocked_head() else {
        ep.ovf_stuck = None;
        return;
    };
    match ep.ovf_stuck {
        Some((p, since)) if p == pos => {
            if now.duration_since(since) < ctx.cfg.peer_check
                || src == shm_layout::Address::default()
                || src.uid != ep.addr.uid
            {
                return;
            }
            let peer = ep.peer_index(src);
            if peer_gone(ep, ctx, peer).is_some() {
                ep.ovf.skip();
                ep.stats.ovf_skipped += 1;
                ep.ovf_stuck = None;
            }
        }
        _ => ep.ovf_stuck = Some((pos, now)),
    }
}

/// Fails everything pending with a peer that is gone. Messages it left in
/// our rings are still delivered by later passes; only what can never
/// complete fails.
fn fail_peer(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, why: String) {
    let fail = || (ErrorKind::Io, prov::PEER_GONE, why.clone());
    ep.peers[p].gone = Some(why.clone());
    // Our sends to it, queued or in flight, in order.
    let mut ops: Vec<TxOp> = ep.peers[p].inflight.drain(..).collect();
    ops.extend(ep.peers[p].txq.drain(..));
    ep.peers[p].ctrlq.clear();
    for op in ops {
        ep.tx_outstanding -= 1;
        let err = if op.state == TxState::Done { op.err.clone() } else { Some(fail()) };
        complete_tx(ep, ctx, &op, err);
    }
    // Receives whose data it was still sending.
    let parts: Vec<(u64, RxCur)> = ep.peers[p].rx_parts.drain(..).collect();
    for (msg_id, cur) in parts {
        match cur {
            RxCur::Active(a) => finish_active(ep, ctx, p, msg_id, a, Some(fail())),
            RxCur::Split(sp) => {
                let mut info = sp.info;
                info.delivered = 0;
                finish_rx(ep, ctx, p, msg_id, PendingRx { dest: sp.dest, info, err: Some(fail()) });
            }
            RxCur::Unexp { id, .. } => {
                // Never complete: drop it.
                for q in 0..2 {
                    if let Some(i) = ep.unexp[q].iter().position(|u| u.id == id) {
                        if let Some(Unexp { body: UnexpBody::Data { v, .. }, .. }) = ep.unexp[q].remove(i) {
                            ep.unexp_bytes -= v.len();
                        }
                    }
                }
            }
        }
    }
    // Unexpected rendezvous from it: the data is gone with it.
    for q in 0..2 {
        ep.unexp[q].retain(|u| !(u.peer == p && matches!(u.body, UnexpBody::Rts { .. })));
    }
    // Receives directed at it.
    for q in 0..2 {
        let mut i = 0;
        while i < ep.posted[q].len() {
            if ep.posted[q][i].src == Some(p) {
                let r = ep.posted[q].remove(i).expect("index checked");
                let at = r.iovs.v[0].ptr + r.moff;
                let cap = if r.multi { r.iovs.v[0].len - r.moff } else { r.iovs.total() };
                let d = Dest { ctx: r.ctx, iovs: r.iovs, cap, buf: at, multi_release: r.multi, cqe: r.cqe };
                let info = RxInfo { tagged: q == 1, tag: 0, data: 0, hflags: 0, total: 0, delivered: 0 };
                finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: Some(fail()) });
            } else {
                i += 1;
            }
        }
    }
}

fn accept_claims(ep: &mut EpState, claimed: u64) {
    let n_slots = ep.sec.g.n_slots as usize;
    let mut new = claimed & !ep.claimed_seen;
    while new != 0 {
        let s = new.trailing_zeros() as usize;
        new &= new - 1;
        if s >= n_slots {
            continue;
        }
        let slot = ep.sec.slot(s as u32);
        // SAFETY: the claimant wrote addr before setting the claimed bit we
        // acquired (SYNC: the release fetch_or in Section::claim_ring, the
        // acquire load of `claimed` in progress_ep); a plain-data copy,
        // validated below.
        let addr = unsafe { std::ptr::addr_of!(slot.addr).read_volatile() };
        if addr.uid != ep.addr.uid {
            continue; // not one of ours: never read that ring
        }
        let p = ep.peer_index(addr);
        // SAFETY: the ring lies in our own section; we are its only consumer.
        let rx = unsafe {
            RingRx::new(ep.sec.ringctl_at(s as u32), ep.sec.ring_cells(s as u32), ep.sec.g.ring_cells as usize)
        };
        ep.rings[s] = Some(InRing { rx, peer: p });
    }
    ep.claimed_seen = claimed;
}

/// Reads up to [`BATCH`] messages of ring `r` (taken out of the endpoint
/// by [`progress_ep`]). Each message is handled through a copy of its place
/// ([`RingView`]).
fn drain_ring(ep: &mut EpState, ctx: &mut Ctx<'_>, r: &mut InRing) {
    let peer = r.peer;
    if ep.peers[peer].broken {
        return;
    }
    for i in 0..BATCH {
        let Some((h, ncells)) = r.rx.peek() else {
            break;
        };
        if ncells == 0 {
            // A cell count that does not fit the ring: we cannot find the
            // next message, so this peer's ring is dead to us.
            bad(ep, ctx, peer, None, "cell count out of range");
            ep.peers[peer].broken = true;
            break;
        }
        let src = Src::Ring(r.rx.view(), payload_capacity(ncells));
        // The call out of line gets copies, so that the header and place
        // stay in registers on the inline path (see on_eager).
        let flow =
            if h.op == op::EAGER { on_eager(ep, ctx, peer, &h, &src) } else { handle(ep, ctx, peer, &{ h }, &{ src }) };
        if flow == Flow::Stall {
            ep.stats.stalls += 1;
            break;
        }
        ep.stats.rx_ring += 1;
        // From the second message in a row on, a stream: fetch ahead.
        r.rx.consume(ncells, i > 0);
    }
    r.rx.release_credit();
}

fn drain_ovf(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    for _ in 0..BATCH {
        let Some(m) = ep.ovf.peek() else {
            if ep.ovf_stuck.is_none() {
                if let Some((pos, _)) = ep.ovf.blocked_head() {
                    // Claimed, not published: a sender mid-push, or one
                    // that died there (check_ovf_claim decides).
                    ep.ovf_stuck = Some((pos, std::time::Instant::now()));
                }
            }
            break;
        };
        ep.ovf_stuck = None;
        if m.src.uid != ep.addr.uid {
            ep.ovf.commit();
            continue;
        }
        let p = ep.peer_index(m.src);
        if ep.peers[p].broken {
            ep.ovf.commit();
            continue;
        }
        if handle(ep, ctx, p, &m.hdr, &Src::Buf(&m.payload[..OVF_PAYLOAD])) == Flow::Stall {
            ep.stats.stalls += 1;
            break;
        }
        ep.stats.rx_ovf += 1;
        ep.ovf.commit();
    }
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

#[inline]
fn rx_room(ep: &EpState, ctx: &Ctx<'_>) -> bool {
    ep.rx_cq.is_none_or(|c| ctx.cqs[c].as_ref().is_none_or(|q| q.has_room()))
}

fn new_unexp_id(ep: &mut EpState) -> u64 {
    let id = ep.next_unexp_id;
    ep.next_unexp_id += 1;
    id
}

/// Whether holding `more` unexpected bytes from peer `p` is refused (the
/// ring then stalls: back-pressure). Never refused while we wait on `p`
/// itself (a matched receive whose data it is sending, or a send of ours
/// awaiting its FIN or CTS): what we wait for may sit behind this message
/// in the same ring, so refusing would deadlock. The overshoot is bounded
/// by what fits in that ring and the pool ahead of it.
fn unexp_full(ep: &EpState, ctx: &Ctx<'_>, p: usize, more: usize) -> bool {
    let full =
        ep.unexp_bytes + more > ctx.cfg.unexp_max || ep.unexp[0].len() + ep.unexp[1].len() >= ctx.cfg.rx_size * 4;
    full && !waiting_on(ep, p)
}

fn waiting_on(ep: &EpState, p: usize) -> bool {
    let peer = &ep.peers[p];
    peer.rx_parts.iter().any(|x| matches!(x.1, RxCur::Active(_) | RxCur::Split(_)))
        || peer.inflight.iter().any(|op| matches!(op.state, TxState::AwaitFin { .. }))
}

/// An inline message: checked, then the common case ([`eager_to_front`])
/// inlined into the ring's drain loop, the rest out of line.
#[inline(always)]
fn on_eager(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    let len = h.len as usize;
    if len > src.cap() {
        bad(ep, ctx, p, None, "inline length beyond its cells");
        return Flow::Done;
    }
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    if let Some(flow) = eager_to_front(ep, ctx, p, h, src, len, tagged) {
        return flow;
    }
    if !rx_room(ep, ctx) {
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
    src: &Src<'_>,
    len: usize,
    tagged: bool,
) -> Flow {
    let q = tagged as usize;
    // Matched by reference: moving the Dest out of the Option would copy
    // bytes just written by narrow stores (a store-forwarding stall).
    let m = ep.take_match(ctx, tagged, p, h.tag, len);
    match &m {
        Some(d) => {
            let n = d.iovs.scatter(0, len.min(d.cap), |o, dst| src.read(o, dst));
            let info = RxInfo { tagged, tag: h.tag, data: h.data, hflags: h.flags, total: len, delivered: n };
            if ep.peers[p].rx_order.is_empty() {
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
            let mut v = ep.spare_buf(len);
            src.read(0, &mut v);
            ep.unexp_bytes += len;
            let id = new_unexp_id(ep);
            let body = UnexpBody::Data { v, received: len, msg_id: 0 };
            ep.unexp[q].push_back(Unexp { id, peer: p, tag: h.tag, data: h.data, hflags: h.flags, len, body });
        }
    }
    Flow::Done
}

/// How a receive completion signals an armed channel: solicited messages
/// always; others not at all on a solicited-wait endpoint.
#[inline]
fn rx_signal(ep: &EpState, hflags: u8) -> Signal {
    if hflags & hdr_flags::SOLICITED != 0 {
        Signal::Solicited
    } else if ep.solicited_wait {
        Signal::Quiet
    } else {
        Signal::Normal
    }
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
    src: &Src<'_>,
    len: usize,
    tagged: bool,
) -> Option<Flow> {
    if (!tagged && ep.srq.is_some()) || !ep.peers[p].rx_order.is_empty() {
        return None;
    }
    let q = tagged as usize;
    let r = ep.posted[q].front()?;
    let seg = r.iovs.v[0];
    if r.multi
        || r.iovs.n != 1
        || len > seg.len
        || r.src.is_some_and(|s| s != p)
        || (tagged && (h.tag & !r.ignore) != (r.tag & !r.ignore))
    {
        return None;
    }
    let (op_context, cqe) = (r.ctx, r.cqe);
    let mut cq = None;
    if let Some(c) = ep.rx_cq {
        if let Some(q) = ctx.cqs[c].as_mut() {
            if !q.has_room() {
                return Some(Flow::Stall);
            }
            cq = Some(q);
        }
    }
    // SAFETY: the posted receive's buffer, valid and writable until its
    // completion (the posting contract); len <= its length.
    let dst = unsafe { std::slice::from_raw_parts_mut(seg.ptr as *mut u8, len) };
    src.read(0, dst);
    ep.posted[q].pop_front();
    let ok =
        RxOk { op_context, buf: seg.ptr, len, tagged, hflags: h.flags, data: h.data, tag: h.tag, multi_release: false };
    complete_rx_ok(ep, ctx.counters, ctx.avs, cq, p, &ok, cqe);
    Some(Flow::Done)
}

/// Starts a matched multi-part receive: its data arrives in chunks.
fn start_active(ep: &mut EpState, p: usize, msg_id: u64, a: ActiveRecv) {
    let peer = &mut ep.peers[p];
    peer.rx_parts.push((msg_id, RxCur::Active(a)));
    peer.rx_order.push_back((msg_id, None));
}

fn on_bounce_hdr(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    if src.cap() < 16 {
        bad(ep, ctx, p, None, "short bounce header");
        return Flow::Done;
    }
    let (msg_id, total) = (src.u64_at(0), src.u64_at(8) as usize);
    if msg_id == 0 || total == 0 || total > MAX_MSG_SIZE || ep.peers[p].rx_parts.iter().any(|x| x.0 == msg_id) {
        bad(ep, ctx, p, None, "bad bounce header");
        return Flow::Done;
    }
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    let q = tagged as usize;
    match ep.take_match(ctx, tagged, p, h.tag, total) {
        Some(dest) => {
            start_active(
                ep,
                p,
                msg_id,
                ActiveRecv { dest, total, received: 0, tag: h.tag, data: h.data, hflags: h.flags },
            );
        }
        None => {
            // The data will be copied out of the pool as it arrives
            // (counted in unexp_bytes chunk by chunk).
            let id = new_unexp_id(ep);
            let body = UnexpBody::Data { v: Vec::new(), received: 0, msg_id };
            ep.unexp[q].push_back(Unexp { id, peer: p, tag: h.tag, data: h.data, hflags: h.flags, len: total, body });
            ep.peers[p].rx_parts.push((msg_id, RxCur::Unexp { id, total }));
        }
    }
    Flow::Done
}

fn find_unexp(ep: &mut EpState, id: u64) -> Option<&mut Unexp> {
    let [a, b] = &mut ep.unexp;
    a.iter_mut().chain(b.iter_mut()).find(|u| u.id == id)
}

fn on_chunk(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    if src.cap() < 4 {
        bad(ep, ctx, p, None, "short chunk message");
        return Flow::Done;
    }
    let idx = src.u32_at(0);
    let (msg_id, off, len) = (h.tag, h.data as usize, h.len as usize);
    let Some(chunk) = ep.pool.chunk(idx) else {
        bad(ep, ctx, p, Some(msg_id), "chunk index out of range");
        return Flow::Done;
    };
    if len == 0 || len > ep.pool.chunk_size() {
        ep.pool.free(idx);
        bad(ep, ctx, p, Some(msg_id), "chunk length out of range");
        return Flow::Done;
    }
    let Some(k) = ep.peers[p].rx_parts.iter().position(|x| x.0 == msg_id) else {
        ep.pool.free(idx);
        bad(ep, ctx, p, None, "chunk for no message in progress");
        return Flow::Done;
    };
    // SAFETY: chunk is one of our pool's chunks (index checked) and
    // len <= chunk_size; the sender filled it before publishing the message.
    let bytes = unsafe { std::slice::from_raw_parts(chunk as *const u8, len) };
    match &mut ep.peers[p].rx_parts[k].1 {
        RxCur::Split(_) => {
            ep.pool.free(idx);
            bad(ep, ctx, p, None, "chunk for a message being copied directly");
        }
        RxCur::Active(a) => {
            if off != a.received || off + len > a.total {
                ep.pool.free(idx);
                bad(ep, ctx, p, Some(msg_id), "chunk out of order");
                return Flow::Done;
            }
            if off < a.dest.cap {
                let n = (a.dest.cap - off).min(len);
                a.dest.iovs.scatter(off, n, |o, dst| dst.copy_from_slice(&bytes[o..o + dst.len()]));
            }
            ep.pool.free(idx);
            a.received += len;
            if a.received == a.total {
                let (_, cur) = ep.peers[p].rx_parts.swap_remove(k);
                let RxCur::Active(a) = cur else { unreachable!("matched above") };
                finish_active(ep, ctx, p, msg_id, a, None);
            }
        }
        RxCur::Unexp { id, total } => {
            let (id, total) = (*id, *total);
            if unexp_full(ep, ctx, p, len) {
                return Flow::Stall; // chunk stays in the pool and the message in the ring
            }
            let ok = match find_unexp(ep, id) {
                Some(Unexp { body: UnexpBody::Data { v, received, .. }, .. })
                    if *received == off && off + len <= total =>
                {
                    v.extend_from_slice(bytes);
                    *received += len;
                    Some(*received == total)
                }
                _ => None,
            };
            ep.pool.free(idx);
            match ok {
                Some(done) => {
                    ep.unexp_bytes += len;
                    if done {
                        ep.peers[p].rx_parts.swap_remove(k);
                    }
                }
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
    cma: bool,
}

fn on_rts(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    let malformed = |ep: &mut EpState, ctx: &mut Ctx<'_>| {
        bad(ep, ctx, p, None, "malformed request to send");
        Flow::Done
    };
    if src.cap() < 24 {
        return malformed(ep, ctx);
    }
    let (msg_id, total, niov, fl) = (src.u64_at(0), src.u64_at(8) as usize, src.u32_at(16) as usize, src.u32_at(20));
    if msg_id == 0 || niov == 0 || niov > MAX_IOV || 24 + 16 * niov > src.cap() || total > MAX_MSG_SIZE {
        return malformed(ep, ctx);
    }
    let iovs: Vec<(u64, u64)> = (0..niov).map(|i| (src.u64_at(24 + 16 * i), src.u64_at(32 + 16 * i))).collect();
    if iovs.iter().try_fold(0u64, |a, v| a.checked_add(v.1)) != Some(total as u64)
        || ep.peers[p].rx_parts.iter().any(|x| x.0 == msg_id)
    {
        return malformed(ep, ctx);
    }
    if !rx_room(ep, ctx) {
        return Flow::Stall;
    }
    let rts = Rts { msg_id, iovs, cma: fl & rts_flags::CMA != 0 };
    let tagged = h.flags & hdr_flags::TAGGED != 0;
    let q = tagged as usize;
    match ep.take_match(ctx, tagged, p, h.tag, total) {
        Some(d) => {
            let info = RxInfo { tagged, tag: h.tag, data: h.data, hflags: h.flags, total, delivered: 0 };
            rendezvous(ep, ctx, p, d, info, rts);
        }
        None => {
            if unexp_full(ep, ctx, p, 0) {
                return Flow::Stall;
            }
            let id = new_unexp_id(ep);
            let body = UnexpBody::Rts { msg_id, iovs: rts.iovs, cma: rts.cma };
            ep.unexp[q].push_back(Unexp { id, peer: p, tag: h.tag, data: h.data, hflags: h.flags, len: total, body });
        }
    }
    Flow::Done
}

/// A matched rendezvous: read the data by single copy if the sender offered
/// it and the kernel lets us; else ask for it through the pool.
fn rendezvous(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, d: Dest, mut info: RxInfo, rts: Rts) {
    if let Err(e) = ensure_connected(ep, ctx, p) {
        let f = (ErrorKind::Io, prov::CMA_FAULT, format!("cannot reach the sender to fetch its message: {e}"));
        finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: Some(f) });
        return;
    }
    let try_cma = rts.cma && !ep.peers[p].cma_refused && ctx.cfg.cma != crate::proto::CmaMode::Off;
    if try_cma {
        let want = info.total.min(d.cap);
        let on_ring = matches!(ep.peers[p].chan, Some(Chan::Ring(_)));
        // The sender's half goes in one CTS_WRITE of at most MAX_IOV ranges.
        let fits = d.iovs.n <= MAX_IOV;
        if ep.peers[p].cma_worked && on_ring && fits && want >= ctx.cfg.split_min.max(8192) {
            split_copy(ep, ctx, p, d, info, rts, want);
            return;
        }
        let local = local_ranges(&d, 0, usize::MAX);
        let peer = &mut ep.peers[p];
        match cma::read(peer.pid, &local, &rts.iovs, ctx.cfg.cma) {
            Ok(n) => {
                info.delivered = n;
                peer.cma_worked = true;
                ep.stats.cma_reads += 1;
                finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: None });
                queue_ctrl(ep, p, Ctrl::new(op::FIN, rts.msg_id, 0));
                return;
            }
            Err(CmaError::Refused(_)) => peer.cma_refused = true,
            Err(CmaError::Fault(e)) => {
                let f = cma_fail(&peer.addr, peer.pid, e);
                finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: Some(f) });
                queue_ctrl(ep, p, Ctrl::new(op::FIN, rts.msg_id, ErrorKind::Io.errno() as u32));
                return;
            }
        }
    }
    if info.total == 0 {
        finish_rx(ep, ctx, p, 0, PendingRx { dest: d, info, err: None });
        queue_ctrl(ep, p, Ctrl::new(op::FIN, rts.msg_id, 0));
        return;
    }
    ep.stats.cma_fallbacks += 1;
    let a = ActiveRecv { dest: d, total: info.total, received: 0, tag: info.tag, data: info.data, hflags: info.hflags };
    start_active(ep, p, rts.msg_id, a);
    queue_ctrl(ep, p, Ctrl::new(op::CTS_BOUNCE, rts.msg_id, 0));
}

/// Our receive buffer's bytes `[off, off + len)` as (pointer, length) ranges.
fn local_ranges(d: &Dest, off: usize, len: usize) -> Vec<(*mut u8, usize)> {
    let all: Vec<(u64, u64)> = d.iovs.segs().iter().map(|s| (s.ptr as u64, s.len as u64)).collect();
    let len = len.min(d.cap.saturating_sub(off));
    cma::sub_ranges(&all, off, len).into_iter().map(|(a, l)| (a as usize as *mut u8, l as usize)).collect()
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
    let mut pl = Vec::with_capacity(8 + 16 * theirs.len());
    pl.extend_from_slice(&(theirs.len() as u32).to_le_bytes());
    pl.extend_from_slice(&0u32.to_le_bytes());
    for (a, l) in &theirs {
        pl.extend_from_slice(&(*a as u64).to_le_bytes());
        pl.extend_from_slice(&(*l as u64).to_le_bytes());
    }
    let mut c = Ctrl::new(op::CTS_WRITE, rts.msg_id, 0);
    c.data = split as u64;
    c.payload = pl;
    queue_ctrl(ep, p, c);
    progress_peer_tx(ep, ctx, p);
    let mine = local_ranges(&d, 0, split);
    let peer = &mut ep.peers[p];
    let own_err = match cma::read(peer.pid, &mine, &cma::sub_ranges(&rts.iovs, 0, split), ctx.cfg.cma) {
        Ok(_) => None,
        Err(CmaError::Refused(e)) | Err(CmaError::Fault(e)) => Some(cma_fail(&peer.addr, peer.pid, e)),
    };
    ep.stats.cma_reads += 1;
    ep.stats.split_copies += 1;
    let sr = SplitRecv { dest: d, info, split, want, remote: rts.iovs, own_err };
    ep.peers[p].rx_parts.push((rts.msg_id, RxCur::Split(sr)));
    ep.peers[p].rx_order.push_back((rts.msg_id, None));
    // No FIN yet: if the sender's write fails we still read its buffer, so
    // its send may complete only after WDONE (on_wdone sends the FIN).
}

/// Sender side of a split copy: write the asked part of our message into
/// the receiver's buffer, then say so.
fn on_cts_write(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr, src: &Src<'_>) -> Flow {
    let msg_id = h.tag;
    let parsed = (src.cap() >= 8).then(|| src.u32_at(0) as usize).filter(|&n| n <= MAX_IOV && 8 + 16 * n <= src.cap());
    let ranges: Vec<(u64, u64)> = match parsed {
        Some(n) => (0..n).map(|i| (src.u64_at(8 + 16 * i), src.u64_at(16 + 16 * i))).collect(),
        None => Vec::new(),
    };
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    let off = h.data as usize;
    let peer = &mut ep.peers[p];
    let op = peer.inflight.iter().find(|op| op.state == (TxState::AwaitFin { msg_id }));
    let status = match op {
        Some(op) if parsed.is_some() && off.checked_add(total as usize).is_some_and(|e| e <= op.len) => {
            let all: Vec<(u64, u64)> = op.iovs.segs().iter().map(|s| (s.ptr as u64, s.len as u64)).collect();
            let local: Vec<(*mut u8, usize)> = cma::sub_ranges(&all, off, total as usize)
                .into_iter()
                .map(|(a, l)| (a as usize as *mut u8, l as usize))
                .collect();
            match cma::write(peer.pid, &local, &ranges, ctx.cfg.cma) {
                Ok(_) => 0,
                Err(CmaError::Refused(e)) | Err(CmaError::Fault(e)) => e as u32,
            }
        }
        _ => ErrorKind::Io.errno() as u32,
    };
    queue_ctrl(ep, p, Ctrl::new(op::WDONE, msg_id, status));
    Flow::Done
}

/// Receiver side: the sender's half is in place (or failed: then read it
/// ourselves); the split receive completes.
fn on_wdone(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr) -> Flow {
    let Some(k) = ep.peers[p].rx_parts.iter().position(|x| x.0 == h.tag && matches!(x.1, RxCur::Split(_))) else {
        return Flow::Done;
    };
    let RxCur::Split(mut s) = ep.peers[p].rx_parts.swap_remove(k).1 else { unreachable!("matched above") };
    if h.len != 0 && s.own_err.is_none() {
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
    finish_rx(ep, ctx, p, h.tag, PendingRx { dest: s.dest, info, err: s.own_err });
    // Done with the sender's buffer: its send may complete.
    queue_ctrl(ep, p, Ctrl::new(op::FIN, h.tag, status));
    Flow::Done
}

fn on_cts(ep: &mut EpState, p: usize, h: &MsgHdr) -> Flow {
    let peer = &mut ep.peers[p];
    if let Some(op) = peer.inflight.iter_mut().find(|op| op.state == (TxState::AwaitFin { msg_id: h.tag })) {
        op.state = TxState::Chunks { off: 0, msg_id: h.tag };
        if op.owned.is_none() {
            // We offered single copy and the receiver could not use it:
            // stop offering it to this peer (and use the no-CMA thresholds).
            peer.cma_refused = true;
        }
        ep.mark_busy(p);
    }
    Flow::Done
}

fn on_fin(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, h: &MsgHdr) -> Flow {
    let who = crate::av::AddressVector::straddr(&ep.peers[p].addr);
    let peer = &mut ep.peers[p];
    if let Some(op) = peer.inflight.iter_mut().find(|op| op.state == (TxState::AwaitFin { msg_id: h.tag })) {
        op.state = TxState::Done;
        if h.len != 0 {
            let k = ErrorKind::from_errno(h.len as i32);
            op.err = Some((k, prov::REMOTE, format!("{who} failed to take the message: {}", k.message())));
        }
        retire(ep, ctx, p);
    }
    Flow::Done
}

impl ActiveRecv {
    /// Facts for its completion, with `delivered` bytes in place.
    fn info(&self, delivered: usize) -> RxInfo {
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

fn finish_active(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, msg_id: u64, a: ActiveRecv, err: Option<Fail>) {
    let info = a.info(a.received.min(a.total).min(a.dest.cap));
    finish_rx(ep, ctx, p, msg_id, PendingRx { dest: a.dest, info, err });
}

/// A peer sent something that does not parse: drop it and fail the
/// multi-part message it belonged to, if known.
fn bad(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, msg_id: Option<u64>, what: &str) {
    let who = crate::av::AddressVector::straddr(&ep.peers[p].addr);
    let Some(m) = msg_id else { return };
    let Some(k) = ep.peers[p].rx_parts.iter().position(|x| x.0 == m) else {
        return;
    };
    match ep.peers[p].rx_parts.swap_remove(k).1 {
        RxCur::Active(a) => {
            let f = (ErrorKind::Io, prov::PROTOCOL, format!("{who}: {what}"));
            finish_active(ep, ctx, p, m, a, Some(f));
        }
        RxCur::Unexp { id, .. } => {
            for q in 0..2 {
                if let Some(i) = ep.unexp[q].iter().position(|u| u.id == id) {
                    if let Some(Unexp { body: UnexpBody::Data { v, .. }, .. }) = ep.unexp[q].remove(i) {
                        ep.unexp_bytes -= v.len();
                    }
                }
            }
        }
        // The sender may still be writing into that buffer: only its WDONE
        // may complete the receive.
        split @ RxCur::Split(_) => ep.peers[p].rx_parts.push((m, split)),
    }
}

/// Longest an endpoint's close waits for senders still writing into its
/// receive buffers (split single copies).
const CLOSE_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The endpoint closes: waits (bounded by [`CLOSE_DRAIN`], and only for
/// live peers) for split copies the senders are writing into our buffers,
/// then writes every matched receive in per-peer order: those complete but
/// held for order as they are, the others as `FI_ECANCELED` (flushed). SRQ
/// buffers the endpoint dequeued are thereby reported exactly once.
pub(crate) fn flush_rx(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    ep.closing = true;
    let t0 = std::time::Instant::now();
    let splitting = |ep: &EpState| {
        ep.peers.iter().any(|p| p.gone.is_none() && p.rx_parts.iter().any(|x| matches!(x.1, RxCur::Split(_))))
    };
    while splitting(ep) && t0.elapsed() < CLOSE_DRAIN {
        progress_ep(ep, ctx);
        std::thread::yield_now();
    }
    let cancel = || (ErrorKind::Canceled, prov::FLUSHED, "endpoint closed before the receive completed".to_string());
    for p in 0..ep.peers.len() {
        let order: Vec<(u64, Option<PendingRx>)> = ep.peers[p].rx_order.drain(..).collect();
        let mut parts: Vec<(u64, RxCur)> = ep.peers[p].rx_parts.drain(..).collect();
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
            emit_rx(ep, ctx, p, &pr.dest, &pr.info, pr.err);
        }
    }
}

/// Delivers an unexpected message to a receive posted for it.
pub(crate) fn deliver_unexp(ep: &mut EpState, ctx: &mut Ctx<'_>, u: Unexp, d: Dest, tagged: bool) {
    let info = RxInfo { tagged, tag: u.tag, data: u.data, hflags: u.hflags, total: u.len, delivered: 0 };
    match u.body {
        UnexpBody::Data { v, received, msg_id } => {
            ep.unexp_bytes -= v.len();
            let n = d.iovs.scatter(0, v.len().min(d.cap), |o, dst| dst.copy_from_slice(&v[o..o + dst.len()]));
            ep.recycle_buf(v);
            if received == u.len {
                finish_rx(ep, ctx, u.peer, 0, PendingRx { dest: d, info: RxInfo { delivered: n, ..info }, err: None });
            } else {
                // Still arriving: the rest goes straight to the receive.
                let peer = &mut ep.peers[u.peer];
                if let Some(x) = peer.rx_parts.iter_mut().find(|x| x.0 == msg_id) {
                    x.1 = RxCur::Active(ActiveRecv {
                        dest: d,
                        total: u.len,
                        received,
                        tag: u.tag,
                        data: u.data,
                        hflags: u.hflags,
                    });
                    peer.rx_order.push_back((msg_id, None));
                }
            }
        }
        UnexpBody::Rts { msg_id, iovs, cma } => rendezvous(ep, ctx, u.peer, d, info, Rts { msg_id, iovs, cma }),
    }
}

/// A receive from `p` is complete: write it now, or after the receives
/// matched before it from the same peer (`key` is its message id if it was
/// started with `start_active`, else 0).
fn finish_rx(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, key: u64, pr: PendingRx) {
    let order = &mut ep.peers[p].rx_order;
    if key == 0 && order.is_empty() {
        emit_rx(ep, ctx, p, &pr.dest, &pr.info, pr.err);
        return;
    }
    match order.iter_mut().find(|x| key != 0 && x.0 == key) {
        Some(slot) => slot.1 = Some(pr),
        None => order.push_back((0, Some(pr))),
    }
    while ep.peers[p].rx_order.front().is_some_and(|x| x.1.is_some()) {
        let (_, pr) = ep.peers[p].rx_order.pop_front().expect("front checked");
        let pr = pr.expect("checked");
        emit_rx(ep, ctx, p, &pr.dest, &pr.info, pr.err);
    }
}

/// A receive that completed without error, for [`complete_rx_ok`].
struct RxOk {
    op_context: usize,
    buf: usize,
    len: usize,
    tagged: bool,
    hflags: u8,
    data: u64,
    tag: u64,
    multi_release: bool,
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
/// fast path ([`eager_to_front`]); inlined, so `ok` is never a struct
/// re-read from memory.
#[inline(always)]
fn complete_rx_ok(
    ep: &mut EpState,
    counters: &[shm_layout::Counter],
    avs: &[Option<crate::av::AvState>],
    cq: Option<&mut crate::cq::CqState>,
    p: usize,
    ok: &RxOk,
    entry: bool,
) {
    if let Some(c) = ep.cntr_recv {
        // SYNC: pairs with the acquire loads in Counter::read/readerr.
        counters[c].value.v.fetch_add(1, Ordering::Release);
    }
    if !entry {
        return;
    }
    let Some(cq) = cq else {
        return;
    };
    // Each only if it will be used.
    let src = if cq.wants_src() { ep.src_addr(avs, p) } else { FI_ADDR_NOTAVAIL };
    let sig = if cq.notifies() { rx_signal(ep, ok.hflags) } else { Signal::Normal };
    let has_data = ok.hflags & hdr_flags::REMOTE_CQ_DATA != 0;
    let e = CqTaggedEntry {
        op_context: ok.op_context,
        flags: rx_flags(ok.tagged, ok.hflags, ok.multi_release),
        len: ok.len,
        buf: ok.buf,
        data: if has_data { ok.data } else { 0 },
        tag: if ok.tagged { ok.tag } else { 0 },
    };
    cq.push_ext(e, src, sig);
}

/// Writes a finished receive's completion (success, truncation or error).
#[inline]
fn emit_rx(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize, d: &Dest, i: &RxInfo, err: Option<Fail>) {
    if d.iovs.ext_slot().is_some() {
        if let Some(q) = ep.srq.and_then(|s| ctx.srqs[s].as_mut()) {
            q.release(&d.iovs);
        }
    }
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
        let ok = RxOk {
            op_context: d.ctx,
            buf: d.buf,
            len: i.delivered,
            tagged: i.tagged,
            hflags: i.hflags,
            data: i.data,
            tag: i.tag,
            multi_release: d.multi_release,
        };
        let cq = ep.rx_cq.and_then(|c| ctx.cqs[c].as_mut());
        complete_rx_ok(ep, ctx.counters, ctx.avs, cq, p, &ok, d.cqe || d.multi_release);
        return;
    };
    if let Some(c) = ep.cntr_recv {
        // SYNC: pairs with the acquire loads in Counter::read/readerr.
        ctx.counters[c].err.v.fetch_add(1, Ordering::Release);
    }
    let Some(cq) = ep.rx_cq.and_then(|c| ctx.cqs[c].as_mut()) else {
        return;
    };
    cq.push_err(
        CqErrEntry {
            op_context: d.ctx,
            flags: rx_flags(i.tagged, i.hflags, d.multi_release),
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

#[inline]
pub(crate) fn complete_tx(ep: &mut EpState, ctx: &mut Ctx<'_>, op: &TxOp, err: Option<Fail>) {
    complete_send(
        ep,
        ctx,
        SendDone { ctx: op.ctx, tagged: op.tagged, tag: op.tag, cqe: op.cqe, inject: op.inject },
        err,
    )
}

/// What a send's completion needs to know of it.
#[derive(Clone, Copy)]
pub(crate) struct SendDone {
    pub ctx: usize,
    pub tagged: bool,
    pub tag: u64,
    pub cqe: bool,
    pub inject: bool,
}

#[inline]
pub(crate) fn complete_send(ep: &mut EpState, ctx: &mut Ctx<'_>, op: SendDone, err: Option<Fail>) {
    let flags = FI_SEND | if op.tagged { FI_TAGGED } else { FI_MSG };
    if let Some(c) = ep.cntr_send {
        let c = &ctx.counters[c];
        // SYNC: pairs with the acquire loads in Counter::read/readerr.
        if err.is_some() { &c.err.v } else { &c.value.v }.fetch_add(1, Ordering::Release);
    }
    if err.is_none() && !op.cqe {
        return; // an inject, or a send without FI_COMPLETION
    }
    let Some(cq) = ep.tx_cq.and_then(|c| ctx.cqs[c].as_mut()) else {
        return;
    };
    match err {
        Some((k, pe, detail)) if !op.inject => cq.push_err(
            CqErrEntry { op_context: op.ctx, flags, tag: op.tag, err: k.errno(), prov_errno: pe, ..Default::default() },
            detail,
        ),
        None if op.cqe => cq.push(CqTaggedEntry { op_context: op.ctx, flags, ..Default::default() }, NO_SRC),
        _ => {}
    }
}

/// Completes finished sends from the front of a peer's in-flight queue.
fn retire(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize) {
    while ep.peers[p].inflight.front().is_some_and(|op| op.state == TxState::Done) {
        let mut op = ep.peers[p].inflight.pop_front().expect("front checked");
        ep.tx_outstanding -= 1;
        let err = op.err.take();
        complete_tx(ep, ctx, &op, err);
    }
}

fn ensure_connected(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize) -> crate::Result<()> {
    if ep.peers[p].chan.is_none() {
        ep.connect(ctx, p)?;
    }
    Ok(())
}

fn queue_ctrl(ep: &mut EpState, p: usize, c: Ctrl) {
    ep.peers[p].ctrlq.push_back(c);
    ep.mark_busy(p);
}

fn chan_push(chan: &mut Chan, me: &shm_layout::Address, h: &MsgHdr, parts: &[&[u8]]) -> bool {
    match chan {
        Chan::Ring(r) => r.try_push(h, parts),
        Chan::Ovf(q) => {
            let mut buf = [0u8; OVF_PAYLOAD];
            let mut at = 0;
            for p in parts {
                if at + p.len() > OVF_PAYLOAD {
                    return false;
                }
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            let mut h = *h;
            h.ncells = 1;
            q.push(&h, me, &buf[..at])
        }
    }
}

fn chan_room(chan: &mut Chan, ncells: usize) -> bool {
    match chan {
        Chan::Ring(r) => r.has_room_for(ncells),
        Chan::Ovf(_) => true,
    }
}

fn data_hdr(op: &TxOp, kind: u8, len: u32) -> MsgHdr {
    MsgHdr { op: kind, flags: op.hflags, ncells: 0, len, tag: op.tag, data: op.data }
}

/// Sends an inline message at once if the channel has room.
pub(crate) fn push_inline(peer: &mut Peer, me: &shm_layout::Address, op: &TxOp) -> bool {
    match peer.chan.as_mut() {
        Some(chan) => push_inline_chan(chan, me, op),
        None => false,
    }
}

fn push_inline_chan(chan: &mut Chan, me: &shm_layout::Address, op: &TxOp) -> bool {
    // SAFETY: the op's buffers are valid until completion (its contract).
    let slices = unsafe { op.iovs.slices() };
    chan_push(chan, me, &data_hdr(op, op::EAGER, op.len as u32), &slices[..op.iovs.n])
}

/// Moves every busy peer's queues forward.
pub(crate) fn progress_tx(ep: &mut EpState, ctx: &mut Ctx<'_>) {
    let mut i = 0;
    while i < ep.busy.len() {
        let p = ep.busy[i];
        progress_peer_tx(ep, ctx, p);
        let peer = &mut ep.peers[p];
        let idle = peer.txq.is_empty()
            && peer.ctrlq.is_empty()
            && !peer.inflight.iter().any(|op| matches!(op.state, TxState::Chunks { .. }));
        if idle {
            peer.busy = false;
            ep.busy.swap_remove(i);
        } else {
            i += 1;
        }
    }
}

/// Pushes the next chunk of `op`; false when the ring or pool is full.
fn push_chunk(chan: &mut Chan, me: &shm_layout::Address, pool: &crate::pool::Pool, op: &mut TxOp) -> bool {
    let TxState::Chunks { off, msg_id } = op.state else {
        return false;
    };
    if !chan_room(chan, 1) {
        return false;
    }
    let Some(idx) = pool.alloc() else {
        return false;
    };
    let n = (op.len - off).min(pool.chunk_size());
    let chunk = pool.chunk(idx).expect("allocated index is in range");
    // SAFETY: we own chunk idx (popped from the free list) until the CHUNK
    // message hands it to the receiver; n <= chunk_size.
    op.iovs.gather(off, unsafe { std::slice::from_raw_parts_mut(chunk, n) });
    let h = MsgHdr { op: op::CHUNK, flags: 0, ncells: 0, len: n as u32, tag: msg_id, data: off as u64 };
    if !chan_push(chan, me, &h, &[&idx.to_le_bytes()]) {
        pool.free(idx);
        return false;
    }
    op.state = if off + n >= op.len { TxState::Done } else { TxState::Chunks { off: off + n, msg_id } };
    true
}

/// Moves one peer's control messages, in-flight data and queued sends
/// forward as far as ring room and pool chunks allow.
pub(crate) fn progress_peer_tx(ep: &mut EpState, ctx: &mut Ctx<'_>, p: usize) {
    if ep.peers[p].gone.is_some() || ensure_connected(ep, ctx, p).is_err() {
        return;
    }
    if !ep.peers[p].chan_valid() {
        chan_lost(ep, ctx, p);
        return;
    }
    let me = ep.addr;
    let mut pushed = false;
    {
        let stats = &mut ep.stats;
        let peer = &mut ep.peers[p];
        let chan = peer.chan.as_mut().expect("connected");
        let pool = peer.pool.as_ref().expect("connected");
        let cma_refused = peer.cma_refused;
        // 1. Control messages first: they unblock the peer.
        while let Some(c) = peer.ctrlq.front() {
            let h = MsgHdr { op: c.op, flags: 0, ncells: 0, len: c.status, tag: c.msg_id, data: c.data };
            if !chan_push(chan, &me, &h, &[&c.payload]) {
                break;
            }
            peer.ctrlq.pop_front();
            pushed = true;
        }
        // 2. Data of messages already started, oldest first.
        let mut blocked = !peer.ctrlq.is_empty();
        for op in peer.inflight.iter_mut() {
            if blocked {
                break;
            }
            while matches!(op.state, TxState::Chunks { .. }) {
                if !push_chunk(chan, &me, pool, op) {
                    blocked = true;
                    break;
                }
                stats.tx_chunks += 1;
                pushed = true;
            }
        }
        // 3. Start queued sends: headers go out in order, even while older
        //    data still waits for pool chunks.
        while peer.ctrlq.is_empty() {
            let Some(op) = peer.txq.front_mut() else {
                break;
            };
            let ok = match op.proto {
                Proto::Inline => {
                    let ok = push_inline_chan(chan, &me, op);
                    if ok {
                        op.state = TxState::Done;
                    }
                    ok
                }
                Proto::Bounce => {
                    let msg_id = peer.next_msg_id;
                    let mut pl = [0u8; 16];
                    pl[..8].copy_from_slice(&msg_id.to_le_bytes());
                    pl[8..].copy_from_slice(&(op.len as u64).to_le_bytes());
                    let ok = chan_push(chan, &me, &data_hdr(op, op::BOUNCE_HDR, 0), &[&pl]);
                    if ok {
                        peer.next_msg_id += 1;
                        op.state = TxState::Chunks { off: 0, msg_id };
                        while !blocked && matches!(op.state, TxState::Chunks { .. }) {
                            if push_chunk(chan, &me, pool, op) {
                                stats.tx_chunks += 1;
                            } else {
                                blocked = true;
                            }
                        }
                    }
                    ok
                }
                Proto::Rndv => {
                    let msg_id = peer.next_msg_id;
                    let mut pl = [0u8; 24 + 16 * MAX_IOV];
                    let cma = crate::proto::offer_cma(ctx.cfg, cma_refused, op.owned.is_some());
                    pl[..8].copy_from_slice(&msg_id.to_le_bytes());
                    pl[8..16].copy_from_slice(&(op.len as u64).to_le_bytes());
                    pl[16..20].copy_from_slice(&(op.iovs.n as u32).to_le_bytes());
                    pl[20..24].copy_from_slice(&(if cma { rts_flags::CMA } else { 0 }).to_le_bytes());
                    for (k, s) in op.iovs.segs().iter().enumerate() {
                        pl[24 + 16 * k..32 + 16 * k].copy_from_slice(&(s.ptr as u64).to_le_bytes());
                        pl[32 + 16 * k..40 + 16 * k].copy_from_slice(&(s.len as u64).to_le_bytes());
                    }
                    let n = 24 + 16 * op.iovs.n;
                    let ok = chan_push(chan, &me, &data_hdr(op, op::RTS, 0), &[&pl[..n]]);
                    if ok {
                        peer.next_msg_id += 1;
                        op.state = TxState::AwaitFin { msg_id };
                    }
                    ok
                }
            };
            if !ok {
                break;
            }
            pushed = true;
            let op = peer.txq.pop_front().expect("front");
            match op.proto {
                Proto::Inline => stats.tx_inline += 1,
                Proto::Bounce => stats.tx_bounce += 1,
                Proto::Rndv => stats.tx_rndv += 1,
            }
            peer.inflight.push_back(op);
        }
        if pushed {
            if let Some(db) = peer.doorbell() {
                crate::doorbell::ring(db);
            }
        }
    }
    retire(ep, ctx, p);
}
