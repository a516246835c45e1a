//! Poll sets (`fi_poll_open`): CQs and counters of one domain polled
//! together, over the library's poll set. `fi_poll` makes a progress pass
//! and returns the contexts (given at their open) of the CQs that hold
//! entries and of the counters that changed since the last poll.

use crate::sys;
use crate::util::{self, nb3, no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EINVAL};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

/// A poll set.
#[repr(C)]
pub struct Poll {
    /// What the application holds.
    pub fid: sys::fid_poll,
    dom: *const crate::domain::Domain,
    /// The library's poll set.
    pub set: shmfab::PollSet,
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

static OPS: sys::fi_ops_poll = sys::fi_ops_poll {
    size: std::mem::size_of::<sys::fi_ops_poll>(),
    poll: Some(poll),
    poll_add: Some(add),
    poll_del: Some(del),
};

/// The poll set behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Poll> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_POLL, &FI_OPS) }
}

/// `fi_poll_open`.
///
/// # Safety
/// libfabric's contract: `domain` a live fid, `attr` null or valid, `out`
/// valid for a write.
pub unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_poll_attr,
    out: *mut *mut sys::fid_poll,
) -> c_int {
    // SAFETY: libfabric's contract.
    let Some(d) = (unsafe { crate::domain::of(domain.cast()) }) else { return EINVAL };
    if out.is_null() {
        return EINVAL;
    }
    // SAFETY: attr is null or valid.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.flags != 0) {
        return EBADFLAGS;
    }
    let set = match d.dom.poll_open() {
        Ok(s) => s,
        Err(e) => return util::err(e, sys::FI_LOG_DOMAIN, "fi_poll_open"),
    };
    d.refs.fetch_add(1, Relaxed);
    let b = Box::new(Poll {
        fid: sys::fid_poll { fid: util::fid(sys::FI_CLASS_POLL, std::ptr::null_mut(), &FI_OPS), ops: util::ops(&OPS) },
        dom: d,
        set,
    });
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// `fi_close`: `-FI_EBUSY` while it has members.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(p) = (unsafe { of(fid) }) else { return EINVAL };
    if let Err(e) = p.set.close() {
        return util::err(e, sys::FI_LOG_DOMAIN, "fi_close(poll)");
    }
    // SAFETY: the domain outlives what is opened from it (refs).
    unsafe { &*p.dom }.refs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((p as *const Poll).cast_mut()) });
    0
}

/// `fi_poll`: up to `count` contexts into `context`.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `context`
/// holds `count` pointers.
unsafe extern "C" fn poll(ps: *mut sys::fid_poll, context: *mut *mut c_void, count: c_int) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(p) = (unsafe { of(ps.cast()) }) else { return EINVAL };
    if count < 0 || (count > 0 && context.is_null()) {
        return EINVAL;
    }
    let out: &mut [usize] = if count == 0 {
        &mut []
    } else {
        // SAFETY: context holds count pointers, which have usize's layout.
        unsafe { std::slice::from_raw_parts_mut(context.cast::<usize>(), count as usize) }
    };
    match p.set.poll(out) {
        Ok(n) => n as c_int,
        Err(e) => util::err(e, sys::FI_LOG_DOMAIN, "fi_poll"),
    }
}

/// `fi_poll_add` / `fi_poll_del` of a CQ or counter.
///
/// # Safety
/// `ps` and `member` live fids.
unsafe fn change(ps: *mut sys::fid_poll, member: *mut sys::fid, flags: u64, add: bool) -> c_int {
    // SAFETY: caller's contract.
    let Some(p) = (unsafe { of(ps.cast()) }) else { return EINVAL };
    if flags != 0 {
        return EBADFLAGS;
    }
    // SAFETY: member is a live fid; `of` checks class and ops.
    let r = unsafe {
        if let Some(c) = crate::cq::of(member) {
            let ctx = c.fid.fid.context as usize;
            if add {
                p.set.add_cq(&c.cq, ctx)
            } else {
                p.set.del_cq(&c.cq)
            }
        } else if let Some(c) = crate::cntr::of(member) {
            let ctx = c.fid.fid.context as usize;
            if add {
                p.set.add_cntr(&c.cntr, ctx)
            } else {
                p.set.del_cntr(&c.cntr)
            }
        } else {
            return EINVAL;
        }
    };
    util::status(r, sys::FI_LOG_DOMAIN, if add { "fi_poll_add" } else { "fi_poll_del" })
}

/// `fi_poll_add`: the member's context (given at its open) is what
/// `fi_poll` returns for it.
///
/// # Safety
/// libfabric's contract: live fids.
unsafe extern "C" fn add(ps: *mut sys::fid_poll, member: *mut sys::fid, flags: u64) -> c_int {
    // SAFETY: libfabric's contract, passed on.
    unsafe { change(ps, member, flags, true) }
}

/// `fi_poll_del`.
///
/// # Safety
/// libfabric's contract: live fids.
unsafe extern "C" fn del(ps: *mut sys::fid_poll, member: *mut sys::fid, flags: u64) -> c_int {
    // SAFETY: libfabric's contract, passed on.
    unsafe { change(ps, member, flags, false) }
}
