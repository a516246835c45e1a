//! Triggered operations and the domain's deferred work queue
//! (fi_trigger(3)) over the library's (`shmfab::Endpoint::triggered`,
//! `shmfab::Domain::queue_work`, `cancel_work`, `flush_work`).
//!
//! **FI_TRIGGER** on `fi_recvmsg`, `fi_trecvmsg`, `fi_sendmsg`,
//! `fi_tsendmsg`, `fi_writemsg`,
//! `fi_readmsg`, `fi_atomicmsg`, `fi_fetch_atomicmsg` and
//! `fi_compare_atomicmsg`: the message's context is a `struct
//! fi_triggered_context` (event FI_TRIGGER_THRESHOLD; FI_TRIGGER_XPU is
//! `-FI_ENOSYS`, anything else `-FI_EINVAL`), and the completion's
//! `op_context` is that same pointer (fi_trigger(3): it replaces the
//! `fi_context`). The structure is only read, at the call; the
//! application keeps it, and the buffers, until the operation completes.
//! A triggered receive is posted when it fires (a message that arrived
//! before waits as unexpected); FI_MULTI_RECV and the probe flags with
//! FI_TRIGGER are `-FI_ENOSYS`. `fi_cancel` with the triggered context
//! cancels a triggered operation (any kind) that has not fired: it never
//! runs and completes as an FI_ECANCELED error entry.
//!
//! **`fi_control` on the domain**: FI_QUEUE_WORK (`struct
//! fi_deferred_work *`, every `fi_op_type`; a deferred receive,
//! FI_OP_RECV or FI_OP_TRECV, counts its completion counter when its
//! message has arrived), FI_CANCEL_WORK (the
//! same struct: 0 when it was taken off the queue, `-FI_ENOENT` when it is
//! no longer queued: it ran, or was cancelled or flushed), FI_FLUSH_WORK
//! (arg NULL: all deferred work of the domain; a `struct fid_cntr *`, or
//! a `struct fi_deferred_work *` whose `triggering_cntr` names one: the
//! work waiting on that counter). The provider keeps the library's id of
//! queued work in the work struct's `context` (fi_trigger(3) lets it), so
//! the struct must not be changed while queued. Buffers named by the work
//! are read or written when it fires; the op structs (and their iov
//! arrays) are read at FI_QUEUE_WORK only, but fi_trigger(3) asks the
//! application to keep them until completion, which is harmless here.
//!
//! The library takes one local buffer per atomic (operands, compares,
//! results): `fi_ioc` segments must be adjacent in memory (always true of
//! one segment); scattered operands or compares are accepted with
//! FI_INJECT (copied now), scattered results are `-FI_ENOSYS`.

use crate::ep::Segs;
use crate::sys;
use crate::util::{self, EINVAL, ENOSYS};
use shmfab::{AtomicMsg, AtomicOp, AtomicType, DeferredOp, DeferredWork, RecvMsg, RmaIoc, RmaIov, SendMsg, Trigger};
use shmfab::{Counter, WorkId};
use std::ffi::{c_int, c_void};
use std::io::{IoSlice, IoSliceMut};

const EOPNOTSUPP: c_int = -(sys::FI_EOPNOTSUPP as c_int);
const ENOENT: c_int = -sys::FI_ENOENT;
const DATA: sys::fi_log_subsys = sys::FI_LOG_EP_DATA;

/// Flags of a triggered or deferred operation that the library does not
/// take: the trigger itself and FI_MORE (a hint).
const DROP: u64 = sys::FI_TRIGGER | sys::FI_MORE;

/// Send flags for the library (as `ep.rs` gives its sends):
/// FI_TRANSMIT_COMPLETE and FI_INJECT_COMPLETE hold for every send and
/// are dropped; FI_DELIVERY_COMPLETE goes through (the fired send then
/// completes once the receiver has the data).
fn send_flags(f: u64) -> Result<u64, c_int> {
    Ok(f & !(DROP | sys::FI_TRANSMIT_COMPLETE | sys::FI_INJECT_COMPLETE))
}

/// One-sided flags for the library.
fn rma_flags(f: u64) -> u64 {
    f & !DROP
}

