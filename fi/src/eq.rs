//! Event queues (`fi_eq_open`). shmfab has no connection events and its
//! address vectors insert synchronously, so the only events are those the
//! application writes (`fi_eq_write`); clients that open an EQ for
//! asynchronous events (fi_pingpong, MPI) get one that works, read,
//! blocking read and write included.

use crate::sys;
use crate::util::{self, nb3, no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EINVAL, ENOSYS, ETOOSMALL};
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// An event queue.
#[repr(C)]
pub struct Eq {
    /// What the application holds.
    pub fid: sys::fid_eq,
    fabric: *const crate::fabric::Fabric,
    /// Events not read yet: (event, its bytes).
    q: Mutex<VecDeque<(u32, Vec<u8>)>>,
    /// Signalled on every write.
    cv: Condvar,
    /// Whether blocking reads are allowed (a wait object other than none).
    can_wait: bool,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(nb3),
    control: Some(nb3),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static OPS: sys::fi_ops_eq = sys::fi_ops_eq {
    size: std::mem::size_of::<sys::fi_ops_eq>(),
    read: Some(read),
    readerr: Some(readerr),
    write: Some(write),
    sread: Some(sread),
    strerror: Some(strerror),
};

/// `fi_eq_open`.
///
/// # Safety
/// libfabric's contract: `fabric` a live fid, `attr` valid, `out` valid
/// for a write.
pub unsafe extern "C" fn open(
    fabric: *mut sys::fid_fabric,
    attr: *mut sys::fi_eq_attr,
    out: *mut *mut sys::fid_eq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract.
    let (Some(f), Some(a)) = (unsafe { crate::fabric::of(fabric) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    if out.is_null() {
        return EINVAL;
    }
    if a.flags & !sys::FI_WRITE != 0 {
        return EBADFLAGS;
    }
    let can_wait = match a.wait_obj {
        sys::FI_WAIT_NONE => false,
        sys::FI_WAIT_UNSPEC | sys::FI_WAIT_YIELD => true,
        // FD, mutex/condvar and wait-set wait objects for EQs: not built yet.
        _ => return ENOSYS,
    };
    f.refs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let b = Box::new(Eq {
        fid: sys::fid_eq { fid: util::fid(sys::FI_CLASS_EQ, context, &FI_OPS), ops: util::ops(&OPS) },
        fabric: f,
        q: Mutex::new(VecDeque::new()),
        cv: Condvar::new(),
        can_wait,
    });
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// The EQ behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Eq> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_EQ, &FI_OPS) }
}

/// `close`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL };
    // SAFETY: the fabric outlives its EQs (its close is refused while refs > 0).
    unsafe { &*e.fabric }.refs.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((e as *const Eq).cast_mut()) });
    0
}

/// Takes (or with FI_PEEK copies) the first event into the caller's buffer.
///
/// # Safety
/// `event` valid for a write; `buf` valid for `len` bytes.
unsafe fn take(q: &mut VecDeque<(u32, Vec<u8>)>, event: *mut u32, buf: *mut c_void, len: usize, flags: u64) -> isize {
    let Some((ev, data)) = q.front() else { return -(sys::FI_EAGAIN as isize) };
    if data.len() > len || (buf.is_null() && !data.is_empty()) {
        return ETOOSMALL as isize;
    }
    // SAFETY: event is valid for a write, buf for len >= data.len() bytes.
    unsafe {
        if !event.is_null() {
            *event = *ev;
        }
        std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len());
    }
    let n = data.len() as isize;
    if flags & sys::FI_PEEK == 0 {
        q.pop_front();
    }
    n
}

/// `read`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn read(eq: *mut sys::fid_eq, event: *mut u32, buf: *mut c_void, len: usize, flags: u64) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(eq.cast()) }) else { return EINVAL as isize };
    let mut q = e.q.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: the caller's buffers, as fi_eq_read(3) requires.
    unsafe { take(&mut q, event, buf, len, flags) }
}

/// No error events are ever made (nothing in shmfab reports through an
/// EQ): `-FI_EAGAIN`.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn readerr(eq: *mut sys::fid_eq, _: *mut sys::fi_eq_err_entry, _: u64) -> isize {
    // SAFETY: libfabric passes our fid.
    if unsafe { of(eq.cast()) }.is_none() {
        return EINVAL as isize;
    }
    -(sys::FI_EAGAIN as isize)
}

/// `write`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn write(eq: *mut sys::fid_eq, event: u32, buf: *const c_void, len: usize, flags: u64) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(eq.cast()) }) else { return EINVAL as isize };
    if flags != 0 {
        return EBADFLAGS as isize;
    }
    let data = if len == 0 || buf.is_null() {
        Vec::new()
    } else {
        // SAFETY: buf is valid for len bytes (fi_eq_write(3)).
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec()
    };
    e.q.lock().unwrap_or_else(|p| p.into_inner()).push_back((event, data));
    e.cv.notify_all();
    len as isize
}

/// `sread`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn sread(
    eq: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(eq.cast()) }) else { return EINVAL as isize };
    if !e.can_wait {
        return EINVAL as isize;
    }
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let mut q = e.q.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if !q.is_empty() {
            // SAFETY: the caller's buffers, as fi_eq_sread(3) requires.
            return unsafe { take(&mut q, event, buf, len, flags) };
        }
        match deadline {
            None => q = e.cv.wait(q).unwrap_or_else(|p| p.into_inner()),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return -(sys::FI_EAGAIN as isize);
                }
                q = e.cv.wait_timeout(q, d - now).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
    }
}

/// `strerror`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn strerror(
    _: *mut sys::fid_eq,
    _prov_errno: c_int,
    _: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    let s = "no provider error (shmfab's event queues carry no errors)";
    // SAFETY: buf is null or valid for len bytes (fi_eq_strerror(3)).
    if unsafe { util::copy_cstr(s, buf, len) } {
        return buf;
    }
    util::static_cstr(s)
}
