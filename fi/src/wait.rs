//! Wait sets (`fi_wait_open`, `fi_wait`) on the library's wait set.
//!
//! libfabric opens a wait set on the fabric; the library's wait set
//! belongs to a domain (waiting drives that domain's progress). So the
//! library's set is made when the first CQ or counter joins (opened with
//! FI_WAIT_SET), on that member's domain, and members of another domain
//! are refused (`-FI_ENOSYS`: a wait set across domains is not built).
//! Wait objects: FI_WAIT_UNSPEC, FI_WAIT_YIELD, FI_WAIT_FD and
//! FI_WAIT_MUTEX_COND. FI_GETWAIT must give an FD set's fd before any
//! member names the domain: it is an epoll instance of the provider's,
//! made at open, to which the library set's fd is added when the set is
//! made (an epoll fd is readable while a descriptor in it is). A
//! MUTEX_COND set's library set is an FD one, watched by the relay
//! ([`PCond`]). `fi_trywait` takes a set (`fabric.rs`) and arms its
//! domain as for CQs; before any member joined there is nothing to wait
//! for, and it returns 0.
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
    /// The wait object: FI_WAIT_UNSPEC, _YIELD, _FD or _MUTEX_COND.
    wait_obj: sys::fi_wait_obj,
    /// FI_WAIT_FD: the epoll instance FI_GETWAIT gives (the library set's
    /// fd is added to it when the set is made).
    epfd: Option<std::os::fd::OwnedFd>,
    /// FI_WAIT_MUTEX_COND: the pthread objects FI_GETWAIT gives.
    pcond: Option<std::sync::Arc<PCond>>,
    /// FI_WAIT_MUTEX_COND: the relay's watch of the library set's fd (made
    /// with the set; dropped when it closes, before its fd does).
    watch: std::sync::Mutex<Option<Watch>>,
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
    control: Some(control),
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
        let w = match self.wait_obj {
            sys::FI_WAIT_YIELD => shmfab::WaitObj::Yield,
            sys::FI_WAIT_FD | sys::FI_WAIT_MUTEX_COND => shmfab::WaitObj::Fd,
            _ => shmfab::WaitObj::Unspec,
        };
        if self.set.get().is_none() {
            let s = d.dom.wait_open_with(w).map_err(|e| util::err(e, sys::FI_LOG_DOMAIN, "wait set"))?;
            let fd = if w == shmfab::WaitObj::Fd {
                Some(s.wait_fd().map_err(|e| util::err(e, sys::FI_LOG_DOMAIN, "wait set"))?)
            } else {
                None
            };
            // A set made meanwhile by another thread wins; ours is dropped.
            if self.set.set((key, s)).is_ok() {
                // Released by `close`.
                d.refs.fetch_add(1, Relaxed);
                if let Some(fd) = fd {
                    self.connect(fd)?;
                }
            }
        }
        let (k, s) = self.set.get().expect("set just above");
        if *k != key {
            return Err(ENOSYS);
        }
        Ok(s)
    }

    /// Connects the library set's fd to what FI_GETWAIT gave: the epoll
    /// instance (FI_WAIT_FD) or the relay (FI_WAIT_MUTEX_COND).
    fn connect(&self, fd: c_int) -> Result<(), c_int> {
        use std::os::fd::AsRawFd;
        if let Some(ep) = &self.epfd {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 0 };
            // SAFETY: both descriptors are live (the set's fd until the set
            // closes, which removes it from the epoll instance with it).
            if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(-sys::FI_ENOMEM);
            }
        }
        if let Some(pc) = &self.pcond {
            *self.watch.lock().unwrap_or_else(|p| p.into_inner()) = Some(watch(fd, pc)?);
        }
        Ok(())
    }

    /// `fi_trywait` on the set: 0 when the caller may block on its wait
    /// object, `-FI_EAGAIN` when a member has an event (the library's
    /// `Domain::trywait_with` with the set); 0 before any member joined.
    pub fn trywait(&self) -> c_int {
        let Some((d, s)) = self.set.get() else { return 0 };
        // SAFETY: the key is the address of the domain the set was made on,
        // alive while the set holds its reference.
        let d = unsafe { &*(*d as *const crate::domain::Domain) };
        util::status(d.dom.trywait_with(&[], &[], &[s]), sys::FI_LOG_DOMAIN, "fi_trywait(wait set)")
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
    let (mut epfd, mut pcond) = (None, None);
    match a.wait_obj {
        sys::FI_WAIT_UNSPEC | sys::FI_WAIT_YIELD => {}
        sys::FI_WAIT_FD => {
            use std::os::fd::FromRawFd;
            // SAFETY: plain syscall.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return -sys::FI_ENOMEM;
            }
            // SAFETY: a new descriptor we own.
            epfd = Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        }
        sys::FI_WAIT_MUTEX_COND => pcond = Some(PCond::new()),
        sys::FI_WAIT_POLLFD => return ENOSYS,
        _ => return EINVAL,
    }
    f.refs.fetch_add(1, Relaxed);
    let b = Box::new(Wait {
        fid: sys::fid_wait { fid: util::fid(sys::FI_CLASS_WAIT, std::ptr::null_mut(), &FI_OPS), ops: util::ops(&OPS) },
        fabric: f,
        wait_obj: a.wait_obj,
        epfd,
        pcond,
        watch: std::sync::Mutex::new(None),
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
        // The relay lets go of the set's fd (still open: the library's
        // handle holds it until the set is dropped below).
        drop(w.watch.lock().unwrap_or_else(|p| p.into_inner()).take());
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

/// `fi_control` on a wait set: FI_GETWAIT (the epoll fd of FI_WAIT_FD,
/// the `struct fi_mutex_cond` of FI_WAIT_MUTEX_COND) and FI_GETWAITOBJ.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and `arg`
/// valid as fi_control(3) says for the command.
unsafe extern "C" fn control(fid: *mut sys::fid, command: c_int, arg: *mut std::ffi::c_void) -> c_int {
    use std::os::fd::AsRawFd;
    // SAFETY: libfabric passes our fid.
    let Some(w) = (unsafe { of(fid) }) else { return EINVAL };
    if arg.is_null() {
        return EINVAL;
    }
    match command as u32 {
        sys::FI_GETWAITOBJ => {
            // SAFETY: arg is an enum fi_wait_obj (fi_control(3)).
            unsafe { *arg.cast::<sys::fi_wait_obj>() = w.wait_obj };
            0
        }
        sys::FI_GETWAIT => {
            if let Some(ep) = &w.epfd {
                // SAFETY: arg is an int for FI_WAIT_FD.
                unsafe { *arg.cast::<c_int>() = ep.as_raw_fd() };
                0
            } else if let Some(pc) = &w.pcond {
                // SAFETY: arg is a struct fi_mutex_cond for FI_WAIT_MUTEX_COND.
                unsafe { pc.get(arg) };
                0
            } else {
                ENOSYS
            }
        }
        _ => ENOSYS,
    }
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

/// A FI_WAIT_MUTEX_COND wait object: the pthread mutex and condition
/// variable FI_GETWAIT hands out (`struct fi_mutex_cond`), broadcast (under
/// the mutex) whenever the object may have an event. The library's own
/// mutex/condvar are Rust's, which an application cannot wait on, so the
/// provider opens the library's object with an FD wait object and the
/// relay thread ([`watch`]) turns each time the library makes that fd
/// readable (after `fi_trywait` armed it) into a broadcast. The protocol
/// is fi_trywait(3)'s: lock the mutex, `fi_trywait`, and only if it
/// returned 0 `pthread_cond_wait`; the relay's broadcast takes the mutex,
/// so it cannot fall between the two.
pub struct PCond {
    mutex: std::cell::UnsafeCell<libc::pthread_mutex_t>,
    cond: std::cell::UnsafeCell<libc::pthread_cond_t>,
}

// SAFETY: the pthread objects are made for use from any thread; they are
// only touched through pthread calls (and their addresses handed out).
unsafe impl Send for PCond {}
// SAFETY: as above.
unsafe impl Sync for PCond {}

impl PCond {
    /// A new mutex and condition variable (their addresses never move: the
    /// object lives in an `Arc`).
    pub fn new() -> std::sync::Arc<PCond> {
        std::sync::Arc::new(PCond {
            mutex: std::cell::UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
            cond: std::cell::UnsafeCell::new(libc::PTHREAD_COND_INITIALIZER),
        })
    }

    /// Wakes every thread waiting on the condition variable.
    pub fn broadcast(&self) {
        // SAFETY: initialised pthread objects at fixed addresses; the lock
        // is held only around the broadcast.
        unsafe {
            libc::pthread_mutex_lock(self.mutex.get());
            libc::pthread_cond_broadcast(self.cond.get());
            libc::pthread_mutex_unlock(self.mutex.get());
        }
    }

    /// FI_GETWAIT: writes the `struct fi_mutex_cond` at `arg`.
    ///
    /// # Safety
    /// `arg` valid for a write of a `struct fi_mutex_cond`.
    pub unsafe fn get(&self, arg: *mut std::ffi::c_void) {
        // SAFETY: caller's contract; the pthread types are the same C types
        // under two bindings.
        unsafe {
            *arg.cast::<sys::fi_mutex_cond>() =
                sys::fi_mutex_cond { mutex: self.mutex.get().cast(), cond: self.cond.get().cast() };
        }
    }
}

impl Drop for PCond {
    fn drop(&mut self) {
        // SAFETY: nobody holds them any more (last reference).
        unsafe {
            libc::pthread_cond_destroy(self.cond.get());
            libc::pthread_mutex_destroy(self.mutex.get());
        }
    }
}

/// The relay: one thread of the provider, started by the first
/// FI_WAIT_MUTEX_COND object, waiting in `epoll_wait` (edge-triggered:
/// each write to a watched eventfd is one event, without reading it: the
/// library empties its fds itself) and broadcasting the condition of the
/// fd that fired.
struct Relay {
    epfd: std::os::fd::OwnedFd,
    /// Watched objects by token (the epoll event's data).
    conds: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Arc<PCond>>>,
    next: std::sync::atomic::AtomicU64,
}

fn relay() -> Result<&'static Relay, c_int> {
    static RELAY: OnceLock<Option<Relay>> = OnceLock::new();
    RELAY
        .get_or_init(|| {
            use std::os::fd::FromRawFd;
            // SAFETY: plain syscall.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return None;
            }
            // SAFETY: fd is a new descriptor we own.
            let epfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
            let r = Relay { epfd, conds: Default::default(), next: 1.into() };
            // The thread lives as long as the process (the provider is
            // never unloaded: linked -z nodelete); it sleeps in the kernel.
            std::thread::Builder::new().name("shmfab-fi-cond".into()).spawn(relay_run).ok()?;
            Some(r)
        })
        .as_ref()
        .ok_or(-sys::FI_ENOMEM)
}

fn relay_run() {
    use std::os::fd::AsRawFd;
    // Spawned inside the initialiser: this waits for it to finish.
    let Ok(r) = relay() else { return };
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 16];
    loop {
        // SAFETY: ev holds 16 events; epfd is live for the process.
        let n = unsafe { libc::epoll_wait(r.epfd.as_raw_fd(), ev.as_mut_ptr(), ev.len() as c_int, -1) };
        for e in ev.iter().take(n.max(0) as usize) {
            let token = e.u64;
            // Cloned out of the map: the broadcast takes the application's
            // mutex, which must never wait on the map's lock.
            let c = r.conds.lock().unwrap_or_else(|p| p.into_inner()).get(&token).cloned();
            if let Some(c) = c {
                c.broadcast();
            }
        }
    }
}

/// A watch of the relay: the condition is broadcast each time `fd` is made
/// readable, until the watch is dropped (before the fd closes).
pub struct Watch {
    token: u64,
    fd: c_int,
}

/// Watches `fd` (an eventfd of the library's) for `c`.
pub fn watch(fd: c_int, c: &std::sync::Arc<PCond>) -> Result<Watch, c_int> {
    use std::os::fd::AsRawFd;
    let r = relay()?;
    let token = r.next.fetch_add(1, Relaxed);
    r.conds.lock().unwrap_or_else(|p| p.into_inner()).insert(token, c.clone());
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLET) as u32, u64: token };
    // SAFETY: epfd and fd are live descriptors; ev is valid.
    if unsafe { libc::epoll_ctl(r.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        r.conds.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
        return Err(-sys::FI_ENOMEM);
    }
    Ok(Watch { token, fd })
}

impl Drop for Watch {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        let Ok(r) = relay() else { return };
        // SAFETY: epfd is live; fd is still open (dropped before its owner).
        unsafe { libc::epoll_ctl(r.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, self.fd, std::ptr::null_mut()) };
        r.conds.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.token);
    }
}
