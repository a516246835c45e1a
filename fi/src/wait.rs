//! Wait sets (`fi_wait_open`, `fi_wait`) on the library's wait set.
//!
//! libfabric opens a wait set on the fabric; the library's wait set
//! belongs to a domain (waiting drives that domain's progress). So the
//! library's set is made when the first CQ or counter joins (opened with
//! FI_WAIT_SET), on that member's domain, and members of another domain
//! are refused (`-FI_ENOSYS`: a wait set across domains is not built).
//! Wait objects: FI_WAIT_UNSPEC and FI_WAIT_YIELD (FI_WAIT_FD would need
//! the fd before any member names the domain: not built).
//!
//! The set holds a reference on that domain until the set closes: the
//! domain's close is `-FI_EBUSY` before (the set lives on it), and no
//! other domain can take its place (and its address) meanwhile.

use crate::sys;
use crate::util::{self, nb3, no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EBUSY, EINVAL, ENOSYS};
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A wait set.
#[repr(C)]
pub struct Wait {
    /// What the application holds.
    pub fid: sys::fid_wait,
    fabric: *const crate::fabric::Fabric,
    /// FI_WAIT_YIELD (else FI_WAIT_UNSPEC).
    yields: bool,
    /// The library's set and the domain it was made on (by the first
    /// member; the set holds one of the domain's `refs` until it closes).
    set: OnceLock<(usize, shmfab::WaitSet)>,
    /// CQs and counters in it (close is `-FI_EBUSY` while any is).
    refs: AtomicUsize,
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

static OPS: sys::fi_ops_wait = sys::fi_ops_wait { size: std::mem::size_of::<sys::fi_ops_wait>(), wait: Some(wait) };

/// The wait set behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Wait> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_WAIT, &FI_OPS) }
}

impl Wait {
    /// The library's set for a member of domain `d`: made on `d` by the
    /// first member; `-FI_ENOSYS` for a member of another domain.
    fn set_for(&self, d: &crate::domain::Domain) -> Result<&shmfab::WaitSet, c_int> {
        let key = d as *const crate::domain::Domain as usize;
        let w = if self.yields { shmfab::WaitObj::Yield } else { shmfab::WaitObj::Unspec };
        if self.set.get().is_none() {
            let s = d.dom.wait_open_with(w).map_err(|e| util::err(e, sys::FI_LOG_DOMAIN, "wait set"))?;
            // A set made meanwhile by another thread wins; ours is dropped.
            if self.set.set((key, s)).is_ok() {
                // Released by `close`.
                d.refs.fetch_add(1, Relaxed);
            }
        }
        let (k, s) = self.set.get().expect("set just above");
        if *k != key {
            return Err(ENOSYS);
        }
        Ok(s)
    }

    /// Opens a CQ of domain `d` that waits through this set.
    pub fn cq_open(&self, d: &crate::domain::Domain, attr: &shmfab::CqAttr) -> Result<shmfab::CompletionQueue, c_int> {
        let cq = self.set_for(d)?.cq_open(attr).map_err(|e| util::err(e, sys::FI_LOG_CQ, "fi_cq_open(wait set)"))?;
        self.refs.fetch_add(1, Relaxed);
        Ok(cq)
    }

    /// Opens a counter of domain `d` that waits through this set.
    pub fn cntr_open(&self, d: &crate::domain::Domain) -> Result<shmfab::Counter, c_int> {
        let c = self.set_for(d)?.cntr_open().map_err(|e| util::err(e, sys::FI_LOG_CNTR, "fi_cntr_open(wait set)"))?;
        self.refs.fetch_add(1, Relaxed);
        Ok(c)
    }
}

/// A library object that can wait through a wait set: a CQ or a counter.
pub trait Member {
    /// Its log subsystem.
    const SUBSYS: sys::fi_log_subsys;
    /// Its name in log lines.
    const NAME: &'static str;
    /// The log line of a failure to leave.
    const LEAVES: &'static str;
    /// Leaves the library's set `s` (`join` false) or joins it.
    fn join(&self, s: &shmfab::WaitSet, join: bool) -> shmfab::Result<()>;
}

impl Member for shmfab::CompletionQueue {
    const SUBSYS: sys::fi_log_subsys = sys::FI_LOG_CQ;
    const NAME: &'static str = "CQ";
    const LEAVES: &'static str = "wait set: CQ leaves";
    fn join(&self, s: &shmfab::WaitSet, join: bool) -> shmfab::Result<()> {
        if join {
            s.add_cq(self)
        } else {
            s.del_cq(self)
        }
    }
}

