//! The receiver's bounce-buffer pool: fixed-size chunks in the receiving
//! endpoint's section, shared by every inbound peer (memory grows with the
//! number of endpoints, not with peers squared). The free list is a Treiber
//! stack of chunk indices whose head carries an ABA tag:
//! `head = tag << 32 | (index + 1)`, with 0 in the low half meaning empty.
//!
//! Senders pop a chunk, fill it and name it in a ring message; the receiver
//! copies it out (or holds it while the message is unexpected) and pushes it
//! back. Indices read from shared memory are bounds-checked.

use crate::sync::AtomicU32;
use crate::sync::Ordering;
use shm_layout::PoolCtl;

/// Handle on a pool.
pub struct Pool {
    /// Free-list head.
    ctl: *const PoolCtl,
    /// `next[i]`: link of chunk i (index + 1, 0 = end).
    next: *const AtomicU32,
    /// First chunk.
    chunks: *mut u8,
    /// Number of chunks.
    n: u32,
    /// Bytes per chunk.
    chunk_size: usize,
}

// SAFETY: pointers into a mapping its owner keeps alive; shared words are atomics.
unsafe impl Send for Pool {}
// SAFETY: as above: every shared word is an atomic, chunks are handed over
// through the free list and ring messages.
unsafe impl Sync for Pool {}

const LOW: u64 = 0xffff_ffff;

impl Pool {
    /// Wraps a pool.
    ///
    /// # Safety
    /// `ctl`, `n` links at `next` and `n * chunk_size` bytes at `chunks`
    /// must stay mapped for the life of the handle.
    pub unsafe fn new(ctl: *const PoolCtl, next: *const AtomicU32, chunks: *mut u8, n: u32, chunk_size: usize) -> Self {
        Pool { ctl, next, chunks, n, chunk_size }
    }

    /// Puts every chunk on the free list (owner, before peers can see it).
    ///
    /// # Safety
    /// Nobody may use the pool concurrently.
    pub unsafe fn init(&self) {
        for i in 0..self.n {
            let link = if i + 1 < self.n { i + 2 } else { 0 };
            // SAFETY: i < n.
            unsafe { (*self.next.add(i as usize)).store(link, Ordering::Relaxed) };
        }
        // SAFETY: ctl mapped.
        unsafe {
            (*self.ctl).in_use.store(0, Ordering::Relaxed);
            // SYNC: publishes the links to the acquire loads of `head` in
            // alloc() (senders also get them through the section's OPEN
            // store, for the acquire in Section::open_at).
            (*self.ctl).head.store(1, Ordering::Release);
        }
    }

    /// Chunks in the pool.
    pub fn len(&self) -> u32 {
        self.n
    }

    /// Whether the pool has no chunks (never for a valid geometry).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Takes a free chunk; None when every chunk is in use (or the list is
    /// corrupt).
    pub fn alloc(&self) -> Option<u32> {
        // SAFETY: ctl mapped.
        let head = unsafe { &(*self.ctl).head };
        // SYNC: pairs with the release CAS in free() (or the release store
        // in init()): the link of the head chunk read below is visible.
        let mut h = head.load(Ordering::Acquire);
        loop {
            let idx1 = (h & LOW) as u32;
            if idx1 == 0 || idx1 > self.n {
                return None;
            }
            // SAFETY: idx1 - 1 < n.
            let next = unsafe { (*self.next.add(idx1 as usize - 1)).load(Ordering::Relaxed) };
            if next > self.n {
                return None;
            }
            let new = ((h >> 32).wrapping_add(1) << 32) | next as u64;
            // SYNC: acquire pairs with the release CAS in free(): the
            // chunk's previous reader is done with it before we write it
            // (and, on failure, the new head's link is visible). The release
            // half pairs with nothing: a later alloc() reaches free()'s
            // release through the release sequence of the CASes on `head`,
            // so Acquire alone would do.
            match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // SAFETY: ctl mapped.
                    unsafe { (*self.ctl).in_use.fetch_add(1, Ordering::Relaxed) };
                    return Some(idx1 - 1);
                }
                Err(cur) => h = cur,
            }
        }
    }

    /// Returns a chunk; false if `idx` is out of range.
    pub fn free(&self, idx: u32) -> bool {
        if idx >= self.n {
            return false;
        }
        // SAFETY: ctl mapped.
        let head = unsafe { &(*self.ctl).head };
        let mut h = head.load(Ordering::Relaxed);
        loop {
            // SAFETY: idx < n.
            unsafe { (*self.next.add(idx as usize)).store((h & LOW) as u32, Ordering::Relaxed) };
            let new = ((h >> 32).wrapping_add(1) << 32) | (idx as u64 + 1);
            // SYNC: release pairs with the acquire loads and CAS in alloc():
            // the link written above and our reads of the chunk happen
            // before the next taker's writes.
            match head.compare_exchange_weak(h, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => {
                    // SAFETY: ctl mapped.
                    unsafe { (*self.ctl).in_use.fetch_sub(1, Ordering::Relaxed) };
                    return true;
                }
                Err(cur) => h = cur,
            }
        }
    }

    /// Pointer to chunk `idx`, if in range.
    pub fn chunk(&self, idx: u32) -> Option<*mut u8> {
        if idx >= self.n {
            return None;
        }
        // SAFETY: idx < n, so the chunk lies inside the pool.
        Some(unsafe { self.chunks.add(idx as usize * self.chunk_size) })
    }

    /// Chunks currently taken.
    pub fn in_use(&self) -> u32 {
        // SAFETY: ctl mapped.
        unsafe { (*self.ctl).in_use.load(Ordering::Relaxed) }
    }
}

