//! The endpoint's atomic calls (`fi_atomic(3)`) and `fi_query_atomic`,
//! over the library's (`shmfab::Endpoint::atomicmsg` and friends).
//!
//! libfabric's datatypes and ops have the library's numbering
//! (`AtomicType::from_raw`, `AtomicOp::from_raw`; checked below); the
//! ones the library does not know (long double and its complex) are
//! `-FI_EOPNOTSUPP`. Local buffers in several `fi_ioc` segments are
//! gathered into one, and fetched values scattered back, which is right
//! because every library call is done when it returns. Remote addresses
//! are offsets in the registration (no FI_MR_VIRT_ADDR).

use crate::ep::{done, me};
use crate::sys;
use crate::util::EINVAL;
use shmfab::{AtomicCall, AtomicOp, AtomicType, RmaIoc};
use std::ffi::{c_int, c_void};

const _: () = {
    assert!(sys::FI_INT8 == AtomicType::Int8 as sys::fi_datatype);
    assert!(sys::FI_DOUBLE_COMPLEX == AtomicType::DoubleComplex as sys::fi_datatype);
    assert!(sys::FI_FLOAT == AtomicType::Float as sys::fi_datatype);
    assert!(sys::FI_MIN == AtomicOp::Min as sys::fi_op);
    assert!(sys::FI_ATOMIC_READ == AtomicOp::Read as sys::fi_op);
    assert!(sys::FI_CSWAP == AtomicOp::Cswap as sys::fi_op);
    assert!(sys::FI_MSWAP == AtomicOp::Mswap as sys::fi_op);
};

const EOPNOTSUPP: c_int = -(sys::FI_EOPNOTSUPP as c_int);

/// The endpoint's atomic ops table.
pub static ATOMIC_OPS: sys::fi_ops_atomic = sys::fi_ops_atomic {
    size: std::mem::size_of::<sys::fi_ops_atomic>(),
    write: Some(write),
    writev: Some(writev),
    writemsg: Some(writemsg),
    inject: Some(inject),
    readwrite: Some(readwrite),
    readwritev: Some(readwritev),
    readwritemsg: Some(readwritemsg),
    compwrite: Some(compwrite),
    compwritev: Some(compwritev),
    compwritemsg: Some(compwritemsg),
    writevalid: Some(writevalid),
    readwritevalid: Some(readwritevalid),
    compwritevalid: Some(compwritevalid),
};

/// libfabric's datatype and op as the library's.
pub(crate) fn map(dt: sys::fi_datatype, op: sys::fi_op) -> Option<(AtomicType, AtomicOp)> {
    let dt = AtomicType::from_raw(u8::try_from(dt).ok()?)?;
    let op = AtomicOp::from_raw(u8::try_from(op).ok()?)?;
    Some((dt, op))
}

/// Local segments as (pointer, bytes).
///
/// # Safety
/// `v` null or valid for `n` entries.
unsafe fn iocs(v: *const sys::fi_ioc, n: usize, size: usize) -> Option<Vec<(*mut u8, usize)>> {
    if n == 0 {
        return Some(Vec::new());
    }
    if v.is_null() {
        return None;
    }
    // SAFETY: caller's contract.
    let s = unsafe { std::slice::from_raw_parts(v, n) };
    // A segment with elements needs an address (one of none may have any:
    // it is never read).
    let segs: Vec<(*mut u8, usize)> = s.iter().map(|i| (i.addr.cast::<u8>(), i.count.saturating_mul(size))).collect();
    segs.iter().all(|&(p, l)| l == 0 || !p.is_null()).then_some(segs)
}

