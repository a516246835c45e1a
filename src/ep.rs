//! Reliable-datagram endpoints: binding, addressing, and posting sends and
//! receives (untagged and tagged, with iovs, remote CQ data, inject,
//! directed receive and multi-receive buffers).
//!
//! Operations that take a caller's buffer and complete later are `unsafe`:
//! the buffer must stay valid (and, for sends, unchanged) until its
//! completion is reported, as in libfabric. `inject` copies and is safe.

use crate::av::AvState;
use crate::domain::{Claim, Ctx, Domain, DomainInner, Section};
use crate::error::{Error, ErrorKind, Result};
use crate::flags::*;
use crate::ovf::Ovf;
use crate::pool::Pool;
use crate::proto::{self, Proto, INJECT_SIZE, MAX_MSG_SIZE};
use crate::region::Region;
use crate::ring::{RingRx, RingTx};
use crate::sync::Ordering;
use shm_layout::{ep_state, Address, Doorbell, MAX_IOV};
use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

/// One buffer segment (address and length), kept as integers: the memory is
/// the caller's, valid until completion by the operation's contract.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Iov {
    pub ptr: usize,
    pub len: usize,
}

impl Iov {
    /// The segment of a send buffer.
    #[inline(always)]
    fn of(buf: &[u8]) -> Iov {
        Iov { ptr: buf.as_ptr() as usize, len: buf.len() }
    }
}

/// Up to [`MAX_IOV`] segments inline; more (buffers of a shared receive
/// queue, up to [`crate::srq::SRQ_MAX_IOV`]) live in a list the SRQ keeps
/// for the receive's lifetime: then `n > MAX_IOV`, `v[0].ptr` is the list's
/// address and `v[0].len` its slot in the SRQ (so the common case stays
/// small: this struct is copied along the receive path).
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Iovs {
    pub v: [Iov; MAX_IOV],
    pub n: usize,
}

impl Iovs {
    pub fn one(ptr: usize, len: usize) -> Iovs {
        let mut v = [Iov::default(); MAX_IOV];
        v[0] = Iov { ptr, len };
        Iovs { v, n: 1 }
    }

    /// Segments held in an SRQ's list `list` (`n > MAX_IOV` of them) at
    /// `slot`; the list must outlive every copy of the result.
    pub fn external(list: *const Iov, n: usize, slot: usize) -> Iovs {
        debug_assert!(n > MAX_IOV);
        let mut v = [Iov::default(); MAX_IOV];
        v[0] = Iov { ptr: list as usize, len: slot };
        Iovs { v, n }
    }

    /// The SRQ slot of an external list.
    pub fn ext_slot(&self) -> Option<usize> {
        (self.n > MAX_IOV).then_some(self.v[0].len)
    }

    pub fn total(&self) -> usize {
        self.segs().iter().map(|i| i.len).sum()
    }

    #[inline]
    pub fn segs(&self) -> &[Iov] {
        if self.n <= MAX_IOV {
            &self.v[..self.n]
        } else {
            // SAFETY: per `external`: v[0].ptr is a live list of n segments,
            // kept by the SRQ until the receive holding it completes.
            unsafe { std::slice::from_raw_parts(self.v[0].ptr as *const Iov, self.n) }
        }
    }

    /// Copies `len` bytes into the segments starting at byte `off`, taking
    /// them from `read(src_off, dst)`; clipped to the segments' total.
    /// Returns bytes copied.
    pub fn scatter(&self, off: usize, len: usize, mut read: impl FnMut(usize, &mut [u8])) -> usize {
        let mut skip = off;
        let mut left = len;
        let mut done = 0;
        for s in self.segs() {
            if left == 0 {
                break;
            }
            if skip >= s.len {
                skip -= s.len;
                continue;
            }
            let n = (s.len - skip).min(left);
            // SAFETY: the segment is the caller's receive buffer, valid and
            // writable until completion; skip + n <= s.len.
            let dst = unsafe { std::slice::from_raw_parts_mut((s.ptr + skip) as *mut u8, n) };
            read(done, dst);
            done += n;
            left -= n;
            skip = 0;
        }
        done
    }

    /// Copies bytes `[off, off + dst.len())` of the segments into `dst`.
    pub fn gather(&self, off: usize, dst: &mut [u8]) {
        let mut skip = off;
        let mut at = 0;
        for s in self.segs() {
            if at == dst.len() {
                break;
            }
            if skip >= s.len {
                skip -= s.len;
                continue;
            }
            let n = (s.len - skip).min(dst.len() - at);
            // SAFETY: the segment is the caller's send buffer, valid until
            // completion; skip + n <= s.len.
            let src = unsafe { std::slice::from_raw_parts((s.ptr + skip) as *const u8, n) };
            dst[at..at + n].copy_from_slice(src);
            at += n;
            skip = 0;
        }
    }

    /// The segments as slices.
    ///
    /// # Safety
    /// The segments must be valid for reads (the operation's contract).
    pub unsafe fn slices(&self) -> [&[u8]; MAX_IOV] {
        let mut out: [&[u8]; MAX_IOV] = [&[]; MAX_IOV];
        for (o, s) in out.iter_mut().zip(self.segs()) {
            // SAFETY: per this function's contract.
            *o = unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) };
        }
        out
    }
}

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

/// An error to report: kind, provider errno, text.
pub(crate) type Fail = (ErrorKind, i32, String);

/// A queued transmit.
pub(crate) struct TxOp {
    pub ctx: usize,
    pub tagged: bool,
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
    /// Inject: no entry even on error (counters only).
    pub inject: bool,
    /// Set when the receiver reported a failure.
    pub err: Option<Fail>,
}

/// A posted receive.
pub(crate) struct PostedRecv {
    pub ctx: usize,
    pub iovs: Iovs,
    /// Directed receive: only from this peer (its index in `peers`, which
    /// never changes: peers are only appended).
    pub src: Option<usize>,
    pub tag: u64,
    pub ignore: u64,
    pub multi: bool,
    /// Bytes of a multi-receive buffer already used.
    pub moff: usize,
    pub cqe: bool,
}

/// What a matched receive delivers into.
#[derive(Clone, Copy)]
pub(crate) struct Dest {
    pub ctx: usize,
    pub iovs: Iovs,
    pub cap: usize,
    pub buf: usize,
    pub multi_release: bool,
    pub cqe: bool,
}

/// A message that arrived before its receive.
pub(crate) enum UnexpBody {
    /// Whole payload (inline, or a bounce message copied out of the pool;
    /// `received < len` while its chunks are still arriving).
    Data { v: Vec<u8>, received: usize, msg_id: u64 },
    /// A rendezvous: the data stays with the sender until matched.
    Rts { msg_id: u64, iovs: Vec<(u64, u64)>, cma: bool },
}

pub(crate) struct Unexp {
    pub id: u64,
    pub peer: usize,
    pub tag: u64,
    pub data: u64,
    pub hflags: u8,
    pub len: usize,
    pub body: UnexpBody,
}

/// A matched receive whose data is still arriving in chunks.
pub(crate) struct ActiveRecv {
    pub dest: Dest,
    pub total: usize,
    pub received: usize,
    pub tag: u64,
    pub data: u64,
    pub hflags: u8,
}

