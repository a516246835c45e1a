//! The SPSC ring: one sender (producer) and one receiving endpoint
//! (consumer) per ring, cells of whole cache lines in the receiver's region.
//!
//! A message occupies `ncells` consecutive cells (modulo the ring). Its
//! first cell holds the sequence word, the header and the first
//! [`CELL_PAYLOAD`] bytes; the following cells are payload only, so the
//! payload is one contiguous byte range (split at most once at the ring's
//! end). The producer writes payload and header, then publishes with a
//! release store of `pos + 1`. The consumer spins on that one word. A small
//! message is one cache line.
//!
//! Stale payload: the cell after a message is where the consumer looks
//! next. If that cell last held *payload* (a continuation cell of a message
//! one lap ago), its first word could by chance equal the awaited `pos + 1`;
//! so before publishing, the producer zeroes that cell's sequence word, but
//! only then: it remembers which cells hold continuation payload
//! (`cont`, one bit per cell), so a stream of one-line messages touches one
//! cache line per message.
//!
//! Piped messages ([`op::PIPED`], inline messages from
//! [`RingTx::piped_from`] bytes on): the producer publishes the header
//! first, then writes the payload from the second cell on in pieces of
//! [`PIPE_PIECE`] bytes, storing after each the count written so far in
//! the first cell's payload area (release; the consumer's acquire load
//! is [`RingView::progress`]). The consumer copies each piece as it
//! lands, while the producer writes the next, instead of waiting for the
//! whole message: one copy overlaps the other. Its cells and guard are
//! those of any message, reserved and zeroed before the header is
//! published, so the consumer's look at the next cell is unchanged.
//!
//! Lap ends ([`RingTx::lap_from`], `SHMFAB_RING_LAP` cells, 64 by
//! default): a message that answers the consumer's side (no push since it
//! last sent us one), starting at that cell index or later with the ring
//! empty (the consumer's head read to be sure), claims the rest of the lap
//! in its cell count: the consumer, which moves by the header's count,
//! skips the cells after its payload, and the next message starts at the
//! ring's first cell. A ping-pong then reuses the first 64 cells and one
//! message instead of moving through the whole ring, and so does a window
//! that follows an acknowledgement (the message rate's). For the
//! stale-payload rule the skipped cells are cleaned (those holding
//! continuation payload get their sequence word zeroed), and the guard is
//! the next lap's first cell.
//! The consumer needs no change for it: a count up to the lap's end is
//! any message's (its fast receive path takes such a message too).
//! Why fewer lines are faster was not found (no hardware counters here);
//! a C probe had shown it (the same line for every message 0.047 against
//! 0.072 us through a 64 KiB ring near), and so did a 128-cell ring.
//!
//! Credit: the producer keeps `cached_head` and re-reads the consumer's
//! shared `head` only when the ring looks full; the consumer publishes its
//! head in batches (`release_credit`, at the end of a progress pass or every
//! quarter ring).
//!
//! ```
//! use shmfab::internal::ring::{cells_for, RingRx, RingTx};
//! use shm_layout::{Cell, MsgHdr, RingCtl};
//! // A ring on the heap (in shmfab it lives in the receiver's region).
//! // SAFETY: (doc example) all-zero bytes are a valid RingCtl.
//! let ctl: Box<RingCtl> = Box::new(unsafe { std::mem::zeroed() });
//! // SAFETY: (doc example) all-zero bytes are a valid Cell.
//! let cells: Vec<Cell> = (0..128).map(|_| unsafe { std::mem::zeroed() }).collect();
//! let (c, p) = (&*ctl as *const RingCtl, cells.as_ptr() as *mut u8);
//! // SAFETY: (doc example) ctl and cells outlive both handles; one producer, one consumer.
//! let (mut tx, mut rx) = unsafe { (RingTx::new(c, p, 128), RingRx::new(c, p, 128)) };
//! let hdr = MsgHdr { op: 1, len: 5, ..Default::default() };
//! assert!(tx.try_push(&hdr, &[b"hello"]));
//! let (h, n) = rx.peek().unwrap();
//! assert_eq!((h.len, n), (5, cells_for(5)));
//! let mut out = [0u8; 5];
//! rx.read_payload(0, &mut out);
//! rx.consume(n, false);
//! assert_eq!(&out, b"hello");
//! ```

use crate::sync::Ordering;
use shm_layout::{op, Cell, MsgHdr, RingCtl, CELL_PAYLOAD, PIPE_PROGRESS};
use std::mem::{offset_of, size_of};

/// Byte stride of one cell.
const STRIDE: usize = size_of::<Cell>();
/// Offset of the payload in a message's first cell.
const PAYLOAD_OFF: usize = offset_of!(Cell, payload);

/// Cells a message with `len` payload bytes needs.
#[inline]
pub const fn cells_for(len: usize) -> usize {
    if len <= CELL_PAYLOAD {
        1
    } else {
        1 + (len - CELL_PAYLOAD).div_ceil(STRIDE)
    }
}

/// Cells a piped message with `len` payload bytes needs: the first, then
/// the payload from the second on.
#[inline]
pub const fn piped_cells(len: usize) -> usize {
    1 + len.div_ceil(STRIDE)
}

/// Payload bytes a piped message of `ncells` cells holds (0 for 0).
#[inline]
pub const fn piped_capacity(ncells: usize) -> usize {
    ncells.saturating_sub(1) * STRIDE
}

/// The progress word of the piped message whose first cell is `c`: bytes
/// of a cell's payload area, so a plain atomic of the standard library
/// (not one of [`crate::sync`]'s, which the loom models replace: no model
/// sends piped messages).
#[inline(always)]
fn progress_word(c: *const Cell) -> *const std::sync::atomic::AtomicU64 {
    (c as *const u8).wrapping_add(PIPE_PROGRESS) as *const std::sync::atomic::AtomicU64
}

/// Payload bytes that fit in `ncells` cells.
#[inline]
pub const fn payload_capacity(ncells: usize) -> usize {
    ncells * STRIDE - PAYLOAD_OFF
}

/// Whether `len` payload bytes fit in `ncells` cells (never in 0).
#[inline(always)]
pub const fn fits_cells(len: usize, ncells: usize) -> bool {
    len + PAYLOAD_OFF <= ncells * STRIDE
}

/// `copy_nonoverlapping` without a call into memcpy for the sizes of
/// small messages (up to 32 bytes: two overlapping loads and stores of the
/// widest size that fits), the call for the rest. The call's test comes
/// first among the others, so that a caller known to copy at most 32 bytes
/// (one cell's payload) has no call in its code at all: a call on a path
/// never taken still made its caller keep values in the stack across it
/// (the inject's ring push spilled its cell's address).
///
/// # Safety
/// As `copy_nonoverlapping(src, dst, n)`.
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY (every arm): each access lies in [0, n) of both ranges, which
    // the caller guarantees valid and disjoint.
    unsafe {
        // The most common small size first (one range check, not a tree).
        if (8..=16).contains(&n) {
            let (a, b) = (rd(src as *const u64), rd(src.add(n - 8) as *const u64));
            wr(dst as *mut u64, a);
            wr(dst.add(n - 8) as *mut u64, b);
            return;
        }
        if n > 32 {
            crate::copy::copy(src, dst, n);
            return;
        }
        match n {
            0 => {}
            1..=3 => {
                for i in 0..n {
                    *dst.add(i) = *src.add(i);
                }
            }
            4..=7 => {
                let (a, b) = (rd(src as *const u32), rd(src.add(n - 4) as *const u32));
                wr(dst as *mut u32, a);
                wr(dst.add(n - 4) as *mut u32, b);
            }
            // 17..=32 (8..=16 returned above; the pair of 16-byte
            // accesses also covers 16).
            _ => {
                debug_assert!((17..=32).contains(&n));
                let (a, b) = (rd(src as *const u128), rd(src.add(n - 16) as *const u128));
                wr(dst as *mut u128, a);
                wr(dst.add(n - 16) as *mut u128, b);
            }
        }
    }
}