/// The trigger of a triggered operation's context.
///
/// # Safety
/// `ctx` null or a valid `struct fi_triggered_context` (fi_trigger(3)).
unsafe fn trigger<'a>(ctx: *mut c_void) -> Result<Trigger<'a>, c_int> {
    // SAFETY: caller's contract.
    let Some(t) = (unsafe { ctx.cast::<sys::fi_triggered_context>().as_ref() }) else { return Err(EINVAL) };
    match t.event_type {
        sys::FI_TRIGGER_THRESHOLD => {}
        sys::FI_TRIGGER_XPU => {
            util::log(sys::FI_LOG_WARN, DATA, "FI_TRIGGER: FI_TRIGGER_XPU is not supported");
            return Err(ENOSYS);
        }
        _ => return Err(EINVAL),
    }
    // SAFETY: the event type says the union holds a threshold.
    let th = unsafe { t.trigger.threshold };
    // SAFETY: the counter is null or a live fid (fi_trigger(3)); `of`
    // checks that it is one of ours.
    let Some(c) = (unsafe { crate::cntr::of(th.cntr.cast()) }) else { return Err(EINVAL) };
    Ok(Trigger { cntr: &c.cntr, threshold: th.threshold as u64 })
}

/// The endpoint behind a fid.
///
/// # Safety
/// `ep` null or a live fid.
unsafe fn endpoint<'a>(ep: *mut sys::fid_ep) -> Result<&'a shmfab::Endpoint, c_int> {
    // SAFETY: caller's contract.
    unsafe { crate::ep::of(ep.cast()) }.map(|e| &e.ep).ok_or(EINVAL)
}

/// The source filter of a receive on `ep` (null or a live fid): `src`
/// with FI_DIRECTED_RECV, else FI_ADDR_UNSPEC (fi_msg(3): the address is
/// ignored), as the endpoint's untriggered receives take it.
///
/// # Safety
/// `ep` null or a live fid.
unsafe fn rx_src(ep: *mut sys::fid_ep, src: u64) -> u64 {
    // SAFETY: caller's contract.
    unsafe { crate::ep::of(ep.cast()) }.map_or(src, |e| e.src(src))
}

/// The counter behind a fid.
///
/// # Safety
/// `c` null or a live fid.
unsafe fn counter<'a>(c: *mut sys::fid_cntr) -> Result<&'a Counter, c_int> {
    // SAFETY: caller's contract.
    unsafe { crate::cntr::of(c.cast()) }.map(|c| &c.cntr).ok_or(EINVAL)
}

/// An iovec array's segments ([`crate::ep::Segs`]; -FI_EINVAL for a bad
/// array).
///
/// # Safety
/// `iov` null or valid for `count` entries, each segment valid for its
/// length.
unsafe fn slices<'a>(iov: *const sys::iovec, count: usize) -> Result<Segs<IoSlice<'a>>, c_int> {
    // SAFETY: caller's contract.
    unsafe { crate::ep::slices(iov, count) }.ok_or(EINVAL)
}

/// As [`slices`], to receive into (the library keeps raw segments; the
/// array itself is never written).
///
/// # Safety
/// As [`slices`]; the segments writable until the operation completes.
unsafe fn slices_mut<'a>(iov: *const sys::iovec, count: usize) -> Result<Segs<IoSliceMut<'a>>, c_int> {
    // SAFETY: caller's contract.
    unsafe { crate::ep::slices_mut(iov, count) }.ok_or(EINVAL)
}

/// Remote segments of an RMA.
///
/// # Safety
/// `v` null or valid for `n` entries.
unsafe fn rma_iovs(v: *const sys::fi_rma_iov, n: usize) -> Result<Vec<RmaIov>, c_int> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if v.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: caller's contract.
    let s = unsafe { std::slice::from_raw_parts(v, n) };
    Ok(s.iter().map(|r| RmaIov { addr: r.addr, len: r.len, key: r.key }).collect())
}

/// A local buffer of an atomic: the application's, or a copy (FI_INJECT).
enum Buf {
    App(*mut u8, usize),
    Copy(Vec<u8>),
}

impl Buf {
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::App(_, 0) => &[],
            // SAFETY: the application's segment, valid for reads until
            // the operation completes (fi_atomic(3)).
            Buf::App(p, n) => unsafe { std::slice::from_raw_parts(*p, *n) },
            Buf::Copy(v) => v,
        }
    }

    /// The application's segment to write the fetched values to.
    ///
    /// # Safety
    /// Only for an `App` result buffer, valid for writes until the
    /// operation completes.
    unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        match *self {
            Buf::App(_, 0) | Buf::Copy(_) => &mut [],
            // SAFETY: caller's contract.
            Buf::App(p, n) => unsafe { std::slice::from_raw_parts_mut(p, n) },
        }
    }
}

