//! Matching: the posted receives and the unexpected messages of one
//! endpoint, the memory budget of the latter, multi-receive buffers, and
//! the one tag predicate ([`PostedRecv::accepts`]) every match uses.
//!
//! Invariants, kept by this module's methods alone:
//! - `unexp_bytes` is the sum of the payload bytes held by queued
//!   unexpected messages (their `Data` bodies); it moves only when one is
//!   queued, grows by a chunk, or leaves the queue.
//! - A posted receive is in `posted[tagged]` until it is taken whole, or
//!   (multi-receive) until less than `min_multi_recv` bytes of it remain.
//! - A multi-receive buffer (an endpoint's or an SRQ's) has a record in its
//!   owner's [`MultiRecs`] from its posting until the entry with
//!   FI_MULTI_RECV is written: the pieces carved from it and not yet
//!   reported, and whether it is released (left its queue). That entry is
//!   the last one that references the buffer: the report that leaves no
//!   piece outstanding on a released buffer (see [`MultiRecs`]).
//! - A receive of a kind (untagged, tagged) that an endpoint takes from
//!   its SRQ ([`Matching::srq_for`]) comes from the SRQ's queue of that
//!   kind, never from the endpoint's own (the API refuses to post there).
//!   The SRQ's queues are [`PostQueue`]s too (of [`Posted`] receives,
//!   compact forms of [`PostedRecv`]s), taken by
//!   [`take_at`] and matched by [`PostedRecv::accepts`]: one matcher. The
//!   source of an SRQ receive is an fi_addr, not a peer index (see
//!   [`crate::srq`]): its callers pass the message's source fi_addr in
//!   the receiving endpoint's AV where the endpoint's own pass a peer.
//! - An unexpected message named in `holds` (claimed by a peek with
//!   FI_CLAIM, or discarded while its chunks still arrive) stays in its
//!   queue, so that its chunks still find it, but no receive or peek takes
//!   it: only the FI_CLAIM receive of its context does (a discarded one
//!   leaves once its last chunk came). A context holds one claim at most.

use super::complete::Dw;
use super::request::{Iov, Iovs};
use crate::domain::Ctx;
use crate::error::{Error, Result};
use crate::proto::Config;
use shm_layout::MAX_IOV;
use std::collections::VecDeque;

/// A posted receive.
#[derive(Clone, Copy, Default)]
pub(crate) struct PostedRecv {
    pub ctx: usize,
    pub iovs: Iovs,
    /// Directed receive: only from this peer (its index in the peer table,
    /// which never changes: peers are only appended).
    pub src: Option<usize>,
    pub tag: u64,
    pub ignore: u64,
    /// For a multi-receive buffer, its record id in its owner's
    /// [`MultiRecs`] (never 0); 0 for any other receive.
    pub multi: u32,
    /// For a multi-receive buffer: bytes of it already used. For any
    /// other receive: how it reports, as [`Dw::raw`] ([`PostedRecv::dw`]:
    /// 0, [`Dw::NONE`], but for a deferred work request's receive, see
    /// `crate::trigger`). One word for both, so that posting an ordinary
    /// receive writes no more than it did.
    pub moff: usize,
    pub cqe: bool,
}

impl PostedRecv {
    /// How its completion reports (see `moff`).
    #[inline(always)]
    pub fn dw(&self) -> Dw {
        dw_of(self.multi, self.moff)
    }

    /// Whether a message from peer `p` with `tag` may land in this receive:
    /// the source, if directed, is `p`, and (tagged) the tags agree outside
    /// the ignore bits. The one predicate of every match ([`tags_agree`]).
    #[inline(always)]
    pub fn accepts(&self, tagged: bool, p: usize, tag: u64) -> bool {
        self.src.is_none_or(|s| s == p) && tags_agree(tagged, tag, self.tag, self.ignore)
    }
}

/// How a receive's completion reports: a multi-receive buffer's never
/// through deferred work; else as its `moff` says ([`PostedRecv::moff`]).
#[inline(always)]
fn dw_of(multi: u32, moff: usize) -> Dw {
    if multi != 0 {
        Dw::NONE
    } else {
        Dw::from_raw(moff as u32)
    }
}

/// Whether a message's `tag` fits a receive's (`want`, `ignore`): always
/// for an untagged one.
#[inline(always)]
fn tags_agree(tagged: bool, tag: u64, want: u64, ignore: u64) -> bool {
    !tagged || (tag & !ignore) == (want & !ignore)
}

/// A posted receive as its queue holds it ([`PostQueue`]): 64 bytes (a
/// cache line's size; the slots are not aligned to lines), where a
/// [`PostedRecv`] (four segments inline) takes 128. The first
/// segment is here; a receive of 2..=[`MAX_IOV`] segments keeps the others
/// in its queue's side array, at its slot; an SRQ's external list (`n >
/// MAX_IOV`) is named by the first segment, as in [`Iovs::external`].
/// Posting the common one-segment receive then writes 8 words instead of
/// 17. An empty slot ([`Default`]) is undirected, with no segment.
#[derive(Clone, Copy)]
pub(crate) struct Posted {
    pub ctx: usize,
    /// The first segment (see above).
    pub seg: Iov,
    pub tag: u64,
    pub ignore: u64,
    /// A directed receive's source ([`PostedRecv::src`]), or
    /// [`Posted::ANY`].
    src: usize,
    /// As [`PostedRecv::moff`].
    pub moff: usize,
    /// As [`PostedRecv::multi`].
    pub multi: u32,
    /// Segments, as [`Iovs::n`] (at most [`crate::srq::SRQ_MAX_IOV`]).
    n: u16,
    pub cqe: bool,
}

impl Default for Posted {
    /// An empty slot: undirected ([`Posted::ANY`], not peer 0), no segment.
    fn default() -> Posted {
        Posted { ctx: 0, seg: Iov::default(), tag: 0, ignore: 0, src: Self::ANY, moff: 0, multi: 0, n: 0, cqe: false }
    }
}

impl Posted {
    /// `src` of an undirected receive (no peer index or fi_addr of a
    /// directed one is `usize::MAX`: FI_ADDR_UNSPEC is not directed).
    const ANY: usize = usize::MAX;

    /// The compact form of `r` (its segments after the first aside).
    #[inline(always)]
    fn of(r: &PostedRecv) -> Posted {
        debug_assert!(r.iovs.n <= u16::MAX as usize && r.src != Some(Self::ANY));
        Posted {
            ctx: r.ctx,
            seg: r.iovs.v[0],
            tag: r.tag,
            ignore: r.ignore,
            src: r.src.unwrap_or(Self::ANY),
            moff: r.moff,
            multi: r.multi,
            n: r.iovs.n as u16,
            cqe: r.cqe,
        }
    }

    /// Directed receive: only from this source.
    #[inline(always)]
    pub fn src(&self) -> Option<usize> {
        (self.src != Self::ANY).then_some(self.src)
    }

    /// Segments (as [`Iovs::n`]).
    #[inline(always)]
    pub fn segs(&self) -> usize {
        self.n as usize
    }

    /// Whether its segments after the first are in its queue's side array.
    #[inline(always)]
    fn has_extra(&self) -> bool {
        self.n > 1 && self.n as usize <= MAX_IOV
    }

    /// As [`PostedRecv::dw`].
    #[inline(always)]
    pub fn dw(&self) -> Dw {
        dw_of(self.multi, self.moff)
    }

    /// As [`PostedRecv::accepts`].
    #[inline(always)]
    pub fn accepts(&self, tagged: bool, p: usize, tag: u64) -> bool {
        (self.src == Self::ANY || self.src == p) && tags_agree(tagged, tag, self.tag, self.ignore)
    }
}

/// The segments after the first of a posted receive of 2..=[`MAX_IOV`].
type Extra = [Iov; MAX_IOV - 1];

/// The posted receives of one queue, oldest first: a ring of a power of
/// two slots whose positions are masked (a `VecDeque` wraps them by a
/// comparison: its front, pop and push were about 40 instructions of every
/// message's receive path, by callgrind), each slot a compact [`Posted`].
///
/// Invariants: `slots.len()` is 0 or a power of two; `len <=
/// slots.len()`; `head < slots.len()` whenever `slots` is not empty (0
/// otherwise). So every position [`PostQueue::at`] gives is a slot when
/// `slots` is not empty, which `len > 0` implies. `extra` is empty or as
/// long as `slots`, and not empty if a slot in use holds a receive with
/// [`Posted::has_extra`], whose other segments are at its index there.
#[derive(Default)]
pub(crate) struct PostQueue {
    slots: Vec<Posted>,
    /// Segments after the first (see the invariants), allocated with the
    /// first receive of several segments.
    extra: Vec<Extra>,
    /// Slot of the oldest (below `slots.len()`).
    head: usize,
    len: usize,
}

impl PostQueue {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Slot of the `i`-th oldest (`slots` not empty).
    #[inline(always)]
    fn at(&self, i: usize) -> usize {
        (self.head + i) & (self.slots.len() - 1)
    }

