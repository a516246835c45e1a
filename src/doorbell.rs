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

use crate::sync::{fence, Ordering};
use std::time::Duration;

/// Wakes a sleeping receiver if there is one. Call after publishing.
#[inline]
pub fn ring(db: &shm_layout::Doorbell) {
    // SYNC: orders our earlier publish (release store) before the sleepers
    // load; pairs with the fence in wait().
    fence(Ordering::SeqCst);
    if db.sleepers.load(Ordering::Relaxed) != 0 {
        db.futex.fetch_add(1, Ordering::Release);
        futex_wake(&db.futex);
    }
}

/// Sleeps until `has_work()` is true, the doorbell rings, or `timeout`
/// passes. Returns `has_work()`'s verdict from before sleeping if it was
/// true (no sleep), else false after waking (the caller re-checks).
pub fn wait(db: &shm_layout::Doorbell, mut has_work: impl FnMut() -> bool, timeout: Option<Duration>) -> bool {
    let seen = db.futex.load(Ordering::Acquire);
    db.sleepers.fetch_add(1, Ordering::Relaxed);
    // SYNC: pairs with the fence in ring(): either the signaller sees our
    // sleeper count, or we see its published work here.
    fence(Ordering::SeqCst);
    if has_work() {
        db.sleepers.fetch_sub(1, Ordering::Relaxed);
        return true;
    }
    futex_wait(&db.futex, seen, timeout);
    db.sleepers.fetch_sub(1, Ordering::Relaxed);
    false
}

/// Bumps the word and wakes every sleeper unconditionally (signal/close).
pub fn wake_all(db: &shm_layout::Doorbell) {
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

    #[test]
    fn loom_no_lost_wakeup() {
        loom::model(|| {
            let db = Arc::new(shm_layout::Doorbell {
                futex: crate::sync::AtomicU32::new(0),
                sleepers: crate::sync::AtomicU32::new(0),
            });
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
}
