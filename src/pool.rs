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
    /// corrupt). [`Pool::alloc_many`] of one.
    pub fn alloc(&self) -> Option<u32> {
        let mut one = [0u32];
        (self.alloc_many(&mut one) == 1).then_some(one[0])
    }

    /// Takes up to `out.len()` free chunks with one CAS on the head (their
    /// links read first): a sender filling several fragments pays the
    /// cross-core misses on the head once, not per chunk. Returns how many
    /// it took (0 when the pool is empty or the list corrupt); they are
    /// in `out[..n]`.
    pub fn alloc_many(&self, out: &mut [u32]) -> usize {
        if out.is_empty() {
            return 0;
        }
        // SAFETY: ctl mapped.
        let head = unsafe { &(*self.ctl).head };
        // SYNC: pairs with the release CAS in free()/free_many() (or the
        // release store in init()): the links of the chunks walked below
        // are visible.
        let mut h = head.load(Ordering::Acquire);
        loop {
            let mut n = 0;
            let mut at = (h & LOW) as u32;
            // Walk at most out.len() links from the head. A link changes
            // only when its chunk is popped and pushed again, which moves
            // the head's tag: the CAS below then fails and we walk anew.
            while n < out.len() && at != 0 {
                if at > self.n {
                    break; // corrupt link: take what came before it
                }
                out[n] = at - 1;
                n += 1;
                // SAFETY: at - 1 < n chunks.
                at = unsafe { (*self.next.add(at as usize - 1)).load(Ordering::Relaxed) };
            }
            if n == 0 || at > self.n {
                if n == 0 {
                    return 0;
                }
                // The link after the last taken is out of range: take one
                // fewer so the head never holds a corrupt value... unless
                // that leaves none.
                n -= 1;
                if n == 0 {
                    return 0;
                }
                at = out[n] + 1;
            }
            let new = ((h >> 32).wrapping_add(1) << 32) | at as u64;
            // SYNC: as in alloc(): acquire pairs with the release CAS in
            // free()/free_many(), so the chunks' previous readers are done
            // before we write them.
            match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // SAFETY: ctl mapped.
                    unsafe { (*self.ctl).in_use.fetch_add(n as u32, Ordering::Relaxed) };
                    return n;
                }
                Err(cur) => h = cur,
            }
        }
    }

    /// Returns several chunks with one CAS on the head (linked among
    /// themselves first); false, returning none, if any index is out of
    /// range.
    pub fn free_many(&self, idx: &[u32]) -> bool {
        let Some((&first, rest)) = idx.split_first() else {
            return true;
        };
        if idx.iter().any(|&i| i >= self.n) {
            return false;
        }
        let mut last = first;
        for &i in rest {
            // SAFETY: last < n (checked above).
            unsafe { (*self.next.add(last as usize)).store(i + 1, Ordering::Relaxed) };
            last = i;
        }
        // SAFETY: ctl mapped.
        let head = unsafe { &(*self.ctl).head };
        let mut h = head.load(Ordering::Relaxed);
        loop {
            // SAFETY: last < n.
            unsafe { (*self.next.add(last as usize)).store((h & LOW) as u32, Ordering::Relaxed) };
            let new = ((h >> 32).wrapping_add(1) << 32) | (first as u64 + 1);
            // SYNC: release pairs with the acquire loads and CAS in
            // alloc()/alloc_many(): every link written above and our reads
            // of the chunks happen before the next taker's writes.
            match head.compare_exchange_weak(h, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => {
                    // SAFETY: ctl mapped.
                    unsafe { (*self.ctl).in_use.fetch_sub(idx.len() as u32, Ordering::Relaxed) };
                    return true;
                }
                Err(cur) => h = cur,
            }
        }
    }

    /// Returns a chunk; false if `idx` is out of range.
    /// [`Pool::free_many`] of one.
    pub fn free(&self, idx: u32) -> bool {
        self.free_many(std::slice::from_ref(&idx))
    }

    /// Pointer to chunk `idx`, if in range.
    pub fn chunk(&self, idx: u32) -> Option<*mut u8> {
        if idx >= self.n {
            return None;
        }
        // SAFETY: idx < n, so the chunk lies inside the pool.
        Some(unsafe { self.chunks.add(idx as usize * self.chunk_size) })
    }

    /// Returns the `k` chunks from `idx` on ([`Pool::free_many`] of a run);
    /// false, returning none, if any is out of range.
    pub fn free_run(&self, idx: u32, k: u32) -> bool {
        let mut buf = [0u32; shm_layout::wire::Chunk::MAX_RUN as usize];
        if k as usize > buf.len() || idx.checked_add(k).is_none_or(|e| e > self.n) {
            return false;
        }
        for (j, b) in buf[..k as usize].iter_mut().enumerate() {
            *b = idx + j as u32;
        }
        self.free_many(&buf[..k as usize])
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
    fn alloc_many_and_free_many_keep_the_list_whole() {
        let p = heap_pool(10);
        // SAFETY: fresh pool.
        unsafe { p.init() };
        let mut a = [0u32; 4];
        assert_eq!(p.alloc_many(&mut a), 4);
        let mut b = [0u32; 16];
        assert_eq!(p.alloc_many(&mut b), 6, "takes what is left");
        assert_eq!(p.alloc_many(&mut b[..1]), 0, "empty");
        assert_eq!(p.alloc_many(&mut []), 0);
        assert_eq!(p.in_use(), 10);
        let mut all: Vec<u32> = a.iter().chain(&b[..6]).copied().collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert!(!p.free_many(&[1, 10]), "out of range refused");
        assert_eq!(p.in_use(), 10, "nothing returned by a refused call");
        assert!(p.free_many(&b[..6]));
        assert!(p.free_many(&[]));
        assert!(p.free(a[0]));
        assert!(p.free_many(&a[1..]));
        assert_eq!(p.in_use(), 0);
        // Everything comes back exactly once, whatever the mix.
        let mut got = vec![];
        while let Some(i) = p.alloc() {
            got.push(i);
            let mut two = [0u32; 2];
            let k = p.alloc_many(&mut two);
            got.extend_from_slice(&two[..k]);
        }
        got.sort();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn runs_come_back_in_order() {
        let p = heap_pool(8);
        // SAFETY: fresh pool.
        unsafe { p.init() };
        let mut a = [0u32; 8];
        assert_eq!(p.alloc_many(&mut a), 8);
        assert!(!p.free_run(6, 3), "past the end: refused");
        assert!(!p.free_run(0, 17), "longer than a run: refused");
        assert!(!p.free_run(u32::MAX, 2), "no overflow");
        assert_eq!(p.in_use(), 8);
        assert!(p.free_run(4, 4));
        assert!(p.free_run(0, 4));
        assert_eq!(p.in_use(), 0);
        // Each run back in index order, the last returned first.
        let mut b = [0u32; 8];
        assert_eq!(p.alloc_many(&mut b), 8);
        assert_eq!(b, [0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn alloc_many_stops_before_a_corrupt_link() {
        // A peer scribbled on a link (the list lives in shared memory):
        // take the chunks before it, never put the bad value in the head.
        let p = heap_pool(6);
        // SAFETY: fresh pool.
        unsafe { p.init() };
        // SAFETY: index 2 < 6; the test owns the pool.
        unsafe { (*p.next.add(2)).store(999, crate::sync::Ordering::Relaxed) };
        let mut out = [0u32; 6];
        assert_eq!(p.alloc_many(&mut out), 2, "chunks 0 and 1; chunk 2 stays at the head");
        assert_eq!(&out[..2], &[0, 1]);
        assert_eq!(p.alloc_many(&mut out), 0, "chunk 2's link is bad: nothing more");
        assert_eq!(p.alloc(), None);
    }

    #[test]
    fn concurrent_batches_never_hand_out_a_chunk_twice() {
        let p: &'static super::Pool = Box::leak(Box::new(heap_pool(12)));
        // SAFETY: fresh pool.
        unsafe { p.init() };
        let owners: &'static [std::sync::atomic::AtomicU32] =
            Box::leak((0..12).map(|_| std::sync::atomic::AtomicU32::new(0)).collect::<Vec<_>>().into_boxed_slice());
        let ts: Vec<_> = (0..4u32)
            .map(|t| {
                std::thread::spawn(move || {
                    for r in 0..20000usize {
                        let mut got = [0u32; 5];
                        let k = p.alloc_many(&mut got[..1 + (r + t as usize) % 5]);
                        for &i in &got[..k] {
                            let prev = owners[i as usize].swap(t + 1, std::sync::atomic::Ordering::SeqCst);
                            assert_eq!(prev, 0, "chunk {i} handed out twice");
                        }
                        for &i in &got[..k] {
                            owners[i as usize].store(0, std::sync::atomic::Ordering::SeqCst);
                        }
                        if r % 2 == 0 {
                            assert!(p.free_many(&got[..k]));
                        } else {
                            for &i in &got[..k] {
                                assert!(p.free(i));
                            }
                        }
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(p.in_use(), 0);
        let mut out = [0u32; 12];
        assert_eq!(p.alloc_many(&mut out), 12, "every chunk back on the list");
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
    fn loom_pool_batches() {
        // A sender takes two chunks at once while the receiver returns two
        // at once: never the same chunk twice, all three back at the end.
        loom::model(|| {
            let p: &'static super::Pool = Box::leak(Box::new(heap_pool(3)));
            // SAFETY: fresh pool.
            unsafe { p.init() };
            let mut first = [0u32; 2];
            assert_eq!(p.alloc_many(&mut first), 2);
            let t = loom::thread::spawn(move || {
                let mut got = [0u32; 2];
                let k = p.alloc_many(&mut got);
                assert!(k >= 1, "one chunk at least was free");
                assert!(p.free_many(&got[..k]));
                k
            });
            assert!(p.free_many(&first));
            let k = t.join().unwrap();
            assert!(k <= 3);
            let mut all = [0u32; 3];
            assert_eq!(p.alloc_many(&mut all), 3);
            all.sort();
            assert_eq!(all, [0, 1, 2]);
        });
    }

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