    /// Puts `r` in slot `k` (a slot of `slots`).
    #[inline(always)]
    fn put(&mut self, k: usize, r: &PostedRecv) {
        debug_assert!(k < self.slots.len());
        // SAFETY: the callers give a slot of `slots` (masked by `at`, or
        // `head`, into a non-empty `slots`: invariants above).
        unsafe { *self.slots.get_unchecked_mut(k) = Posted::of(r) };
        if r.iovs.n > 1 && r.iovs.n <= MAX_IOV {
            self.put_extra(k, [r.iovs.v[1], r.iovs.v[2], r.iovs.v[3]]);
        }
    }

    /// The side array's part of [`PostQueue::put`] (out of line: a
    /// receive of one segment never gets here).
    #[cold]
    #[inline(never)]
    fn put_extra(&mut self, k: usize, e: Extra) {
        if self.extra.is_empty() {
            self.extra = vec![Extra::default(); self.slots.len()];
        }
        self.extra[k] = e;
    }

    /// The receive in slot `k` (a slot of `slots`), whole.
    fn full(&self, k: usize) -> PostedRecv {
        let r = &self.slots[k];
        let mut iovs = Iovs { v: [Iov::default(); MAX_IOV], n: r.segs() };
        iovs.v[0] = r.seg;
        if r.has_extra() {
            iovs.v[1..].copy_from_slice(&self.extra[k]);
        }
        PostedRecv {
            ctx: r.ctx,
            iovs,
            src: r.src(),
            tag: r.tag,
            ignore: r.ignore,
            multi: r.multi,
            moff: r.moff,
            cqe: r.cqe,
        }
    }

    /// The segments of the `i`-th oldest (`i < len`).
    #[inline]
    pub fn iovs(&self, i: usize) -> Iovs {
        let k = self.at(i);
        let r = &self.slots[k];
        if r.n == 1 {
            return Iovs::one(r.seg.ptr, r.seg.len);
        }
        self.full(k).iovs
    }

    /// Moves the receive in slot `from` to slot `to`.
    #[inline]
    fn shift(&mut self, from: usize, to: usize) {
        self.slots[to] = self.slots[from];
        if !self.extra.is_empty() {
            self.extra[to] = self.extra[from];
        }
    }

    /// Appends `r` (built in its slot when inlined).
    #[inline(always)]
    pub fn push_back(&mut self, r: PostedRecv) {
        if self.len == self.slots.len() {
            self.grow();
        }
        // `slots` is not empty (grown above if it was full, so if it was
        // empty), and `at` masks into it (invariants above).
        let i = self.at(self.len);
        self.put(i, &r);
        self.len += 1;
    }

    /// Puts `r` before the oldest (a receive given back).
    pub fn push_front(&mut self, r: PostedRecv) {
        if self.len == self.slots.len() {
            self.grow();
        }
        self.head = (self.head + self.slots.len() - 1) & (self.slots.len() - 1);
        self.put(self.head, &r);
        self.len += 1;
    }

    /// Slots (receives it holds without growing).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Makes room for `n` receives at once (so that pushes up to that
    /// many allocate nothing).
    pub fn reserve(&mut self, n: usize) {
        while self.slots.len() < n {
            self.grow();
        }
    }

    #[inline(always)]
    pub fn front(&self) -> Option<&Posted> {
        if self.len == 0 {
            return None;
        }
        debug_assert!(self.head < self.slots.len());
        // SAFETY: len > 0, so `slots` is not empty and head < slots.len()
        // (invariants above).
        Some(unsafe { self.slots.get_unchecked(self.head) })
    }

    /// Drops the oldest, if any.
    #[inline(always)]
    pub fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = self.at(1);
            self.len -= 1;
        }
    }

    pub fn get(&self, i: usize) -> Option<&Posted> {
        if i >= self.len {
            return None;
        }
        self.slots.get(self.at(i))
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut Posted> {
        if i >= self.len {
            return None;
        }
        let k = self.at(i);
        self.slots.get_mut(k)
    }

    /// Removes the `i`-th oldest, moving the shorter side of the queue
    /// by one slot (as `VecDeque::remove`).
    pub fn remove(&mut self, i: usize) -> Option<PostedRecv> {
        if i >= self.len {
            return None;
        }
        let r = self.full(self.at(i));
        if i < self.len / 2 {
            // The older ones move one slot towards the newer end.
            for k in (0..i).rev() {
                let (from, to) = (self.at(k), self.at(k + 1));
                self.shift(from, to);
            }
            self.head = self.at(1);
        } else {
            for k in i..self.len - 1 {
                let (to, from) = (self.at(k), self.at(k + 1));
                self.shift(from, to);
            }
        }
        self.len -= 1;
        Some(r)
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Posted> + '_ {
        (0..self.len).map(|i| &self.slots[self.at(i)])
    }

    /// Takes them all, oldest first.
    pub fn take_all(&mut self) -> Vec<PostedRecv> {
        let v = (0..self.len).map(|i| self.full(self.at(i))).collect();
        self.head = 0;
        self.len = 0;
        v
    }

    /// Doubles the slots (at least 8), the oldest moved to slot 0.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(8);
        let mut v = Vec::with_capacity(cap);
        v.extend(self.iter().copied());
        v.resize(cap, Posted::default());
        if !self.extra.is_empty() {
            let mut e = Vec::with_capacity(cap);
            e.extend((0..self.len).map(|i| self.extra[self.at(i)]));
            e.resize(cap, Extra::default());
            self.extra = e;
        }
        self.slots = v;
        self.head = 0;
    }
}

impl std::ops::Index<usize> for PostQueue {
    type Output = Posted;
    #[inline(always)]
    fn index(&self, i: usize) -> &Posted {
        self.get(i).expect("posted receive index in range")
    }
}

impl std::ops::IndexMut<usize> for PostQueue {
    #[inline(always)]
    fn index_mut(&mut self, i: usize) -> &mut Posted {
        self.get_mut(i).expect("posted receive index in range")
    }
}

/// What a matched receive delivers into.
#[derive(Clone, Copy, Default)]
pub(crate) struct Dest {
    pub ctx: usize,
    pub iovs: Iovs,
    pub cap: usize,
    pub buf: usize,
    /// For a piece carved from a multi-receive buffer (`keys.multi` names
    /// the buffer): its carve released the buffer (what is left of it
    /// from here goes back to an SRQ if the piece is given back); whether
    /// its entry carries FI_MULTI_RECV is decided when it is reported
    /// ([`MultiRecs::settle`]). For any other: its entry carries
    /// FI_MULTI_RECV (a buffer leaving its queue unused, released).
    pub multi_release: bool,
    pub cqe: bool,
    /// The receive's [`PostedRecv::dw`].
    pub dw: Dw,
    /// The match fields of the receive it came from: an SRQ buffer taken
    /// by an endpoint that closes (discarding) goes back to its queue
    /// with them.
    pub keys: Keys,
}

/// The match fields of a posted receive, kept with what it delivers into.
#[derive(Clone, Copy, Default)]
pub(crate) struct Keys {
    pub src: Option<usize>,
    pub tag: u64,
    pub ignore: u64,
    /// A piece carved from a multi-receive buffer: the buffer's record id
    /// ([`MultiRecs`]), settled when the piece is reported; else 0.
    pub multi: u32,
    /// The receive's own `cqe` (an SRQ's: whether it asked for
    /// FI_COMPLETION), before the taking endpoint's selective completion
    /// decided the Dest's.
    pub cqe: bool,
}

/// The multi-receive buffers of one owner (an endpoint's matching, or an
/// SRQ), by record id: for each, the pieces carved from it and not yet
/// reported, and whether it is released. The entry with FI_MULTI_RECV is
/// the report that finds the buffer released with no piece outstanding:
///
/// - a carve counts a piece ([`MultiRecs::carve`]), and the carve that
///   leaves less than the minimum releases the buffer;
/// - each piece's report settles it ([`MultiRecs::settle`]), in success
///   or error: the one that leaves none outstanding on a released buffer
///   carries the flag, so a piece that released the buffer while an
///   earlier one (another peer's rendezvous, say) still arrives reports
///   without it, and that earlier one, reported last, with it;
/// - a buffer that leaves its queue unused (cancel, flush, its directed
///   peer gone) is released then ([`MultiRecs::release_unused`]): that
///   report carries the flag unless pieces are outstanding (the last of
///   them carries it);
/// - a piece an SRQ takes back ([`MultiRecs::give_back`]) is settled
///   without a report (and the piece that released the buffer takes the
///   release back with it: the buffer is posted again).
///
/// A record is freed with its flag. Ids of an SRQ's records have
/// [`MultiRecs::SRQ`] set (a piece's report finds its owner by it). A
/// record's slot is reused LIFO, each time under a new generation, which
/// its id carries: a stale id (one whose record was freed, and perhaps
/// reopened for another buffer) names no record, so it can never act on
/// another buffer's.
pub(crate) struct MultiRecs {
    recs: Vec<MultiRec>,
    free: Vec<u32>,
    /// [`MultiRecs::SRQ`] for an SRQ's, else 0: set in every id.
    mark: u32,
}

