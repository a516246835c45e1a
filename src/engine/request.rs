//! Operations as values: one [`Request`] type with an [`OpKind`], its
//! buffers, destination, context, tag, data and flags, and one submit path
//! ([`EpState::submit`](super::EpState::submit)). The kind alone decides
//! the completion flags ([`OpKind::completion_flags`]), the counter a
//! completion counts on ([`OpKind::counter`]) and, with the size, the
//! protocol ([`crate::proto::choose`]). Deferred work stores requests,
//! collectives are schedules of them, and the C provider's `fi_msg*`
//! structs map onto them.

use super::complete::{CntrKind, Dw};
use crate::flags::*;
use shm_layout::MAX_IOV;

/// What an operation does: the kind of a request, which decides its
/// completion flags, its counter and (with its size) its protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// fi_send and friends.
    Msg,
    /// fi_tsend and friends.
    Tagged,
    /// fi_read (not built yet: refused with `-FI_ENOSYS` at submission).
    Read,
    /// fi_write (not built yet).
    Write,
    /// fi_atomic (not built yet).
    Atomic,
    /// fi_fetch_atomic (not built yet).
    FetchAtomic,
    /// fi_compare_atomic (not built yet).
    CompareAtomic,
    /// Deferred counter add (not built yet).
    CntrAdd,
    /// Deferred counter set (not built yet).
    CntrSet,
}

impl OpKind {
    /// Whether the operation matches by tag at the target.
    #[inline(always)]
    pub fn tagged(self) -> bool {
        self == OpKind::Tagged
    }

    /// Whether shmfab carries this kind today.
    #[inline(always)]
    pub fn supported(self) -> bool {
        matches!(self, OpKind::Msg | OpKind::Tagged)
    }

    /// The flags of the initiator's completion entry (fi_cq(3)): the one
    /// place they are decided.
    #[inline(always)]
    pub fn completion_flags(self) -> u64 {
        match self {
            OpKind::Msg => FI_SEND | FI_MSG,
            OpKind::Tagged => FI_SEND | FI_TAGGED,
            OpKind::Read => FI_RMA | FI_READ,
            OpKind::Write => FI_RMA | FI_WRITE,
            OpKind::Atomic => FI_ATOMIC | FI_WRITE,
            OpKind::FetchAtomic | OpKind::CompareAtomic => FI_ATOMIC | FI_READ,
            OpKind::CntrAdd | OpKind::CntrSet => 0,
        }
    }

    /// The initiator's counter a completion of this kind counts on.
    #[inline(always)]
    pub(crate) fn counter(self) -> Option<CntrKind> {
        match self {
            OpKind::Msg | OpKind::Tagged => Some(CntrKind::Send),
            OpKind::Read | OpKind::FetchAtomic | OpKind::CompareAtomic => Some(CntrKind::Read),
            OpKind::Write | OpKind::Atomic => Some(CntrKind::Write),
            OpKind::CntrAdd | OpKind::CntrSet => None,
        }
    }
}

/// Flags a transmit request may carry.
pub(crate) const SEND_FLAGS: u64 =
    FI_REMOTE_CQ_DATA | FI_COMPLETION | FI_INJECT | SHMFAB_SOLICITED | crate::flags::FI_DELIVERY_COMPLETE;

/// One operation, as submitted. Borrowed for the call: what must outlive it
/// (the segments of a queued transmit, or a copy for inject) goes into the
/// transmit record.
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    pub kind: OpKind,
    /// The buffer of a one-buffer call (`iov` is then None), else unused.
    pub one: Iov,
    /// The segments of an iov call (at most [`MAX_IOV`]).
    pub iov: Option<&'a Iovs>,
    pub dest: FiAddr,
    pub context: usize,
    pub tag: u64,
    pub data: u64,
    /// A subset of [`SEND_FLAGS`] (checked at the API). FI_INJECT: the
    /// buffer may be reused on return (the payload is copied if it cannot
    /// leave at once).
    pub flags: u64,
    /// An inject call (fi_inject and friends): no CQ entry on success; an
    /// error gives an error entry with no context (counters count both).
    /// A send with FI_INJECT alone completes as any send.
    pub silent: bool,
    /// Deferred work's reporting ([`Dw::NONE`] for an ordinary call).
    pub dw: Dw,
}

impl Request<'_> {
    /// Total payload bytes.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.iov.map_or(self.one.len, |v| v.total())
    }

    /// FI_DELIVERY_COMPLETE: the completion waits until the receiver has
    /// the data in its buffer (the send goes by rendezvous).
    #[inline(always)]
    pub fn deliver(&self) -> bool {
        self.flags & crate::flags::FI_DELIVERY_COMPLETE != 0
    }

    /// Whether the buffer may be reused on return (FI_INJECT).
    #[inline(always)]
    pub fn inject(&self) -> bool {
        self.flags & FI_INJECT != 0
    }

    /// The segments, built only where a record needs them.
    #[inline]
    pub fn iovs(&self) -> Iovs {
        self.iov.copied().unwrap_or_else(|| Iovs::one(self.one.ptr, self.one.len))
    }

    /// The wire header flags.
    #[inline(always)]
    pub fn hdr_flags(&self) -> u8 {
        let mut h = 0;
        if self.kind.tagged() {
            h |= shm_layout::hdr_flags::TAGGED;
        }
        if self.flags & FI_REMOTE_CQ_DATA != 0 {
            h |= shm_layout::hdr_flags::REMOTE_CQ_DATA;
        }
        if self.flags & SHMFAB_SOLICITED != 0 {
            h |= shm_layout::hdr_flags::SOLICITED;
        }
        h
    }
}

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
    pub fn of(buf: &[u8]) -> Iov {
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
            crate::copy::copy_slice(&mut dst[at..at + n], src);
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
