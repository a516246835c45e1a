//! The MPSC overflow queue: senders that found every ring slot taken share
//! one bounded lock-free queue in the receiver's endpoint section (Vyukov's
//! bounded queue: a sequence word per cell, producers claim positions with a
//! CAS). Each entry carries the sender's address, since no slot says it.
//!
//! Memory per endpoint stays bounded however many peers there are.

use crate::sync::Ordering;
use shm_layout::{Address, MsgHdr, OvfCell, OvfCtl, OVF_PAYLOAD};

static DIE_AFTER_CLAIM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Fault injection for the tests: when on, this process's next overflow
/// push kills the process (SIGKILL) between claiming a cell and publishing
/// it, as a crash there would.
#[doc(hidden)]
pub fn set_fault_die_after_claim(on: bool) {
    DIE_AFTER_CLAIM.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn fault_die_after_claim() -> bool {
    DIE_AFTER_CLAIM.load(std::sync::atomic::Ordering::Relaxed)
}

/// Handle on a queue (producer or consumer side).
pub struct Ovf {
    /// Control words.
    ctl: *const OvfCtl,
    /// Cells.
    cells: *mut OvfCell,
    /// Number of cells (power of two).
    cap: u64,
}

// SAFETY: pointers into a mapping kept alive by the handle's owner; every
// shared word is accessed through atomics.
unsafe impl Send for Ovf {}

/// A message taken from the queue.
pub struct OvfMsg {
    /// Header as published.
    pub hdr: MsgHdr,
    /// Sender's address as it wrote it (untrusted).
    pub src: Address,
    /// Payload.
    pub payload: [u8; OVF_PAYLOAD],
}

impl Ovf {
    /// Wraps a queue.
    ///
    /// # Safety
    /// `ctl` and `cap` cells at `cells` must stay mapped for the life of the
    /// handle; `cap` is a power of two.
    pub unsafe fn new(ctl: *const OvfCtl, cells: *mut OvfCell, cap: usize) -> Self {
        Ovf { ctl, cells, cap: cap as u64 }
    }

    /// Resets an empty queue (owner only, before anyone can see it).
    ///
    /// # Safety
    /// No producer or consumer may use the queue concurrently.
    pub unsafe fn init(&self) {
        for i in 0..self.cap {
            // SAFETY: i < cap.
            unsafe { (*self.cells.add(i as usize)).seq.store(i, Ordering::Relaxed) };
        }
        // SAFETY: ctl mapped.
        unsafe {
            (*self.ctl).enqueue.v.store(0, Ordering::Relaxed);
            (*self.ctl).dequeue.v.store(0, Ordering::Release);
        }
    }

    fn cell(&self, pos: u64) -> *mut OvfCell {
        // SAFETY: masked index.
        unsafe { self.cells.add((pos & (self.cap - 1)) as usize) }
    }

    /// Enqueues; false when full.
    pub fn push(&self, hdr: &MsgHdr, src: &Address, payload: &[u8]) -> bool {
        debug_assert!(payload.len() <= OVF_PAYLOAD);
        let payload = &payload[..payload.len().min(OVF_PAYLOAD)];
        // SAFETY: ctl mapped.
        let enq = unsafe { &(*self.ctl).enqueue.v };
        let mut pos = enq.load(Ordering::Relaxed);
        loop {
            let c = self.cell(pos);
            // SYNC: pairs with the consumer's release store in pop().
            // SAFETY: c inside the queue.
            let seq = unsafe { (*c).seq.load(Ordering::Acquire) };
            let dif = seq.wrapping_sub(pos) as i64;
            if dif == 0 {
                match enq.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        // SAFETY: we own cell pos until we publish it. The
                        // source goes first: if we die before publishing,
                        // it tells the consumer whose claim blocks the queue
                        // (see `blocked_head`).
                        unsafe {
                            std::ptr::addr_of_mut!((*c).src).write_volatile(*src);
                            if fault_die_after_claim() {
                                libc::kill(libc::getpid(), libc::SIGKILL);
                            }
                            std::ptr::addr_of_mut!((*c).hdr).write_volatile(*hdr);
                            std::ptr::copy_nonoverlapping(
                                payload.as_ptr(),
                                std::ptr::addr_of_mut!((*c).payload) as *mut u8,
                                payload.len(),
                            );
                            // SYNC: publishes the entry to the acquire in pop().
                            (*c).seq.store(pos + 1, Ordering::Release);
                        }
                        return true;
                    }
                    Err(p) => pos = p,
                }
            } else if dif < 0 {
                return false;
            } else {
                pos = enq.load(Ordering::Relaxed);
            }
        }
    }

    /// Copies the next entry without taking it (the owner only).
    pub fn peek(&self) -> Option<OvfMsg> {
        // SAFETY: ctl mapped; dequeue is written only by the owner.
        let pos = unsafe { (*self.ctl).dequeue.v.load(Ordering::Relaxed) };
        let c = self.cell(pos);
        // SYNC: pairs with the producer's release store in push().
        // SAFETY: c inside the queue.
        if unsafe { (*c).seq.load(Ordering::Acquire) } != pos + 1 {
            return None;
        }
        // SAFETY: published entry; copied out once.
        Some(unsafe {
            OvfMsg {
                hdr: std::ptr::addr_of!((*c).hdr).read_volatile(),
                src: std::ptr::addr_of!((*c).src).read_volatile(),
                payload: std::ptr::addr_of!((*c).payload).read_volatile(),
            }
        })
    }

    /// Frees the entry [`Ovf::peek`] returned (the owner only).
    pub fn commit(&self) {
        // SAFETY: ctl mapped; dequeue is written only by the owner.
        let deq = unsafe { &(*self.ctl).dequeue.v };
        let pos = deq.load(Ordering::Relaxed);
        let c = self.cell(pos);
        // SAFETY: c inside the queue; the cell is ours (read, or its claimant
        // is dead) until the release store below: clear its source so a
        // later claimant that dies early is not taken for this one.
        unsafe {
            std::ptr::addr_of_mut!((*c).src).write_volatile(Address::default());
            // SYNC: frees the cell for the producer's acquire in push().
            (*c).seq.store(pos + self.cap, Ordering::Release);
        }
        deq.store(pos + 1, Ordering::Relaxed);
    }

    /// When the next entry is claimed by a producer but not published:
    /// its position and the source the producer wrote first (all zero if it
    /// wrote none yet). A claim whose producer died blocks the queue; the
    /// owner then frees it with [`Ovf::skip`].
    pub fn blocked_head(&self) -> Option<(u64, Address)> {
        // SAFETY: ctl and cells mapped; dequeue is written only by the owner.
        unsafe {
            let pos = (*self.ctl).dequeue.v.load(Ordering::Relaxed);
            let c = self.cell(pos);
            if (*c).seq.load(Ordering::Acquire) != pos || (*self.ctl).enqueue.v.load(Ordering::Acquire) <= pos {
                return None;
            }
            Some((pos, std::ptr::addr_of!((*c).src).read_volatile()))
        }
    }

    /// Frees the head entry whose producer died after claiming it (the
    /// owner only, after [`Ovf::blocked_head`] named it and its owner was
    /// found dead: nobody will publish it).
    pub fn skip(&self) {
        self.commit();
    }

    /// Dequeues (the owner only).
    pub fn pop(&self) -> Option<OvfMsg> {
        let m = self.peek()?;
        self.commit();
        Some(m)
    }

    /// Whether an entry waits.
    pub fn ready(&self) -> bool {
        // SAFETY: ctl and cell mapped.
        unsafe {
            let pos = (*self.ctl).dequeue.v.load(Ordering::Relaxed);
            (*self.cell(pos)).seq.load(Ordering::Acquire) == pos + 1
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A zeroed queue of `cap` cells in leaked memory (its control words
    /// and cells, for the tests to look at or to share between threads).
    fn leaked(cap: usize) -> (&'static OvfCtl, &'static mut [OvfCell]) {
        // SAFETY: zeroed OvfCtl/OvfCell are valid.
        let ctl: &'static OvfCtl = Box::leak(Box::new(unsafe { std::mem::zeroed() }));
        let cells: &'static mut [OvfCell] =
            Box::leak((0..cap).map(|_| unsafe { std::mem::zeroed() }).collect::<Vec<OvfCell>>().into_boxed_slice());
        (ctl, cells)
    }

    #[test]
    fn a_dead_claim_is_named_and_skipped() {
        let cap = 8usize;
        let (ctl, cells) = leaked(cap);
        // SAFETY: leaked memory lives forever.
        let q = unsafe { Ovf::new(ctl, cells.as_mut_ptr(), cap) };
        // SAFETY: nobody else uses it yet.
        unsafe { q.init() };
        assert!(q.blocked_head().is_none(), "empty is not blocked");
        let live = Address { ep_index: 1, token: 11, ..Default::default() };
        assert!(q.push(&MsgHdr { tag: 1, ..Default::default() }, &live, b"a"));
        assert!(q.blocked_head().is_none(), "published is not blocked");
        assert_eq!(q.pop().unwrap().hdr.tag, 1);
        // A producer claims position 1, writes its source, and dies.
        let dead = Address { ep_index: 2, token: 22, ..Default::default() };
        ctl.enqueue.v.store(2, Ordering::Relaxed);
        cells[1].src = dead;
        // Another one publishes behind it.
        assert!(q.push(&MsgHdr { tag: 3, ..Default::default() }, &live, b"c"));
        assert!(q.peek().is_none(), "the dead claim blocks the queue");
        assert_eq!(q.blocked_head(), Some((1, dead)));
        q.skip();
        assert_eq!(q.pop().unwrap().hdr.tag, 3, "the entry behind it comes out");
        assert!(q.blocked_head().is_none());
        // The skipped cell is clean for its next round.
        assert_eq!(cells[1].src, Address::default());
    }

    #[test]
    fn many_producers_one_consumer_lose_nothing() {
        let cap = 16usize;
        let (ctl, cells) = leaked(cap);
        let (c, p) = (ctl as *const OvfCtl as usize, cells.as_mut_ptr() as usize);
        // SAFETY: leaked memory lives forever.
        let q = unsafe { Ovf::new(c as *const _, p as *mut _, cap) };
        // SAFETY: nobody else uses it yet.
        unsafe { q.init() };
        let producers: Vec<_> = (0..4u32)
            .map(|t| {
                std::thread::spawn(move || {
                    // SAFETY: leaked memory.
                    let q = unsafe { Ovf::new(c as *const _, p as *mut _, cap) };
                    let src = Address { ep_index: t, ..Default::default() };
                    for i in 0..5000u64 {
                        let h = MsgHdr { tag: i, ..Default::default() };
                        while !q.push(&h, &src, &i.to_le_bytes()) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; 4];
        let mut n = 0;
        while n < 20000 {
            if let Some(m) = q.pop() {
                let t = m.src.ep_index as usize;
                assert_eq!(m.hdr.tag, next[t], "per-producer order");
                assert_eq!(&m.payload[..8], &next[t].to_le_bytes());
                next[t] += 1;
                n += 1;
            } else {
                std::thread::yield_now();
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert!(q.pop().is_none());
    }
}
