//! Fabric and domain: the objects everything else is opened from.
//!
//! A domain owns one shared region (header with the doorbell, a counter
//! table, and one section per endpoint) and all in-process state of its
//! objects behind one lock: one uncontended lock per call is the whole cost
//! of thread safety, and a progress pass sees every endpoint, CQ and counter
//! of the domain at once.

use crate::av::AvState;
use crate::cntr::CntrState;
use crate::cq::CqState;
use crate::ep::EpState;
use crate::error::{Error, ErrorKind, Result};
use crate::proto::Config;
use crate::region::{self, Region};
use crate::srq::SrqState;
use crate::sync::{DomainGuard, DomainLock, LockError, Threading};
use shm_layout::{ep_state, eps_offset, Address, EpGeometry, EpHeader, OvfCell, OvfCtl, PoolCtl, RingCtl, SlotEntry};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The fabric: configuration shared by its domains.
pub struct Fabric {
    cfg: Config,
}

impl Fabric {
    /// Opens the fabric with the configuration from the environment
    /// (`SHMFAB_*`, see [`crate::proto`]).
    pub fn open() -> Result<Fabric> {
        Ok(Fabric { cfg: Config::from_env() })
    }

    /// Opens the fabric with an explicit configuration.
    pub fn with_config(mut cfg: Config) -> Result<Fabric> {
        cfg.geometry.validate().map_err(|m| Error::with(ErrorKind::Inval, format!("bad geometry: {m}")))?;
        cfg.clamp();
        Ok(Fabric { cfg })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Opens a domain with the default threading model,
    /// [`Threading::Domain`] (or `SHMFAB_THREADING=safe`).
    pub fn domain(&self) -> Result<Domain> {
        let t = match std::env::var("SHMFAB_THREADING").as_deref() {
            Ok("safe") => Threading::Safe,
            _ => Threading::Domain,
        };
        self.domain_with(t)
    }

    /// Opens a domain: creates its shared region (removing this user's
    /// regions whose owners died first).
    pub fn domain_with(&self, threading: Threading) -> Result<Domain> {
        crate::doorbell::init();
        region::clean_dead(false);
        let job = region::job_hash(&region::job_id());
        let cfg = self.cfg.clone();
        let region = Region::create(job, &cfg.geometry, cfg.max_eps, cfg.max_counters)?;
        let token = region
            .name()
            .rsplit('.')
            .next()
            .and_then(|t| u64::from_str_radix(t, 16).ok())
            .ok_or_else(|| Error::with(ErrorKind::Other, "region name without token"))?;
        let n = cfg.max_eps as usize;
        let st = DomainState {
            eps: (0..n).map(|_| None).collect(),
            eps_end: 0,
            ep_gen: vec![0; n],
            cqs: Vec::new(),
            cntrs: Vec::new(),
            avs: Vec::new(),
            srqs: Vec::new(),
            regions: HashMap::new(),
        };
        Ok(Domain {
            inner: Arc::new(DomainInner {
                cfg,
                region,
                job,
                token,
                uid: region::uid(),
                st: DomainLock::new(st, threading),
                sleeps: Default::default(),
                bridge: std::sync::Mutex::new(None),
                progress_thread: std::sync::Mutex::new(None),
                threading,
            }),
        })
    }
}

/// Entries (and errors) held by the domain's CQs.
fn cq_entries(st: &DomainState) -> usize {
    st.cqs.iter().flatten().map(|c| c.entries.len() + c.errors.len()).sum()
}

/// A domain (see the module docs).
#[derive(Clone)]
pub struct Domain {
    pub(crate) inner: Arc<DomainInner>,
}

pub(crate) struct DomainInner {
    pub cfg: Config,
    pub region: Region,
    pub job: u32,
    pub token: u64,
    pub uid: u32,
    pub st: DomainLock<DomainState>,
    /// Times a `wait` really slept on the doorbell.
    pub sleeps: std::sync::atomic::AtomicU64,
    /// The FD wait objects' bridge thread, started by the first FD CQ.
    pub bridge: std::sync::Mutex<Option<crate::fdwait::Bridge>>,
    /// The auto-progress thread, if started: (stop flag, handle).
    pub progress_thread: std::sync::Mutex<Option<(Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<()>)>>,
    /// Threading model (the progress thread needs Safe).
    pub threading: Threading,
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // Stop the bridge while the doorbell it sleeps on is still mapped.
        if let Ok(mut b) = self.bridge.lock() {
            b.take();
        }
        // Stop the progress thread (it holds only a weak reference; if it
        // is the one dropping the domain, it is not joined).
        if let Ok(mut p) = self.progress_thread.lock() {
            if let Some((stop, h)) = p.take() {
                stop.store(true, std::sync::atomic::Ordering::Release);
                crate::doorbell::wake_all(&self.region.header().doorbell);
                if h.thread().id() != std::thread::current().id() {
                    let _ = h.join();
                }
            }
        }
    }
}

