//! The transmit engine: per peer, the sends not started (`txq`), those
//! started and not yet complete (`inflight`) and the control messages
//! waiting to go (`ctrlq`); per endpoint, the peers with something to move
//! (`busy`) and the count of transmits outstanding.
//!
//! Invariants, kept by this module alone:
//! - `TxEngine::outstanding` is the number of transmit records in every
//!   peer's `txq` and `inflight` together (bounded by `tx_size`).
//! - `PeerTx::busy` is true exactly when the peer's index is in
//!   `TxEngine::busy`, and a peer is there while it has queued sends,
//!   control messages or pool chunks still to push.
//! - Headers leave in `txq` order; completions are written from the front
//!   of `inflight` only (send order per peer).

use super::complete::{complete_send, complete_send_ok, Dw, Fail, SendDone};
use super::matching::Dest;
use super::peers::{Chan, Peer};
use super::request::{Iovs, OpKind, Request};
use super::EpState;
use crate::domain::{Ctx, CtxSrc};
use crate::error::{Error, ErrorKind, Result};
use crate::proto::{self, Proto, INJECT_SIZE, MAX_MSG_SIZE};
use crate::ring::RingTx;
use shm_layout::{hdr_flags, op, rts_flags, wire, MsgHdr, CELL_PAYLOAD, OVF_PAYLOAD};
use std::collections::VecDeque;

/// Where a transmit stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxState {
    /// Nothing sent yet.
    Start,
    /// Header sent; streaming pool chunks, `off` bytes sent.
    Chunks { off: usize, msg_id: u64 },
    /// RTS sent; waiting for the receiver's FIN or CTS_BOUNCE.
    AwaitFin { msg_id: u64 },
    /// Finished; completes when every earlier send to the peer has.
    Done,
}

/// A transmit record: a request that did not complete at once.
pub(crate) struct TxOp {
    pub kind: OpKind,
    pub ctx: usize,
    pub tag: u64,
    pub data: u64,
    pub hflags: u8,
    pub len: usize,
    pub iovs: Iovs,
    /// Copy of the payload (inject queued behind other sends).
    pub owned: Option<Vec<u8>>,
    pub proto: Proto,
    pub state: TxState,
    /// Writes a CQ entry on success.
    pub cqe: bool,
    /// FI_INJECT: the caller may reuse its buffer; the payload is copied
    /// (`owned`) if it does not leave at once, and single copy is not
    /// offered.
    pub inject: bool,
    /// An inject call: no entry even on error (counters only).
    pub silent: bool,
    /// FI_DELIVERY_COMPLETE: sent by rendezvous, done at the receiver's
    /// FIN only (which it sends once the data is in place, whichever path
    /// carried it), also when the data goes through the pool.
    pub deliver: bool,
    /// Set when the receiver reported a failure.
    pub err: Option<Fail>,
    /// Deferred work's reporting (see [`Dw`]).
    pub dw: Dw,
    /// Holds a reservation in the transmit CQ (resource management): given
    /// back when its entry is written ([`complete_send`]), or when the
    /// endpoint closes with it outstanding
    /// ([`EpState::drop_tx_reservations`]).
    pub rsv: bool,
    /// A rendezvous offering single copy in one of the lowest
    /// [`EAGER_CLASSES`] of [`proto::pick_class`]: that class plus one (0
    /// otherwise). Its receiver's CTS_BOUNCE_THIS_ONE (the pool picked)
    /// lets the next sends of the class go eagerly ([`PeerTx::eager_left`]).
    pub pick: u8,
    /// Would have gone inline, but is part of a stream or found no room
    /// in the ring ([`proto::stream_to_pool`]): counted in
    /// `EpStats::tx_streamed` when its header leaves, with `tx_bounce`.
    pub streamed: bool,
}

/// The pick classes ([`proto::pick_class`]: 8-64 KiB by default, three
/// octaves) where a sender whose last rendezvous the receiver took through
/// the pool sends the next [`EAGER_RUN`] the ordinary way (inline, or
/// eagerly through the pool), saving the request and its answer; only
/// below [`EAGER_MAX`] bytes, whatever `SHMFAB_CMA_MIN` is.
pub const EAGER_CLASSES: usize = 3;

/// Bytes from which no send goes eagerly after a pick ([`EAGER_CLASSES`]).
/// Not 64-128 KiB any more (2026-11-27, paired `scripts/ab.sh`, this
/// against 128 KiB): far (raw 8 B 0.19-0.21 us) 64 KiB 10.12 -> 7.87 us
/// (better in 12 of 12) and 96 KiB 13.75 -> 10.21 (8 of 8); near (raw
/// 0.05) 64 KiB -0.16 (10 of 12), 96 KiB -3.7 (8 of 8; the placement
/// moved during it), 64 KiB streams +0.20 GB/s (6 of 8). Session 16 had
/// measured the eager run of 64-128 KiB 0.6-1.3 us faster near; not
/// reproduced here. (The bench's buffers sit in the kernel copy's slow
/// band, so every 64 KiB rendezvous there is answered with the pool: an
/// eager run after each.) Not 128-256 KiB either: there it won 0.5-0.7
/// us near but lost 1.9-2.3 us on a far placement where 128 KiB takes
/// 17 us (raw 8 B 0.13, 10 paired rounds, 2026-11-26).
pub const EAGER_MAX: usize = 64 * 1024;

/// The sends of 8 KiB up to [`STREAM_MAX`] (bytes, whatever
/// `SHMFAB_CMA_MIN` is) that would go by rendezvous, made while another
/// send to the peer is under way (a stream's), are flagged
/// `hdr_flags::STREAM` and go as the receiver's answers to the stream
/// say ([`StreamWay`]; outside the [`EAGER_CLASSES`], the ordinary way).
/// The receiver picks for them by the stream's rate
/// ([`proto::StreamPick`]), not by its one-copy measure, which waits on a
/// busy sender for the pool's sample: near it took single copy for 8 and
/// 16 KiB streams, which streamed at 3.5 and 5.4 GB/s against 9.7 and
/// 8.7 by the pool (2026-11-27, paired, raw 8 B 0.05 us). Until session
/// 20 those sends always went the ordinary way, which far kept 16 and 32
/// KiB streams at 2.3-2.5 and 1.9-2.2 GB/s against 4.3-4.4 and 6.1-6.2
/// by single copy (raw 0.25). Not 64 KiB and up, whose rendezvous each
/// get a pick (a far placement, raw 0.18: 5.97 GB/s by single copy
/// against 2.24 through the pool).
pub const STREAM_MAX: usize = 64 * 1024;

/// Sends of a class that go eagerly after the receiver picked the pool
/// for one; then a rendezvous lets it pick again (its measure stays
/// fresh: single copy can win again when the CPUs move).
pub const EAGER_RUN: u8 = 7;

/// [`EAGER_RUN`] after a pick of the pool whose measure is at least
/// `proto::PICK_SURE` times single copy's (CTS_BOUNCE_SURE): the
/// rendezvous that lets the receiver pick again comes every 32nd send
/// instead of every 8th where the pool wins by far, while a close pick
/// keeps the short run (31 for every pick lost 0.7 us at 64 KiB near and
/// 5 far in session 18: a wrong pick lasts four times as long).
pub const EAGER_RUN_SURE: u8 = 31;

impl TxOp {
    /// What its completion needs.
    #[inline]
    pub fn done(&self) -> SendDone {
        SendDone {
            kind: self.kind,
            ctx: self.ctx,
            tag: self.tag,
            cqe: self.cqe,
            silent: self.silent,
            dw: self.dw,
            rsv: self.rsv,
        }
    }

    fn hdr(&self, kind: u8, len: u32) -> MsgHdr {
        MsgHdr { op: kind, flags: self.hflags, ncells: 0, len, tag: self.tag, data: self.data }
    }
}