#[derive(Clone, Copy, Default)]
struct MultiRec {
    /// Pieces carved and not yet reported.
    out: u32,
    /// The generation of the slot's current (or last) record: at most
    /// `MultiRecs::GEN_MASK`, bumped at each reopening of the slot.
    generation: u32,
    released: bool,
    live: bool,
}

impl MultiRecs {
    /// Set in the record ids of an SRQ's buffers.
    pub const SRQ: u32 = 1 << 31;
    /// Bits of an id holding its slot's index plus one (never 0).
    const INDEX_BITS: u32 = 20;
    const INDEX_MASK: u32 = (1 << Self::INDEX_BITS) - 1;
    /// Generations, in the bits between the index and [`MultiRecs::SRQ`]
    /// (they wrap: a stale id is refused unless its slot was reopened a
    /// multiple of 2048 times since).
    const GEN_MASK: u32 = (1 << (31 - Self::INDEX_BITS)) - 1;

    /// Records of an endpoint's buffers (`srq` false) or of an SRQ's.
    pub fn new(srq: bool) -> MultiRecs {
        MultiRecs { recs: Vec::new(), free: Vec::new(), mark: if srq { Self::SRQ } else { 0 } }
    }

    /// A record for a buffer being posted: its id (never 0), or
    /// `-FI_EAGAIN` when 2^20 - 1 records are live already (buffers
    /// posted, or released with pieces outstanding: progress frees them).
    #[cold]
    #[inline(never)]
    pub fn open(&mut self) -> Result<u32> {
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None if self.recs.len() < Self::INDEX_MASK as usize => {
                self.recs.push(MultiRec::default());
                self.recs.len() - 1
            }
            None => {
                return Err(Error::with(
                    crate::error::ErrorKind::Again,
                    format!("{} multi-receive buffers are posted or not yet released", Self::INDEX_MASK),
                ))
            }
        };
        let r = &mut self.recs[i];
        let generation = (r.generation + 1) & Self::GEN_MASK;
        *r = MultiRec { out: 0, generation, released: false, live: true };
        Ok(self.mark | generation << Self::INDEX_BITS | (i as u32 + 1))
    }

    /// The live record `id` names: None for an id of no record, or a stale
    /// one (its record freed, or its slot reopened under a new generation).
    fn rec(&mut self, id: u32) -> Option<&mut MultiRec> {
        if id & Self::SRQ != self.mark {
            return None; // another owner's (an SRQ's, or an endpoint's)
        }
        let i = ((id & Self::INDEX_MASK) as usize).checked_sub(1)?;
        let generation = (id >> Self::INDEX_BITS) & Self::GEN_MASK;
        self.recs.get_mut(i).filter(|r| r.live && r.generation == generation)
    }

    /// Whether any record is live: a buffer posted, or released with
    /// pieces outstanding.
    pub fn any_live(&self) -> bool {
        self.free.len() < self.recs.len()
    }

    /// Frees record `id` (its flag is written, or its buffer was never
    /// posted); a stale id frees nothing.
    pub fn close(&mut self, id: u32) {
        if let Some(r) = self.rec(id) {
            r.live = false;
            self.free.push((id & Self::INDEX_MASK) - 1);
        }
    }

    /// A piece is carved from buffer `id`; `release`: the carve released it.
    /// A buffer in a queue always has its record: an unknown id counts
    /// nothing (a bug, asserted in debug builds).
    fn carve(&mut self, id: u32, release: bool) {
        if let Some(r) = self.rec(id) {
            r.out += 1;
            r.released |= release;
        } else {
            debug_assert!(false, "a piece carved from an unknown multi-receive buffer");
        }
    }

    /// A piece of buffer `id` is reported (in success or error): whether
    /// its entry carries FI_MULTI_RECV (the buffer is released and no
    /// other piece is outstanding; the record is then freed). An outstanding
    /// piece keeps its record, so an unknown id is a bug (asserted in debug
    /// builds); its entry then goes without the flag, since a freed
    /// record's flag was written already and a reopened slot is another
    /// buffer's.
    pub fn settle(&mut self, id: u32) -> bool {
        let Some(r) = self.rec(id) else {
            debug_assert!(false, "a piece of an unknown multi-receive buffer");
            return false;
        };
        r.out = r.out.saturating_sub(1);
        let last = r.released && r.out == 0;
        if last {
            self.close(id);
        }
        last
    }

    /// Buffer `id` leaves its queue unused (cancelled, flushed, its
    /// directed peer gone): released. Whether the entry that reports it
    /// carries FI_MULTI_RECV (no piece outstanding: the record is freed);
    /// otherwise the last piece's does. A buffer in a queue always has its
    /// record: an unknown id is a bug (asserted in debug builds), and the
    /// entry carries the flag (the buffer leaves: nothing else will).
    pub fn release_unused(&mut self, id: u32) -> bool {
        let Some(r) = self.rec(id) else {
            debug_assert!(false, "an unknown multi-receive buffer left its queue");
            return true;
        };
        r.released = true;
        let last = r.out == 0;
        if last {
            self.close(id);
        }
        last
    }

    /// A piece of buffer `id` taken back unreported (an SRQ's, given back
    /// by an endpoint that closes discarding): with `release` (it released
    /// the buffer) the buffer is unreleased, posted again from that piece
    /// on. Whether a flag is owed anyway: the buffer stays released (its
    /// releasing piece was reported, or is held elsewhere) and this was its
    /// last outstanding piece (the record is then freed). An outstanding
    /// piece keeps its record: an unknown id is a bug (asserted in debug
    /// builds), and owes nothing.
    pub fn give_back(&mut self, id: u32, release: bool) -> bool {
        let Some(r) = self.rec(id) else {
            debug_assert!(false, "a piece of an unknown multi-receive buffer given back");
            return false;
        };
        r.out = r.out.saturating_sub(1);
        if release {
            r.released = false;
        }
        let owed = r.released && r.out == 0;
        if owed {
            self.close(id);
        }
        owed
    }

    /// Records live (for tests).
    #[cfg(all(test, not(loom)))]
    pub fn live(&self) -> usize {
        self.recs.iter().filter(|r| r.live).count()
    }
}

/// Takes the posted receive `i` of `queue` for a message of `len` bytes:
/// removes it, or carves from a multi-receive buffer (counted in `recs`;
/// released, and removed, when less than `min_multi_recv` bytes of it
/// remain). The one way a receive leaves a queue for a message, an
/// endpoint's or an SRQ's.
#[inline(always)]
pub(crate) fn take_at(
    queue: &mut PostQueue,
    i: usize,
    len: usize,
    min_multi_recv: usize,
    recs: &mut MultiRecs,
) -> Dest {
    if queue[i].multi != 0 {
        carve(queue, i, len, min_multi_recv, recs)
    } else {
        let iovs = queue.iovs(i);
        // Built from a reference, then the entry dropped: moving the
        // whole entry out first costs store-forwarding stalls.
        let r = &queue[i];
        let d = Dest {
            ctx: r.ctx,
            iovs,
            cap: iovs.total(),
            buf: r.seg.ptr,
            multi_release: false,
            cqe: r.cqe,
            dw: r.dw(),
            keys: Keys { src: r.src(), tag: r.tag, ignore: r.ignore, multi: 0, cqe: r.cqe },
        };
        if i == 0 {
            queue.pop_front();
        } else {
            queue.remove(i);
        }
        d
    }
}

/// Where a posted receive taken out unmatched would have delivered (a
/// multi-receive buffer, of `recs`: what is left of it, released; its
/// entry has FI_MULTI_RECV unless pieces of it are outstanding, see
/// [`MultiRecs::release_unused`]). Its report settles nothing.
pub(crate) fn unused(r: PostedRecv, recs: &mut MultiRecs) -> Dest {
    let (at, cap, flag) = if r.multi != 0 {
        (r.iovs.v[0].ptr + r.moff, r.iovs.v[0].len - r.moff, recs.release_unused(r.multi))
    } else {
        (r.iovs.v[0].ptr, r.iovs.total(), false)
    };
    let keys = Keys { src: r.src, tag: r.tag, ignore: r.ignore, multi: 0, cqe: r.cqe };
    Dest { ctx: r.ctx, iovs: r.iovs, cap, buf: at, multi_release: flag, cqe: r.cqe, dw: r.dw(), keys }
}