/// The bytes of the segments in one buffer.
///
/// # Safety
/// Every segment valid for its bytes (or empty).
unsafe fn gather(segs: &[(*mut u8, usize)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(segs.iter().map(|s| s.1).sum());
    for &(p, l) in segs {
        if l > 0 {
            // SAFETY: caller's contract.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(p, l) });
        }
    }
    out
}

/// What one atomic call asks for, in the provider's terms.
struct Call {
    call: AtomicCall,
    buf: Vec<(*mut u8, usize)>,
    compare: Vec<(*mut u8, usize)>,
    result: Vec<(*mut u8, usize)>,
    dest: u64,
    remote: Vec<RmaIoc>,
    context: usize,
    data: u64,
    flags: u64,
    /// A call without a flags argument: the endpoint's default transmit
    /// flags apply ([`crate::ep::rma_defaults`]), as for `fi_send`.
    defaults: bool,
}

/// Runs one call on the library's endpoint.
///
/// # Safety
/// The segments of `c` are valid (the result's for writes), as the
/// calls' man pages require.
unsafe fn run(ep: *mut sys::fid_ep, dt: sys::fi_datatype, op: sys::fi_op, c: Call, what: &str) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { me(ep) }) else { return EINVAL as isize };
    let Some((dt, op)) = map(dt, op) else { return EOPNOTSUPP as isize };
    // SAFETY: the caller's segments (this function's contract).
    let buf = unsafe { gather(&c.buf) };
    // SAFETY: as above.
    let cmp = unsafe { gather(&c.compare) };
    let mut res = vec![0u8; c.result.iter().map(|s| s.1).sum()];
    let flags = if c.defaults { crate::ep::rma_defaults(e) } else { c.flags & !sys::FI_MORE };
    let r = match c.call {
        AtomicCall::Write => e.ep.atomicmsg(dt, op, &buf, &c.remote, c.dest, c.context, c.data, flags),
        AtomicCall::Fetch => e.ep.fetch_atomicmsg(dt, op, &buf, &mut res, &c.remote, c.dest, c.context, c.data, flags),
        AtomicCall::Compare => {
            e.ep.compare_atomicmsg(dt, op, &buf, &cmp, &mut res, &c.remote, c.dest, c.context, c.data, flags)
        }
    };
    if r.is_ok() {
        let mut at = 0;
        for &(p, l) in &c.result {
            // SAFETY: the result segments are the caller's, writable.
            unsafe { std::ptr::copy_nonoverlapping(res[at..].as_ptr(), p, l) };
            at += l;
        }
    }
    done(r, what)
}

/// The element size of `dt` (1 when unknown: the call then fails in `run`).
fn size(dt: sys::fi_datatype, op: sys::fi_op) -> usize {
    map(dt, op).map_or(1, |(t, _)| t.size())
}

/// The remote side of a non-msg call: `count` elements at `addr`.
fn one(addr: u64, key: u64, count: usize) -> Vec<RmaIoc> {
    vec![RmaIoc { addr, count, key }]
}

/// The remote side of a msg call.
///
/// # Safety
/// `v` null or valid for `n` entries.
unsafe fn remote(v: *const sys::fi_rma_ioc, n: usize) -> Option<Vec<RmaIoc>> {
    if v.is_null() {
        return (n == 0).then(Vec::new);
    }
    // SAFETY: caller's contract.
    let s = unsafe { std::slice::from_raw_parts(v, n) };
    Some(s.iter().map(|r| RmaIoc { addr: r.addr, count: r.count, key: r.key }).collect())
}