/// A multi-part message arriving from a peer, by message id.
pub(crate) enum RxCur {
    Active(ActiveRecv),
    Unexp {
        id: u64,
        total: usize,
    },
    /// Split single copy: we read `[0, split)`, the sender writes
    /// `[split, want)`; completes on the sender's WDONE.
    Split(SplitRecv),
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

/// How we send to a peer.
pub(crate) enum Chan {
    Ring(RingTx),
    Ovf(Ovf),
}

/// A control message waiting to go to a peer.
#[derive(Clone, Debug)]
pub(crate) struct Ctrl {
    pub op: u8,
    pub msg_id: u64,
    pub status: u32,
    /// Header `data` field.
    pub data: u64,
    /// Payload (CTS_WRITE's ranges), empty for most.
    pub payload: Vec<u8>,
}

impl Ctrl {
    /// A control message without payload.
    pub fn new(op: u8, msg_id: u64, status: u32) -> Ctrl {
        Ctrl { op, msg_id, status, data: 0, payload: Vec::new() }
    }
}

/// Everything an endpoint knows about one peer endpoint, both directions.
pub(crate) struct Peer {
    pub addr: Address,
    /// The peer's region, mapped on first send to it.
    pub region: Option<Arc<Region>>,
    pub pid: i32,
    pub chan: Option<Chan>,
    /// The peer's pool (we fill its chunks).
    pub pool: Option<Pool>,
    pub doorbell: *const Doorbell,
    /// Sends not started yet, in order.
    pub txq: VecDeque<TxOp>,
    /// Sends started (header out), in order; completed from the front.
    pub inflight: VecDeque<TxOp>,
    pub ctrlq: VecDeque<Ctrl>,
    pub next_msg_id: u64,
    /// Multi-part messages arriving from this peer.
    pub rx_parts: Vec<(u64, RxCur)>,
    /// Matched receives from this peer in match order; a completion waits
    /// here until those before it are written (message id, or 0 for one
    /// that completed on arrival).
    pub rx_order: VecDeque<(u64, Option<PendingRx>)>,
    /// The kernel refused CMA with this peer: do not offer it again.
    pub cma_refused: bool,
    /// A single copy from this peer has worked: the split copy may be used.
    pub cma_worked: bool,
    /// In `EpState::busy`.
    pub busy: bool,
    /// (AV generation, fi_addr) of this peer as a source.
    pub src_cache: (u64, FiAddr),
    /// Sent us something we could not parse: its ring is no longer read.
    pub broken: bool,
    /// Why the peer is gone (its process died or its endpoint closed):
    /// everything pending with it has failed, new sends fail at once.
    pub gone: Option<String>,
    /// What says our channel to it is still ours (see [`Peer::chan_valid`]).
    pub claim: ChanClaim,
}

/// Where a sender checks, before each push, that the channel it writes is
/// still its own: the ring slot's owner word (a line written only when a
/// slot is claimed or released, so the check is an L1 hit), or for the
/// overflow queue the section's generation and state. A closed endpoint's
/// section is zeroed and may be reopened for someone else: a sender that
/// kept writing would corrupt the new endpoint's rings.
pub(crate) struct ChanClaim {
    owner: *const crate::sync::AtomicU64,
    token: u64,
    hdr: *const shm_layout::EpHeader,
    generation: u32,
}

impl ChanClaim {
    const NONE: ChanClaim = ChanClaim { owner: std::ptr::null(), token: 0, hdr: std::ptr::null(), generation: 0 };
}

// SAFETY: doorbell and the claim pointers point into `region`, which the
// Peer keeps alive.
unsafe impl Send for Peer {}

impl Peer {
    fn new(addr: Address) -> Peer {
        Peer {
            addr,
            region: None,
            pid: 0,
            chan: None,
            pool: None,
            doorbell: std::ptr::null(),
            txq: VecDeque::new(),
            inflight: VecDeque::new(),
            ctrlq: VecDeque::new(),
            next_msg_id: 1,
            rx_parts: Vec::new(),
            rx_order: VecDeque::new(),
            cma_refused: false,
            cma_worked: false,
            busy: false,
            src_cache: (u64::MAX, FI_ADDR_NOTAVAIL),
            broken: false,
            gone: None,
            claim: ChanClaim::NONE,
        }
    }

    #[inline(always)]
    pub fn doorbell(&self) -> Option<&Doorbell> {
        // SAFETY: set from our Arc<Region>, alive as long as self.
        unsafe { self.doorbell.as_ref() }
    }

    /// Whether our channel to the peer is still ours: our ring slot still
    /// holds our token, or (overflow queue) the section is still open at
    /// the generation we connected to. True before the first connect.
    #[inline]
    pub fn chan_valid(&self) -> bool {
        let c = &self.claim;
        // SAFETY: the pointers are into the peer's region, which `region`
        // keeps mapped; they are set together with it in connect().
        unsafe {
            if !c.owner.is_null() {
                (*c.owner).load(Ordering::Relaxed) == c.token
            } else if let Some(h) = c.hdr.as_ref() {
                h.generation.load(Ordering::Relaxed) == c.generation
                    && h.state.load(Ordering::Relaxed) == ep_state::OPEN
            } else {
                true
            }
        }
    }
}

pub(crate) struct InRing {
    pub rx: RingRx,
    pub peer: usize,
}

/// What an endpoint has done, by path (for tests, `shmfab inspect` and
/// tuning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpStats {
    /// Sends that went inline.
    pub tx_inline: u64,
    /// Sends that went through the receiver's pool eagerly.
    pub tx_bounce: u64,
    /// Sends that went by rendezvous.
    pub tx_rndv: u64,
    /// Pool chunks filled.
    pub tx_chunks: u64,
    /// Messages taken from inbound SPSC rings.
    pub rx_ring: u64,
    /// Messages taken from the overflow queue.
    pub rx_ovf: u64,
    /// Rendezvous data read by single copy.
    pub cma_reads: u64,
    /// Rendezvous data fetched through the pool because CMA was off,
    /// not offered, or refused.
    pub cma_fallbacks: u64,
    /// Single copies shared with the sender (receiver read half, sender
    /// wrote half).
    pub split_copies: u64,
    /// Progress passes that left a message in place (back-pressure).
    pub stalls: u64,
    /// Sends refused with -FI_EAGAIN.
    pub tx_again: u64,
    /// Overflow queue entries freed because the sender that claimed them
    /// died before publishing.
    pub ovf_skipped: u64,
}

