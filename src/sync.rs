//! Atomics for the lock-free protocols: std's, or loom's under `cfg(loom)`
//! (re-exported from `shm_layout::sync`, so shared types and the code that
//! drives them use the same ones).

pub use shm_layout::sync::{fence, AtomicU32, AtomicU64, Ordering};

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicBool;

/// Plain (non-atomic) data in shared memory, as a loom model sees it: a
/// handle built for a model carries one of these per piece of plain data
/// it hands over (a queue cell's payload, a slot's address) and reports
/// each read and write of that data to it, so that loom fails the model
/// when an access is not ordered after the last conflicting one (the
/// orderings that hand the data over are then checked, not only the
/// atomics' values). Handles made outside the models carry none.
#[cfg(loom)]
pub(crate) struct Tracked(loom::cell::UnsafeCell<()>);

#[cfg(loom)]
impl Tracked {
    /// A fresh stand-in (inside a model only).
    #[cfg(test)]
    pub(crate) fn new() -> Tracked {
        Tracked(loom::cell::UnsafeCell::new(()))
    }

    /// Reports a read of the data.
    pub(crate) fn read(&self) {
        self.0.with(|_| ());
    }

    /// Reports a write of the data.
    pub(crate) fn write(&self) {
        self.0.with_mut(|_| ());
    }

    /// `n` fresh stand-ins, leaked (a model builds its shared state per
    /// run and leaks it, as the ring model does).
    #[cfg(test)]
    pub(crate) fn leaked(n: usize) -> &'static [Tracked] {
        Box::leak((0..n).map(|_| Tracked::new()).collect::<Vec<_>>().into_boxed_slice())
    }
}

/// The end of a poll that found nothing (a CQ read with `-FI_EAGAIN`, a
/// poll set with no event): a pause, as a spin-wait iteration should have.
/// Without it, a caller polling in a tight loop has loads of the ring's
/// next cell from several polls in flight when the sender's write takes the
/// line, and (most likely: no hardware counters here to confirm it) the
/// core discards and replays them, the memory-ordering machine clear that
/// PAUSE exists to avoid; that costs the message more than the pause costs
/// the poll. Measured here: 8-byte half round trip 0.175-0.180 µs without
/// it, 0.162-0.167 µs with it; an empty CQ read 18.6 ns without, 29.3 ns
/// with. Two pauses or more measured worse. (An lfence instead measured
/// the same latency and 21.5 ns per empty read; the pause is the
/// instruction made for spin-waits, on every CPU, and lets a hypervisor see
/// a spinning vCPU.)
#[inline(always)]
pub(crate) fn idle_pause() {
    std::hint::spin_loop();
}

/// Threading model of a domain (libfabric's `fi_threading`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Threading {
    /// FI_THREAD_DOMAIN: one thread drives the domain and all its objects.
    /// The first thread that uses it owns it; calls from another thread
    /// fail with `-FI_EINVAL` (never a data race). No atomic
    /// read-modify-write per call: the fast path.
    #[default]
    Domain,
    /// FI_THREAD_SAFE: any thread may call; calls are serialised by a lock
    /// (one compare-and-swap per call).
    Safe,
    /// FI_THREAD_DOMAIN as libfabric defines it: the caller serialises
    /// every call to the domain and its objects, which may come from any
    /// thread, one at a time. Neither pinned to a thread nor locked: a
    /// re-entrant call is still refused, but two calls at once are a data
    /// race, so a domain opens in this mode only through the `unsafe`
    /// [`crate::Fabric::domain_serialized`] (libfabric's provider uses it).
    Serialized,
}

thread_local! {
    static THREAD_TOKEN: Cell<u64> = const { Cell::new(0) };
}
static NEXT_TOKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The owner word of a [`Threading::Serialized`] lock: no thread's token
/// (tokens count up from 1), so the owner check's slow test passes it.
const ANY_THREAD: u64 = u64::MAX;

/// A small number unique to the calling thread (never 0).
#[inline]
fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let v = NEXT_TOKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        t.set(v);
        v
    })
}

/// The domain lock. In [`Threading::Safe`] mode: one compare-and-swap to
/// take, a plain release store to give back (a futex mutex pays a second
/// atomic read-modify-write on unlock, about 7 ns on these VMs, on every
/// call); a thread that finds it taken spins briefly, then yields, then
/// sleeps in short naps, never an unbounded spin on a 2-core machine. In
/// [`Threading::Domain`] mode: the owning thread is checked with a plain
/// load, and a re-entrant use is refused. In [`Threading::Serialized`]
/// mode only the re-entrant use is refused (the caller serialises).
pub struct DomainLock<T> {
    safe: bool,
    /// Safe mode: true while a guard exists.
    locked: AtomicBool,
    /// Domain mode: token of the owning thread, 0 until first use;
    /// Serialized mode: [`ANY_THREAD`] (the owner check then passes for
    /// every thread, with no test of the mode on the owner's fast path).
    owner: std::sync::atomic::AtomicU64,
    /// Domain and Serialized modes: a guard exists (touched only by the
    /// owner thread, or by the one thread the caller lets in).
    busy: Cell<bool>,
    data: UnsafeCell<T>,
}

