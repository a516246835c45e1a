//! Reliable-datagram endpoints: binding, addressing, and posting sends and
//! receives (untagged and tagged, with iovs, remote CQ data, inject,
//! directed receive and multi-receive buffers).
//!
//! Operations that take a caller's buffer and complete later are `unsafe`:
//! the buffer must stay valid (and, for sends, unchanged) until its
//! completion is reported, as in libfabric. `inject` copies and is safe.

use crate::domain::{Ctx, CtxSrc, Domain, DomainInner, Section};
use crate::engine::complete::{CntrKind, Dw};
use crate::engine::matching::{Dest, PostedRecv};
use crate::engine::request::{Iov, Iovs};
use crate::engine::request::{OpKind, Request, SEND_FLAGS};
use crate::engine::EpState;
use crate::error::{Error, ErrorKind, Result};
use crate::flags::*;
use shm_layout::{Address, MAX_IOV};
use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

/// What an endpoint has done, by path (for tests, `shmfab inspect` and
/// tuning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpStats {
    /// Sends that went inline.
    pub tx_inline: u64,
    /// Sends that went through the receiver's pool eagerly.
    pub tx_bounce: u64,
    /// Of those, sends that would have gone inline but were part of a
    /// stream (`SHMFAB_STREAM_MIN`: not an answer, and the peer's ring
    /// still held our messages or had no room).
    pub tx_streamed: u64,
    /// Sends that went by rendezvous.
    pub tx_rndv: u64,
    /// Pool chunks filled.
    pub tx_chunks: u64,
    /// Messages taken from inbound SPSC rings.
    pub rx_ring: u64,
    /// Messages taken from the overflow queue.
    pub rx_ovf: u64,
    /// Piped inline messages taken (also counted in `rx_ring`): published
    /// before their payload was whole, copied as it landed.
    pub rx_piped: u64,
    /// Rendezvous data read by single copy.
    pub cma_reads: u64,
    /// Rendezvous data fetched through the pool because CMA was off,
    /// not offered, refused, or its buffers sat in the kernel copy's slow
    /// band (those also counted in `cma_aliased`).
    pub cma_fallbacks: u64,
    /// Rendezvous messages whose two buffers sat in the slow band of the
    /// kernel's copy ([`crate::copy`]): sent through the pool instead.
    pub cma_aliased: u64,
    /// Rendezvous messages taken through the pool although single copy was
    /// usable, because the pool measured faster with that peer at that
    /// size ([`crate::proto::PathPick`]).
    pub pool_picked: u64,
    /// Single copies shared with the sender (receiver read half, sender
    /// wrote half).
    pub split_copies: u64,
    /// FINs queued to senders: one per rendezvous read by single copy
    /// (or discarded, or failed), one per rendezvous through the pool only
    /// when its sender asked (FI_DELIVERY_COMPLETE: `rts_flags::FIN`).
    pub fins: u64,
    /// Progress passes that left a message in place (back-pressure).
    pub stalls: u64,
    /// Sends refused with -FI_EAGAIN.
    pub tx_again: u64,
    /// Overflow queue entries freed because the sender that claimed them
    /// died before publishing.
    pub ovf_skipped: u64,
    /// Piped messages dropped unfinished because their sender was gone
    /// (its process died, or its endpoint closed, mid-message).
    pub pipes_dropped: u64,
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
        let idx = st.eps.free_slot().ok_or_else(|| {
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
        let id = inner.region.id();
        let addr = Address { pid: id.pid, job: id.job, token: id.token, fd: id.fd, ep_index: idx as u32, generation };
        let ep = crate::domain::EpBox::new(EpState::new(addr, sec, inner.cfg.pipe_min, inner.cfg.ring_lap));
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

/// Runs `$body` with the endpoint's state and where its progress context
/// comes from ([`CtxSrc`]), under the domain lock. The state comes from the
/// handle's pointer, not from the domain's slot vector: two dependent loads
/// fewer on every call.
macro_rules! with_ep_src {
    ($self:ident, |$ep:ident, $src:ident| $body:expr) => {{
        let mut st = $self.dom.lock()?;
        // Read under the lock: a close that freed the state set it before
        // taking the lock (release on its unlock, acquire on our lock).
        if $self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "endpoint is closed"));
        }
        let mut src = CtxSrc::new(&$self.dom, &mut st);
        // SAFETY: the endpoint is open (checked just above under the lock),
        // so its state is allocated; the lock guard `st` is held until the
        // body ends, and neither the context source (which gives out only
        // the CQs, counters, AVs, SRQs and regions) nor anything else made
        // from `st` reaches the endpoint slots, so this is the only
        // reference.
        let state = unsafe { &mut *$self.state.as_ptr() };
        run_with(
            state,
            &mut src,
            #[inline(always)]
            |$ep, $src| $body,
        )
    }};
}

/// As `with_ep_src!`, with the progress context built.
macro_rules! with_ep {
    ($self:ident, |$ep:ident, $ctx:ident| $body:expr) => {
        with_ep_src!($self, |ep, src| run_with(
            ep,
            &mut src.ctx(),
            #[inline(always)]
            |$ep, $ctx| $body
        ))
    };
}

/// Calls `f` (a closure lets `with_ep!` bodies use `return` and `?`).
#[inline(always)]
fn run_with<C, R>(ep: &mut EpState, ctx: &mut C, f: impl FnOnce(&mut EpState, &mut C) -> Result<R>) -> Result<R> {
    f(ep, ctx)
}

/// Posts a receive: matches the unexpected queue first. Inlined into each
/// receive call, so that the receive is built in its queue slot (not on
/// the stack and copied there); the matching of unexpected messages is out
/// of line.
#[inline(always)]
fn post_rx(ep: &mut EpState, src: &mut CtxSrc<'_>, tagged: bool, r: PostedRecv) -> Result<()> {
    if !ep.enabled {
        return Err(Error::with(ErrorKind::Inval, "endpoint is not enabled"));
    }
    if !ep.bind.can_report_rx() {
        return Err(Error::with(ErrorKind::NoCq, "no receive CQ or receive counter bound"));
    }
    ep.matching.post(tagged, r, src.cfg().rx_size)?;
    if ep.matching.has_unexp(tagged) {
        match_unexp(ep, &mut src.ctx(), tagged);
    }
    Ok(())
}

