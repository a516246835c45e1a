//! Counters (`fi_cntr_open`): read, readerr, add, set, adderr, seterr,
//! wait, `fi_control` FI_GETWAIT / FI_GETWAITOBJ, and FI_WAIT_SET
//! (`wait.rs`), over the library's counter.

use crate::sys;
use crate::util::{self, nb3, no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EINVAL, ENOSYS};
use shmfab::{CntrAttr, WaitObj};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// A counter.
#[repr(C)]
pub struct Cntr {
    /// What the application holds.
    pub fid: sys::fid_cntr,
    dom: *const crate::domain::Domain,
    /// FI_WAIT_MUTEX_COND: the pthread objects and their relay watch on
    /// the library counter's fd (dropped before the counter: field order).
    cond: Option<(std::sync::Arc<crate::wait::PCond>, crate::wait::Watch)>,
    /// The library's counter.
    pub cntr: shmfab::Counter,
    wait_obj: sys::fi_wait_obj,
    /// The wait set it waits through (FI_WAIT_SET), else null.
    wait: *const crate::wait::Wait,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(nb3),
    control: Some(control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static OPS: sys::fi_ops_cntr = sys::fi_ops_cntr {
    size: std::mem::size_of::<sys::fi_ops_cntr>(),
    read: Some(read),
    readerr: Some(readerr),
    add: Some(add),
    set: Some(set),
    wait: Some(wait),
    adderr: Some(adderr),
    seterr: Some(seterr),
};

impl Cntr {
    /// The domain it was opened from (alive while it is).
    pub fn domain(&self) -> &crate::domain::Domain {
        // SAFETY: the domain outlives what is opened from it (its close is
        // refused while its refs count this object).
        unsafe { &*self.dom }
    }
}

/// The counter behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Cntr> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_CNTR, &FI_OPS) }
}

/// `fi_cntr_open`.
///
/// # Safety
/// libfabric's contract.
pub unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cntr_attr,
    out: *mut *mut sys::fid_cntr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract.
    let Some(d) = (unsafe { crate::domain::of(domain.cast()) }) else { return EINVAL };
    if out.is_null() {
        return EINVAL;
    }
    // SAFETY: attr is null (defaults) or valid.
    let a = unsafe { attr.as_ref() }.copied().unwrap_or_default();
    if a.events != sys::FI_CNTR_EVENTS_COMP {
        return EINVAL;
    }
    if a.flags != 0 {
        return EBADFLAGS;
    }
    let wait_obj = match a.wait_obj {
        sys::FI_WAIT_NONE => WaitObj::None,
        sys::FI_WAIT_UNSPEC => WaitObj::Unspec,
        sys::FI_WAIT_YIELD => WaitObj::Yield,
        sys::FI_WAIT_FD => WaitObj::Fd,
        // Through the wait set named (opened by it, below).
        sys::FI_WAIT_SET => WaitObj::Unspec,
        // An FD counter whose fd the relay turns into broadcasts of the
        // pthread condition FI_GETWAIT hands out (`wait::PCond`).
        sys::FI_WAIT_MUTEX_COND => WaitObj::Fd,
        // Not offered by the library for counters.
        sys::FI_WAIT_POLLFD => return ENOSYS,
        _ => return EINVAL,
    };
    let (cntr, wait) = if a.wait_obj == sys::FI_WAIT_SET {
        // SAFETY: wait_set is null or a live fid (fi_cntr(3)).
        let Some(w) = (unsafe { crate::wait::of(a.wait_set.cast()) }) else { return EINVAL };
        match w.cntr_open(d) {
            Ok(c) => (c, w as *const crate::wait::Wait),
            Err(e) => return e,
        }
    } else {
        match d.dom.cntr_open_with(&CntrAttr { wait_obj }) {
            Ok(c) => (c, std::ptr::null()),
            Err(e) => return util::err(e, sys::FI_LOG_CNTR, "fi_cntr_open"),
        }
    };
    let cond = if a.wait_obj == sys::FI_WAIT_MUTEX_COND {
        let pc = crate::wait::PCond::new();
        let w = match cntr.wait_fd().map_err(|e| util::err(e, sys::FI_LOG_CNTR, "fi_cntr_open")) {
            Ok(fd) => crate::wait::watch(fd, &pc),
            Err(e) => Err(e),
        };
        match w {
            Ok(w) => Some((pc, w)),
            Err(e) => {
                let _ = cntr.close();
                return e;
            }
        }
    } else {
        None
    };
    d.refs.fetch_add(1, Relaxed);
    let b = Box::new(Cntr {
        fid: sys::fid_cntr { fid: util::fid(sys::FI_CLASS_CNTR, context, &FI_OPS), ops: util::ops(&OPS) },
        dom: d,
        cond,
        cntr,
        wait_obj: a.wait_obj,
        wait,
    });
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
    // SAFETY: `wait` is null or the set the cntr was opened through.
    let r = unsafe { crate::wait::close_member(c.wait, &c.cntr, || c.cntr.close(), "fi_close(cntr)") };
    if r != 0 {
        return r;
    }
    // SAFETY: the domain outlives its counters (refs).
    unsafe { &*c.dom }.refs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((c as *const Cntr).cast_mut()) });
    0
}