/// Everything in-process of a domain.
pub(crate) struct DomainState {
    /// Endpoints by section index.
    pub eps: Vec<Option<EpBox>>,
    /// One past the highest open endpoint's index (a progress pass looks
    /// no further).
    pub eps_end: usize,
    /// Generation of each section (bumped at each open).
    pub ep_gen: Vec<u32>,
    pub cqs: Vec<Option<CqState>>,
    pub cntrs: Vec<Option<CntrState>>,
    pub avs: Vec<Option<AvState>>,
    pub srqs: Vec<Option<SrqState>>,
    /// Peer regions mapped so far, by name (first contact maps them).
    pub regions: HashMap<String, Arc<Region>>,
}

impl DomainState {
    /// Puts `ep` in endpoint slot `idx` (None: the endpoint closed),
    /// keeping `eps_end`; returns what was there.
    pub fn set_ep(&mut self, idx: usize, ep: Option<EpBox>) -> Option<EpBox> {
        let old = std::mem::replace(&mut self.eps[idx], ep);
        self.eps_end = self.eps.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
        old
    }
}

/// An open endpoint's state, owned by its slot in [`DomainState::eps`]: a
/// heap allocation held by raw pointer rather than a `Box`, because the
/// endpoint's handle keeps a copy of the pointer (its calls then skip two
/// dependent loads, the slot vector and the box: 8 ns off an 8-byte half
/// round trip), and a `Box` asserts that it is the only way to the value.
pub(crate) struct EpBox(std::ptr::NonNull<EpState>);

impl EpBox {
    pub fn new(ep: EpState) -> Self {
        EpBox(std::ptr::NonNull::from(Box::leak(Box::new(ep))))
    }

    /// The state's address, for the endpoint's handle (see `with_ep!`).
    pub fn ptr(&self) -> std::ptr::NonNull<EpState> {
        self.0
    }
}

impl std::ops::Deref for EpBox {
    type Target = EpState;
    #[inline(always)]
    fn deref(&self) -> &EpState {
        // SAFETY: the allocation lives until drop; access is serialised by
        // the domain lock, under which `&self` is held.
        unsafe { self.0.as_ref() }
    }
}

impl std::ops::DerefMut for EpBox {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut EpState {
        // SAFETY: as in deref; `&mut self` (under the domain lock) excludes
        // any other reference made from this slot, and the handle's copy is
        // used only while its call holds the lock, never with this one.
        unsafe { self.0.as_mut() }
    }
}

impl Drop for EpBox {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::leak in `new` and is freed
        // once, here; the endpoint's handle is closed by then (its close
        // takes the state out of the slot and drops it).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

// SAFETY: EpBox owns its EpState as a Box would; EpState is Send.
unsafe impl Send for EpBox {}

/// What a progress pass needs besides the endpoint it works on.
pub(crate) struct Ctx<'a> {
    pub cfg: &'a Config,
    pub cqs: &'a mut [Option<CqState>],
    pub avs: &'a [Option<AvState>],
    pub srqs: &'a mut [Option<SrqState>],
    pub regions: &'a mut HashMap<String, Arc<Region>>,
    pub counters: &'a [shm_layout::Counter],
}

