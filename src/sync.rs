//! Atomics for the lock-free protocols: std's, or loom's under `cfg(loom)`
//! (re-exported from `shm_layout::sync`, so shared types and the code that
//! drives them use the same ones).

pub use shm_layout::sync::{fence, AtomicU32, AtomicU64, Ordering};

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};

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
    /// The calling thread's token, [`NO_TOKEN`] until its first
    /// [`thread_token`].
    static THREAD_TOKEN: Cell<u64> = const { Cell::new(NO_TOKEN) };
}
/// Tokens are multiples of [`TOKEN_STEP`] from it: the low bits of a lock
/// word stay free for [`BUSY`].
static NEXT_TOKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(TOKEN_STEP);
const TOKEN_STEP: u64 = 4;
/// The token of a thread that has none yet: no lock word ever holds it
/// (not a multiple of [`TOKEN_STEP`], no [`BUSY`] bit), so the owner's
/// one compare fails and the slow path gives the thread its token.
const NO_TOKEN: u64 = 2;
/// Lock word bit: a guard exists.
const BUSY: u64 = 1;
/// Lock word of a [`Threading::Serialized`] lock while free: no thread's
/// token (tokens count up from [`TOKEN_STEP`]); the slow path's first
/// test lets any thread in.
const SERIALIZED: u64 = !(TOKEN_STEP - 1);
/// Lock word of a [`Threading::Safe`] lock while free: no thread's token
/// either; taken by a compare-and-swap to `SAFE | BUSY`.
const SAFE: u64 = SERIALIZED - TOKEN_STEP;

/// A number unique to the calling thread (a multiple of [`TOKEN_STEP`],
/// never 0), given on first use.
#[inline]
fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| {
        let v = t.get();
        if v != NO_TOKEN {
            return v;
        }
        let v = NEXT_TOKEN.fetch_add(TOKEN_STEP, std::sync::atomic::Ordering::Relaxed);
        t.set(v);
        v
    })
}

/// The calling thread's token as it is: [`NO_TOKEN`] if it has none yet
/// (one thread-local load, no branch).
#[inline(always)]
fn thread_token_raw() -> u64 {
    THREAD_TOKEN.with(Cell::get)
}

/// The domain lock: one word ([`DomainLock::lock`]'s fast path is one
/// load, one compare and one store; giving it back is one store). In
/// [`Threading::Domain`] mode the word holds the owning thread's token (0
/// until first use), with [`BUSY`] while a guard exists: the owner's call
/// finds its own token there, and any other value sends the call to the
/// slow path, which takes an unowned lock (compare-and-swap from 0) or
/// refuses the call (another thread's, or re-entrant). In
/// [`Threading::Safe`] mode: one compare-and-swap to take, a plain release
/// store to give back (a futex mutex pays a second atomic
/// read-modify-write on unlock, about 7 ns on these VMs, on every call); a
/// thread that finds it taken spins briefly, then yields, then sleeps in
/// short naps, never an unbounded spin on a 2-core machine. In
/// [`Threading::Serialized`] mode only the re-entrant use is refused (the
/// caller serialises).
pub struct DomainLock<T> {
    /// Domain mode: 0, or the owner's token, `| BUSY` while a guard
    /// exists; Serialized mode: [`SERIALIZED`] (`| BUSY`); Safe mode:
    /// [`SAFE`] (`| BUSY`).
    word: std::sync::atomic::AtomicU64,
    data: UnsafeCell<T>,
}

// SAFETY: access to `data` is serialised: in Safe mode by the word's BUSY
// bit (set by an acquire compare-and-swap, cleared by a release store); in
// Domain mode by allowing only the owner thread (set once by CAS) and one
// guard at a time (BUSY, which only the owner thread sets or clears once
// it owns the lock); in Serialized mode by the contract of the unsafe
// constructor of such domains (the caller orders every call, so `data` is
// never touched by two threads at once, and each call happens after the
// previous one).
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
        let w = match mode {
            Threading::Domain => 0,
            Threading::Safe => SAFE,
            Threading::Serialized => SERIALIZED,
        };
        DomainLock { word: std::sync::atomic::AtomicU64::new(w), data: UnsafeCell::new(v) }
    }

    /// Takes the lock. The owner of a Domain-mode lock finds its token in
    /// the word (one thread-local load, one load, one compare, one store:
    /// the owner check of every call); everything else goes out of line
    /// (a Serialized-mode call there first, for one compare more).
    #[inline(always)]
    pub fn lock(&self) -> Result<DomainGuard<'_, T>, LockError> {
        // Relaxed: only the owner thread itself stores its token (or its
        // token | BUSY) here once it owns the lock, so a load that finds
        // the token is this thread's own store, in program order; in
        // Serialized mode the caller orders the calls.
        let w = self.word.load(std::sync::atomic::Ordering::Relaxed);
        if w == thread_token_raw() {
            self.word.store(w | BUSY, std::sync::atomic::Ordering::Relaxed);
            return Ok(DomainGuard { lock: self });
        }
        self.lock_slow()
    }

    /// [`DomainLock::lock`] past its fast path: a thread's first call,
    /// the first use of a Domain-mode lock, Safe mode, and the refusals.
    #[inline(never)]
    fn lock_slow(&self) -> Result<DomainGuard<'_, T>, LockError> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
        if self.word.load(Relaxed) == SERIALIZED {
            // The caller orders the calls: no other is in progress.
            self.word.store(SERIALIZED | BUSY, Relaxed);
            return Ok(DomainGuard { lock: self });
        }
        let me = thread_token();
        let mut round = 0u32;
        loop {
            // SYNC: acquire pairs with the release store in
            // DomainGuard::drop (Safe mode: the previous holder's data
            // accesses happen before ours) and with the AcqRel CAS below
            // of another thread that took an unowned lock.
            let w = self.word.load(Acquire);
            if w == me {
                // This thread's first call after its token was given.
                self.word.store(me | BUSY, Relaxed);
                return Ok(DomainGuard { lock: self });
            }
            if w == 0 {
                // Domain mode, first use: this thread becomes the owner,
                // unless another one does first (then it is refused below).
                // SYNC: AcqRel: the claim pairs with the acquire load above
                // of a thread that then finds this one the owner.
                if self.word.compare_exchange(0, me | BUSY, AcqRel, Acquire).is_ok() {
                    return Ok(DomainGuard { lock: self });
                }
                continue;
            }
            if w == SAFE {
                // SYNC: acquire pairs with the release store in
                // DomainGuard::drop.
                if self.word.compare_exchange_weak(SAFE, SAFE | BUSY, Acquire, Relaxed).is_ok() {
                    return Ok(DomainGuard { lock: self });
                }
            } else if w == SAFE | BUSY {
                round += 1;
                if round < 64 {
                    std::hint::spin_loop();
                } else if round < 128 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            } else if w == me | BUSY || w == SERIALIZED | BUSY {
                return Err(LockError::Reentrant);
            } else {
                return Err(LockError::OtherThread);
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
        // The word without BUSY: the owner's token, SERIALIZED or SAFE. Read
        // again rather than kept in the guard (a register held across every
        // call for one load of a line this thread just wrote): while BUSY
        // is set no other thread changes the word.
        let w = self.lock.word.load(std::sync::atomic::Ordering::Relaxed);
        // SYNC: release pairs with the acquire load and compare-and-swap in
        // DomainLock::lock_slow (Safe mode: the next holder sees our data
        // accesses; Domain mode: a plain store on x86 all the same).
        self.lock.word.store(w & !BUSY, std::sync::atomic::Ordering::Release);
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