/// In-process state of an endpoint.
pub(crate) struct EpState {
    pub addr: Address,
    pub enabled: bool,
    pub sec: Section,
    pub pool: Pool,
    pub ovf: Ovf,
    pub tx_cq: Option<usize>,
    pub rx_cq: Option<usize>,
    pub tx_sel: bool,
    pub rx_sel: bool,
    pub cntr_send: Option<usize>,
    pub cntr_recv: Option<usize>,
    pub av: Option<usize>,
    /// Shared receive queue its untagged receives come from.
    pub srq: Option<usize>,
    /// Solicited wait: a receive completion signals a completion channel
    /// only if the message was sent solicited (errors always do).
    pub solicited_wait: bool,
    /// Closing: takes no more SRQ buffers.
    pub closing: bool,
    /// Inbound rings by slot.
    pub rings: Vec<Option<InRing>>,
    /// `rings` is out of the endpoint (a progress pass drains them; see
    /// `left_in_queues`).
    pub rings_out: bool,
    /// Claimed-slot mask already turned into `rings`.
    pub claimed_seen: u64,
    pub peers: Vec<Peer>,
    pub peer_by_addr: HashMap<Address, usize>,
    /// fi_addr -> peer index (u32::MAX: unknown). An fi_addr's address
    /// changes only by removal (inserts add handles or return existing
    /// ones), and the AV clears this on every removal.
    pub peer_by_fi: Vec<u32>,
    /// Peers with queued transmits or control messages.
    pub busy: Vec<usize>,
    /// Posted receives: [untagged, tagged].
    pub posted: [VecDeque<PostedRecv>; 2],
    /// Unexpected messages: [untagged, tagged].
    pub unexp: [VecDeque<Unexp>; 2],
    pub unexp_bytes: usize,
    pub next_unexp_id: u64,
    pub tx_outstanding: usize,
    pub min_multi_recv: usize,
    pub stats: EpStats,
    /// Buffers of delivered unexpected messages, kept for the next ones
    /// (small ones only, at most `SPARE_MAX`): no allocation per message.
    pub spare: Vec<Vec<u8>>,
    /// Progress passes, to look at the clock only now and then.
    pub passes: u32,
    /// When peers with pending operations were last checked for life.
    pub last_check: std::time::Instant,
    /// Set after a doorbell sleep: check the clock on the next pass.
    pub check_now: bool,
    /// The overflow queue's head found claimed but unpublished: its
    /// position and since when.
    pub ovf_stuck: Option<(u64, std::time::Instant)>,
}

/// Most spare unexpected-message buffers an endpoint keeps.
const SPARE_MAX: usize = 256;
/// Largest buffer kept as a spare.
const SPARE_BYTES: usize = 4096;

impl EpState {
    /// A buffer of `len` bytes for an unexpected message (a recycled one if
    /// it fits).
    #[inline]
    pub fn spare_buf(&mut self, len: usize) -> Vec<u8> {
        match self.spare.pop() {
            Some(mut v) if v.capacity() >= len => {
                v.resize(len, 0);
                v
            }
            other => {
                if let Some(v) = other {
                    self.spare.push(v);
                }
                vec![0u8; len]
            }
        }
    }

    /// Keeps a delivered unexpected message's buffer for reuse.
    #[inline]
    pub fn recycle_buf(&mut self, mut v: Vec<u8>) {
        if v.capacity() <= SPARE_BYTES && self.spare.len() < SPARE_MAX {
            v.clear();
            self.spare.push(v);
        }
    }

    /// Whether a message is waiting in any inbound ring or the overflow queue.
    pub fn inbound_ready(&self) -> bool {
        if self.sec.header().claimed.load(Ordering::Acquire) != self.claimed_seen {
            return true;
        }
        self.rings.iter().flatten().any(|r| r.rx.ready()) || self.ovf.ready()
    }

    pub fn peer_index(&mut self, addr: Address) -> usize {
        if let Some(&i) = self.peer_by_addr.get(&addr) {
            return i;
        }
        self.peers.push(Peer::new(addr));
        let i = self.peers.len() - 1;
        self.peer_by_addr.insert(addr, i);
        i
    }

    /// The peer behind `fi_addr` (through a cache indexed by fi_addr, which
    /// the bound AV clears when it removes an address), not necessarily
    /// connected.
    #[inline(always)]
    pub fn peer_of(&mut self, ctx: &Ctx<'_>, fi_addr: FiAddr) -> Result<usize> {
        let cached = self.peer_by_fi.get(fi_addr as usize).copied().unwrap_or(u32::MAX);
        if cached != u32::MAX {
            return Ok(cached as usize);
        }
        self.peer_of_slow(ctx, fi_addr)
    }

    /// [`EpState::peer_of`] when the cache does not know `fi_addr`.
    #[cold]
    #[inline(never)]
    fn peer_of_slow(&mut self, ctx: &Ctx<'_>, fi_addr: FiAddr) -> Result<usize> {
        let av_id = self.av.ok_or_else(|| Error::with(ErrorKind::Inval, "no address vector bound to the endpoint"))?;
        let av: &AvState = ctx.avs[av_id].as_ref().expect("bound AV exists");
        let a = av.lookup(fi_addr).ok_or_else(|| {
            Error::with(ErrorKind::AddrNotAvail, format!("fi_addr {fi_addr} is not in the address vector"))
        })?;
        let p = self.peer_index(a);
        let i = fi_addr as usize;
        if i < (1 << 24) {
            if self.peer_by_fi.len() <= i {
                self.peer_by_fi.resize(i + 1, u32::MAX);
            }
            self.peer_by_fi[i] = p as u32;
        }
        Ok(p)
    }

    /// The peer behind `fi_addr`, connected.
    #[inline(always)]
    pub fn peer_for(&mut self, ctx: &mut Ctx<'_>, fi_addr: FiAddr) -> Result<usize> {
        let p = self.peer_of(ctx, fi_addr)?;
        if self.peers[p].chan.is_none() {
            self.connect(ctx, p)?;
        }
        Ok(p)
    }

    /// First contact: map the peer's region, check its endpoint, claim a
    /// ring slot (or fall back to the overflow queue).
    pub fn connect(&mut self, ctx: &mut Ctx<'_>, p: usize) -> Result<()> {
        let addr = self.peers[p].addr;
        let name = crate::region::region_name(addr.uid, addr.job, addr.token);
        let region = match ctx.regions.get(&name) {
            Some(r) => r.clone(),
            None => {
                let r = Arc::new(Region::attach(&name)?);
                ctx.regions.insert(name.clone(), r.clone());
                r
            }
        };
        let sec = Section::of(&region, addr.ep_index)?;
        if !sec.open_at(addr.generation) {
            return Err(Error::with(
                ErrorKind::AddrNotAvail,
                format!("endpoint {} is closed", crate::av::AddressVector::straddr(&addr)),
            ));
        }
        let me = self.addr;
        let token = Section::claim_token(me, addr.generation);
        let mut claim = ChanClaim { owner: std::ptr::null(), token, hdr: sec.header(), generation: addr.generation };
        let chan = match sec.claim_ring(addr.generation, token, me) {
            Claim::Ring(s) => {
                claim.owner = &sec.slot(s).owner;
                // SAFETY: the ring belongs to the mapped section we hold
                // (region kept in Peer); we are its only producer (claimed).
                Chan::Ring(unsafe { RingTx::new(sec.ringctl_at(s), sec.ring_cells(s), sec.g.ring_cells as usize) })
            }
            Claim::Full => {
                sec.use_overflow();
                Chan::Ovf(sec.ovf())
            }
            Claim::Closed => {
                return Err(Error::with(
                    ErrorKind::AddrNotAvail,
                    format!("endpoint {} is closed", crate::av::AddressVector::straddr(&addr)),
                ))
            }
        };
        let peer = &mut self.peers[p];
        peer.pid = region.owner().0 as i32;
        peer.pool = Some(sec.pool());
        peer.doorbell = &region.header().doorbell as *const Doorbell;
        peer.chan = Some(chan);
        peer.claim = claim;
        peer.region = Some(region);
        Ok(())
    }