/// The counter of an ops call (libfabric passes the fid it got from us).
///
/// # Safety
/// `c` a live fid.
unsafe fn me<'a>(c: *mut sys::fid_cntr) -> Option<&'a Cntr> {
    // SAFETY: caller's contract.
    unsafe { of(c.cast()) }
}

/// `fi_cntr_read`: the value (0, logged, if the counter cannot be read:
/// the call has no error return).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn read(c: *mut sys::fid_cntr) -> u64 {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { me(c) }) else { return 0 };
    c.cntr.read().unwrap_or_else(|e| {
        util::err(e, sys::FI_LOG_CNTR, "fi_cntr_read");
        0
    })
}

/// `fi_cntr_readerr`, as `read`.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn readerr(c: *mut sys::fid_cntr) -> u64 {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { me(c) }) else { return 0 };
    c.cntr.readerr().unwrap_or_else(|e| {
        util::err(e, sys::FI_LOG_CNTR, "fi_cntr_readerr");
        0
    })
}

/// `add`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn add(c: *mut sys::fid_cntr, v: u64) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { me(c) }) else { return EINVAL };
    util::status(c.cntr.add(v), sys::FI_LOG_CNTR, "fi_cntr_add")
}

/// `set`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn set(c: *mut sys::fid_cntr, v: u64) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { me(c) }) else { return EINVAL };
    util::status(c.cntr.set(v), sys::FI_LOG_CNTR, "fi_cntr_set")
}

/// `adderr`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn adderr(c: *mut sys::fid_cntr, v: u64) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { me(c) }) else { return EINVAL };
    util::status(c.cntr.adderr(v), sys::FI_LOG_CNTR, "fi_cntr_adderr")
}

/// `seterr`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn seterr(c: *mut sys::fid_cntr, v: u64) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { me(c) }) else { return EINVAL };
    util::status(c.cntr.seterr(v), sys::FI_LOG_CNTR, "fi_cntr_seterr")
}

/// `fi_cntr_wait`: timeout in milliseconds, negative for ever.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn wait(c: *mut sys::fid_cntr, threshold: u64, ms: c_int) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(c) = (unsafe { me(c) }) else { return EINVAL };
    let t = (ms >= 0).then(|| Duration::from_millis(ms as u64));
    util::status(c.cntr.wait(threshold, t), sys::FI_LOG_CNTR, "fi_cntr_wait")
}

/// `fi_control` on a counter: FI_GETWAIT (the fd of FI_WAIT_FD, the
/// `struct fi_mutex_cond` of FI_WAIT_MUTEX_COND) and FI_GETWAITOBJ.
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
        sys::FI_GETWAIT if c.wait_obj == sys::FI_WAIT_FD => match c.cntr.wait_fd() {
            // SAFETY: arg is an int for FI_WAIT_FD.
            Ok(fd) => unsafe {
                *arg.cast::<c_int>() = fd;
                0
            },
            Err(e) => util::err(e, sys::FI_LOG_CNTR, "FI_GETWAIT"),
        },
        sys::FI_GETWAIT if c.wait_obj == sys::FI_WAIT_MUTEX_COND => match &c.cond {
            Some((pc, _)) => {
                // SAFETY: arg is a struct fi_mutex_cond (fi_control(3)).
                unsafe { pc.get(arg) };
                0
            }
            None => ENOSYS,
        },
        _ => ENOSYS,
    }
}
