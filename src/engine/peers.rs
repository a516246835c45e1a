//! Peers: the table of every endpoint this endpoint talks to, the fi_addr
//! cache in front of it, first contact (mapping the peer's region and
//! claiming a ring), and liveness (why a peer can no longer answer).
//!
//! Invariants:
//! - A peer's index never changes: peers are only appended, so an index
//!   held anywhere (a posted directed receive, a ring, an unexpected
//!   message) stays valid for the endpoint's life.
//! - `by_addr` maps every peer's address to its index, and nothing else.
//! - `by_fi[f]` is one more than the peer of fi_addr `f` in the bound AV,
//!   or 0 when not cached (a test against zero, and the one subtracted
//!   folds into the peer's address: one instruction fewer than `u32::MAX`
//!   for none); an fi_addr's address changes only by removal, and
//!   the AV clears this cache on every removal ([`Peers::clear_fi_cache`]).
//! - `chan`, `pool`, `doorbell`, `claim` and `region` are set together by
//!   [`Peers::connect`]; the pointers point into `region`, which the peer
//!   keeps mapped.

use super::complete::PeerRx;
use super::tx::PeerTx;
use crate::av::AvState;
use crate::domain::{Claim, Section};
use crate::error::{Error, ErrorKind, Result};
use crate::flags::*;
use crate::ovf::Ovf;
use crate::pool::Pool;
use crate::region::Region;
use crate::ring::RingTx;
use crate::sync::Ordering;
use shm_layout::{ep_state, Address, Doorbell};
use std::collections::HashMap;
use std::sync::Arc;

/// How we send to a peer.
/// Its tag explicit (`repr(u8)`): the send's fast path tests one byte for
/// the ring, where a niche in `RingTx` took a 64-bit constant and a compare.
#[repr(u8)]
pub(crate) enum Chan {
    Ring(RingTx),
    Ovf(Ovf),
}

/// Where a sender checks, before each push, that the channel it writes is
/// still its own: the ring slot's owner word (a line written only when a
/// slot is claimed or released, so the check is an L1 hit), or for the
/// overflow queue the section's generation and state. A closed endpoint's
/// section is zeroed and may be reopened for someone else: a sender that
/// kept writing would corrupt the new endpoint's rings.
struct ChanClaim {
    owner: *const crate::sync::AtomicU64,
    token: u64,
    hdr: *const shm_layout::EpHeader,
    generation: u32,
}

impl ChanClaim {
    const NONE: ChanClaim = ChanClaim { owner: std::ptr::null(), token: 0, hdr: std::ptr::null(), generation: 0 };
}

/// Everything an endpoint knows about one peer endpoint, both directions:
/// the link (this module's), and the transmit and receive state the other
/// parts own ([`PeerTx`], [`PeerRx`]), kept in one record so that a send
/// or a receive finds all of it behind one index.
pub(crate) struct Peer {
    pub addr: Address,
    /// The peer's region, mapped on first send to it.
    region: Option<Arc<Region>>,
    pub pid: i32,
    pub chan: Option<Chan>,
    /// The peer's pool (we fill its chunks).
    pub pool: Option<Pool>,
    doorbell: *const Doorbell,
    /// The kernel refused CMA with this peer: do not offer it again.
    pub cma_refused: bool,
    /// A single copy from this peer has worked: the split copy may be used.
    pub cma_worked: bool,
    /// Single copy or the pool for its rendezvous messages in the band
    /// where either may win ([`crate::proto::pick_class`]), as measured.
    pub pick: [crate::proto::PathPick; crate::proto::PICK_CLASSES],
    /// The same for its streams' rendezvous messages, measured by their
    /// rate (boxed: touched only by messages of the band).
    pub stream_pick: Box<crate::proto::StreamPick>,
    /// (AV generation, fi_addr) of this peer as a source.
    src_cache: (u64, FiAddr),
    /// Sent us something we could not parse: its ring is no longer read.
    pub broken: bool,
    /// Sent us a message since our last push to it by the inline fast
    /// path (which then tells the ring: [`RingTx::heard_back`]).
    pub heard: bool,
    /// Why the peer is gone (its process died or its endpoint closed):
    /// everything pending with it has failed, new sends fail at once. A
    /// box, whose None is a null pointer: the send's fast path tests it
    /// against zero (a `String`'s None is a capacity of 2^63, a constant
    /// the send path then kept in a register).
    pub gone: Option<Box<str>>,
    /// What says our channel to it is still ours (see [`Peer::chan_valid`]).
    claim: ChanClaim,
    /// Our transmits to it (the transmit engine's).
    pub tx: PeerTx,
    /// Our receives from it in progress (completion's).
    pub rx: PeerRx,
}

