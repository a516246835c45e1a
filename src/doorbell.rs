//! The doorbell: one futex word per receiving domain, in its region.
//!
//! A waiter reads the futex word, announces itself in `sleepers`, fences,
//! re-checks for work, and only then FUTEX_WAITs on the value it read. A
//! signaller publishes its message, fences, and only if `sleepers` is
//! non-zero bumps the word and calls FUTEX_WAKE: the fast path makes no
//! system call. The two fences order "publish then look for sleepers"
//! against "announce then look for work": one side always sees the other,
//! so no wake-up is lost (a loom model checks this). Spurious wake-ups are
//! allowed. The futex is shared, not private: it crosses processes.
//!
//! The signaller's fence is on every send's fast path and costs a locked
//! instruction (about 8 ns on these VMs). Where the kernel offers
//! `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, every shmfab process
//! registers for it ([`init`]) and the fence moves to the waiter, which is
//! about to sleep anyway: the waiter's membarrier makes every CPU running a
//! registered process execute a full barrier, so the signallers need only a
//! compiler barrier (the asymmetric Dekker pattern the man page describes).
//! A process that could not register keeps the fence in `ring`; waiters
//! always fence too, so mixed processes stay correct.

use crate::sync::{fence, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

static ASYMMETRIC: OnceLock<bool> = OnceLock::new();

/// Set once [`init`] has found the asymmetric barrier available: what
/// [`asymmetric`] reads on every send, one load of a flag (the `OnceLock`
/// asked there took two loads and two tests). Process-wide, never reset;
/// a plain std atomic, outside the loom models (under loom `init` never
/// finds the barrier, and the flag stays false).
static ASYMMETRIC_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Registers this process for expedited global membarrier; returns whether
/// signallers of this process may skip their fence. Idempotent.
pub fn init() -> bool {
    let on = *ASYMMETRIC.get_or_init(|| {
        if cfg!(loom) || std::env::var_os("SHMFAB_NO_MEMBARRIER").is_some() {
            return false;
        }
        // SAFETY: membarrier takes integer arguments only.
        let q = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
        let want = (MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) as libc::c_long;
        // SAFETY: as above.
        q >= 0
            && q & want == want
            && unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) } == 0
    });
    if on {
        // SYNC: release pairs with the acquire load in asymmetric(): a
        // thread that sees the flag sees the process registered.
        ASYMMETRIC_ON.store(true, std::sync::atomic::Ordering::Release);
    }
    on
}

/// Whether this process's signallers may skip their fence. False until
/// [`init`] found the barrier (a thread that asks earlier fences: safe).
#[inline(always)]
fn asymmetric() -> bool {
    // SYNC: acquire pairs with the release store in init() (a plain load
    // on x86).
    ASYMMETRIC_ON.load(std::sync::atomic::Ordering::Acquire)
}

/// Wakes a sleeping receiver if there is one. Call after publishing.
/// Inlined into the send path as far as the test for sleepers in a
/// registered process (no call when nobody sleeps); the fenced variant and
/// the wake-up are out of line.
#[inline(always)]
pub fn ring(db: &shm_layout::Doorbell) {
    if !asymmetric() {
        return ring_fenced(db);
    }
    // SYNC: orders our earlier publish (release store) before the sleepers
    // load; pairs with the fence and membarrier in wait(): registered
    // processes get that barrier from the waiter's membarrier.
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    if db.sleepers.load(Ordering::Relaxed) != 0 {
        wake(db);
    }
}

/// [`ring`] in a process that could not register for membarrier.
#[inline(never)]
fn ring_fenced(db: &shm_layout::Doorbell) {
    // SYNC: orders our earlier publish (release store) before the sleepers
    // load; pairs with the fence in wait().
    fence(Ordering::SeqCst);
    if db.sleepers.load(Ordering::Relaxed) != 0 {
        wake(db);
    }
}

/// Bumps the word and wakes the sleepers ([`ring`] found some).
#[cold]
#[inline(never)]
fn wake(db: &shm_layout::Doorbell) {
    // SYNC: pairs with the acquire loads of the word in wait() and
    // announce() (and the bridge's in fdwait): a waiter that reads the
    // bump sees what was published before it. The wake-up's safety rests
    // on the fences, not on this.
    db.futex.fetch_add(1, Ordering::Release);
    futex_wake(&db.futex);
}

