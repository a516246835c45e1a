//! Event queues (`fi_eq_open`). shmfab has no connection events; the
//! events are the completions of address vectors opened with FI_EVENT
//! (`FI_AV_COMPLETE`, and an error entry per address that failed, see
//! `av.rs`), the joins of collective groups (`FI_JOIN_COMPLETE`, see
//! `coll.rs`) and those the application writes (`fi_eq_write`). Read,
//! readerr, blocking read, write and strerror.

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
    /// The fabric it was opened on.
    pub(crate) fabric: *const crate::fabric::Fabric,
    /// Events and error entries not read yet.
    q: Mutex<Queues>,
    /// Signalled on every write.
    cv: Condvar,
    /// Whether blocking reads are allowed (a wait object other than none).
    can_wait: bool,
    /// Address vectors and endpoints bound to it (close is `-FI_EBUSY`
    /// while any is).
    pub refs: std::sync::atomic::AtomicUsize,
    /// Before API 1.5 `fi_eq_err_entry` ends at `err_data`.
    api_version: u32,
}

/// What an EQ holds.
#[derive(Default)]
struct Queues {
    /// Events: (event, its bytes).
    events: VecDeque<(u32, Vec<u8>)>,
    /// Error entries (no provider error data).
    errors: VecDeque<ErrEntry>,
}

/// An error entry: fid, context, data (for an AV insert, the index of the
/// address), positive errno.
struct ErrEntry {
    fid: *mut sys::fid,
    context: *mut c_void,
    data: u64,
    err: c_int,
}

impl Eq {
    /// Queues an event (and wakes blocked readers).
    pub fn post(&self, event: u32, bytes: &[u8]) {
        self.q.lock().unwrap_or_else(|p| p.into_inner()).events.push_back((event, bytes.to_vec()));
        self.cv.notify_all();
    }

    /// Queues an error entry (and wakes blocked readers).
    pub fn post_err(&self, fid: *mut sys::fid, context: *mut c_void, data: u64, err: c_int) {
        self.q.lock().unwrap_or_else(|p| p.into_inner()).errors.push_back(ErrEntry { fid, context, data, err });
        self.cv.notify_all();
    }
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
        q: Mutex::new(Queues::default()),
        cv: Condvar::new(),
        can_wait,
        refs: std::sync::atomic::AtomicUsize::new(0),
        api_version: f.fid.api_version,
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
    if e.refs.load(std::sync::atomic::Ordering::Relaxed) != 0 {
        return crate::util::EBUSY;
    }
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
unsafe fn take(q: &mut Queues, event: *mut u32, buf: *mut c_void, len: usize, flags: u64) -> isize {
    if !q.errors.is_empty() {
        return -(sys::FI_EAVAIL as isize);
    }
    let Some((ev, data)) = q.events.front() else { return -(sys::FI_EAGAIN as isize) };
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
        q.events.pop_front();
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

/// `fi_eq_readerr`: the next error entry (`-FI_EAGAIN` when none); no
/// provider error data (`err_data_size` 0).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `buf` valid.
unsafe extern "C" fn readerr(eq: *mut sys::fid_eq, buf: *mut sys::fi_eq_err_entry, flags: u64) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(eq.cast()) }) else { return EINVAL as isize };
    if buf.is_null() {
        return EINVAL as isize;
    }
    if flags != 0 {
        return EBADFLAGS as isize;
    }
    let Some(x) = e.q.lock().unwrap_or_else(|p| p.into_inner()).errors.pop_front() else {
        return -(sys::FI_EAGAIN as isize);
    };
    // SAFETY: buf is the caller's entry; before API 1.5 it ends at
    // err_data (err_data_size is not written then).
    unsafe {
        let b = &mut *buf;
        b.fid = x.fid;
        b.context = x.context;
        b.data = x.data;
        b.err = x.err;
        b.prov_errno = 0;
        if e.api_version >= crate::info::fi_version(1, 5) {
            if b.err_data_size == 0 {
                b.err_data = std::ptr::null_mut();
            }
            b.err_data_size = 0;
        } else {
            b.err_data = std::ptr::null_mut();
        }
    }
    std::mem::size_of::<sys::fi_eq_err_entry>() as isize
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
    e.q.lock().unwrap_or_else(|p| p.into_inner()).events.push_back((event, data));
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
        if !q.events.is_empty() || !q.errors.is_empty() {
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
    let s = "no provider error (shmfab's event queue errors carry only err)";
    // SAFETY: buf is null or valid for len bytes (fi_eq_strerror(3)).
    if unsafe { util::copy_cstr(s, buf, len) } {
        return buf;
    }
    util::static_cstr(s)
}