/// [`take_at`] of a multi-receive buffer: carves a piece of it (out of
/// line: the other receives' path stays as short as before the pieces
/// were counted).
#[inline(never)]
fn carve(queue: &mut PostQueue, i: usize, len: usize, min: usize, recs: &mut MultiRecs) -> Dest {
    let r = &mut queue[i];
    let base = r.seg;
    let avail = base.len - r.moff;
    let at = base.ptr + r.moff;
    let used = len.min(avail);
    // Keep later messages 8-byte aligned inside the buffer.
    r.moff = (r.moff + used).next_multiple_of(8).min(base.len);
    let release = base.len - r.moff < min.max(1);
    recs.carve(r.multi, release);
    let d = Dest {
        ctx: r.ctx,
        iovs: Iovs::one(at, avail),
        cap: avail,
        buf: at,
        multi_release: release,
        cqe: r.cqe,
        dw: Dw::NONE,
        keys: Keys { src: r.src(), tag: r.tag, ignore: r.ignore, multi: r.multi, cqe: r.cqe },
    };
    if release {
        queue.remove(i);
    }
    d
}

/// A message that arrived before its receive.
pub(crate) enum UnexpBody {
    /// Whole payload (inline, or a bounce message copied out of the pool;
    /// `received < len` while its chunks are still arriving).
    Data { v: Vec<u8>, received: usize, msg_id: u64 },
    /// A rendezvous: the data stays with the sender until matched. `cma`:
    /// single copy offered; `fin`: the sender asked for a FIN also when
    /// the data comes through the pool (`rts_flags::FIN`).
    Rts { msg_id: u64, iovs: Vec<(u64, u64)>, cma: bool, fin: bool },
    /// A claimed message whose sender failed before it could be received
    /// (its data is gone): its FI_CLAIM receive completes in error.
    Lost,
}

pub(crate) struct Unexp {
    pub id: u64,
    pub peer: usize,
    pub tag: u64,
    pub data: u64,
    pub hflags: u8,
    pub len: usize,
    pub body: UnexpBody,
}

impl Unexp {
    /// Payload bytes it holds in endpoint memory.
    fn held(&self) -> usize {
        match &self.body {
            UnexpBody::Data { v, .. } => v.len(),
            UnexpBody::Rts { .. } | UnexpBody::Lost => 0,
        }
    }

    /// Whether its data is still arriving (a bounce message).
    pub fn arriving(&self) -> bool {
        matches!(self.body, UnexpBody::Data { received, .. } if received < self.len)
    }
}

/// Why an unexpected message is out of reach of receives and peeks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Hold {
    /// Claimed (FI_PEEK | FI_CLAIM) under this receive context.
    Claimed(usize),
    /// Discarded while its chunks still arrive: they are dropped, and the
    /// message leaves with the last one.
    Discarded,
}

/// What [`Matching::discard`] did.
pub(crate) enum Discard {
    /// The message left the queue: the caller releases what it holds (a
    /// rendezvous's sender waits for its FIN).
    Gone(Unexp),
    /// Still arriving: held as discarded until its last chunk.
    Arriving,
}

/// Whether no hold names the unexpected message `id`.
#[inline]
fn free(holds: &[(u64, Hold)], id: u64) -> bool {
    holds.is_empty() || !holds.iter().any(|h| h.0 == id)
}

/// Most spare unexpected-message buffers an endpoint keeps.
const SPARE_MAX: usize = 256;
/// Largest buffer kept as a spare.
const SPARE_BYTES: usize = 4096;

/// The endpoint's matching state (see the module docs for its invariants).
pub(crate) struct Matching {
    /// Posted receives: [untagged, tagged], in posting order.
    posted: [PostQueue; 2],
    /// Unexpected messages: [untagged, tagged], in arrival order.
    unexp: [VecDeque<Unexp>; 2],
    /// Payload bytes held by `unexp` (invariant above).
    unexp_bytes: usize,
    /// Next unexpected message's id (never 0).
    next_unexp_id: u64,
    /// Unexpected messages held back from matching, by id (see the module
    /// docs); usually empty.
    holds: Vec<(u64, Hold)>,
    /// FI_OPT_MIN_MULTI_RECV.
    pub min_multi_recv: usize,
    /// The endpoint's own multi-receive buffers.
    pub multi: MultiRecs,
    /// Buffers of delivered unexpected messages, kept for the next ones
    /// (small ones only, at most `SPARE_MAX`): no allocation per message.
    spare: Vec<Vec<u8>>,
    /// Shared receive queue bound (see [`Matching::srq_for`]).
    pub srq: Option<usize>,
    /// Whether [untagged, tagged] receives come from `srq`.
    srq_kinds: [bool; 2],
    /// Whether [`Matching::front_plain`] is off for [untagged, tagged]
    /// messages: from the SRQ, FI_SOURCE_ERR on, or a deferred work
    /// request's receive posted (one load on the fast path).
    plain_off: [bool; 2],
    /// The endpoint is closing: takes no more SRQ buffers.
    pub closing: bool,
    /// FI_SOURCE_ERR: every receive completes through `emit_rx`, which
    /// checks its source ([`Matching::front_plain`] is off).
    source_err: bool,
    /// Posted receives whose `dw` is not [`Dw::NONE`] (deferred work's:
    /// they complete through `emit_rx`, which counts their completion
    /// counter).
    deferred: usize,
}

impl Matching {
    pub fn new() -> Matching {
        Matching {
            posted: [PostQueue::default(), PostQueue::default()],
            unexp: [VecDeque::new(), VecDeque::new()],
            unexp_bytes: 0,
            next_unexp_id: 1,
            holds: Vec::new(),
            min_multi_recv: 64,
            multi: MultiRecs::new(false),
            spare: Vec::new(),
            srq: None,
            srq_kinds: [false; 2],
            plain_off: [false; 2],
            closing: false,
            source_err: false,
            deferred: 0,
        }
    }

    /// Turns FI_SOURCE_ERR on or off.
    pub fn set_source_err(&mut self, on: bool) {
        self.source_err = on;
        self.set_plain_off();
    }

    /// Recomputes `plain_off` (see there).
    fn set_plain_off(&mut self) {
        let general = self.source_err || self.deferred > 0;
        self.plain_off = [self.srq_kinds[0] || general, self.srq_kinds[1] || general];
    }

    /// A receive with a deferred completion (`r.dw()` not [`Dw::NONE`])
    /// is posted as [`Matching::post`] posts; while it is, the fast path
    /// declines, so that its completion goes through `emit_rx`.
    pub fn post_deferred(&mut self, tagged: bool, r: PostedRecv, rx_size: usize) -> Result<()> {
        let dw = r.dw();
        self.post(tagged, r, rx_size)?;
        if !dw.is_none() {
            self.deferred += 1;
            self.set_plain_off();
        }
        Ok(())
    }

    /// A posted receive left its queue (taken whole, cancelled, flushed).
    #[inline(always)]
    fn left(&mut self, dw: Dw) {
        if !dw.is_none() {
            self.left_deferred();
        }
    }

    #[cold]
    #[inline(never)]
    fn left_deferred(&mut self) {
        self.deferred -= 1;
        self.set_plain_off();
    }

    /// Binds the shared receive queue `id`: the receives of the kinds
    /// `kinds` ([untagged, tagged]) come from it.
    pub fn bind_srq(&mut self, id: usize, kinds: [bool; 2]) {
        self.srq = Some(id);
        self.srq_kinds = kinds;
        self.set_source_err(self.source_err);
    }

    /// The SRQ that `tagged`'s receives come from, if any.
    #[inline(always)]
    pub fn srq_for(&self, tagged: bool) -> Option<usize> {
        self.srq.filter(|_| self.srq_kinds[tagged as usize])
    }

    /// Whether FI_SOURCE_ERR is on.
    #[inline]
    pub fn source_err(&self) -> bool {
        self.source_err
    }

    /// Receives posted (both queues).
    pub fn posted_count(&self) -> usize {
        self.posted[0].len() + self.posted[1].len()
    }

    /// Unexpected messages held (both queues).
    pub fn unexp_count(&self) -> usize {
        self.unexp[0].len() + self.unexp[1].len()
    }

    /// Payload bytes held by unexpected messages.
    #[cfg(all(test, not(loom)))]
    pub fn unexp_bytes(&self) -> usize {
        self.unexp_bytes
    }

    /// Whether an unexpected message waits in `tagged`'s queue.
    #[inline(always)]
    pub fn has_unexp(&self, tagged: bool) -> bool {
        !self.unexp[tagged as usize].is_empty()
    }

    /// Whether a receive directed at peer `p` is posted.
    pub fn directed_at(&self, p: usize) -> bool {
        self.posted.iter().any(|q| q.iter().any(|r| r.src() == Some(p)))
    }

    /// Appends a posted receive; `-FI_EAGAIN` when `rx_size` are posted.
    #[inline(always)]
    pub fn post(&mut self, tagged: bool, r: PostedRecv, rx_size: usize) -> Result<()> {
        let q = &mut self.posted[tagged as usize];
        if q.len() >= rx_size {
            return Err(Error::AGAIN);
        }
        q.push_back(r);
        Ok(())
    }