// SAFETY: doorbell and the claim pointers point into `region`, which the
// Peer keeps alive.
unsafe impl Send for Peer {}

impl Peer {
    fn new(addr: Address) -> Peer {
        Peer {
            addr,
            region: None,
            pid: 0,
            chan: None,
            pool: None,
            doorbell: std::ptr::null(),
            cma_refused: false,
            cma_worked: false,
            pick: Default::default(),
            stream_pick: Default::default(),
            src_cache: (u64::MAX, FI_ADDR_NOTAVAIL),
            broken: false,
            heard: false,
            gone: None,
            claim: ChanClaim::NONE,
            tx: PeerTx::new(),
            rx: PeerRx::new(),
        }
    }

    #[inline(always)]
    pub fn doorbell(&self) -> Option<&Doorbell> {
        // SAFETY: set from our Arc<Region>, alive as long as self.
        unsafe { self.doorbell.as_ref() }
    }

    /// Whether we mapped its region (sent to it, or looked at it).
    pub fn connected(&self) -> bool {
        self.chan.is_some()
    }

    /// Whether our channel to the peer is still ours: our ring slot still
    /// holds our token, or (overflow queue) the section is still open at
    /// the generation we connected to. True before the first connect.
    #[inline]
    pub fn chan_valid(&self) -> bool {
        let c = &self.claim;
        // SAFETY: the pointers are into the peer's region, which `region`
        // keeps mapped; they are set together with it in connect().
        unsafe {
            if !c.owner.is_null() {
                (*c.owner).load(Ordering::Relaxed) == c.token
            } else if let Some(h) = c.hdr.as_ref() {
                h.generation.load(Ordering::Relaxed) == c.generation
                    && h.state.load(Ordering::Relaxed) == ep_state::OPEN
            } else {
                true
            }
        }
    }
}

/// The peer table (see the module docs for its invariants).
pub(crate) struct Peers {
    list: Vec<Peer>,
    by_addr: HashMap<Address, usize>,
    /// fi_addr -> peer index + 1 (0: unknown).
    by_fi: Vec<u32>,
    /// The bound address vector.
    av: Option<usize>,
    /// Inline messages from this many bytes go piped on the rings we
    /// claim (`Config::pipe_min`; 0: none).
    pipe_min: usize,
    /// Answers from this cell of the rings we claim on take the rest of
    /// the lap when the ring is empty (`Config::ring_lap`; 0: none).
    ring_lap: usize,
}

impl std::ops::Index<usize> for Peers {
    type Output = Peer;
    #[inline(always)]
    fn index(&self, p: usize) -> &Peer {
        &self.list[p]
    }
}

impl std::ops::IndexMut<usize> for Peers {
    #[inline(always)]
    fn index_mut(&mut self, p: usize) -> &mut Peer {
        &mut self.list[p]
    }
}