#[cfg(test)]
pub(crate) mod test_pool {
    use super::*;
    /// A pool on the heap (leaked), for unit and loom tests.
    pub fn heap_pool(n: u32) -> Pool {
        let ctl: &'static PoolCtl = Box::leak(Box::new(PoolCtl {
            head: crate::sync::AtomicU64::new(0),
            in_use: AtomicU32::new(0),
            reserved: 0,
        }));
        let next: &'static [AtomicU32] =
            Box::leak((0..n).map(|_| AtomicU32::new(0)).collect::<Vec<_>>().into_boxed_slice());
        // SAFETY: leaked, lives forever; chunks pointer is never dereferenced by these tests.
        unsafe { Pool::new(ctl, next.as_ptr(), std::ptr::null_mut(), n, 4096) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::test_pool::heap_pool;

    #[test]
    fn alloc_all_then_free_all() {
        let p = heap_pool(8);
        // SAFETY: fresh pool.
        unsafe { p.init() };
        let mut got: Vec<u32> = (0..8).map(|_| p.alloc().unwrap()).collect();
        assert!(p.alloc().is_none());
        assert_eq!(p.in_use(), 8);
        got.sort();
        assert_eq!(got, (0..8).collect::<Vec<_>>());
        assert!(!p.free(8), "out of range refused");
        for i in got {
            assert!(p.free(i));
        }
        assert_eq!(p.in_use(), 0);
        assert!(p.alloc().is_some());
    }

    #[test]
    fn concurrent_alloc_free_never_hands_out_a_chunk_twice() {
        let p: &'static super::Pool = Box::leak(Box::new(heap_pool(4)));
        // SAFETY: fresh pool.
        unsafe { p.init() };
        let owners: &'static [std::sync::atomic::AtomicU32] =
            Box::leak((0..4).map(|_| std::sync::atomic::AtomicU32::new(0)).collect::<Vec<_>>().into_boxed_slice());
        let ts: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for _ in 0..20000 {
                        if let Some(i) = p.alloc() {
                            let prev = owners[i as usize].swap(t + 1, std::sync::atomic::Ordering::SeqCst);
                            assert_eq!(prev, 0, "chunk {i} handed out twice");
                            owners[i as usize].store(0, std::sync::atomic::Ordering::SeqCst);
                            assert!(p.free(i));
                        }
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(p.in_use(), 0);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::test_pool::heap_pool;

    #[test]
    fn loom_pool_free_list() {
        loom::model(|| {
            let p: &'static super::Pool = Box::leak(Box::new(heap_pool(2)));
            // SAFETY: fresh pool.
            unsafe { p.init() };
            let t = loom::thread::spawn(move || {
                if let Some(i) = p.alloc() {
                    assert!(p.free(i));
                }
            });
            let a = p.alloc();
            let b = p.alloc();
            if let (Some(a), Some(b)) = (a, b) {
                assert_ne!(a, b);
            }
            for x in [a, b].into_iter().flatten() {
                assert!(p.free(x));
            }
            t.join().unwrap();
            let x = p.alloc().unwrap();
            let y = p.alloc().unwrap();
            assert_ne!(x, y);
            assert!(p.alloc().is_none());
        });
    }
}