/// A call on one element (count 1: a fetch-add, a compare-swap), the
/// commonest atomic of one-sided MPI layers: the operands and the result
/// through arrays on the stack (copied in and out, as [`run`] does: C lets
/// them overlap) instead of the generic path's six vectors, and the
/// library's one-element call (its shared-heap fast path) when the
/// endpoint's default flags are none. `compare` null for the calls
/// without one, `result` null for `fi_atomic`.
///
/// # Safety
/// As [`write`]: each non-null pointer valid for one element.
#[allow(clippy::too_many_arguments)]
unsafe fn one_elem(
    ep: *mut sys::fid_ep,
    call: AtomicCall,
    (buf, compare, result): (*const c_void, *const c_void, *mut c_void),
    dest: u64,
    (addr, key): (u64, u64),
    dt: sys::fi_datatype,
    op: sys::fi_op,
    ctx: *mut c_void,
    what: &str,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { me(ep) }) else { return EINVAL as isize };
    let Some((t, o)) = map(dt, op) else { return EOPNOTSUPP as isize };
    let n = t.size();
    let (mut b, mut c, mut r) = ([0u8; 16], [0u8; 16], [0u8; 16]);
    if n > b.len() {
        return EINVAL as isize;
    }
    // ATOMIC_READ takes no operand: buf may be null (the library refuses
    // an empty operand for the others).
    let bl = if buf.is_null() { 0 } else { n };
    // SAFETY: non-null pointers hold one element (this function's
    // contract); the arrays hold 16 bytes, n at most (checked).
    unsafe {
        if !buf.is_null() {
            std::ptr::copy_nonoverlapping(buf.cast::<u8>(), b.as_mut_ptr(), n);
        }
        if !compare.is_null() {
            std::ptr::copy_nonoverlapping(compare.cast::<u8>(), c.as_mut_ptr(), n);
        }
    }
    let flags = crate::ep::rma_defaults(e);
    let (b, c, rr) = (&b[..bl], &c[..n], &mut r[..n]);
    let ioc = [RmaIoc { addr, count: 1, key }];
    let cx = ctx as usize;
    let res = match (call, flags) {
        (AtomicCall::Write, 0) => e.ep.atomic(t, o, b, dest, addr, key, cx),
        (AtomicCall::Write, f) => e.ep.atomicmsg(t, o, b, &ioc, dest, cx, 0, f),
        (AtomicCall::Fetch, 0) => e.ep.fetch_atomic(t, o, b, rr, dest, addr, key, cx),
        (AtomicCall::Fetch, f) => e.ep.fetch_atomicmsg(t, o, b, rr, &ioc, dest, cx, 0, f),
        (AtomicCall::Compare, 0) => e.ep.compare_atomic(t, o, b, c, rr, dest, addr, key, cx),
        (AtomicCall::Compare, f) => e.ep.compare_atomicmsg(t, o, b, c, rr, &ioc, dest, cx, 0, f),
    };
    if res.is_ok() && !result.is_null() {
        // SAFETY: the caller's result holds one element.
        unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), result.cast::<u8>(), n) };
    }
    done(res, what)
}

/// `fi_atomic`.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn write(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    ctx: *mut c_void,
) -> isize {
    if count == 1 {
        // SAFETY: libfabric's contract: buf holds one element.
        return unsafe {
            one_elem(
                ep,
                AtomicCall::Write,
                (buf, std::ptr::null(), std::ptr::null_mut()),
                dest,
                (addr, key),
                dt,
                op,
                ctx,
                "fi_atomic",
            )
        };
    }
    let n = count * size(dt, op);
    let c = Call {
        call: AtomicCall::Write,
        buf: vec![(buf.cast_mut().cast(), n)],
        compare: Vec::new(),
        result: Vec::new(),
        dest,
        remote: one(addr, key, count),
        context: ctx as usize,
        data: 0,
        flags: 0,
        defaults: true,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, dt, op, c, "fi_atomic") }
}

/// `fi_atomicv`.
///
/// # Safety
/// As [`write`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn writev(
    ep: *mut sys::fid_ep,
    iov: *const sys::fi_ioc,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    ctx: *mut c_void,
) -> isize {
    let sz = size(dt, op);
    // SAFETY: iov holds count entries.
    let Some(buf) = (unsafe { iocs(iov, count, sz) }) else { return EINVAL as isize };
    let n = buf.iter().map(|s| s.1).sum::<usize>() / sz;
    let c = Call {
        call: AtomicCall::Write,
        buf,
        compare: Vec::new(),
        result: Vec::new(),
        dest,
        remote: one(addr, key, n),
        context: ctx as usize,
        data: 0,
        flags: 0,
        defaults: true,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, dt, op, c, "fi_atomicv") }
}

