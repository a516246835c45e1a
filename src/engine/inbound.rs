//! Inbound: what peers write into this endpoint's section, as the
//! receiver sees it: the SPSC rings senders claimed, the shared overflow
//! queue, and our bounce-buffer pool.
//!
//! Invariants:
//! - `rings[s]` is Some exactly for the slots whose claim this endpoint
//!   has accepted, with the claimant's peer index; `ring_bits` has bit `s`
//!   set exactly for those; `claimed_seen` holds those slots' bits and the
//!   bits it settled without a ring (a claimant of another user, a bit
//!   past the slots). A set `claimed` bit outside it is looked at by the
//!   next pass ([`Inbound::accept_claims`]).
//! - `rings_out` is true exactly while a progress pass holds the rings
//!   (then `rings` is empty here, and [`Inbound::may_hold`] answers yes).
//!   A pass unwound by a panic never puts them back: `rings` stays empty
//!   with `ring_bits` as it was, so [`Inbound::take_rings`] gives the mask
//!   only with a slice that is not empty (the slots it names are then
//!   that slice's).
//! - `ovf_stuck` names the overflow queue's head position found claimed
//!   but unpublished, and since when; None when the head moved.
//! - `InRing::held` (`ovf_held` for the overflow queue) is true exactly
//!   when the last pass that read the queue stopped on a message it could
//!   not take (receive CQ full, unexpected budget spent, broken peer):
//!   such a message is no work for a sleeper until the application acts.

use super::peers::Peers;
use crate::domain::Section;
use crate::ovf::Ovf;
use crate::pool::Pool;
use crate::ring::RingRx;
use crate::sync::Ordering;

/// An accepted inbound ring and the peer that writes it.
pub(crate) struct InRing {
    pub rx: RingRx,
    pub peer: usize,
    /// The last pass stopped on a message it could not take.
    pub held: bool,
}

/// The rings a progress pass took out of the endpoint
/// ([`Inbound::take_rings`]).
pub(crate) struct InRings {
    rings: Box<[Option<InRing>]>,
    /// The endpoint's `ring_bits`, taken with the rings.
    bits: u64,
}

impl InRings {
    /// The slots that hold a ring, as a mask: [`InRings::get_unchecked`]
    /// finds each.
    #[inline(always)]
    pub fn mask(&self) -> u64 {
        self.bits
    }

    /// The ring in slot `s`.
    ///
    /// # Safety
    /// Bit `s` of [`InRings::mask`] is set.
    #[inline(always)]
    pub unsafe fn get_unchecked(&mut self, s: usize) -> &mut InRing {
        debug_assert!(matches!(self.rings.get(s), Some(Some(_))));
        // SAFETY: bit s of the mask is set (the caller's contract), so
        // slot s exists and holds a ring (the invariant of `ring_bits`, in
        // the module docs: take_rings gives the mask only with the slice
        // it describes).
        unsafe { self.rings.get_unchecked_mut(s).as_mut().unwrap_unchecked() }
    }
}

/// The endpoint's inbound queues (see the module docs).
pub(crate) struct Inbound {
    /// Inbound rings by slot (a boxed slice: two words to take out and
    /// put back on every pass).
    rings: Box<[Option<InRing>]>,
    /// `rings` is out (a progress pass drains them).
    rings_out: bool,
    /// Claimed-slot bits settled: turned into `rings`, or refused for good.
    claimed_seen: u64,
    /// The slots of `rings` that hold a ring (invariant above).
    ring_bits: u64,
    /// Our section's generation: we take claims made for it only.
    generation: u32,
    /// The shared overflow queue.
    pub ovf: Ovf,
    /// The last pass stopped on an overflow message it could not take.
    pub ovf_held: bool,
    /// The overflow queue's head found claimed but unpublished: its
    /// position and since when.
    pub ovf_stuck: Option<(u64, std::time::Instant)>,
    /// Our pool: its chunks carry the payload of bounce messages to us.
    pub pool: Pool,
    /// Chunks copied out in this pass, not yet back on the free list:
    /// `freed[..n_freed]`. Returned together ([`Pool::free_many`]: one CAS
    /// on the list's head, which the senders also write, per pass rather
    /// than per chunk) by [`Inbound::flush_freed`] at the end of each
    /// drain, or when full.
    freed: [u32; FREED_MAX],
    /// Entries of `freed` in use (at most [`FREED_MAX`]).
    n_freed: usize,
}

/// Chunks an endpoint holds back before returning them together.
const FREED_MAX: usize = 64;

impl Inbound {
    pub fn new(sec: &Section) -> Inbound {
        Inbound {
            rings: (0..sec.g.n_slots as usize).map(|_| None).collect(),
            rings_out: false,
            claimed_seen: 0,
            ring_bits: 0,
            // Relaxed: our own store, in Section::open.
            generation: sec.header().generation.load(Ordering::Relaxed),
            ovf: sec.ovf(),
            ovf_held: false,
            ovf_stuck: None,
            pool: sec.pool(),
            freed: [0; FREED_MAX],
            n_freed: 0,
        }
    }