/// `fi_ioc` segments as one buffer: adjacent segments (or one) are the
/// application's memory; scattered ones are copied when `copy` (FI_INJECT
/// operands), else `-FI_ENOSYS` (the library takes one buffer).
///
/// # Safety
/// `v` null or valid for `n` entries, each valid for `count * size` bytes.
unsafe fn ioc_buf(v: *const sys::fi_ioc, n: usize, size: usize, copy: bool, what: &str) -> Result<Buf, c_int> {
    if n == 0 {
        return Ok(Buf::App(std::ptr::null_mut(), 0));
    }
    if v.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: caller's contract.
    let s = unsafe { std::slice::from_raw_parts(v, n) };
    let segs: Vec<(*mut u8, usize)> =
        s.iter().map(|i| (i.addr.cast::<u8>(), i.count.saturating_mul(size))).filter(|x| x.1 > 0).collect();
    let Some(&(start, _)) = segs.first() else { return Ok(Buf::App(std::ptr::null_mut(), 0)) };
    if segs.iter().any(|s| s.0.is_null()) {
        return Err(EINVAL);
    }
    let mut end = start as usize;
    let mut adjacent = true;
    for &(p, l) in &segs {
        adjacent &= p as usize == end;
        end = (p as usize).wrapping_add(l);
    }
    if adjacent {
        return Ok(Buf::App(start, end - start as usize));
    }
    if copy {
        let mut out = Vec::new();
        for &(p, l) in &segs {
            // SAFETY: caller's contract.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(p, l) });
        }
        return Ok(Buf::Copy(out));
    }
    util::log(
        sys::FI_LOG_WARN,
        DATA,
        &format!("triggered or deferred atomic: {what} segments must be adjacent in memory (one buffer)"),
    );
    Err(ENOSYS)
}

/// An atomic's description, owning what [`AtomicMsg`] borrows.
struct Atom {
    dt: AtomicType,
    op: AtomicOp,
    buf: Buf,
    remote: Vec<RmaIoc>,
    dest: u64,
    context: usize,
    data: u64,
}

impl Atom {
    /// Reads `m` (with the call's `flags`).
    ///
    /// # Safety
    /// `m` as fi_atomic(3) says for the `*msg` calls.
    unsafe fn new(m: &sys::fi_msg_atomic, flags: u64) -> Result<Atom, c_int> {
        let dt = u8::try_from(m.datatype).ok().and_then(AtomicType::from_raw);
        let op = u8::try_from(m.op).ok().and_then(AtomicOp::from_raw);
        let (Some(dt), Some(op)) = (dt, op) else { return Err(EOPNOTSUPP) };
        let inject = flags & sys::FI_INJECT != 0;
        // SAFETY: caller's contract.
        let buf = unsafe { ioc_buf(m.msg_iov, m.iov_count, dt.size(), inject, "operand") }?;
        let remote = if m.rma_iov_count == 0 {
            Vec::new()
        } else if m.rma_iov.is_null() {
            return Err(EINVAL);
        } else {
            // SAFETY: caller's contract.
            let s = unsafe { std::slice::from_raw_parts(m.rma_iov, m.rma_iov_count) };
            s.iter().map(|r| RmaIoc { addr: r.addr, count: r.count, key: r.key }).collect()
        };
        Ok(Atom { dt, op, buf, remote, dest: m.addr, context: m.context as usize, data: m.data })
    }

    fn msg(&self) -> AtomicMsg<'_> {
        AtomicMsg {
            dt: self.dt,
            op: self.op,
            buf: self.buf.bytes(),
            rma_ioc: &self.remote,
            dest: self.dest,
            context: self.context,
            data: self.data,
        }
    }

    /// The fetch buffer (results), one adjacent run of segments.
    ///
    /// # Safety
    /// `v` null or valid for `n` writable segments.
    unsafe fn result(&self, v: *const sys::fi_ioc, n: usize) -> Result<Buf, c_int> {
        // SAFETY: caller's contract.
        unsafe { ioc_buf(v, n, self.dt.size(), false, "result") }
    }

    /// The compare operands.
    ///
    /// # Safety
    /// `v` null or valid for `n` segments.
    unsafe fn compare(&self, v: *const sys::fi_ioc, n: usize, flags: u64) -> Result<Buf, c_int> {
        // SAFETY: caller's contract.
        unsafe { ioc_buf(v, n, self.dt.size(), flags & sys::FI_INJECT != 0, "compare") }
    }
}

/// The result of a library call as the C calls' return.
fn status(r: shmfab::Result<()>, what: &str) -> isize {
    util::status(r, DATA, what) as isize
}

/// Evaluates to the value of a `Result<_, c_int>`, or returns its error
/// from the enclosing data call.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e as isize,
        }
    };
}

// ---- FI_TRIGGER on the endpoint's calls ---------------------------------

