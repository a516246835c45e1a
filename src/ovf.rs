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
    /// Under loom: two stand-ins per cell for its plain data (the source,
    /// then header and payload), None outside the models (see
    /// [`crate::sync::Tracked`]).
    #[cfg(loom)]
    tracked: Option<&'static [crate::sync::Tracked]>,
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

/// Which plain data of a cell an access touches (for the loom models).
#[derive(Clone, Copy)]
enum Part {
    /// The sender's address.
    Src = 0,
    /// Header and payload.
    Body = 1,
}

impl Ovf {
    /// Wraps a queue.
    ///
    /// # Safety
    /// `ctl` and `cap` cells at `cells` must stay mapped for the life of the
    /// handle; `cap` is a power of two.
    pub unsafe fn new(ctl: *const OvfCtl, cells: *mut OvfCell, cap: usize) -> Self {
        Ovf {
            ctl,
            cells,
            cap: cap as u64,
            #[cfg(loom)]
            tracked: None,
        }
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
            // SYNC: nobody acquires `dequeue` (only the owner reads it): the
            // queue is published to producers by the OPEN store in
            // Section::open, for the acquire in Section::open_at. Release
            // here is more than needed.
            (*self.ctl).dequeue.v.store(0, Ordering::Release);
        }
    }

    fn cell(&self, pos: u64) -> *mut OvfCell {
        // SAFETY: masked index.
        unsafe { self.cells.add((pos & (self.cap - 1)) as usize) }
    }

    /// Under loom, reports an access to `part` of the cell of `pos`.
    #[inline(always)]
    fn track(&self, pos: u64, part: Part, write: bool) {
        #[cfg(loom)]
        if let Some(t) = self.tracked {
            let t = &t[(pos & (self.cap - 1)) as usize * 2 + part as usize];
            if write {
                t.write()
            } else {
                t.read()
            }
        }
        #[cfg(not(loom))]
        let _ = (pos, part, write);
    }

    /// Claims the next position: a CAS on `enqueue` when that position's
    /// cell is free (its sequence equals the position). None when full.
    fn claim(&self) -> Option<u64> {
        // SAFETY: ctl mapped.
        let enq = unsafe { &(*self.ctl).enqueue.v };
        let mut pos = enq.load(Ordering::Relaxed);
        loop {
            let c = self.cell(pos);
            // SYNC: acquire pairs with the consumer's release store in
            // commit(): its reads of the cell's previous entry happen
            // before our writes (or with init's stores, published by the
            // section's OPEN store).
            // SAFETY: c inside the queue.
            let seq = unsafe { (*c).seq.load(Ordering::Acquire) };
            let dif = seq.wrapping_sub(pos) as i64;
            if dif == 0 {
                // Relaxed: the claim publishes nothing (the entry is
                // published by the release store of its sequence).
                match enq.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Some(pos),
                    Err(p) => pos = p,
                }
            } else if dif < 0 {
                return None;
            } else {
                pos = enq.load(Ordering::Relaxed);
            }
        }
    }

    /// Writes the source into the claimed cell of `pos`.
    fn write_src(&self, pos: u64, src: &Address) {
        self.track(pos, Part::Src, true);
        // SAFETY: we own the cell of `pos` until we publish it.
        unsafe { std::ptr::addr_of_mut!((*self.cell(pos)).src).write_volatile(*src) };
    }

    /// Enqueues; false when full.
    pub fn push(&self, hdr: &MsgHdr, src: &Address, payload: &[u8]) -> bool {
        debug_assert!(payload.len() <= OVF_PAYLOAD);
        let payload = &payload[..payload.len().min(OVF_PAYLOAD)];
        let Some(pos) = self.claim() else {
            return false;
        };
        // The source goes first: if we die before publishing, it tells the
        // consumer whose claim blocks the queue (see `blocked_head`).
        self.write_src(pos, src);
        if fault_die_after_claim() {
            // SAFETY: kill takes integer arguments only.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let c = self.cell(pos);
        self.track(pos, Part::Body, true);
        // SAFETY: we own cell pos until we publish it.
        unsafe {
            std::ptr::addr_of_mut!((*c).hdr).write_volatile(*hdr);
            std::ptr::copy_nonoverlapping(
                payload.as_ptr(),
                std::ptr::addr_of_mut!((*c).payload) as *mut u8,
                payload.len(),
            );
            // SYNC: publishes source, header and payload to the acquire load
            // in peek() (ready() and blocked_head() only look).
            (*c).seq.store(pos + 1, Ordering::Release);
        }
        true
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
        self.track(pos, Part::Src, false);
        self.track(pos, Part::Body, false);
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
        self.track(pos, Part::Src, true);
        // SAFETY: c inside the queue; the cell is ours (read, or its claimant
        // is dead) until the release store below: clear its source so a
        // later claimant that dies early is not taken for this one.
        unsafe {
            std::ptr::addr_of_mut!((*c).src).write_volatile(Address::default());
            // SYNC: frees the cell for the producer's acquire in claim()
            // (our reads of it, and the cleared source, happen before its
            // writes).
            (*c).seq.store(pos + self.cap, Ordering::Release);
        }
        deq.store(pos + 1, Ordering::Relaxed);
    }

    /// When the next entry is claimed by a producer but not published:
    /// its position and the source the producer wrote first (all zero if it
    /// wrote none yet). A claim whose producer died blocks the queue; the
    /// owner then frees it with [`Ovf::skip`].
    ///
    /// The source is read while its producer, if alive, may be writing it:
    /// nothing orders the two (the claim is a relaxed CAS and the source
    /// is written after it), so the address may be half written. Only a
    /// producer stopped in the middle of that write for a whole peer-check
    /// period could be named by a half-written address; the loom models do
    /// not track this read.
    pub fn blocked_head(&self) -> Option<(u64, Address)> {
        // SAFETY: ctl and cells mapped; dequeue is written only by the owner.
        unsafe {
            let pos = (*self.ctl).dequeue.v.load(Ordering::Relaxed);
            let c = self.cell(pos);
            // SYNC: neither acquire pairs with a release: `seq == pos` was
            // stored by us (commit) or init, and the claim on `enqueue` is
            // relaxed. More than needed; they only look.
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
            // SYNC: pairs with the release store in push(), though only
            // peek()'s acquire hands the entry over: this one only looks.
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

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{AtomicU64, Tracked};
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;
    use shm_layout::PaddedU64;

    /// A queue of `cap` cells in leaked memory, with its data tracked, as
    /// (control words, cells, stand-ins): plain addresses to move into the
    /// model's threads.
    fn leaked(cap: usize) -> (usize, usize, &'static [Tracked]) {
        let ctl: &'static OvfCtl = Box::leak(Box::new(OvfCtl {
            enqueue: PaddedU64 { v: AtomicU64::new(0) },
            dequeue: PaddedU64 { v: AtomicU64::new(0) },
        }));
        let cells: &'static mut [OvfCell] = Box::leak(
            (0..cap)
                .map(|_| OvfCell {
                    seq: AtomicU64::new(0),
                    hdr: MsgHdr::default(),
                    src: Address::default(),
                    payload: [0; OVF_PAYLOAD],
                })
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        (ctl as *const OvfCtl as usize, cells.as_mut_ptr() as usize, Tracked::leaked(2 * cap))
    }

    /// A handle on a queue made by `leaked`.
    fn handle(q: (usize, usize, &'static [Tracked]), cap: usize) -> Ovf {
        // SAFETY: leaked memory lives for ever; cap cells.
        let mut h = unsafe { Ovf::new(q.0 as *const OvfCtl, q.1 as *mut OvfCell, cap) };
        h.tracked = Some(q.2);
        h
    }

    /// Producer `k`'s address.
    fn src(k: u32) -> Address {
        Address { pid: 1, ep_index: k, token: 100 + k, ..Default::default() }
    }

    /// A producer that claims a position and writes its source, then stops
    /// for good: a process killed between claim and publish.
    fn claim_and_die(q: &Ovf, me: &Address) {
        loop {
            if let Some(pos) = q.claim() {
                q.write_src(pos, me);
                return;
            }
            loom::thread::yield_now();
        }
    }

    /// The consumer's side: takes entries until `want` came, skipping a
    /// blocked head only when its source names a claimant found dead
    /// (`dead`, set by that claimant when it stops: finding a process dead
    /// is ordered after everything it did). Returns the entries' (source
    /// index, tag) in the order taken, and how many claims were skipped.
    fn consume(q: &Ovf, want: usize, dead: Option<(&AtomicBool, Address)>) -> (Vec<(u32, u64)>, usize) {
        let (mut got, mut skipped) = (Vec::new(), 0);
        while got.len() < want || (dead.is_some() && skipped == 0) {
            if let Some(m) = q.pop() {
                got.push(entry(m));
                continue;
            }
            if let (Some((pos, who)), Some((d, dead_src))) = (q.blocked_head(), dead) {
                // SYNC: the life check (peer_gone) learns of the death after it.
                if who == dead_src && d.load(Ordering::Acquire) {
                    q.skip();
                    skipped += 1;
                    assert!(q.blocked_head().is_none_or(|(p, _)| p > pos), "skip moves past the claim");
                    continue;
                }
            }
            loom::thread::yield_now();
        }
        (got, skipped)
    }

    /// An entry taken, as (source index, tag), its payload checked.
    fn entry(m: OvfMsg) -> (u32, u64) {
        assert_eq!(m.payload[..2], [m.src.ep_index as u8, m.hdr.tag as u8], "the payload of its header");
        (m.src.ep_index, m.hdr.tag)
    }

    /// Takes every entry published now.
    fn take(q: &Ovf) -> Vec<(u32, u64)> {
        std::iter::from_fn(|| q.pop()).map(entry).collect()
    }

    /// Producer `k` pushes tags `0..n`, retrying while the queue is full.
    fn produce(q: &Ovf, k: u32, n: u64) {
        for tag in 0..n {
            while !q.push(&MsgHdr { tag, ..Default::default() }, &src(k), &[k as u8, tag as u8]) {
                loom::thread::yield_now();
            }
        }
    }

    /// Two producers through two cells, the consumer taking entries as
    /// they come: one producer pushes twice, the other once, so at least
    /// one push needs a cell the consumer freed (the second lap), or finds
    /// the queue full. Every entry pushed comes out once, in order per
    /// producer, with the payload its producer wrote (the cells' plain data
    /// is tracked: loom fails the model if the sequence words do not order
    /// each write before the reads of it, and those reads before the next
    /// lap's writes). Nobody waits on anybody here (with two producers,
    /// waiting loops made some of loom's paths exceed its branch limit): a
    /// push that finds the queue full stops its producer, the consumer
    /// looks three times, and the rest is taken after the join.
    #[test]
    fn loom_ovf_two_producers_in_order_lose_nothing() {
        let mut b = loom::model::Builder::new();
        // LOOM_MAX_PREEMPTIONS overrides; 4 takes about 9 s here.
        b.preemption_bound = b.preemption_bound.or(Some(4));
        b.check(|| {
            let cap = 2;
            let mem = leaked(cap);
            let q = handle(mem, cap);
            // SAFETY: no other handle yet.
            unsafe { q.init() };
            let ps: Vec<_> = (1..=2u32)
                .map(|k| {
                    loom::thread::spawn(move || {
                        let q = handle(mem, cap);
                        (0..3 - k as u64)
                            .take_while(|&tag| {
                                q.push(&MsgHdr { tag, ..Default::default() }, &src(k), &[k as u8, tag as u8])
                            })
                            .count() as u64
                    })
                })
                .collect();
            let mut got = Vec::new();
            for _ in 0..3 {
                got.extend(take(&q));
                loom::thread::yield_now();
            }
            let pushed: Vec<u64> = ps.into_iter().map(|p| p.join().unwrap()).collect();
            got.extend(take(&q));
            for k in 1..=2u32 {
                let tags: Vec<u64> = got.iter().filter(|e| e.0 == k).map(|e| e.1).collect();
                assert_eq!(
                    tags,
                    (0..pushed[k as usize - 1]).collect::<Vec<_>>(),
                    "producer {k}: each entry once, in order"
                );
            }
            assert!(pushed.iter().sum::<u64>() >= 2, "a push fails only when the queue is full");
            assert!(q.pop().is_none() && q.blocked_head().is_none());
        });
    }

    /// A producer claims a cell and dies before publishing, another pushes
    /// two entries. The consumer waits while the head's claimant may be
    /// alive (a live producer mid-push blocks the head too), skips the dead
    /// claim once its source names a dead claimant, and then gets the live
    /// entries, each once and in order. The queue is sound afterwards: no
    /// source is left in a cell, and two more laps go through.
    #[test]
    fn loom_ovf_a_dead_claim_is_skipped_and_the_rest_delivered() {
        let mut b = loom::model::Builder::new();
        // LOOM_MAX_PREEMPTIONS overrides; 3 takes about 9 s here, 4 40 s.
        b.preemption_bound = b.preemption_bound.or(Some(3));
        b.check(|| {
            let cap = 2;
            let mem = leaked(cap);
            let q = handle(mem, cap);
            // SAFETY: no other handle yet.
            unsafe { q.init() };
            let dead = Arc::new(AtomicBool::new(false));
            let d2 = dead.clone();
            let killed = loom::thread::spawn(move || {
                claim_and_die(&handle(mem, cap), &src(9));
                // SYNC: stands for the process's death, which the life
                // check observes after its last store.
                d2.store(true, Ordering::Release);
            });
            let live = loom::thread::spawn(move || produce(&handle(mem, cap), 1, 2));
            let (got, skipped) = consume(&q, 2, Some((&dead, src(9))));
            assert_eq!(got, [(1, 0), (1, 1)], "the live entries, once, in order");
            assert_eq!(skipped, 1, "the dead claim, once");
            killed.join().unwrap();
            live.join().unwrap();
            assert!(q.pop().is_none() && q.blocked_head().is_none());
            // SAFETY: the threads are joined; the cells are plain memory now.
            let cells = unsafe { std::slice::from_raw_parts(mem.1 as *const OvfCell, cap) };
            assert!(cells.iter().all(|c| c.src == Address::default()), "a freed cell keeps no source");
            for _ in 0..2 {
                produce(&q, 2, 2);
                assert_eq!(consume(&q, 2, None).0, [(2, 0), (2, 1)]);
            }
        });
    }
}