/// Sets bits `[from, from + count)` of `bits`, positions taken modulo `cap`
/// (a power of two; `count < cap`): a word at a time, where a loop over
/// the cells of a 4 KiB message took about 650 instructions.
#[inline]
fn set_bits(bits: &mut [u64], cap: u64, from: u64, count: u64) {
    let mut p = from & (cap - 1);
    let mut left = count;
    while left > 0 {
        let b = p % 64;
        let k = left.min(64 - b).min(cap - p);
        let m = if k == 64 { !0 } else { ((1u64 << k) - 1) << b };
        bits[(p / 64) as usize] |= m;
        left -= k;
        p = (p + k) & (cap - 1);
    }
}

/// Cells after the next one that the consumer starts fetching when it
/// moves on (when it is behind, they are written already). 3 rather than
/// 6: in the message rate the consumer drains while the producer is still
/// writing (one pass takes the window), and lines asked for further ahead
/// are more often ones the producer has yet to write, pulled away from it
/// and back. Paired runs of `bench msgrate` (scripts/ab.sh, raw
/// 0.045-0.15 us): 3 against 6 better in 29, 34 and 32 of 40 (median +1.0
/// to +1.5 Mmsg/s, with a posting change since backed out in both), then
/// alone against the base in 27 of 40 and 44 of 60 (+0.5, +0.8); 4 in 32
/// and 26 of 40, 2 in 24, 1 in 26, 12 in 18. The 8 B ping-pong does not
/// prefetch (a lone message): 17 of 40 against the base, median +0.
const RX_PREFETCH: u64 = 3;

/// Bytes of a piped message written between two stores of its progress
/// word. Measured (2026-11-27, a C probe of two processes, interleaved
/// rounds, 16 KiB): 4 KiB pieces 13% less per round trip than one piece,
/// 2 KiB pieces 8% more; in shmfab, paired `scripts/ab.sh` rounds near
/// (raw 8 B 0.047-0.053 us): 4 KiB pieces against no piping, 16 KiB
/// -0.21 us (better in 19 of 24), 8 KiB -0.10 (20 of 24); 2 KiB pieces
/// +0.08 at 16 KiB (7 of 24).
pub const PIPE_PIECE: usize = 4096;

/// Cells ahead of the tail whose line the producer claims early.
const PREFETCH_AHEAD: u64 = 2;