/// Rings a thread-safe domain's own doorbell for a completion or count
/// one thread made, which a thread asleep in the same domain re-checked
/// before it came (`CqState::wake`, `Bindings::wake`): out of line, off the
/// path of the default threading model.
#[cold]
#[inline(never)]
pub fn ring_own(db: std::ptr::NonNull<shm_layout::Doorbell>) {
    // SAFETY: the callers' pointers name the doorbell of a live domain's
    // region, which outlives the CQ and endpoint states holding them.
    let db = unsafe { db.as_ref() };
    // SYNC: as in ring(): orders what we queued before the load of the
    // watchers, against the waiter's fence (or membarrier) after it
    // announced itself and before its re-check.
    if asymmetric() {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
    // Only watchers: a sleeping progress thread needs no wake for what
    // this process made (it would cost a system call per completion).
    if db.watchers.load(Ordering::Relaxed) != 0 {
        // SYNC: pairs with the acquire loads of the word in wait_as() and
        // announce(), as in ring().
        db.futex.fetch_add(1, Ordering::Release);
        futex_wake(&db.futex);
    }
}

/// Sleeps until `has_work()` is true, the doorbell rings, or `timeout`
/// passes. Returns true if work was there (no sleep), false after sleeping
/// (the caller re-checks).
pub fn wait(db: &shm_layout::Doorbell, has_work: impl FnMut() -> bool, timeout: Option<Duration>) -> bool {
    wait_as(db, false, has_work, timeout)
}

/// As [`wait`]; a `watcher` also waits for what this process's own threads
/// make, which [`ring_own`] wakes it for.
pub fn wait_as(
    db: &shm_layout::Doorbell,
    watcher: bool,
    mut has_work: impl FnMut() -> bool,
    timeout: Option<Duration>,
) -> bool {
    // SYNC: pairs with the release bump in ring() and wake_all().
    let seen = db.futex.load(Ordering::Acquire);
    db.sleepers.fetch_add(1, Ordering::Relaxed);
    if watcher {
        // Relaxed: ordered before the re-check by the fence below, as the
        // sleepers count is (pairs with the fence in ring_own()).
        db.watchers.fetch_add(1, Ordering::Relaxed);
    }
    // SYNC: pairs with the fence in ring(): either the signaller sees our
    // sleeper count, or we see its published work here.
    fence(Ordering::SeqCst);
    if asymmetric() {
        // SYNC: a full barrier on every CPU running a registered process,
        // standing in for the fence registered signallers skip.
        // SAFETY: membarrier takes integer arguments only.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) };
    }
    if has_work() {
        withdraw(db, watcher);
        return true;
    }
    futex_wait(&db.futex, seen, timeout);
    withdraw(db, watcher);
    false
}

/// A sleeper (a watcher too, if `watcher`) is no longer asleep.
pub(crate) fn withdraw(db: &shm_layout::Doorbell, watcher: bool) {
    db.sleepers.fetch_sub(1, Ordering::Relaxed);
    if watcher {
        db.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sleeps on `word` while it holds `val`, at most `timeout` (None: no
/// limit); spurious returns possible.
pub(crate) fn futex_wait_shared(word: &crate::sync::AtomicU32, val: u32, timeout: Option<Duration>) {
    futex_wait(word, val, timeout)
}

/// Announces a sleeper (a watcher: the fd bridge) and makes the barrier
/// that pairs with `ring` and `ring_own`: returns the futex value seen
/// before announcing. The caller re-checks for work, then sleeps from that
/// value or withdraws ([`withdraw`] with `watcher` true).
pub(crate) fn announce(db: &shm_layout::Doorbell) -> u32 {
    // SYNC: pairs with the release bump in ring() and wake_all().
    let seen = db.futex.load(Ordering::Acquire);
    db.sleepers.fetch_add(1, Ordering::Relaxed);
    db.watchers.fetch_add(1, Ordering::Relaxed);
    // SYNC: as in wait(): pairs with the fence (or membarrier) in ring().
    fence(Ordering::SeqCst);
    if asymmetric() {
        // SAFETY: membarrier takes integer arguments only.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) };
    }
    seen
}

/// Bumps the word and wakes every sleeper unconditionally (signal/close).
pub fn wake_all(db: &shm_layout::Doorbell) {
    // SYNC: pairs with the acquire loads of the word in wait() and
    // announce() (and the bridge's in fdwait), as in ring().
    db.futex.fetch_add(1, Ordering::Release);
    futex_wake(&db.futex);
}

#[cfg(not(loom))]
fn futex_wait(word: &crate::sync::AtomicU32, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: word is a live, aligned u32 in a shared mapping; FUTEX_WAIT
    // (not private) only reads it; tsp is null or points at ts on our stack.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, val, tsp, 0usize, 0u32);
    }
}

#[cfg(not(loom))]
fn futex_wake(word: &crate::sync::AtomicU32) {
    // SAFETY: word is a live, aligned u32; FUTEX_WAKE does not touch memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
    }
}

// Under loom the futex is modelled as "sleep until the word changes": a lost
// wake-up then shows as a waiter that never finishes.
#[cfg(loom)]
fn futex_wait(word: &crate::sync::AtomicU32, val: u32, _timeout: Option<Duration>) {
    // SYNC: pairs with the release bump in ring() and wake_all(), as the
    // kernel's futex does.
    while word.load(Ordering::Acquire) == val {
        loom::thread::yield_now();
    }
}

#[cfg(loom)]
fn futex_wake(_word: &crate::sync::AtomicU32) {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn wakes_a_sleeper_and_times_out_without_one() {
        // SAFETY: all-zero is a valid Doorbell.
        let db: Arc<shm_layout::Doorbell> = Arc::new(unsafe { std::mem::zeroed() });
        let t0 = std::time::Instant::now();
        assert!(!wait(&db, || false, Some(Duration::from_millis(20))));
        assert!(t0.elapsed() >= Duration::from_millis(15), "timeout honoured");
        let flag = Arc::new(AtomicBool::new(false));
        let (d2, f2) = (db.clone(), flag.clone());
        let h = std::thread::spawn(move || {
            let mut rounds = 0;
            while !f2.load(std::sync::atomic::Ordering::Acquire) {
                wait(&d2, || f2.load(std::sync::atomic::Ordering::Acquire), Some(Duration::from_secs(10)));
                rounds += 1;
            }
            rounds
        });
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, std::sync::atomic::Ordering::Release);
        ring(&db);
        let rounds = h.join().unwrap();
        assert!(rounds <= 2, "woken, not timed out: {rounds}");
        assert_eq!(db.sleepers.load(Ordering::Relaxed), 0);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    fn doorbell() -> Arc<shm_layout::Doorbell> {
        Arc::new(shm_layout::Doorbell {
            futex: crate::sync::AtomicU32::new(0),
            sleepers: crate::sync::AtomicU32::new(0),
            watchers: crate::sync::AtomicU32::new(0),
        })
    }

    #[test]
    fn loom_no_lost_wakeup() {
        loom::model(|| {
            let db = doorbell();
            let work = Arc::new(AtomicBool::new(false));
            let (d2, w2) = (db.clone(), work.clone());
            let sig = loom::thread::spawn(move || {
                // SYNC: the publish the waiter must see.
                w2.store(true, Ordering::Release);
                ring(&d2);
            });
            while !work.load(Ordering::Acquire) {
                wait(&db, || work.load(Ordering::Acquire), None);
            }
            sig.join().unwrap();
        });
    }

    /// A watcher asleep is woken by what another thread of its process
    /// makes (`ring_own`), which wakes no one else.
    #[test]
    fn loom_a_watcher_gets_what_its_own_threads_make() {
        loom::model(|| {
            let db = doorbell();
            let work = Arc::new(AtomicBool::new(false));
            let (d2, w2) = (db.clone(), work.clone());
            let sig = loom::thread::spawn(move || {
                // SYNC: the completion the watcher must see.
                w2.store(true, Ordering::Release);
                ring_own(std::ptr::NonNull::from(&*d2));
            });
            while !work.load(Ordering::Acquire) {
                wait_as(&db, true, || work.load(Ordering::Acquire), None);
            }
            sig.join().unwrap();
            assert_eq!(db.watchers.load(Ordering::Relaxed), 0);
        });
    }
}