impl Peers {
    /// No peers yet; inline messages from `pipe_min` bytes go piped on
    /// the rings claimed later (0: none), and answers from cell
    /// `ring_lap` of them on take the rest of the lap (0: none).
    pub fn new(pipe_min: usize, ring_lap: usize) -> Peers {
        Peers { list: Vec::new(), by_addr: HashMap::new(), by_fi: Vec::new(), av: None, pipe_min, ring_lap }
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Peer> {
        self.list.iter()
    }

    /// Peer `p`, with no bounds check (the hot paths': a ring's peer, the
    /// fi_addr cache's).
    ///
    /// # Safety
    /// `p` is an index this table gave ([`Peers::index_of`], the fi_addr
    /// cache, or one held since): peers are only appended, so it is below
    /// the table's length (the first invariant above).
    #[inline(always)]
    pub unsafe fn get_unchecked_mut(&mut self, p: usize) -> &mut Peer {
        debug_assert!(p < self.list.len());
        // SAFETY: the caller's contract.
        unsafe { self.list.get_unchecked_mut(p) }
    }

    /// The bound address vector.
    #[inline(always)]
    pub fn av(&self) -> Option<usize> {
        self.av
    }

    /// Binds the address vector (its fi_addrs start uncached).
    pub fn bind_av(&mut self, av: usize) {
        self.av = Some(av);
        self.by_fi.clear();
    }

    /// Forgets every fi_addr (the AV removed one).
    pub fn clear_fi_cache(&mut self) {
        self.by_fi.clear();
    }

    /// The index of the peer at `addr`, appended if new.
    pub fn index_of(&mut self, addr: Address) -> usize {
        if let Some(&i) = self.by_addr.get(&addr) {
            return i;
        }
        self.list.push(Peer::new(addr));
        let i = self.list.len() - 1;
        self.by_addr.insert(addr, i);
        i
    }

    /// The peer behind `fi_addr` (through the cache), not necessarily
    /// connected.
    #[inline(always)]
    pub fn of(&mut self, avs: &crate::table::Slots<AvState>, fi_addr: FiAddr) -> Result<usize> {
        self.of_with(|| avs, fi_addr)
    }

    /// The peer the fi_addr cache knows `fi_addr` as, if it does (cleared
    /// by the AV on every removal; filled by [`Peers::of`]).
    #[inline(always)]
    pub fn cached(&self, fi_addr: FiAddr) -> Option<usize> {
        match self.by_fi.get(fi_addr as usize) {
            Some(&c) if c != 0 => Some(c as usize - 1),
            _ => None,
        }
    }

    /// [`Peers::of`], with the AVs asked for only when the cache does not
    /// know `fi_addr` (the fast paths then do not load them).
    #[inline(always)]
    pub fn of_with<'a>(
        &mut self,
        avs: impl FnOnce() -> &'a crate::table::Slots<AvState>,
        fi_addr: FiAddr,
    ) -> Result<usize> {
        let cached = self.by_fi.get(fi_addr as usize).copied().unwrap_or(0);
        if cached != 0 {
            return Ok(cached as usize - 1);
        }
        self.of_slow(avs(), fi_addr)
    }

    /// [`Peers::of`] when the cache does not know `fi_addr`.
    #[cold]
    #[inline(never)]
    fn of_slow(&mut self, avs: &crate::table::Slots<AvState>, fi_addr: FiAddr) -> Result<usize> {
        let av_id = self.av.ok_or_else(|| Error::with(ErrorKind::Inval, "no address vector bound to the endpoint"))?;
        let av: &AvState = avs.get(av_id).expect("bound AV exists");
        let a = av.lookup(fi_addr).ok_or_else(|| {
            Error::with(ErrorKind::AddrNotAvail, format!("fi_addr {fi_addr} is not in the address vector"))
        })?;
        let p = self.index_of(a);
        let i = fi_addr as usize;
        if let (true, Ok(v)) = (i < (1 << 24), u32::try_from(p + 1)) {
            if self.by_fi.len() <= i {
                self.by_fi.resize(i + 1, 0);
            }
            self.by_fi[i] = v;
        }
        Ok(p)
    }

    /// Source fi_addr of a peer as the bound AV knows it (cached per peer
    /// for the AV's generation; inlined: every receive completion asks).
    #[inline(always)]
    pub fn src_addr(&mut self, avs: &crate::table::Slots<AvState>, p: usize) -> FiAddr {
        let Some(av) = self.av.and_then(|a| avs.get(a)) else {
            return FI_ADDR_NOTAVAIL;
        };
        let peer = &mut self.list[p];
        if peer.src_cache.0 != av.generation {
            peer.src_cache = (av.generation, av.by_addr.get(&peer.addr).copied().unwrap_or(FI_ADDR_NOTAVAIL));
        }
        peer.src_cache.1
    }