    /// Source fi_addr of a peer as the bound AV knows it (cached per peer
    /// for the AV's generation; inlined: every receive completion asks).
    #[inline(always)]
    pub fn src_addr(&mut self, avs: &[Option<AvState>], p: usize) -> FiAddr {
        let Some(av) = self.av.and_then(|a| avs[a].as_ref()) else {
            return FI_ADDR_NOTAVAIL;
        };
        let peer = &mut self.peers[p];
        if peer.src_cache.0 != av.generation {
            peer.src_cache = (av.generation, av.by_addr.get(&peer.addr).copied().unwrap_or(FI_ADDR_NOTAVAIL));
        }
        peer.src_cache.1
    }

    pub fn mark_busy(&mut self, p: usize) {
        if !self.peers[p].busy {
            self.peers[p].busy = true;
            self.busy.push(p);
        }
    }

    /// The fast path of a small send: one segment, inline in the peer's
    /// ring, nothing queued or in flight to that peer, so it completes at
    /// once; no transmit record is built. `None` when it does not apply
    /// (the caller then takes the general path, which also reports every
    /// error but an unknown destination).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn send_inline_now(
        &mut self,
        ctx: &mut Ctx<'_>,
        dest: FiAddr,
        buf: &[u8],
        hdr: &shm_layout::MsgHdr,
        done: crate::progress::SendDone,
    ) -> Option<Result<()>> {
        if !self.enabled || self.tx_outstanding >= ctx.cfg.tx_size {
            return None;
        }
        if done.cqe && self.tx_cq.is_none() && self.cntr_send.is_none() {
            return None;
        }
        let p = match self.peer_of(ctx, dest) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        // A peer not connected yet (first contact) also takes the general
        // path: its channel is None.
        let peer = self.peers.get_mut(p)?;
        if peer.gone.is_some() || !peer.txq.is_empty() || !peer.inflight.is_empty() || !peer.chan_valid() {
            return None;
        }
        if !proto::inline_on_ring(ctx.cfg, buf.len()) {
            let cma_ok = proto::offer_cma(ctx.cfg, peer.cma_refused, done.inject);
            if proto::choose(ctx.cfg, buf.len(), 1, true, cma_ok) != Proto::Inline {
                return None;
            }
        }
        let Some(Chan::Ring(ring)) = peer.chan.as_mut() else { return None };
        if !ring.try_push(hdr, &[buf]) {
            return None;
        }
        if let Some(db) = peer.doorbell() {
            crate::doorbell::ring(db);
        }
        self.stats.tx_inline += 1;
        crate::progress::complete_send(self, ctx, done, None);
        Some(Ok(()))
    }

    /// Queues (or sends at once) a transmit. The general send path, kept
    /// out of the inlined fast path so that the latter's frame stays small
    /// (the transmit record is built for it only).
    #[inline(never)]
    pub fn post_tx(&mut self, ctx: &mut Ctx<'_>, dest: FiAddr, mut op: TxOp, inject: bool) -> Result<()> {
        if !self.enabled {
            return Err(Error::with(ErrorKind::Inval, "endpoint is not enabled"));
        }
        if self.tx_cq.is_none() && self.cntr_send.is_none() && op.cqe {
            return Err(Error::with(ErrorKind::NoCq, "no transmit CQ or send counter bound"));
        }
        if self.tx_outstanding >= ctx.cfg.tx_size {
            crate::progress::progress_tx(self, ctx);
            if self.tx_outstanding >= ctx.cfg.tx_size {
                self.stats.tx_again += 1;
                return Err(Error::AGAIN);
            }
        }
        let p = self.peer_for(ctx, dest)?;
        if !self.peers[p].chan_valid() {
            let why = crate::progress::chan_lost(self, ctx, p);
            return Err(Error::with(ErrorKind::Io, why));
        }
        let peer = &mut self.peers[p];
        if let Some(why) = &peer.gone {
            return Err(Error::with(ErrorKind::Io, why.clone()));
        }
        let on_ring = matches!(peer.chan, Some(Chan::Ring(_)));
        let cma_ok = proto::offer_cma(ctx.cfg, peer.cma_refused, inject);
        op.proto = proto::choose(ctx.cfg, op.len, op.iovs.n, on_ring, cma_ok);
        if peer.txq.is_empty() && op.proto == Proto::Inline && crate::progress::push_inline(peer, &self.addr, &op) {
            if let Some(db) = peer.doorbell() {
                crate::doorbell::ring(db);
            }
            self.stats.tx_inline += 1;
            if peer.inflight.is_empty() {
                crate::progress::complete_tx(self, ctx, &op, None);
            } else {
                // Completes after the earlier sends still in flight.
                op.state = TxState::Done;
                if inject && op.owned.is_none() {
                    op.iovs = Iovs::default();
                }
                peer.inflight.push_back(op);
                self.tx_outstanding += 1;
            }
            return Ok(());
        }
        if inject && op.owned.is_none() {
            let mut v = vec![0u8; op.len];
            op.iovs.gather(0, &mut v);
            op.iovs = Iovs::one(v.as_ptr() as usize, v.len());
            op.owned = Some(v);
        }
        self.peers[p].txq.push_back(op);
        self.tx_outstanding += 1;
        self.mark_busy(p);
        crate::progress::progress_peer_tx(self, ctx, p);
        Ok(())
    }

    /// Posts a receive: matches the unexpected queue first.
    pub fn post_rx(&mut self, ctx: &mut Ctx<'_>, tagged: bool, r: PostedRecv) -> Result<()> {
        if !self.enabled {
            return Err(Error::with(ErrorKind::Inval, "endpoint is not enabled"));
        }
        if self.rx_cq.is_none() && self.cntr_recv.is_none() {
            return Err(Error::with(ErrorKind::NoCq, "no receive CQ or receive counter bound"));
        }
        let q = tagged as usize;
        if self.posted[q].len() >= ctx.cfg.rx_size {
            return Err(Error::AGAIN);
        }
        self.posted[q].push_back(r);
        if self.unexp[q].is_empty() {
            return Ok(());
        }
        // Unexpected messages that this receive (or a multi-receive buffer,
        // several of them) matches.
        while let Some(ui) = self.match_unexp(tagged, self.posted[q].len() - 1) {
            let u = self.unexp[q].remove(ui).expect("index from match");
            let last = self.posted[q].len() - 1;
            let dest = self.take_posted(q, last, u.len);
            crate::progress::deliver_unexp(self, ctx, u, dest, tagged);
            if self.posted[q].len() <= last {
                break; // consumed (not a multi-receive buffer still open)
            }
        }
        Ok(())
    }

    /// First unexpected message the posted receive `ri` matches.
    fn match_unexp(&self, tagged: bool, ri: usize) -> Option<usize> {
        let q = tagged as usize;
        let r = &self.posted[q][ri];
        self.unexp[q]
            .iter()
            .position(|u| r.src.is_none_or(|s| s == u.peer) && (!tagged || (u.tag & !r.ignore) == (r.tag & !r.ignore)))
    }

    /// Takes the receive a message of `len` bytes from `p` with `tag`
    /// matches: the SRQ's oldest buffer for an untagged message on an SRQ
    /// endpoint, else the first matching posted receive.
    #[inline(always)]
    pub fn take_match(&mut self, ctx: &mut Ctx<'_>, tagged: bool, p: usize, tag: u64, len: usize) -> Option<Dest> {
        if !tagged {
            if let Some(s) = self.srq {
                if self.closing {
                    return None;
                }
                return ctx.srqs[s].as_mut().and_then(|q| q.take());
            }
        }
        let i = self.match_posted(tagged, p, tag)?;
        Some(self.take_posted(tagged as usize, i, len))
    }

    /// First posted receive a message from `p` with `tag` matches.
    #[inline]
    pub fn match_posted(&self, tagged: bool, p: usize, tag: u64) -> Option<usize> {
        let q = tagged as usize;
        self.posted[q]
            .iter()
            .position(|r| r.src.is_none_or(|s| s == p) && (!tagged || (tag & !r.ignore) == (r.tag & !r.ignore)))
    }

    /// Takes the posted receive `i` of queue `q` for a message of `len`
    /// bytes: removes it, or carves from a multi-receive buffer.
    #[inline(always)]
    pub fn take_posted(&mut self, q: usize, i: usize, len: usize) -> Dest {
        let min = self.min_multi_recv;
        let r = &mut self.posted[q][i];
        if r.multi {
            let base = r.iovs.v[0];
            let avail = base.len - r.moff;
            let at = base.ptr + r.moff;
            let used = len.min(avail);
            // Keep later messages 8-byte aligned inside the buffer.
            r.moff = (r.moff + used).next_multiple_of(8).min(base.len);
            let release = base.len - r.moff < min.max(1);
            let d = Dest {
                ctx: r.ctx,
                iovs: Iovs::one(at, avail),
                cap: avail,
                buf: at,
                multi_release: release,
                cqe: r.cqe,
            };
            if release {
                self.posted[q].remove(i);
            }
            d
        } else {
            // Built from a reference, then the entry dropped: moving the
            // whole entry out first costs store-forwarding stalls.
            let d = Dest {
                ctx: r.ctx,
                iovs: r.iovs,
                cap: r.iovs.total(),
                buf: r.iovs.v[0].ptr,
                multi_release: false,
                cqe: r.cqe,
            };
            if i == 0 {
                self.posted[q].pop_front();
            } else {
                self.posted[q].remove(i);
            }
            d
        }
    }
}

