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
//! - `rings_out` is true exactly while a progress pass drains the rings
//!   in place ([`Inbound::rings_for_pass`] to [`Inbound::pass_done`]): the
//!   pass holds a `&mut` to the ring it reads, so nothing else reads or
//!   writes `rings` meanwhile (a handler that asks [`Inbound::may_hold`]
//!   gets yes without a look). `rings` never changes length (made at the
//!   section's slot count), and only [`Inbound::accept_claims`] fills its
//!   slots, before the drain. A pass unwound by a panic leaves the flag
//!   set (so `may_hold` says yes until the next pass clears it) and the
//!   message it was handling maybe half taken (its head moved but the
//!   credit not given, chunks not yet returned): no reference outlives
//!   the pass, but that message may be delivered again. Passes do not
//!   nest (`progress_ep` is entered from API calls only, under the domain
//!   lock, which refuses re-entry) and handlers reach neither the domain
//!   nor these functions; nothing checks that at run time (a check would
//!   need a guard clearing the flag on unwind).
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
    /// The last pass left a piped message at the head whose payload its
    /// sender had not finished writing (`progress::take_piped`): no work
    /// for a sleeper until it is whole ([`RingRx::piped_whole`]), which
    /// its sender's doorbell, rung after the last piece, says.
    pub pipe_wait: bool,
    /// That message's receive is matched and waits in the peer's receive
    /// order (`progress::PIPE_ID`), holding the bytes copied so far.
    pub pipe_active: bool,
}

impl InRing {
    /// Whether a pass has something to do here: a published message,
    /// unless held back, or piped and still being written.
    #[inline]
    fn has_work(&self) -> bool {
        !self.held && self.rx.ready() && (!self.pipe_wait || self.rx.piped_whole())
    }
}

/// The rings a progress pass drains in place ([`Inbound::rings_for_pass`]):
/// the address of the endpoint's ring slots and the mask of those holding
/// one. Taking the rings out of the endpoint and back (so that the ring
/// being read was a local no handler could alias) cost about 13
/// instructions a pass, empty ones included.
#[derive(Clone, Copy)]
pub(crate) struct PassRings {
    base: *mut Option<InRing>,
    /// Slots at `base` (for the debug check of [`PassRings::get`]).
    len: usize,
    /// The endpoint's `ring_bits` at the start of the pass.
    bits: u64,
}

impl PassRings {
    /// The slots that hold a ring, as a mask: [`PassRings::get`] finds
    /// each.
    #[inline(always)]
    pub fn mask(&self) -> u64 {
        self.bits
    }

    /// The ring in slot `s`.
    ///
    /// # Safety
    /// Bit `s` of [`PassRings::mask`] is set, the pass that made these is
    /// not done ([`Inbound::pass_done`]), and the caller holds no other
    /// reference to that ring.
    #[inline(always)]
    pub unsafe fn get<'a>(&self, s: usize) -> &'a mut InRing {
        debug_assert!(s < self.len && self.bits & (1 << s) != 0);
        // SAFETY: bit s of the mask is set (the caller's contract), so slot
        // s exists and holds a ring (the invariant of `ring_bits`, in the
        // module docs); `rings` neither moves nor changes length, and while
        // `rings_out` is set nothing but the pass reaches its slots (module
        // docs), so this is the only reference to the ring.
        unsafe {
            debug_assert!((*self.base.add(s)).is_some());
            (*self.base.add(s)).as_mut().unwrap_unchecked()
        }
    }
}

/// The endpoint's inbound queues (see the module docs).
pub(crate) struct Inbound {
    /// Inbound rings by slot (a Vec, not a boxed slice: a pass reaches
    /// its slots through a pointer while the endpoint is borrowed, which a
    /// `Box`'s claim to unique access would forbid). Its length never
    /// changes.
    rings: Vec<Option<InRing>>,
    /// A progress pass drains `rings` in place (module docs).
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

    /// Returns the chunks [`Inbound::release_chunk`] held back (the test
    /// inline, the return out of line: a drain of inline messages frees
    /// none).
    #[inline(always)]
    pub fn flush_freed(&mut self) {
        if self.n_freed > 0 {
            self.flush_freed_now();
        }
    }

    #[inline(never)]
    fn flush_freed_now(&mut self) {
        self.pool.free_many(&self.freed[..self.n_freed]);
        self.n_freed = 0;
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
            self.rings[s] = Some(InRing { rx, peer: p, held: false, pipe_wait: false, pipe_active: false });
            self.ring_bits |= bit;
        }
    }

    /// Whether any slot holds a ring.
    #[inline(always)]
    pub fn has_rings(&self) -> bool {
        self.ring_bits != 0
    }

    /// The rings for a pass to drain in place, with the mask of the slots
    /// holding one; [`Inbound::pass_done`] ends the pass.
    #[inline(always)]
    pub fn rings_for_pass(&mut self) -> PassRings {
        self.rings_out = true;
        PassRings { base: self.rings.as_mut_ptr(), len: self.rings.len(), bits: self.ring_bits }
    }

    /// The pass that [`Inbound::rings_for_pass`] began is done: its
    /// references to the rings are gone.
    #[inline(always)]
    pub fn pass_done(&mut self) {
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
        self.rings.iter().flatten().any(InRing::has_work) || !self.ovf_held && self.ovf.ready()
    }

    /// Whether a queue is held back (see [`Inbound::ready`]).
    pub fn holds_back(&self) -> bool {
        self.ovf_held || self.rings.iter().flatten().any(|r| r.held)
    }

    /// Drops, from the rings of peer `p` (gone: its process died or its
    /// endpoint closed), a piped message at the head whose payload it
    /// never finished writing: nothing will finish it, and it would keep
    /// [`Inbound::may_hold`] true (so the failure of what is pending with
    /// `p`) for ever. Its matched receive, if any, fails with the rest.
    /// Returns how many were dropped.
    pub fn drop_unfinished_pipes(&mut self, p: usize) -> usize {
        let mut n = 0;
        for r in self.rings.iter_mut().flatten().filter(|r| r.peer == p && r.pipe_wait) {
            // A message whole by now stays, and its parked receive with it:
            // the next pass delivers it.
            if r.rx.ready() && !r.rx.piped_whole() {
                let (_, ncells) = r.rx.current();
                if ncells != 0 {
                    r.rx.consume(ncells, false);
                    r.rx.release_credit();
                    (r.pipe_wait, r.pipe_active) = (false, false);
                    n += 1;
                }
            }
        }
        n
    }

    /// Whether a ring of peer `p` holds a piped message it has not
    /// finished writing (the peer check looks at such a peer even with
    /// nothing else pending with it: [`Inbound::drop_unfinished_pipes`]).
    pub fn waits_on_pipe(&self, p: usize) -> bool {
        self.rings.iter().flatten().any(|r| r.peer == p && r.pipe_wait)
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
