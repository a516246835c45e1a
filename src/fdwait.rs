//! FD wait objects: an eventfd per CQ opened with [`WaitObj::Fd`], which
//! poll, select and epoll report readable when a completion may be there,
//! even one caused by another process (which cannot write our eventfd).
//!
//! The bridge: [`trywait`](crate::Domain::trywait) runs a progress pass and,
//! when nothing is there to read, announces a sleeper on the domain's
//! doorbell, re-checks, and hands the futex value it saw to a small thread
//! of the domain. That thread sleeps on the futex; a sender that rings the
//! doorbell wakes it, and it makes every FD CQ of the domain readable, then
//! withdraws its announcement. Senders pay for a wake-up only while an
//! application is really blocked on an fd. While something is pending with
//! a peer, trywait arms the bridge with the peer-check period: it then
//! fires when that passes even if nothing rang (a peer's death rings
//! nothing), and the application's next trywait checks peers' lives.
//!
//! [`WaitObj::Fd`]: crate::cq::WaitObj::Fd

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The bridge of one domain.
pub(crate) struct Bridge {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    /// While armed and not yet fired: the futex value seen, and when to
    /// fire even if nothing rang.
    armed: Mutex<Option<(u32, Option<Instant>)>>,
    cv: Condvar,
    stop: AtomicBool,
    /// The eventfds to make readable.
    fds: Mutex<Vec<Arc<OwnedFd>>>,
    /// The mutex/condvar wait objects to signal.
    conds: Mutex<Vec<Arc<MutexCond>>>,
    /// The domain's doorbell (in its region, which outlives the bridge:
    /// DomainInner stops the bridge before its region is unmapped).
    doorbell: usize,
}

/// A FI_WAIT_MUTEX_COND wait object: a generation bumped (and the condvar
/// notified) whenever a completion may be there. Wait while the generation
/// is the one you saw before `trywait` returned `Ok`.
#[derive(Default)]
pub struct MutexCond {
    /// Generation, bumped at each signal.
    pub mutex: Mutex<u64>,
    /// Notified at each signal.
    pub cond: Condvar,
}

impl MutexCond {
    /// Bumps the generation and wakes the waiters.
    pub fn signal(&self) {
        *self.mutex.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.cond.notify_all();
    }
}

/// A new non-blocking eventfd.
pub(crate) fn eventfd() -> crate::Result<Arc<OwnedFd>> {
    let fd = rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC)?;
    Ok(Arc::new(fd))
}

/// Makes an eventfd readable.
pub(crate) fn poke(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Empties an eventfd (not readable any more).
pub(crate) fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = rustix::io::read(fd, &mut b);
}

impl Bridge {
    pub(crate) fn start(doorbell: &shm_layout::Doorbell) -> Bridge {
        let shared = Arc::new(Shared {
            armed: Mutex::new(None),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            fds: Mutex::new(Vec::new()),
            conds: Mutex::new(Vec::new()),
            doorbell: doorbell as *const _ as usize,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("shmfab-fd-bridge".into())
            .spawn(move || run(&s))
            .expect("spawn the fd bridge thread");
        Bridge { shared, thread: Some(thread) }
    }

    pub(crate) fn add(&self, fd: Arc<OwnedFd>) {
        self.shared.fds.lock().unwrap_or_else(|p| p.into_inner()).push(fd);
    }

    pub(crate) fn add_cond(&self, c: Arc<MutexCond>) {
        self.shared.conds.lock().unwrap_or_else(|p| p.into_inner()).push(c);
    }

    pub(crate) fn remove_cond(&self, c: &Arc<MutexCond>) {
        self.shared.conds.lock().unwrap_or_else(|p| p.into_inner()).retain(|x| !Arc::ptr_eq(x, c));
    }

    pub(crate) fn remove(&self, fd: &OwnedFd) {
        let raw = fd.as_raw_fd();
        self.shared.fds.lock().unwrap_or_else(|p| p.into_inner()).retain(|f| f.as_raw_fd() != raw);
    }

    /// Whether an earlier trywait's arming has not fired yet: None if not,
    /// else whether it fires after a period even if nothing rings.
    pub(crate) fn armed(&self) -> Option<bool> {
        self.shared.armed.lock().unwrap_or_else(|p| p.into_inner()).map(|(_, d)| d.is_some())
    }

    /// Hands over an announced sleeper: the bridge waits on the futex from
    /// value `seen` (at most `period`, if given: then it fires anyway) and
    /// withdraws the announcement when it fires.
    pub(crate) fn arm(&self, seen: u32, period: Option<Duration>) {
        let deadline = period.map(|p| Instant::now() + p);
        *self.shared.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some((seen, deadline));
        self.shared.cv.notify_one();
    }
}

fn run(s: &Shared) {
    // SAFETY: see Shared::doorbell: the doorbell outlives this thread.
    let db = unsafe { &*(s.doorbell as *const shm_layout::Doorbell) };
    loop {
        let (seen, deadline) = {
            let mut a = s.armed.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(v) = *a {
                    break v;
                }
                a = s.cv.wait(a).unwrap_or_else(|p| p.into_inner());
            }
        };
        // Sleep until a sender rings (or the value already moved on), or
        // the period passes.
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if !left.is_some_and(|l| l.is_zero()) {
            crate::doorbell::futex_wait_shared(&db.futex, seen, left);
        }
        if s.stop.load(Ordering::Acquire) {
            crate::doorbell::withdraw(db, true);
            return;
        }
        // SYNC: pairs with the release bump in ring() and wake_all().
        let rang = db.futex.load(Ordering::Acquire) != seen;
        if !rang && deadline.is_none_or(|d| Instant::now() < d) {
            continue; // spurious: still armed, sleep again
        }
        crate::doorbell::withdraw(db, true);
        *s.armed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        s.fire();
    }
}

impl Shared {
    fn fire(&self) {
        for fd in self.fds.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            poke(fd);
        }
        for c in self.conds.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            c.signal();
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cv.notify_one();
        // SAFETY: as in run().
        let db = unsafe { &*(self.shared.doorbell as *const shm_layout::Doorbell) };
        crate::doorbell::wake_all(db);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