/// An endpoint.
pub struct Endpoint {
    pub(crate) dom: Arc<DomainInner>,
    pub(crate) idx: usize,
    /// The state in slot `idx` (see [`crate::domain::EpBox`]): dereferenced
    /// only under the domain lock, after `closed` was read false under it.
    state: std::ptr::NonNull<EpState>,
    addr: Address,
    closed: std::sync::atomic::AtomicBool,
}

/// Operation flags for the `*msg` calls.
pub type OpFlags = u64;

impl Domain {
    /// Opens an endpoint: takes a free section of the domain's region,
    /// reserves its memory (first touch by this process) and opens it to
    /// peers. Its address ([`Endpoint::getname`]) is valid at once.
    pub fn endpoint(&self) -> Result<Endpoint> {
        let inner = &self.inner;
        let mut st = inner.lock()?;
        let idx = st.eps.iter().position(|e| e.is_none()).ok_or_else(|| {
            Error::with(
                ErrorKind::NoSpc,
                format!("all {} endpoints of the domain are open (SHMFAB_MAX_EPS)", inner.cfg.max_eps),
            )
        })?;
        let sec = Section::of(&inner.region, idx as u32)?;
        inner.region.reserve(sec.offset, sec.g.section_size())?;
        st.ep_gen[idx] = st.ep_gen[idx].wrapping_add(1);
        let generation = st.ep_gen[idx];
        // SAFETY: the section is closed (state CLOSED, freshly zeroed pages),
        // so no peer uses its pool or queue yet.
        unsafe { sec.open(generation) };
        let (pool, ovf) = (sec.pool(), sec.ovf());
        let addr = Address { uid: inner.uid, job: inner.job, token: inner.token, ep_index: idx as u32, generation };
        let n_slots = sec.g.n_slots as usize;
        let ep = crate::domain::EpBox::new(EpState {
            addr,
            enabled: false,
            sec,
            pool,
            ovf,
            tx_cq: None,
            rx_cq: None,
            tx_sel: false,
            rx_sel: false,
            cntr_send: None,
            cntr_recv: None,
            av: None,
            srq: None,
            solicited_wait: false,
            closing: false,
            rings: (0..n_slots).map(|_| None).collect(),
            rings_out: false,
            claimed_seen: 0,
            peers: Vec::new(),
            peer_by_addr: HashMap::new(),
            peer_by_fi: Vec::new(),
            busy: Vec::new(),
            posted: [VecDeque::new(), VecDeque::new()],
            unexp: [VecDeque::new(), VecDeque::new()],
            unexp_bytes: 0,
            next_unexp_id: 1,
            tx_outstanding: 0,
            min_multi_recv: 64,
            stats: EpStats::default(),
            spare: Vec::new(),
            passes: 0,
            last_check: std::time::Instant::now(),
            check_now: false,
            ovf_stuck: None,
        });
        let state = ep.ptr();
        st.set_ep(idx, Some(ep));
        Ok(Endpoint { dom: inner.clone(), idx, state, addr, closed: false.into() })
    }
}

// SAFETY: the handle's state pointer is dereferenced only under the domain
// lock (which serialises every thread's access to the state) and only while
// the endpoint is open: `close` marks it closed before it takes the lock to
// free the state, and `with_ep!` reads the mark under the lock.
unsafe impl Send for Endpoint {}
// SAFETY: as for Send: shared handles reach the state only through the lock.
unsafe impl Sync for Endpoint {}

/// Runs `$body` with the endpoint's state and a progress context, under the
/// domain lock. The state comes from the handle's pointer, not from the
/// domain's slot vector: two dependent loads fewer on every call.
macro_rules! with_ep {
    ($self:ident, |$ep:ident, $ctx:ident| $body:expr) => {{
        let mut st = $self.dom.lock()?;
        // Read under the lock: a close that freed the state set it before
        // taking the lock (release on its unlock, acquire on our lock).
        if $self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "endpoint is closed"));
        }
        let crate::domain::DomainState { cqs, avs, srqs, regions, .. } = &mut *st;
        let mut ctx = Ctx { cfg: &$self.dom.cfg, cqs, avs, srqs, regions, counters: $self.dom.counters() };
        // SAFETY: the endpoint is open (checked just above under the lock),
        // so its state is allocated; the lock guard `st` is held until the
        // body ends, and neither the context nor anything else made from
        // `st` reaches the endpoint slots, so this is the only reference.
        let state = unsafe { &mut *$self.state.as_ptr() };
        run_with(
            state,
            &mut ctx,
            #[inline(always)]
            |$ep, $ctx| $body,
        )
    }};
}