/// `fi_sendmsg` / `fi_tsendmsg` (`tag` for the tagged one) with
/// FI_TRIGGER.
///
/// # Safety
/// libfabric's contract for those calls, `ctx` a `struct
/// fi_triggered_context` kept until the send completes.
#[allow(clippy::too_many_arguments)]
unsafe fn send(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    count: usize,
    dest: u64,
    ctx: *mut c_void,
    data: u64,
    tag: Option<u64>,
    flags: u64,
) -> isize {
    // SAFETY: the caller's contract (each line).
    let e = tri!(unsafe { endpoint(ep) });
    let t = tri!(unsafe { trigger(ctx) });
    let v = tri!(unsafe { slices(iov, count) });
    let f = tri!(send_flags(flags));
    let m = SendMsg { iov: &v, dest, context: ctx as usize, data, tag: tag.unwrap_or(0) };
    let tr = e.triggered(t);
    // SAFETY: fi_msg(3)/fi_trigger(3): the buffers stay valid and
    // unchanged until the send completes.
    let r = unsafe {
        if tag.is_some() {
            tr.tsendmsg(m, f)
        } else {
            tr.sendmsg(m, f)
        }
    };
    status(r, "triggered send")
}

/// `fi_sendmsg` with FI_TRIGGER (called by `ep.rs`).
///
/// # Safety
/// libfabric's contract: `ep` a live fid, `msg` null or valid, its
/// context a `struct fi_triggered_context`.
pub(crate) unsafe fn sendmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg, flags: u64) -> isize {
    // SAFETY: caller's contract.
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: as above.
    unsafe { send(ep, m.msg_iov, m.iov_count, m.addr, m.context, m.data, None, flags) }
}

/// `fi_tsendmsg` with FI_TRIGGER (called by `ep.rs`).
///
/// # Safety
/// As [`sendmsg`].
pub(crate) unsafe fn tsendmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_tagged, flags: u64) -> isize {
    // SAFETY: caller's contract.
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: as above.
    unsafe { send(ep, m.msg_iov, m.iov_count, m.addr, m.context, m.data, Some(m.tag), flags) }
}

/// Receive flags for the library: the trigger and FI_MORE dropped;
/// FI_COMPLETION kept; FI_MULTI_RECV and the probes passed on, for the
/// library to refuse (`-FI_ENOSYS`).
fn recv_flags(f: u64) -> u64 {
    f & !DROP
}

/// `fi_recvmsg` / `fi_trecvmsg` (`tagged`) with FI_TRIGGER.
///
/// # Safety
/// libfabric's contract: `ep` a live fid; `iov` valid for `count`
/// writable segments kept until the receive completes; `ctx` a `struct
/// fi_triggered_context` kept as long.
#[allow(clippy::too_many_arguments)]
unsafe fn recv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    count: usize,
    src: u64,
    ctx: *mut c_void,
    tag: u64,
    ignore: u64,
    flags: u64,
    tagged: bool,
) -> isize {
    // SAFETY: the caller's contract (each line).
    let e = tri!(unsafe { endpoint(ep) });
    let t = tri!(unsafe { trigger(ctx) });
    let mut v = tri!(unsafe { slices_mut(iov, count) });
    // SAFETY: `ep` checked live just above.
    let src = unsafe { rx_src(ep, src) };
    let m = RecvMsg { iov: &mut v, src, context: ctx as usize, tag, ignore };
    let tr = e.triggered(t);
    // SAFETY: fi_msg(3)/fi_tagged(3)/fi_trigger(3): the buffers stay
    // valid and untouched until the receive completes.
    let r = unsafe {
        if tagged {
            tr.trecvmsg(m, recv_flags(flags))
        } else {
            tr.recvmsg(m, recv_flags(flags))
        }
    };
    status(r, "triggered receive")
}

/// `fi_recvmsg` with FI_TRIGGER (called by `ep.rs`): posted when the
/// trigger's counter reaches its threshold; its completion's `op_context`
/// is the triggered context.
///
/// # Safety
/// libfabric's contract: `ep` a live fid, `msg` null or valid, its
/// context a `struct fi_triggered_context`.
pub(crate) unsafe fn recvmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg, flags: u64) -> isize {
    // SAFETY: caller's contract.
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: as above.
    unsafe { recv(ep, m.msg_iov, m.iov_count, m.addr, m.context, 0, 0, flags, false) }
}

/// `fi_trecvmsg` with FI_TRIGGER (called by `ep.rs`), as [`recvmsg`].
///
/// # Safety
/// As [`recvmsg`], for `struct fi_msg_tagged`.
pub(crate) unsafe fn trecvmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_tagged, flags: u64) -> isize {
    // SAFETY: caller's contract.
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: as above.
    unsafe { recv(ep, m.msg_iov, m.iov_count, m.addr, m.context, m.tag, m.ignore, flags, true) }
}