    /// For the receive just posted (the last of its queue): the first
    /// unexpected message it accepts, taken out of the queue, with the
    /// place it delivers into. Called again while it returns something
    /// and the receive is still posted (a multi-receive buffer takes
    /// several).
    pub fn take_unexp_for_last(&mut self, tagged: bool) -> Option<(Unexp, Dest)> {
        let q = tagged as usize;
        let ri = self.posted[q].len().checked_sub(1)?;
        let r = &self.posted[q][ri];
        let holds = &self.holds;
        let ui = self.unexp[q].iter().position(|u| r.accepts(tagged, u.peer, u.tag) && free(holds, u.id))?;
        let u = self.unexp[q].remove(ui).expect("index from position");
        self.unexp_bytes -= u.held();
        let d = self.take_posted(q, ri, u.len);
        Some((u, d))
    }

    /// Takes the endpoint's own posted receive that a message of `len`
    /// bytes from `p` with `tag` matches: the first that accepts it (for a
    /// kind the endpoint takes from its SRQ, see [`EpState::take_match`]).
    #[inline(always)]
    pub fn take_match(&mut self, tagged: bool, p: usize, tag: u64, len: usize) -> Option<Dest> {
        let q = tagged as usize;
        let i = self.posted[q].iter().position(|r| r.accepts(tagged, p, tag))?;
        Some(self.take_posted(q, i, len))
    }

    /// The inline fast path's match: the oldest posted receive, if it is a
    /// plain one (one segment, not multi-receive, not from an SRQ) that
    /// accepts the message and holds `len` bytes. Returns its context,
    /// segment and whether it wants an entry; [`Matching::pop_front`] then
    /// takes it.
    #[inline(always)]
    pub fn front_plain(&self, tagged: bool, p: usize, tag: u64, len: usize) -> Option<(usize, Iov, bool)> {
        // Two fixed loads and a select: an index would keep `tagged`
        // live as a word (a spill in the ring loop, by callgrind).
        if if tagged { self.plain_off[1] } else { self.plain_off[0] } {
            return None;
        }
        let r = self.posted[tagged as usize].front()?;
        let seg = r.seg;
        if r.multi != 0 || r.n != 1 || len > seg.len || !r.accepts(tagged, p, tag) {
            return None;
        }
        Some((r.ctx, seg, r.cqe))
    }

    /// Removes the oldest posted receive of a queue (after
    /// [`Matching::front_plain`]).
    #[inline(always)]
    pub fn pop_front(&mut self, tagged: bool) {
        self.posted[tagged as usize].pop_front();
    }

    /// Takes the posted receive `i` of queue `q` for a message of `len`
    /// bytes (see [`take_at`]).
    #[inline(always)]
    fn take_posted(&mut self, q: usize, i: usize, len: usize) -> Dest {
        let d = take_at(&mut self.posted[q], i, len, self.min_multi_recv, &mut self.multi);
        // A multi-receive part (which may leave the queue) has no deferred
        // reporting: only a receive taken whole counts here.
        self.left(d.dw);
        d
    }

    /// Removes every receive directed at peer `p`, with its queue
    /// (tagged or not) and the place it would have delivered into.
    pub fn take_directed(&mut self, p: usize) -> Vec<(bool, Dest)> {
        let mut out = Vec::new();
        for q in 0..2 {
            let mut i = 0;
            while i < self.posted[q].len() {
                if self.posted[q][i].src() == Some(p) {
                    let r = self.posted[q].remove(i).expect("index checked");
                    self.left(r.dw());
                    out.push((q == 1, unused(r, &mut self.multi)));
                } else {
                    i += 1;
                }
            }
        }
        out
    }

    /// Removes the first posted receive (untagged queue first) whose
    /// context is `ctx` (fi_cancel), with its queue and the place it would
    /// have delivered into.
    pub fn cancel(&mut self, ctx: usize) -> Option<(bool, Dest)> {
        let (q, r) = (0..2).find_map(|q| {
            let i = self.posted[q].iter().position(|r| r.ctx == ctx)?;
            Some((q, self.posted[q].remove(i).expect("index from position")))
        })?;
        self.left(r.dw());
        Some((q == 1, unused(r, &mut self.multi)))
    }

    /// Takes every posted receive (the endpoint closes), untagged first,
    /// each queue in posting order.
    pub fn take_all_posted(&mut self) -> Vec<(bool, Dest)> {
        let mut out = Vec::new();
        for q in 0..2 {
            let recs = &mut self.multi;
            out.extend(self.posted[q].take_all().into_iter().map(|r| (q == 1, unused(r, recs))));
        }
        self.deferred = 0;
        self.set_plain_off();
        out
    }

    /// Whether holding `more` unexpected bytes is over the budget
    /// (`unexp_max` bytes, or four times `rx_size` messages).
    #[inline]
    pub fn over_budget(&self, cfg: &Config, more: usize) -> bool {
        self.unexp_bytes + more > cfg.unexp_max || self.unexp_count() >= cfg.rx_size * 4
    }

    /// Queues an unexpected message (its id is assigned here); returns the id.
    pub fn queue_unexp(&mut self, tagged: bool, mut u: Unexp) -> u64 {
        let id = self.next_unexp_id;
        self.next_unexp_id += 1;
        u.id = id;
        self.unexp_bytes += u.held();
        self.unexp[tagged as usize].push_back(u);
        id
    }

    /// Appends a chunk at `off` to the still-arriving unexpected message
    /// `id` (of `total` bytes). Some(complete) when it fitted; None when
    /// the message is unknown or the chunk out of order.
    pub fn append_unexp(&mut self, id: u64, off: usize, bytes: &[u8], total: usize) -> Option<bool> {
        let discarded = self.holds.contains(&(id, Hold::Discarded));
        let [a, b] = &mut self.unexp;
        let u = a.iter_mut().chain(b.iter_mut()).find(|u| u.id == id)?;
        let UnexpBody::Data { v, received, .. } = &mut u.body else {
            return None;
        };
        if *received != off || off + bytes.len() > total {
            return None;
        }
        *received += bytes.len();
        let done = *received == total;
        if discarded {
            // Nobody will read it: counted, not kept; gone with its last chunk.
            if done {
                self.drop_unexp(id);
            }
        } else {
            v.reserve(bytes.len());
            let at = v.len();
            // SAFETY: reserved above: bytes.len() bytes of spare capacity
            // at `at`, disjoint from `bytes` (the pool's chunk); written
            // in full before the length covers them.
            unsafe {
                crate::copy::copy(bytes.as_ptr(), v.as_mut_ptr().add(at), bytes.len());
                v.set_len(at + bytes.len());
            }
            self.unexp_bytes += bytes.len();
        }
        Some(done)
    }

    /// Drops the unexpected message `id` (it can never complete). A
    /// claimed one stays, lost, for its FI_CLAIM receive to report.
    pub fn drop_unexp(&mut self, id: u64) {
        let claimed = self.holds.iter().any(|h| h.0 == id && matches!(h.1, Hold::Claimed(_)));
        for q in 0..2 {
            if let Some(i) = self.unexp[q].iter().position(|u| u.id == id) {
                if claimed {
                    self.unexp_bytes -= self.unexp[q][i].held();
                    self.unexp[q][i].body = UnexpBody::Lost;
                    return;
                }
                let u = self.unexp[q].remove(i).expect("index from position");
                self.unexp_bytes -= u.held();
                self.holds.retain(|h| h.0 != id);
            }
        }
    }

    /// Drops the unexpected rendezvous requests of peer `p` (gone: its
    /// data went with it); claimed ones stay, lost.
    pub fn drop_rts_from(&mut self, p: usize) {
        let ids: Vec<u64> = self
            .unexp
            .iter()
            .flatten()
            .filter(|u| u.peer == p && matches!(u.body, UnexpBody::Rts { .. }))
            .map(|u| u.id)
            .collect();
        for id in ids {
            self.drop_unexp(id);
        }
    }

    /// The first unexpected message of `tagged`'s queue that the receive
    /// `r` accepts and nobody holds (a peek: it stays queued).
    pub fn find_free(&self, tagged: bool, r: &PostedRecv) -> Option<&Unexp> {
        self.unexp[tagged as usize].iter().find(|u| r.accepts(tagged, u.peer, u.tag) && free(&self.holds, u.id))
    }

    /// Whether `ctx` holds a claimed message.
    pub fn claims(&self, ctx: usize) -> bool {
        self.holds.iter().any(|h| h.1 == Hold::Claimed(ctx))
    }

    /// Claims the unexpected message `id` for the receive context `ctx`
    /// (which holds no other: [`Matching::claims`]).
    pub fn claim(&mut self, id: u64, ctx: usize) {
        debug_assert!(!self.claims(ctx) && free(&self.holds, id));
        self.holds.push((id, Hold::Claimed(ctx)));
    }

    /// The id of the message `ctx` claimed, released from the claim (the
    /// caller takes or discards it at once).
    pub fn unclaim(&mut self, ctx: usize) -> Option<u64> {
        let i = self.holds.iter().position(|h| h.1 == Hold::Claimed(ctx))?;
        Some(self.holds.swap_remove(i).0)
    }

    /// The unexpected message `id`, if queued.
    pub fn get(&self, id: u64) -> Option<&Unexp> {
        self.unexp.iter().flatten().find(|u| u.id == id)
    }