/// Calls `f` (a closure lets `with_ep!` bodies use `return` and `?`).
#[inline(always)]
fn run_with<R>(
    ep: &mut EpState,
    ctx: &mut Ctx<'_>,
    f: impl FnOnce(&mut EpState, &mut Ctx<'_>) -> Result<R>,
) -> Result<R> {
    f(ep, ctx)
}

fn iovs_from(slices: &[IoSlice<'_>]) -> Result<Iovs> {
    if slices.len() > MAX_IOV {
        return Err(Error::with(ErrorKind::Inval, format!("at most {MAX_IOV} iov segments")));
    }
    let mut v = Iovs::default();
    for (i, s) in slices.iter().enumerate() {
        v.v[i] = Iov { ptr: s.as_ptr() as usize, len: s.len() };
    }
    v.n = slices.len();
    Ok(v)
}

fn iovs_from_mut(slices: &mut [IoSliceMut<'_>]) -> Result<Iovs> {
    if slices.len() > MAX_IOV {
        return Err(Error::with(ErrorKind::Inval, format!("at most {MAX_IOV} iov segments")));
    }
    let mut v = Iovs::default();
    for (i, s) in slices.iter_mut().enumerate() {
        v.v[i] = Iov { ptr: s.as_mut_ptr() as usize, len: s.len() };
    }
    v.n = slices.len();
    Ok(v)
}

/// A send request for [`Endpoint::sendmsg`] / [`Endpoint::tsendmsg`].
pub struct SendMsg<'a> {
    /// Payload segments (at most 4).
    pub iov: &'a [IoSlice<'a>],
    /// Destination.
    pub dest: FiAddr,
    /// Operation context, returned in the completion.
    pub context: usize,
    /// Remote CQ data (sent when `flags` has FI_REMOTE_CQ_DATA).
    pub data: u64,
    /// Tag (tagged sends).
    pub tag: u64,
}

/// A receive request for [`Endpoint::recvmsg`] / [`Endpoint::trecvmsg`].
pub struct RecvMsg<'a, 'b> {
    /// Buffer segments (at most 4; one with FI_MULTI_RECV).
    pub iov: &'a mut [IoSliceMut<'b>],
    /// Source filter (FI_ADDR_UNSPEC: any).
    pub src: FiAddr,
    /// Operation context.
    pub context: usize,
    /// Tag (tagged receives).
    pub tag: u64,
    /// Tag bits to ignore.
    pub ignore: u64,
}

const SEND_FLAGS: u64 = FI_REMOTE_CQ_DATA | FI_COMPLETION | FI_INJECT | SHMFAB_SOLICITED;
const RECV_FLAGS: u64 = FI_MULTI_RECV | FI_COMPLETION;

impl Endpoint {
    /// This endpoint's address (24 bytes with [`Address::to_bytes`]).
    pub fn getname(&self) -> Address {
        self.addr
    }

    /// Counts of what the endpoint has done, by path.
    pub fn stats(&self) -> Result<EpStats> {
        with_ep!(self, |ep, _ctx| Ok(ep.stats))
    }

    /// Index of this endpoint's section in the domain region.
    pub fn index(&self) -> usize {
        self.idx
    }