    /// First contact: map the peer's region, check its endpoint, claim a
    /// ring slot (or fall back to the overflow queue). `me` is our address.
    pub fn connect(&mut self, me: Address, regions: &mut crate::region::RegionMap, p: usize) -> Result<()> {
        #[cfg(all(test, not(loom)))]
        if let Some(k) = CONNECT_FAILS.with(|f| f.get()) {
            return Err(Error::with(k, "connect failure injected by a test"));
        }
        let addr = self.list[p].addr;
        let id = crate::region::RegionId::of(&addr);
        let region = match regions.get(&id) {
            Some(r) => r.clone(),
            None => {
                let r = Arc::new(Region::attach(&id)?);
                regions.insert(id, r.clone());
                r
            }
        };
        if region.owner().0 != addr.pid {
            return Err(Error::with(
                ErrorKind::AddrNotAvail,
                format!(
                    "endpoint {}: its region's owner is pid {}, not the address's",
                    crate::av::AddressVector::straddr(&addr),
                    region.owner().0
                ),
            ));
        }
        let sec = Section::of(&region, addr.ep_index)?;
        if !sec.open_at(addr.generation) {
            return Err(Error::with(
                ErrorKind::AddrNotAvail,
                format!("endpoint {} is closed", crate::av::AddressVector::straddr(&addr)),
            ));
        }
        let token = Section::claim_token(me, addr.generation);
        let mut claim = ChanClaim { owner: std::ptr::null(), token, hdr: sec.header(), generation: addr.generation };
        let chan = match sec.claim_ring(addr.generation, token, me) {
            Claim::Ring(s) => {
                claim.owner = &sec.slot(s).owner;
                // SAFETY: the ring belongs to the mapped section we hold
                // (region kept in Peer); we are its only producer (claimed).
                Chan::Ring(
                    unsafe { RingTx::new(sec.ringctl_at(s), sec.ring_cells(s), sec.g.ring_cells as usize) }
                        .piped_from(self.pipe_min)
                        .lap_from(self.ring_lap),
                )
            }
            Claim::Full => {
                sec.use_overflow();
                Chan::Ovf(sec.ovf())
            }
            Claim::Closed => {
                return Err(Error::with(
                    ErrorKind::AddrNotAvail,
                    format!("endpoint {} is closed", crate::av::AddressVector::straddr(&addr)),
                ))
            }
        };
        let peer = &mut self.list[p];
        peer.pid = region.owner().0 as i32;
        // Another PID namespace (named regions): its pid is not one of ours,
        // so no single copy with it (the pool instead).
        peer.cma_refused |= region.foreign_pids();
        peer.pool = Some(sec.pool());
        peer.doorbell = &region.header().doorbell as *const Doorbell;
        peer.chan = Some(chan);
        peer.claim = claim;
        peer.region = Some(region);
        Ok(())
    }

    /// The peer behind `fi_addr`, connected.
    #[inline(always)]
    pub fn connected_of(
        &mut self,
        me: Address,
        avs: &crate::table::Slots<AvState>,
        regions: &mut crate::region::RegionMap,
        fi_addr: FiAddr,
    ) -> Result<usize> {
        let p = self.of(avs, fi_addr)?;
        if self.list[p].chan.is_none() {
            self.connect(me, regions, p)?;
        }
        Ok(p)
    }