/// `fi_atomicmsg`.
///
/// # Safety
/// As [`write`].
unsafe extern "C" fn writemsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_atomic, flags: u64) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::atomicmsg(ep, msg, flags) };
    }
    // SAFETY: msg valid (fi_atomic(3)).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let sz = size(m.datatype, m.op);
    // SAFETY: the msg's arrays hold their counts.
    let (Some(buf), Some(remote)) =
        (unsafe { iocs(m.msg_iov, m.iov_count, sz) }, unsafe { remote(m.rma_iov, m.rma_iov_count) })
    else {
        return EINVAL as isize;
    };
    let c = Call {
        call: AtomicCall::Write,
        buf,
        compare: Vec::new(),
        result: Vec::new(),
        dest: m.addr,
        remote,
        context: m.context as usize,
        data: m.data,
        flags,
        defaults: false,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, m.datatype, m.op, c, "fi_atomicmsg") }
}

/// `fi_inject_atomic`.
///
/// # Safety
/// As [`write`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn inject(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: sys::fi_datatype,
    op: sys::fi_op,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { me(ep) }) else { return EINVAL as isize };
    let Some((t, o)) = map(dt, op) else { return EOPNOTSUPP as isize };
    let n = count * t.size();
    if buf.is_null() && n != 0 {
        return EINVAL as isize;
    }
    // SAFETY: buf holds count elements (fi_atomic(3)).
    let b = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) } };
    done(e.ep.inject_atomic(t, o, b, dest, addr, key), "fi_inject_atomic")
}

/// `fi_fetch_atomic`.
///
/// # Safety
/// As [`write`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn readwrite(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    ctx: *mut c_void,
) -> isize {
    let n = count * size(dt, op);
    if result.is_null() {
        return EINVAL as isize;
    }
    if count == 1 {
        // SAFETY: libfabric's contract: buf (or null) and result hold one
        // element.
        return unsafe {
            one_elem(
                ep,
                AtomicCall::Fetch,
                (buf, std::ptr::null(), result),
                dest,
                (addr, key),
                dt,
                op,
                ctx,
                "fi_fetch_atomic",
            )
        };
    }
    // ATOMIC_READ takes no operand: buf may be null.
    let b = if buf.is_null() { Vec::new() } else { vec![(buf.cast_mut().cast(), n)] };
    let c = Call {
        call: AtomicCall::Fetch,
        buf: b,
        compare: Vec::new(),
        result: vec![(result.cast(), n)],
        dest,
        remote: one(addr, key, count),
        context: ctx as usize,
        data: 0,
        flags: 0,
        defaults: true,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, dt, op, c, "fi_fetch_atomic") }
}

/// `fi_fetch_atomicv`.
///
/// # Safety
/// As [`write`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn readwritev(
    ep: *mut sys::fid_ep,
    iov: *const sys::fi_ioc,
    _desc: *mut *mut c_void,
    count: usize,
    resultv: *mut sys::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    ctx: *mut c_void,
) -> isize {
    let sz = size(dt, op);
    // SAFETY: the arrays hold their counts.
    let (Some(buf), Some(result)) = (unsafe { iocs(iov, count, sz) }, unsafe { iocs(resultv, result_count, sz) })
    else {
        return EINVAL as isize;
    };
    let n = result.iter().map(|s| s.1).sum::<usize>() / sz;
    let c = Call {
        call: AtomicCall::Fetch,
        buf,
        compare: Vec::new(),
        result,
        dest,
        remote: one(addr, key, n),
        context: ctx as usize,
        data: 0,
        flags: 0,
        defaults: true,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, dt, op, c, "fi_fetch_atomicv") }
}