impl DomainInner {
    #[inline(always)]
    pub fn lock(&self) -> Result<DomainGuard<'_, DomainState>> {
        self.st.lock().map_err(|e| match e {
            LockError::OtherThread => Error::with(
                ErrorKind::Inval,
                "this domain was opened with Threading::Domain (FI_THREAD_DOMAIN) and is driven by another \
                 thread; open it with Threading::Safe to share it between threads",
            ),
            LockError::Reentrant => Error::with(ErrorKind::Inval, "domain called re-entrantly from inside a call"),
        })
    }

    pub fn region_fd(&self) -> &std::fs::File {
        self.region.file()
    }

    #[inline]
    pub fn counters(&self) -> &[shm_layout::Counter] {
        // Our own region: the count is the one we created it with (the
        // shared header is not re-read on this hot path).
        let n = self.cfg.max_counters;
        // SAFETY: the counter table lies inside our own region (region_size
        // counts it) and Counter holds only atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.region.base().add(shm_layout::COUNTERS_OFFSET) as *const shm_layout::Counter,
                n as usize,
            )
        }
    }

    /// Runs `f` with the endpoint `idx` and a progress context.
    #[inline(always)]
    pub fn with_ep<R>(
        &self,
        st: &mut DomainState,
        idx: usize,
        f: impl FnOnce(&mut EpState, &mut Ctx<'_>) -> Result<R>,
    ) -> Result<R> {
        let DomainState { eps, cqs, avs, srqs, regions, .. } = st;
        let ep = eps
            .get_mut(idx)
            .and_then(|e| e.as_deref_mut())
            .ok_or_else(|| Error::with(ErrorKind::Inval, "endpoint is closed"))?;
        let mut ctx = Ctx { cfg: &self.cfg, cqs, avs, srqs, regions, counters: self.counters() };
        f(ep, &mut ctx)
    }

    /// One progress pass over every enabled endpoint.
    #[inline(always)]
    pub fn progress(&self, st: &mut DomainState) {
        let counters = self.counters();
        let DomainState { eps, eps_end, cqs, avs, srqs, regions, .. } = st;
        for ep in eps[..*eps_end].iter_mut().flatten() {
            if !ep.enabled {
                continue;
            }
            // Made per endpoint: one context made before the loop (and a
            // helper shared with `with_ep` and `with_ep!`) measured 5-6 ns
            // slower per 8 B half round trip, with fewer instructions.
            let mut ctx = Ctx { cfg: &self.cfg, cqs, avs, srqs, regions, counters };
            crate::progress::progress_ep(ep, &mut ctx);
        }
    }

    /// Whether any enabled endpoint has inbound work waiting.
    fn has_inbound(&self, st: &DomainState) -> bool {
        st.eps.iter().flatten().any(|ep| ep.enabled && ep.inbound_ready())
    }
}

impl Domain {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Name of the domain's region under /dev/shm.
    pub fn region_name(&self) -> &str {
        self.inner.region.name()
    }

    /// Runs one progress pass (reading a CQ or counter does this too).
    pub fn progress(&self) -> Result<()> {
        let mut st = self.inner.lock()?;
        self.inner.progress(&mut st);
        Ok(())
    }

    /// Sleeps on the domain's doorbell until inbound work may be there or
    /// `timeout` passes; returns at once if work is already waiting. Wake-ups
    /// may be spurious: callers re-check. Work that is not a new inbound
    /// message (pool chunks freed, credit returned) does not ring the
    /// doorbell, so callers waiting for that should pass a short timeout.
    pub fn wait(&self, timeout: Duration) {
        self.sleep(timeout, || false);
    }