/// Whether the CPU has PREFETCHW (CPUID 0x8000_0001 ECX bit 8,
/// 3DNowPrefetch, on every x86-64 since Broadwell and on AMD).
fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        let max = __cpuid(0x8000_0000).eax;
        max >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Producer side of a ring (lives in the sender's process).
pub struct RingTx {
    /// Control words in the receiver's region.
    ctl: *const RingCtl,
    /// First cell in the receiver's region.
    cells: *mut u8,
    /// Cells in the ring (power of two).
    cap: u64,
    /// `cap - 1`: the mask of a position (finding a cell on the send's
    /// path does not subtract).
    mask: u64,
    /// Next position to write; the producer's own, monotonic. Invariant:
    /// `tail - cached_head <= cap`.
    tail: u64,
    /// Copy of the consumer's head; may be stale (smaller than the real
    /// head) and is refreshed only when the ring looks full.
    cached_head: u64,
    /// Bit i set: cell i holds continuation payload written by us (so its
    /// first word is not a sequence value we control).
    cont: Vec<u64>,
    /// The CPU has PREFETCHW.
    pfw: bool,
    /// A message was pushed since the consumer's side last sent us one
    /// ([`RingTx::heard_back`]): a push that finds it set is part of a
    /// stream, and claims the lines ahead (see [`RingTx::publish_at`]).
    pushed: bool,
    /// A one-cell message at this position or later finds neither its cell
    /// nor the next one marked in `cont`: every continuation cell written
    /// so far has been overwritten by a message's first cell by then (the
    /// last one, at `c`, by the message at `c + cap`), or cleaned by a lap
    /// end that skipped it ([`RingTx::publish_lap`]). Only grows.
    cont_clear_from: u64,
    /// Inline (`EAGER`) messages of this many payload bytes or more go
    /// piped ([`RingTx::piped_from`]); `usize::MAX`: none.
    pipe_min: usize,
    /// The tail just after the last large message the sender marked
    /// ([`RingTx::note_large`]); 0: none.
    large_end: u64,
    /// A message that answers the peer, found at this cell index of the
    /// ring or later with the ring empty, takes the rest of the lap
    /// ([`RingTx::publish_lap`]); `u64::MAX`: never.
    hot: u64,
    /// No lap end is tried before this position: cell `hot` of the
    /// current lap, or a lap after a try that found the consumer behind
    /// (`u64::MAX` with `hot` off). The one test of the send's path.
    lap_at: u64,
}

/// A piped message being written ([`RingTx::begin_piped`]).
pub struct PipeWrite {
    /// Its first cell's position.
    pos: u64,
    /// Its payload bytes.
    len: usize,
}

// SAFETY: the pointers refer to a shared mapping kept alive by the owner of
// the RingTx (the peer's Region); the ring has one producer by construction.
unsafe impl Send for RingTx {}

impl RingTx {
    /// Wraps a ring.
    ///
    /// # Safety
    /// `ctl` and `cells` (`cap` cells, `cap` a power of two >= 2) must stay
    /// mapped for the life of the handle, and this must be the only producer.
    pub unsafe fn new(ctl: *const RingCtl, cells: *mut u8, cap: usize) -> Self {
        debug_assert!(cap.is_power_of_two() && cap >= 2);
        // SAFETY: ctl is valid per the contract. A fresh claimant starts at
        // the consumer's head: the ring is empty when a slot is claimed.
        // SYNC: pairs with the release store in RingRx::release_credit; a
        // claimed ring's head is the zero of a fresh or punched page, so
        // there is nothing to pair with in practice (more than needed).
        let head = unsafe { (*ctl).head.v.load(Ordering::Acquire) };
        RingTx {
            ctl,
            cells,
            cap: cap as u64,
            mask: cap as u64 - 1,
            tail: head,
            cached_head: head,
            // A claimed ring starts zeroed: no cell holds payload yet.
            cont: vec![0; cap.div_ceil(64)],
            pfw: has_prefetchw(),
            pushed: false,
            cont_clear_from: 0,
            pipe_min: usize::MAX,
            large_end: 0,
            hot: u64::MAX,
            lap_at: u64::MAX,
        }
    }

    /// Whether a message at `pos` may take the rest of the lap
    /// ([`RingTx::publish_lap`], which tests the rest): it answers the
    /// peer (no push since the peer last sent us one) and `pos` is past
    /// `lap_at`. Two tests, inline on every push.
    #[inline(always)]
    fn lap_due(&self, pos: u64) -> bool {
        !self.pushed && pos >= self.lap_at
    }

    /// Publishes the message of `n` cells at `pos` (first cell `c`, its
    /// payload written), when [`RingTx::lap_due`] said it may, as taking
    /// the rest of the lap if it starts at cell index `hot` or later, ends
    /// before the ring's last cell, and the ring is empty (the consumer
    /// has taken everything before it: its head read unless the cached one
    /// says so, once per lap in a ping-pong, whose consumer published its
    /// head before it answered); the next message then starts at the
    /// ring's first cell, so a ping-pong reuses a few lines instead of
    /// moving through the ring. Else as usual, and no lap end is tried for
    /// a lap (the consumer behind: both sides streaming, say, where these
    /// reads of the head still cost 4 KiB streams both ways 3-8% far,
    /// `examples/bibw.rs`: a build that read it and never took the lap end
    /// lost as much). Returns the cells taken.
    ///
    /// The skipped cells are cleaned for the stale-payload rule: those
    /// marked as holding continuation payload get their sequence word
    /// zeroed (free cells: the consumer is past them) and their mark
    /// cleared, so `cont_clear_from` stays true: a cell a later lap's
    /// positions do not march over holds no mark. The guard is the next
    /// lap's first cell.
    #[cold]
    #[inline(never)]
    fn publish_lap(&mut self, c: *mut Cell, pos: u64, n: u64, hdr: &MsgHdr) -> u64 {
        let i = pos & self.mask;
        let k = self.cap - i;
        if i < self.hot || n >= k {
            // Not yet at cell `hot` of this lap (the ring's positions went
            // round without a lap end), or a message reaching the lap's
            // last cell: as usual, tried again from cell `hot` (of the
            // next lap, for a message past it).
            let start = (pos & !self.mask) + if i < self.hot { 0 } else { self.cap };
            self.lap_at = start.saturating_add(self.hot).max(pos + 1);
            let guard = self.mark(pos, n);
            self.publish_at(c, pos, n, hdr, guard);
            return n;
        }
        // (k fits the header's count: lap_from keeps hot at least cap -
        // 65535.)
        debug_assert!(k <= u16::MAX as u64);
        if self.cached_head != pos {
            // SYNC: pairs with the release store in RingRx::release_credit,
            // as in has_room: the consumer's reads of the cells skipped
            // happen before our writes to them (the cleaning below).
            // SAFETY: ctl mapped per the contract of new().
            self.cached_head = unsafe { (*self.ctl).head.v.load(Ordering::Acquire) };
        }
        if self.cached_head != pos {
            self.lap_at = pos + self.cap;
            let guard = self.mark(pos, n);
            self.publish_at(c, pos, n, hdr, guard);
            return n;
        }
        self.clean(pos + n, k - n);
        // The message's own cells as usual; the bit of the cell after it,
        // cleaned just now, is clear.
        let clear = self.mark(pos, n);
        debug_assert!(!clear);
        let lap = pos + k;
        let (w, b) = (((lap & self.mask) / 64) as usize, 1u64 << ((lap & self.mask) % 64));
        let guard = self.cont[w] & b != 0;
        self.cont[w] &= !b;
        self.publish_at(c, pos, k, hdr, guard);
        self.lap_at = lap.saturating_add(self.hot);
        k
    }

    /// Zeroes the sequence word of each of the `count` cells from `from`
    /// (not wrapping: they end at a lap's end at most) that holds
    /// continuation payload, and clears its mark.
    fn clean(&mut self, from: u64, count: u64) {
        let (mut p, end) = (from & self.mask, (from & self.mask) + count);
        debug_assert!(end <= self.cap);
        while p < end {
            let w = (p / 64) as usize;
            let hi = end.min((p / 64 + 1) * 64);
            let span = hi - p;
            let m = if span == 64 { !0 } else { ((1u64 << span) - 1) << (p % 64) };
            let mut set = self.cont[w] & m;
            self.cont[w] &= !m;
            while set != 0 {
                let q = w as u64 * 64 + set.trailing_zeros() as u64;
                // SAFETY: q < cap: a cell of our mapped ring, free (the
                // consumer's head is past its last use: publish_lap).
                // Relaxed: published by publish_at's release store.
                unsafe { (*self.cell(q)).seq.store(0, Ordering::Relaxed) };
                set &= set - 1;
            }
            p = hi;
        }
    }

    /// Inline messages of `min` payload bytes or more go piped (see the
    /// module's note); 0: none.
    pub fn piped_from(mut self, min: usize) -> Self {
        self.pipe_min = if min == 0 { usize::MAX } else { min };
        self
    }

    /// A message that answers the peer, starting at cell index `cells` or
    /// later with the ring empty, takes the rest of the lap (see
    /// [`RingTx::publish_lap`]); 0: none.
    /// On a ring of more than 65536 cells, not before cell `cap - 65535`:
    /// a header counts at most 65535 cells.
    pub fn lap_from(mut self, cells: usize) -> Self {
        self.hot = if cells == 0 { u64::MAX } else { (cells as u64).max(self.cap.saturating_sub(u16::MAX as u64)) };
        self.lap_at = (self.tail & !self.mask).saturating_add(self.hot);
        self
    }

    /// The endpoint this ring writes to sent us a message (its answer,
    /// perhaps): the next push is not part of a stream, and claims no
    /// line ahead (see [`RingTx::publish_at`]).
    #[inline(always)]
    pub fn heard_back(&mut self) {
        self.pushed = false;
    }

    /// The next position to write (tests look at where messages went).
    #[cfg(test)]
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Cells in the ring (tests).
    #[cfg(test)]
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Whether a message of `ncells` cells can ever fit this ring (its
    /// cells and the guard: the ring is the receiver's, whose size may
    /// differ from the sender's own).
    #[inline]
    pub fn can_hold(&self, ncells: usize) -> bool {
        (ncells as u64) < self.cap
    }

    /// Marks the message just pushed as a large one (the sender's choice
    /// of size: see [`RingTx::large_pending`]).
    #[inline]
    pub fn note_large(&mut self) {
        self.large_end = self.tail;
    }

    /// Whether the last message marked by [`RingTx::note_large`] is still
    /// in the ring (as far as the consumer has published its head: see
    /// [`RingRx::release_credit`]): the next large message would follow
    /// it in a stream. Reads the consumer's head only when the cached one
    /// says so.
    #[inline]
    pub fn large_pending(&mut self) -> bool {
        if self.large_end <= self.cached_head {
            return false;
        }
        // SYNC: pairs with the release store in RingRx::release_credit, as
        // in has_room.
        // SAFETY: ctl mapped per the contract of new().
        self.cached_head = unsafe { (*self.ctl).head.v.load(Ordering::Acquire) };
        self.large_end > self.cached_head
    }

    /// Whether a message of `ncells` cells fits now.
    #[inline]
    pub fn has_room_for(&mut self, ncells: usize) -> bool {
        self.has_room(ncells as u64)
    }

    /// Whether `ncells` (plus the guard cell) fit now.
    #[inline]
    fn has_room(&mut self, ncells: u64) -> bool {
        let need = ncells + 1; // the guard cell after the message
        if self.tail + need - self.cached_head <= self.cap {
            return true;
        }
        // SYNC: pairs with the release store in RingRx::release_credit: the
        // consumer's reads of the cells it gave back happen before our
        // writes to them.
        // SAFETY: ctl mapped per the contract of new().
        self.cached_head = unsafe { (*self.ctl).head.v.load(Ordering::Acquire) };
        self.tail + need - self.cached_head <= self.cap
    }

    #[inline]
    fn cell(&self, pos: u64) -> *mut Cell {
        // SAFETY: index masked into 0..cap; cells spans cap cells.
        unsafe { self.cells.add((pos & self.mask) as usize * STRIDE) as *mut Cell }
    }

    /// Records that `[pos, pos + n)` now holds a message (first cell, then
    /// `n - 1` continuation cells); returns whether the cell after it holds
    /// continuation payload and must be zeroed (which clears its bit).
    #[inline(always)]
    fn mark(&mut self, pos: u64, n: u64) -> bool {
        if n == 1 && pos >= self.cont_clear_from {
            return false; // nothing to clear, no guard (see cont_clear_from)
        }
        if n > 1 {
            self.cont_clear_from = pos + n + self.cap;
        }
        let mask = self.cap - 1;
        let bit = |p: u64| (((p & mask) / 64) as usize, 1u64 << ((p & mask) % 64));
        let (w, b) = bit(pos);
        self.cont[w] &= !b;
        set_bits(&mut self.cont, self.cap, pos + 1, n - 1);
        let (w, b) = bit(pos + n);
        let guard = self.cont[w] & b != 0;
        self.cont[w] &= !b;
        guard
    }

    /// Writes `src` at payload offset `voff` of the message starting at `pos`.
    #[inline]
    fn write_payload(&self, pos: u64, voff: usize, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        let ring_bytes = self.cap as usize * STRIDE;
        // ring_bytes is a power of two (cap is): a mask, not a division.
        let start = ((pos & (self.cap - 1)) as usize * STRIDE + PAYLOAD_OFF + voff) & (ring_bytes - 1);
        let first = src.len().min(ring_bytes - start);
        // SAFETY: start < ring_bytes and first <= ring_bytes - start; the
        // rest wraps to the ring's start and is < ring_bytes because a
        // message never exceeds the ring. The cells are reserved (has_room).
        unsafe {
            copy_small(src.as_ptr(), self.cells.add(start), first);
            if first < src.len() {
                crate::copy::copy(src.as_ptr().add(first), self.cells, src.len() - first);
            }
        }
    }

    /// [`RingTx::try_push`] of one buffer that fits the first cell (at
    /// most [`CELL_PAYLOAD`] bytes): one cell, no wrap to handle, the
    /// payload copied without a call. The hot path of small sends.
    #[inline(always)]
    pub fn push_one_cell(&mut self, hdr: &MsgHdr, buf: &[u8]) -> bool {
        debug_assert!(buf.len() <= CELL_PAYLOAD);
        if !self.has_room(1) {
            return false;
        }
        let pos = self.tail;
        // The cell's address, computed once: the payload stores below may
        // alias our fields for all the compiler knows, so it would reload
        // them and compute it again for the header.
        let c = self.cell(pos);
        // SAFETY: the cell is reserved (has_room) and its payload area
        // holds CELL_PAYLOAD >= buf.len() bytes.
        unsafe { copy_small(buf.as_ptr(), (c as *mut u8).add(PAYLOAD_OFF), buf.len()) };
        if self.lap_due(pos) {
            self.publish_lap(c, pos, 1, &{ *hdr });
            return true;
        }
        let guard = self.mark(pos, 1);
        self.publish_at(c, pos, 1, hdr, guard);
        true
    }

    /// Publishes one message whose payload is the concatenation of `parts`;
    /// `hdr.ncells` is set here. False (and nothing written) if there is no
    /// room. The one-cell case is inlined into the caller; the rest is not.
    #[inline(always)]
    pub fn try_push(&mut self, hdr: &MsgHdr, parts: &[&[u8]]) -> bool {
        if let [buf] = parts {
            return self.try_push_one(hdr, buf);
        }
        self.push_cells(&{ *hdr }, parts)
    }

    /// [`RingTx::try_push`] of one buffer.
    #[inline(always)]
    pub fn try_push_one(&mut self, hdr: &MsgHdr, buf: &[u8]) -> bool {
        if buf.len() <= CELL_PAYLOAD {
            return self.push_one_cell(hdr, buf);
        }
        // The call out of line gets copies of the header and of the list
        // of parts, made here: the caller's then never have their address
        // taken, and on the one-cell path stay in registers instead of
        // being stored to the stack.
        self.push_cells(&{ *hdr }, &[buf])
    }

    /// [`RingTx::try_push`] past one cell.
    #[inline(never)]
    fn push_cells(&mut self, hdr: &MsgHdr, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len >= self.pipe_min && hdr.op == op::EAGER {
            return self.push_piped(hdr, parts, len);
        }
        let n = cells_for(len) as u64;
        if !self.can_hold(n as usize) || !self.has_room(n) {
            return false;
        }
        let pos = self.tail;
        let mut off = 0;
        for p in parts {
            self.write_payload(pos, off, p);
            off += p.len();
        }
        if self.lap_due(pos) {
            self.publish_lap(self.cell(pos), pos, n, &{ *hdr });
            return true;
        }
        let guard = self.mark(pos, n);
        self.publish(pos, n, hdr, guard);
        true
    }

    /// [`RingTx::try_push`] of a piped message (see the module's note):
    /// published first, then written piece by piece. False (and nothing
    /// written) if there is no room.
    fn push_piped(&mut self, hdr: &MsgHdr, parts: &[&[u8]], len: usize) -> bool {
        let Some(w) = self.begin_piped(hdr, len) else {
            return false;
        };
        let mut off = 0;
        for p in parts {
            let mut k = 0;
            while k < p.len() {
                // Pieces end at multiples of PIPE_PIECE of the message.
                let q = (p.len() - k).min(PIPE_PIECE - off % PIPE_PIECE);
                self.pipe_write(&w, off, &p[k..k + q]);
                off += q;
                k += q;
            }
        }
        true
    }

    /// Reserves the cells of a piped message of `len` payload bytes and
    /// publishes its header (kind [`op::PIPED`] for `hdr`'s `EAGER`), its
    /// progress word 0; [`RingTx::pipe_write`] then writes the payload.
    /// None (nothing written) if there is no room.
    pub fn begin_piped(&mut self, hdr: &MsgHdr, len: usize) -> Option<PipeWrite> {
        let n = piped_cells(len) as u64;
        if !self.can_hold(n as usize) || !self.has_room(n) {
            return None;
        }
        let pos = self.tail;
        let c = self.cell(pos);
        // SAFETY: c is a reserved cell (has_room); its payload area, at
        // PIPE_PROGRESS, is 8-aligned (cells are 64-aligned) and 32 bytes.
        // Relaxed: published by publish_at's release store.
        unsafe { (*progress_word(c as *const Cell)).store(0, std::sync::atomic::Ordering::Relaxed) };
        let mut h = *hdr;
        h.op = op::PIPED;
        if self.lap_due(pos) {
            self.publish_lap(c, pos, n, &h);
        } else {
            let guard = self.mark(pos, n);
            self.publish_at(c, pos, n, &h, guard);
        }
        Some(PipeWrite { pos, len })
    }

    /// Writes `bytes` at payload offset `off` of the piped message `w`
    /// (the bytes before `off` written already), then stores the count
    /// written, `off + bytes.len()`, as its progress.
    pub fn pipe_write(&self, w: &PipeWrite, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= w.len, "pipe_write past the message's length");
        // The payload starts at the second cell: CELL_PAYLOAD past the
        // first cell's payload area.
        self.write_payload(w.pos, CELL_PAYLOAD + off, bytes);
        // SYNC: pairs with the acquire load in RingView::progress: the
        // payload bytes written so far are visible to a consumer that
        // reads this count.
        // SAFETY: the message's first cell, reserved by begin_piped and
        // not consumed before its progress reaches len (the consumer's
        // rule), so still ours to write.
        unsafe {
            (*progress_word(self.cell(w.pos))).store((off + bytes.len()) as u64, std::sync::atomic::Ordering::Release)
        };
    }

    /// Writes the header of the message of `n` cells at `pos` (its payload
    /// written), zeroes the guard cell's sequence word if `guard`, then
    /// publishes; asks early for the lines the next messages will take.
    #[inline(always)]
    fn publish(&mut self, pos: u64, n: u64, hdr: &MsgHdr, guard: bool) {
        self.publish_at(self.cell(pos), pos, n, hdr, guard)
    }

    /// [`RingTx::publish`] with the first cell's address `c` (that of `pos`).
    #[inline(always)]
    fn publish_at(&mut self, c: *mut Cell, pos: u64, n: u64, hdr: &MsgHdr, guard: bool) {
        let w = hdr.words(n as u16);
        // SAFETY: c is a reserved cell; the guard cell pos + n is free
        // (has_room counted it), so zeroing its sequence word races nothing.
        // The header is 24 bytes at offset 8 of the cell: three aligned words.
        unsafe {
            let hp = std::ptr::addr_of_mut!((*c).hdr) as *mut u64;
            hp.write_volatile(w[0]);
            hp.add(1).write_volatile(w[1]);
            hp.add(2).write_volatile(w[2]);
            if guard {
                // Relaxed: published by the release store below.
                (*self.cell(pos + n)).seq.store(0, Ordering::Relaxed);
            }
            // SYNC: publishes payload, header and guard to the acquire load
            // in RingRx::ready (and so peek).
            (*c).seq.store(pos + 1, Ordering::Release);
            // Relaxed: read only by observers (`shmfab inspect`).
            (*self.ctl).tail.v.store(pos + n, Ordering::Relaxed);
        }
        self.tail = pos + n;
        // In a stream (a push since the peer last sent us anything), ask
        // for ownership of a line a few cells ahead, while it is free: the
        // write there will not wait for the line to come back from the
        // consumer's core. Not for a push that answers the peer (a
        // ping-pong): its consumer is polling the next cell, and its
        // hardware prefetcher has the lines after it, which a claim ahead
        // only pulls back and forth between the cores. Measured
        // (scripts/ab.sh, near, raw about 0.05 us): claiming on every push
        // against never, 8 B ping-pong 0.1350 against 0.1165 us (better
        // in 10 of 12 rounds), 8 B rate 27.4 against 25.7 Mmsg/s (worse
        // in 9 of 10): hence only in streams.
        let stream = self.pushed;
        self.pushed = true;
        #[cfg(target_arch = "x86_64")]
        if self.pfw && stream {
            // As many lines as this message took, PREFETCH_AHEAD cells on.
            for k in 0..n {
                let ahead = self.tail + PREFETCH_AHEAD + k;
                if ahead - self.cached_head >= self.cap {
                    break;
                }
                // SAFETY: prefetchw only hints the cache; the address is a
                // cell of our mapped ring.
                unsafe {
                    std::arch::asm!("prefetchw [{}]", in(reg) self.cell(ahead), options(nostack, preserves_flags, readonly))
                };
            }
        }
    }
}

/// Where the current message of a ring is: enough to read its payload.
#[derive(Clone, Copy)]
pub struct RingView {
    cells: *const u8,
    /// Cells in the ring minus one (the ring's mask).
    mask: u64,
    head: u64,
}

impl RingView {
    /// The progress word of the current message, if it is piped
    /// ([`op::PIPED`]): payload bytes written so far. The peer
    /// writes it: any value may come (the caller clamps it to the
    /// message's length and its cells).
    #[inline(always)]
    pub fn progress(&self) -> u64 {
        let c = (self.head & self.mask) as usize * STRIDE;
        // SYNC: pairs with the release store in RingTx::pipe_write: the
        // payload bytes it counts are visible to the reads that follow.
        // SAFETY: the first cell of the current message lies in the
        // mapped ring; its payload area is 8-aligned.
        unsafe { (*progress_word(self.cells.add(c) as *const Cell)).load(std::sync::atomic::Ordering::Acquire) }
    }

    /// As [`RingRx::read_payload`].
    #[inline(always)]
    pub fn read_payload(&self, voff: usize, dst: &mut [u8]) {
        if voff + dst.len() <= CELL_PAYLOAD {
            // Inside the first cell's payload area: no wrap to handle.
            let start = (self.head & self.mask) as usize * STRIDE + PAYLOAD_OFF + voff;
            // SAFETY: start..start + dst.len() lies in the payload area of
            // a cell of the mapped ring; stale bytes are possible only from
            // a broken peer (wrong data, not UB).
            unsafe { copy_small(self.cells.add(start), dst.as_mut_ptr(), dst.len()) };
            return;
        }
        let ring_bytes = (self.mask + 1) as usize * STRIDE;
        // ring_bytes is a power of two (cap is): a mask, not a division.
        let start = ((self.head & self.mask) as usize * STRIDE + PAYLOAD_OFF + voff) & (ring_bytes - 1);
        let first = dst.len().min(ring_bytes - start);
        // SAFETY: as in RingTx::write_payload; the bytes may change under us
        // only if the peer is broken, which yields wrong data, not UB in
        // this byte copy. The view comes from a live RingRx of a ring the
        // domain keeps mapped.
        unsafe {
            copy_small(self.cells.add(start), dst.as_mut_ptr(), first);
            if first < dst.len() {
                crate::copy::copy(self.cells, dst.as_mut_ptr().add(first), dst.len() - first);
            }
        }
    }
}

/// Consumer side of a ring (lives in the receiving endpoint).
///
/// `repr(C)` with `cells` and `mask` (never written) apart from `head`
/// (written per message): a view copies them as one wide load that must
/// not span a just-written `head`.
#[repr(C)]
pub struct RingRx {
    /// First cell.
    cells: *const u8,
    /// Cells in the ring (a power of two) minus one: the mask of a
    /// position, kept rather than the count so that finding a cell, on the
    /// poll loop's path, does not subtract first.
    mask: u64,
    /// Control words in our region.
    ctl: *const RingCtl,
    /// Next position to read; the consumer's own, monotonic.
    head: u64,
    /// Head as last published to the producer (`<= head`).
    published: u64,
}

// SAFETY: the pointers refer to our own region, kept alive by the domain;
// one consumer by construction.
unsafe impl Send for RingRx {}

impl RingRx {
    /// Wraps a ring.
    ///
    /// # Safety
    /// As [`RingTx::new`]; this must be the only consumer.
    pub unsafe fn new(ctl: *const RingCtl, cells: *const u8, cap: usize) -> Self {
        debug_assert!(cap.is_power_of_two() && cap >= 2);
        // SAFETY: ctl valid per contract.
        let head = unsafe { (*ctl).head.v.load(Ordering::Relaxed) };
        RingRx { ctl, cells, mask: cap as u64 - 1, head, published: head }
    }

    #[inline]
    fn cell(&self, pos: u64) -> *const Cell {
        // SAFETY: masked index within the ring.
        unsafe { self.cells.add((pos & self.mask) as usize * STRIDE) as *const Cell }
    }

    /// The next message's header and cell count, if one is published. The
    /// header is copied once: later changes by the peer are not seen. A
    /// header whose cell count does not fit the ring is reported with
    /// `ncells == 0` for the caller to treat as a broken peer.
    #[inline]
    pub fn peek(&self) -> Option<(MsgHdr, usize)> {
        if !self.ready() {
            return None;
        }
        Some(self.current())
    }

    /// The header and cell count of the message at the head, as
    /// [`RingRx::peek`] gives them, for a caller that has just found it
    /// published ([`RingRx::ready`] true; the head has not moved since,
    /// and a published message stays so until we consume it). Without
    /// that, it reads whatever the cell holds: wrong data, not UB.
    #[inline]
    pub fn current(&self) -> (MsgHdr, usize) {
        let c = self.cell(self.head);
        // SAFETY: published header (the caller's ready(), whose acquire
        // load made it visible); volatile because the peer owns the bytes.
        let h = unsafe { std::ptr::addr_of!((*c).hdr).read_volatile() };
        let n = h.ncells as u64;
        if n == 0 || n > self.mask {
            return (h, 0);
        }
        (h, n as usize)
    }

    /// Copies payload bytes `[voff, voff + dst.len())` of the current
    /// message. The caller keeps `voff + dst.len()` within the message's
    /// cells ([`payload_capacity`]).
    #[inline]
    pub fn read_payload(&self, voff: usize, dst: &mut [u8]) {
        self.view().read_payload(voff, dst)
    }

    /// The current message's place (a small copy: reading a message does
    /// not need to move or borrow the ring itself).
    #[inline]
    pub fn view(&self) -> RingView {
        RingView { cells: self.cells, mask: self.mask, head: self.head }
    }

    /// Moves past the current message. `ahead`: the caller reads a stream
    /// (this message was not the first it found in a row), so the next
    /// cells are probably written already: start fetching them while this
    /// message is handled. Not for a message that came alone (a ping-pong):
    /// the cells ahead are not written yet, and fetching them only pulls
    /// lines the producer is about to write (the 8 B half round trip
    /// measured the same either way in 40 paired rounds; the message rate
    /// needs the prefetch: 28 Mmsg/s with it, 16.5 without).
    #[inline]
    pub fn consume(&mut self, ncells: usize, ahead: bool) {
        self.head += ncells as u64;
        #[cfg(target_arch = "x86_64")]
        if ahead {
            // SAFETY: prefetch is a hint; the addresses are inside the ring.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                // The lines that just came into the window (the others were
                // asked for by earlier calls). One cell, the common case: the
                // loop's one line without its bound arithmetic (13 fewer
                // instructions per half round trip by scripts/profile.sh).
                if ncells == 1 {
                    _mm_prefetch(self.cell(self.head + RX_PREFETCH) as *const i8, _MM_HINT_T0);
                } else {
                    let first = (RX_PREFETCH + 1).saturating_sub(ncells as u64).max(1);
                    for k in first..=RX_PREFETCH {
                        _mm_prefetch(self.cell(self.head + k) as *const i8, _MM_HINT_T0);
                    }
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = ahead;
        if self.head - self.published >= (self.mask + 1) / 4 {
            self.release_credit();
        }
    }

    /// Moves past the current message, for a caller that publishes the
    /// head itself before it looks at the ring again
    /// ([`RingRx::release_credit`]: a pass's first message, whose credit
    /// the end of the pass gives): no test of the credit due, no fetch
    /// ahead (see [`RingRx::consume`]).
    #[inline]
    pub fn advance(&mut self, ncells: usize) {
        self.head += ncells as u64;
    }

    /// Publishes the head so the producer can reuse consumed cells.
    #[inline]
    pub fn release_credit(&mut self) {
        if self.head != self.published {
            // SYNC: pairs with the acquire load in RingTx::has_room: our
            // reads of the consumed cells happen before the producer
            // rewrites them.
            // SAFETY: ctl is in our region.
            unsafe { (*self.ctl).head.v.store(self.head, Ordering::Release) };
            self.published = self.head;
        }
    }

    /// Whether the published message at the head, piped, has all its
    /// payload written (its progress has reached its length). The caller
    /// found it ready and piped.
    #[inline]
    pub fn piped_whole(&self) -> bool {
        let (h, _) = self.current();
        self.view().progress() >= h.len as u64
    }

    /// Whether a message is waiting (then [`RingRx::current`] reads it).
    #[inline]
    pub fn ready(&self) -> bool {
        // SYNC: pairs with the release store in RingTx::publish: payload,
        // header and guard are visible to the reads that follow a true
        // answer (peek, current, read_payload).
        // SAFETY: inside the ring.
        unsafe { (*self.cell(self.head)).seq.load(Ordering::Acquire) == self.head + 1 }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn set_bits_matches_a_bit_at_a_time() {
        // Every start and length on rings of 16, 64 and 256 cells,
        // wrapping included, against the loop it replaced.
        for cap in [16u64, 64, 256] {
            for from in 0..2 * cap {
                for count in 0..cap {
                    let mut want = vec![0u64; cap.div_ceil(64) as usize];
                    for p in from..from + count {
                        let q = p & (cap - 1);
                        want[(q / 64) as usize] |= 1 << (q % 64);
                    }
                    let mut got = vec![0u64; cap.div_ceil(64) as usize];
                    super::set_bits(&mut got, cap, from, count);
                    assert_eq!(got, want, "cap {cap} from {from} count {count}");
                }
            }
        }
    }

    use super::*;

    #[test]
    fn copy_small_copies_every_size_exactly() {
        for n in 0..80 {
            let src: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
            let mut dst = vec![0xEEu8; n + 16];
            // SAFETY: src has n bytes, dst n + 16; disjoint allocations.
            unsafe { copy_small(src.as_ptr(), dst.as_mut_ptr().add(8), n) };
            assert!(dst[..8].iter().all(|&b| b == 0xEE), "n={n}: before");
            assert_eq!(&dst[8..8 + n], &src[..], "n={n}");
            assert!(dst[8 + n..].iter().all(|&b| b == 0xEE), "n={n}: after");
        }
    }

    struct Heap {
        ctl: Box<RingCtl>,
        cells: Vec<Cell>,
    }
    fn heap(cap: usize) -> Heap {
        // SAFETY: all-zero is a valid RingCtl and Cell (atomics and integers).
        Heap {
            ctl: Box::new(unsafe { std::mem::zeroed() }),
            cells: (0..cap).map(|_| unsafe { std::mem::zeroed() }).collect(),
        }
    }

    #[test]
    fn cells_for_boundaries() {
        assert_eq!(cells_for(0), 1);
        assert_eq!(cells_for(32), 1);
        assert_eq!(cells_for(33), 2);
        assert_eq!(cells_for(96), 2);
        assert_eq!(cells_for(97), 3);
        for n in 1..50 {
            assert!(payload_capacity(n) >= if n == 1 { 32 } else { 32 + 64 * (n - 1) });
            assert_eq!(cells_for(payload_capacity(n)), n);
        }
    }

    /// Takes the ring's next message, which must be message `got` (its
    /// tag), with the payload `inflight` holds first for it.
    fn take_in_order(rx: &mut RingRx, inflight: &mut std::collections::VecDeque<Vec<u8>>, got: &mut u64) {
        let (hh, n) = rx.peek().expect("a message");
        assert_eq!(hh.tag, *got, "order");
        let want = inflight.pop_front().unwrap();
        let mut buf = vec![0u8; hh.len as usize];
        rx.read_payload(0, &mut buf);
        assert_eq!(buf, want, "payload of message {got}");
        rx.consume(n, true);
        *got += 1;
    }

    #[test]
    fn wraps_and_fills_and_never_reads_stale_payload_as_a_message() {
        let cap = 128;
        let h = heap(cap);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (mut tx, mut rx) = unsafe { (RingTx::new(c, p, cap), RingRx::new(c, p, cap)) };
        let mut inflight = std::collections::VecDeque::new();
        let mut got = 0u64;
        for round in 0..3000u64 {
            // Odd rounds: a one-cell message (try_push's one-cell path),
            // landing on cells that larger ones left continuation payload in.
            let small = round % 2 == 1;
            let len = if small { (round as usize * 7) % (CELL_PAYLOAD + 1) } else { (round as usize * 37) % 700 };
            // Every 8-byte word of the payload holds the value a first cell
            // at the same place one lap later would be waiting for (its
            // cell's position + cap + 1): without the guard, stale payload
            // would pass for a published message.
            let words: Vec<u8> = (0..len.div_ceil(8))
                .flat_map(|j| {
                    let cell = tx.tail + (PAYLOAD_OFF as u64 + 8 * j as u64) / STRIDE as u64;
                    (cell + cap as u64 + 1).to_le_bytes()
                })
                .take(len)
                .collect();
            let hdr = MsgHdr { op: 1, len: len as u32, tag: round, ..Default::default() };
            let push = |tx: &mut RingTx| {
                if small {
                    tx.try_push(&hdr, &[&words])
                } else {
                    tx.try_push(&hdr, &[&words[..len / 2], &words[len / 2..]])
                }
            };
            while !push(&mut tx) {
                take_in_order(&mut rx, &mut inflight, &mut got);
                rx.release_credit();
            }
            inflight.push_back(words);
            if round % 3 == 0 {
                while rx.peek().is_some() {
                    take_in_order(&mut rx, &mut inflight, &mut got);
                }
                assert!(inflight.is_empty(), "stale cells must not pass for messages");
                rx.release_credit();
            }
        }
        while rx.peek().is_some() {
            take_in_order(&mut rx, &mut inflight, &mut got);
        }
        assert_eq!(got, 3000);
        assert!(inflight.is_empty());
    }

    /// Piped messages among plain ones, wrapping: each is published
    /// before its payload (the consumer sees its header with progress 0,
    /// not whole), its pieces counted as written, its payload read from
    /// the second cell; and stale payload left by either kind never passes
    /// for a message (the words are the sequence values a first cell there
    /// would be awaited with, in the layout of the message that wrote them).
    /// A marked large message is pending until the consumer publishes a
    /// head past it; unmarked messages after it do not extend it.
    #[test]
    fn a_large_message_is_pending_until_the_consumer_gives_its_cells_back() {
        let cap = 128;
        let h = heap(cap);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (mut tx, mut rx) = unsafe { (RingTx::new(c, p, cap), RingRx::new(c, p, cap)) };
        let hdr = MsgHdr { op: op::EAGER, len: 200, ..Default::default() };
        assert!(!tx.large_pending(), "nothing marked yet");
        assert!(tx.try_push(&hdr, &[&[1u8; 200]]));
        assert!(!tx.large_pending(), "an unmarked message");
        assert!(tx.try_push(&hdr, &[&[2u8; 200]]));
        tx.note_large();
        let small = MsgHdr { op: op::EAGER, len: 8, ..Default::default() };
        assert!(tx.try_push(&small, &[&[3u8; 8]]));
        assert!(tx.large_pending());
        // The consumer takes the first message and publishes: still there.
        let (_, n) = rx.peek().unwrap();
        rx.consume(n, false);
        rx.release_credit();
        assert!(tx.large_pending());
        // Takes the marked one but has not published its head yet.
        let (_, n) = rx.peek().unwrap();
        rx.advance(n);
        assert!(tx.large_pending(), "the head not published");
        rx.release_credit();
        assert!(!tx.large_pending(), "given back (the small one after it need not be)");
    }

    #[test]
    fn piped_messages_publish_first_count_their_pieces_and_leave_no_stale_seq() {
        let cap = 128;
        let h = heap(cap);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (tx, mut rx) = unsafe { (RingTx::new(c, p, cap), RingRx::new(c, p, cap)) };
        let mut tx = tx.piped_from(100);
        let mut got = 0u64;
        for round in 0..3000u64 {
            let len = (round as usize * 37) % (PIPE_PIECE + 700);
            let piped = len >= 100;
            let first = if piped { STRIDE as u64 } else { PAYLOAD_OFF as u64 };
            let words: Vec<u8> = (0..len.div_ceil(8))
                .flat_map(|j| {
                    let cell = tx.tail + (first + 8 * j as u64) / STRIDE as u64;
                    (cell + cap as u64 + 1).to_le_bytes()
                })
                .take(len)
                .collect();
            let hdr = MsgHdr { op: op::EAGER, len: len as u32, tag: round, ..Default::default() };
            if piped && round % 5 == 0 {
                // By hand: the header seen before any piece.
                let w = tx.begin_piped(&hdr, len).expect("the consumer keeps the ring empty");
                let (hh, _) = rx.peek().expect("published first");
                assert!(hh.op == op::PIPED && rx.view().progress() == 0 && !rx.piped_whole());
                tx.pipe_write(&w, 0, &words[..len / 3]);
                assert_eq!(rx.view().progress(), (len / 3) as u64);
                tx.pipe_write(&w, len / 3, &words[len / 3..]);
            } else {
                assert!(tx.try_push(&hdr, &[&words[..len / 2], &words[len / 2..]]));
            }
            let (hh, n) = rx.peek().expect("a message");
            assert_eq!((hh.tag, hh.op == op::PIPED), (got, piped), "order and kind");
            let mut buf = vec![0u8; len];
            if piped {
                assert!(rx.piped_whole() && n == piped_cells(len) && piped_capacity(n) >= len);
                rx.read_payload(CELL_PAYLOAD, &mut buf);
            } else {
                rx.read_payload(0, &mut buf);
            }
            assert_eq!(buf, words, "payload of message {got}");
            rx.consume(n, true);
            rx.release_credit();
            got += 1;
            assert!(rx.peek().is_none(), "stale cells must not pass for messages (after {got})");
        }
    }

    /// A ping-pong's messages reuse the lap's first cells: with the
    /// consumer keeping up, the answer found at the lap cell takes the rest
    /// of the lap and the next starts at cell 0. A push that answers
    /// nothing (a stream) never does; one that finds the consumer behind
    /// does not, nor does the next try until a lap on. On a ring of more
    /// than 65536 cells the lap ends start at cell `cap - 65535` (a
    /// header counts 16 bits of cells), and are taken there.
    #[test]
    fn an_answer_takes_the_rest_of_the_lap_only_with_the_ring_empty() {
        let cap = 256;
        let h = heap(cap);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (tx, mut rx) = unsafe { (RingTx::new(c, p, cap), RingRx::new(c, p, cap)) };
        let mut tx = tx.lap_from(16);
        let hdr = MsgHdr { op: op::EAGER, len: 8, ..Default::default() };
        let take = |rx: &mut RingRx| {
            let (hh, n) = rx.peek().expect("a message");
            let mut b = [0u8; 8];
            rx.read_payload(0, &mut b);
            assert_eq!(b, hh.tag.to_le_bytes());
            rx.consume(n, false);
            rx.release_credit();
            n
        };
        let mut tag = 0u64;
        let mut push = |tx: &mut RingTx, answer: bool| {
            if answer {
                tx.heard_back();
            }
            tag += 1;
            assert!(tx.try_push(&MsgHdr { tag, ..hdr }, &[&tag.to_le_bytes()]));
        };
        // Three laps of a ping-pong: 16 one-cell messages, then the 17th
        // (at cell 16) takes the other 240.
        for _ in 0..3 {
            for k in 0..17 {
                push(&mut tx, true);
                assert_eq!(take(&mut rx), if k == 16 { cap - 16 } else { 1 });
            }
            assert_eq!(tx.tail % cap as u64, 0);
        }
        // A stream: every push after the first answers nothing.
        let t0 = tx.tail;
        push(&mut tx, true);
        for _ in 0..40 {
            push(&mut tx, false);
        }
        assert_eq!(tx.tail, t0 + 41, "no lap end in a stream");
        for _ in 0..41 {
            assert_eq!(take(&mut rx), 1);
        }
        // An answer with a message still unread: no lap end, and none
        // tried again for a lap although the consumer then keeps up.
        push(&mut tx, false);
        push(&mut tx, true);
        let refused_at = tx.tail - 1;
        assert_eq!(tx.tail, t0 + 43);
        take(&mut rx);
        take(&mut rx);
        while tx.tail < refused_at + cap as u64 {
            push(&mut tx, true);
            assert_eq!(take(&mut rx), 1, "not due before {}", refused_at + cap as u64);
        }
        push(&mut tx, true);
        assert!(take(&mut rx) > 1 && tx.tail % cap as u64 == 0, "due again");

        // More cells to the lap's end than a header counts: not before
        // cell cap - 65535, and there every lap.
        let big = 1usize << 17;
        let h = heap(big);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (tx, mut rx) = unsafe { (RingTx::new(c, p, big), RingRx::new(c, p, big)) };
        let mut tx = tx.lap_from(1);
        let from = (big - u16::MAX as usize) as u64;
        for lap in 0..3u64 {
            while tx.tail % big as u64 != from {
                push(&mut tx, true);
                assert_eq!(take(&mut rx), 1, "before cell {from}");
            }
            push(&mut tx, true);
            assert_eq!((take(&mut rx), tx.tail), (u16::MAX as usize, (lap + 1) * big as u64));
        }
    }

    /// A piped answer at the lap cell takes the rest of the lap too; its
    /// consumer reads it whole and finds the next message at cell 0.
    #[test]
    fn a_piped_answer_takes_the_rest_of_the_lap() {
        let cap = 256;
        let h = heap(cap);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (tx, mut rx) = unsafe { (RingTx::new(c, p, cap), RingRx::new(c, p, cap)) };
        let mut tx = tx.piped_from(100).lap_from(16);
        let data: Vec<u8> = (0..3000u32).map(|k| (k * 13) as u8).collect();
        for round in 0..6u64 {
            tx.heard_back();
            let at = tx.tail;
            let hdr = MsgHdr { op: op::EAGER, len: 3000, tag: round, ..Default::default() };
            assert!(tx.try_push(&hdr, &[&data]));
            let (hh, n) = rx.peek().expect("a message");
            assert!(hh.op == op::PIPED && rx.piped_whole() && hh.tag == round);
            let want = if at % cap as u64 >= 16 { cap - (at % cap as u64) as usize } else { piped_cells(3000) };
            assert_eq!(n, want, "round {round} at {at}");
            assert_eq!(tx.tail, at + n as u64);
            let mut buf = vec![0u8; 3000];
            rx.read_payload(CELL_PAYLOAD, &mut buf);
            assert_eq!(buf, data);
            rx.consume(n, true);
            rx.release_credit();
            assert!(rx.peek().is_none());
        }
    }

    /// A small xorshift generator for the model test below.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// What a cell last held, as the model below tracks it.
    #[derive(Clone, Copy, PartialEq)]
    enum Held {
        Nothing,
        First,
        Cont,
    }

    /// Random pushes (answers or not, one cell or many, plain, RTS or
    /// piped, payload forging sequence values up to four laps on) against
    /// a consumer that drains, takes one, or lags, on a ring of `cap`
    /// cells with lap ends from cell `lap`. After each push: only the
    /// message's cells and its guard changed, within the consumer's
    /// published credit; a tail that jumped did so as a lap end; at or
    /// past `cont_clear_from` no mark is set; every cell still holding
    /// continuation payload is marked and below `cont_clear_from`; the
    /// tail's cell is never stale; a lap end is taken exactly when it is
    /// due (an answer, from `lap_at` and the lap cell on, ending before
    /// the lap's last cell, the consumer's published head at the tail).
    /// The consumer checks order, cell counts and payloads. Returns the
    /// lap ends taken.
    fn random_pushes(cap: usize, lap: usize, pipe_min: usize, seed: u64, rounds: u64) -> u64 {
        let h = heap(cap);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (tx, mut rx) = unsafe { (RingTx::new(c, p, cap), RingRx::new(c, p, cap)) };
        let mut tx = tx.lap_from(lap).piped_from(pipe_min);
        let (capu, mask) = (cap as u64, cap as u64 - 1);
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) + 12345);
        let mut held = vec![Held::Nothing; cap];
        let mut inflight = std::collections::VecDeque::new();
        let mut laps = 0u64;
        // SAFETY: x & mask is a cell of the heap ring.
        let word0 =
            |x: u64| unsafe { (*(p.add((x & mask) as usize * STRIDE) as *const Cell)).seq.load(Ordering::Relaxed) };
        // SAFETY: the heap ring's cap cells.
        let snap = || unsafe { std::slice::from_raw_parts(p as *const u8, cap * STRIDE).to_vec() };
        let take = |rx: &mut RingRx, inflight: &mut std::collections::VecDeque<(u64, bool, Vec<u8>, usize)>| {
            let (hh, n) = rx.peek().expect("a message");
            let (tag, piped, want, wn) = inflight.pop_front().expect("a message in flight");
            assert_eq!((hh.tag, n, hh.op == op::PIPED), (tag, wn, piped), "order, cells and kind");
            let mut buf = vec![0u8; hh.len as usize];
            rx.read_payload(if piped { CELL_PAYLOAD } else { 0 }, &mut buf);
            assert_eq!(buf, want, "payload of {tag}");
            rx.consume(n, true);
        };
        let maxn = (cap / 2).max(2);
        for round in 0..rounds {
            let answer = rng.below(10) < 6;
            let len = if rng.below(2) == 0 {
                rng.below(CELL_PAYLOAD as u64 + 1) as usize
            } else {
                CELL_PAYLOAD + 1 + rng.below((payload_capacity(maxn) - CELL_PAYLOAD) as u64) as usize
            };
            let kind = if rng.below(5) == 0 { op::RTS } else { op::EAGER };
            let piped = kind == op::EAGER && pipe_min != 0 && len >= pipe_min;
            let natural = if piped { piped_cells(len) } else { cells_for(len) } as u64;
            if natural >= capu {
                continue;
            }
            let hdr = MsgHdr { op: kind, len: len as u32, tag: round, ..Default::default() };
            let (pos, payload) = loop {
                let pos = tx.tail;
                let payload: Vec<u8> = (0..len.div_ceil(8))
                    .flat_map(|_| (pos + rng.below(4 * capu) + 1).to_le_bytes())
                    .take(len)
                    .collect();
                if answer {
                    tx.heard_back();
                }
                let before = snap();
                // SAFETY: ctl lives in the heap above.
                let head = unsafe { (*c).head.v.load(Ordering::Relaxed) };
                let split = rng.below(len as u64 + 1) as usize;
                // A lap end exactly when: an answer, due, at the lap cell or
                // past it, ending before the lap's last cell, the ring empty.
                let i = pos & mask;
                let lap_end = answer && pos >= tx.lap_at && i >= tx.hot && i + natural < capu && head == pos;
                if tx.try_push(&hdr, &[&payload[..split], &payload[split..]]) {
                    let t = tx.tail;
                    assert_eq!(t - pos != natural, lap_end, "round {round}: a lap end when, and only when, due");
                    assert!(t + 1 - head <= capu, "round {round}: guard {t} past the credit (head {head})");
                    let after = snap();
                    for x in 0..cap {
                        if before[x * STRIDE..(x + 1) * STRIDE] != after[x * STRIDE..(x + 1) * STRIDE] {
                            let off = (x as u64).wrapping_sub(pos) & mask;
                            assert!(off <= t - pos, "round {round}: cell {x} written outside [{pos}, {t}]");
                        }
                    }
                    if t - pos != natural {
                        assert!(answer && t & mask == 0 && t - pos == capu - (pos & mask), "round {round}: a lap end");
                        laps += 1;
                    }
                    break (pos, payload);
                }
                if rx.peek().is_some() {
                    take(&mut rx, &mut inflight);
                }
                rx.release_credit();
            };
            let t = tx.tail;
            inflight.push_back((round, piped, payload, (t - pos) as usize));
            held[(pos & mask) as usize] = Held::First;
            for q in pos + 1..pos + natural {
                held[(q & mask) as usize] = Held::Cont;
            }
            if t >= tx.cont_clear_from {
                assert!(tx.cont.iter().all(|&w| w == 0), "round {round}: marks left at tail {t}");
            }
            for x in 0..capu {
                if held[x as usize] == Held::Cont && word0(x) != 0 {
                    assert!(tx.cont[(x / 64) as usize] >> (x % 64) & 1 != 0, "round {round}: cell {x} unmarked");
                    assert!(t < tx.cont_clear_from, "round {round}: cell {x} stale under the fast path");
                }
            }
            assert!(
                !(held[(t & mask) as usize] == Held::Cont && word0(t) != 0),
                "round {round}: the tail's cell stale"
            );
            match rng.below(10) {
                0..=4 => {
                    while rx.peek().is_some() {
                        take(&mut rx, &mut inflight);
                    }
                    rx.release_credit();
                }
                5..=6 => {
                    if rx.peek().is_some() {
                        take(&mut rx, &mut inflight);
                    }
                    if rng.below(2) == 0 {
                        rx.release_credit();
                    }
                }
                _ => {}
            }
        }
        while rx.peek().is_some() {
            take(&mut rx, &mut inflight);
        }
        assert!(inflight.is_empty());
        laps
    }

    /// [`random_pushes`] over ring sizes, lap cells from 1 to past the
    /// ring, piped messages off and on, three seeds each: lap ends are
    /// taken whenever the lap cell is at most half the ring.
    #[test]
    fn random_pushes_keep_the_ring_invariants() {
        for cap in [64usize, 128, 256] {
            for lap in [1usize, 3, cap / 4, cap / 2, cap - 1, cap, 3 * cap] {
                for pipe_min in [0usize, 100] {
                    for seed in 1..4u64 {
                        let laps = random_pushes(cap, lap, pipe_min, seed, 3000);
                        assert!(lap > cap / 2 || laps > 0, "cap {cap} lap {lap}: no lap end taken");
                    }
                }
            }
        }
    }

    #[test]
    fn payload_survives_wrap() {
        let cap = 128;
        let h = heap(cap);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handles.
        let (mut tx, mut rx) = unsafe { (RingTx::new(c, p, cap), RingRx::new(c, p, cap)) };
        for i in 0..500u32 {
            let len = 1 + (i as usize * 131) % 3000;
            let data: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
            assert!(tx.try_push(&MsgHdr { len: len as u32, ..Default::default() }, &[&data]));
            let (hh, n) = rx.peek().unwrap();
            let mut out = vec![0u8; hh.len as usize];
            rx.read_payload(0, &mut out);
            assert_eq!(out, data, "message {i}");
            rx.consume(n, true);
            rx.release_credit();
        }
    }

    #[test]
    fn too_large_for_ring_is_refused() {
        let h = heap(128);
        let (c, p) = (&*h.ctl as *const RingCtl, h.cells.as_ptr() as *mut u8);
        // SAFETY: heap outlives the handle.
        let mut tx = unsafe { RingTx::new(c, p, 128) };
        let big = vec![0u8; payload_capacity(128)];
        assert!(!tx.try_push(&MsgHdr::default(), &[&big]));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    #[test]
    fn loom_ring_order_and_credit() {
        model(false);
    }

    /// The same with every push an answer (lap ends taken from cell 1:
    /// the producer reads the consumer's head to find the ring empty).
    #[test]
    fn loom_ring_lap_ends() {
        model(true);
    }

    fn model(laps: bool) {
        loom::model(move || {
            let cap = 4;
            let ctl: &'static RingCtl = Box::leak(Box::new(RingCtl {
                head: shm_layout::PaddedU64 { v: crate::sync::AtomicU64::new(0) },
                tail: shm_layout::PaddedU64 { v: crate::sync::AtomicU64::new(0) },
            }));
            let cells: &'static [Cell] = Box::leak(
                (0..cap)
                    .map(|_| Cell {
                        seq: crate::sync::AtomicU64::new(0),
                        hdr: MsgHdr::default(),
                        payload: [0; CELL_PAYLOAD],
                    })
                    .collect::<Vec<_>>()
                    .into_boxed_slice(),
            );
            let cp = cells.as_ptr() as usize;
            let c = ctl as *const RingCtl as usize;
            let prod = loom::thread::spawn(move || {
                // SAFETY: leaked, 'static.
                let tx = unsafe { RingTx::new(c as *const RingCtl, cp as *mut u8, cap) };
                let mut tx = tx.lap_from(if laps { 1 } else { 0 });
                let mut i = 0u64;
                while i < 4 {
                    if laps {
                        tx.heard_back();
                    }
                    if tx.try_push(&MsgHdr { tag: i, ..Default::default() }, &[]) {
                        i += 1;
                    } else {
                        loom::thread::yield_now();
                    }
                }
            });
            // SAFETY: leaked, 'static.
            let mut rx = unsafe { RingRx::new(c as *const RingCtl, cp as *const u8, cap) };
            let mut want = 0u64;
            while want < 4 {
                if let Some((h, n)) = rx.peek() {
                    assert_eq!(h.tag, want);
                    assert!(n == 1 || (laps && n < cap), "{n} cells");
                    rx.consume(n, true);
                    rx.release_credit();
                    want += 1;
                } else {
                    loom::thread::yield_now();
                }
            }
            prod.join().unwrap();
        });
    }
}