/// `fi_fetch_atomicmsg`.
///
/// # Safety
/// As [`write`].
unsafe extern "C" fn readwritemsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_atomic,
    resultv: *mut sys::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    flags: u64,
) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::fetch_atomicmsg(ep, msg, resultv, result_count, flags) };
    }
    // SAFETY: msg valid (fi_atomic(3)).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let sz = size(m.datatype, m.op);
    // SAFETY: the arrays hold their counts.
    let (Some(buf), Some(result), Some(remote)) =
        (unsafe { iocs(m.msg_iov, m.iov_count, sz) }, unsafe { iocs(resultv, result_count, sz) }, unsafe {
            remote(m.rma_iov, m.rma_iov_count)
        })
    else {
        return EINVAL as isize;
    };
    let c = Call {
        call: AtomicCall::Fetch,
        buf,
        compare: Vec::new(),
        result,
        dest: m.addr,
        remote,
        context: m.context as usize,
        data: m.data,
        flags,
        defaults: false,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, m.datatype, m.op, c, "fi_fetch_atomicmsg") }
}

/// `fi_compare_atomic`.
///
/// # Safety
/// As [`write`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn compwrite(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    compare: *const c_void,
    _compare_desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    ctx: *mut c_void,
) -> isize {
    let n = count * size(dt, op);
    if buf.is_null() || compare.is_null() || result.is_null() {
        return EINVAL as isize;
    }
    if count == 1 {
        // SAFETY: libfabric's contract: each buffer holds one element.
        return unsafe {
            one_elem(
                ep,
                AtomicCall::Compare,
                (buf, compare, result),
                dest,
                (addr, key),
                dt,
                op,
                ctx,
                "fi_compare_atomic",
            )
        };
    }
    let c = Call {
        call: AtomicCall::Compare,
        buf: vec![(buf.cast_mut().cast(), n)],
        compare: vec![(compare.cast_mut().cast(), n)],
        result: vec![(result.cast(), n)],
        dest,
        remote: one(addr, key, count),
        context: ctx as usize,
        data: 0,
        flags: 0,
        defaults: true,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, dt, op, c, "fi_compare_atomic") }
}

/// `fi_compare_atomicv`.
///
/// # Safety
/// As [`write`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn compwritev(
    ep: *mut sys::fid_ep,
    iov: *const sys::fi_ioc,
    _desc: *mut *mut c_void,
    count: usize,
    comparev: *const sys::fi_ioc,
    _compare_desc: *mut *mut c_void,
    compare_count: usize,
    resultv: *mut sys::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    ctx: *mut c_void,
) -> isize {
    let sz = size(dt, op);
    // SAFETY: the arrays hold their counts.
    let (Some(buf), Some(compare), Some(result)) =
        (unsafe { iocs(iov, count, sz) }, unsafe { iocs(comparev, compare_count, sz) }, unsafe {
            iocs(resultv, result_count, sz)
        })
    else {
        return EINVAL as isize;
    };
    let n = result.iter().map(|s| s.1).sum::<usize>() / sz;
    let c = Call {
        call: AtomicCall::Compare,
        buf,
        compare,
        result,
        dest,
        remote: one(addr, key, n),
        context: ctx as usize,
        data: 0,
        flags: 0,
        defaults: true,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, dt, op, c, "fi_compare_atomicv") }
}

/// `fi_compare_atomicmsg`.
///
/// # Safety
/// As [`write`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn compwritemsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_atomic,
    comparev: *const sys::fi_ioc,
    _compare_desc: *mut *mut c_void,
    compare_count: usize,
    resultv: *mut sys::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    flags: u64,
) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe {
            crate::trigger::compare_atomicmsg(ep, msg, comparev, compare_count, resultv, result_count, flags)
        };
    }
    // SAFETY: msg valid (fi_atomic(3)).
    let Some(m) = (unsafe { msg.as_ref() }) else { return EINVAL as isize };
    let sz = size(m.datatype, m.op);
    // SAFETY: the arrays hold their counts.
    let (Some(buf), Some(compare), Some(result), Some(remote)) = (
        unsafe { iocs(m.msg_iov, m.iov_count, sz) },
        unsafe { iocs(comparev, compare_count, sz) },
        unsafe { iocs(resultv, result_count, sz) },
        unsafe { remote(m.rma_iov, m.rma_iov_count) },
    ) else {
        return EINVAL as isize;
    };
    let c = Call {
        call: AtomicCall::Compare,
        buf,
        compare,
        result,
        dest: m.addr,
        remote,
        context: m.context as usize,
        data: m.data,
        flags,
        defaults: false,
    };
    // SAFETY: libfabric's contract.
    unsafe { run(ep, m.datatype, m.op, c, "fi_compare_atomicmsg") }
}