    /// Binds a CQ for transmit (FI_TRANSMIT) and/or receive (FI_RECV)
    /// completions; add FI_SELECTIVE_COMPLETION to report only operations
    /// that ask with FI_COMPLETION.
    pub fn bind_cq(&self, cq: &crate::CompletionQueue, flags: u64) -> Result<()> {
        if flags & !(FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION) != 0 || flags & (FI_TRANSMIT | FI_RECV) == 0 {
            return Err(Error::with(
                ErrorKind::BadFlags,
                "bind_cq takes FI_TRANSMIT, FI_RECV, FI_SELECTIVE_COMPLETION",
            ));
        }
        if !Arc::ptr_eq(&cq.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "CQ belongs to another domain"));
        }
        let cq_id = cq.id;
        with_ep!(self, |ep, ctx| {
            if ep.enabled {
                return Err(Error::with(ErrorKind::Inval, "bind before enable"));
            }
            if ctx.cqs.get(cq_id).and_then(|c| c.as_ref()).is_none() {
                return Err(Error::with(ErrorKind::Inval, "CQ is closed"));
            }
            let sel = flags & FI_SELECTIVE_COMPLETION != 0;
            for (want, slot, selslot) in
                [(FI_TRANSMIT, &mut ep.tx_cq, &mut ep.tx_sel), (FI_RECV, &mut ep.rx_cq, &mut ep.rx_sel)]
            {
                if flags & want != 0 {
                    if slot.is_some() {
                        return Err(Error::with(ErrorKind::Inval, "a CQ is already bound for that direction"));
                    }
                    *slot = Some(cq_id);
                    *selslot = sel;
                    ctx.cqs[cq_id].as_mut().expect("checked").bound += 1;
                }
            }
            Ok(())
        })
    }

    /// Binds a counter for completed sends (FI_SEND) and/or receives (FI_RECV).
    pub fn bind_cntr(&self, c: &crate::Counter, flags: u64) -> Result<()> {
        if flags & !(FI_SEND | FI_RECV) != 0 || flags == 0 {
            return Err(Error::with(ErrorKind::BadFlags, "bind_cntr takes FI_SEND and/or FI_RECV"));
        }
        if !Arc::ptr_eq(&c.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "counter belongs to another domain"));
        }
        let id = c.id;
        let mut st = self.dom.lock()?;
        let ep = st.eps[self.idx].as_deref_mut().ok_or_else(|| Error::with(ErrorKind::Inval, "endpoint is closed"))?;
        if ep.enabled {
            return Err(Error::with(ErrorKind::Inval, "bind before enable"));
        }
        let mut n = 0;
        if flags & FI_SEND != 0 {
            if ep.cntr_send.is_some() {
                return Err(Error::with(ErrorKind::Inval, "a send counter is already bound"));
            }
            ep.cntr_send = Some(id);
            n += 1;
        }
        if flags & FI_RECV != 0 {
            if ep.cntr_recv.is_some() {
                return Err(Error::with(ErrorKind::Inval, "a receive counter is already bound"));
            }
            ep.cntr_recv = Some(id);
            n += 1;
        }
        st.cntrs[id].as_mut().ok_or_else(|| Error::with(ErrorKind::Inval, "counter is closed"))?.bound += n;
        Ok(())
    }

    /// Binds the address vector.
    pub fn bind_av(&self, av: &crate::AddressVector) -> Result<()> {
        if !Arc::ptr_eq(&av.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "AV belongs to another domain"));
        }
        let id = av.id;
        with_ep!(self, |ep, ctx| {
            if ep.av.is_some() {
                return Err(Error::with(ErrorKind::Inval, "an AV is already bound"));
            }
            let _ = ctx;
            ep.av = Some(id);
            ep.peer_by_fi.clear();
            Ok(())
        })?;
        let mut st = self.dom.lock()?;
        st.avs[id].as_mut().ok_or_else(|| Error::with(ErrorKind::Inval, "AV is closed"))?.bound += 1;
        Ok(())
    }

    /// Binds a shared receive queue (before enable): the endpoint's untagged
    /// receives then come from it, and `recv`/`recvv`/`recvmsg` on the
    /// endpoint are refused; tagged receives stay the endpoint's own.
    pub fn bind_srq(&self, srq: &crate::SharedRecvQueue) -> Result<()> {
        if !Arc::ptr_eq(&srq.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "SRQ belongs to another domain"));
        }
        let (id, idx) = (srq.id, self.idx);
        with_ep!(self, |ep, ctx| {
            if ep.enabled {
                return Err(Error::with(ErrorKind::Inval, "bind before enable"));
            }
            if ep.srq.is_some() {
                return Err(Error::with(ErrorKind::Inval, "an SRQ is already bound"));
            }
            let q = ctx
                .srqs
                .get_mut(id)
                .and_then(|q| q.as_mut())
                .ok_or_else(|| Error::with(ErrorKind::Inval, "SRQ is closed"))?;
            q.eps.push(idx);
            ep.srq = Some(id);
            Ok(())
        })
    }

    /// Solicited wait (DAT_COMPLETION_SOLICITED_WAIT_FLAG): when on, a
    /// receive completion of this endpoint signals an armed completion
    /// channel only if its message was sent with
    /// [`SHMFAB_SOLICITED`](crate::flags::SHMFAB_SOLICITED) (errors always
    /// signal); when off (the default) every completion signals as
    /// [`CompletionQueue::req_notify`](crate::CompletionQueue::req_notify)
    /// says. The completions themselves are written either way.
    pub fn set_solicited_wait(&self, on: bool) -> Result<()> {
        with_ep!(self, |ep, _ctx| {
            ep.solicited_wait = on;
            Ok(())
        })
    }

    /// Enables the endpoint: needs an AV, and a CQ or counter per direction.
    pub fn enable(&self) -> Result<()> {
        with_ep!(self, |ep, _ctx| {
            if ep.av.is_none() {
                return Err(Error::with(ErrorKind::NoData, "bind an address vector before enable"));
            }
            if ep.tx_cq.is_none() && ep.cntr_send.is_none() {
                return Err(Error::with(ErrorKind::NoCq, "bind a transmit CQ or send counter before enable"));
            }
            if ep.rx_cq.is_none() && ep.cntr_recv.is_none() {
                return Err(Error::with(ErrorKind::NoCq, "bind a receive CQ or receive counter before enable"));
            }
            ep.enabled = true;
            Ok(())
        })
    }

    /// FI_OPT_MIN_MULTI_RECV: a multi-receive buffer is released when less
    /// than this many bytes remain (default 64).
    pub fn set_min_multi_recv(&self, n: usize) -> Result<()> {
        with_ep!(self, |ep, _ctx| {
            ep.min_multi_recv = n;
            Ok(())
        })
    }

    #[inline(always)]
    fn tx(&self, m: &SendMsg<'_>, flags: u64, tagged: bool, inject: bool) -> Result<()> {
        if flags & !SEND_FLAGS != 0 {
            return Err(Error::with(ErrorKind::BadFlags, format!("unsupported send flags {:#x}", flags & !SEND_FLAGS)));
        }
        let iovs = iovs_from(m.iov)?;
        self.tx_raw(iovs.v[0], Some(&iovs), m.dest, m.context, m.data, m.tag, flags, tagged, inject)
    }

    /// The send path, from scalars: each captured by its own reference in
    /// the closure below, so no wide load re-reads a struct written field
    /// by field (a store-forwarding stall). `iovs` is None for the
    /// one-buffer calls (`one` is that buffer): their segment list is built
    /// only if the fast path does not take them.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn tx_raw(
        &self,
        one: Iov,
        iovs: Option<&Iovs>,
        dest: FiAddr,
        context: usize,
        data: u64,
        tag: u64,
        flags: u64,
        tagged: bool,
        inject: bool,
    ) -> Result<()> {
        // Checked by `tx`; the one-buffer calls pass constant valid flags.
        debug_assert!(flags & !SEND_FLAGS == 0);
        let len = iovs.map_or(one.len, |v| v.total());
        if len > MAX_MSG_SIZE {
            return Err(Error::with(ErrorKind::MsgSize, format!("{len} bytes is over the {MAX_MSG_SIZE}-byte limit")));
        }
        if inject && len > INJECT_SIZE {
            return Err(Error::with(
                ErrorKind::MsgSize,
                format!("inject takes at most {INJECT_SIZE} bytes, got {len}"),
            ));
        }
        let mut hflags = 0;
        if tagged {
            hflags |= shm_layout::hdr_flags::TAGGED;
        }
        if flags & FI_REMOTE_CQ_DATA != 0 {
            hflags |= shm_layout::hdr_flags::REMOTE_CQ_DATA;
        }
        if flags & SHMFAB_SOLICITED != 0 {
            hflags |= shm_layout::hdr_flags::SOLICITED;
        }
        with_ep!(self, |ep, ctx| {
            let cqe = !inject && (!ep.tx_sel || flags & FI_COMPLETION != 0);
            if iovs.is_none_or(|v| v.n == 1) {
                // SAFETY: the caller's buffer, valid for reads for the call
                // (and until completion, which is now on this path).
                let buf = unsafe { std::slice::from_raw_parts(one.ptr as *const u8, one.len) };
                let hdr = shm_layout::MsgHdr {
                    op: shm_layout::op::EAGER,
                    flags: hflags,
                    ncells: 0,
                    len: len as u32,
                    tag,
                    data,
                };
                let done = crate::progress::SendDone { ctx: context, tagged, tag, cqe, inject };
                if let Some(r) = ep.send_inline_now(ctx, dest, buf, &hdr, done) {
                    return r;
                }
            }
            let iovs = iovs.copied().unwrap_or_else(|| Iovs::one(one.ptr, one.len));
            let op = TxOp {
                ctx: context,
                tagged,
                tag,
                data,
                hflags,
                len,
                iovs,
                owned: None,
                proto: Proto::Inline,
                state: TxState::Start,
                cqe,
                inject,
                err: None,
            };
            ep.post_tx(ctx, dest, op, inject)
        })
    }

    #[inline(always)]
    fn rx(&self, m: &mut RecvMsg<'_, '_>, flags: u64, tagged: bool) -> Result<()> {
        if flags & !RECV_FLAGS != 0 {
            return Err(Error::with(
                ErrorKind::BadFlags,
                format!("unsupported receive flags {:#x}", flags & !RECV_FLAGS),
            ));
        }
        let multi = flags & FI_MULTI_RECV != 0;
        if multi && (tagged || m.iov.len() != 1) {
            return Err(Error::with(ErrorKind::Inval, "FI_MULTI_RECV takes one buffer on an untagged receive"));
        }
        let iovs = iovs_from_mut(m.iov)?;
        let (src_fi, tag, ignore, context) = (m.src, m.tag, m.ignore, m.context);
        with_ep!(self, |ep, ctx| {
            if !tagged && ep.srq.is_some() {
                return Err(Error::with(
                    ErrorKind::Inval,
                    "the endpoint takes its untagged receives from its shared receive queue: post there",
                ));
            }
            // A directed receive's source becomes a known peer, so its
            // death is noticed while this receive waits for it.
            let src = if src_fi == FI_ADDR_UNSPEC {
                None
            } else {
                let p = ep.peer_of(ctx, src_fi).map_err(|_| {
                    Error::with(
                        ErrorKind::AddrNotAvail,
                        format!("source fi_addr {src_fi} is not in the address vector"),
                    )
                })?;
                Some(p)
            };
            let r = PostedRecv {
                ctx: context,
                iovs,
                src,
                tag,
                ignore,
                multi,
                moff: 0,
                cqe: !ep.rx_sel || flags & FI_COMPLETION != 0,
            };
            ep.post_rx(ctx, tagged, r)
        })
    }

    /// fi_sendmsg.
    ///
    /// # Safety
    /// The iov buffers must stay valid and unchanged until the send completes.
    pub unsafe fn sendmsg(&self, m: &SendMsg<'_>, flags: OpFlags) -> Result<()> {
        self.tx(m, flags, false, flags & FI_INJECT != 0 && m.iov.iter().map(|s| s.len()).sum::<usize>() <= INJECT_SIZE)
    }

    /// fi_tsendmsg.
    ///
    /// # Safety
    /// As [`Endpoint::sendmsg`].
    pub unsafe fn tsendmsg(&self, m: &SendMsg<'_>, flags: OpFlags) -> Result<()> {
        self.tx(m, flags, true, false)
    }

    /// fi_recvmsg (FI_MULTI_RECV for multi-receive buffers).
    ///
    /// # Safety
    /// The buffers must stay valid and untouched until the receive completes
    /// (for FI_MULTI_RECV: until the completion with FI_MULTI_RECV).
    pub unsafe fn recvmsg(&self, m: &mut RecvMsg<'_, '_>, flags: OpFlags) -> Result<()> {
        self.rx(m, flags, false)
    }

    /// fi_trecvmsg.
    ///
    /// # Safety
    /// As [`Endpoint::recvmsg`].
    pub unsafe fn trecvmsg(&self, m: &mut RecvMsg<'_, '_>, flags: OpFlags) -> Result<()> {
        self.rx(m, flags, true)
    }

    /// fi_send.
    ///
    /// # Safety
    /// `buf` must stay valid and unchanged until the send completes.
    pub unsafe fn send(&self, buf: &[u8], dest: FiAddr, context: usize) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, context, 0, 0, 0, false, false)
    }

    /// fi_sendv.
    ///
    /// # Safety
    /// As [`Endpoint::send`], for every segment.
    pub unsafe fn sendv(&self, iov: &[IoSlice<'_>], dest: FiAddr, context: usize) -> Result<()> {
        self.tx(&SendMsg { iov, dest, context, data: 0, tag: 0 }, 0, false, false)
    }

    /// fi_senddata: a send carrying remote CQ data.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    pub unsafe fn senddata(&self, buf: &[u8], data: u64, dest: FiAddr, context: usize) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, context, data, 0, FI_REMOTE_CQ_DATA, false, false)
    }

    /// fi_inject: no completion entry; `buf` may be reused on return.
    pub fn inject(&self, buf: &[u8], dest: FiAddr) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, 0, 0, 0, 0, false, true)
    }

    /// fi_injectdata.
    pub fn injectdata(&self, buf: &[u8], data: u64, dest: FiAddr) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, 0, data, 0, FI_REMOTE_CQ_DATA, false, true)
    }

    /// fi_recv.
    ///
    /// # Safety
    /// `buf` must stay valid and untouched until the receive completes.
    pub unsafe fn recv(&self, buf: &mut [u8], src: FiAddr, context: usize) -> Result<()> {
        self.rx(&mut RecvMsg { iov: &mut [IoSliceMut::new(buf)], src, context, tag: 0, ignore: 0 }, 0, false)
    }

    /// fi_recvv.
    ///
    /// # Safety
    /// As [`Endpoint::recv`], for every segment.
    pub unsafe fn recvv(&self, iov: &mut [IoSliceMut<'_>], src: FiAddr, context: usize) -> Result<()> {
        self.rx(&mut RecvMsg { iov, src, context, tag: 0, ignore: 0 }, 0, false)
    }

    /// fi_tsend.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    pub unsafe fn tsend(&self, buf: &[u8], dest: FiAddr, tag: u64, context: usize) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, context, 0, tag, 0, true, false)
    }

    /// fi_tsendv.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    pub unsafe fn tsendv(&self, iov: &[IoSlice<'_>], dest: FiAddr, tag: u64, context: usize) -> Result<()> {
        self.tx(&SendMsg { iov, dest, context, data: 0, tag }, 0, true, false)
    }

    /// fi_tsenddata.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    pub unsafe fn tsenddata(&self, buf: &[u8], data: u64, dest: FiAddr, tag: u64, context: usize) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, context, data, tag, FI_REMOTE_CQ_DATA, true, false)
    }

    /// fi_tinject.
    pub fn tinject(&self, buf: &[u8], dest: FiAddr, tag: u64) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, 0, 0, tag, 0, true, true)
    }

    /// fi_tinjectdata.
    pub fn tinjectdata(&self, buf: &[u8], data: u64, dest: FiAddr, tag: u64) -> Result<()> {
        self.tx_raw(Iov::of(buf), None, dest, 0, data, tag, FI_REMOTE_CQ_DATA, true, true)
    }

    /// fi_trecv: matches tags equal outside `ignore`; `src` directs it.
    ///
    /// # Safety
    /// As [`Endpoint::recv`].
    pub unsafe fn trecv(&self, buf: &mut [u8], src: FiAddr, tag: u64, ignore: u64, context: usize) -> Result<()> {
        self.rx(&mut RecvMsg { iov: &mut [IoSliceMut::new(buf)], src, context, tag, ignore }, 0, true)
    }

    /// fi_trecvv.
    ///
    /// # Safety
    /// As [`Endpoint::recv`].
    pub unsafe fn trecvv(
        &self,
        iov: &mut [IoSliceMut<'_>],
        src: FiAddr,
        tag: u64,
        ignore: u64,
        context: usize,
    ) -> Result<()> {
        self.rx(&mut RecvMsg { iov, src, context, tag, ignore }, 0, true)
    }

    /// Closes the endpoint: unbinds it, and closes its section to peers.
    /// Receives already matched (SRQ buffers it dequeued among them) that
    /// have not completed are flushed to its CQ as `FI_ECANCELED` error
    /// entries; queued sends and unmatched posted receives are dropped
    /// without completions.
    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let mut st = self.dom.lock()?;
        if st.eps[self.idx].is_none() {
            return Ok(());
        }
        self.dom.with_ep(&mut st, self.idx, |ep, ctx| {
            crate::progress::flush_rx(ep, ctx);
            Ok(())
        })?;
        let Some(ep) = st.set_ep(self.idx, None) else {
            return Ok(());
        };
        if let Some(s) = ep.srq {
            if let Some(q) = st.srqs[s].as_mut() {
                q.eps.retain(|&e| e != self.idx);
                if q.eps.is_empty() && q.orphaned {
                    st.srqs[s] = None;
                }
            }
        }
        ep.sec.close();
        for cq in [ep.tx_cq, ep.rx_cq].into_iter().flatten() {
            if let Some(c) = st.cqs[cq].as_mut() {
                c.bound -= 1;
                if c.bound == 0 && c.orphaned {
                    st.cqs[cq] = None;
                }
            }
        }
        for c in [ep.cntr_send, ep.cntr_recv].into_iter().flatten() {
            if let Some(s) = st.cntrs[c].as_mut() {
                s.bound -= 1;
                if s.bound == 0 && s.orphaned {
                    st.cntrs[c] = None;
                }
            }
        }
        if let Some(a) = ep.av {
            if let Some(s) = st.avs[a].as_mut() {
                s.bound -= 1;
                if s.bound == 0 && s.orphaned {
                    st.avs[a] = None;
                }
            }
        }
        // Give the section's pages back; a reopen starts from zeroed memory.
        let _ = rustix::fs::fallocate(
            self.dom.region_fd(),
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            ep.sec.offset as u64 + std::mem::size_of::<shm_layout::EpHeader>() as u64,
            (ep.sec.g.section_size() - std::mem::size_of::<shm_layout::EpHeader>()) as u64,
        );
        Ok(())
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