impl Member for shmfab::Counter {
    const SUBSYS: sys::fi_log_subsys = sys::FI_LOG_CNTR;
    const NAME: &'static str = "counter";
    const LEAVES: &'static str = "wait set: counter leaves";
    fn join(&self, s: &shmfab::WaitSet, join: bool) -> shmfab::Result<()> {
        if join {
            s.add_cntr(self)
        } else {
            s.del_cntr(self)
        }
    }
}

/// Closes `m`, a member of the wait set `w` (null: of none): 0, or the
/// negative errno of the step that failed (`close` closes it, `what`
/// names that close in the log).
///
/// A member closes in three steps: it leaves the library's set, closes,
/// and only then stops counting; a close the library refuses (still
/// bound) makes it join again. The count drops only with a close that
/// succeeded, so the set cannot close (and be freed) under a member that
/// still points at it, even when joining again fails (that member then
/// waits on its own until it closes: a member already out of the
/// library's set leaves at once).
///
/// # Safety
/// `w` null or the live wait set `m` was opened through (a wait set
/// outlives its members: its close is refused while they are in it).
pub unsafe fn close_member<M: Member>(
    w: *const Wait,
    m: &M,
    close: impl FnOnce() -> shmfab::Result<()>,
    what: &str,
) -> c_int {
    // SAFETY: caller's contract.
    let Some(w) = (unsafe { w.as_ref() }) else { return util::status(close(), M::SUBSYS, what) };
    let Some((_, s)) = w.set.get() else { return EINVAL };
    match m.join(s, false) {
        Err(e) if e.kind() != shmfab::ErrorKind::NoEnt => {
            return util::err(e, M::SUBSYS, M::LEAVES);
        }
        _ => {}
    }
    if let Err(e) = close() {
        if let Err(e) = m.join(s, true) {
            util::log(sys::FI_LOG_WARN, M::SUBSYS, &format!("wait set: {} does not join again: {e}", M::NAME));
        }
        return util::err(e, M::SUBSYS, what);
    }
    w.refs.fetch_sub(1, Relaxed);
    0
}

/// `fi_wait_open`.
///
/// # Safety
/// libfabric's contract: `fabric` a live fid, `attr` valid, `out` valid
/// for a write.
pub unsafe extern "C" fn open(
    fabric: *mut sys::fid_fabric,
    attr: *mut sys::fi_wait_attr,
    out: *mut *mut sys::fid_wait,
) -> c_int {
    // SAFETY: libfabric's contract.
    let (Some(f), Some(a)) = (unsafe { crate::fabric::of(fabric) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    if out.is_null() {
        return EINVAL;
    }
    if a.flags != 0 {
        return EBADFLAGS;
    }
    let yields = match a.wait_obj {
        sys::FI_WAIT_UNSPEC => false,
        sys::FI_WAIT_YIELD => true,
        sys::FI_WAIT_FD | sys::FI_WAIT_MUTEX_COND | sys::FI_WAIT_POLLFD => return ENOSYS,
        _ => return EINVAL,
    };
    f.refs.fetch_add(1, Relaxed);
    let b = Box::new(Wait {
        fid: sys::fid_wait { fid: util::fid(sys::FI_CLASS_WAIT, std::ptr::null_mut(), &FI_OPS), ops: util::ops(&OPS) },
        fabric: f,
        yields,
        set: OnceLock::new(),
        refs: AtomicUsize::new(0),
    });
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// `fi_close`: `-FI_EBUSY` while CQs or counters wait through it.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(w) = (unsafe { of(fid) }) else { return EINVAL };
    if w.refs.load(Relaxed) != 0 {
        return EBUSY;
    }
    if let Some((d, s)) = w.set.get() {
        if let Err(e) = s.close() {
            return util::err(e, sys::FI_LOG_DOMAIN, "fi_close(wait)");
        }
        // SAFETY: the key is the address of the domain the set was made
        // on, alive until this reference (taken in `set_for`) goes.
        unsafe { &*(*d as *const crate::domain::Domain) }.refs.fetch_sub(1, Relaxed);
    }
    // SAFETY: the fabric outlives its wait sets (refs).
    unsafe { &*w.fabric }.refs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((w as *const Wait).cast_mut()) });
    0
}

/// `fi_wait`: 0 when a member has an event, `-FI_ETIMEDOUT` after
/// `timeout` milliseconds (negative: for ever). Before any member joined,
/// nothing can happen but a member joining: it sleeps in short naps.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made.
unsafe extern "C" fn wait(ws: *mut sys::fid_wait, timeout: c_int) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(w) = (unsafe { of(ws.cast()) }) else { return EINVAL };
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    loop {
        if let Some((_, s)) = w.set.get() {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            return util::status(s.wait(left), sys::FI_LOG_DOMAIN, "fi_wait");
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return -sys::FI_ETIMEDOUT;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
