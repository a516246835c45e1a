//! Completion queues (`fi_cq_open`): every entry format, read, readfrom,
//! readerr (into the caller's `err_data` buffer when it gives one, as
//! API 1.5 and later define, else into the CQ's own; at most the domain's
//! `max_err_data` bytes either way), sread and sreadfrom with a threshold
//! condition, signal, strerror, and `fi_control` FI_GETWAIT /
//! FI_GETWAITOBJ, FI_WAIT_SET and FI_WAIT_MUTEX_COND (`wait.rs`), over
//! the library's CQ.
//!
//! The library's entry types are `#[repr(C)]` copies of libfabric's
//! (checked below at compile time), so reads go straight into the
//! application's array.

use crate::sys;
use crate::util::{self, nb3, no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EINVAL, ENOSYS};
use shmfab::{CqAttr, CqDataEntry, CqEntry, CqFormat, CqMsgEntry, CqTaggedEntry, WaitCond, WaitObj};
use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

const _: () = {
    assert!(size_of::<CqEntry>() == size_of::<sys::fi_cq_entry>());
    assert!(size_of::<CqMsgEntry>() == size_of::<sys::fi_cq_msg_entry>());
    assert!(offset_of!(CqMsgEntry, len) == offset_of!(sys::fi_cq_msg_entry, len));
    assert!(size_of::<CqDataEntry>() == size_of::<sys::fi_cq_data_entry>());
    assert!(offset_of!(CqDataEntry, data) == offset_of!(sys::fi_cq_data_entry, data));
    assert!(size_of::<CqTaggedEntry>() == size_of::<sys::fi_cq_tagged_entry>());
    assert!(offset_of!(CqTaggedEntry, tag) == offset_of!(sys::fi_cq_tagged_entry, tag));
};