    /// Why peer `p` can no longer answer, if it cannot: its process died
    /// (it no longer holds its region's lock), its region is closing, or its endpoint closed.
    pub fn gone_reason(&mut self, me: Address, regions: &mut crate::region::RegionMap, p: usize) -> Option<String> {
        let addr = self.list[p].addr;
        let who = crate::av::AddressVector::straddr(&addr);
        if self.list[p].region.is_none() {
            // Never mapped (we only received from it): map it now to look.
            if let Err(e) = self.connect(me, regions, p) {
                return match e.kind() {
                    // Its region or endpoint no longer exists: unlinked by
                    // its owner, or by the next start after its owner died.
                    ErrorKind::AddrNotAvail => {
                        Some(format!("peer {who} is gone (its process died or closed its domain or endpoint): {e}"))
                    }
                    // A limit of ours (descriptors: EMFILE and ENFILE come
                    // as Other; memory), or an interrupted call: no word on
                    // the peer, which may well be alive and mid-message.
                    // The next check looks again (a dead peer's region is
                    // missing or maps: a definite answer either way).
                    ErrorKind::Other | ErrorKind::NoMem | ErrorKind::Again | ErrorKind::Intr | ErrorKind::Busy => None,
                    _ => Some(format!("peer {who} cannot be reached: {e}")),
                };
            }
        }
        let region = self.list[p].region.as_ref()?;
        let pid = region.owner().0;
        if !region.alive() {
            return Some(format!("peer {who} (pid {pid}) died"));
        }
        if region.header().state.load(Ordering::Acquire) != shm_layout::state::READY {
            return Some(format!("peer {who} (pid {pid}) closed its domain"));
        }
        match Section::of(region, addr.ep_index) {
            Ok(sec) if sec.open_at(addr.generation) => None,
            _ => Some(format!("peer {who} (pid {pid}) closed its endpoint")),
        }
    }
}

#[cfg(all(test, not(loom)))]
thread_local! {
    /// Tests: [`Peers::connect`] on this thread fails with this kind.
    pub(crate) static CONNECT_FAILS: std::cell::Cell<Option<ErrorKind>> = const { std::cell::Cell::new(None) };
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::table::Table;

    fn addr(token: u32) -> Address {
        Address { pid: 1, job: 2, token, fd: 3, ep_index: 0, generation: 1 }
    }

    fn av_of(addrs: &[Address]) -> (Table<AvState>, usize) {
        let mut t = Table::new();
        let av = AvState {
            entries: addrs.iter().map(|a| Some(*a)).collect(),
            by_addr: addrs.iter().enumerate().map(|(i, a)| (*a, i as FiAddr)).collect(),
            generation: 0,
        };
        let id = t.insert(av);
        (t, id)
    }

    #[test]
    fn indices_are_stable_and_addresses_unique() {
        let mut p = Peers::new(0, 0);
        let a = p.index_of(addr(10));
        let b = p.index_of(addr(11));
        assert_eq!((a, b), (0, 1));
        assert_eq!(p.index_of(addr(10)), a, "a known address keeps its index");
        assert_eq!(p.len(), 2);
        assert_eq!(p[b].addr, addr(11));
        assert!(!p[a].connected());
        assert!(p[a].chan_valid(), "no claim to lose before the first connect");
    }

    #[test]
    fn fi_addr_cache_follows_the_av_and_is_cleared_on_removal() {
        let (mut avs, id) = av_of(&[addr(10), addr(11)]);
        let mut p = Peers::new(0, 0);
        assert_eq!(p.of(&avs, 0).unwrap_err().kind(), ErrorKind::Inval, "no AV bound");
        p.bind_av(id);
        assert_eq!(p.of(&avs, 1).unwrap(), 0, "first peer met gets index 0");
        assert_eq!(p.of(&avs, 0).unwrap(), 1);
        assert_eq!(p.of(&avs, 7).unwrap_err().kind(), ErrorKind::AddrNotAvail);
        // The AV moves fi_addr 1 to another address: after the removal
        // clears the cache, the new address is found.
        let av = avs.get_mut(id).unwrap();
        av.entries[1] = Some(addr(12));
        av.by_addr.insert(addr(12), 1);
        av.generation += 1;
        assert_eq!(p.of(&avs, 1).unwrap(), 0, "stale until cleared, as the AV clears it on every removal");
        p.clear_fi_cache();
        assert_eq!(p.of(&avs, 1).unwrap(), 2);
        // Source addresses come from the AV, cached per generation.
        assert_eq!(p.src_addr(&avs, 2), 1);
        assert_eq!(p.src_addr(&avs, 1), 0);
    }
}
