//! Shared receive queues, as dat_srq_post_recv(3) and libfabric's shared
//! receive context: one queue of posted buffers that every endpoint bound to
//! it takes its untagged receives from, whichever peer a message comes from.
//!
//! - [`SharedRecvQueue::post_recv`] is non-blocking and allocation-free: the
//!   queue's room (its maximum, up to [`SRQ_MAX_IOV`] segments per buffer) is
//!   reserved when it is opened or resized; a full queue gives `-FI_EAGAIN`.
//! - A message fills the buffer's segments in order: every front segment
//!   completely, at most one partly, the rest untouched.
//! - The completion goes to the receive CQ (and counter) of the endpoint that
//!   dequeued the buffer, with that endpoint's flags; its context is the
//!   cookie given at posting. Completions of one connection (sending
//!   endpoint to receiving endpoint) come in send order; there is no order
//!   between connections.
//! - A message that finds the queue empty waits as an unexpected message of
//!   its endpoint (within the endpoint's budget; past it, back-pressure to the
//!   sender) and takes the next buffer posted.
//! - Low watermark: when a dequeue leaves fewer buffers posted than the
//!   watermark, one [`SrqEvent::LowWatermark`] is queued on the SRQ
//!   ([`SharedRecvQueue::read_event`], [`SharedRecvQueue::wait_event`]);
//!   [`SharedRecvQueue::set_low_watermark`] arms it again.
//! - An endpoint closed with buffers it dequeued but has not completed
//!   flushes them to its CQ as `FI_ECANCELED` error entries; one closed
//!   with [`crate::Endpoint::close_discard`] puts them back at the front
//!   of the queue instead, still posted. Closing the SRQ
//!   while endpoints are bound to it is `Busy`.

use crate::domain::{Domain, DomainInner};
use crate::engine::matching::Dest;
use crate::engine::request::{Iov, Iovs};
use crate::error::{Error, ErrorKind, Result};
use shm_layout::MAX_IOV;
use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Buffers posted and not yet dequeued.
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

/// A posted buffer.
#[derive(Clone, Copy)]
pub(crate) struct SrqBuf {
    cookie: usize,
    n: usize,
    segs: [Iov; SRQ_MAX_IOV],
}