/// A completion queue.
#[repr(C)]
pub struct Cq {
    /// What the application holds.
    pub fid: sys::fid_cq,
    dom: *const crate::domain::Domain,
    /// FI_WAIT_MUTEX_COND: the pthread objects and their relay watch on
    /// the library CQ's fd (dropped before the CQ: field order).
    cond: Option<(std::sync::Arc<crate::wait::PCond>, crate::wait::Watch)>,
    /// The library's CQ.
    pub cq: shmfab::CompletionQueue,
    format: CqFormat,
    wait_obj: sys::fi_wait_obj,
    /// FI_CQ_COND_THRESHOLD: blocking reads take a `size_t` threshold in
    /// `cond` (else `cond` is not read).
    threshold: bool,
    /// The wait set it waits through (FI_WAIT_SET), else null.
    wait: *const crate::wait::Wait,
    /// Before API 1.5 `fi_cq_err_entry` ends at `err_data`.
    api_version: u32,
    /// The provider's error-data buffer (`info::MAX_ERR_DATA` bytes and a
    /// NUL), where `err_data` points when the caller gives no buffer:
    /// valid until the next `readerr` (fi_cq(3)), and never more than the
    /// domain's `max_err_data`.
    err_buf: std::sync::Mutex<Box<[u8]>>,
    /// Completions of collectives reported here (`coll.rs`).
    pub(crate) coll: crate::coll::CqColl,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(nb3),
    control: Some(control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static OPS: sys::fi_ops_cq = sys::fi_ops_cq {
    size: size_of::<sys::fi_ops_cq>(),
    read: Some(read),
    readfrom: Some(readfrom),
    readerr: Some(readerr),
    sread: Some(sread),
    sreadfrom: Some(sreadfrom),
    signal: Some(signal),
    strerror: Some(strerror),
};

impl Cq {
    /// Its entry format.
    pub(crate) fn format(&self) -> CqFormat {
        self.format
    }

    /// The domain it was opened from (alive while it is).
    pub fn domain(&self) -> &crate::domain::Domain {
        // SAFETY: the domain outlives what is opened from it (its close is
        // refused while its refs count this object).
        unsafe { &*self.dom }
    }
}

/// The CQ behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Cq> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_CQ, &FI_OPS) }
}

/// `fi_cq_open`.
///
/// # Safety
/// libfabric's contract.
pub unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cq_attr,
    out: *mut *mut sys::fid_cq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract.
    let (Some(d), Some(a)) = (unsafe { crate::domain::of(domain.cast()) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    if out.is_null() {
        return EINVAL;
    }
    if a.flags & !sys::FI_AFFINITY != 0 {
        return EBADFLAGS;
    }
    // FI_CQ_FORMAT_UNSPEC: the provider's choice (fi_cq(3)), the
    // smallest entry, as libfabric's own utility CQ chooses; written back
    // to the attributes below so that the application knows what it reads.
    let format = match a.format {
        sys::FI_CQ_FORMAT_UNSPEC | sys::FI_CQ_FORMAT_CONTEXT => CqFormat::Context,
        sys::FI_CQ_FORMAT_MSG => CqFormat::Msg,
        sys::FI_CQ_FORMAT_DATA => CqFormat::Data,
        sys::FI_CQ_FORMAT_TAGGED => CqFormat::Tagged,
        _ => return EINVAL,
    };
    let wait_obj = match a.wait_obj {
        sys::FI_WAIT_NONE => WaitObj::None,
        sys::FI_WAIT_UNSPEC => WaitObj::Unspec,
        sys::FI_WAIT_YIELD => WaitObj::Yield,
        sys::FI_WAIT_FD => WaitObj::Fd,
        sys::FI_WAIT_POLLFD => WaitObj::PollFd,
        // Through the wait set named (opened by it, below).
        sys::FI_WAIT_SET => WaitObj::Unspec,
        // FI_WAIT_MUTEX_COND: the library's mutex and condvar are Rust's,
        // not the pthread objects FI_GETWAIT must hand out: an FD CQ whose
        // fd the relay turns into broadcasts (`wait::PCond`).
        sys::FI_WAIT_MUTEX_COND => WaitObj::Fd,
        _ => return EINVAL,
    };
    let wait_cond = match a.wait_cond {
        sys::FI_CQ_COND_NONE => WaitCond::None,
        sys::FI_CQ_COND_THRESHOLD => WaitCond::Threshold,
        _ => return EINVAL,
    };
    let lib_attr = CqAttr { size: a.size, format, wait_obj, wait_cond };
    let (cq, wait) = if a.wait_obj == sys::FI_WAIT_SET {
        // SAFETY: wait_set is null or a live fid (fi_cq(3)).
        let Some(w) = (unsafe { crate::wait::of(a.wait_set.cast()) }) else { return EINVAL };
        match w.cq_open(d, &lib_attr) {
            Ok(c) => (c, w as *const crate::wait::Wait),
            Err(e) => return e,
        }
    } else {
        match d.dom.cq_open(&lib_attr) {
            Ok(c) => (c, std::ptr::null()),
            Err(e) => return util::err(e, sys::FI_LOG_CQ, "fi_cq_open"),
        }
    };
    let cond = if a.wait_obj == sys::FI_WAIT_MUTEX_COND {
        let pc = crate::wait::PCond::new();
        let w = match cq.wait_fd().map_err(|e| util::err(e, sys::FI_LOG_CQ, "fi_cq_open")) {
            Ok(fd) => crate::wait::watch(fd, &pc),
            Err(e) => Err(e),
        };
        match w {
            Ok(w) => Some((pc, w)),
            Err(e) => {
                let _ = cq.close();
                return e;
            }
        }
    } else {
        None
    };
    d.refs.fetch_add(1, Relaxed);
    let b = Box::new(Cq {
        fid: sys::fid_cq { fid: util::fid(sys::FI_CLASS_CQ, context, &FI_OPS), ops: util::ops(&OPS) },
        dom: d,
        cond,
        cq,
        format,
        wait_obj: a.wait_obj,
        threshold: wait_cond == WaitCond::Threshold,
        wait,
        api_version: d.api_version,
        err_buf: std::sync::Mutex::new(vec![0u8; crate::info::MAX_ERR_DATA + 1].into_boxed_slice()),
        coll: Default::default(),
    });
    // SAFETY: attr is the caller's attributes, valid for writes (fi_cq(3):
    // the provider fills in what it chose); `a` is not used after this.
    if unsafe { (*attr).format } == sys::FI_CQ_FORMAT_UNSPEC {
        // SAFETY: as above.
        unsafe { (*attr).format = sys::FI_CQ_FORMAT_CONTEXT };
    }
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// `close`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(fid) }) else { return EINVAL };
    // SAFETY: `wait` is null or the set the cq was opened through.
    let r = unsafe { crate::wait::close_member(c.wait, &c.cq, || c.cq.close(), "fi_close(cq)") };
    if r != 0 {
        return r;
    }
    // SAFETY: the domain outlives its CQs (refs).
    unsafe { &*c.dom }.refs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((c as *const Cq).cast_mut()) });
    0
}