    /// Gives chunk `idx` (in range: decoded) back, with the pass's others.
    #[inline]
    pub fn release_chunk(&mut self, idx: u32) {
        if self.n_freed == FREED_MAX {
            self.flush_freed();
        }
        self.freed[self.n_freed] = idx;
        self.n_freed += 1;
    }

    /// Gives the `k` chunks from `idx` on (a run, in range: decoded)
    /// back, with the pass's others, in index order: the free list then
    /// holds them in that order, so a sender's next [`Pool::alloc_many`]
    /// finds them back to back again (a run it may send as one fragment).
    #[inline]
    pub fn release_run(&mut self, idx: u32, k: u32) {
        for j in 0..k {
            self.release_chunk(idx + j);
        }
    }

    /// Returns the chunks [`Inbound::release_chunk`] held back.
    #[inline]
    pub fn flush_freed(&mut self) {
        if self.n_freed > 0 {
            self.pool.free_many(&self.freed[..self.n_freed]);
            self.n_freed = 0;
        }
    }

    /// The claimed-slot mask of the section, if it has a bit not settled
    /// yet by [`Inbound::accept_claims`].
    #[inline(always)]
    pub fn new_claims(&self, sec: &Section) -> Option<u64> {
        // SYNC: pairs with the release fetch_or in Section::claim_ring (a
        // hint: Section::take_claim acquires the claim itself).
        let claimed = sec.header().claimed.load(Ordering::Acquire);
        (claimed & !self.claimed_seen != 0).then_some(claimed)
    }

    /// Turns the slots of newly set `claimed` bits that hold a claim for
    /// our generation into rings (their claimants into peers); the other
    /// bits are dropped ([`Section::take_claim`]).
    pub fn accept_claims(&mut self, sec: &Section, peers: &mut Peers, claimed: u64) {
        let n_slots = sec.g.n_slots as usize;
        let mut new = claimed & !self.claimed_seen;
        while new != 0 {
            let s = new.trailing_zeros() as usize;
            let bit = new & new.wrapping_neg();
            new &= new - 1;
            if s >= n_slots {
                self.claimed_seen |= bit; // no such slot: never looked at
                continue;
            }
            // A plain-data copy of the claimant's address, checked against
            // its token there; untrusted still.
            let Some(addr) = sec.take_claim(s as u32, self.generation) else {
                continue; // no claim of ours (the bit is dropped)
            };
            self.claimed_seen |= bit;
            if !addr.is_plausible() {
                continue; // not one of ours: never read that ring
            }
            let p = peers.index_of(addr);
            // SAFETY: the ring lies in our own section; we are its only consumer.
            let rx =
                unsafe { RingRx::new(sec.ringctl_at(s as u32), sec.ring_cells(s as u32), sec.g.ring_cells as usize) };
            self.rings[s] = Some(InRing { rx, peer: p, held: false });
            self.ring_bits |= bit;
        }
    }

    /// Whether any slot holds a ring.
    #[inline(always)]
    pub fn has_rings(&self) -> bool {
        self.ring_bits != 0
    }

    /// Takes the rings out for a pass to drain, with the mask of the slots
    /// holding one ([`Inbound::put_rings`] brings them back). The mask is
    /// 0 with an empty slice: the rings of a pass a panic unwound are
    /// gone, and the endpoint has none to walk (see the module docs).
    #[inline(always)]
    pub fn take_rings(&mut self) -> InRings {
        self.rings_out = true;
        let rings = std::mem::take(&mut self.rings);
        let bits = if rings.is_empty() { 0 } else { self.ring_bits };
        InRings { rings, bits }
    }

    #[inline(always)]
    pub fn put_rings(&mut self, rings: InRings) {
        // What take_rings left is empty, no allocation: nothing to drop.
        let left = std::mem::replace(&mut self.rings, rings.rings);
        debug_assert!(left.is_empty());
        std::mem::forget(left);
        self.rings_out = false;
    }

    /// Whether a message that a pass may take is waiting in any ring or
    /// the overflow queue, or a new ring was claimed. Queues held back (the
    /// last pass stopped on a message it could not take) do not count:
    /// only the application can let them move, and a sleeper that counted
    /// them would never sleep.
    pub fn ready(&self, sec: &Section) -> bool {
        if self.new_claims(sec).is_some() {
            return true;
        }
        self.rings.iter().flatten().any(|r| !r.held && r.rx.ready()) || !self.ovf_held && self.ovf.ready()
    }

    /// Whether a queue is held back (see [`Inbound::ready`]).
    pub fn holds_back(&self) -> bool {
        self.ovf_held || self.rings.iter().flatten().any(|r| r.held)
    }

    /// Whether peer `p` may still have messages here: its ring, or the
    /// shared overflow queue (any entry counts), or a ring claimed since
    /// the last pass looked (it may be its). While the rings are out being
    /// drained (a handler asks), the answer is yes: the caller decides
    /// again at the next check.
    pub fn may_hold(&self, sec: &Section, p: usize) -> bool {
        self.rings_out
            || self.rings.iter().flatten().any(|r| r.peer == p && r.rx.ready())
            || self.ovf.ready()
            || self.new_claims(sec).is_some()
    }
}