    /// Takes the unexpected message `id` out of its queue (it is received).
    pub fn take(&mut self, id: u64) -> Option<Unexp> {
        let (q, i) = (0..2).find_map(|q| Some((q, self.unexp[q].iter().position(|u| u.id == id)?)))?;
        let u = self.unexp[q].remove(i).expect("index from position");
        self.unexp_bytes -= u.held();
        self.holds.retain(|h| h.0 != id);
        Some(u)
    }

    /// Discards the unexpected message `id` (FI_DISCARD): out of the
    /// queue, or, while its chunks still arrive, held until the last one
    /// (its bytes so far freed at once). None when unknown.
    pub fn discard(&mut self, id: u64) -> Option<Discard> {
        if !self.get(id)?.arriving() {
            return self.take(id).map(Discard::Gone);
        }
        self.holds.retain(|h| h.0 != id);
        self.holds.push((id, Hold::Discarded));
        let u = self.unexp.iter_mut().flatten().find(|u| u.id == id).expect("found above");
        if let UnexpBody::Data { v, .. } = &mut u.body {
            self.unexp_bytes -= v.len();
            *v = Vec::new();
        }
        Some(Discard::Arriving)
    }

    /// Takes out the first unexpected message of `tagged`'s queue that
    /// nobody holds and that `accept` takes (given the message and its
    /// source as `src` maps its peer: an SRQ's receives name fi_addrs).
    pub fn take_unexp_with(
        &mut self,
        tagged: bool,
        mut src: impl FnMut(usize) -> usize,
        mut accept: impl FnMut(usize, &Unexp) -> bool,
    ) -> Option<Unexp> {
        let q = tagged as usize;
        let holds = &self.holds;
        let i = self.unexp[q].iter().position(|u| free(holds, u.id) && accept(src(u.peer), u))?;
        let u = self.unexp[q].remove(i).expect("index from position");
        self.unexp_bytes -= u.held();
        Some(u)
    }

    /// The first unexpected message of `tagged`'s queue that the receive
    /// `r` accepts (its source mapped by `src`, as for
    /// [`Matching::take_unexp_with`]) and nobody holds: a peek on an SRQ.
    pub fn find_free_with(&self, tagged: bool, r: &PostedRecv, mut src: impl FnMut(usize) -> usize) -> Option<&Unexp> {
        self.unexp[tagged as usize].iter().find(|u| free(&self.holds, u.id) && r.accepts(tagged, src(u.peer), u.tag))
    }

    /// A buffer of `len` bytes for an unexpected message (a recycled one if
    /// it fits).
    #[inline]
    pub fn spare_buf(&mut self, len: usize) -> Vec<u8> {
        match self.spare.pop() {
            Some(mut v) if v.capacity() >= len => {
                v.resize(len, 0);
                v
            }
            other => {
                if let Some(v) = other {
                    self.spare.push(v);
                }
                vec![0u8; len]
            }
        }
    }

    /// Keeps a delivered unexpected message's buffer for reuse.
    #[inline]
    pub fn recycle_buf(&mut self, mut v: Vec<u8>) {
        if v.capacity() <= SPARE_BYTES && self.spare.len() < SPARE_MAX {
            v.clear();
            self.spare.push(v);
        }
    }
}

impl super::EpState {
    /// Takes the receive a message of `len` bytes from peer `p` with `tag`
    /// matches: for a kind the endpoint takes from its SRQ, the first SRQ
    /// receive that accepts it (none while the endpoint closes), else the
    /// first of its own that does.
    #[inline(always)]
    pub fn take_match(&mut self, ctx: &mut Ctx<'_>, tagged: bool, p: usize, tag: u64, len: usize) -> Option<Dest> {
        if let Some(s) = self.matching.srq_for(tagged) {
            return self.take_srq_match(ctx, s, tagged, p, tag, len);
        }
        self.matching.take_match(tagged, p, tag, len)
    }

    /// [`EpState::take_match`] from SRQ `s`: its receives name their
    /// source by fi_addr, so the message's source is the fi_addr of peer
    /// `p` in this endpoint's AV (`FI_ADDR_NOTAVAIL` if it has none); the
    /// receive writes an entry if it asked for FI_COMPLETION or this
    /// endpoint's receive CQ is not bound with FI_SELECTIVE_COMPLETION.
    #[inline(never)]
    fn take_srq_match(
        &mut self,
        ctx: &mut Ctx<'_>,
        s: usize,
        tagged: bool,
        p: usize,
        tag: u64,
        len: usize,
    ) -> Option<Dest> {
        if self.matching.closing {
            return None;
        }
        let q = ctx.srqs.get_mut(s)?;
        let src = if q.directed(tagged) { self.peers.src_addr(ctx.avs, p) as usize } else { usize::MAX };
        let mut d = q.take_match(tagged, src, tag, len)?;
        d.cqe |= !self.bind.rx_sel;
        Some(d)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The receive the queue model's `ctx` stands for: 1 to MAX_IOV
    /// segments, or an external list, by `ctx` (segments after the first
    /// live in the queue's side array), directed or not.
    fn model_recv(ctx: usize) -> PostedRecv {
        let n = ctx % (MAX_IOV + 1) + 1;
        let iovs = if n > MAX_IOV {
            Iovs::external(ctx as *const Iov, 16, ctx)
        } else {
            let mut v = [Iov::default(); MAX_IOV];
            for (k, s) in v.iter_mut().enumerate().take(n) {
                *s = Iov { ptr: ctx * 100 + k, len: k + 1 };
            }
            Iovs { v, n }
        };
        let src = ctx.is_multiple_of(3).then_some(ctx);
        PostedRecv { ctx, iovs, src, tag: ctx as u64, ..Default::default() }
    }

    /// Whether `r` is [`model_recv`]`(ctx)` whole (segments, source, tag).
    fn is_model(r: &PostedRecv, ctx: usize) -> bool {
        let m = model_recv(ctx);
        let segs = |x: &PostedRecv| {
            let n = x.iovs.n.min(if x.iovs.n > MAX_IOV { 1 } else { MAX_IOV });
            (x.iovs.n, x.iovs.v[..n].iter().map(|s| (s.ptr, s.len)).collect::<Vec<_>>())
        };
        r.ctx == ctx && r.src == m.src && r.tag == m.tag && segs(r) == segs(&m)
    }

    /// The queue against a `VecDeque` model: pushes past growth while
    /// wrapped, pops, pushes in front, and removals on both sides of the
    /// middle; receives of several segments keep them (the side array
    /// moves with the slots).
    #[test]
    fn post_queue_keeps_order_across_wrap_growth_and_removal() {
        let r = model_recv;
        let mut q = PostQueue::default();
        let mut model = std::collections::VecDeque::new();
        let mut next = 0;
        let mut seed = 7u64;
        let mut most = 0;
        for step in 0..4000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let pick = (seed >> 33) as usize;
            // Growing phases (pushes 5 in 8) and shrinking ones (2 in 8).
            let bias = if (step / 500) % 2 == 0 { 5 } else { 2 };
            let k = pick % 8;
            match if k < bias {
                0
            } else if k < bias + 2 {
                3
            } else {
                5
            } {
                0 => {
                    q.push_back(r(next));
                    model.push_back(next);
                    next += 1;
                }
                3 => {
                    assert_eq!(q.front().map(|x| x.ctx), model.front().copied());
                    q.pop_front();
                    model.pop_front();
                }
                _ if pick.is_multiple_of(16) => {
                    q.push_front(r(next));
                    model.push_front(next);
                    next += 1;
                }
                _ => {
                    if !model.is_empty() {
                        let i = pick % model.len();
                        let (got, want) = (q.remove(i), model.remove(i));
                        assert!(got.is_some_and(|x| is_model(&x, want.unwrap())), "step {step}");
                    }
                    assert!(q.remove(model.len()).is_none());
                }
            }
            most = most.max(model.len());
            assert_eq!(q.len(), model.len());
            assert!(q.iter().map(|x| x.ctx).eq(model.iter().copied()), "step {step}");
            if let Some(last) = model.len().checked_sub(1) {
                assert_eq!(q[last].ctx, model[last]);
                q[last].moff = 1;
                assert_eq!(q.get(last).map(|x| x.moff), Some(1));
                q[last].moff = 0;
            }
        }
        assert!(most > 64, "the queue grew past several doublings ({most})");
        for (i, &c) in model.iter().enumerate() {
            let want = model_recv(c).iovs;
            let got = q.iovs(i);
            assert_eq!((got.n, got.v[0].ptr, got.v[0].len), (want.n, want.v[0].ptr, want.v[0].len));
            assert_eq!(q[i].src(), model_recv(c).src);
        }
        let all = q.take_all();
        assert!(all.len() == model.len() && all.iter().zip(model.iter()).all(|(x, &c)| is_model(x, c)));
        assert_eq!(q.len(), 0);
        assert!(q.front().is_none() && q.get(0).is_none());
    }