/// Reads in the CQ's format into the caller's array: `how` is the
/// library call (read, readfrom, sread...) for one entry type.
///
/// # Safety
/// `buf` holds `count` entries of the CQ's format.
unsafe fn in_format(
    c: &Cq,
    buf: *mut c_void,
    count: usize,
    how: &mut dyn FnMut(Entries<'_>) -> shmfab::Result<usize>,
) -> isize {
    if buf.is_null() && count > 0 {
        return EINVAL as isize;
    }
    /// The caller's array as a slice of `T`.
    ///
    /// # Safety
    /// As `in_format`.
    unsafe fn arr<'a, T>(buf: *mut c_void, count: usize) -> &'a mut [T] {
        if count == 0 {
            return &mut [];
        }
        // SAFETY: buf holds count entries of T (caller's contract).
        unsafe { std::slice::from_raw_parts_mut(buf.cast::<T>(), count) }
    }
    // SAFETY (each arm): the CQ's format names the entry type of buf.
    let r = match c.format {
        CqFormat::Context => how(Entries::Context(unsafe { arr(buf, count) })),
        CqFormat::Msg => how(Entries::Msg(unsafe { arr(buf, count) })),
        CqFormat::Data => how(Entries::Data(unsafe { arr(buf, count) })),
        CqFormat::Tagged | CqFormat::Unspec => how(Entries::Tagged(unsafe { arr(buf, count) })),
    };
    util::ssize(r, sys::FI_LOG_CQ, "fi_cq_read")
}

/// The application's array, by format.
enum Entries<'a> {
    Context(&'a mut [CqEntry]),
    Msg(&'a mut [CqMsgEntry]),
    Data(&'a mut [CqDataEntry]),
    Tagged(&'a mut [CqTaggedEntry]),
}

/// Calls `$f` (a generic library read) on whichever array `$e` holds.
macro_rules! each {
    ($e:expr, |$a:ident| $body:expr) => {
        match $e {
            Entries::Context($a) => $body,
            Entries::Msg($a) => $body,
            Entries::Data($a) => $body,
            Entries::Tagged($a) => $body,
        }
    };
}

/// `read`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn read(cq: *mut sys::fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(cq.cast()) }) else { return EINVAL as isize };
    if count == 0 {
        return progress_only(c);
    }
    if c.coll.active() {
        // SAFETY: buf holds count entries of the CQ's format (fi_cq(3)).
        return unsafe {
            crate::coll::read(c, buf, count, std::ptr::null_mut(), &mut |b, n, _| {
                in_format(c, b, n, &mut |e| each!(e, |a| c.cq.read(a)))
            })
        };
    }
    if buf.is_null() {
        return EINVAL as isize;
    }
    // The poll loop's call: the library's read on the caller's array
    // typed by the CQ's format, without `in_format`'s closure.
    // SAFETY (each arm): buf holds count (> 0) entries of the CQ's
    // format (fi_cq(3)), which names the entry type.
    let r = unsafe {
        match c.format {
            CqFormat::Context => c.cq.read(std::slice::from_raw_parts_mut(buf.cast::<CqEntry>(), count)),
            CqFormat::Msg => c.cq.read(std::slice::from_raw_parts_mut(buf.cast::<CqMsgEntry>(), count)),
            CqFormat::Data => c.cq.read(std::slice::from_raw_parts_mut(buf.cast::<CqDataEntry>(), count)),
            CqFormat::Tagged | CqFormat::Unspec => {
                c.cq.read(std::slice::from_raw_parts_mut(buf.cast::<CqTaggedEntry>(), count))
            }
        }
    };
    util::ssize(r, sys::FI_LOG_CQ, "fi_cq_read")
}

/// A read of 0 entries: "may be used to drive progress" (fi_cq(3)). It
/// runs a progress pass and returns `-FI_EAGAIN`, as no completion was
/// retrieved. (libfabric's utility CQ returns 0 instead when entries are
/// already queued; the library has no call that tells without taking one,
/// and either way the caller reads them with a count above 0.)
#[cold]
fn progress_only(c: &Cq) -> isize {
    match c.domain().dom.progress() {
        Ok(()) => -(sys::FI_EAGAIN as isize),
        Err(e) => util::err(e, sys::FI_LOG_CQ, "fi_cq_read(count 0)") as isize,
    }
}

/// The caller's source array.
///
/// # Safety
/// `src` valid for `count` entries.
unsafe fn srcs<'a>(src: *mut u64, count: usize) -> &'a mut [u64] {
    if count == 0 || src.is_null() {
        return &mut [];
    }
    // SAFETY: caller's contract.
    unsafe { std::slice::from_raw_parts_mut(src, count) }
}

/// `readfrom`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn readfrom(cq: *mut sys::fid_cq, buf: *mut c_void, count: usize, src: *mut u64) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(cq.cast()) }) else { return EINVAL as isize };
    if count == 0 {
        return progress_only(c);
    }
    if src.is_null() {
        return EINVAL as isize;
    }
    if c.coll.active() {
        // SAFETY: buf and src hold count entries (fi_cq(3)).
        return unsafe {
            crate::coll::read(c, buf, count, src, &mut |b, n, sp| {
                let s = srcs(sp, n);
                in_format(c, b, n, &mut |e| each!(e, |a| c.cq.readfrom(a, s)))
            })
        };
    }
    // SAFETY: src holds count entries (fi_cq(3)).
    let s = unsafe { srcs(src, count) };
    // SAFETY: buf holds count entries of the CQ's format.
    unsafe { in_format(c, buf, count, &mut |e| each!(e, |a| c.cq.readfrom(a, s))) }
}

/// The timeout of the blocking reads: negative waits for ever.
fn timeout(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// The threshold of a blocking read: `cond` is a `size_t` for a CQ
/// opened with FI_CQ_COND_THRESHOLD, and not read otherwise (fi_cq(3):
/// `wait_cond` says how `cond` is interpreted; with FI_CQ_COND_NONE it
/// may point at anything or nothing).
///
/// # Safety
/// For a threshold CQ, `cond` null or valid for a `size_t` read.
unsafe fn threshold(c: &Cq, cond: *const c_void) -> Option<usize> {
    // SAFETY: caller's contract.
    (c.threshold && !cond.is_null()).then(|| unsafe { *cond.cast::<usize>() })
}

/// `sread`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn sread(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    ms: c_int,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(cq.cast()) }) else { return EINVAL as isize };
    // SAFETY: cond is null or a size_t for a threshold CQ (fi_cq(3)).
    let th = unsafe { threshold(c, cond) };
    if c.coll.active() {
        // SAFETY: as below.
        return unsafe {
            coll_sread(c, buf, count, std::ptr::null_mut(), ms, &mut |b, n, _, t| {
                in_format(c, b, n, &mut |e| each!(e, |a| c.cq.sread(a, th, t)))
            })
        };
    }
    // SAFETY: buf holds count entries of the CQ's format.
    unsafe { in_format(c, buf, count, &mut |e| each!(e, |a| c.cq.sread(a, th, timeout(ms)))) }
}

/// `sreadfrom`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn sreadfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    cond: *const c_void,
    ms: c_int,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(cq.cast()) }) else { return EINVAL as isize };
    if src.is_null() {
        return EINVAL as isize;
    }
    // SAFETY: cond is null or a size_t for a threshold CQ; src holds
    // count entries.
    let (th, s) = unsafe { (threshold(c, cond), srcs(src, count)) };
    if c.coll.active() {
        // SAFETY: as below.
        return unsafe {
            coll_sread(c, buf, count, src, ms, &mut |b, n, sp, t| {
                let s = srcs(sp, n);
                in_format(c, b, n, &mut |e| each!(e, |a| c.cq.sreadfrom(a, s, th, t)))
            })
        };
    }
    // SAFETY: buf holds count entries of the CQ's format.
    unsafe { in_format(c, buf, count, &mut |e| each!(e, |a| c.cq.sreadfrom(a, s, th, timeout(ms)))) }
}