/// `fi_writemsg` with FI_TRIGGER (called by `ep.rs`).
///
/// # Safety
/// As [`sendmsg`], for `struct fi_msg_rma`.
pub(crate) unsafe fn writemsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    // SAFETY: caller's contract (each line).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let e = tri!(unsafe { endpoint(ep) });
    let t = tri!(unsafe { trigger(m.context) });
    let v = tri!(unsafe { slices(m.msg_iov, m.iov_count) });
    let r = tri!(unsafe { rma_iovs(m.rma_iov, m.rma_iov_count) });
    // SAFETY: fi_rma(3): the buffers stay valid and unchanged until the
    // write completes.
    let res = unsafe { e.triggered(t).writemsg(&v, &r, m.addr, m.context as usize, m.data, rma_flags(flags)) };
    status(res, "triggered fi_writemsg")
}

/// `fi_readmsg` with FI_TRIGGER (called by `ep.rs`).
///
/// # Safety
/// As [`writemsg`].
pub(crate) unsafe fn readmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    // SAFETY: caller's contract (each line).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let e = tri!(unsafe { endpoint(ep) });
    let t = tri!(unsafe { trigger(m.context) });
    let mut v = tri!(unsafe { slices_mut(m.msg_iov, m.iov_count) });
    let r = tri!(unsafe { rma_iovs(m.rma_iov, m.rma_iov_count) });
    // SAFETY: fi_rma(3): the buffers stay valid and untouched until the
    // read completes.
    let res = unsafe { e.triggered(t).readmsg(&mut v, &r, m.addr, m.context as usize, rma_flags(flags)) };
    status(res, "triggered fi_readmsg")
}

/// `fi_atomicmsg` with FI_TRIGGER (called by `atomic.rs`).
///
/// # Safety
/// As [`sendmsg`], for `struct fi_msg_atomic`.
pub(crate) unsafe fn atomicmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_atomic, flags: u64) -> isize {
    // SAFETY: caller's contract (each line).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let e = tri!(unsafe { endpoint(ep) });
    let t = tri!(unsafe { trigger(m.context) });
    let a = tri!(unsafe { Atom::new(m, flags) });
    // SAFETY: fi_atomic(3): the operands stay valid and unchanged until
    // the atomic completes (or were copied: FI_INJECT).
    let res = unsafe { e.triggered(t).atomicmsg(a.msg(), rma_flags(flags)) };
    status(res, "triggered fi_atomicmsg")
}

/// `fi_fetch_atomicmsg` with FI_TRIGGER (called by `atomic.rs`).
///
/// # Safety
/// As [`atomicmsg`]; `resultv` valid for `result_count` writable
/// segments kept until the atomic completes.
pub(crate) unsafe fn fetch_atomicmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_atomic,
    resultv: *const sys::fi_ioc,
    result_count: usize,
    flags: u64,
) -> isize {
    // SAFETY: caller's contract (each line).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let e = tri!(unsafe { endpoint(ep) });
    let t = tri!(unsafe { trigger(m.context) });
    let a = tri!(unsafe { Atom::new(m, flags) });
    let res = tri!(unsafe { a.result(resultv, result_count) });
    // SAFETY: as above; the result segment is the application's.
    let r = unsafe { e.triggered(t).fetch_atomicmsg(a.msg(), res.bytes_mut(), rma_flags(flags)) };
    status(r, "triggered fi_fetch_atomicmsg")
}

/// `fi_compare_atomicmsg` with FI_TRIGGER (called by `atomic.rs`).
///
/// # Safety
/// As [`fetch_atomicmsg`]; `comparev` valid for `compare_count` segments.
pub(crate) unsafe fn compare_atomicmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_atomic,
    comparev: *const sys::fi_ioc,
    compare_count: usize,
    resultv: *const sys::fi_ioc,
    result_count: usize,
    flags: u64,
) -> isize {
    // SAFETY: caller's contract (each line).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let e = tri!(unsafe { endpoint(ep) });
    let t = tri!(unsafe { trigger(m.context) });
    let a = tri!(unsafe { Atom::new(m, flags) });
    let cmp = tri!(unsafe { a.compare(comparev, compare_count, flags) });
    let res = tri!(unsafe { a.result(resultv, result_count) });
    // SAFETY: as above.
    let r = unsafe { e.triggered(t).compare_atomicmsg(a.msg(), cmp.bytes(), res.bytes_mut(), rma_flags(flags)) };
    status(r, "triggered fi_compare_atomicmsg")
}

// ---- fi_control on the domain -------------------------------------------

/// Marks a `fi_deferred_work` this provider queued: its context's first
/// word (the second is the domain, the third the library's `WorkId`).
static QUEUED: u8 = 0;