    /// A receive into `buf`; `multi`: a multi-receive buffer's record id
    /// (0: none).
    fn recv(buf: &mut [u8], src: Option<usize>, tag: u64, ignore: u64, multi: u32) -> PostedRecv {
        PostedRecv {
            ctx: buf.as_ptr() as usize,
            iovs: Iovs::one(buf.as_mut_ptr() as usize, buf.len()),
            src,
            tag,
            ignore,
            multi,
            moff: 0,
            cqe: true,
        }
    }

    fn unexp(peer: usize, tag: u64, data: &[u8]) -> Unexp {
        Unexp {
            id: 0,
            peer,
            tag,
            data: 0,
            hflags: 0,
            len: data.len(),
            body: UnexpBody::Data { v: data.to_vec(), received: data.len(), msg_id: 0 },
        }
    }

    #[test]
    fn ignore_mask_and_directed_receive() {
        let mut b = [0u8; 8];
        let r = recv(&mut b, None, 0xab00, 0x00ff, 0);
        assert!(r.accepts(true, 3, 0xab42));
        assert!(r.accepts(true, 3, 0xab00));
        assert!(!r.accepts(true, 3, 0xac00));
        // Untagged matching ignores tags.
        assert!(r.accepts(false, 3, 0xffff));
        let d = recv(&mut b, Some(2), 7, 0, 0);
        assert!(d.accepts(true, 2, 7));
        assert!(!d.accepts(true, 1, 7));
        assert!(!d.accepts(true, 2, 8));
    }

    #[test]
    fn first_accepting_receive_is_taken_in_posting_order() {
        let (mut a, mut b, mut c) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        let mut m = Matching::new();
        m.post(true, recv(&mut a, Some(1), 5, 0, 0), 16).unwrap();
        m.post(true, recv(&mut b, None, 5, 0, 0), 16).unwrap();
        m.post(true, recv(&mut c, None, 5, 0, 0), 16).unwrap();
        // From peer 0: the directed one is skipped.
        let d = m.take_match(true, 0, 5, 4).unwrap();
        assert_eq!(d.ctx, b.as_ptr() as usize);
        let d = m.take_match(true, 1, 5, 4).unwrap();
        assert_eq!(d.ctx, a.as_ptr() as usize);
        assert_eq!(m.posted_count(), 1);
        assert!(m.take_match(true, 0, 6, 4).is_none());
        assert!(m.take_match(false, 0, 5, 4).is_none(), "tagged receives never match untagged");
    }

    #[test]
    fn posted_queue_is_bounded() {
        let mut b = [0u8; 8];
        let mut m = Matching::new();
        m.post(false, recv(&mut b, None, 0, 0, 0), 1).unwrap();
        assert_eq!(m.post(false, recv(&mut b, None, 0, 0, 0), 1).unwrap_err(), Error::AGAIN);
    }

    #[test]
    fn multi_receive_carves_aligned_and_releases_below_minimum() {
        let mut b = [0u8; 256];
        let mut m = Matching::new();
        m.min_multi_recv = 64;
        let id = m.multi.open().unwrap();
        m.post(false, recv(&mut b, None, 0, 0, id), 4).unwrap();
        let base = b.as_ptr() as usize;
        let d1 = m.take_match(false, 0, 0, 10).unwrap();
        assert_eq!((d1.buf, d1.cap, d1.keys.multi, d1.multi_release), (base, 256, id, false));
        let d2 = m.take_match(false, 0, 0, 100).unwrap();
        assert_eq!((d2.buf, d2.cap, d2.multi_release), (base + 16, 240, false), "next message 8-byte aligned");
        // 256 - 120 = 136 left; taking 80 leaves 56 < 64: released.
        let d3 = m.take_match(false, 0, 0, 80).unwrap();
        assert_eq!((d3.buf, d3.multi_release), (base + 120, true));
        assert_eq!(m.posted_count(), 0);
        assert!(m.take_match(false, 0, 0, 1).is_none());
        // Reported in any order: the last report carries FI_MULTI_RECV.
        assert!(!m.multi.settle(id), "d3 released it, d1 and d2 are outstanding");
        assert!(!m.multi.settle(id));
        assert!(m.multi.settle(id), "the last piece reported");
        assert_eq!(m.multi.live(), 0, "the record is freed with its flag");
    }

    /// A buffer leaving unused (cancel, flush) with pieces outstanding:
    /// its entry has no flag, the last piece's has; with none, its own
    /// has. An SRQ's piece given back: the releasing one posts the buffer
    /// again (unreleased), another one owes the flag when it was the last.
    #[test]
    fn multi_receive_release_unused_and_give_back() {
        let mut b = [0u8; 256];
        let mut m = Matching::new();
        let id = m.multi.open().unwrap();
        m.post(false, recv(&mut b, None, 0, 0, id), 4).unwrap();
        let d1 = m.take_match(false, 0, 0, 8).unwrap();
        let (_, c) = m.cancel(b.as_ptr() as usize).unwrap();
        assert!(!c.multi_release && c.keys.multi == 0, "d1 is outstanding; the cancel settles nothing");
        assert!(m.multi.settle(d1.keys.multi), "d1 is the last report");
        let id = m.multi.open().unwrap();
        m.post(false, recv(&mut b, None, 0, 0, id), 4).unwrap();
        let (_, c) = m.cancel(b.as_ptr() as usize).unwrap();
        assert!(c.multi_release, "nothing outstanding: the cancel's entry releases it");
        assert_eq!(m.multi.live(), 0);

        let mut q = MultiRecs::new(true);
        let id = q.open().unwrap();
        assert_ne!(id & MultiRecs::SRQ, 0);
        q.carve(id, false);
        q.carve(id, true);
        assert!(!q.give_back(id, true), "the releasing piece back: the buffer is posted again");
        assert!(!q.give_back(id, false), "not released any more");
        q.carve(id, false);
        q.carve(id, true);
        assert!(!q.settle(id), "the releasing piece reported, one outstanding");
        assert!(q.give_back(id, false), "the last piece given back owes the flag");
        assert_eq!(q.live(), 0);
    }

    /// A record's slot is reused under a new generation: the id of the
    /// freed record names nothing, so a stale id cannot act on (or free)
    /// the record of the buffer that reuses its slot.
    #[test]
    fn multi_receive_stale_id_is_refused() {
        for srq in [false, true] {
            let mut q = MultiRecs::new(srq);
            let old = q.open().unwrap();
            q.close(old);
            let new = q.open().unwrap();
            assert_eq!(new & MultiRecs::INDEX_MASK, old & MultiRecs::INDEX_MASK, "the slot is reused");
            assert_ne!(new, old, "under a new generation");
            assert_eq!((new & MultiRecs::SRQ != 0, new != 0), (srq, true));
            assert!(q.rec(old).is_none(), "the stale id names no record");
            assert!(q.rec(new).is_some());
            q.close(old);
            assert_eq!(q.live(), 1, "a stale close frees nothing");
            q.carve(new, true);
            assert!(q.settle(new), "the new buffer's record is intact");
            assert!(q.rec(new).is_none() && q.rec(old).is_none());
        }
        // The generation wraps within its bits, never touching SRQ.
        let mut q = MultiRecs::new(false);
        for _ in 0..3 * (MultiRecs::GEN_MASK + 1) {
            let id = q.open().unwrap();
            assert_eq!(id & (MultiRecs::SRQ | !((MultiRecs::GEN_MASK << MultiRecs::INDEX_BITS) | 1)), 0);
            q.close(id);
        }
    }

    /// The index space is bounded: past it, a post is refused, not wrapped.
    #[test]
    fn multi_receive_records_are_bounded() {
        let mut q = MultiRecs::new(true);
        for _ in 0..MultiRecs::INDEX_MASK {
            q.open().unwrap();
        }
        assert_eq!(q.open().unwrap_err().kind(), crate::error::ErrorKind::Again, "full for now: progress frees");
        assert!(q.any_live());
        q.close(7);
        assert!(q.open().is_err(), "an endpoint's id names no SRQ record");
        q.close(MultiRecs::SRQ | 7);
        assert!(q.open().is_err(), "a stale id (generation 0) freed nothing");
        q.close(MultiRecs::SRQ | 1 << MultiRecs::INDEX_BITS | 7);
        let id = q.open().unwrap();
        assert_eq!(id, MultiRecs::SRQ | 2 << MultiRecs::INDEX_BITS | 7, "slot 6 again, generation 2");
    }