/// A blocking read of a CQ collectives report on: non-blocking reads
/// (`coll::read`), and between them the library's blocking read for at
/// most 1 ms (a collective's completion rings no CQ), until the timeout.
///
/// # Safety
/// As `coll::read`; `lib(buf, n, src, timeout)` a blocking library read.
unsafe fn coll_sread(
    c: &Cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    ms: c_int,
    lib: &mut dyn FnMut(*mut c_void, usize, *mut u64, Option<Duration>) -> isize,
) -> isize {
    let t0 = std::time::Instant::now();
    let limit = timeout(ms);
    loop {
        // SAFETY: caller's contract.
        let r = unsafe { crate::coll::read(c, buf, count, src, &mut |b, n, s| lib(b, n, s, Some(Duration::ZERO))) };
        if r != -(sys::FI_EAGAIN as isize) {
            return r;
        }
        let left = limit.map(|l| l.saturating_sub(t0.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return r;
        }
        let slice = left.map_or(Duration::from_millis(1), |l| l.min(Duration::from_millis(1)));
        let r = lib(buf, count, src, Some(slice));
        if r != -(sys::FI_EAGAIN as isize) {
            return r;
        }
    }
}

/// `readerr`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn readerr(cq: *mut sys::fid_cq, buf: *mut sys::fi_cq_err_entry, flags: u64) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(cq.cast()) }) else { return EINVAL as isize };
    if buf.is_null() {
        return EINVAL as isize;
    }
    if flags != 0 {
        return EBADFLAGS as isize;
    }
    // SAFETY: buf is the caller's fi_cq_err_entry.
    if let Some(r) = unsafe { crate::coll::readerr(c, buf, c.api_version >= crate::info::fi_version(1, 5)) } {
        return r;
    }
    // SAFETY: buf is the caller's fi_cq_err_entry; before API 1.5 it ends
    // at err_data (err_data_size is neither read nor written then).
    let user = unsafe {
        let b = &*buf;
        (c.api_version >= crate::info::fi_version(1, 5) && b.err_data_size > 0 && !b.err_data.is_null())
            .then_some((b.err_data, b.err_data_size))
    };
    // The error data is copied while the library holds the CQ: another
    // thread's readerr (FI_THREAD_SAFE) replaces the CQ's own copy, which
    // a copy made after the call could read freed. At most max_err_data
    // bytes (fi_domain(3)), into the caller's buffer or into this CQ's.
    let max = crate::info::MAX_ERR_DATA;
    let mut own = None;
    let got = match user {
        // SAFETY: fi_cq(3): err_data points at err_data_size writable bytes
        // of the caller's.
        Some((p, room)) => c.cq.readerr_into(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), room.min(max)) }),
        None => {
            let mut b = c.err_buf.lock().unwrap_or_else(|p| p.into_inner());
            let r = c.cq.readerr_into(&mut b[..max]);
            if let Ok((_, n)) = r {
                b[n] = 0; // a text reads as a C string
                own = Some(b.as_mut_ptr());
            }
            r
        }
    };
    let (e, copied) = match got {
        Ok(x) => x,
        Err(e) => return util::err(e, sys::FI_LOG_CQ, "fi_cq_readerr") as isize,
    };
    // SAFETY: as above.
    unsafe {
        let b = &mut *buf;
        b.op_context = e.op_context as *mut c_void;
        b.flags = e.flags;
        b.len = e.len;
        b.buf = e.buf as *mut c_void;
        b.data = e.data;
        b.tag = e.tag;
        b.olen = e.olen;
        b.err = e.err;
        b.prov_errno = e.prov_errno;
        match user {
            // The caller's buffer: as much of the error data as fit, copied
            // above.
            Some(_) => b.err_data_size = copied,
            None => {
                b.err_data = own.map_or(std::ptr::null_mut(), |p| p.cast());
                if c.api_version >= crate::info::fi_version(1, 5) {
                    b.err_data_size = copied;
                }
            }
        }
    }
    1
}