/// The deferred-work commands of `fi_control` on a domain (the domain's
/// `control` passes them here): FI_QUEUE_WORK, FI_CANCEL_WORK,
/// FI_FLUSH_WORK (the module's comment); anything else `-FI_ENOSYS`.
///
/// # Safety
/// libfabric's contract: `fid` one of ours, `arg` as the command says.
pub(crate) unsafe extern "C" fn domain_control(fid: *mut sys::fid, command: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(d) = (unsafe { crate::domain::of(fid) }) else { return EINVAL };
    let w = arg.cast::<sys::fi_deferred_work>();
    // SAFETY (each command): arg is null or what the command takes
    // (fi_trigger(3)).
    let r = match command as u32 {
        sys::FI_QUEUE_WORK => unsafe { queue_work(d, w) },
        sys::FI_CANCEL_WORK => unsafe { cancel_work(d, w) },
        sys::FI_FLUSH_WORK => unsafe { flush_work(d, arg) },
        _ => Err(ENOSYS),
    };
    r.err().unwrap_or(0)
}

/// The library's error as the C return.
fn lib<T>(r: shmfab::Result<T>, what: &str) -> Result<T, c_int> {
    r.map_err(|e| util::err(e, sys::FI_LOG_DOMAIN, what))
}

/// The `fi_op_*` struct a work request points to.
///
/// # Safety
/// `p` null or valid.
unsafe fn op<'a, T>(p: *mut T) -> Result<&'a T, c_int> {
    // SAFETY: caller's contract.
    unsafe { p.as_ref() }.ok_or(EINVAL)
}