/// A control message waiting to go to a peer.
#[derive(Clone, Debug)]
pub(crate) struct Ctrl {
    /// Header, from a `shm_layout::wire` encoder.
    pub hdr: MsgHdr,
    /// Payload (CTS_WRITE's ranges), empty for most.
    pub payload: Vec<u8>,
}

impl Ctrl {
    /// A control message without payload.
    pub fn new(kind: wire::CtrlKind, msg_id: u64, status: u32) -> Ctrl {
        Ctrl { hdr: wire::Control { kind, status, msg_id }.encode(), payload: Vec::new() }
    }
}

/// Our transmits to one peer (see the module docs).
pub(crate) struct PeerTx {
    /// Sends not started yet, in order.
    txq: VecDeque<TxOp>,
    /// Sends started (header out), in order; completed from the front.
    inflight: VecDeque<TxOp>,
    ctrlq: VecDeque<Ctrl>,
    /// Id of the next multi-part message (never 0).
    next_msg_id: u64,
    /// In `TxEngine::busy`.
    busy: bool,
    /// Per class of [`EAGER_CLASSES`]: sends of that class still to go
    /// eagerly through the pool (set to [`EAGER_RUN`] when the receiver
    /// picks the pool for a rendezvous of it; counts down to 0, then a
    /// rendezvous lets the receiver pick again).
    eager_left: [u8; EAGER_CLASSES],
    /// Per class of [`EAGER_CLASSES`], how a stream's sends go (flagged
    /// `hdr_flags::STREAM`; the receiver picks for them by their rate,
    /// [`proto::StreamPick`]): see [`StreamWay`].
    stream_way: [StreamWay; EAGER_CLASSES],
}

/// How the next send of a stream in one class goes, from the receiver's
/// last answer to one of the stream's rendezvous messages. A stream's
/// sends are posted faster than answers come back (a window of 64 goes
/// out before the first answer), so unlike [`PeerTx::eager_left`] the
/// pool's run does not end at a rendezvous: the sends after it keep the
/// pool until its answer says otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum StreamWay {
    /// By rendezvous, each picked for by the receiver: at first, and
    /// while single copy is its pick (its FINs after reads say so).
    #[default]
    Rndv,
    /// The ordinary way (inline, or eagerly through the pool) after the
    /// receiver picked the pool (CTS_BOUNCE_THIS_ONE): `left` more, then
    /// one rendezvous to ask again, and the ordinary way while `asking`.
    /// `reads`: rendezvous read by single copy since; one may be the
    /// receiver's exploration (every 64th pick), two in a row are its
    /// pick, and end the pool's way.
    Pool { left: u8, asking: bool, reads: u8 },
}

impl PeerTx {
    pub fn new() -> PeerTx {
        PeerTx {
            txq: VecDeque::new(),
            inflight: VecDeque::new(),
            ctrlq: VecDeque::new(),
            next_msg_id: 1,
            busy: false,
            eager_left: [0; EAGER_CLASSES],
            stream_way: [StreamWay::Rndv; EAGER_CLASSES],
        }
    }

    /// Nothing queued or in flight: a new send may complete at once.
    #[inline(always)]
    pub fn quiet(&self) -> bool {
        self.txq.is_empty() && self.inflight.is_empty()
    }

    /// The eager class of a `len`-byte rendezvous that would go eagerly
    /// now ([`eager_after_pick`]: the receiver's last pick for its class
    /// was the pool, and the run is not over), if it would.
    #[inline]
    pub fn eager_class(&self, cfg: &proto::Config, len: usize) -> Option<usize> {
        eager_pick_class(cfg, len).filter(|&c| self.eager_left[c] > 0)
    }

    /// Whether sends to this peer are waiting for anything of it.
    pub fn pending(&self) -> bool {
        !self.txq.is_empty() || self.inflight.iter().any(|op| op.state != TxState::Done)
    }

    /// Whether a send of ours awaits the peer's answer (FIN or CTS).
    pub fn awaiting_answer(&self) -> bool {
        self.inflight.iter().any(|op| matches!(op.state, TxState::AwaitFin { .. }))
    }

    /// The rendezvous send `msg_id` awaiting the peer's answer.
    pub fn awaiting(&mut self, msg_id: u64) -> Option<&mut TxOp> {
        self.inflight.iter_mut().find(|op| op.state == (TxState::AwaitFin { msg_id }))
    }

    fn idle(&self) -> bool {
        self.txq.is_empty()
            && self.ctrlq.is_empty()
            && !self.inflight.iter().any(|op| matches!(op.state, TxState::Chunks { .. }))
    }
}

/// The endpoint's transmit engine (see the module docs).
pub(crate) struct TxEngine {
    /// Peers with queued transmits, control messages or chunks to push.
    busy: Vec<usize>,
    /// Transmit records queued or in flight, all peers.
    outstanding: usize,
}

impl TxEngine {
    pub fn new() -> TxEngine {
        TxEngine { busy: Vec::new(), outstanding: 0 }
    }

    /// Whether any peer has something to move.
    #[inline(always)]
    pub fn any_busy(&self) -> bool {
        !self.busy.is_empty()
    }

    /// Transmits queued or in flight.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Whether another transmit may be taken (`tx_size`).
    #[inline(always)]
    pub fn has_room(&self, tx_size: usize) -> bool {
        self.outstanding < tx_size
    }

    fn mark_busy(&mut self, ptx: &mut PeerTx, p: usize) {
        if !ptx.busy {
            ptx.busy = true;
            self.busy.push(p);
        }
    }

    /// Queues a control message to peer `p`.
    pub fn queue_ctrl(&mut self, peer: &mut Peer, p: usize, c: Ctrl) {
        peer.tx.ctrlq.push_back(c);
        self.mark_busy(&mut peer.tx, p);
    }

    /// The receiver of rendezvous send `msg_id` of peer `p` asked for the
    /// data through the pool (CTS_BOUNCE; `this_one`: for this message
    /// only, CTS_BOUNCE_THIS_ONE, CTS_BOUNCE_SURE or CTS_BOUNCE_EXPLORE):
    /// it goes on in chunks; `run`: the receiver picked the pool, so the
    /// next `run` of its class go eagerly ([`EAGER_RUN`], or
    /// [`EAGER_RUN_SURE`]; 0 after CTS_BOUNCE_EXPLORE, a measure of the
    /// pool while single copy stays preferred). True when that send had
    /// offered single copy (the receiver could not use it).
    pub fn bounce_requested(&mut self, peer: &mut Peer, p: usize, msg_id: u64, this_one: bool, run: u8) -> bool {
        let Some(op) = peer.tx.awaiting(msg_id) else {
            return false;
        };
        op.state = TxState::Chunks { off: 0, msg_id };
        let owned = op.owned.is_some();
        let (pick, stream) = (op.pick, op.hflags & hdr_flags::STREAM != 0);
        if this_one && run > 0 && pick > 0 {
            // The receiver picked the pool (or its buffer sits in the
            // kernel copy's slow band): the next of this class go eagerly
            // (the next of its stream, for a stream's message).
            let c = pick as usize - 1;
            if stream {
                peer.tx.stream_way[c] = StreamWay::Pool { left: EAGER_RUN, asking: false, reads: 0 };
            } else {
                peer.tx.eager_left[c] = run;
            }
        }
        self.mark_busy(&mut peer.tx, p);
        !owned
    }

    /// Takes every transmit of a peer that failed, in send order (control
    /// messages are dropped).
    pub fn take_all(&mut self, ptx: &mut PeerTx) -> Vec<TxOp> {
        let mut ops: Vec<TxOp> = ptx.inflight.drain(..).collect();
        ops.extend(ptx.txq.drain(..));
        ptx.ctrlq.clear();
        self.outstanding -= ops.len();
        ops
    }
}