/// The unexpected messages that the receive just posted takes.
#[inline(never)]
pub(crate) fn match_unexp(ep: &mut EpState, ctx: &mut Ctx<'_>, tagged: bool) {
    let before = ep.matching.posted_count() - 1;
    // Unexpected messages that this receive (or a multi-receive buffer,
    // several of them) matches.
    while let Some((u, dest)) = ep.matching.take_unexp_for_last(tagged) {
        crate::progress::deliver_unexp(ep, ctx, u, dest, tagged);
        if ep.matching.posted_count() <= before {
            break; // consumed (not a multi-receive buffer still open)
        }
    }
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

const RECV_FLAGS: u64 = FI_MULTI_RECV | FI_COMPLETION;
/// The flags of peeks and claims (tagged receives only).
const PROBE_FLAGS: u64 = FI_PEEK | FI_CLAIM | FI_DISCARD;

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
            // Checked by the handle's mark (a closed handle's slot may hold
            // a CQ opened since, which a test of the slot alone would bind).
            cq.state_in(ctx.cqs)?;
            let sel = flags & FI_SELECTIVE_COMPLETION != 0;
            for (want, slot, selslot) in [
                (FI_TRANSMIT, &mut ep.bind.tx_cq, &mut ep.bind.tx_sel),
                (FI_RECV, &mut ep.bind.rx_cq, &mut ep.bind.rx_sel),
            ] {
                if flags & want != 0 {
                    if slot.is_some() {
                        return Err(Error::with(ErrorKind::Inval, "a CQ is already bound for that direction"));
                    }
                    *slot = Some(cq_id);
                    *selslot = sel;
                    ctx.cqs.bind(cq_id)?;
                }
            }
            ep.bind.tx_rm = ep.bind.tx_cq.and_then(|c| ctx.cqs.get(c)).is_some_and(|q| q.rm());
            Ok(())
        })
    }

    /// Binds a counter for the events of `flags` (fi_cntr(3)): completed
    /// sends (FI_SEND), receives (FI_RECV), reads (FI_READ), writes
    /// (FI_WRITE), and reads and writes of our memory by peers
    /// (FI_REMOTE_READ, FI_REMOTE_WRITE: the one-sided operations of peers
    /// that landed in any of this domain's registrations through this
    /// endpoint's address, with FI_RMA_EVENT semantics; see `crate::rma`).
    pub fn bind_cntr(&self, c: &crate::Counter, flags: u64) -> Result<()> {
        let all = CntrKind::ALL.iter().fold(0, |a, k| a | k.1);
        if flags & !all != 0 || flags == 0 {
            return Err(Error::with(
                ErrorKind::BadFlags,
                "bind_cntr takes FI_SEND, FI_RECV, FI_READ, FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE",
            ));
        }
        if !Arc::ptr_eq(&c.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "counter belongs to another domain"));
        }
        let id = c.id;
        let mut st = self.dom.lock()?;
        let ep = st.eps.get_mut(self.idx).ok_or_else(|| Error::with(ErrorKind::Inval, "endpoint is closed"))?;
        if ep.enabled {
            return Err(Error::with(ErrorKind::Inval, "bind before enable"));
        }
        // As bind_cq: the handle's mark, under the lock.
        if c.is_closed() {
            return Err(Error::with(ErrorKind::Inval, "counter is closed"));
        }
        let kinds = CntrKind::ALL.iter().filter(|k| flags & k.1 != 0);
        if let Some((k, _)) = kinds.clone().find(|k| ep.bind.cntr(k.0).is_some()) {
            return Err(Error::with(ErrorKind::Inval, format!("a {k:?} counter is already bound")));
        }
        // Bound in the table first: a closed counter is refused before the
        // endpoint records it.
        let kinds: Vec<CntrKind> = kinds.map(|k| k.0).collect();
        let crate::domain::DomainState { eps, cntrs, .. } = &mut *st;
        cntrs.bind_n(id, kinds.len())?;
        let ep = eps.get_mut(self.idx).expect("checked open above");
        for k in kinds {
            ep.bind.bind_cntr(k, id);
        }
        if self.dom.threading == crate::Threading::Safe {
            ep.bind.wake = Some(std::ptr::NonNull::from(&self.dom.region.header().doorbell));
        }
        Ok(())
    }

    /// Binds the address vector.
    pub fn bind_av(&self, av: &crate::AddressVector) -> Result<()> {
        if !Arc::ptr_eq(&av.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "AV belongs to another domain"));
        }
        let id = av.id;
        let mut st = self.dom.lock()?;
        let crate::domain::DomainState { eps, avs, .. } = &mut *st;
        let ep = eps.get_mut(self.idx).ok_or_else(|| Error::with(ErrorKind::Inval, "endpoint is closed"))?;
        if ep.peers.av().is_some() {
            return Err(Error::with(ErrorKind::Inval, "an AV is already bound"));
        }
        // Bound in the table first: a closed AV is refused before the
        // endpoint records it.
        avs.bind(id)?;
        ep.peers.bind_av(id);
        Ok(())
    }

    /// Binds a shared receive queue (before enable): the endpoint's untagged
    /// receives then come from it, and `recv`/`recvv`/`recvmsg` on the
    /// endpoint are refused; tagged receives stay the endpoint's own
    /// (see [`Endpoint::bind_srq_for`]).
    pub fn bind_srq(&self, srq: &crate::SharedRecvQueue) -> Result<()> {
        self.bind_srq_for(srq, FI_MSG)
    }

    /// Binds a shared receive queue (before enable) for the receives of
    /// `flags`: FI_MSG (untagged), FI_TAGGED, or both. Those then come
    /// from the SRQ (its posted receives, in posting order, matched by
    /// the messages of every endpoint bound for them), and posting them on
    /// the endpoint (receives, and for FI_TAGGED peeks and claims) is
    /// refused.
    pub fn bind_srq_for(&self, srq: &crate::SharedRecvQueue, flags: u64) -> Result<()> {
        if flags & !(FI_MSG | FI_TAGGED) != 0 || flags == 0 {
            return Err(Error::with(ErrorKind::BadFlags, "an SRQ is bound for FI_MSG, FI_TAGGED or both"));
        }
        if !Arc::ptr_eq(&srq.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "SRQ belongs to another domain"));
        }
        let kinds = [flags & FI_MSG != 0, flags & FI_TAGGED != 0];
        let (id, idx) = (srq.id, self.idx);
        with_ep!(self, |ep, ctx| {
            if ep.enabled {
                return Err(Error::with(ErrorKind::Inval, "bind before enable"));
            }
            if ep.matching.srq.is_some() {
                return Err(Error::with(ErrorKind::Inval, "an SRQ is already bound"));
            }
            let q = ctx.srqs.bind(id)?;
            q.eps.push(idx);
            if kinds[1] {
                q.reserve_tagged();
            }
            ep.matching.bind_srq(id, kinds);
            Ok(())
        })
    }

    /// Solicited wait (DAT_COMPLETION_SOLICITED_WAIT_FLAG): when on, a
    /// receive completion of this endpoint signals an armed completion
    /// channel only if its message was sent with
    /// [`SHMFAB_SOLICITED`] (errors always
    /// signal); when off (the default) every completion signals as
    /// [`CompletionQueue::req_notify`](crate::CompletionQueue::req_notify)
    /// says. The completions themselves are written either way.
    pub fn set_solicited_wait(&self, on: bool) -> Result<()> {
        with_ep!(self, |ep, _ctx| {
            ep.bind.solicited_wait = on;
            Ok(())
        })
    }

    /// FI_SOURCE_ERR (fi_cq(3)): when on, a message received from an
    /// address that is not in the endpoint's AV completes as an error entry
    /// of kind `AddrNotAvail` (prov_errno [`prov::UNKNOWN_SOURCE`]) with
    /// the entry's usual fields, its `err_data` the sender's raw address
    /// ([`Address::SIZE`] bytes, which [`AddressVector::insert`] takes),
    /// instead of a completion whose source is `FI_ADDR_NOTAVAIL`. The
    /// data was received whole either way. Off by default.
    ///
    /// [`prov::UNKNOWN_SOURCE`]: crate::cq::prov::UNKNOWN_SOURCE
    /// [`AddressVector::insert`]: crate::AddressVector::insert
    pub fn set_source_err(&self, on: bool) -> Result<()> {
        with_ep!(self, |ep, _ctx| {
            ep.matching.set_source_err(on);
            Ok(())
        })
    }

    /// Enables the endpoint: needs an AV, and a CQ or counter per direction
    /// (`-FI_ENOCQ`); with counters only for receives, not while the SRQ it
    /// takes its untagged receives from holds an FI_MULTI_RECV buffer,
    /// whose release only a receive CQ entry reports (`-FI_ENOCQ`).
    pub fn enable(&self) -> Result<()> {
        with_ep!(self, |ep, ctx| {
            if ep.peers.av().is_none() {
                return Err(Error::with(ErrorKind::NoData, "bind an address vector before enable"));
            }
            if !ep.bind.can_report_tx() {
                return Err(Error::with(ErrorKind::NoCq, "bind a transmit CQ or send counter before enable"));
            }
            if !ep.bind.can_report_rx() {
                return Err(Error::with(ErrorKind::NoCq, "bind a receive CQ or receive counter before enable"));
            }
            if ep.bind.rx_cq.is_none()
                && ep.matching.srq_for(false).and_then(|s| ctx.srqs.get(s)).is_some_and(|q| q.holds_multi())
            {
                // Counters only: it could not report the release of the
                // multi-receive buffers it would take.
                return Err(Error::with(ErrorKind::NoCq, crate::srq::MULTI_NO_CQ));
            }
            let (rw, rr) = (ep.bind.cntr(CntrKind::RemoteWrite), ep.bind.cntr(CntrKind::RemoteRead));
            crate::mr::publish_ep(&self.dom, self.idx, rw, rr);
            ep.set_enabled();
            Ok(())
        })
    }

    /// Makes the endpoint passive (or active again): see
    /// [`EpState::passive`]. The World's barrier endpoint is passive
    /// outside barriers, so data messages do not pay for its rings. An
    /// endpoint with transmits still to move stays active (nothing would
    /// move them): it goes passive at a later call.
    pub(crate) fn set_passive(&self, passive: bool) -> Result<()> {
        with_ep!(self, |ep, _ctx| {
            let passive = passive && !ep.tx.any_busy();
            ep.set_passive(passive);
            Ok(())
        })
    }

    /// FI_OPT_MIN_MULTI_RECV: a multi-receive buffer is released when less
    /// than this many bytes remain (default 64).
    pub fn set_min_multi_recv(&self, n: usize) -> Result<()> {
        with_ep!(self, |ep, _ctx| {
            ep.matching.min_multi_recv = n;
            Ok(())
        })
    }

    #[inline(always)]
    fn tx(&self, m: &SendMsg<'_>, flags: u64, kind: OpKind) -> Result<()> {
        if flags & !SEND_FLAGS != 0 {
            return Err(Error::with(ErrorKind::BadFlags, format!("unsupported send flags {:#x}", flags & !SEND_FLAGS)));
        }
        let iovs = iovs_from(m.iov)?;
        self.submit(Request {
            kind,
            one: iovs.v[0],
            iov: Some(&iovs),
            dest: m.dest,
            context: m.context,
            tag: m.tag,
            data: m.data,
            flags,
            silent: false,
            dw: Dw::NONE,
        })
    }

    /// The one submit path of every transmit call: the request goes to
    /// the endpoint's [`EpState::submit`] under the domain lock. Inlined
    /// into each call, so a one-buffer call's request stays in registers
    /// (its segment list is built only if the fast path does not take it).
    #[inline(always)]
    fn submit(&self, r: Request<'_>) -> Result<()> {
        // Checked by `tx`; the one-buffer calls pass constant valid flags.
        debug_assert!(r.flags & !SEND_FLAGS == 0);
        with_ep_src!(self, |ep, src| ep.submit(src, &r))
    }

    /// Runs `f` with the endpoint's state and a progress context under the
    /// domain lock (for the one-sided calls of `crate::rma`).
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut EpState, &mut Ctx<'_>) -> Result<R>) -> Result<R> {
        with_ep!(self, |ep, ctx| f(ep, ctx))
    }

    /// As [`Endpoint::with_state`], with the context source rather than
    /// the progress context (not built: a [`crate::HeapTarget`] call and
    /// the heap fast path of the one-buffer and one-element RMA calls
    /// need only the counters; they build the context from the source
    /// when they need more).
    #[inline(always)]
    pub(crate) fn with_state_src<R>(&self, f: impl FnOnce(&mut EpState, &mut CtxSrc<'_>) -> Result<R>) -> Result<R> {
        with_ep_src!(self, |ep, src| f(ep, src))
    }

    /// A one-buffer transmit call.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn tx_one(
        &self,
        kind: OpKind,
        buf: &[u8],
        dest: FiAddr,
        context: usize,
        data: u64,
        tag: u64,
        flags: u64,
    ) -> Result<()> {
        // The one-buffer calls with FI_INJECT are the inject calls.
        let silent = flags & FI_INJECT != 0;
        self.submit(Request {
            kind,
            one: Iov::of(buf),
            iov: None,
            dest,
            context,
            tag,
            data,
            flags,
            silent,
            dw: Dw::NONE,
        })
    }

    #[inline(always)]
    fn rx(&self, m: &mut RecvMsg<'_, '_>, flags: u64, tagged: bool) -> Result<()> {
        if flags & !RECV_FLAGS != 0 {
            if tagged && flags & PROBE_FLAGS != 0 && flags & !(RECV_FLAGS | PROBE_FLAGS) == 0 {
                return self.probe(m, flags);
            }
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
        with_ep_src!(self, |ep, cx| {
            if ep.matching.srq_for(tagged).is_some() {
                return Err(Error::with(
                    ErrorKind::Inval,
                    "the endpoint takes these receives from its shared receive queue: post there",
                ));
            }
            // A directed receive's source becomes a known peer, so its
            // death is noticed while this receive waits for it.
            let src = if src_fi == FI_ADDR_UNSPEC {
                None
            } else if let Some(p) = ep.peers.cached(src_fi) {
                // The fi_addr cache's answer, not merged with the lookup's
                // error below (a test of a flag known false, otherwise).
                Some(p)
            } else {
                let p = ep.peers.of_with(|| cx.avs(), src_fi).map_err(|_| {
                    Error::with(
                        ErrorKind::AddrNotAvail,
                        format!("source fi_addr {src_fi} is not in the address vector"),
                    )
                })?;
                Some(p)
            };
            // A multi-receive buffer's record (see `MultiRecs`), freed if
            // the post fails.
            if multi && ep.enabled && ep.bind.rx_cq.is_none() {
                // Counters only: nothing could report the buffer's release.
                return Err(Error::with(
                    ErrorKind::NoCq,
                    "FI_MULTI_RECV reports a buffer's release in a receive CQ entry: bind a receive CQ \
                     (a counter cannot report it)",
                ));
            }
            let multi = if multi { ep.matching.multi.open()? } else { 0 };
            let r = PostedRecv {
                ctx: context,
                iovs,
                src,
                tag,
                ignore,
                multi,
                moff: 0,
                cqe: !ep.bind.rx_sel || flags & FI_COMPLETION != 0,
            };
            let res = post_rx(ep, cx, tagged, r);
            if multi != 0 && res.is_err() {
                ep.matching.multi.close(multi);
            }
            res
        })
    }

    /// A tagged receive with FI_PEEK or FI_CLAIM (see [`Endpoint::trecvmsg`]).
    #[cold]
    #[inline(never)]
    fn probe(&self, m: &mut RecvMsg<'_, '_>, flags: u64) -> Result<()> {
        let (peek, claim, discard) = (flags & FI_PEEK != 0, flags & FI_CLAIM != 0, flags & FI_DISCARD != 0);
        if flags & FI_MULTI_RECV != 0 || !(peek || claim) || (peek && claim && discard) {
            return Err(Error::with(
                ErrorKind::BadFlags,
                "a peek or claim is FI_PEEK, FI_PEEK | FI_CLAIM, FI_PEEK | FI_DISCARD, FI_CLAIM or FI_CLAIM | FI_DISCARD",
            ));
        }
        let (src_fi, tag, ignore, context) = (m.src, m.tag, m.ignore, m.context);
        if claim && context == 0 {
            return Err(Error::with(ErrorKind::Inval, "FI_CLAIM needs a context: the one its message is claimed with"));
        }
        // A peek copies no data, and a discard takes none: their buffers are
        // ignored.
        let iovs = if peek || discard { Iovs::default() } else { iovs_from_mut(m.iov)? };
        if peek {
            // What has arrived is seen (a peek does not wait): a pass over
            // the domain, so that what its other endpoints send us moves too.
            let mut st = self.dom.lock()?;
            self.dom.progress(&mut st);
        }
        with_ep_src!(self, |ep, cx| {
            if !ep.enabled {
                return Err(Error::with(ErrorKind::Inval, "endpoint is not enabled"));
            }
            if ep.matching.srq_for(true).is_some() {
                return Err(Error::with(
                    ErrorKind::Inval,
                    "the endpoint takes its tagged receives from its shared receive queue: peek and claim there",
                ));
            }
            if ep.bind.rx_cq.is_none() {
                return Err(Error::with(
                    ErrorKind::NoCq,
                    "peeks and claims report through a receive CQ: none is bound",
                ));
            }
            if !peek {
                let cqe = !ep.bind.rx_sel || flags & FI_COMPLETION != 0;
                let d = Dest { ctx: context, iovs, cap: iovs.total(), buf: iovs.v[0].ptr, cqe, ..Default::default() };
                return crate::progress::claimed_rx(ep, &mut cx.ctx(), d, discard);
            }
            if claim && ep.matching.claims(context) {
                return Err(Error::with(ErrorKind::Inval, "this context already holds a claimed message"));
            }
            let src = if src_fi == FI_ADDR_UNSPEC {
                None
            } else {
                let p = ep.peers.of_with(|| cx.avs(), src_fi).map_err(|_| {
                    Error::with(
                        ErrorKind::AddrNotAvail,
                        format!("source fi_addr {src_fi} is not in the address vector"),
                    )
                })?;
                Some(p)
            };
            let r = PostedRecv { ctx: context, iovs, src, tag, ignore, multi: 0, moff: 0, cqe: true };
            crate::progress::peek(ep, &mut cx.ctx(), &r, claim, discard);
            Ok(())
        })
    }

    /// fi_sendmsg. Flags: FI_COMPLETION, FI_REMOTE_CQ_DATA, FI_INJECT (the
    /// buffers may be reused on return; at most [`INJECT_SIZE`](crate::proto::INJECT_SIZE) bytes, else
    /// `-FI_EMSGSIZE`; the completion is written as for any send, unlike
    /// [`Endpoint::inject`]'s), [`SHMFAB_SOLICITED`], and
    /// FI_DELIVERY_COMPLETE: the send completes only once the receiver has
    /// the data in its receive buffer (it goes by rendezvous, whatever its
    /// size, and completes at the receiver's FIN: a send to a peer that
    /// has posted no matching receive stays incomplete until one is
    /// posted and filled, or the message is discarded, or the peer dies).
    ///
    /// # Safety
    /// The iov buffers must stay valid and unchanged until the send completes
    /// (with FI_INJECT: until the call returns).
    pub unsafe fn sendmsg(&self, m: &SendMsg<'_>, flags: OpFlags) -> Result<()> {
        self.tx(m, flags, OpKind::Msg)
    }

    /// fi_tsendmsg, with the flags of [`Endpoint::sendmsg`].
    ///
    /// # Safety
    /// As [`Endpoint::sendmsg`].
    pub unsafe fn tsendmsg(&self, m: &SendMsg<'_>, flags: OpFlags) -> Result<()> {
        self.tx(m, flags, OpKind::Tagged)
    }

    /// fi_recvmsg (FI_MULTI_RECV for multi-receive buffers: carved by the
    /// messages of every peer, 8-byte aligned, released when less than
    /// [`Endpoint::set_min_multi_recv`] bytes remain; the buffer's last
    /// completion has FI_MULTI_RECV, which waits for every piece carved
    /// before the release, or a cancel, to be reported). That completion
    /// is how the buffer comes back, so FI_MULTI_RECV needs a receive CQ:
    /// `-FI_ENOCQ` on an endpoint with a receive counter only.
    /// `-FI_EAGAIN` when 2^20 - 1 multi-receive buffers are posted or
    /// released with pieces still to be reported (progress frees them).
    ///
    /// # Safety
    /// The buffers must stay valid and untouched until the receive completes
    /// (for FI_MULTI_RECV: until the completion with FI_MULTI_RECV).
    pub unsafe fn recvmsg(&self, m: &mut RecvMsg<'_, '_>, flags: OpFlags) -> Result<()> {
        self.rx(m, flags, false)
    }

    /// fi_trecvmsg. Flags: FI_COMPLETION, and the probes of fi_tagged(3),
    /// which MPI's probe and matched receive use:
    /// - FI_PEEK: after a progress pass over the domain, looks for the first unexpected
    ///   message this receive accepts (source if directed, tag and ignore
    ///   bits) without taking it. Found: a completion of `context` with the
    ///   message's length, tag, remote CQ data and source (buf NULL: no
    ///   data is copied, and the buffers are ignored). None: an error
    ///   completion `-FI_ENOMSG`. Always written, whatever
    ///   FI_SELECTIVE_COMPLETION says; counters do not count peeks.
    /// - FI_PEEK | FI_CLAIM: as FI_PEEK, and the message found is claimed
    ///   for `context`: no other receive or peek sees it any more.
    ///   `-FI_EINVAL` if `context` already holds a claim.
    /// - FI_CLAIM: receives the message claimed with `context` into the
    ///   buffers, completing as a receive posted for it would (a message
    ///   still arriving completes when it has; a rendezvous is read from the
    ///   sender now). `-FI_EINVAL` if `context` holds no claim (never
    ///   claimed, or received already).
    /// - FI_DISCARD, with FI_PEEK or FI_CLAIM: the message found or claimed
    ///   is dropped (a rendezvous's send completes at its sender); the
    ///   completion of FI_PEEK | FI_DISCARD gives the message's length,
    ///   that of FI_CLAIM | FI_DISCARD length 0.
    ///
    /// Peeks and claims need a receive CQ (`-FI_ENOCQ`); a claim's context
    /// is not 0.
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
        self.tx_one(OpKind::Msg, buf, dest, context, 0, 0, 0)
    }

    /// fi_sendv.
    ///
    /// # Safety
    /// As [`Endpoint::send`], for every segment.
    pub unsafe fn sendv(&self, iov: &[IoSlice<'_>], dest: FiAddr, context: usize) -> Result<()> {
        self.tx(&SendMsg { iov, dest, context, data: 0, tag: 0 }, 0, OpKind::Msg)
    }

    /// fi_senddata: a send carrying remote CQ data.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    pub unsafe fn senddata(&self, buf: &[u8], data: u64, dest: FiAddr, context: usize) -> Result<()> {
        self.tx_one(OpKind::Msg, buf, dest, context, data, 0, FI_REMOTE_CQ_DATA)
    }

    /// fi_inject: no completion entry; `buf` may be reused on return.
    pub fn inject(&self, buf: &[u8], dest: FiAddr) -> Result<()> {
        self.tx_one(OpKind::Msg, buf, dest, 0, 0, 0, FI_INJECT)
    }

    /// fi_injectdata.
    pub fn injectdata(&self, buf: &[u8], data: u64, dest: FiAddr) -> Result<()> {
        self.tx_one(OpKind::Msg, buf, dest, 0, data, 0, FI_REMOTE_CQ_DATA | FI_INJECT)
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
        self.tx_one(OpKind::Tagged, buf, dest, context, 0, tag, 0)
    }

    /// fi_tsendv.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    pub unsafe fn tsendv(&self, iov: &[IoSlice<'_>], dest: FiAddr, tag: u64, context: usize) -> Result<()> {
        self.tx(&SendMsg { iov, dest, context, data: 0, tag }, 0, OpKind::Tagged)
    }

    /// fi_tsenddata.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    pub unsafe fn tsenddata(&self, buf: &[u8], data: u64, dest: FiAddr, tag: u64, context: usize) -> Result<()> {
        self.tx_one(OpKind::Tagged, buf, dest, context, data, tag, FI_REMOTE_CQ_DATA)
    }

    /// fi_tinject.
    pub fn tinject(&self, buf: &[u8], dest: FiAddr, tag: u64) -> Result<()> {
        self.tx_one(OpKind::Tagged, buf, dest, 0, 0, tag, FI_INJECT)
    }

    /// fi_tinjectdata.
    pub fn tinjectdata(&self, buf: &[u8], data: u64, dest: FiAddr, tag: u64) -> Result<()> {
        self.tx_one(OpKind::Tagged, buf, dest, 0, data, tag, FI_REMOTE_CQ_DATA | FI_INJECT)
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

    /// fi_cancel for receives: the first posted receive whose context is
    /// `context` and that no message has matched yet completes as an
    /// `FI_ECANCELED` error entry (its buffer is then free). Returns whether
    /// one was found: a receive already matched completes as usual (as
    /// fi_endpoint(3) says, the cancel of an operation that completed has
    /// no effect). Sends are not cancelled, unless triggered and not fired
    /// yet: a triggered operation of this endpoint (any kind, see
    /// [`Endpoint::triggered`]) still waiting for its trigger, with that
    /// context, is looked for first; it never runs, and completes as an
    /// `FI_ECANCELED` error entry.
    pub fn cancel(&self, context: usize) -> Result<bool> {
        if self.cancel_triggered(context)? {
            return Ok(true);
        }
        with_ep!(self, |ep, ctx| {
            let Some((tagged, d)) = ep.matching.cancel(context) else {
                return Ok(false);
            };
            let why = (ErrorKind::Canceled, crate::cq::prov::CANCELED, "receive cancelled".to_string());
            crate::engine::complete::unused_rx(&ep.bind, ctx, &d, tagged, why);
            Ok(true)
        })
    }

    /// Closes the endpoint: unbinds it, and closes its section to peers.
    /// Receives already matched (SRQ buffers it dequeued among them) that
    /// have not completed, then the receives still posted, are flushed to
    /// its CQ as `FI_ECANCELED` error entries; queued sends are dropped
    /// without completions.
    pub fn close(&self) -> Result<()> {
        self.close_with(false)
    }

    /// Closes the endpoint as fi_endpoint(3)'s fi_close does: outstanding
    /// operations are dropped with no completions. The endpoint's own
    /// receives not completed, matched or still posted, are dropped (their
    /// buffers are free once this returns); SRQ buffers it dequeued but
    /// did not fill go back to the front of their SRQ, still posted there
    /// (a message waiting at another bound endpoint takes them at once).
    /// Receives that completed are reported as with [`Endpoint::close`].
    pub fn close_discard(&self) -> Result<()> {
        self.close_with(true)
    }

    fn close_with(&self, discard: bool) -> Result<()> {
        if self.closed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let mut st = self.dom.lock()?;
        if st.eps.get(self.idx).is_none() {
            return Ok(());
        }
        crate::trigger::ep_closing(&self.dom, &mut st, self.idx, discard);
        self.dom.with_ep(&mut st, self.idx, |ep, ctx| {
            crate::progress::flush_rx(ep, ctx, discard);
            ep.drop_tx_reservations(ctx);
            Ok(())
        })?;
        let Some(ep) = st.set_ep(self.idx, None) else {
            return Ok(());
        };
        st.unbind_ep(self.idx, &ep);
        if let Some(s) = ep.matching.srq.filter(|_| discard) {
            // Buffers given back serve the other endpoints' waiting messages.
            for tagged in [false, true] {
                crate::srq::serve(&self.dom, &mut st, s, tagged, false)?;
            }
        }
        crate::mr::publish_ep(&self.dom, self.idx, None, None);
        ep.sec.close();
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{CompletionQueue, CqAttr, CqTaggedEntry, Fabric};

    fn open(dom: &Domain, cq: &CompletionQueue, av: &crate::AddressVector) -> Endpoint {
        let ep = dom.endpoint().unwrap();
        ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(av).unwrap();
        ep.enable().unwrap();
        ep
    }

    /// `close` flushes the receives still posted as `FI_ECANCELED` entries;
    /// `close_discard` drops them with no entry (fi_close's rule).
    #[test]
    fn close_discard_drops_posted_receives_silently() {
        std::env::set_var("SHMFAB_JOB_ID", format!("ep-discard-{}", std::process::id()));
        let dom = Fabric::open().unwrap().domain().unwrap();
        let cq = dom.cq_open(&CqAttr::default()).unwrap();
        let av = dom.av_open().unwrap();
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        for discard in [false, true] {
            let ep = open(&dom, &cq, &av);
            // SAFETY: a and b outlive the endpoint, closed below.
            unsafe {
                ep.recv(&mut a, FI_ADDR_UNSPEC, 1).unwrap();
                ep.trecv(&mut b, FI_ADDR_UNSPEC, 5, 0, 2).unwrap();
            }
            if discard {
                ep.close_discard().unwrap();
            } else {
                ep.close().unwrap();
            }
            dom.progress().unwrap();
            let mut e = [CqTaggedEntry::default()];
            if !discard {
                for ctx in [1, 2] {
                    assert_eq!(cq.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
                    let x = cq.readerr().unwrap();
                    assert_eq!((x.op_context, x.err), (ctx, ErrorKind::Canceled.errno()));
                }
            }
            assert_eq!(cq.read(&mut e).unwrap_err(), Error::AGAIN);
        }
    }

    /// FI_SOURCE_ERR: a message from an address the receiver's AV lacks
    /// is an `AddrNotAvail` error entry whose error data is the sender's
    /// address; once inserted, the next one completes with its fi_addr.
    /// Without it, the source is FI_ADDR_NOTAVAIL.
    #[test]
    fn source_err_reports_unknown_senders() {
        std::env::set_var("SHMFAB_JOB_ID", format!("ep-srcerr-{}", std::process::id()));
        let dom = Fabric::open().unwrap().domain().unwrap();
        let (cq, tx_cq) = (dom.cq_open(&CqAttr::default()).unwrap(), dom.cq_open(&CqAttr::default()).unwrap());
        let (av, tx_av) = (dom.av_open().unwrap(), dom.av_open().unwrap());
        let rx = open(&dom, &cq, &av);
        let tx = open(&dom, &tx_cq, &tx_av);
        let to = tx_av.insert(&[rx.getname()]).unwrap()[0];
        let mut b = [0u8; 8];
        let mut e = [CqTaggedEntry::default()];
        let mut src = [0u64];
        // SAFETY (each receive): b outlives the completions read below.
        unsafe { rx.recv(&mut b, FI_ADDR_UNSPEC, 1).unwrap() };
        tx.inject(b"plain", to).unwrap();
        dom.progress().unwrap();
        assert_eq!(cq.readfrom(&mut e, &mut src).unwrap(), 1);
        assert_eq!((e[0].op_context, src[0]), (1, crate::FI_ADDR_NOTAVAIL), "without FI_SOURCE_ERR");
        rx.set_source_err(true).unwrap();
        // SAFETY: as above: the buffers outlive their completions, read below.
        unsafe { rx.recv(&mut b, FI_ADDR_UNSPEC, 2).unwrap() };
        tx.inject(b"who", to).unwrap();
        dom.progress().unwrap();
        assert_eq!(cq.readfrom(&mut e, &mut src).unwrap_err().kind(), ErrorKind::Avail);
        let mut data = [0u8; 64];
        let (x, n) = cq.readerr_into(&mut data).unwrap();
        assert_eq!((x.op_context, x.len, x.err), (2, 3, ErrorKind::AddrNotAvail.errno()));
        assert_eq!(x.prov_errno, crate::cq::prov::UNKNOWN_SOURCE);
        assert_eq!(&data[..n], &tx.getname().to_bytes()[..], "the error data is the sender's address");
        assert_eq!(&b[..3], b"who", "received whole");
        let from = av.insert(&[Address::from_bytes(&data[..n]).unwrap()]).unwrap()[0];
        // SAFETY: b outlives the completion read below.
        unsafe { rx.recv(&mut b, FI_ADDR_UNSPEC, 3).unwrap() };
        tx.inject(b"known", to).unwrap();
        dom.progress().unwrap();
        assert_eq!(cq.readfrom(&mut e, &mut src).unwrap(), 1);
        assert_eq!((e[0].op_context, src[0]), (3, from));
        assert_eq!(tx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "injects complete nothing");
    }

    /// A passive endpoint (the World's barrier endpoint outside barriers)
    /// is left alone by the domain's passes: a message to it waits in its
    /// ring while data flows on another endpoint, and is taken once it is
    /// active again.
    #[test]
    fn passive_endpoint_is_not_polled() {
        std::env::set_var("SHMFAB_JOB_ID", format!("ep-passive-{}", std::process::id()));
        let dom = Fabric::open().unwrap().domain().unwrap();
        let (cq, ctl_cq) = (dom.cq_open(&CqAttr::default()).unwrap(), dom.cq_open(&CqAttr::default()).unwrap());
        let av = dom.av_open().unwrap();
        let (data, ctl) = (open(&dom, &cq, &av), open(&dom, &ctl_cq, &av));
        let a = av.insert(&[data.getname(), ctl.getname()]).unwrap();
        ctl.set_passive(true).unwrap();
        let mut b = [0u8; 4];
        // SAFETY: b outlives the receive, completed below.
        unsafe { ctl.trecv(&mut b, FI_ADDR_UNSPEC, 7, 0, 1).unwrap() };
        data.tinject(b"ping", a[1], 7).unwrap();
        let mut e = [CqTaggedEntry::default()];
        for _ in 0..100 {
            dom.progress().unwrap();
            assert_eq!(cq.read(&mut e).unwrap_err(), Error::AGAIN);
        }
        assert_eq!(ctl.stats().unwrap().rx_ring, 0, "the passive endpoint's ring was not read");
        ctl.set_passive(false).unwrap();
        dom.progress().unwrap();
        assert_eq!(ctl_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, &b), (1, b"ping"));
    }

    /// A stream read through arrays smaller than it: the first read's
    /// pass takes at most 16 inline messages from the ring (the rest wait there,
    /// for the next reads' passes), writes what fits into the read's
    /// array and queues the rest in the CQ; every message completes once,
    /// in order, into its own buffer (48 messages read through arrays of
    /// 16, then 16 through arrays of 4 with receives posted into the slots
    /// the first round used, then 48 through an array of 64, which a read
    /// fills 16 at a time).
    #[test]
    fn stream_read_in_small_arrays_completes_in_order() {
        std::env::set_var("SHMFAB_JOB_ID", format!("ep-fullsink-{}", std::process::id()));
        let dom = Fabric::open().unwrap().domain().unwrap();
        let (cq, tx_cq) = (dom.cq_open(&CqAttr::default()).unwrap(), dom.cq_open(&CqAttr::default()).unwrap());
        let (av, tx_av) = (dom.av_open().unwrap(), dom.av_open().unwrap());
        let rx = open(&dom, &cq, &av);
        let tx = open(&dom, &tx_cq, &tx_av);
        let to = tx_av.insert(&[rx.getname()]).unwrap()[0];
        let mut bufs = [[0u8; 8]; 48];
        for (k, (array, n)) in [(16usize, 48usize), (4, 16), (64, 48)].into_iter().enumerate() {
            for (i, b) in bufs[..n].iter_mut().enumerate() {
                // SAFETY: bufs outlive the completions, all read below.
                unsafe { rx.trecv(b, FI_ADDR_UNSPEC, 9, 0, 100 * k + i).unwrap() };
            }
            for i in 0..n {
                tx.tinject(&(i as u64).to_le_bytes(), to, 9).unwrap();
            }
            let before = rx.stats().unwrap().rx_ring;
            let mut e = vec![CqTaggedEntry::default(); array];
            let mut got = 0;
            while got < n {
                let m = match cq.read(&mut e) {
                    Ok(m) => m,
                    Err(x) if x == Error::AGAIN => continue,
                    Err(x) => panic!("read: {x}"),
                };
                if got == 0 {
                    assert_eq!(m, array.min(16), "the first read fills its array, 16 entries at most");
                    let taken = rx.stats().unwrap().rx_ring - before;
                    assert_eq!(taken as usize, 16, "the first read's pass takes 16 messages of the stream");
                }
                for x in &e[..m] {
                    assert_eq!(x.op_context, 100 * k + got, "in order, each once");
                    got += 1;
                }
            }
            for (i, b) in bufs[..n].iter().enumerate() {
                assert_eq!(u64::from_le_bytes(*b), i as u64, "message {i} in its own buffer");
            }
            assert_eq!(cq.read(&mut [CqTaggedEntry::default()]).unwrap_err(), Error::AGAIN);
        }
    }

    /// Two endpoints of one domain, each with its CQ and AV, each
    /// addressing the other (a job id of `name` and the pid). Field order
    /// is drop order: the endpoints first.
    struct Duo {
        a: Endpoint,
        b: Endpoint,
        cqa: CompletionQueue,
        cqb: CompletionQueue,
        _avs: (crate::AddressVector, crate::AddressVector),
        to_b: FiAddr,
        to_a: FiAddr,
        _dom: Domain,
    }

    fn duo(name: &str) -> Duo {
        std::env::set_var("SHMFAB_JOB_ID", format!("{name}-{}", std::process::id()));
        let dom = Fabric::open().unwrap().domain().unwrap();
        let (cqa, cqb) = (dom.cq_open(&CqAttr::default()).unwrap(), dom.cq_open(&CqAttr::default()).unwrap());
        let (ava, avb) = (dom.av_open().unwrap(), dom.av_open().unwrap());
        let (a, b) = (open(&dom, &cqa, &ava), open(&dom, &cqb, &avb));
        let to_b = ava.insert(&[b.getname()]).unwrap()[0];
        let to_a = avb.insert(&[a.getname()]).unwrap()[0];
        Duo { a, b, cqa, cqb, _avs: (ava, avb), to_b, to_a, _dom: dom }
    }

    /// A ping-pong between two endpoints (in one process, as two ranks'
    /// would be) of 8 B to 3000 B messages, tagged and checked: every
    /// message arrives whole and in order while the answers take lap ends
    /// (`crate::ring`, "Lap ends": seen here as each side's ring tail at a
    /// lap's start after an answer, more than 20 times; 2 with
    /// `SHMFAB_RING_LAP=0`, where only a message ending there counts), the
    /// lap ends' long cell counts read by the receive paths.
    #[test]
    fn a_ping_pong_across_lap_ends_keeps_every_message() {
        let d = duo("ep-laps");
        let (a, b, cqa, cqb, to_b, to_a) = (&d.a, &d.b, &d.cqa, &d.cqb, d.to_b, d.to_a);
        let sizes = [8usize, 64, 200, 1000, 3000];
        let mut laps = [0usize; 2];
        let wait = |cq: &CompletionQueue, want: usize| {
            let mut e = [CqTaggedEntry::default()];
            loop {
                match cq.read(&mut e) {
                    Ok(1) if e[0].flags & FI_RECV != 0 => return e[0],
                    Ok(_) => continue,
                    Err(x) if x == Error::AGAIN => continue,
                    Err(x) => panic!("read: {x} (waiting for {want})"),
                }
            }
        };
        let mut rbuf = vec![0u8; 3000];
        for i in 0..1200usize {
            let len = sizes[(i / 40) % sizes.len()];
            let msg: Vec<u8> = (0..len).map(|k| (k * 31 + i) as u8).collect();
            for (side, (tx, to, rx, rcq, rfrom)) in
                [(&a, to_b, &b, &cqb, to_a), (&b, to_a, &a, &cqa, to_b)].into_iter().enumerate()
            {
                // SAFETY: rbuf outlives the completion waited for below.
                unsafe { rx.trecv(&mut rbuf[..len], rfrom, i as u64, 0, i).unwrap() };
                // SAFETY: msg outlives the receive's completion, waited for
                // below, which follows the send's reading of it.
                unsafe { tx.tsend(&msg, to, i as u64, 0).unwrap() };
                let e = wait(rcq, i);
                assert_eq!((e.op_context, e.len, e.tag), (i, len, i as u64), "message {i} of side {side}");
                assert_eq!(&rbuf[..len], &msg[..], "payload of message {i} of side {side}");
                let (t, cap) = with_ring(tx, to, |r| (r.tail(), r.cap())).unwrap();
                laps[side] += (t % cap == 0) as usize;
            }
        }
        assert!(laps.iter().all(|&n| n > 20), "lap ends taken: {laps:?}");
    }

    /// A stream of 16 KiB messages (posted in windows, the receiver idle
    /// while each goes out) goes as the receiver's stream pick answers:
    /// by rendezvous at first, the ordinary way (eagerly through the pool)
    /// with one rendezvous asking again per window once it picks the pool,
    /// by rendezvous again after two reads by single copy in a row. Every
    /// message arrives whole, in order, whichever way it went.
    #[test]
    fn a_stream_goes_the_way_its_receiver_picks() {
        let d = duo("ep-streamway");
        let (a, b, cqa, cqb, to_b, to_a) = (&d.a, &d.b, &d.cqa, &d.cqb, d.to_b, d.to_a);
        fn addr_of(ep: &Endpoint) -> Result<shm_layout::Address> {
            with_ep!(ep, |st, _ctx| Ok(st.addr))
        }
        fn set_pick(
            rx: &Endpoint,
            from: shm_layout::Address,
            class: usize,
            stream: bool,
            k: crate::proto::PathPick,
        ) -> Result<()> {
            with_ep!(rx, |st, _ctx| {
                let p = st.peers.index_of(from);
                *(if stream { &mut st.peers[p].stream_pick.pick[class] } else { &mut st.peers[p].pick[class] }) = k;
                Ok(())
            })
        }
        let a_addr = addr_of(a).unwrap();
        const LEN: usize = 16 << 10;
        const W: usize = 12;
        let class = crate::proto::pick_class(&crate::proto::Config::default(), LEN).unwrap();
        // The receiver's measure of a's streams in the class: single copy
        // (ns per byte) against the pool.
        let prefer = |stream: bool, pool: bool| {
            let mut k = crate::proto::PathPick::default();
            // The preferred path at 1 ns a message: the samples the
            // window itself takes (a few us each here, in one process)
            // cannot move the pick.
            let (fast, slow) = (std::time::Duration::from_nanos(1), std::time::Duration::from_micros(9));
            for via_pool in [false, false, true, true] {
                k.record(via_pool, if via_pool == pool { fast } else { slow }, LEN);
            }
            set_pick(b, a_addr, class, stream, k).unwrap()
        };
        let drain = |cq: &CompletionQueue, want: usize| {
            let mut got = Vec::new();
            let mut e = [CqTaggedEntry::default()];
            let t0 = std::time::Instant::now();
            while got.len() < want {
                match cq.read(&mut e) {
                    Ok(1) => got.push(e[0]),
                    Ok(_) => {}
                    Err(x) if x == Error::AGAIN => assert!(t0.elapsed().as_secs() < 30, "stuck at {}", got.len()),
                    Err(x) => panic!("read: {x}"),
                }
            }
            got
        };
        // Both buffers at one offset in their pages (from mmap, both
        // large): never in the kernel copy's slow band (crate::copy),
        // which the receiver would take through the pool.
        let mut rbuf = vec![0u8; LEN * W];
        let mut sbuf = vec![0u8; LEN * W];
        let mut n = 0usize;
        // One window: W sends posted while b is idle; the rendezvous sends
        // among them counted at the sender; then b takes all, and a its
        // completions (the answers to a's rendezvous come in meanwhile).
        let mut window = |what: &str| -> (u64, u64) {
            let before = (a.stats().unwrap(), b.stats().unwrap());
            for k in 0..W {
                // SAFETY: rbuf outlives the completions drained below.
                unsafe { b.trecv(&mut rbuf[k * LEN..][..LEN], to_a, 5, 0, k).unwrap() };
            }
            for (i, x) in sbuf.iter_mut().enumerate() {
                *x = (i * 7 + n) as u8;
            }
            for m in sbuf.chunks(LEN) {
                // SAFETY: sbuf outlives the sends' completions, drained
                // below.
                unsafe { a.tsend(m, to_b, 5, 0).unwrap() };
            }
            let rx = drain(cqb, W);
            for (k, e) in rx.iter().enumerate() {
                assert_eq!((e.op_context, e.len), (k, LEN), "{what}: receive {k}");
                assert!(rbuf[k * LEN..][..LEN] == sbuf[k * LEN..][..LEN], "{what}: payload {k}");
            }
            drain(cqa, W);
            n += W;
            let after = (a.stats().unwrap(), b.stats().unwrap());
            (after.0.tx_rndv - before.0.tx_rndv, after.1.cma_reads - before.1.cma_reads)
        };
        // The first of each window goes with nothing under way: not a
        // stream's, and picked for by the other measure, which prefers
        // single copy here (a rendezvous read each window: a pick of the
        // pool would send the next windows' firsts eagerly, and quiet).
        prefer(false, false);
        prefer(true, true);
        let run = crate::engine::tx::EAGER_RUN as usize;
        assert!(W > run + 2);
        assert_eq!(window("at first"), (W as u64, 1), "every send by rendezvous, the stream's through the pool");
        assert_eq!(window("the pool picked"), (2, 1), "the run, one asking again, the rest while it asks");
        prefer(true, false);
        assert_eq!(window("single copy picked"), (2, 2), "the pool's way after one read (the asking send's)");
        assert_eq!(window("after one read"), (2, 2), "the first stream send asks at once: its read is the second");
        assert_eq!(window("single copy again"), (W as u64, W as u64), "every send by rendezvous, read by single copy");
        prefer(true, true);
        assert_eq!(window("the pool again"), (W as u64, 1), "each answered through the pool (posted before answers)");
        assert_eq!(window("its run"), (2, 1));
    }

    /// A piped message from `tx` to `to` (whose ring `tx` claimed by an
    /// earlier send), as `RingTx::push_piped` writes one but stopped after
    /// its first `upto` bytes: the sender descheduled mid-message. `hlen`
    /// is the length its header says (the payload's, unless a test lies).
    fn pipe_partial(
        tx: &Endpoint,
        to: FiAddr,
        tag: u64,
        hlen: usize,
        payload: &[u8],
        upto: usize,
    ) -> Result<crate::ring::PipeWrite> {
        pipe_partial_with(tx, to, shm_layout::hdr_flags::TAGGED, tag, hlen, payload, upto)
    }

    /// [`pipe_partial`] with the header's flags (0: untagged).
    fn pipe_partial_with(
        tx: &Endpoint,
        to: FiAddr,
        flags: u8,
        tag: u64,
        hlen: usize,
        payload: &[u8],
        upto: usize,
    ) -> Result<crate::ring::PipeWrite> {
        let h = shm_layout::MsgHdr { op: shm_layout::op::EAGER, flags, len: hlen as u32, tag, ..Default::default() };
        with_ring(tx, to, |r| {
            let w = r.begin_piped(&h, payload.len()).expect("an empty ring has room");
            if upto > 0 {
                r.pipe_write(&w, 0, &payload[..upto]);
            }
            w
        })
    }

    /// Runs `f` on `tx`'s ring to `to` (claimed by an earlier send).
    fn with_ring<R>(tx: &Endpoint, to: FiAddr, f: impl FnOnce(&mut crate::ring::RingTx) -> R) -> Result<R> {
        with_ep!(tx, |ep, _ctx| {
            let p = ep.peers.cached(to).expect("sent to before");
            let Some(crate::engine::peers::Chan::Ring(r)) = ep.peers[p].chan.as_mut() else { panic!("no ring") };
            Ok(f(r))
        })
    }

    /// The rest of a [`pipe_partial`] message, from `from`.
    fn pipe_rest(tx: &Endpoint, to: FiAddr, w: &crate::ring::PipeWrite, payload: &[u8], from: usize) -> Result<()> {
        with_ring(tx, to, |r| r.pipe_write(w, from, &payload[from..]))
    }

    /// Whether the endpoint's inbound queues hold work for a pass (what a
    /// sleeper asks before it sleeps).
    fn has_work(ep: &Endpoint) -> bool {
        fn ready(ep: &Endpoint) -> Result<bool> {
            with_ep!(ep, |st, _ctx| Ok(st.inbound.ready(&st.sec)))
        }
        ready(ep).unwrap()
    }

    struct PipePair {
        dom: Domain,
        rx_cq: CompletionQueue,
        // Field order is drop order: endpoints before their SRQ.
        rx: Endpoint,
        tx: Endpoint,
        /// The receiver's shared receive queue for tagged receives
        /// ([`pipe_pair_srq`]).
        srq: Option<crate::SharedRecvQueue>,
        to: FiAddr,
    }

    /// Two endpoints of one domain, the sender's ring to the receiver
    /// claimed by a first small message (received and read).
    fn pipe_pair(name: &str) -> PipePair {
        pipe_pair_with(name, false)
    }

    /// [`pipe_pair`] whose receiver takes its tagged receives from a
    /// shared receive queue (the first message's too).
    fn pipe_pair_srq(name: &str) -> PipePair {
        pipe_pair_with(name, true)
    }

    fn pipe_pair_with(name: &str, srq: bool) -> PipePair {
        std::env::set_var("SHMFAB_JOB_ID", format!("ep-pipe-{name}-{}", std::process::id()));
        let dom = Fabric::open().unwrap().domain().unwrap();
        let (rx_cq, tx_cq) = (dom.cq_open(&CqAttr::default()).unwrap(), dom.cq_open(&CqAttr::default()).unwrap());
        let (av, tx_av) = (dom.av_open().unwrap(), dom.av_open().unwrap());
        let srq = srq.then(|| dom.srq_open(&crate::SrqAttr::default()).unwrap());
        let rx = dom.endpoint().unwrap();
        rx.bind_cq(&rx_cq, FI_TRANSMIT | FI_RECV).unwrap();
        rx.bind_av(&av).unwrap();
        if let Some(q) = &srq {
            rx.bind_srq_for(q, FI_TAGGED).unwrap();
        }
        rx.enable().unwrap();
        let tx = open(&dom, &tx_cq, &tx_av);
        let to = tx_av.insert(&[rx.getname()]).unwrap()[0];
        let mut b = [0u8; 8];
        // SAFETY: b outlives the completion read below.
        unsafe {
            match &srq {
                Some(q) => q.trecv(&mut b, FI_ADDR_UNSPEC, 1, 0, 99).unwrap(),
                None => rx.trecv(&mut b, FI_ADDR_UNSPEC, 1, 0, 99).unwrap(),
            }
        };
        tx.tinject(b"hello", to, 1).unwrap();
        dom.progress().unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, &b[..5]), (99, &b"hello"[..]));
        std::mem::forget(tx_cq);
        PipePair { dom, rx_cq, rx, tx, srq, to }
    }

    fn payload(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + seed as usize) as u8).collect()
    }

    /// A matched receive takes a piped message's pieces as they land: with
    /// the sender stopped after its first piece, the pass copies that piece
    /// and leaves (no completion; no work for a sleeper meanwhile); the
    /// rest completes it with every byte, counted as piped.
    #[test]
    fn piped_message_is_copied_as_it_lands() {
        let t = pipe_pair("land");
        let msg = payload(12000, 3);
        let mut buf = vec![0u8; 12000];
        // SAFETY: buf outlives the completion read below.
        unsafe { t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 7, 0, 1).unwrap() };
        let w = pipe_partial(&t.tx, t.to, 7, msg.len(), &msg, 4096).unwrap();
        assert!(has_work(&t.rx), "a published piped message is work at first");
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "not whole: no completion");
        assert!(!has_work(&t.rx), "waiting for its sender: no work for a sleeper");
        pipe_rest(&t.tx, t.to, &w, &msg, 4096).unwrap();
        assert!(has_work(&t.rx), "whole: work again");
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len, e[0].tag), (1, 12000, 7));
        assert!(buf == msg, "every byte, in place");
        let st = t.rx.stats().unwrap();
        assert_eq!(st.rx_piped, 1);
        // The ring goes on: a plain message after it.
        let mut b = [0u8; 8];
        // SAFETY: b outlives the completion read below.
        unsafe { t.rx.trecv(&mut b, FI_ADDR_UNSPEC, 8, 0, 2).unwrap() };
        t.tx.tinject(b"after", t.to, 8).unwrap();
        t.dom.progress().unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, &b[..5]), (2, &b"after"[..]));
        assert!(!has_work(&t.rx));
    }

    /// A piped message that nothing matches waits, unread, while its
    /// sender writes it; a receive posted meanwhile takes it at the next
    /// pass (it parks, the sender being stopped) and gets the rest as it
    /// lands: into a receive of three segments cut across its pieces.
    #[test]
    fn piped_message_matched_while_being_written() {
        let t = pipe_pair("unexp");
        let msg = payload(16000, 5);
        let w = pipe_partial(&t.tx, t.to, 9, msg.len(), &msg, 5000).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        assert!(!has_work(&t.rx));
        let (mut a, mut b, mut c) = (vec![0u8; 3000], vec![0u8; 5000], vec![0u8; 8000]);
        {
            let mut iov = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b), IoSliceMut::new(&mut c)];
            // SAFETY: a, b and c outlive the completion read below.
            unsafe { t.rx.trecvv(&mut iov, FI_ADDR_UNSPEC, 9, 0, 3).unwrap() };
        }
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "posted, but the message is not whole");
        pipe_rest(&t.tx, t.to, &w, &msg, 5000).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len), (3, 16000));
        assert!(a == msg[..3000] && b == msg[3000..8000] && c == msg[8000..], "every segment");
        assert_eq!(t.rx.stats().unwrap().rx_piped, 1);
    }

    /// A piped message longer than its receive: the pieces that land are
    /// copied up to the receive's length and no further (the buffer past
    /// it untouched), and the completion reports the truncation.
    #[test]
    fn piped_message_truncated_to_its_receive() {
        let t = pipe_pair("trunc");
        let msg = payload(12000, 11);
        let mut buf = vec![0xeeu8; 9000];
        // SAFETY: buf outlives the completion read below.
        unsafe { t.rx.trecv(&mut buf[..5000], FI_ADDR_UNSPEC, 4, 0, 4).unwrap() };
        let w = pipe_partial(&t.tx, t.to, 4, msg.len(), &msg, 8192).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        pipe_rest(&t.tx, t.to, &w, &msg, 8192).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
        let x = t.rx_cq.readerr().unwrap();
        assert_eq!((x.op_context, x.len, x.olen, x.err), (4, 5000, 7000, ErrorKind::Trunc.errno()));
        assert!(buf[..5000] == msg[..5000], "the receive's bytes");
        assert!(buf[5000..].iter().all(|&b| b == 0xee), "nothing past the receive");
    }

    /// The peer's counts are not trusted: a progress word past the
    /// header's length is clamped to it (the receive gets the header's
    /// length, no more), and a header whose length does not fit its cells
    /// is dropped as a broken message, the ring going on after it.
    #[test]
    fn piped_progress_and_length_from_a_broken_peer_are_checked() {
        let t = pipe_pair("broken");
        let msg = payload(8192, 13);
        let mut buf = vec![0xeeu8; 8192];
        // SAFETY: buf outlives the completion read below.
        unsafe { t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 5, 0, 5).unwrap() };
        // Cells for 8192 bytes, a header saying 4096: the progress word
        // goes to 8192.
        let w = pipe_partial(&t.tx, t.to, 5, 4096, &msg, 1000).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        pipe_rest(&t.tx, t.to, &w, &msg, 1000).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len), (5, 4096));
        assert!(buf[..4096] == msg[..4096] && buf[4096..].iter().all(|&b| b == 0xee), "the header's length only");
        // A header longer than its cells: dropped, the receive stays posted.
        let mut b2 = vec![0u8; 1 << 20];
        // SAFETY: b2 outlives the completion read below.
        unsafe { t.rx.trecv(&mut b2, FI_ADDR_UNSPEC, 6, 0, 6).unwrap() };
        let w = pipe_partial(&t.tx, t.to, 6, 1 << 20, &msg, 0).unwrap();
        pipe_rest(&t.tx, t.to, &w, &msg, 0).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "dropped, not delivered");
        t.tx.tinject(b"next", t.to, 6).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len, &b2[..4]), (6, 4, &b"next"[..]));
    }

    /// A sender gone mid-message (here its endpoint closed after the first
    /// piece; a process killed there is the real case) never finishes it:
    /// the peer check drops the message and fails its matched receive, as
    /// it fails whatever else is pending with a dead peer.
    #[test]
    fn piped_message_of_a_gone_sender_fails_its_receive() {
        let t = pipe_pair("gone");
        let msg = payload(16384, 17);
        let mut buf = vec![0u8; 16384];
        // SAFETY: buf outlives the completion read below.
        unsafe { t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 3, 0, 7).unwrap() };
        pipe_partial(&t.tx, t.to, 3, msg.len(), &msg, 4096).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        t.tx.close().unwrap();
        let t0 = std::time::Instant::now();
        let err = loop {
            match t.rx_cq.read(&mut e) {
                Err(x) if x.kind() == ErrorKind::Avail => break t.rx_cq.readerr().unwrap(),
                Err(x) if x.kind() == ErrorKind::Again => {}
                other => panic!("unexpected {other:?}"),
            }
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the receive never failed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        assert_eq!((err.op_context, err.prov_errno), (7, crate::cq::prov::PEER_GONE));
        let st = t.rx.stats().unwrap();
        assert_eq!((st.pipes_dropped, st.rx_piped), (1, 0));
        assert!(!has_work(&t.rx), "nothing left");
    }

    /// A piped message matched, while being written, by a receive of a
    /// shared receive queue waits for its pieces as one of the endpoint's
    /// own would (parked in the receive order), then completes whole with
    /// the SRQ receive's context.
    #[test]
    fn piped_message_parked_in_a_shared_receive_queue_receive() {
        let t = pipe_pair_srq("srq");
        let srq = t.srq.as_ref().expect("an SRQ");
        let mut e = [CqTaggedEntry::default()];
        let msg = payload(16384, 31);
        let mut buf = vec![0u8; 16384];
        // SAFETY: buf outlives the completion read below.
        unsafe { srq.trecv(&mut buf, FI_ADDR_UNSPEC, 3, 0, 7).unwrap() };
        let w = pipe_partial(&t.tx, t.to, 3, msg.len(), &msg, 4096).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "the first piece only");
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "parked: still waiting");
        pipe_rest(&t.tx, t.to, &w, &msg, 4096).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len), (7, 16384));
        assert!(buf == msg, "every byte");
        assert_eq!(t.rx.stats().unwrap().rx_piped, 1);
    }

    /// A piped message matched, while being written, by a multi-receive
    /// buffer takes the buffer's first piece and waits for its pieces; a
    /// message behind it in the ring takes the next piece once it is
    /// whole, and the buffer stays posted (no FI_MULTI_RECV yet).
    #[test]
    fn piped_message_parked_in_a_multi_receive_buffer() {
        let t = pipe_pair("multi");
        let msg = payload(12000, 37);
        let mut buf = vec![0u8; 65536];
        {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let mut m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 5, tag: 0, ignore: 0 };
            // SAFETY: buf outlives the completions read below.
            unsafe { t.rx.recvmsg(&mut m, FI_MULTI_RECV).unwrap() };
        }
        let w = pipe_partial_with(&t.tx, t.to, 0, 0, msg.len(), &msg, 8192).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        t.tx.inject(b"behind", t.to).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "behind the unfinished one");
        pipe_rest(&t.tx, t.to, &w, &msg, 8192).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len, e[0].flags & FI_MULTI_RECV), (5, 12000, 0));
        assert_eq!(e[0].buf, buf.as_ptr() as usize, "the buffer's first piece");
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len, e[0].flags & FI_MULTI_RECV), (5, 6, 0));
        assert_eq!(e[0].buf, buf.as_ptr() as usize + 12000, "the next piece");
        assert!(buf[..12000] == msg[..] && &buf[12000..12006] == b"behind");
        assert_eq!(t.rx.stats().unwrap().rx_piped, 1);
    }

    /// The peer check of a sender we never mapped (we only received from
    /// it) maps its region to look; a failure that says nothing of the
    /// peer (our descriptor or memory limits) is no proof it is gone: its
    /// unfinished piped message is kept and its receive stays posted over
    /// several checks, and once it finishes the message completes whole.
    /// (Found by review: such a failure dropped the live sender's message.)
    #[test]
    fn a_failed_look_at_a_live_sender_drops_nothing() {
        use crate::engine::peers::CONNECT_FAILS;
        let t = pipe_pair("look");
        let msg = payload(16384, 29);
        let mut buf = vec![0u8; 16384];
        // SAFETY: buf outlives the completion read below.
        unsafe { t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 3, 0, 8).unwrap() };
        let w = pipe_partial(&t.tx, t.to, 3, msg.len(), &msg, 4096).unwrap();
        let mut e = [CqTaggedEntry::default()];
        let checks = t.dom.config().peer_check * 4;
        for kind in [ErrorKind::Other, ErrorKind::NoMem] {
            CONNECT_FAILS.with(|f| f.set(Some(kind)));
            let t0 = std::time::Instant::now();
            while t0.elapsed() < checks {
                assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "{kind:?}: nothing fails");
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        CONNECT_FAILS.with(|f| f.set(None));
        assert_eq!(t.rx.stats().unwrap().pipes_dropped, 0);
        pipe_rest(&t.tx, t.to, &w, &msg, 4096).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len), (8, 16384));
        assert!(buf == msg, "every byte");
    }

    /// A raw ring message from `tx` to `to` (a protocol message written by
    /// hand).
    fn push_raw(tx: &Endpoint, to: FiAddr, h: shm_layout::MsgHdr, pl: &[u8]) -> Result<()> {
        with_ring(tx, to, |r| assert!(r.try_push(&h, &[pl])))
    }

    /// A piped message that nothing matches until it is whole goes to
    /// the unexpected queue then, as any inline message, and a receive
    /// posted after finds it there.
    #[test]
    fn unexpected_piped_message_is_queued_once_whole() {
        let t = pipe_pair("unexp-whole");
        let msg = payload(10000, 23);
        let w = pipe_partial(&t.tx, t.to, 9, msg.len(), &msg, 4096).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        pipe_rest(&t.tx, t.to, &w, &msg, 4096).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "whole, but no receive yet");
        assert!(!has_work(&t.rx), "queued unexpected: the ring is empty");
        let mut buf = vec![0u8; 10000];
        // SAFETY: buf outlives the completion read below.
        unsafe { t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 9, 0, 3).unwrap() };
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len), (3, 10000));
        assert!(buf == msg);
        assert_eq!(t.rx.stats().unwrap().rx_piped, 1);
    }

    /// Piped messages parked one after the other (each matched, its sender
    /// stopped mid-message) behind an earlier message of the same peer
    /// still arriving (a pool message whose chunks have not come): each
    /// keeps its own place in the peer's order, and every completion comes,
    /// in order, once the earlier one ends. (Found by review: both parked
    /// under one id, the second's completion overwrote the first's and its
    /// own place stayed empty for good, holding back every later one.)
    #[test]
    fn parked_piped_messages_keep_their_places_behind_a_pool_message() {
        let t = pipe_pair("two-parked");
        let (mut a, mut b, mut c, mut d) = (vec![0u8; 100], vec![0u8; 12000], vec![0u8; 12000], [0u8; 8]);
        // SAFETY: the buffers outlive the reads below.
        unsafe {
            t.rx.trecv(&mut a, FI_ADDR_UNSPEC, 1, 0, 11).unwrap();
            t.rx.trecv(&mut b, FI_ADDR_UNSPEC, 2, 0, 12).unwrap();
            t.rx.trecv(&mut c, FI_ADDR_UNSPEC, 3, 0, 13).unwrap();
            t.rx.trecv(&mut d, FI_ADDR_UNSPEC, 4, 0, 14).unwrap();
        }
        // A: a pool message's header; its chunk comes last.
        let mut pl = [0u8; shm_layout::wire::BounceHdr::WIRE];
        shm_layout::wire::BounceHdr { msg_id: 77, total: 100 }.encode(&mut pl).unwrap();
        let h = shm_layout::MsgHdr {
            op: shm_layout::op::BOUNCE_HDR,
            flags: shm_layout::hdr_flags::TAGGED,
            tag: 1,
            ..Default::default()
        };
        push_raw(&t.tx, t.to, h, &pl).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        let (mb, mc) = (payload(12000, 1), payload(12000, 2));
        for (tag, m) in [(2, &mb), (3, &mc)] {
            let w = pipe_partial(&t.tx, t.to, tag, m.len(), m, 4096).unwrap();
            assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "parked");
            pipe_rest(&t.tx, t.to, &w, m, 4096).unwrap();
            assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "whole, held behind A");
        }
        t.tx.tinject(b"dddd", t.to, 4).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "held behind A");
        // A ends: a chunk whose index the receiver refuses fails it.
        let h = shm_layout::MsgHdr { op: shm_layout::op::CHUNK, tag: 77, len: 100, ..Default::default() };
        push_raw(&t.tx, t.to, h, &u32::MAX.to_le_bytes()).unwrap();
        let mut got = Vec::new();
        for _ in 0..50 {
            match t.rx_cq.read(&mut e) {
                Ok(_) => got.push((e[0].op_context, true)),
                Err(x) if x.kind() == ErrorKind::Avail => got.push((t.rx_cq.readerr().unwrap().op_context, false)),
                Err(_) => {}
            }
        }
        assert_eq!(got, vec![(11, false), (12, true), (13, true), (14, true)], "every completion, in order");
        assert!(b == mb && c == mc && &d[..4] == b"dddd");
    }

    /// A parked piped message that its sender finished before closing its
    /// endpoint (a last message, then finalize) goes to its own receive,
    /// even when the peer check runs first in the pass that finds it whole
    /// (a receiver waking from a sleep). (Found by review: the check's
    /// cleanup forgot the parked receive, the message went to the next
    /// posted one and the parked one failed as if its sender had died.)
    #[test]
    fn finished_piped_message_of_a_closed_sender_goes_to_its_receive() {
        let t = pipe_pair("closed-whole");
        let msg = payload(16384, 17);
        let (mut buf, mut other) = (vec![0u8; 16384], vec![0u8; 16384]);
        // SAFETY: the buffers outlive the reads below.
        unsafe {
            t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 3, 0, 7).unwrap();
            t.rx.trecv(&mut other, FI_ADDR_UNSPEC, 3, 0, 8).unwrap();
        }
        let w = pipe_partial(&t.tx, t.to, 3, msg.len(), &msg, 4096).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "parked");
        pipe_rest(&t.tx, t.to, &w, &msg, 4096).unwrap();
        t.tx.close().unwrap();
        // The next pass checks peers first, as after a sleep.
        fn age(ep: &Endpoint) -> Result<()> {
            with_ep!(ep, |st, _ctx| {
                st.check_soon();
                st.last_check = std::time::Instant::now() - std::time::Duration::from_secs(10);
                Ok(())
            })
        }
        age(&t.rx).unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap(), 1);
        assert_eq!((e[0].op_context, e[0].len), (7, 16384), "the parked receive gets it");
        assert!(buf == msg);
        assert_eq!(t.rx.stats().unwrap().pipes_dropped, 0);
        // The other receive stays posted: nothing more came.
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
    }

    /// An unmatched piped message whose sender is gone mid-message is
    /// dropped by the peer check, though nothing else is pending with that
    /// peer; a wildcard receive posted after it stays posted for live
    /// senders. (Found by review: the check skipped the peer, and the
    /// receive matched the stuck message, then failed as if its sender
    /// were its own.)
    #[test]
    fn unmatched_piped_message_of_a_gone_sender_is_dropped() {
        let t = pipe_pair("gone-unmatched");
        let msg = payload(16384, 1);
        pipe_partial(&t.tx, t.to, 3, msg.len(), &msg, 4096).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
        t.tx.close().unwrap();
        let t0 = std::time::Instant::now();
        while t.rx.stats().unwrap().pipes_dropped == 0 {
            assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN);
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "never dropped");
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let mut buf = vec![0u8; 16384];
        // SAFETY: buf outlives the reads below.
        unsafe { t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 0, u64::MAX, 9).unwrap() };
        for _ in 0..100 {
            assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "the wildcard receive stays posted");
        }
        assert!(!has_work(&t.rx));
    }

    /// A broken peer's protocol message may not take the id of parked
    /// piped messages.
    #[test]
    fn the_parked_pipe_id_is_never_a_peers() {
        let rx = crate::engine::complete::PeerRx::new();
        assert!(rx.has(crate::progress::PIPE_ID) && rx.has(0) && !rx.has(1));
    }

    /// An endpoint closed while a receive waits parked on a piped message
    /// (its sender stopped mid-message) cancels that receive, as it
    /// cancels every receive matched and not complete.
    #[test]
    fn close_cancels_a_parked_piped_receive() {
        let t = pipe_pair("close-parked");
        let msg = payload(12000, 29);
        let mut buf = vec![0u8; 12000];
        // SAFETY: buf outlives the close below, which ends the receive.
        unsafe { t.rx.trecv(&mut buf, FI_ADDR_UNSPEC, 5, 0, 31).unwrap() };
        pipe_partial(&t.tx, t.to, 5, msg.len(), &msg, 4096).unwrap();
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "parked");
        t.rx.close().unwrap();
        t.dom.progress().unwrap();
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
        let x = t.rx_cq.readerr().unwrap();
        assert_eq!((x.op_context, x.err), (31, ErrorKind::Canceled.errno()));
        assert_eq!(t.rx_cq.read(&mut e).unwrap_err(), Error::AGAIN, "nothing else");
    }
}
