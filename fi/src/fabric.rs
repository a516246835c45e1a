//! The fabric object (`fi_fabric`): configuration from the environment,
//! and what domains and event queues are opened from.

use crate::sys;
use crate::util::{self, nb4, nb5, no_ops_open, no_ops_set, no_tostr, EBUSY, EINVAL};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A fabric: libfabric's `fid_fabric`, first, then the library's fabric.
#[repr(C)]
pub struct Fabric {
    /// What the application holds.
    pub fid: sys::fid_fabric,
    /// The library's fabric.
    pub fabric: shmfab::Fabric,
    /// Domains and event queues open from it (close is `-FI_EBUSY` while
    /// any is).
    pub refs: AtomicUsize,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(nb3_bind),
    control: Some(nb3_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static OPS: sys::fi_ops_fabric = sys::fi_ops_fabric {
    size: std::mem::size_of::<sys::fi_ops_fabric>(),
    domain: Some(crate::domain::open),
    passive_ep: Some(nb4),
    eq_open: Some(crate::eq::open),
    wait_open: Some(crate::wait::open),
    trywait: Some(trywait),
    domain2: Some(nb5),
};

/// `fi_fabric_bind`: nothing binds to a fabric.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn nb3_bind(_: *mut sys::fid, _: *mut sys::fid, _: u64) -> c_int {
    util::ENOSYS
}

/// `fi_control` on a fabric: no commands.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn nb3_control(_: *mut sys::fid, _: c_int, _: *mut c_void) -> c_int {
    util::ENOSYS
}

/// `fi_trywait` over CQs, counters and wait sets (`-FI_EINVAL` for any
/// other fid): `0` when the caller may block on their wait objects,
/// `-FI_EAGAIN` when it should read them first. The library's
/// `Domain::trywait_with`, once per domain of the CQs and counters, and
/// once per wait set (`wait::Wait::trywait`).
///
/// # Safety
/// libfabric's contract: `fids` holds `count` live fids.
unsafe extern "C" fn trywait(_: *mut sys::fid_fabric, fids: *mut *mut sys::fid, count: c_int) -> c_int {
    if count < 0 || (count > 0 && fids.is_null()) {
        return EINVAL;
    }
    let fids = if count == 0 {
        &[][..]
    } else {
        // SAFETY: fids holds count entries (libfabric's contract).
        unsafe { std::slice::from_raw_parts(fids, count as usize) }
    };
    // Per domain: its CQs and counters.
    type Group<'a> = (&'a crate::domain::Domain, Vec<&'a shmfab::CompletionQueue>, Vec<&'a shmfab::Counter>);
    let mut groups: Vec<Group<'_>> = Vec::new();
    for &f in fids {
        // SAFETY: each is a live fid; `of` checks class and ops.
        let (d, cq, cntr) = unsafe {
            if let Some(c) = crate::cq::of(f) {
                (c.domain(), Some(&c.cq), None)
            } else if let Some(c) = crate::cntr::of(f) {
                (c.domain(), None, Some(&c.cntr))
            } else if let Some(w) = crate::wait::of(f) {
                match w.trywait() {
                    0 => continue,
                    r => return r,
                }
            } else {
                return EINVAL;
            }
        };
        let i = match groups.iter().position(|g| std::ptr::eq(g.0, d)) {
            Some(i) => i,
            None => {
                groups.push((d, Vec::new(), Vec::new()));
                groups.len() - 1
            }
        };
        groups[i].1.extend(cq);
        groups[i].2.extend(cntr);
    }
    for (d, cqs, cntrs) in &groups {
        if let Err(e) = d.dom.trywait_with(cqs, cntrs, &[]) {
            return util::err(e, sys::FI_LOG_FABRIC, "fi_trywait");
        }
    }
    0
}

/// The fabric behind a `fid_fabric` the application passed.
///
/// # Safety
/// `f` must be null or a live fid.
pub unsafe fn of<'a>(f: *mut sys::fid_fabric) -> Option<&'a Fabric> {
    // SAFETY: caller's contract; Fabric starts with its fid.
    unsafe { util::ours(f.cast(), sys::FI_CLASS_FABRIC, &FI_OPS) }
}

/// The provider's `fabric` entry (`fi_fabric`).
///
/// # Safety
/// libfabric's contract: `attr` valid, `out` valid for a write.
pub unsafe extern "C" fn open(
    attr: *mut sys::fi_fabric_attr,
    out: *mut *mut sys::fid_fabric,
    context: *mut c_void,
) -> c_int {
    if attr.is_null() || out.is_null() {
        return EINVAL;
    }
    // SAFETY: attr is valid (checked non-null, libfabric's contract).
    let attr = unsafe { &*attr };
    if !attr.name.is_null() {
        // SAFETY: a non-null name is a NUL-terminated string.
        let n = unsafe { std::ffi::CStr::from_ptr(attr.name) };
        if n != crate::info::NAME {
            return util::ENODATA;
        }
    }
    let fabric = match shmfab::Fabric::open() {
        Ok(f) => f,
        Err(e) => return util::err(e, sys::FI_LOG_FABRIC, "fi_fabric"),
    };
    let api_version = if attr.api_version == 0 { crate::info::API_VERSION } else { attr.api_version };
    let b = Box::new(Fabric {
        fid: sys::fid_fabric {
            fid: util::fid(sys::FI_CLASS_FABRIC, context, &FI_OPS),
            ops: util::ops(&OPS),
            api_version,
        },
        fabric,
        refs: AtomicUsize::new(0),
    });
    // SAFETY: out is valid for a write (checked non-null).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// `close`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes the fid it got from us.
    let Some(f) = (unsafe { util::ours::<Fabric>(fid, sys::FI_CLASS_FABRIC, &FI_OPS) }) else {
        return EINVAL;
    };
    if f.refs.load(Relaxed) != 0 {
        return EBUSY;
    }
    // SAFETY: the fabric came from Box::leak in `open`, has no children,
    // and the application gives up its handle with this call.
    drop(unsafe { Box::from_raw((f as *const Fabric).cast_mut()) });
    0
}