/// The error for a kind not carried yet; out of line, so that no part of a
/// request on the send path has its address taken (the request then stays
/// in registers).
#[cold]
#[inline(never)]
fn unsupported(kind: OpKind) -> Error {
    Error::with(ErrorKind::NoSys, format!("{kind:?} operations are not supported yet"))
}

/// Sends an inline message at once if the channel has room.
fn push_inline(chan: &mut Chan, me: &shm_layout::Address, op: &TxOp) -> bool {
    // SAFETY: the op's buffers are valid until completion (its contract).
    let slices = unsafe { op.iovs.slices() };
    chan_push(chan, me, &op.hdr(op::EAGER, op.len as u32), &slices[..op.iovs.n])
}

/// Pushes one message to a peer. The ring's case is inlined into the
/// caller (one per pool fragment: the call and the overflow case's
/// stack buffer cost about 20 instructions per message there); the
/// overflow queue's is out of line.
#[inline(always)]
fn chan_push(chan: &mut Chan, me: &shm_layout::Address, h: &MsgHdr, parts: &[&[u8]]) -> bool {
    match chan {
        Chan::Ring(r) => r.try_push(h, parts),
        Chan::Ovf(q) => ovf_push(q, me, h, parts),
    }
}

/// [`chan_push`] to the overflow queue: the parts gathered into one cell.
#[inline(never)]
fn ovf_push(q: &mut crate::ovf::Ovf, me: &shm_layout::Address, h: &MsgHdr, parts: &[&[u8]]) -> bool {
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

/// The send fast path's push of a message of more than one cell; false
/// when it takes the general path instead: a stream's
/// ([`proto::stream_to_pool`]: not an answer, the last large message
/// still in the ring), or no room. Out of line: the one-cell case stays
/// short.
#[inline(never)]
fn push_cells_now(ring: &mut RingTx, heard: &mut bool, cfg: &proto::Config, hdr: &MsgHdr, buf: &[u8]) -> bool {
    let large = proto::stream_to_pool(cfg, buf.len(), true);
    if large && !*heard && ring.large_pending() {
        return false;
    }
    if std::mem::take(heard) {
        // As for one cell (send_inline_now).
        ring.heard_back();
    }
    if !ring.try_push_one(hdr, buf) {
        return false;
    }
    if large {
        ring.note_large();
    }
    true
}

/// Marks a message of `len` bytes just pushed to a ring (inline, or the
/// header of one through the pool) as large, if it is: the next large
/// message that answers nothing goes through the pool while it is still
/// there ([`proto::stream_to_pool`]).
#[inline]
fn note_large(chan: &mut Chan, cfg: &proto::Config, len: usize) {
    if let Chan::Ring(r) = chan {
        if proto::stream_to_pool(cfg, len, true) {
            r.note_large();
        }
    }
}

fn chan_room(chan: &mut Chan, ncells: usize) -> bool {
    match chan {
        Chan::Ring(r) => r.has_room_for(ncells),
        Chan::Ovf(_) => true,
    }
}

/// Most pool chunks one progress pass takes at once for a peer.
const STASH: usize = 32;

/// Pool chunks taken together ([`crate::pool::Pool::alloc_many`]: one CAS
/// on the receiver's free list for a run of fragments, not one each) and
/// not yet filled; what a pass leaves unused goes back at its end
/// ([`Stash::give_back`]), so no sender hoards a shared pool.
struct Stash {
    /// Taken indices; `idx[at..n]` still ours and unused.
    idx: [u32; STASH],
    /// Entries of `idx` taken from the pool.
    n: usize,
    /// Entries of `idx` used (named in a CHUNK message); `at <= n`.
    at: usize,
}

impl Stash {
    fn new() -> Stash {
        Stash { idx: [0; STASH], n: 0, at: 0 }
    }

    /// A run of chunks back to back, at most `max_run` long: from the
    /// stash, else from a new batch of up to `want` (at least one, at most
    /// [`STASH`]) from the pool. Returns the first and how many.
    /// `want` is asked only when a new batch is taken (it divides).
    #[inline]
    fn take(&mut self, pool: &crate::pool::Pool, want: impl FnOnce() -> usize, max_run: usize) -> Option<(u32, usize)> {
        if self.at == self.n {
            self.n = pool.alloc_many(&mut self.idx[..want().clamp(1, STASH)]);
            self.at = 0;
            if self.n == 0 {
                return None;
            }
            if max_run > 1 && !runs_intact(&self.idx[..self.n], max_run) {
                // In index order, so that chunks lying back to back sit
                // side by side whatever order the list gave them in (a
                // receiver returning one chunk per pass reverses them).
                // Only when the runs are broken: a receiver returns each
                // run in index order (`Inbound::release_run`), so after a
                // message in runs the list holds the runs again, the last
                // freed first, and the sort of 16 took 150-340 cycles
                // before a message's first copy (rdtsc marks, 64 KiB
                // ping-pong) where the test takes a few.
                self.idx[..self.n].sort_unstable();
            }
        }
        let first = self.idx[self.at];
        let mut k = 1;
        while k < max_run && self.at + k < self.n && self.idx[self.at + k] == first.wrapping_add(k as u32) {
            k += 1;
        }
        self.at += k;
        Some((first, k))
    }

    /// Un-takes the `k` chunks [`Stash::take`] just gave (its message did
    /// not fit).
    fn untake(&mut self, k: usize) {
        self.at -= k;
    }

    /// Returns the unused chunks to the pool.
    fn give_back(&mut self, pool: &crate::pool::Pool) {
        if self.at < self.n {
            pool.free_many(&self.idx[self.at..self.n]);
        }
        (self.n, self.at) = (0, 0);
    }
}

/// Whether `idx`, cut into pieces of `run` from its start, holds chunks
/// back to back in each piece (runs [`Stash::take`] finds as they are).
#[inline]
fn runs_intact(idx: &[u32], run: usize) -> bool {
    idx.chunks(run).all(|r| r.windows(2).all(|w| w[1] == w[0].wrapping_add(1)))
}

/// Pushes the next fragment of `op` (in a run of pool chunks:
/// [`proto::frag_for`]); false when the ring or pool is full.
fn push_chunk(
    chan: &mut Chan,
    me: &shm_layout::Address,
    pool: &crate::pool::Pool,
    stash: &mut Stash,
    cfg: &proto::Config,
    op: &mut TxOp,
) -> bool {
    let TxState::Chunks { off, msg_id } = op.state else {
        return false;
    };
    if !chan_room(chan, 1) {
        return false;
    }
    let cs = pool.chunk_size();
    let frag = proto::frag_for(cfg, op.len);
    let per = frag.min(cs).max(1);
    // Chunks still needed (one per fragment when fragments are shorter
    // than a chunk), and the longest run this fragment takes: never more
    // chunks than its bytes fill (the receiver frees as many as they do).
    let max_run = if frag <= cs { 1 } else { frag.min(op.len - off).div_ceil(cs).min(wire::Chunk::MAX_RUN as usize) };
    let Some((idx, k)) = stash.take(pool, || (op.len - off).div_ceil(per), max_run) else {
        return false;
    };
    let n = (op.len - off).min(frag).min(k * cs);
    let chunk = pool.chunk(idx).expect("allocated index is in range");
    // SAFETY: we own chunks idx..idx + k (popped from the free list),
    // which lie back to back, until the CHUNK message hands them to the
    // receiver; n <= k * chunk_size.
    op.iovs.gather(off, unsafe { std::slice::from_raw_parts_mut(chunk, n) });
    let mut pl = [0u8; wire::Chunk::WIRE];
    let c = wire::Chunk { msg_id, offset: off as u64, len: n as u32, index: idx };
    let (h, _) = c.encode(&mut pl).expect("buffer sized for a chunk");
    if !chan_push(chan, me, &h, &[&pl]) {
        stash.untake(k);
        return false;
    }
    // The message is still being received until this chunk is taken.
    note_large(chan, cfg, op.len);
    op.state = match (off + n >= op.len, op.deliver) {
        (false, _) => TxState::Chunks { off: off + n, msg_id },
        (true, false) => TxState::Done,
        // Delivery complete: done at the receiver's FIN, which it sends
        // after its copy of a rendezvous's last chunk.
        (true, true) => TxState::AwaitFin { msg_id },
    };
    true
}

/// The eager class of a `len`-byte rendezvous ([`EAGER_CLASSES`], below
/// [`EAGER_MAX`]), if it has one.
#[inline]
fn eager_pick_class(cfg: &proto::Config, len: usize) -> Option<usize> {
    proto::pick_class(cfg, len).filter(|&c| c < EAGER_CLASSES && len < EAGER_MAX)
}

/// Whether a `len`-byte rendezvous is one a stream sends the ordinary way
/// ([`STREAM_MAX`]).
fn stream_class_of(cfg: &proto::Config, len: usize) -> bool {
    len < STREAM_MAX && proto::pick_class(cfg, len).is_some()
}

/// A rendezvous `op` offering single copy in the lowest [`EAGER_CLASSES`]
/// pick classes (below [`EAGER_MAX`]) goes the ordinary way (what
/// [`proto::choose`] gives without single copy: inline up to
/// `inline_max`, else eagerly through the pool) while the receiver's last
/// pick for its class was the pool ([`PeerTx::eager_left`]); else it
/// notes its class, for the receiver's answer to set that.
///
/// Measured (2026-11-26, near, raw 8 B 0.05 us, paired rounds): 64 KiB
/// eagerly through the pool took 4.4-4.8 us against 5.0-6.1 by a
/// rendezvous whose receiver picked the pool.
fn eager_after_pick(ptx: &mut PeerTx, cfg: &proto::Config, op: &mut TxOp, on_ring: bool) {
    let Some(c) = eager_pick_class(cfg, op.len) else {
        return;
    };
    if ptx.eager_left[c] > 0 && !op.deliver {
        // What it would be without single copy: inline up to inline_max,
        // else through the pool; a rendezvous from rndv_min
        // (SHMFAB_RNDV_MIN set below EAGER_MAX), which then keeps its
        // pick and the run.
        let ordinary = proto::choose(cfg, op.kind, op.len, op.iovs.n, on_ring, false);
        if ordinary != Proto::Rndv {
            ptx.eager_left[c] -= 1;
            op.proto = ordinary;
            return;
        }
    }
    op.pick = c as u8 + 1;
}

/// A stream's rendezvous `op` (flagged `hdr_flags::STREAM`) in the
/// [`EAGER_CLASSES`] goes as its class's [`StreamWay`] says: by
/// rendezvous noting its class (for the receiver's answer to set the way),
/// or the ordinary way (what [`proto::choose`] gives without single copy)
/// after the receiver picked the pool, but for one rendezvous every
/// [`EAGER_RUN`] + 1 sends, to ask again.
fn stream_after_pick(ptx: &mut PeerTx, cfg: &proto::Config, op: &mut TxOp, on_ring: bool) {
    let Some(c) = eager_pick_class(cfg, op.len) else {
        return;
    };
    let ordinary = proto::choose(cfg, op.kind, op.len, op.iovs.n, on_ring, false);
    if let StreamWay::Pool { left, asking, .. } = &mut ptx.stream_way[c] {
        if ordinary != Proto::Rndv && !op.deliver && (*left > 0 || *asking) {
            *left = left.saturating_sub(1);
            op.proto = ordinary;
            return;
        }
        *asking = true;
    }
    op.pick = c as u8 + 1;
}

/// The receiver read a stream's rendezvous `op` by single copy (its FIN
/// came without a CTS_BOUNCE): after two in a row (one may be the
/// receiver's exploration of single copy) the stream's next sends of its
/// class go by rendezvous again ([`StreamWay::Rndv`]).
pub(crate) fn stream_read(ptx: &mut PeerTx, pick: u8, hflags: u8) {
    if pick == 0 || hflags & hdr_flags::STREAM == 0 {
        return;
    }
    if let Some(w) = ptx.stream_way.get_mut(pick as usize - 1) {
        if let StreamWay::Pool { reads, asking, .. } = w {
            // Answered: the next send asks again.
            *asking = false;
            *reads += 1;
            if *reads < 2 {
                return;
            }
        }
        *w = StreamWay::Rndv;
    }
}

impl EpState {
    /// Submits a transmit request: the one way in for every operation.
    /// Checks it, then tries the fast path of a small send (one segment,
    /// inline in the peer's ring, nothing queued or in flight to that
    /// peer, so it completes at once without a transmit record), else the
    /// general path.
    #[inline(always)]
    pub fn submit(&mut self, src: &mut CtxSrc<'_>, r: &Request<'_>) -> Result<()> {
        let len = r.len();
        if len > MAX_MSG_SIZE {
            return Err(Error::with(ErrorKind::MsgSize, format!("{len} bytes is over the {MAX_MSG_SIZE}-byte limit")));
        }
        let inject = r.inject();
        if inject && len > INJECT_SIZE {
            return Err(Error::with(
                ErrorKind::MsgSize,
                format!("inject takes at most {INJECT_SIZE} bytes, got {len}"),
            ));
        }
        if !r.kind.supported() {
            return Err(unsupported(r.kind));
        }
        let cqe = !r.silent && (!self.bind.tx_sel || r.flags & crate::flags::FI_COMPLETION != 0);
        let done = SendDone { kind: r.kind, ctx: r.context, tag: r.tag, cqe, silent: r.silent, dw: r.dw, rsv: false };
        if r.iov.is_none_or(|v| v.n == 1) && !r.deliver() {
            // SAFETY: the caller's buffer, valid for reads for the call
            // (and until completion, which is now on this path).
            let buf = unsafe { std::slice::from_raw_parts(r.one.ptr as *const u8, r.one.len) };
            let hdr =
                MsgHdr { op: op::EAGER, flags: r.hdr_flags(), ncells: 0, len: len as u32, tag: r.tag, data: r.data };
            if let Some(res) = self.send_inline_now(src, r.dest, buf, &hdr, done, inject) {
                return res;
            }
        }
        let op = TxOp {
            kind: r.kind,
            ctx: r.context,
            tag: r.tag,
            data: r.data,
            hflags: r.hdr_flags(),
            len,
            iovs: r.iovs(),
            owned: None,
            proto: Proto::Inline,
            state: TxState::Start,
            cqe,
            inject,
            silent: r.silent,
            deliver: r.deliver(),
            err: None,
            dw: r.dw,
            rsv: false,
            pick: 0,
            streamed: false,
        };
        self.post_tx(&mut src.ctx(), r.dest, op)
    }

    /// The fast path of a small send (see [`EpState::submit`]), for a
    /// destination the fi_addr cache knows. `None` when it does not apply
    /// (the caller then takes the general path, which looks the
    /// destination up and reports every error, an unknown one included).
    #[inline(always)]
    fn send_inline_now(
        &mut self,
        src: &mut CtxSrc<'_>,
        dest: crate::flags::FiAddr,
        buf: &[u8],
        hdr: &MsgHdr,
        done: SendDone,
        inject: bool,
    ) -> Option<Result<()>> {
        let cfg = src.cfg();
        if !self.enabled || !self.tx.has_room(cfg.tx_size) {
            return None;
        }
        if done.cqe {
            if !self.bind.can_report_tx() {
                return None;
            }
            if self.bind.tx_rm && !super::complete::tx_has_room(&self.bind, src.cqs()) {
                // Resource management: the entry written below needs room.
                return Some(Err(self.cq_full()));
            }
        }
        // A destination the fi_addr cache does not know (the first send to
        // it, or one since the AV removed an address) takes the general
        // path, which looks it up (or reports it unknown) and fills the
        // cache; so does a peer not connected yet (first contact): its
        // channel is None.
        let p = self.peers.cached(dest)?;
        // SAFETY: p is an index the peer table gave (its fi_addr cache).
        let peer = unsafe { self.peers.get_unchecked_mut(p) };
        if peer.gone.is_some() || !peer.tx.quiet() || !peer.chan_valid() {
            return None;
        }
        let cfg = src.cfg();
        let mut eager = None;
        if !proto::inline_on_ring(cfg, buf.len()) {
            let cma_ok = proto::offer_cma(cfg, peer.cma_refused, inject);
            match proto::choose(cfg, done.kind, buf.len(), 1, true, cma_ok) {
                Proto::Inline => {}
                Proto::Rndv if cma_ok && buf.len() <= cfg.inline_max => {
                    // A message that would go by rendezvous, for the
                    // receiver to pick single copy or the pool, goes
                    // inline here if it picked the pool (an eager run:
                    // `eager_after_pick`), counted once pushed.
                    eager = Some(peer.tx.eager_class(cfg, buf.len())?);
                }
                _ => return None,
            }
        }
        let Some(Chan::Ring(ring)) = peer.chan.as_mut() else { return None };
        if buf.len() <= CELL_PAYLOAD {
            if std::mem::take(&mut peer.heard) {
                // An answer, perhaps: no claim of the lines ahead (see
                // RingTx::publish_at).
                ring.heard_back();
            }
            if !ring.push_one_cell(hdr, buf) {
                return None;
            }
        } else {
            // (A copy of the header: as in RingTx::try_push_one, the
            // caller's then never has its address taken.)
            if !push_cells_now(ring, &mut peer.heard, cfg, &{ *hdr }, buf) {
                return None;
            }
            // (Not for one cell: an eager run's message of one cell, with
            // SHMFAB_CMA_MIN under a cell, leaves the run one longer.)
            if let Some(c) = eager {
                peer.tx.eager_left[c] -= 1;
            }
        }
        if let Some(db) = peer.doorbell() {
            crate::doorbell::ring(db);
        }
        self.stats.tx_inline += 1;
        complete_send_ok(&self.bind, src, done);
        Some(Ok(()))
    }

    /// Queues (or sends at once) a transmit: the general send path, kept
    /// out of the inlined fast path so that the latter's frame stays small
    /// (the transmit record is built for it only).
    #[inline(never)]
    fn post_tx(&mut self, ctx: &mut Ctx<'_>, dest: crate::flags::FiAddr, mut op: TxOp) -> Result<()> {
        if !self.enabled {
            return Err(Error::with(ErrorKind::Inval, "endpoint is not enabled"));
        }
        if !self.bind.can_report_tx() && op.cqe {
            return Err(Error::with(ErrorKind::NoCq, "no transmit CQ or send counter bound"));
        }
        if !self.tx.has_room(ctx.cfg.tx_size) {
            self.progress_tx(ctx);
            if !self.tx.has_room(ctx.cfg.tx_size) {
                self.stats.tx_again += 1;
                return Err(Error::AGAIN);
            }
        }
        let p = self.peers.connected_of(self.addr, ctx.avs, ctx.regions, dest)?;
        if !self.peers[p].chan_valid() {
            let why = self.chan_lost(ctx, p);
            return Err(Error::with(ErrorKind::Io, why));
        }
        let inject = op.inject;
        let peer = &mut self.peers[p];
        if let Some(why) = &peer.gone {
            return Err(Error::with(ErrorKind::Io, why.to_string()));
        }
        if self.bind.tx_rm && op.cqe {
            // Resource management: an entry of the transmit CQ for this
            // transmit, taken now whether it completes at once or later,
            // given back when its entry is written.
            if let Err(e) = super::complete::tx_room(&self.bind, ctx.cqs, true) {
                self.stats.tx_again += 1;
                return Err(e);
            }
            op.rsv = true;
        }
        let on_ring = matches!(peer.chan, Some(Chan::Ring(_)));
        let cma_ok = proto::offer_cma(ctx.cfg, peer.cma_refused, inject);
        op.proto = proto::choose(ctx.cfg, op.kind, op.len, op.iovs.n, on_ring, cma_ok);
        if op.proto == Proto::Rndv && cma_ok {
            if !op.deliver && !peer.tx.quiet() && stream_class_of(ctx.cfg, op.len) {
                // Below 64 KiB, while another send to the peer is under
                // way (a stream, or a window): flagged, for the receiver
                // to pick by the stream's rate, with runs of its own
                // (STREAM_MAX); the ordinary way outside the eager classes.
                if eager_pick_class(ctx.cfg, op.len).is_some() {
                    op.hflags |= hdr_flags::STREAM;
                    stream_after_pick(&mut peer.tx, ctx.cfg, &mut op, on_ring);
                } else {
                    op.proto = proto::choose(ctx.cfg, op.kind, op.len, op.iovs.n, on_ring, false);
                }
            } else {
                // After the receiver picked the pool: the ordinary way,
                // which the rules below then refine (an answer inline, a
                // stream through the pool).
                eager_after_pick(&mut peer.tx, ctx.cfg, &mut op, on_ring);
            }
        }
        // An answer to the peer (it sent us something since our last send
        // to it): the ring is told, as the fast path tells it; and a
        // message that would take the pool goes inline up to answer_max.
        let answering = std::mem::take(&mut peer.heard);
        if answering {
            if let Some(Chan::Ring(r)) = peer.chan.as_mut() {
                r.heard_back();
            }
            if !op.deliver
                && peer.tx.txq.is_empty()
                && proto::answer_inline(ctx.cfg, op.proto, op.len, on_ring, answering)
            {
                op.proto = Proto::Inline;
            }
        }
        // A large inline message that answers nothing, while the last
        // large one we sent is still in the peer's ring: a stream, which
        // the pool carries further.
        if op.proto == Proto::Inline && !answering && !op.deliver && proto::stream_to_pool(ctx.cfg, op.len, on_ring) {
            if let Some(Chan::Ring(r)) = peer.chan.as_mut() {
                if r.large_pending() {
                    op.proto = Proto::Bounce;
                    op.streamed = true;
                }
            }
        }
        // An inline message the peer's ring can never hold (its ring
        // smaller than ours: SHMFAB_RING_CELLS differs between the two
        // processes) goes through the pool: pushed, it would wait for room
        // for ever, and every send queued behind it too. (Cells counted as
        // piped, the larger count.)
        if op.proto == Proto::Inline {
            if let Some(Chan::Ring(r)) = peer.chan.as_ref() {
                if !r.can_hold(crate::ring::piped_cells(op.len)) {
                    op.proto = Proto::Bounce;
                }
            }
        }
        if op.deliver {
            // Delivery complete: by rendezvous, whose FIN the receiver
            // sends once the data is in place. An RTS in an overflow cell
            // names at most 3 segments: more are gathered into one copy
            // (which the receiver then takes through the pool).
            op.proto = Proto::Rndv;
            if !on_ring && op.iovs.n > 3 && op.owned.is_none() {
                let mut v = vec![0u8; op.len];
                op.iovs.gather(0, &mut v);
                op.iovs = Iovs::one(v.as_ptr() as usize, v.len());
                op.owned = Some(v);
            }
        }
        if peer.tx.txq.is_empty()
            && op.proto == Proto::Inline
            && push_inline(peer.chan.as_mut().expect("connected"), &self.addr, &op)
        {
            note_large(peer.chan.as_mut().expect("connected"), ctx.cfg, op.len);
            if let Some(db) = peer.doorbell() {
                crate::doorbell::ring(db);
            }
            self.stats.tx_inline += 1;
            if peer.tx.inflight.is_empty() {
                complete_send(&self.bind, ctx, op.done(), None);
            } else {
                // Completes after the earlier sends still in flight.
                op.state = TxState::Done;
                if inject && op.owned.is_none() {
                    op.iovs = Iovs::default();
                }
                peer.tx.inflight.push_back(op);
                self.tx.outstanding += 1;
            }
            return Ok(());
        }
        // An inline message the ring has no room for now (a stream filled
        // it) goes through the pool rather than wait for the ring.
        if op.proto == Proto::Inline && peer.tx.txq.is_empty() && proto::stream_to_pool(ctx.cfg, op.len, on_ring) {
            op.proto = Proto::Bounce;
            op.streamed = true;
        }
        if inject && op.owned.is_none() {
            let mut v = vec![0u8; op.len];
            op.iovs.gather(0, &mut v);
            op.iovs = Iovs::one(v.as_ptr() as usize, v.len());
            op.owned = Some(v);
        }
        peer.tx.txq.push_back(op);
        self.tx.outstanding += 1;
        self.tx.mark_busy(&mut peer.tx, p);
        self.progress_peer_tx(ctx, p);
        Ok(())
    }

    /// Queues a control message to peer `p`.
    pub fn queue_ctrl(&mut self, p: usize, c: Ctrl) {
        self.stats.fins += u64::from(c.hdr.op == op::FIN);
        self.tx.queue_ctrl(&mut self.peers[p], p, c);
    }

    /// Moves every busy peer's queues forward.
    pub fn progress_tx(&mut self, ctx: &mut Ctx<'_>) {
        let mut i = 0;
        while i < self.tx.busy.len() {
            let p = self.tx.busy[i];
            self.progress_peer_tx(ctx, p);
            let ptx = &mut self.peers[p].tx;
            if ptx.idle() {
                ptx.busy = false;
                self.tx.busy.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Connects peer `p` if it is not yet.
    pub fn ensure_connected(&mut self, ctx: &mut Ctx<'_>, p: usize) -> Result<()> {
        if !self.peers[p].connected() {
            self.peers.connect(self.addr, ctx.regions, p)?;
        }
        Ok(())
    }

    /// Moves one peer's control messages, in-flight data and queued sends
    /// forward as far as ring room and pool chunks allow.
    pub fn progress_peer_tx(&mut self, ctx: &mut Ctx<'_>, p: usize) {
        if self.peers[p].gone.is_some() || self.ensure_connected(ctx, p).is_err() {
            return;
        }
        if !self.peers[p].chan_valid() {
            self.chan_lost(ctx, p);
            return;
        }
        let me = self.addr;
        let mut pushed = false;
        {
            let stats = &mut self.stats;
            let peer = &mut self.peers[p];
            let chan = peer.chan.as_mut().expect("connected");
            let pool = peer.pool.as_ref().expect("connected");
            let cma_refused = peer.cma_refused;
            let cfg = ctx.cfg;
            let mut stash = Stash::new();
            let tx = &mut peer.tx;
            // 1. Control messages first: they unblock the peer.
            while let Some(c) = tx.ctrlq.front() {
                if !chan_push(chan, &me, &c.hdr, &[&c.payload]) {
                    break;
                }
                tx.ctrlq.pop_front();
                pushed = true;
            }
            // 2. Data of messages already started, oldest first.
            let mut blocked = !tx.ctrlq.is_empty();
            for op in tx.inflight.iter_mut() {
                if blocked {
                    break;
                }
                while matches!(op.state, TxState::Chunks { .. }) {
                    if !push_chunk(chan, &me, pool, &mut stash, cfg, op) {
                        blocked = true;
                        break;
                    }
                    stats.tx_chunks += 1;
                    pushed = true;
                }
            }
            // 3. Start queued sends: headers go out in order, even while
            //    older data still waits for pool chunks.
            while tx.ctrlq.is_empty() {
                let Some(op) = tx.txq.front_mut() else {
                    break;
                };
                let ok = match op.proto {
                    Proto::Inline => {
                        let ok = push_inline(chan, &me, op);
                        if ok {
                            op.state = TxState::Done;
                            note_large(chan, cfg, op.len);
                        } else if proto::stream_to_pool(cfg, op.len, matches!(chan, Chan::Ring(_))) {
                            // As in post_tx: the ring is full, the pool
                            // takes it (its header in the ring's order).
                            op.proto = Proto::Bounce;
                            op.streamed = true;
                            continue;
                        }
                        ok
                    }
                    Proto::Bounce => {
                        let msg_id = tx.next_msg_id;
                        let mut pl = [0u8; wire::BounceHdr::WIRE];
                        let bh = wire::BounceHdr { msg_id, total: op.len as u64 };
                        bh.encode(&mut pl).expect("buffer sized for a bounce header");
                        let ok = chan_push(chan, &me, &op.hdr(op::BOUNCE_HDR, 0), &[&pl]);
                        if ok {
                            tx.next_msg_id += 1;
                            note_large(chan, cfg, op.len);
                            op.state = TxState::Chunks { off: 0, msg_id };
                            while !blocked && matches!(op.state, TxState::Chunks { .. }) {
                                if push_chunk(chan, &me, pool, &mut stash, cfg, op) {
                                    stats.tx_chunks += 1;
                                } else {
                                    blocked = true;
                                }
                            }
                        }
                        ok
                    }
                    Proto::Rndv => {
                        let msg_id = tx.next_msg_id;
                        let mut pl = [0u8; wire::Rts::MAX_WIRE];
                        let cma = proto::offer_cma(ctx.cfg, cma_refused, op.owned.is_some());
                        let segs =
                            op.iovs.segs().iter().map(|s| wire::IovRange { addr: s.ptr as u64, len: s.len as u64 });
                        // FIN: a delivery-complete send waits for the
                        // receiver's FIN whichever way the data goes.
                        let fl = if cma { rts_flags::CMA } else { 0 } | if op.deliver { rts_flags::FIN } else { 0 };
                        let rts = wire::Rts::new(msg_id, op.len as u64, fl, segs)
                            .expect("sends have at most MAX_IOV segments");
                        let n = rts.encode(&mut pl).expect("buffer sized for any RTS");
                        let ok = chan_push(chan, &me, &op.hdr(op::RTS, 0), &[&pl[..n]]);
                        if ok {
                            tx.next_msg_id += 1;
                            op.state = TxState::AwaitFin { msg_id };
                        }
                        ok
                    }
                };
                if !ok {
                    break;
                }
                pushed = true;
                let op = tx.txq.pop_front().expect("front");
                match op.proto {
                    Proto::Inline => stats.tx_inline += 1,
                    Proto::Bounce => {
                        stats.tx_bounce += 1;
                        stats.tx_streamed += u64::from(op.streamed);
                    }
                    Proto::Rndv => stats.tx_rndv += 1,
                }
                tx.inflight.push_back(op);
            }
            stash.give_back(pool);
            if pushed {
                if let Some(db) = peer.doorbell() {
                    crate::doorbell::ring(db);
                }
            }
        }
        self.retire(ctx, p);
    }

    /// Completes finished sends from the front of a peer's in-flight queue.
    pub fn retire(&mut self, ctx: &mut Ctx<'_>, p: usize) {
        while self.peers[p].tx.inflight.front().is_some_and(|op| op.state == TxState::Done) {
            let mut op = self.peers[p].tx.inflight.pop_front().expect("front checked");
            self.tx.outstanding -= 1;
            let err = op.err.take();
            complete_send(&self.bind, ctx, op.done(), err);
        }
    }

    /// A transmit refused for its CQ's room (resource management).
    #[cold]
    #[inline(never)]
    fn cq_full(&mut self) -> Error {
        self.stats.tx_again += 1;
        Error::AGAIN
    }

    /// The endpoint closes: gives back the transmit CQ entries its
    /// outstanding transmits reserved (they are dropped with no
    /// completion, as fi_close does).
    pub fn drop_tx_reservations(&mut self, ctx: &mut Ctx<'_>) {
        let n: usize =
            self.peers.iter().map(|p| p.tx.txq.iter().chain(&p.tx.inflight).filter(|op| op.rsv).count()).sum();
        if n > 0 {
            if let Some(cq) = self.bind.tx_cq.and_then(|c| ctx.cqs.get_mut(c)) {
                cq.release(n);
            }
            for p in 0..self.peers.len() {
                let ptx = &mut self.peers[p].tx;
                for op in ptx.txq.iter_mut().chain(ptx.inflight.iter_mut()) {
                    op.rsv = false;
                }
            }
        }
    }

    /// Sender side of a split copy: the ranges of our in-flight send
    /// `msg_id` from `off` for `len` bytes, if it is that long.
    pub fn send_ranges(&mut self, p: usize, msg_id: u64, off: usize, len: usize) -> Option<Vec<(*mut u8, usize)>> {
        let op = self.peers[p].tx.awaiting(msg_id)?;
        if off.checked_add(len).is_none_or(|e| e > op.len) {
            return None;
        }
        let all: Vec<(u64, u64)> = op.iovs.segs().iter().map(|s| (s.ptr as u64, s.len as u64)).collect();
        Some(
            crate::cma::sub_ranges(&all, off, len)
                .into_iter()
                .map(|(a, l)| (a as usize as *mut u8, l as usize))
                .collect(),
        )
    }
}

/// Our receive buffer's bytes `[off, off + len)` as (pointer, length) ranges.
pub(crate) fn local_ranges(d: &Dest, off: usize, len: usize) -> Vec<(*mut u8, usize)> {
    let all: Vec<(u64, u64)> = d.iovs.segs().iter().map(|s| (s.ptr as u64, s.len as u64)).collect();
    let len = len.min(d.cap.saturating_sub(off));
    crate::cma::sub_ranges(&all, off, len).into_iter().map(|(a, l)| (a as usize as *mut u8, l as usize)).collect()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::engine::peers::Peers;

    fn op(state: TxState) -> TxOp {
        TxOp {
            kind: OpKind::Msg,
            ctx: 0,
            tag: 0,
            data: 0,
            hflags: 0,
            len: 0,
            iovs: Iovs::default(),
            owned: None,
            proto: Proto::Rndv,
            state,
            cqe: true,
            inject: false,
            silent: false,
            deliver: false,
            err: None,
            dw: Dw::NONE,
            rsv: false,
            pick: 0,
            streamed: false,
        }
    }

    #[test]
    fn runs_intact_needs_each_piece_back_to_back() {
        // The list after a 64 KiB message in runs of 4: the last run freed first.
        assert!(runs_intact(&[12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3], 4));
        assert!(runs_intact(&[0, 1, 2, 3, 4, 5], 4), "a short last piece");
        assert!(!runs_intact(&[3, 2, 1, 0], 4), "single chunks returned one per pass");
        assert!(!runs_intact(&[0, 1, 2, 3, 4, 6, 7, 8], 4), "a gap inside the second run");
        assert!(runs_intact(&[4, 5, 6, 1, 2, 3], 3), "runs in any order");
        assert!(runs_intact(&[9], 4) && runs_intact(&[], 4));
    }

    /// A stream's way in one class follows the receiver's answers: by
    /// rendezvous at first; after a pick of the pool the ordinary way, but
    /// for one rendezvous to ask again every EAGER_RUN + 1 sends, and the
    /// ordinary way until it is answered however many are posted (a
    /// window goes out faster than answers come back: asking at each
    /// send, the first version had half of a 64-message window go by
    /// rendezvous, and answering every one through the pool); back to
    /// rendezvous after two reads by single copy in a row, not after one
    /// (the receiver's exploration), nor after a CTS_BOUNCE_EXPLORE.
    #[test]
    fn a_streams_way_follows_the_receivers_answers() {
        let mut peers = Peers::new(0, 0);
        let p = peers.index_of(shm_layout::Address { token: 6, ..Default::default() });
        let mut tx = TxEngine::new();
        let cfg = proto::Config::default();
        let stream_op = |len: usize| TxOp { len, hflags: hdr_flags::STREAM, ..op(TxState::Start) };
        // A 16 KiB stream send that noted its class.
        let asked = || TxOp { pick: 2, ..stream_op(16 << 10) };
        // At first by rendezvous, each noting its class.
        let mut o = stream_op(16 << 10);
        stream_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
        assert_eq!((o.proto, o.pick), (Proto::Rndv, 2));
        // The receiver explores the pool for it: nothing changes.
        let mut id = 100;
        let mut answer = |peers: &mut Peers, o: TxOp, how: Option<bool>| {
            id += 1;
            peers[p].tx.inflight.push_back(TxOp { state: TxState::AwaitFin { msg_id: id }, ..o });
            tx.outstanding += 1;
            match how {
                // CTS_BOUNCE_THIS_ONE (true) or CTS_BOUNCE_EXPLORE (false).
                Some(run) => assert!(tx.bounce_requested(&mut peers[p], p, id, true, if run { EAGER_RUN } else { 0 })),
                // A FIN after a read.
                None => stream_read(&mut peers[p].tx, o.pick, o.hflags),
            }
        };
        answer(&mut peers, asked(), Some(false));
        assert_eq!(peers[p].tx.stream_way[1], StreamWay::Rndv, "an exploration of the pool");
        // It picks the pool: EAGER_RUN the ordinary way, then one asks.
        answer(&mut peers, o, Some(true));
        assert_eq!(peers[p].tx.eager_left, [0; EAGER_CLASSES], "the other sends' runs are their own");
        let mut protos = Vec::new();
        for _ in 0..EAGER_RUN + 4 {
            let mut o = stream_op(16 << 10);
            stream_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
            protos.push((o.proto, o.pick));
        }
        let run = EAGER_RUN as usize;
        assert!(protos[..run].iter().all(|&x| x == (Proto::Inline, 0)), "{protos:?}");
        assert_eq!(protos[run], (Proto::Rndv, 2), "then one asks");
        assert!(protos[run + 1..].iter().all(|&x| x == (Proto::Inline, 0)), "the pool while asking: {protos:?}");
        // Other classes keep their own way.
        let mut o = stream_op(40 << 10);
        stream_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
        assert_eq!((o.proto, o.pick), (Proto::Rndv, 3));
        // One read by single copy (perhaps an exploration): the pool stays,
        // and the next send asks again; a second read in a row ends it.
        answer(&mut peers, asked(), None);
        assert!(matches!(peers[p].tx.stream_way[1], StreamWay::Pool { left: 0, asking: false, reads: 1 }));
        let mut o = stream_op(16 << 10);
        stream_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
        assert_eq!((o.proto, o.pick), (Proto::Rndv, 2), "asks again");
        answer(&mut peers, o, None);
        assert_eq!(peers[p].tx.stream_way[1], StreamWay::Rndv, "two reads in a row: single copy");
        // A pick of the pool between two reads starts the count again.
        answer(&mut peers, asked(), Some(true));
        answer(&mut peers, asked(), None);
        answer(&mut peers, asked(), Some(true));
        answer(&mut peers, asked(), None);
        assert!(matches!(peers[p].tx.stream_way[1], StreamWay::Pool { reads: 1, .. }));
        // Unflagged sends' answers leave the stream's way alone.
        answer(&mut peers, TxOp { hflags: 0, ..asked() }, None);
        assert!(matches!(peers[p].tx.stream_way[1], StreamWay::Pool { reads: 1, .. }));
        // Delivery complete keeps the rendezvous whatever the way.
        let mut o = TxOp { deliver: true, ..stream_op(16 << 10) };
        peers[p].tx.stream_way[1] = StreamWay::Pool { left: 3, asking: false, reads: 0 };
        stream_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
        assert_eq!(o.proto, Proto::Rndv);
    }

    /// The stream and eager rules are bounded in bytes, whatever
    /// SHMFAB_CMA_MIN is (found by review: counted in octaves from it,
    /// with 64 KiB a 96 KiB send in a stream went through the pool, and an
    /// eager run in 128-256 KiB was spent on rendezvous that noted no
    /// class); and a run whose ordinary way is a rendezvous (SHMFAB_RNDV_MIN
    /// below the class) keeps its pick and its run.
    #[test]
    fn stream_and_eager_rules_are_bounded_in_bytes() {
        let mut cfg = proto::Config { cma_min: 64 << 10, ..proto::Config::default() };
        cfg.clamp();
        assert!(!stream_class_of(&cfg, 96 << 10), "96 KiB: single copy may win a stream");
        assert!(!stream_class_of(&cfg, 32 << 10), "below cma_min: no rendezvous to replace");
        let d = proto::Config::default();
        assert!(stream_class_of(&d, 8 << 10) && stream_class_of(&d, (64 << 10) - 1) && !stream_class_of(&d, 64 << 10));
        let mut ptx = PeerTx::new();
        ptx.eager_left = [EAGER_RUN; EAGER_CLASSES];
        let mut o = TxOp { len: 96 << 10, ..op(TxState::Start) };
        eager_after_pick(&mut ptx, &cfg, &mut o, true);
        assert_eq!((o.proto, o.pick, ptx.eager_left[0]), (Proto::Rndv, 0, EAGER_RUN), "96 KiB: past EAGER_MAX");
        let mut o = TxOp { len: 40 << 10, ..op(TxState::Start) };
        eager_after_pick(&mut ptx, &d, &mut o, true);
        assert_eq!((o.proto, ptx.eager_left[2]), (Proto::Bounce, EAGER_RUN - 1), "40 KiB: eagerly");
        let mut low = proto::Config { rndv_min: 40 << 10, ..proto::Config::default() };
        low.clamp();
        let mut o = TxOp { len: 48 << 10, ..op(TxState::Start) };
        ptx.eager_left[2] = EAGER_RUN;
        eager_after_pick(&mut ptx, &low, &mut o, true);
        assert_eq!(
            (o.proto, o.pick, ptx.eager_left[2]),
            (Proto::Rndv, 3, EAGER_RUN),
            "rendezvous without single copy too"
        );
    }

    #[test]
    fn busy_list_and_outstanding_count_follow_the_queues() {
        let mut peers = Peers::new(0, 0);
        let p = peers.index_of(shm_layout::Address { token: 5, ..Default::default() });
        let mut tx = TxEngine::new();
        assert!(!tx.any_busy() && peers[p].tx.quiet());
        tx.queue_ctrl(&mut peers[p], p, Ctrl::new(wire::CtrlKind::Fin, 1, 0));
        tx.queue_ctrl(&mut peers[p], p, Ctrl::new(wire::CtrlKind::Fin, 2, 0));
        assert!(tx.any_busy());
        assert_eq!(tx.busy, vec![p], "a peer is listed once however much it has queued");
        assert!(peers[p].tx.busy);
        // A rendezvous awaiting its answer.
        peers[p].tx.inflight.push_back(op(TxState::AwaitFin { msg_id: 9 }));
        peers[p].tx.txq.push_back(op(TxState::Start));
        tx.outstanding += 2;
        assert!(peers[p].tx.pending() && peers[p].tx.awaiting_answer() && !peers[p].tx.quiet());
        assert!(peers[p].tx.awaiting(8).is_none());
        assert!(
            tx.bounce_requested(&mut peers[p], p, 9, false, EAGER_RUN),
            "offered single copy: the receiver could not use it"
        );
        assert!(matches!(peers[p].tx.inflight[0].state, TxState::Chunks { off: 0, msg_id: 9 }));
        assert_eq!(peers[p].tx.eager_left, [0; EAGER_CLASSES], "not a pick: nothing goes eagerly");
        // The receiver picked the pool for a rendezvous of class 0: the
        // next EAGER_RUN of that class go eagerly, then one asks again.
        peers[p].tx.inflight.push_back(TxOp { pick: 1, ..op(TxState::AwaitFin { msg_id: 10 }) });
        tx.outstanding += 1;
        // Not when the receiver took the pool only to measure it again
        // (CTS_BOUNCE_EXPLORE): single copy stays its pick.
        peers[p].tx.inflight.push_back(TxOp { pick: 1, ..op(TxState::AwaitFin { msg_id: 11 }) });
        tx.outstanding += 1;
        assert!(tx.bounce_requested(&mut peers[p], p, 11, true, 0));
        assert_eq!(peers[p].tx.eager_left, [0; EAGER_CLASSES], "an exploration starts no run");
        // A sure pick of the pool: a long run.
        peers[p].tx.inflight.push_back(TxOp { pick: 1, ..op(TxState::AwaitFin { msg_id: 12 }) });
        tx.outstanding += 1;
        assert!(tx.bounce_requested(&mut peers[p], p, 12, true, EAGER_RUN_SURE));
        assert_eq!(peers[p].tx.eager_left, [EAGER_RUN_SURE, 0, 0]);
        assert!(tx.bounce_requested(&mut peers[p], p, 10, true, EAGER_RUN));
        assert_eq!(peers[p].tx.eager_left, [EAGER_RUN, 0, 0]);
        let cfg = proto::Config::default();
        let mut protos = Vec::new();
        for _ in 0..=EAGER_RUN {
            let mut o = TxOp { len: cfg.cma_min, ..op(TxState::Start) };
            eager_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
            protos.push((o.proto, o.pick));
        }
        // Class 0 (8-16 KiB) eagerly is inline, as without single copy.
        assert!(protos[..EAGER_RUN as usize].iter().all(|&x| x == (Proto::Inline, 0)), "{protos:?}");
        assert_eq!(protos[EAGER_RUN as usize], (Proto::Rndv, 1), "then a rendezvous noting its class");
        // Class 2 (32-64 KiB) eagerly is through the pool; on the
        // overflow queue class 0 is too.
        peers[p].tx.eager_left[2] = 1;
        let mut o = TxOp { len: 5 * cfg.cma_min, ..op(TxState::Start) };
        eager_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
        assert_eq!((o.proto, o.pick), (Proto::Bounce, 0));
        peers[p].tx.eager_left[0] = 1;
        let mut o = TxOp { len: cfg.cma_min, ..op(TxState::Start) };
        eager_after_pick(&mut peers[p].tx, &cfg, &mut o, false);
        assert_eq!((o.proto, o.pick), (Proto::Bounce, 0));
        // Class 3 (64-128 KiB) never goes eagerly (nor notes a class); a
        // delivery-complete send never does.
        peers[p].tx.eager_left[0] = 1;
        let mut o = TxOp { len: 8 * cfg.cma_min, ..op(TxState::Start) };
        eager_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
        assert_eq!((o.proto, o.pick), (Proto::Rndv, 0));
        let mut o = TxOp { len: cfg.cma_min, deliver: true, ..op(TxState::Start) };
        eager_after_pick(&mut peers[p].tx, &cfg, &mut o, true);
        assert_eq!(o.proto, Proto::Rndv);
        // A failed peer gives back every record, in send order.
        let ops = tx.take_all(&mut peers[p].tx);
        assert_eq!(ops.len(), 5);
        assert!(matches!(ops[0].state, TxState::Chunks { msg_id: 9, .. }));
        assert!(matches!(ops[1].state, TxState::Chunks { msg_id: 10, .. }));
        assert!(matches!(ops[2].state, TxState::Chunks { msg_id: 11, .. }));
        assert!(matches!(ops[3].state, TxState::Chunks { msg_id: 12, .. }) && ops[4].state == TxState::Start);
        assert_eq!(tx.outstanding(), 0);
        assert!(peers[p].tx.quiet() && peers[p].tx.idle());
    }
}