/// In-domain state of an SRQ.
pub(crate) struct SrqState {
    max: usize,
    lw: usize,
    armed: bool,
    posted: VecDeque<SrqBuf>,
    events: VecDeque<SrqEvent>,
    /// Section indices of the endpoints bound (they hold their unexpected
    /// messages, which a new buffer serves first). As long as the SRQ's
    /// binding count in its table: each endpoint binds it once.
    pub eps: Vec<usize>,
    /// Where the last search for an unexpected message started (fairness
    /// between the endpoints).
    pub next_ep: usize,
    /// Segment lists of dequeued buffers with more than [`MAX_IOV`]
    /// segments, referenced by their `Dest` until completion (boxes: their
    /// address does not move when the list grows, which a Dest relies on).
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
        SrqState {
            max: attr.max_recv,
            lw: attr.low_watermark,
            armed: attr.low_watermark > 0,
            posted: VecDeque::with_capacity(attr.max_recv),
            events: VecDeque::new(),
            eps: Vec::new(),
            next_ep: 0,
            ext: Vec::new(),
            ext_free: Vec::new(),
        }
    }

    /// Buffers posted.
    pub fn len(&self) -> usize {
        self.posted.len()
    }

    /// Dequeues the oldest buffer for a message (any endpoint, any peer).
    #[inline]
    pub fn take(&mut self) -> Option<Dest> {
        let b = self.posted.pop_front()?;
        if self.armed && self.posted.len() < self.lw {
            self.armed = false;
            self.events.push_back(SrqEvent::LowWatermark { posted: self.posted.len(), low_watermark: self.lw });
        }
        Some(self.dest_of(&b))
    }

    fn dest_of(&mut self, b: &SrqBuf) -> Dest {
        let iovs = if b.n <= MAX_IOV {
            let mut v = Iovs::default();
            v.v[..b.n].copy_from_slice(&b.segs[..b.n]);
            v.n = b.n;
            v
        } else {
            let slot = match self.ext_free.pop() {
                Some(s) => s as usize,
                None => {
                    self.ext.push(Box::new([Iov::default(); SRQ_MAX_IOV]));
                    self.ext.len() - 1
                }
            };
            let list = &mut self.ext[slot];
            list.copy_from_slice(&b.segs);
            // SAFETY-relevant invariant: the box stays in `ext` (its address
            // fixed) until `release` gets `slot` back, and the SRQ state
            // outlives every endpoint bound to it (close is Busy, a dropped
            // handle only orphans it), so the Dest never dangles.
            Iovs::external(list.as_ptr(), b.n, slot)
        };
        let total = iovs.total();
        Dest {
            ctx: b.cookie,
            iovs,
            cap: total,
            buf: b.segs[0].ptr,
            multi_release: false,
            cqe: true,
            dw: crate::engine::complete::Dw::NONE,
        }
    }

    /// Buffers an endpoint dequeued and closed without filling (a close
    /// that discards, see `progress::flush_rx`) go back to the front of the
    /// queue, in their order, still posted: no completion is written for
    /// them. They may take the queue past its maximum for a while (posts
    /// are then refused until it drains).
    pub fn give_back(&mut self, dests: &[Dest]) {
        for d in dests.iter().rev() {
            let segs = d.iovs.segs();
            let mut b = SrqBuf { cookie: d.ctx, n: segs.len(), segs: [Iov::default(); SRQ_MAX_IOV] };
            b.segs[..segs.len()].copy_from_slice(segs);
            self.release(&d.iovs);
            self.posted.push_front(b);
        }
    }

    /// A completed (or flushed) receive gives back its segment list.
    #[inline]
    pub fn release(&mut self, iovs: &Iovs) {
        if let Some(slot) = iovs.ext_slot() {
            self.ext_free.push(slot as u32);
        }
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

/// A message waiting unexpected at an endpoint bound to SRQ `id` (they wait
/// only while the queue is empty) takes the oldest buffer, if one is
/// posted; returns whether one did. Called after a buffer is posted (or
/// given back).
pub(crate) fn serve(dom: &DomainInner, st: &mut crate::domain::DomainState, id: usize) -> Result<bool> {
    let Some(q) = st.srqs.get(id).filter(|q| !q.posted.is_empty()) else {
        return Ok(false);
    };
    let n = q.eps.len();
    let start = if n == 0 { 0 } else { q.next_ep % n };
    for k in 0..n {
        let ei = st.srqs.get(id).expect("checked").eps[(start + k) % n];
        if st.eps[ei].as_ref().is_some_and(|e| e.matching.has_untagged_unexp()) {
            st.srqs.get_mut(id).expect("checked").next_ep = (start + k + 1) % n;
            return dom.with_ep(st, ei, |ep, ctx| {
                let dest = ctx.srqs.get_mut(id).expect("checked").take().expect("checked non-empty");
                let u = ep.matching.pop_untagged_unexp().expect("checked non-empty");
                crate::progress::deliver_unexp(ep, ctx, u, dest, false);
                Ok(true)
            });
        }
    }
    Ok(false)
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

    /// dat_srq_post_recv: posts a buffer of up to [`SRQ_MAX_IOV`] segments;
    /// `cookie` comes back as the completion's `op_context` (it need not be
    /// unique). `-FI_EAGAIN` when `max_recv` buffers are posted. A message
    /// already waiting at a bound endpoint takes the buffer at once.
    ///
    /// # Safety
    /// The segments must stay valid and untouched until the buffer's
    /// completion (success, error or flush) is read.
    pub unsafe fn post_recv(&self, iov: &mut [IoSliceMut<'_>], cookie: usize) -> Result<()> {
        if iov.is_empty() || iov.len() > SRQ_MAX_IOV {
            return Err(Error::with(
                ErrorKind::Inval,
                format!("an SRQ buffer has 1..={SRQ_MAX_IOV} segments, got {}", iov.len()),
            ));
        }
        let mut b = SrqBuf { cookie, n: iov.len(), segs: [Iov::default(); SRQ_MAX_IOV] };
        for (d, s) in b.segs.iter_mut().zip(iov.iter_mut()) {
            *d = Iov { ptr: s.as_mut_ptr() as usize, len: s.len() };
        }
        let (dom, id) = (&self.dom, self.id);
        self.with(|st| {
            let q = st.srqs.get_mut(id).expect("checked");
            if q.posted.len() >= q.max {
                return Err(Error::with(ErrorKind::Again, format!("all {} SRQ buffers are posted", q.max)));
            }
            q.posted.push_back(b);
            serve(dom, st, id)?;
            Ok(())
        })
    }

    /// fi_cancel on a shared receive context: the first buffer still
    /// posted whose cookie is `cookie` leaves the queue and completes as an
    /// `FI_ECANCELED` error entry in the receive CQ (and counter) of the
    /// endpoint bound first, as libfabric's shared receive contexts report
    /// it (the SRQ has no CQ of its own). Returns whether one was found: a
    /// buffer already dequeued completes as usual, and with no endpoint
    /// bound there is nowhere to report, so nothing is cancelled.
    pub fn cancel(&self, cookie: usize) -> Result<bool> {
        let (dom, id) = (&self.dom, self.id);
        self.with(|st| {
            let q = st.srqs.get_mut(id).expect("checked");
            let Some(&ei) = q.eps.first() else { return Ok(false) };
            let Some(i) = q.posted.iter().position(|b| b.cookie == cookie) else { return Ok(false) };
            let b = q.posted.remove(i).expect("index from position");
            let d = q.dest_of(&b);
            q.release(&d.iovs);
            dom.with_ep(st, ei, |ep, ctx| {
                let why = (ErrorKind::Canceled, crate::cq::prov::CANCELED, "receive cancelled".to_string());
                crate::engine::complete::unused_rx(&ep.bind, ctx, &d, false, why);
                Ok(true)
            })
        })
    }

    /// Posts a one-segment buffer.
    ///
    /// # Safety
    /// As [`SharedRecvQueue::post_recv`].
    pub unsafe fn post(&self, buf: &mut [u8], cookie: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.post_recv(&mut [IoSliceMut::new(buf)], cookie) }
    }

    /// dat_srq_query: posted count, maximum, low watermark (after a progress
    /// pass, so the count is current).
    pub fn query(&self) -> Result<SrqInfo> {
        let dom = &self.dom;
        self.with(|st| {
            dom.progress(st);
            let q = st.srqs.get(self.id).expect("checked");
            Ok(SrqInfo {
                posted: q.posted.len(),
                max_recv: q.max,
                low_watermark: q.lw,
                armed: q.armed,
                endpoints: q.eps.len(),
            })
        })
    }

    /// dat_srq_resize: a new maximum, grown or shrunk; never below the
    /// buffers posted now (`Busy`) or the low watermark (`Inval`). Memory
    /// for the new room is reserved here.
    pub fn resize(&self, max_recv: usize) -> Result<()> {
        check_depth(max_recv)?;
        self.with(|st| {
            let q = st.srqs.get_mut(self.id).expect("checked");
            if max_recv < q.posted.len() {
                return Err(Error::with(
                    ErrorKind::Busy,
                    format!("{} buffers are posted: cannot shrink the SRQ to {max_recv}", q.posted.len()),
                ));
            }
            check_lw(q.lw, max_recv)?;
            if max_recv > q.posted.capacity() {
                q.posted.reserve_exact(max_recv - q.posted.len());
            } else {
                q.posted.shrink_to(max_recv);
            }
            q.max = max_recv;
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

    fn buf(segs: &[(usize, usize)], cookie: usize) -> SrqBuf {
        let mut b = SrqBuf { cookie, n: segs.len(), segs: [Iov::default(); SRQ_MAX_IOV] };
        for (d, &(ptr, len)) in b.segs.iter_mut().zip(segs) {
            *d = Iov { ptr, len };
        }
        b
    }

    #[test]
    fn low_watermark_fires_once_per_arming() {
        let mut q = SrqState::new(&SrqAttr { max_recv: 8, low_watermark: 3 });
        for c in 0..5 {
            q.posted.push_back(buf(&[(0x1000, 8)], c));
        }
        assert!(q.take().is_some()); // 4 left
        assert!(q.take().is_some()); // 3 left: not below
        assert!(q.events.is_empty());
        assert!(q.take().is_some()); // 2 left: below
        assert_eq!(q.events.pop_front(), Some(SrqEvent::LowWatermark { posted: 2, low_watermark: 3 }));
        assert!(q.take().is_some());
        assert!(q.events.is_empty(), "fires once per arming");
        q.armed = true;
        assert!(q.take().is_some());
        assert_eq!(q.events.len(), 1);
        assert!(q.take().is_none());
    }

    #[test]
    fn many_segments_go_external_and_come_back() {
        let mut q = SrqState::new(&SrqAttr { max_recv: 4, low_watermark: 0 });
        let segs: Vec<(usize, usize)> = (0..16).map(|i| (0x10000 + i * 0x100, i + 1)).collect();
        q.posted.push_back(buf(&segs, 7));
        q.posted.push_back(buf(&segs[..3], 8));
        let d = q.take().unwrap();
        assert_eq!(d.ctx, 7);
        assert_eq!(d.iovs.segs().len(), 16);
        assert_eq!(d.iovs.segs()[15].len, 16);
        assert_eq!(d.cap, (1..=16).sum::<usize>());
        assert_eq!(d.iovs.ext_slot(), Some(0));
        let d2 = q.take().unwrap();
        assert_eq!((d2.iovs.segs().len(), d2.iovs.ext_slot(), d2.cap), (3, None, 6));
        q.release(&d.iovs);
        q.posted.push_back(buf(&segs, 9));
        let d3 = q.take().unwrap();
        assert_eq!(d3.iovs.ext_slot(), Some(0), "slot reused");
        assert_eq!(q.ext.len(), 1);
    }
}