/// `signal`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn signal(cq: *mut sys::fid_cq) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(cq.cast()) }) else { return EINVAL };
    let r = c.cq.signal();
    if let Some((pc, _)) = &c.cond {
        pc.broadcast();
    }
    util::status(r, sys::FI_LOG_CQ, "fi_cq_signal")
}

/// `strerror`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn strerror(
    cq: *mut sys::fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: libfabric passes our fid.
    let s = match unsafe { of(cq.cast()) } {
        Some(c) => c.cq.strerror(prov_errno),
        None => shmfab::cq::strerror(prov_errno),
    };
    // SAFETY: buf is null or valid for len bytes (fi_cq(3)).
    if unsafe { util::copy_cstr(s, buf, len) } {
        return buf;
    }
    util::static_cstr(s)
}

/// `fi_control` on a CQ: FI_GETWAIT (the fd of FI_WAIT_FD, the
/// `struct fi_wait_pollfd` of FI_WAIT_POLLFD, the `struct fi_mutex_cond`
/// of FI_WAIT_MUTEX_COND) and FI_GETWAITOBJ.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn control(fid: *mut sys::fid, command: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { of(fid) }) else { return EINVAL };
    if arg.is_null() {
        return EINVAL;
    }
    match command as u32 {
        sys::FI_GETWAITOBJ => {
            // SAFETY: arg is an enum fi_wait_obj (fi_control(3)).
            unsafe { *arg.cast::<sys::fi_wait_obj>() = c.wait_obj };
            0
        }
        sys::FI_GETWAIT => match c.wait_obj {
            sys::FI_WAIT_FD => match c.cq.wait_fd() {
                // SAFETY: arg is an int for FI_WAIT_FD.
                Ok(fd) => unsafe {
                    *arg.cast::<c_int>() = fd;
                    0
                },
                Err(e) => util::err(e, sys::FI_LOG_CQ, "FI_GETWAIT"),
            },
            sys::FI_WAIT_MUTEX_COND => match &c.cond {
                Some((pc, _)) => {
                    // SAFETY: arg is a struct fi_mutex_cond (fi_control(3)).
                    unsafe { pc.get(arg) };
                    0
                }
                None => ENOSYS,
            },
            sys::FI_WAIT_POLLFD => {
                // SAFETY: arg is a struct fi_wait_pollfd whose fd array
                // holds nfds entries.
                let p = unsafe { &mut *arg.cast::<sys::fi_wait_pollfd>() };
                let fds: &mut [libc::pollfd] = if p.fd.is_null() || p.nfds == 0 {
                    &mut []
                } else {
                    // SAFETY: as above; libc::pollfd is struct pollfd.
                    unsafe { std::slice::from_raw_parts_mut(p.fd.cast::<libc::pollfd>(), p.nfds) }
                };
                let mut n = 0;
                let r = c.cq.wait_pollfd(fds, &mut n);
                p.nfds = n;
                match r {
                    Ok(ix) => {
                        p.change_index = ix;
                        0
                    }
                    Err(e) => util::err(e, sys::FI_LOG_CQ, "FI_GETWAIT"),
                }
            }
            _ => ENOSYS,
        },
        _ => ENOSYS,
    }
}