/// One valid-op query: 0 and the most elements in `*count`, or
/// `-FI_EOPNOTSUPP`.
///
/// # Safety
/// `count` null or valid for a write.
unsafe fn valid(
    dom: &shmfab::Domain,
    call: AtomicCall,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    count: *mut usize,
) -> c_int {
    let Some((t, o)) = map(dt, op) else { return EOPNOTSUPP };
    match dom.query_atomic(t, o, call) {
        Ok(a) => {
            // SAFETY: caller's contract.
            if let Some(c) = unsafe { count.as_mut() } {
                *c = a.count;
            }
            0
        }
        Err(_) => EOPNOTSUPP,
    }
}

/// `fi_atomicvalid`.
///
/// # Safety
/// As [`write`].
unsafe extern "C" fn writevalid(
    ep: *mut sys::fid_ep,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: libfabric passes our fid; count valid.
    let Some(e) = (unsafe { me(ep) }) else { return EINVAL };
    // SAFETY: as above.
    unsafe { valid(e.domain(), AtomicCall::Write, dt, op, count) }
}

/// `fi_fetch_atomicvalid`.
///
/// # Safety
/// As [`write`].
unsafe extern "C" fn readwritevalid(
    ep: *mut sys::fid_ep,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: libfabric passes our fid; count valid.
    let Some(e) = (unsafe { me(ep) }) else { return EINVAL };
    // SAFETY: as above.
    unsafe { valid(e.domain(), AtomicCall::Fetch, dt, op, count) }
}

/// `fi_compare_atomicvalid`.
///
/// # Safety
/// As [`write`].
unsafe extern "C" fn compwritevalid(
    ep: *mut sys::fid_ep,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: libfabric passes our fid; count valid.
    let Some(e) = (unsafe { me(ep) }) else { return EINVAL };
    // SAFETY: as above.
    unsafe { valid(e.domain(), AtomicCall::Compare, dt, op, count) }
}

/// `fi_query_atomic` (the domain's ops): the call the flags name
/// (FI_FETCH_ATOMIC, FI_COMPARE_ATOMIC, else the plain one) on `dt` and
/// `op`; its element size and most elements in `attr`.
///
/// # Safety
/// libfabric's contract: the fid is live, `attr` valid for a write.
pub unsafe extern "C" fn query_atomic(
    domain: *mut sys::fid_domain,
    dt: sys::fi_datatype,
    op: sys::fi_op,
    attr: *mut sys::fi_atomic_attr,
    flags: u64,
) -> c_int {
    // SAFETY: libfabric's contract.
    let (Some(d), Some(a)) = (unsafe { crate::domain::of(domain.cast()) }, unsafe { attr.as_mut() }) else {
        return EINVAL;
    };
    let call = match flags & (sys::FI_FETCH_ATOMIC | sys::FI_COMPARE_ATOMIC) {
        0 => AtomicCall::Write,
        f if f == sys::FI_FETCH_ATOMIC => AtomicCall::Fetch,
        f if f == sys::FI_COMPARE_ATOMIC => AtomicCall::Compare,
        _ => return EINVAL,
    };
    if flags & !(sys::FI_FETCH_ATOMIC | sys::FI_COMPARE_ATOMIC) != 0 {
        return crate::util::EBADFLAGS;
    }
    let Some((t, o)) = map(dt, op) else { return EOPNOTSUPP };
    match d.dom.query_atomic(t, o, call) {
        Ok(q) => {
            a.size = q.size;
            a.count = q.count;
            0
        }
        Err(_) => EOPNOTSUPP,
    }
}