/// FI_QUEUE_WORK.
///
/// # Safety
/// `w` null or a valid `struct fi_deferred_work` whose op structs are
/// valid, kept with its buffers until the work completes or is cancelled.
unsafe fn queue_work(d: &crate::domain::Domain, w: *mut sys::fi_deferred_work) -> Result<(), c_int> {
    // SAFETY: caller's contract.
    let Some(w) = (unsafe { w.as_mut() }) else { return Err(EINVAL) };
    // SAFETY: live fids or null (fi_trigger(3)); `counter` checks.
    let triggering = unsafe { counter(w.triggering_cntr) }?;
    let completion = if w.completion_cntr.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { counter(w.completion_cntr) }?)
    };
    let threshold = w.threshold;
    // Queues one operation (inside the unsafe block below: fi_trigger(3),
    // the buffers the work names stay valid, those it sends from
    // unchanged, until it completes or is cancelled).
    macro_rules! q {
        ($op:expr) => {
            lib(
                d.dom.queue_work(DeferredWork { threshold, triggering, completion, op: $op }),
                "fi_control(FI_QUEUE_WORK)",
            )
        };
    }
    // SAFETY (the union reads and the op structs): op_type says which
    // pointer the union holds; each is null or valid (caller's contract).
    let id = unsafe {
        match w.op_type {
            t @ (sys::FI_OP_RECV | sys::FI_OP_TRECV) => {
                let (ep, iov, n, src, ctx, tag, ignore, flags) = if t == sys::FI_OP_RECV {
                    let o = op(w.op.msg)?;
                    (o.ep, o.msg.msg_iov, o.msg.iov_count, o.msg.addr, o.msg.context, 0, 0, o.flags)
                } else {
                    let o = op(w.op.tagged)?;
                    let m = &o.msg;
                    (o.ep, m.msg_iov, m.iov_count, m.addr, m.context, m.tag, m.ignore, o.flags)
                };
                let src = rx_src(ep, src);
                let ep = endpoint(ep)?;
                let mut v = slices_mut(iov, n)?;
                let msg = RecvMsg { iov: &mut v, src, context: ctx as usize, tag, ignore };
                let flags = recv_flags(flags);
                q!(if t == sys::FI_OP_RECV {
                    DeferredOp::Recv { ep, msg, flags }
                } else {
                    DeferredOp::Trecv { ep, msg, flags }
                })?
            }
            sys::FI_OP_SEND => {
                let o = op(w.op.msg)?;
                let m = &o.msg;
                let msg = SendMsg {
                    iov: &slices(m.msg_iov, m.iov_count)?,
                    dest: m.addr,
                    context: m.context as usize,
                    data: m.data,
                    tag: 0,
                };
                q!(DeferredOp::Send { ep: endpoint(o.ep)?, msg, flags: send_flags(o.flags)? })?
            }
            sys::FI_OP_TSEND => {
                let o = op(w.op.tagged)?;
                let m = &o.msg;
                let msg = SendMsg {
                    iov: &slices(m.msg_iov, m.iov_count)?,
                    dest: m.addr,
                    context: m.context as usize,
                    data: m.data,
                    tag: m.tag,
                };
                q!(DeferredOp::Tsend { ep: endpoint(o.ep)?, msg, flags: send_flags(o.flags)? })?
            }
            t @ (sys::FI_OP_WRITE | sys::FI_OP_READ) => {
                let o = op(w.op.rma)?;
                let m = &o.msg;
                let ep = endpoint(o.ep)?;
                let rma_iov = rma_iovs(m.rma_iov, m.rma_iov_count)?;
                let (dest, context, flags) = (m.addr, m.context as usize, rma_flags(o.flags));
                if t == sys::FI_OP_WRITE {
                    let iov = slices(m.msg_iov, m.iov_count)?;
                    q!(DeferredOp::Write { ep, iov: &iov, rma_iov: &rma_iov, dest, context, data: m.data, flags })?
                } else {
                    let mut v = slices_mut(m.msg_iov, m.iov_count)?;
                    q!(DeferredOp::Read { ep, iov: &mut v, rma_iov: &rma_iov, dest, context, flags })?
                }
            }
            sys::FI_OP_ATOMIC => {
                let o = op(w.op.atomic)?;
                let a = Atom::new(&o.msg, o.flags)?;
                q!(DeferredOp::Atomic { ep: endpoint(o.ep)?, msg: a.msg(), flags: rma_flags(o.flags) })?
            }
            sys::FI_OP_FETCH_ATOMIC => {
                let o = op(w.op.fetch_atomic)?;
                let a = Atom::new(&o.msg, o.flags)?;
                let res = a.result(o.fetch.msg_iov, o.fetch.iov_count)?;
                let (ep, flags) = (endpoint(o.ep)?, rma_flags(o.flags));
                q!(DeferredOp::FetchAtomic { ep, msg: a.msg(), result: res.bytes_mut(), flags })?
            }
            sys::FI_OP_COMPARE_ATOMIC => {
                let o = op(w.op.compare_atomic)?;
                let a = Atom::new(&o.msg, o.flags)?;
                let cmp = a.compare(o.compare.msg_iov, o.compare.iov_count, o.flags)?;
                let res = a.result(o.fetch.msg_iov, o.fetch.iov_count)?;
                let (ep, flags) = (endpoint(o.ep)?, rma_flags(o.flags));
                q!(DeferredOp::CompareAtomic {
                    ep,
                    msg: a.msg(),
                    compare: cmp.bytes(),
                    result: res.bytes_mut(),
                    flags
                })?
            }
            t @ (sys::FI_OP_CNTR_SET | sys::FI_OP_CNTR_ADD) => {
                let o = op(w.op.cntr)?;
                let (cntr, value) = (counter(o.cntr)?, o.value);
                q!(if t == sys::FI_OP_CNTR_SET {
                    DeferredOp::CntrSet { cntr, value }
                } else {
                    DeferredOp::CntrAdd { cntr, value }
                })?
            }
            _ => return Err(EINVAL),
        }
    };
    let c = &mut w.context.internal;
    c[0] = (&QUEUED as *const u8).cast_mut().cast();
    c[1] = (d as *const crate::domain::Domain).cast_mut().cast();
    // SAFETY: the context has room for a WorkId (8 bytes) in its third
    // word (fi_trigger(3): the provider may use it while the work is
    // queued); read back only by `cancel_work`, as a WorkId.
    unsafe { std::ptr::write_unaligned(c.as_mut_ptr().add(2).cast::<WorkId>(), id) };
    Ok(())
}

/// FI_CANCEL_WORK.
///
/// # Safety
/// `w` null or a valid `struct fi_deferred_work`.
unsafe fn cancel_work(d: &crate::domain::Domain, w: *mut sys::fi_deferred_work) -> Result<(), c_int> {
    // SAFETY: caller's contract.
    let Some(w) = (unsafe { w.as_ref() }) else { return Err(EINVAL) };
    let c = &w.context.internal;
    if c[0] != (&QUEUED as *const u8).cast_mut().cast() || c[1] != (d as *const crate::domain::Domain).cast_mut().cast()
    {
        // Never queued on this domain.
        return Err(EINVAL);
    }
    // SAFETY: `queue_work` wrote a WorkId there (the mark says so); any
    // 8 bytes are a WorkId (one u64), so a changed struct finds nothing.
    let id = unsafe { std::ptr::read_unaligned(c.as_ptr().add(2).cast::<WorkId>()) };
    match lib(d.dom.cancel_work(id), "fi_control(FI_CANCEL_WORK)")? {
        true => Ok(()),
        false => Err(ENOENT),
    }
}