    #[test]
    fn unexpected_budget_counts_bytes_in_and_out() {
        let mut m = Matching::new();
        let cfg = Config { unexp_max: 10, rx_size: 100, ..Config::default() };
        let id = m.queue_unexp(true, unexp(0, 9, &[1; 6]));
        assert_eq!(m.unexp_bytes(), 6);
        assert!(!m.over_budget(&cfg, 4));
        assert!(m.over_budget(&cfg, 5));
        // A receive posted later takes it, and the bytes leave the budget.
        let mut b = [0u8; 8];
        m.post(true, recv(&mut b, None, 9, 0, 0), 4).unwrap();
        let (u, d) = m.take_unexp_for_last(true).unwrap();
        assert_eq!((u.id, d.cap), (id, 8));
        assert_eq!(m.unexp_bytes(), 0);
        assert_eq!(m.posted_count(), 0);
        // A still-arriving message grows chunk by chunk, in order only.
        let u = Unexp { body: UnexpBody::Data { v: Vec::new(), received: 0, msg_id: 3 }, len: 8, ..unexp(1, 0, &[]) };
        let id = m.queue_unexp(false, u);
        assert_eq!(m.append_unexp(id, 4, &[0; 4], 8), None, "out of order");
        assert_eq!(m.append_unexp(id, 0, &[0; 4], 8), Some(false));
        assert_eq!(m.append_unexp(id, 4, &[0; 4], 8), Some(true));
        assert_eq!(m.unexp_bytes(), 8);
        m.drop_unexp(id);
        assert_eq!((m.unexp_bytes(), m.unexp_count()), (0, 0));
        // The message count bounds it too.
        let cfg = Config { unexp_max: 1 << 20, rx_size: 1, ..Config::default() };
        for _ in 0..4 {
            m.queue_unexp(false, unexp(0, 0, &[]));
        }
        assert!(m.over_budget(&cfg, 0));
    }

    #[test]
    fn directed_receives_leave_with_their_peer() {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let mut m = Matching::new();
        m.post(true, recv(&mut a, Some(4), 0, 0, 0), 4).unwrap();
        m.post(false, recv(&mut b, None, 0, 0, 0), 4).unwrap();
        assert!(m.directed_at(4));
        let gone = m.take_directed(4);
        assert_eq!(gone.len(), 1);
        assert!(gone[0].0);
        assert_eq!(gone[0].1.ctx, a.as_ptr() as usize);
        assert!(!m.directed_at(4));
        assert_eq!(m.posted_count(), 1);
    }

    #[test]
    fn claimed_and_discarded_messages_are_out_of_reach() {
        let mut m = Matching::new();
        let a = m.queue_unexp(true, unexp(0, 5, &[1; 4]));
        let b = m.queue_unexp(true, unexp(0, 5, &[2; 4]));
        let mut buf = [0u8; 8];
        let probe = recv(&mut buf, None, 5, 0, 0);
        assert_eq!(m.find_free(true, &probe).unwrap().id, a);
        m.claim(a, 77);
        assert!(m.claims(77) && !m.claims(78));
        assert_eq!(m.find_free(true, &probe).unwrap().id, b, "a claimed message is invisible to peeks");
        // A receive posted now takes b, not the claimed a.
        m.post(true, recv(&mut buf, None, 5, 0, 0), 4).unwrap();
        assert_eq!(m.take_unexp_for_last(true).unwrap().0.id, b);
        m.post(true, recv(&mut buf, None, 5, 0, 0), 4).unwrap();
        assert!(m.take_unexp_for_last(true).is_none(), "nor to receives");
        m.pop_front(true);
        // The claim's receive takes it; the context is then free again.
        assert_eq!(m.unclaim(77), Some(a));
        assert_eq!(m.unclaim(77), None, "a claim is received once");
        assert_eq!(m.take(a).unwrap().id, a);
        assert_eq!((m.unexp_count(), m.unexp_bytes()), (0, 0));

        // A still-arriving message discarded: its bytes freed at once, its
        // later chunks counted and dropped, gone with the last one.
        let u = Unexp { body: UnexpBody::Data { v: Vec::new(), received: 0, msg_id: 3 }, len: 8, ..unexp(1, 5, &[]) };
        let id = m.queue_unexp(true, u);
        assert_eq!(m.append_unexp(id, 0, &[0; 4], 8), Some(false));
        assert_eq!(m.unexp_bytes(), 4);
        assert!(matches!(m.discard(id), Some(Discard::Arriving)));
        assert_eq!(m.unexp_bytes(), 0);
        assert!(m.find_free(true, &probe).is_none());
        assert_eq!(m.append_unexp(id, 4, &[0; 4], 8), Some(true));
        assert_eq!((m.unexp_count(), m.unexp_bytes()), (0, 0));

        // A claimed message whose sender fails stays, lost, for its claim.
        let id = m.queue_unexp(true, unexp(2, 5, &[3; 4]));
        m.claim(id, 9);
        m.drop_unexp(id);
        assert_eq!((m.unexp_count(), m.unexp_bytes()), (1, 0));
        let id2 = m.unclaim(9).unwrap();
        assert!(matches!(m.take(id2).unwrap().body, UnexpBody::Lost));
        // A claimed rendezvous too; an unclaimed one goes.
        let rts = |p| Unexp {
            body: UnexpBody::Rts { msg_id: 1, iovs: vec![], cma: true, fin: false },
            len: 1 << 20,
            ..unexp(p, 5, &[])
        };
        let c = m.queue_unexp(true, rts(4));
        m.queue_unexp(true, rts(4));
        m.claim(c, 10);
        m.drop_rts_from(4);
        assert_eq!(m.unexp_count(), 1);
        assert!(matches!(m.get(c).unwrap().body, UnexpBody::Lost));
    }

    #[test]
    fn front_plain_takes_only_the_simple_case() {
        let (mut a, mut b) = ([0u8; 8], [0u8; 64]);
        let mut m = Matching::new();
        m.post(true, recv(&mut a, None, 1, 0, 0), 4).unwrap();
        assert!(m.front_plain(true, 0, 1, 8).is_some());
        assert!(m.front_plain(true, 0, 1, 9).is_none(), "does not hold it whole");
        assert!(m.front_plain(true, 0, 2, 8).is_none(), "tag differs");
        m.pop_front(true);
        let id = m.multi.open().unwrap();
        m.post(false, recv(&mut b, None, 0, 0, id), 4).unwrap();
        assert!(m.front_plain(false, 0, 0, 8).is_none(), "multi-receive");
        m.pop_front(false);
        m.post(false, recv(&mut b, None, 0, 0, 0), 4).unwrap();
        m.post(true, recv(&mut a, None, 1, 0, 0), 4).unwrap();
        assert!(m.front_plain(false, 0, 0, 8).is_some() && m.front_plain(true, 0, 1, 8).is_some());
        m.set_source_err(true);
        assert!(m.front_plain(false, 0, 0, 8).is_none() && m.front_plain(true, 0, 1, 8).is_none(), "FI_SOURCE_ERR");
        m.set_source_err(false);
        m.bind_srq(0, [true, false]);
        assert!(m.front_plain(false, 0, 0, 8).is_none(), "SRQ endpoint");
        assert!(m.front_plain(true, 0, 1, 8).is_some(), "tagged receives stay the endpoint's");
        assert_eq!((m.srq_for(false), m.srq_for(true)), (Some(0), None));
        m.bind_srq(0, [true, true]);
        assert!(m.front_plain(true, 0, 1, 8).is_none(), "tagged receives from the SRQ too");
        m.set_source_err(true);
        m.set_source_err(false);
        assert!(m.front_plain(true, 0, 1, 8).is_none(), "FI_SOURCE_ERR off keeps the SRQ's");
    }

    /// A deferred work request's receive is never the fast path's (nor
    /// is any other while one is posted), and carries its reporting to its
    /// `Dest` (taken, or cancelled unused).
    #[test]
    fn deferred_receives_keep_their_reporting() {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let dw = Dw::new(Some(3), true);
        let deferred = |r: PostedRecv| PostedRecv { moff: dw.raw() as usize, ..r };
        let mut m = Matching::new();
        m.post_deferred(true, deferred(recv(&mut a, None, 1, 0, 0)), 4).unwrap();
        m.post(true, recv(&mut b, None, 1, 0, 0), 4).unwrap();
        assert!(m.front_plain(true, 0, 1, 8).is_none(), "a deferred receive is posted");
        let d = m.take_match(true, 0, 1, 8).unwrap();
        assert_eq!((d.buf, d.cap, d.dw), (a.as_ptr() as usize, 8, dw));
        assert_eq!(m.front_plain(true, 0, 1, 8).map(|x| x.1.ptr), Some(b.as_ptr() as usize), "none left");
        m.post_deferred(false, deferred(recv(&mut a, None, 0, 0, 0)), 4).unwrap();
        assert!(m.front_plain(true, 0, 1, 8).is_none());
        let (tagged, d) = m.cancel(a.as_ptr() as usize).unwrap();
        assert!(!tagged && d.dw == dw && d.buf == a.as_ptr() as usize && !d.multi_release);
        assert!(m.front_plain(true, 0, 1, 8).is_some(), "none left");
        m.set_source_err(true);
        m.post_deferred(false, deferred(recv(&mut a, None, 0, 0, 0)), 4).unwrap();
        assert_eq!(m.take_all_posted().len(), 2);
        m.set_source_err(false);
        m.post(true, recv(&mut b, None, 1, 0, 0), 4).unwrap();
        assert!(m.front_plain(true, 0, 1, 8).is_some(), "flushed: none left");
    }
}