// SAFETY: access to `data` is serialised: in Safe mode by `locked`
// (acquire on take, release on give back), in Domain mode by allowing only
// the owner thread (set once by CAS) and one guard at a time (`busy`, which
// only the owner thread reads or writes); in Serialized mode by the
// contract of the unsafe constructor of such domains (the caller orders
// every call, so `busy` and `data` are never touched by two threads at
// once, and each call happens after the previous one).
unsafe impl<T: Send> Sync for DomainLock<T> {}
// SAFETY: as above; T moves with the lock.
unsafe impl<T: Send> Send for DomainLock<T> {}

/// Access to the data while the lock is held.
pub struct DomainGuard<'a, T> {
    lock: &'a DomainLock<T>,
}

/// Why the lock could not be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockError {
    /// Domain mode, called from a thread that is not the owner.
    OtherThread,
    /// Domain mode, called again while a call is in progress.
    Reentrant,
}

impl<T> DomainLock<T> {
    /// A lock around `v` for `mode`.
    pub fn new(v: T, mode: Threading) -> Self {
        DomainLock {
            safe: mode == Threading::Safe,
            locked: AtomicBool::new(false),
            owner: std::sync::atomic::AtomicU64::new(if mode == Threading::Serialized { ANY_THREAD } else { 0 }),
            busy: Cell::new(false),
            data: UnsafeCell::new(v),
        }
    }

    /// Takes the lock.
    #[inline]
    pub fn lock(&self) -> Result<DomainGuard<'_, T>, LockError> {
        if !self.safe {
            let me = thread_token();
            let o = self.owner.load(std::sync::atomic::Ordering::Acquire);
            if o != me
                && o != ANY_THREAD
                && (o != 0
                    || self
                        .owner
                        .compare_exchange(
                            0,
                            me,
                            std::sync::atomic::Ordering::AcqRel,
                            std::sync::atomic::Ordering::Acquire,
                        )
                        .is_err())
            {
                return Err(LockError::OtherThread);
            }
            if self.busy.replace(true) {
                return Err(LockError::Reentrant);
            }
            return Ok(DomainGuard { lock: self });
        }
        if !self.try_take() {
            self.lock_slow();
        }
        Ok(DomainGuard { lock: self })
    }

    #[inline]
    fn try_take(&self) -> bool {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        // SYNC: acquire pairs with the release store in DomainGuard::drop.
        self.locked.compare_exchange_weak(false, true, Acquire, Relaxed).is_ok()
    }

    #[cold]
    fn lock_slow(&self) {
        let mut round = 0u32;
        loop {
            if !self.locked.load(std::sync::atomic::Ordering::Relaxed) && self.try_take() {
                return;
            }
            round += 1;
            if round < 64 {
                std::hint::spin_loop();
            } else if round < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }
}

impl<T> Deref for DomainGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access (see DomainLock).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for DomainGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves exclusive access (see DomainLock).
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for DomainGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.lock.safe {
            // SYNC: release pairs with the acquire in DomainLock::lock.
            self.lock.locked.store(false, std::sync::atomic::Ordering::Release);
        } else {
            self.lock.busy.set(false);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{DomainLock, LockError, Threading};
    use std::sync::Arc;

    #[test]
    fn domain_mode_refuses_other_threads_and_reentry() {
        let l = Arc::new(DomainLock::new(0u64, Threading::Domain));
        {
            let mut g = l.lock().unwrap();
            *g += 1;
            assert_eq!(l.lock().err(), Some(LockError::Reentrant));
        }
        assert_eq!(*l.lock().unwrap(), 1);
        let l2 = l.clone();
        let r = std::thread::spawn(move || l2.lock().err()).join().unwrap();
        assert_eq!(r, Some(LockError::OtherThread));
    }

    #[test]
    fn serialized_mode_takes_calls_from_any_thread_one_at_a_time() {
        let l = Arc::new(DomainLock::new(0u64, Threading::Serialized));
        {
            let mut g = l.lock().unwrap();
            *g += 1;
            assert_eq!(l.lock().err(), Some(LockError::Reentrant), "re-entry still refused");
        }
        // Another thread, after this one's call (join orders them): taken,
        // where Domain mode refuses it (domain_mode_refuses_other_threads...).
        let l2 = l.clone();
        let r = std::thread::spawn(move || {
            let mut g = l2.lock().map_err(|e| format!("{e:?}"))?;
            *g += 1;
            Ok::<u64, String>(*g)
        })
        .join()
        .unwrap();
        assert_eq!(r, Ok(2));
        assert_eq!(*l.lock().unwrap(), 2);
    }

    #[test]
    fn lock_serialises_threads() {
        let l = Arc::new(DomainLock::new(0u64, Threading::Safe));
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..50_000 {
                        let mut g = l.lock().unwrap();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*l.lock().unwrap(), 200_000);
    }
}