/// FI_FLUSH_WORK: `arg` NULL (all), a counter, or a work request naming
/// its triggering counter.
///
/// # Safety
/// `arg` null, a live `fid_cntr`, or a valid `struct fi_deferred_work`.
unsafe fn flush_work(d: &crate::domain::Domain, arg: *mut c_void) -> Result<(), c_int> {
    let only = if arg.is_null() {
        None
    } else if let Some(c) = unsafe {
        // SAFETY: either object starts with at least three words (a fid,
        // or the work's context); `of` checks class and ops before
        // taking it for one of our counters.
        crate::cntr::of(arg.cast())
    } {
        Some(&c.cntr)
    } else {
        // SAFETY: not a counter: a work request (caller's contract).
        let w = unsafe { &*arg.cast::<sys::fi_deferred_work>() };
        // SAFETY: a live fid or null.
        Some(unsafe { counter(w.triggering_cntr) }?)
    };
    lib(d.dom.flush_work(only), "fi_control(FI_FLUSH_WORK)").map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ioc(p: &mut [u64], count: usize) -> sys::fi_ioc {
        sys::fi_ioc { addr: p.as_mut_ptr().cast(), count }
    }

    /// Adjacent segments are one buffer of the application's; scattered
    /// ones are copied only when asked (FI_INJECT), else `-FI_ENOSYS`;
    /// empty segments do not break adjacency; null arrays are refused.
    #[test]
    fn ioc_segments_become_one_buffer() {
        let mut a = [1u64, 2, 3, 4];
        let base = a.as_ptr() as usize;
        let (lo, hi) = a.split_at_mut(2);
        let adj = [ioc(lo, 2), ioc(&mut [], 0), ioc(hi, 2)];
        // SAFETY: the segments point into `a`, alive for the test.
        match unsafe { ioc_buf(adj.as_ptr(), 3, 8, false, "t") } {
            Ok(Buf::App(p, n)) => assert_eq!((p as usize, n), (base, 32)),
            _ => panic!("adjacent segments are the application's buffer"),
        }
        let mut b = [7u64, 0, 9];
        let (x, rest) = b.split_at_mut(1);
        let scattered = [ioc(x, 1), ioc(&mut rest[1..], 1)];
        // SAFETY: as above.
        assert!(matches!(unsafe { ioc_buf(scattered.as_ptr(), 2, 8, false, "t") }, Err(ENOSYS)));
        // SAFETY: as above.
        match unsafe { ioc_buf(scattered.as_ptr(), 2, 8, true, "t") } {
            Ok(Buf::Copy(v)) => assert_eq!(v, [7u64.to_ne_bytes(), 9u64.to_ne_bytes()].concat()),
            _ => panic!("scattered operands are copied with FI_INJECT"),
        }
        // SAFETY: null with a count is refused before any read.
        assert!(matches!(unsafe { ioc_buf(std::ptr::null(), 1, 8, true, "t") }, Err(EINVAL)));
        // SAFETY: no segment.
        assert!(matches!(unsafe { ioc_buf(std::ptr::null(), 0, 8, false, "t") }, Ok(Buf::App(_, 0))));
    }

    #[test]
    fn flags_for_the_library() {
        assert_eq!(
            send_flags(sys::FI_TRIGGER | sys::FI_MORE | sys::FI_TRANSMIT_COMPLETE | sys::FI_COMPLETION),
            Ok(sys::FI_COMPLETION)
        );
        assert_eq!(send_flags(sys::FI_TRIGGER | sys::FI_DELIVERY_COMPLETE), Ok(sys::FI_DELIVERY_COMPLETE));
        assert_eq!(rma_flags(sys::FI_TRIGGER | sys::FI_INJECT), sys::FI_INJECT);
    }

    /// A triggered context is checked before anything else is read.
    #[test]
    fn triggered_context_checks() {
        // SAFETY: null is refused.
        assert!(matches!(unsafe { trigger(std::ptr::null_mut()) }, Err(EINVAL)));
        let mut t = sys::fi_triggered_context { event_type: sys::FI_TRIGGER_XPU, ..Default::default() };
        // SAFETY: a valid struct.
        assert!(matches!(unsafe { trigger((&mut t as *mut sys::fi_triggered_context).cast()) }, Err(ENOSYS)));
        t.event_type = 9;
        // SAFETY: as above.
        assert!(matches!(unsafe { trigger((&mut t as *mut sys::fi_triggered_context).cast()) }, Err(EINVAL)));
        t.event_type = sys::FI_TRIGGER_THRESHOLD;
        // SAFETY: as above; its counter is null.
        assert!(matches!(unsafe { trigger((&mut t as *mut sys::fi_triggered_context).cast()) }, Err(EINVAL)));
    }
}