    /// Sleeps as [`Domain::wait`] until `done()` or `timeout` (None:
    /// forever). While sends wait for ring room or pool chunks (which do not
    /// ring the doorbell) it sleeps in 1 ms slices.
    pub(crate) fn wait_for(&self, timeout: Option<Duration>, done: impl Fn() -> bool) {
        // Sends waiting for room, or an overflow queue blocked by a claim
        // that may be dead: nothing will ring for those, so look again soon.
        let local = self
            .inner
            .lock()
            .map(|st| st.eps.iter().flatten().any(|e| !e.busy.is_empty() || e.ovf_stuck.is_some()))
            .unwrap_or(true);
        let cap = if local { Duration::from_millis(1) } else { Duration::from_secs(3600) };
        self.sleep(timeout.map_or(cap, |t| t.min(cap)), done);
    }

    fn sleep(&self, timeout: Duration, done: impl Fn() -> bool) {
        let db = &self.inner.region.header().doorbell;
        let found = crate::doorbell::wait(
            db,
            || {
                done()
                    || match self.inner.lock() {
                        Ok(st) => self.inner.has_inbound(&st),
                        Err(_) => true, // not ours to sleep on: return at once
                    }
            },
            Some(timeout),
        );
        if !found {
            self.inner.sleeps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Time passed: let the next progress pass check peers' lives.
            if let Ok(mut st) = self.inner.lock() {
                for ep in st.eps.iter_mut().flatten() {
                    ep.check_now = true;
                }
            }
        }
    }

    /// fi_trywait over CQs: `Ok` when nothing is there to read and the
    /// CQs' wait fds ([`CompletionQueue::wait_fd`]) will become readable
    /// when something arrives, so the caller may block in poll, select or
    /// epoll; `-FI_EAGAIN` when it should read the CQs first. Only CQs with
    /// [`WaitObj::Fd`](crate::WaitObj::Fd) may be given.
    pub fn trywait(&self, cqs: &[&crate::CompletionQueue]) -> Result<()> {
        self.trywait_with(cqs, &[], &[])
    }

    /// fi_trywait over CQs, counters and wait sets: `-FI_EAGAIN` if a CQ is
    /// not empty, a counter moved since the last trywait (its checkpoint),
    /// or a wait set has an event; else arms the domain's bridge as
    /// [`Domain::trywait`] does and returns `Ok`.
    pub fn trywait_with(
        &self,
        cqs: &[&crate::CompletionQueue],
        cntrs: &[&crate::Counter],
        sets: &[&crate::WaitSet],
    ) -> Result<()> {
        for set in sets {
            if set.has_event()? {
                return Err(Error::AGAIN);
            }
        }
        let mut moved = false;
        {
            let mut st = self.inner.lock()?;
            self.inner.progress(&mut st);
            for c in cntrs {
                if !Arc::ptr_eq(&c.dom, &self.inner) {
                    return Err(Error::with(ErrorKind::Inval, "counter of another domain"));
                }
                let shm = &self.inner.counters()[c.id];
                use std::sync::atomic::Ordering::Acquire;
                let now = (shm.value.v.load(Acquire), shm.err.v.load(Acquire));
                let cs = st.cntrs[c.id].as_mut().ok_or_else(|| Error::with(ErrorKind::Inval, "counter is closed"))?;
                if cs.checkpoint != now {
                    cs.checkpoint = now;
                    moved = true;
                }
            }
        }
        if moved {
            return Err(Error::AGAIN);
        }
        let mut st = self.inner.lock()?;
        for cq in cqs {
            if !Arc::ptr_eq(&cq.dom, &self.inner) {
                return Err(Error::with(ErrorKind::Inval, "CQ of another domain"));
            }
            let c = st.cqs[cq.id].as_ref().ok_or_else(|| Error::with(ErrorKind::Inval, "CQ is closed"))?;
            if !matches!(c.wait_obj, crate::WaitObj::Fd | crate::WaitObj::PollFd | crate::WaitObj::MutexCond) {
                return Err(Error::with(
                    ErrorKind::Inval,
                    "trywait takes CQs with an Fd, PollFd or MutexCond wait object",
                ));
            }
            if let Some(fd) = &c.fd {
                crate::fdwait::drain(fd);
            }
        }
        self.inner.progress(&mut st);
        let ready = |st: &DomainState| {
            cqs.iter().any(|cq| {
                st.cqs[cq.id].as_ref().is_some_and(|c| !c.entries.is_empty() || !c.errors.is_empty() || c.overrun)
            })
        };
        if ready(&st) {
            return Err(Error::AGAIN);
        }
        self.arm_bridge(&st)
    }

    /// The fd half of trywait for completion channels: no CQs to look at.
    pub(crate) fn trywait_fds(&self) -> Result<()> {
        let mut st = self.inner.lock()?;
        self.inner.progress(&mut st);
        self.arm_bridge(&st)
    }

    fn arm_bridge(&self, st: &DomainState) -> Result<()> {
        let db = &self.inner.region.header().doorbell;
        let bridge = self.inner.bridge.lock().unwrap_or_else(|p| p.into_inner());
        let bridge =
            bridge.as_ref().ok_or_else(|| Error::with(ErrorKind::Inval, "no FD wait object in this domain"))?;
        if bridge.is_armed() {
            return Ok(()); // an earlier trywait's announcement still stands
        }
        let seen = crate::doorbell::announce(db);
        if self.inner.has_inbound(st) {
            db.sleepers.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return Err(Error::AGAIN);
        }
        bridge.arm(seen);
        Ok(())
    }

    /// Starts auto progress: a thread of this domain that runs progress
    /// passes and sleeps on the doorbell when there is nothing to do, so
    /// transfers, blocking waits and completions move on while the
    /// application computes. Needs a [`Threading::Safe`] domain (the thread
    /// and the application share it). Stopped when the domain is dropped.
    pub fn start_progress_thread(&self) -> Result<()> {
        if self.inner.threading != Threading::Safe {
            return Err(Error::with(
                ErrorKind::Inval,
                "auto progress needs a domain opened with Threading::Safe (the thread shares it with the application)",
            ));
        }
        let mut slot = self.inner.progress_thread.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Ok(());
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let weak = Arc::downgrade(&self.inner);
        let st = stop.clone();
        let h = std::thread::Builder::new()
            .name("shmfab-progress".into())
            .spawn(move || {
                use std::sync::atomic::Ordering::Acquire;
                loop {
                    if st.load(Acquire) {
                        return;
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    let (busy, made) = match inner.lock() {
                        Ok(mut s) => {
                            let before = cq_entries(&s);
                            inner.progress(&mut s);
                            (s.eps.iter().flatten().any(|e| !e.busy.is_empty()), cq_entries(&s) > before)
                        }
                        Err(_) => (false, false),
                    };
                    if made && inner.region.header().doorbell.sleepers.load(Acquire) != 0 {
                        // Completions made here, with no doorbell rung by
                        // anyone (sends that waited for ring room, ...):
                        // ring our own, so an armed bridge makes the FD and
                        // condvar wait objects ready and sread wakes up.
                        crate::doorbell::wake_all(&inner.region.header().doorbell);
                    }
                    let db = &inner.region.header().doorbell as *const shm_layout::Doorbell as usize;
                    // Sleep without keeping the domain alive.
                    drop(inner);
                    if st.load(Acquire) {
                        return;
                    }
                    // SAFETY: the domain's Drop sets `st`, wakes this thread
                    // and joins it before its region (holding the doorbell)
                    // is unmapped; if this thread dropped the last reference,
                    // `st` was set and we returned above.
                    let db = unsafe { &*(db as *const shm_layout::Doorbell) };
                    let slice = if busy { Duration::from_millis(1) } else { Duration::from_millis(50) };
                    crate::doorbell::wait(db, || st.load(Acquire), Some(slice));
                }
            })
            .map_err(|e| Error::with(ErrorKind::NoMem, format!("cannot start the progress thread: {e}")))?;
        *slot = Some((stop, h));
        Ok(())
    }

    /// How many times [`Domain::wait`] really slept on the doorbell.
    pub fn sleeps(&self) -> u64 {
        self.inner.sleeps.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Pointers to the parts of one endpoint section of a region.
#[derive(Clone, Copy)]
pub(crate) struct Section {
    pub g: EpGeometry,
    pub hdr: *const EpHeader,
    pub slots: *const SlotEntry,
    pub ringctl: *const RingCtl,
    pub cells: *mut u8,
    pub ovfctl: *const OvfCtl,
    pub ovfcells: *mut OvfCell,
    pub poolctl: *const PoolCtl,
    pub pool_next: *const crate::sync::AtomicU32,
    pub chunks: *mut u8,
    /// Offset of the section in its region.
    pub offset: usize,
}

/// How a sender's ring slot claim went ([`Section::claim_ring`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Slot `s` is ours: its address written and its `claimed` bit set; we
    /// are its ring's only producer.
    Ring(u32),
    /// Every slot is taken: use the overflow queue ([`Section::use_overflow`]).
    Full,
}

// SAFETY: the pointers are into a region mapping that the holder of the
// Section keeps alive (the domain's own Region, or a peer's Arc<Region> in
// the Peer); every shared word behind them is an atomic or is copied with
// the protocol's ordering.
unsafe impl Send for Section {}

impl Section {
    /// The section of endpoint `ep` in `r`, whose size was validated against
    /// its geometry (create or attach).
    pub fn of(r: &Region, ep: u32) -> Result<Section> {
        let (g, n_eps, n_counters) = r.geometry();
        if ep >= n_eps {
            return Err(Error::with(
                ErrorKind::AddrNotAvail,
                format!("endpoint index {ep} out of range: region {} has {n_eps}", r.name()),
            ));
        }
        let off = eps_offset(n_counters) + ep as usize * g.section_size();
        Ok(Section {
            g,
            hdr: r.at(off)?,
            slots: r.at(off + g.slots_offset())?,
            ringctl: r.at(off + g.ringctl_offset())?,
            cells: r.at::<u8>(off + g.cells_offset())?,
            ovfctl: r.at(off + g.ovfctl_offset())?,
            ovfcells: r.at(off + g.ovf_cells_offset())?,
            poolctl: r.at(off + g.poolctl_offset())?,
            pool_next: r.at(off + g.pool_next_offset())?,
            chunks: r.at::<u8>(off + g.chunks_offset())?,
            offset: off,
        })
    }

    pub fn header(&self) -> &EpHeader {
        // SAFETY: inside a live mapping (the caller holds its Region).
        unsafe { &*self.hdr }
    }

    pub fn ring_cells(&self, slot: u32) -> *mut u8 {
        // SAFETY: slot < n_slots (callers check), so the ring lies in the section.
        unsafe { self.cells.add(slot as usize * self.g.ring_cells as usize * shm_layout::CACHE_LINE) }
    }

    pub fn ringctl_at(&self, slot: u32) -> *const RingCtl {
        // SAFETY: slot < n_slots.
        unsafe { self.ringctl.add(slot as usize) }
    }

    pub fn slot(&self, slot: u32) -> &SlotEntry {
        // SAFETY: slot < n_slots; SlotEntry is atomics and plain data.
        unsafe { &*self.slots.add(slot as usize) }
    }

    pub fn pool(&self) -> crate::pool::Pool {
        // SAFETY: the pointers cover the pool as the geometry says.
        unsafe {
            crate::pool::Pool::new(
                self.poolctl,
                self.pool_next,
                self.chunks,
                self.g.pool_chunks,
                self.g.chunk_size as usize,
            )
        }
    }

    pub fn ovf(&self) -> crate::ovf::Ovf {
        // SAFETY: as above.
        unsafe { crate::ovf::Ovf::new(self.ovfctl, self.ovfcells, self.g.ovf_cells as usize) }
    }

    /// Whether the endpoint is open at `generation`.
    pub fn open_at(&self, generation: u32) -> bool {
        use crate::sync::Ordering;
        let h = self.header();
        // SYNC: the acquire of `state` pairs with the release store of OPEN
        // in Section::open (generation, pool and queue are then visible) and
        // of CLOSED in Section::close. The generation's acquire pairs with
        // nothing (its store is relaxed, published by the OPEN store): a
        // state read from a later open makes this read return at least that
        // open's generation, so a reopened section never passes for the
        // generation before.
        h.state.load(Ordering::Acquire) == ep_state::OPEN && h.generation.load(Ordering::Acquire) == generation
    }

    /// Opens the section to peers at `generation` (the owner): initialises
    /// its pool and overflow queue, then publishes them with the state.
    ///
    /// # Safety
    /// The section must be closed, with zeroed memory (fresh or punched
    /// pages): no peer uses its pool or queue.
    pub unsafe fn open(&self, generation: u32) {
        use crate::sync::Ordering;
        // SAFETY: closed and zeroed per the contract.
        unsafe {
            self.pool().init();
            self.ovf().init();
        }
        let h = self.header();
        // Relaxed: published by the OPEN store below.
        h.generation.store(generation, Ordering::Relaxed);
        // SYNC: publishes the generation, pool and queue to the acquire
        // load of `state` in Section::open_at (a sender connecting).
        h.state.store(ep_state::OPEN, Ordering::Release);
    }

    /// The token a sender at `me` claims a ring slot with. Never 0 (a free
    /// slot).
    pub fn claim_token(me: Address) -> u64 {
        (me.token ^ ((me.ep_index as u64) << 48) ^ ((me.generation as u64) << 32)) | 1
    }

    /// A sender's claim of a free ring slot for `me`, with the `token` of
    /// [`Section::claim_token`]: a CAS on a slot's owner word; then `me`
    /// written in the slot and its `claimed` bit set, for the owner's
    /// progress pass to take the ring.
    pub fn claim_ring(&self, token: u64, me: Address) -> Claim {
        use crate::sync::Ordering;
        for s in 0..self.g.n_slots {
            let slot = self.slot(s);
            // SYNC: pairs with no release store (the owner word is only
            // zeroed by the punch of a closed section's pages); the release
            // half publishes nothing (the address is published by the
            // fetch_or below).
            if slot.owner.compare_exchange(0, token, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            // SAFETY: we own the slot now; addr is plain data in it.
            unsafe { std::ptr::addr_of!(slot.addr).cast_mut().write_volatile(me) };
            // SYNC: publishes the slot's addr to the acquire load of
            // `claimed` in progress_ep (then accept_claims reads it).
            self.header().claimed.fetch_or(1 << s, Ordering::Release);
            return Claim::Ring(s);
        }
        Claim::Full
    }

    /// A sender found every slot taken and uses the overflow queue: tells
    /// the owner's progress pass to look at it.
    pub fn use_overflow(&self) {
        use crate::sync::Ordering;
        // SYNC: the owner reads the flag relaxed (progress_ep): this release
        // pairs with nothing and is more than needed. The queue's entries
        // are published by their own sequence words (Ovf::push).
        self.header().ovf_used.store(1, Ordering::Release);
    }

    /// Closes the section to peers (the owner; its pages are punched after,
    /// which zeroes every slot's owner word: each sender's check before a
    /// push then fails).
    pub fn close(&self) {
        use crate::sync::Ordering;
        let h = self.header();
        // SYNC: pairs with the acquire of `state` in Section::open_at (a
        // peer's connect or life check); nothing written before it needs
        // publishing (a peer that reads CLOSED only stops), so the release
        // is more than needed. The senders' checks before each push
        // (Peer::chan_valid) read the owner word or state relaxed.
        h.state.store(ep_state::CLOSED, Ordering::Release);
        // Relaxed: only the owner reads `claimed`; a reopen starts from none.
        h.claimed.store(0, Ordering::Relaxed);
    }
}
