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
use crate::engine::EpState;
use crate::error::{Error, ErrorKind, Result};
use crate::proto::Config;
use crate::region::{self, Region};
use crate::srq::SrqState;
use crate::sync::{DomainGuard, DomainLock, LockError, Threading};
use crate::table::{Slots, Table};
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
    /// (`SHMFAB_*`, see [`crate::proto`]). A variable set to an invalid
    /// value is `Inval`, with one line naming it and its valid range.
    pub fn open() -> Result<Fabric> {
        Ok(Fabric { cfg: Config::from_env()? })
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
    /// regions whose owners died first). [`Threading::Serialized`] is
    /// refused here (`-FI_EINVAL`): it needs [`Fabric::domain_serialized`].
    pub fn domain_with(&self, threading: Threading) -> Result<Domain> {
        if threading == Threading::Serialized {
            return Err(Error::with(
                ErrorKind::Inval,
                "Threading::Serialized is opened by the unsafe Fabric::domain_serialized, whose caller \
                 serialises every call",
            ));
        }
        self.open_domain(threading)
    }

    /// Opens a domain in [`Threading::Serialized`] mode (FI_THREAD_DOMAIN
    /// as libfabric defines it): calls may come from any thread, with no
    /// lock and no owner check; a re-entrant call is refused.
    ///
    /// # Safety
    /// The caller must serialise every call to the domain and to every
    /// object opened from it (endpoints, CQs, counters, AVs, SRQs, wait and
    /// poll sets): no two may run at once, and each must happen after the
    /// previous one returned (as a mutex or a thread join orders them).
    /// The domain's auto-progress thread is refused in this mode, as in
    /// [`Threading::Domain`].
    pub unsafe fn domain_serialized(&self) -> Result<Domain> {
        self.open_domain(Threading::Serialized)
    }

    fn open_domain(&self, threading: Threading) -> Result<Domain> {
        crate::doorbell::init();
        region::clean_dead(false);
        let job = region::job_hash(&region::job_id());
        let cfg = self.cfg.clone();
        let region = Region::create(job, &cfg.geometry, cfg.max_eps, cfg.max_counters, cfg.regions)?;
        let n = cfg.max_eps as usize;
        let st = DomainState {
            eps: EpSlots::new(n),
            ep_gen: vec![0; n],
            cqs: Table::new(),
            cntrs: Table::new(),
            avs: Table::new(),
            srqs: Table::new(),
            regions: HashMap::new(),
            trig: Default::default(),
            rm: false,
        };
        Ok(Domain {
            inner: Arc::new(DomainInner {
                cfg,
                region,
                st: DomainLock::new(st, threading),
                sleeps: Default::default(),
                bridge: std::sync::Mutex::new(None),
                progress_thread: std::sync::Mutex::new(None),
                threading,
                rma: Default::default(),
                trig: Default::default(),
            }),
        })
    }
}

/// Entries (and errors) held by the domain's CQs.
fn cq_entries(st: &DomainState) -> usize {
    st.cqs.iter().map(|(_, c)| c.entries.len() + c.errors.len()).sum()
}

/// A digest of the open counters' values and errors: it changes when a
/// pass counts something.
fn counters_digest(st: &DomainState, counters: &[shm_layout::Counter]) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    st.cntrs.iter().fold(0u64, |h, (id, _)| {
        let c = &counters[id];
        (h.rotate_left(7) ^ c.value.v.load(Relaxed)).rotate_left(13) ^ c.err.v.load(Relaxed)
    })
}

/// A domain (see the module docs).
#[derive(Clone)]
pub struct Domain {
    pub(crate) inner: Arc<DomainInner>,
}

pub(crate) struct DomainInner {
    pub cfg: Config,
    pub region: Region,
    pub st: DomainLock<DomainState>,
    /// Times a `wait` really slept on the doorbell.
    pub sleeps: std::sync::atomic::AtomicU64,
    /// The FD wait objects' bridge thread, started by the first FD CQ.
    pub bridge: std::sync::Mutex<Option<crate::fdwait::Bridge>>,
    /// The auto-progress thread, if started: (stop flag, handle).
    pub progress_thread: std::sync::Mutex<Option<(Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<()>)>>,
    /// Threading model (the progress thread needs Safe).
    pub threading: Threading,
    /// Memory registrations, the shared heap, the mailbox (`crate::mr`).
    pub rma: crate::mr::RmaDomain,
    /// Whether triggered or deferred work waits (`crate::trigger`).
    pub trig: crate::trigger::TrigFlag,
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
    /// Endpoints by section index (their invariant is [`EpSlots`]' own).
    pub eps: EpSlots,
    /// Generation of each section (bumped at each open).
    pub ep_gen: Vec<u32>,
    /// The domain's objects by id, each with its bindings (see
    /// [`crate::table`]): endpoints and poll/wait sets bind them.
    pub cqs: Table<CqState>,
    pub cntrs: Table<CntrState>,
    pub avs: Table<AvState>,
    pub srqs: Table<SrqState>,
    /// Peer regions mapped so far, by name (first contact maps them).
    pub regions: region::RegionMap,
    /// Triggered operations and deferred work waiting on counters.
    pub trig: crate::trigger::Triggers,
    /// Resource management (see [`Domain::set_resource_mgmt`]): given to
    /// each CQ at its open.
    pub rm: bool,
}

impl DomainState {
    /// Puts `ep` in endpoint slot `idx` (None: the endpoint closed);
    /// returns what was there (see [`EpSlots::set`]).
    pub fn set_ep(&mut self, idx: usize, ep: Option<EpBox>) -> Option<EpBox> {
        self.eps.set(idx, ep)
    }

    /// Releases every binding the closing endpoint `idx` (its state `ep`,
    /// already out of its slot) held: its SRQ, CQs, counters and AV. Those
    /// orphaned by a dropped handle go with their last binding.
    pub fn unbind_ep(&mut self, idx: usize, ep: &EpState) {
        if let Some(s) = ep.matching.srq {
            if let Some(q) = self.srqs.get_mut(s) {
                q.eps.retain(|&e| e != idx);
            }
            self.srqs.unbind(s);
        }
        for c in [ep.bind.tx_cq, ep.bind.rx_cq].into_iter().flatten() {
            self.cqs.unbind(c);
        }
        for c in ep.bind.counters() {
            self.cntrs.unbind(c);
        }
        if let Some(a) = ep.peers.av() {
            self.avs.unbind(a);
        }
    }
}

pub(crate) use ep_slots::EpSlots;

/// The endpoint slots, in a module of their own so that nothing but their
/// methods can break the invariant the progress walk's unchecked slice
/// rests on.
mod ep_slots {
    use super::EpBox;
    use crate::engine::EpState;

    /// A domain's endpoints by section index, and how far a progress pass
    /// looks. Invariants, kept by these methods alone: `slots` is made at
    /// its full length (the domain's section count) and never resized;
    /// `end` is one past the highest open slot's index (0: none open), so
    /// at most `slots.len()`; only [`EpSlots::set`] opens or closes a slot.
    /// Other code reaches an open endpoint's state, never a slot.
    pub(crate) struct EpSlots {
        slots: Vec<Option<EpBox>>,
        end: usize,
    }

    impl EpSlots {
        /// `n` closed slots.
        pub fn new(n: usize) -> EpSlots {
            EpSlots { slots: (0..n).map(|_| None).collect(), end: 0 }
        }

        /// Puts `ep` in slot `idx` (None: the endpoint closed), keeping
        /// `end`; returns what was there. Panics if `idx` is out of range.
        pub fn set(&mut self, idx: usize, ep: Option<EpBox>) -> Option<EpBox> {
            let old = std::mem::replace(&mut self.slots[idx], ep);
            self.end = self.slots.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
            old
        }

        /// The endpoint open in slot `idx` (None: closed, or no such slot).
        #[inline]
        pub fn get(&self, idx: usize) -> Option<&EpBox> {
            self.slots.get(idx)?.as_ref()
        }

        /// The state of the endpoint open in slot `idx`.
        #[inline]
        pub fn get_mut(&mut self, idx: usize) -> Option<&mut EpState> {
            self.slots.get_mut(idx)?.as_deref_mut()
        }

        /// The first closed slot.
        pub fn free_slot(&self) -> Option<usize> {
            self.slots.iter().position(Option::is_none)
        }

        /// Whether any endpoint is open.
        pub fn any_open(&self) -> bool {
            self.end > 0
        }

        /// The open endpoints.
        pub fn iter(&self) -> impl Iterator<Item = &EpBox> {
            self.slots[..self.end].iter().flatten()
        }

        /// The open endpoints' states (the progress walk's, once per pass:
        /// the slice taken without its bounds check).
        #[inline(always)]
        pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut EpState> {
            // SAFETY: end <= slots.len() (the invariant on end, kept by
            // set alone).
            let open = unsafe { self.slots.get_unchecked_mut(..self.end) };
            open.iter_mut().flatten().map(|e| &mut **e)
        }
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
    pub cqs: &'a mut Slots<CqState>,
    pub avs: &'a Slots<AvState>,
    pub srqs: &'a mut Slots<SrqState>,
    pub regions: &'a mut region::RegionMap,
    pub counters: &'a [shm_layout::Counter],
}

/// What a progress pass takes its [`Ctx`] from: a context already built
/// (the calls out of line that hold one), or the domain's own pass
/// ([`PassCtx`]), which builds it only for a call that takes it.
pub(crate) trait CtxSource {
    /// Runs `f` with the context.
    fn with<R>(&mut self, f: impl FnOnce(&mut Ctx<'_>) -> R) -> R;

    /// The context's CQs, without the rest.
    fn cqs(&mut self) -> &mut Slots<CqState>;
}

impl CtxSource for Ctx<'_> {
    #[inline(always)]
    fn with<R>(&mut self, f: impl FnOnce(&mut Ctx<'_>) -> R) -> R {
        f(self)
    }

    #[inline(always)]
    fn cqs(&mut self) -> &mut Slots<CqState> {
        self.cqs
    }
}

/// The domain's own pass ([`DomainInner::progress`]) as a [`CtxSource`]:
/// the context (ten words loaded from the domain state and stored to the
/// stack, its address passed) is built only where a call takes it, so
/// that a pass that finds nothing (the empty CQ read) builds none. Two
/// words, the domain and its state, from which each context is made (its
/// parts held apart instead were loaded and spilled up front).
///
/// Invariant: `st` points to the domain's state, exclusively borrowed for
/// `'a` by the pass, which meanwhile uses only its endpoint slots (`eps`)
/// besides this: a context made from it reaches every other part, never
/// `eps`.
pub(crate) struct PassCtx<'a> {
    dom: &'a DomainInner,
    st: std::ptr::NonNull<DomainState>,
    _st: std::marker::PhantomData<&'a mut DomainState>,
}

impl CtxSource for PassCtx<'_> {
    #[inline(always)]
    fn with<R>(&mut self, f: impl FnOnce(&mut Ctx<'_>) -> R) -> R {
        let st = self.st.as_ptr();
        // SAFETY: the state is ours for 'a and the pass uses only its
        // endpoint slots meanwhile (the invariant): these borrows of its
        // other fields, made through the pointer field by field, alias
        // nothing, and they end with `f`, before the next are made
        // (`&mut self`).
        let (cqs, avs, srqs, regions) = unsafe {
            (
                &mut *std::ptr::addr_of_mut!((*st).cqs),
                &*std::ptr::addr_of!((*st).avs),
                &mut *std::ptr::addr_of_mut!((*st).srqs),
                &mut *std::ptr::addr_of_mut!((*st).regions),
            )
        };
        let dom = self.dom;
        f(&mut Ctx { cfg: &dom.cfg, cqs, avs, srqs, regions, counters: dom.counters() })
    }

    #[inline(always)]
    fn cqs(&mut self) -> &mut Slots<CqState> {
        // SAFETY: as in `with`: the CQs are not borrowed otherwise while
        // this borrow (of `self`) lives.
        unsafe { &mut *std::ptr::addr_of_mut!((*self.st.as_ptr()).cqs) }
    }
}

/// Where a [`Ctx`] comes from, for the fast paths of the send and receive
/// calls: they read the few things they need (the configuration, the
/// counters, the AVs) through it, and build the context only for a call
/// out of line. A context built at every call, with its address taken by
/// those calls, is ten words loaded from the domain state and stored to
/// the stack on every send and receive.
///
/// It holds the whole domain state but gives out only what a context
/// holds, never the endpoint slots (`with_ep!` relies on that).
pub(crate) struct CtxSrc<'a> {
    dom: &'a DomainInner,
    st: &'a mut DomainState,
}

impl<'a> CtxSrc<'a> {
    #[inline(always)]
    pub fn new(dom: &'a DomainInner, st: &'a mut DomainState) -> Self {
        CtxSrc { dom, st }
    }
}

impl CtxSrc<'_> {
    #[inline(always)]
    pub fn cfg(&self) -> &Config {
        &self.dom.cfg
    }

    #[inline(always)]
    pub fn avs(&self) -> &Slots<AvState> {
        &self.st.avs
    }

    /// The CQs (for a room check of resource management).
    #[inline(always)]
    pub fn cqs(&self) -> &Slots<CqState> {
        &self.st.cqs
    }

    #[inline(always)]
    pub fn counters(&self) -> &[shm_layout::Counter] {
        self.dom.counters()
    }

    /// The full context.
    #[inline(always)]
    pub fn ctx(&mut self) -> Ctx<'_> {
        let DomainState { cqs, avs, srqs, regions, .. } = &mut *self.st;
        Ctx { cfg: &self.dom.cfg, cqs, avs, srqs, regions, counters: self.dom.counters() }
    }
}

impl DomainInner {
    #[inline(always)]
    pub fn lock(&self) -> Result<DomainGuard<'_, DomainState>> {
        self.st.lock().map_err(|e| match e {
            LockError::OtherThread => Error::with(
                ErrorKind::Inval,
                "this domain was opened with Threading::Domain and is driven by another thread; open it \
                 with Threading::Safe to share it between threads (or, serialising every call yourself, \
                 with the unsafe Fabric::domain_serialized)",
            ),
            LockError::Reentrant => Error::with(ErrorKind::Inval, "domain called re-entrantly from inside a call"),
        })
    }

    /// A new eventfd that the domain's bridge (started if need be) makes
    /// readable when it fires: the fd of an Fd wait object or of a
    /// completion channel.
    pub fn bridged_eventfd(&self) -> Result<Arc<std::os::fd::OwnedFd>> {
        let fd = crate::fdwait::eventfd()?;
        let mut b = self.bridge.lock().unwrap_or_else(|p| p.into_inner());
        b.get_or_insert_with(|| crate::fdwait::Bridge::start(&self.region.header().doorbell)).add(fd.clone());
        Ok(fd)
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
        let ep = eps.get_mut(idx).ok_or_else(|| Error::with(ErrorKind::Inval, "endpoint is closed"))?;
        let mut ctx = Ctx { cfg: &self.cfg, cqs, avs, srqs, regions, counters: self.counters() };
        f(ep, &mut ctx)
    }

    /// One progress pass over every enabled endpoint.
    #[inline(always)]
    pub fn progress(&self, st: &mut DomainState) {
        if let Some(o) = self.rma.own_if_any() {
            if o.pending() {
                self.serve_rma(st);
            }
        }
        // The context is built only for a call that takes it (PassCtx):
        // 155 -> 143 instructions per empty CQ read, 581 -> 574 per 8 B
        // half round trip (scripts/profile.sh; drain_ring takes the CQs
        // from it without a context). Built here once for every endpoint
        // (the way before), it was ten words loaded and stored per read.
        let stp = std::ptr::NonNull::from(&mut *st);
        // SAFETY: `st` is borrowed exclusively for the loop; the slots are
        // the one field the loop uses besides the contexts, which reach
        // every other field and never this one (PassCtx's invariant).
        let eps = unsafe { &mut *std::ptr::addr_of_mut!((*stp.as_ptr()).eps) };
        let mut ctx = PassCtx { dom: self, st: stp, _st: std::marker::PhantomData };
        for ep in eps.iter_mut() {
            if !ep.polled() {
                continue;
            }
            crate::progress::progress_ep(ep, &mut ctx);
        }
        // One relaxed load when no work waits on a counter.
        if self.trig.pending() {
            crate::trigger::fire(self, st);
        }
    }

    /// Requests wait in our RMA mailbox: out of line, so that the pass of a
    /// domain without them pays one load (16 instructions per 8 B half
    /// round trip and 15 per empty CQ read when inlined after the endpoint
    /// loop; checked before the loop, 6 and 5 fewer again, by
    /// scripts/profile.sh).
    #[cold]
    #[inline(never)]
    fn serve_rma(&self, st: &mut DomainState) {
        crate::rma::serve_domain(self, st);
    }

    /// Whether any enabled endpoint has inbound work waiting.
    fn has_inbound(&self, st: &DomainState) -> bool {
        st.eps.iter().any(|ep| ep.polled() && ep.inbound_ready())
            || self.rma.own_if_any().is_some_and(|o| o.pending())
            || (self.trig.pending() && st.trig.due(self.counters()))
    }

    /// Whether any enabled endpoint has something pending with a peer not
    /// yet known to be gone: a sleeper must then wake every peer-check
    /// period, so that a peer that dies meanwhile is noticed (nothing else
    /// would ring for it).
    fn waits_on_peers(&self, st: &DomainState) -> bool {
        st.eps
            .iter()
            .any(|ep| ep.enabled && (0..ep.peers.len()).any(|p| ep.peers[p].gone.is_none() && ep.pending_with(p)))
    }

    /// How long a sleep on the doorbell may last: 1 ms while sends wait
    /// for ring room or pool chunks, an overflow queue is blocked by a
    /// claim that may be dead, or messages are held back until the
    /// application acts (nothing will ring for those); the
    /// peer-check period while something is pending with a live peer;
    /// else long.
    fn sleep_cap(&self, st: &DomainState) -> Duration {
        if st.eps.iter().any(|e| e.local_work()) || st.trig.blocked() {
            Duration::from_millis(1)
        } else if self.waits_on_peers(st) {
            self.cfg.peer_check
        } else {
            Duration::from_secs(3600)
        }
    }

    /// The next progress pass of every endpoint looks at the clock (and
    /// checks peers for life when a period has passed): after a sleep.
    fn check_soon(st: &mut DomainState) {
        for ep in st.eps.iter_mut() {
            ep.check_soon();
        }
    }
}

impl Domain {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Resource management (fi_domain(3)'s `resource_mgmt`): with `true`
    /// (FI_RM_ENABLED), no CQ of the domain overruns: a transmit whose
    /// completion entry would not fit its CQ (counting the entries that
    /// outstanding transmits reserved) is refused with `-FI_EAGAIN` at
    /// posting, and what must be written past the CQ's size anyway is held
    /// until read (see [`crate::cq`] for the whole model). Off by default
    /// (FI_RM_DISABLED), which costs nothing on the send path; on, a send
    /// that reports to a CQ looks at that CQ's room first. Set before any
    /// CQ or endpoint is open (`-FI_EBUSY` after: each CQ takes it at open).
    ///
    /// ```
    /// # std::env::set_var("SHMFAB_JOB_ID", format!("doc-rm-{}", std::process::id()));
    /// let dom = shmfab::Fabric::open()?.domain()?;
    /// dom.set_resource_mgmt(true)?;
    /// assert!(dom.resource_mgmt());
    /// let cq = dom.cq_open(&shmfab::CqAttr { size: 8, ..Default::default() })?;
    /// assert_eq!(dom.set_resource_mgmt(false).unwrap_err().kind(), shmfab::ErrorKind::Busy);
    /// # drop(cq);
    /// # Ok::<(), shmfab::Error>(())
    /// ```
    pub fn set_resource_mgmt(&self, on: bool) -> Result<()> {
        let mut st = self.inner.lock()?;
        if st.cqs.iter().next().is_some() || st.eps.any_open() {
            return Err(Error::with(
                ErrorKind::Busy,
                "resource management is set before the domain's first CQ or endpoint opens",
            ));
        }
        st.rm = on;
        Ok(())
    }

    /// Whether resource management is on (see [`Domain::set_resource_mgmt`]).
    pub fn resource_mgmt(&self) -> bool {
        self.inner.lock().map(|st| st.rm).unwrap_or(false)
    }

    /// Name of the domain's region (its file name under /dev/shm when
    /// `SHMFAB_REGIONS=named`; anonymous regions have none, and are called
    /// this in messages and by `shmfab inspect`).
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
    /// `timeout` passes (`None`: until the doorbell rings); returns at once
    /// if work is already waiting. Wake-ups may be spurious: callers
    /// re-check. Work that is not a new inbound message (pool chunks freed,
    /// credit returned) does not ring the doorbell, nor does a peer's
    /// death, so callers waiting for that should pass a short timeout.
    pub fn wait(&self, timeout: Option<Duration>) {
        self.sleep(timeout, || false);
    }

    /// Sleeps as [`Domain::wait`] until `done()` or `timeout` (None:
    /// forever), at most one slice: 1 ms while sends wait for ring room or
    /// pool chunks (which do not ring the doorbell), the peer-check period
    /// while something is pending with a peer (whose death rings nothing).
    /// After a sleep the next progress pass checks peers for life, so a
    /// caller that loops (progress, re-check, `wait_for`) notices a dead
    /// peer within about two periods however long its own timeout.
    pub(crate) fn wait_for(&self, timeout: Option<Duration>, done: impl Fn() -> bool) {
        let cap = self.inner.lock().map(|st| self.inner.sleep_cap(&st)).unwrap_or(Duration::from_millis(1));
        self.sleep(Some(timeout.map_or(cap, |t| t.min(cap))), done);
    }

    fn sleep(&self, timeout: Option<Duration>, done: impl Fn() -> bool) {
        let db = &self.inner.region.header().doorbell;
        // A watcher: another thread of ours may make what it waits for.
        let found = crate::doorbell::wait_as(
            db,
            true,
            || {
                done()
                    || match self.inner.lock() {
                        Ok(st) => self.inner.has_inbound(&st),
                        Err(_) => true, // not ours to sleep on: return at once
                    }
            },
            timeout,
        );
        if !found {
            self.inner.sleeps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Time passed: let the next progress pass check peers' lives.
            if let Ok(mut st) = self.inner.lock() {
                DomainInner::check_soon(&mut st);
            }
        }
    }

    /// fi_trywait over CQs: `Ok` when nothing is there to read and the
    /// CQs' wait fds ([`crate::CompletionQueue::wait_fd`]) will become readable
    /// when something arrives, so the caller may block in poll, select or
    /// epoll; `-FI_EAGAIN` when it should read the CQs first. Only CQs with
    /// [`WaitObj::Fd`](crate::WaitObj::Fd) may be given. While something
    /// is pending with a peer, the fds also become readable after each
    /// peer-check period (`SHMFAB_PEER_CHECK_MS`), so that the next
    /// trywait checks peers' lives: an operation pending with a peer that
    /// died fails while the application blocks on the fds.
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
            // An Fd set's fd is emptied before its members are looked at:
            // an event after the look makes it readable again.
            set.drain_fd();
            if set.has_event()? {
                return Err(Error::AGAIN);
            }
        }
        let mut moved = false;
        {
            let mut st = self.inner.lock()?;
            // The caller is about to block, or has just woken (maybe by the
            // bridge's peer-check timeout): check peers' lives now.
            DomainInner::check_soon(&mut st);
            self.inner.progress(&mut st);
            for c in cntrs {
                if !Arc::ptr_eq(&c.dom, &self.inner) {
                    return Err(Error::with(ErrorKind::Inval, "counter of another domain"));
                }
                let cs = st.cntrs.get_mut(c.id).ok_or_else(|| Error::with(ErrorKind::Inval, "counter is closed"))?;
                // An Fd counter's fd is emptied before the values are read:
                // a change after the read makes it readable again.
                if let Some(fd) = &cs.fd {
                    crate::fdwait::drain(fd);
                }
                let shm = &self.inner.counters()[c.id];
                use std::sync::atomic::Ordering::Acquire;
                let now = (shm.value.v.load(Acquire), shm.err.v.load(Acquire));
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
            let c = st.cqs.get(cq.id).ok_or_else(|| Error::with(ErrorKind::Inval, "CQ is closed"))?;
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
            cqs.iter()
                .any(|cq| st.cqs.get(cq.id).is_some_and(|c| !c.entries.is_empty() || !c.errors.is_empty() || c.overrun))
        };
        if ready(&st) {
            return Err(Error::AGAIN);
        }
        self.arm_bridge(&st)?;
        // A counter that moved since its checkpoint (in the pass above, or
        // by another thread before the bridge announced itself, when its
        // add rang nothing): read it first (the bridge stays armed).
        for c in cntrs {
            let shm = &self.inner.counters()[c.id];
            use std::sync::atomic::Ordering::Acquire;
            let now = (shm.value.v.load(Acquire), shm.err.v.load(Acquire));
            if st.cntrs.get(c.id).is_some_and(|cs| cs.checkpoint != now) {
                return Err(Error::AGAIN);
            }
        }
        drop(st);
        // Likewise a wait set's member (a counter another thread changed).
        if sets.iter().any(|s| s.event_waiting()) {
            return Err(Error::AGAIN);
        }
        Ok(())
    }

    /// The fd half of trywait for completion channels: no CQs to look at.
    pub(crate) fn trywait_fds(&self) -> Result<()> {
        let mut st = self.inner.lock()?;
        DomainInner::check_soon(&mut st);
        self.inner.progress(&mut st);
        self.arm_bridge(&st)
    }

    /// The verbs pattern, without trywait: arms the bridge so that `fd` (a
    /// completion channel's) becomes readable when a sender rings, or
    /// makes it readable now if work already waits.
    pub(crate) fn watch_fd(&self, fd: &std::os::fd::OwnedFd) -> Result<()> {
        let st = self.inner.lock()?;
        match self.arm_bridge(&st) {
            Err(e) if e.kind() == ErrorKind::Again => {
                crate::fdwait::poke(fd);
                Ok(())
            }
            r => r,
        }
    }

    fn arm_bridge(&self, st: &DomainState) -> Result<()> {
        let db = &self.inner.region.header().doorbell;
        let bridge = self.inner.bridge.lock().unwrap_or_else(|p| p.into_inner());
        let bridge =
            bridge.as_ref().ok_or_else(|| Error::with(ErrorKind::Inval, "no FD wait object in this domain"))?;
        // While something is pending with a peer, the bridge fires after a
        // peer-check period even if nothing rang (a peer's death rings
        // nothing): the application wakes, and its next trywait checks
        // peers' lives. Likewise while messages are held back (another
        // thread's posted receive or CQ read, which lets them move, rings
        // nothing either).
        let held = st.eps.iter().any(|e| e.polled() && e.inbound.holds_back());
        let period = (held || self.inner.waits_on_peers(st)).then_some(self.inner.cfg.peer_check);
        match bridge.armed() {
            // An earlier trywait's announcement still stands.
            Some(timed) if timed || period.is_none() => return Ok(()),
            // It sleeps without a period, and one is needed now: make it
            // fire (the fds become readable; the next trywait arms anew).
            Some(_) => {
                crate::doorbell::wake_all(db);
                return Ok(());
            }
            None => {}
        }
        let seen = crate::doorbell::announce(db);
        if self.inner.has_inbound(st) {
            crate::doorbell::withdraw(db, true);
            return Err(Error::AGAIN);
        }
        bridge.arm(seen, period);
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
        // Triggered work due wakes the thread (see `trigger::Watch`).
        let watch = self.inner.trig.watch(self.inner.counters());
        let st = stop.clone();
        let h = std::thread::Builder::new()
            .name("shmfab-progress".into())
            .spawn(move || {
                use std::sync::atomic::Ordering::Acquire;
                let mut slept = false;
                loop {
                    if st.load(Acquire) {
                        return;
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    let (busy, made) = match inner.lock() {
                        Ok(mut s) => {
                            if slept {
                                // Time passed: check peers' lives when due.
                                DomainInner::check_soon(&mut s);
                            }
                            let before = (cq_entries(&s), counters_digest(&s, inner.counters()));
                            inner.progress(&mut s);
                            let after = (cq_entries(&s), counters_digest(&s, inner.counters()));
                            // Work held back for room is retried after a nap.
                            let busy = s.eps.iter().any(|e| e.tx.any_busy()) || s.trig.blocked();
                            (busy, after.0 > before.0 || after.1 != before.1)
                        }
                        Err(_) => (false, false),
                    };
                    if made {
                        // Completions made or counted here, with no
                        // doorbell rung by anyone (sends that waited for
                        // ring room, ...): ring our own (only if someone
                        // sleeps), so an armed bridge makes the FD and
                        // condvar wait objects ready and sread, a counter's
                        // wait or a wait set's wakes up.
                        crate::doorbell::ring(&inner.region.header().doorbell);
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
                    // SAFETY (`due`): as for the doorbell just above; the
                    // counter table lies in the same region.
                    slept = !crate::doorbell::wait(db, || st.load(Acquire) || unsafe { watch.due() }, Some(slice));
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

/// The deadline of a wait of at most `timeout` from now: `None` (no
/// deadline, wait forever) for `None` and for a timeout so long that the
/// clock cannot express its end (`Duration::MAX`, say): never reached
/// either way.
pub(crate) fn deadline(timeout: Option<Duration>) -> Option<std::time::Instant> {
    timeout.and_then(|t| std::time::Instant::now().checked_add(t))
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
    /// Under loom: a stand-in per slot for its plain `addr` (see
    /// [`crate::sync::Tracked`]); None outside the models.
    #[cfg(loom)]
    pub tracked: Option<&'static [crate::sync::Tracked]>,
}

/// How a sender's ring slot claim went ([`Section::claim_ring`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Slot `s` is ours: its address written, the claim announced and its
    /// `claimed` bit set; we are its ring's only producer.
    Ring(u32),
    /// Every slot is taken: use the overflow queue ([`Section::use_overflow`]).
    Full,
    /// The section is no longer open at the generation asked for: the
    /// endpoint closed (and the section may be open for another one).
    Closed,
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
            #[cfg(loom)]
            tracked: None,
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

    /// The token a sender at `me` holds a ring slot of this section's
    /// endpoint with, when that endpoint is at `generation`: the value of
    /// the slot's owner word once the claim is announced (its
    /// [`Section::ANNOUNCED`] bit set; while the claim is made the word
    /// holds the token without that bit). The target's generation is in
    /// it: a claim made for one generation never passes for a claim of the
    /// next (the same sender reconnecting to the reopened section takes a
    /// slot with another token), so the check before each push
    /// (`Peer::chan_valid`) fails for good once the section is closed, and
    /// the owner takes no claim whose token is not of its generation
    /// ([`Section::take_claim`]). Odd: never 0 (a free slot).
    pub fn claim_token(me: Address, generation: u32) -> u64 {
        // The top bit is the announcement's alone.
        ((me.region_bits()
            ^ ((me.ep_index as u64) << 48)
            ^ ((me.generation as u64) << 32)
            ^ ((generation as u64) << 1))
            & !Self::ANNOUNCED)
            | 1
            | Self::ANNOUNCED
    }

    /// The bit of a slot's owner word that announces the claim: set by the
    /// claimant once its address is in the slot, while the section is still
    /// the one it claimed in (a CAS from its token without the bit). The
    /// top bit, which the target's generation (shifted by one) never
    /// reaches: the tokens of two generations still differ.
    pub const ANNOUNCED: u64 = 1 << 63;

    /// A sender's claim of a free ring slot for `me`, with the `token` of
    /// [`Section::claim_token`] for the endpoint at `generation`, in four
    /// steps: a CAS of a slot's owner word from 0 to the token without its
    /// [`Section::ANNOUNCED`] bit; a check that the section is still open
    /// at `generation` (else the slot is given back: the claim may have
    /// landed in the section reopened for another endpoint); `me` written
    /// in the slot; the announcement, a CAS of the owner word to the token,
    /// which fails if the close's punch freed the slot since the first CAS
    /// (then the claim died with its generation); last the slot's `claimed`
    /// bit, which tells the owner's progress pass to look at the slot (a
    /// hint: the pass takes the ring only for an announced token of its own
    /// generation, [`Section::take_claim`]).
    pub fn claim_ring(&self, generation: u32, token: u64, me: Address) -> Claim {
        use crate::sync::Ordering;
        let claiming = token & !Self::ANNOUNCED;
        for s in 0..self.g.n_slots {
            let slot = self.slot(s);
            // SYNC: the acquire pairs with the close: a zero left by the
            // punch of a closed section's pages (Endpoint::close, after
            // Section::close) is read after the kernel replaced the page,
            // which orders it as a release store would; the check below
            // then sees the section closed or reopened. The release half
            // publishes nothing (the address is published by the
            // announcement).
            if slot.owner.compare_exchange(0, claiming, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            if !self.open_at(generation) {
                // Relaxed: we wrote nothing in the slot. A CAS, not a
                // store: if the punch zeroed our claim and another sender
                // took the slot since, it is theirs.
                let _ = slot.owner.compare_exchange(claiming, 0, Ordering::Relaxed, Ordering::Relaxed);
                return Claim::Closed;
            }
            self.track_addr(s, true);
            // SAFETY: we own the slot now; addr is plain data in it.
            unsafe { std::ptr::addr_of!(slot.addr).cast_mut().write_volatile(me) };
            // SYNC: the release publishes the slot's addr to the acquire
            // load of the owner word in Section::take_claim. Succeeding, it
            // comes before the punch in the word's order: the address went
            // to the page the punch replaces, never to a reopened section.
            // Failing, the punch freed the slot (and maybe another sender
            // of the next generation took it): the claim is dead, and the
            // owner of the next generation takes no slot for this address
            // (its token is not of that generation).
            if slot.owner.compare_exchange(claiming, token, Ordering::Release, Ordering::Relaxed).is_err() {
                return Claim::Closed;
            }
            // SYNC: pairs with the acquire load of `claimed` in
            // Inbound::new_claims (a hint to look at the slot) and with the
            // acquire fetch_and in Section::take_claim: a pass that drops
            // this bit then sees the announcement.
            self.header().claimed.fetch_or(1 << s, Ordering::Release);
            return Claim::Ring(s);
        }
        Claim::Full
    }

    /// The owner's look at slot `s`, whose `claimed` bit it found set and
    /// has not taken yet, for its endpoint at `generation`: the claimant's
    /// address when the slot holds an announced claim of that generation
    /// for the address in the slot (then its ring is the claimant's), else
    /// None and the bit is dropped. A bit can outlive its claim: a sender
    /// that claimed for an older generation and was slow to set it sets
    /// it in the reopened section, for a slot the punch freed. Dropping
    /// the bit never hides a claim: one announced since the first look set
    /// the bit before the drop (then the drop sees its announcement, looked
    /// for once more) or sets it after (the next pass looks). An announced
    /// word whose token does not match the slot's address (a stale sender's
    /// address written over a new claimant's) is unannounced: its claimant's
    /// check before a push fails, and the ring is never read.
    pub fn take_claim(&self, s: u32, generation: u32) -> Option<Address> {
        use crate::sync::Ordering;
        if let Some(a) = self.announced(s, generation) {
            return Some(a);
        }
        // SYNC: the acquire pairs with the release fetch_or of a claimant
        // in Section::claim_ring (a drop after its bit sees its
        // announcement below). Releases nothing.
        self.header().claimed.fetch_and(!(1u64 << s), Ordering::Acquire);
        self.announced(s, generation)
    }

    /// The address of slot `s` if it holds an announced claim for it at
    /// `generation` (see [`Section::take_claim`]).
    fn announced(&self, s: u32, generation: u32) -> Option<Address> {
        use crate::sync::Ordering;
        let slot = self.slot(s);
        // SYNC: pairs with the release CAS that announces the claim in
        // Section::claim_ring: the address is then visible.
        let owner = slot.owner.load(Ordering::Acquire);
        if owner & Self::ANNOUNCED == 0 {
            return None; // free, or a claim not announced yet
        }
        self.track_addr(s, false);
        // SAFETY: slot s < n_slots (callers check); a plain-data copy,
        // untrusted (checked against the token below).
        let a = unsafe { std::ptr::addr_of!(slot.addr).read_volatile() };
        if Self::claim_token(a, generation) == owner {
            return Some(a);
        }
        // Relaxed: publishes nothing; the claimant's check reads it relaxed.
        let _ = slot.owner.compare_exchange(owner, owner & !Self::ANNOUNCED, Ordering::Relaxed, Ordering::Relaxed);
        None
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

    /// The address the claimant of slot `s` wrote, read as accept_claims
    /// reads it once the slot's `claimed` bit is set (for the models; the
    /// pass could call this).
    #[cfg(test)]
    pub fn claimant(&self, s: u32) -> Address {
        self.track_addr(s, false);
        // SAFETY: slot s < n_slots; a plain-data copy, untrusted.
        unsafe { std::ptr::addr_of!(self.slot(s).addr).read_volatile() }
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
        // Relaxed: only the owner reads `claimed`; a reopen starts from
        // none (a bit that a slow sender sets later is dropped by the
        // reopened endpoint's pass, Section::take_claim).
        h.claimed.store(0, Ordering::Relaxed);
    }

    /// Under loom, reports an access to slot `s`'s address.
    #[inline(always)]
    fn track_addr(&self, s: u32, write: bool) {
        #[cfg(loom)]
        if let Some(t) = self.tracked {
            if write {
                t[s as usize].write()
            } else {
                t[s as usize].read()
            }
        }
        #[cfg(not(loom))]
        let _ = (s, write);
    }
}

/// A section on the heap, laid out by its geometry, for the unit and loom
/// tests (as the pool has a heap pool): every atomic is made in place
/// (loom's atomics are handles, not plain words), the rest is zero. Freed
/// on drop.
#[cfg(test)]
pub(crate) struct HeapSection {
    /// The section.
    pub sec: Section,
    buf: *mut u8,
    layout: std::alloc::Layout,
}

#[cfg(test)]
impl HeapSection {
    /// A small geometry for the models (not a valid one for a region):
    /// two slots of four cells, a queue of two, two chunks.
    pub const SMALL: EpGeometry =
        EpGeometry { n_slots: 2, ring_cells: 4, ovf_cells: 2, pool_chunks: 2, chunk_size: 4096, reserved: 0 };

    /// A closed section of geometry `g` (not validated: tests use small ones).
    pub fn new(g: EpGeometry) -> HeapSection {
        use crate::sync::{AtomicU32, AtomicU64};
        use shm_layout::{Cell, MsgHdr, PaddedU64, CELL_PAYLOAD, OVF_PAYLOAD, PAGE};
        let layout = std::alloc::Layout::from_size_align(g.section_size(), PAGE).expect("section layout");
        // Under loom an AtomicU32 takes 8 bytes, the geometry counts 4 per
        // pool link: the links must still end before the chunks.
        assert!(g.pool_next_offset() + g.pool_chunks as usize * std::mem::size_of::<AtomicU32>() <= g.chunks_offset());
        // SAFETY: the size is non-zero (a section holds at least its header).
        let buf = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!buf.is_null(), "out of memory");
        let p64 = || PaddedU64 { v: AtomicU64::new(0) };
        let (n_slots, n_cells) = (g.n_slots as usize, g.n_slots as usize * g.ring_cells as usize);
        // SAFETY: each write is of the type the geometry places at that
        // offset, inside the buffer and aligned (the buffer is page aligned
        // and the geometry aligns each part for its type).
        unsafe {
            (buf as *mut EpHeader).write(EpHeader {
                state: AtomicU32::new(0),
                generation: AtomicU32::new(0),
                claimed: AtomicU64::new(0),
                ovf_used: AtomicU32::new(0),
                tx_queued: AtomicU32::new(0),
                rx_posted: AtomicU32::new(0),
                unexpected: AtomicU32::new(0),
                rx_active: AtomicU32::new(0),
                reserved: 0,
                passes: AtomicU64::new(0),
            });
            let slots = buf.add(g.slots_offset()) as *mut SlotEntry;
            let ringctl = buf.add(g.ringctl_offset()) as *mut RingCtl;
            for s in 0..n_slots {
                slots.add(s).write(SlotEntry { owner: AtomicU64::new(0), addr: Address::default() });
                ringctl.add(s).write(RingCtl { head: p64(), tail: p64() });
            }
            let cells = buf.add(g.cells_offset()) as *mut Cell;
            for i in 0..n_cells {
                cells.add(i).write(Cell { seq: AtomicU64::new(0), hdr: MsgHdr::default(), payload: [0; CELL_PAYLOAD] });
            }
            (buf.add(g.ovfctl_offset()) as *mut OvfCtl).write(OvfCtl { enqueue: p64(), dequeue: p64() });
            let ovf = buf.add(g.ovf_cells_offset()) as *mut OvfCell;
            for i in 0..g.ovf_cells as usize {
                ovf.add(i).write(OvfCell {
                    seq: AtomicU64::new(0),
                    hdr: MsgHdr::default(),
                    src: Address::default(),
                    payload: [0; OVF_PAYLOAD],
                });
            }
            (buf.add(g.poolctl_offset()) as *mut PoolCtl).write(PoolCtl {
                head: AtomicU64::new(0),
                in_use: AtomicU32::new(0),
                reserved: 0,
            });
            let next = buf.add(g.pool_next_offset()) as *mut AtomicU32;
            for i in 0..g.pool_chunks as usize {
                next.add(i).write(AtomicU32::new(0));
            }
        }
        // SAFETY: every offset is inside the buffer (section_size covers them).
        let at = |off: usize| unsafe { buf.add(off) };
        let sec = Section {
            g,
            hdr: buf as *const EpHeader,
            slots: at(g.slots_offset()) as *const SlotEntry,
            ringctl: at(g.ringctl_offset()) as *const RingCtl,
            cells: at(g.cells_offset()),
            ovfctl: at(g.ovfctl_offset()) as *const OvfCtl,
            ovfcells: at(g.ovf_cells_offset()) as *mut OvfCell,
            poolctl: at(g.poolctl_offset()) as *const PoolCtl,
            pool_next: at(g.pool_next_offset()) as *const crate::sync::AtomicU32,
            chunks: at(g.chunks_offset()),
            offset: 0,
            #[cfg(loom)]
            tracked: Some(crate::sync::Tracked::leaked(n_slots)),
        };
        HeapSection { sec, buf, layout }
    }
}

#[cfg(test)]
impl Drop for HeapSection {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout, freed once.
        unsafe { std::alloc::dealloc(self.buf, self.layout) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;

    fn sender(token: u32) -> Address {
        Address { pid: 1, job: 2, token, fd: 3, ep_index: 0, generation: 1 }
    }

    #[test]
    fn ring_claims_are_per_generation() {
        let hs = HeapSection::new(HeapSection::SMALL);
        let sec = hs.sec;
        // SAFETY: fresh section, no peer.
        unsafe { sec.open(1) };
        let (a, b, c) = (sender(10), sender(11), sender(12));
        let claim = |gen: u32, who: Address| sec.claim_ring(gen, Section::claim_token(who, gen), who);
        assert_eq!(claim(1, a), Claim::Ring(0));
        assert_eq!(claim(1, b), Claim::Ring(1));
        assert_eq!(claim(1, c), Claim::Full, "two slots");
        assert_eq!((sec.claimant(0), sec.claimant(1)), (a, b));
        assert_eq!(sec.header().claimed.load(Ordering::Relaxed), 0b11);
        sec.close();
        // The punch of the pages (Endpoint::close) zeroes every owner word.
        for s in 0..2 {
            sec.slot(s).owner.store(0, Ordering::Relaxed);
        }
        assert!(!sec.open_at(1));
        assert_eq!(claim(1, a), Claim::Closed, "a claim for a closed generation");
        assert_eq!(sec.slot(0).owner.load(Ordering::Relaxed), 0, "is given back");
        // SAFETY: closed and zeroed.
        unsafe { sec.open(2) };
        assert_eq!(sec.header().claimed.load(Ordering::Relaxed), 0, "a reopen starts from no claims");
        assert_eq!(claim(2, a), Claim::Ring(0));
        let old = Section::claim_token(a, 1);
        assert_ne!(sec.slot(0).owner.load(Ordering::Relaxed), old, "the same sender's old claim stays dead");
    }

    /// Writes `a` as slot `s`'s address, as a claimant (or a stale one) does.
    fn write_addr(sec: &Section, s: u32, a: Address) {
        // SAFETY: slot s lies in the section; no other thread touches it.
        unsafe { std::ptr::addr_of!(sec.slot(s).addr).cast_mut().write_volatile(a) };
    }

    #[test]
    fn the_owner_takes_only_announced_claims_of_its_generation() {
        let hs = HeapSection::new(HeapSection::SMALL);
        let sec = hs.sec;
        let claimed = || sec.header().claimed.load(Ordering::Relaxed);
        // SAFETY: fresh section, no peer.
        unsafe { sec.open(1) };
        let (a, b, c) = (sender(10), sender(11), sender(12));
        let claim = |gen: u32, who: Address| sec.claim_ring(gen, Section::claim_token(who, gen), who);
        assert_eq!(claim(1, a), Claim::Ring(0));
        assert_eq!(sec.take_claim(0, 1), Some(a));
        assert_eq!(sec.slot(0).owner.load(Ordering::Relaxed), Section::claim_token(a, 1), "announced");
        sec.close();
        for s in 0..2 {
            sec.slot(s).owner.store(0, Ordering::Relaxed);
            write_addr(&sec, s, Address::default());
        }
        // SAFETY: closed and zeroed.
        unsafe { sec.open(2) };
        // A sender that claimed slot 0 for generation 1 just before the
        // close writes its address and sets the slot's bit only now, in the
        // reopened section (its owner word was freed by the punch).
        write_addr(&sec, 0, a);
        sec.header().claimed.fetch_or(1, Ordering::Release);
        assert_eq!(sec.take_claim(0, 2), None, "a claim of generation 1 taken at generation 2");
        assert_eq!(claimed(), 0, "its bit is dropped");
        // The slot is claimable again, and taken for its new claimant.
        assert_eq!(claim(2, b), Claim::Ring(0));
        assert_eq!(claimed(), 1);
        assert_eq!(sec.take_claim(0, 2), Some(b));
        // An announced claim of generation 1 left in the section (a model
        // of what the announcement's CAS prevents) is not taken either.
        sec.slot(1).owner.store(Section::claim_token(a, 1), Ordering::Relaxed);
        write_addr(&sec, 1, a);
        sec.header().claimed.fetch_or(2, Ordering::Release);
        assert_eq!(sec.take_claim(1, 2), None, "a generation-1 token taken at generation 2");
        assert_eq!(claimed(), 1, "its bit is dropped");
        sec.slot(1).owner.store(0, Ordering::Relaxed);
        // A stale address written over a new claimant's: the ring is never
        // read with that source, and its claimant's check before a push fails.
        assert_eq!(claim(2, c), Claim::Ring(1));
        write_addr(&sec, 1, a);
        assert_eq!(sec.take_claim(1, 2), None, "a claim taken with another sender's address");
        assert_eq!(claimed(), 1);
        let owner = sec.slot(1).owner.load(Ordering::Relaxed);
        assert_ne!(owner, Section::claim_token(c, 2), "its claimant's check passes");
        assert_ne!(owner, 0, "the slot, whose ring may hold messages, is not free");
        // Its word now reads as a claim not announced yet: not taken.
        sec.header().claimed.fetch_or(2, Ordering::Release);
        assert_eq!(sec.take_claim(1, 2), None, "a claim not announced taken");
        assert_eq!(claimed(), 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::ring::{RingRx, RingTx};
    use crate::sync::Ordering;
    use shm_layout::MsgHdr;

    const G: EpGeometry = HeapSection::SMALL;

    /// The sender's own address (generation 1 of its endpoint).
    const ME: Address = Address { pid: 1, job: 2, token: 0x77, fd: 3, ep_index: 3, generation: 1 };

    /// What the punch of a closed section's pages does (Endpoint::close):
    /// every word after the header reads zero. The kernel replaces the
    /// pages: the zero comes after every access to the old page, and a
    /// peer's access that finds the new page is ordered after the punch.
    /// Modelled as release swaps of zero (swaps, not stores: loom leaves a
    /// plain store unordered with a concurrent CAS, so a later load could
    /// read the CAS's value over the zero). The slot's plain address is
    /// zeroed untracked: no CPU store races it.
    fn punch(sec: &Section) {
        let rel = Ordering::Release;
        for s in 0..sec.g.n_slots {
            sec.slot(s).owner.swap(0, rel);
            // SAFETY: slot s lies in the section; a model thread's plain
            // write stands for the kernel's zeroing.
            unsafe { std::ptr::addr_of!(sec.slot(s).addr).cast_mut().write_volatile(Address::default()) };
            // SAFETY: as above.
            let rc = unsafe { &*sec.ringctl_at(s) };
            rc.head.v.swap(0, rel);
            rc.tail.v.swap(0, rel);
            for i in 0..sec.g.ring_cells as usize {
                // SAFETY: cell i of ring s lies in the section.
                unsafe { (*(sec.ring_cells(s) as *const shm_layout::Cell).add(i)).seq.swap(0, rel) };
            }
        }
        // SAFETY: the queue's and pool's words lie in the section.
        unsafe {
            (*sec.ovfctl).enqueue.v.swap(0, rel);
            (*sec.ovfctl).dequeue.v.swap(0, rel);
            for i in 0..sec.g.ovf_cells as usize {
                (*sec.ovfcells.add(i)).seq.swap(0, rel);
            }
            (*sec.poolctl).head.swap(0, rel);
            (*sec.poolctl).in_use.swap(0, rel);
            for i in 0..sec.g.pool_chunks as usize {
                (*sec.pool_next.add(i)).swap(0, rel);
            }
        }
    }

    /// A sender connects while the owner opens the section: a sender that
    /// finds it open finds its queue initialised; its claim's address is
    /// read by the owner only after it was written (a loom-tracked plain
    /// write), and its first message comes through.
    #[test]
    fn loom_open_publishes_the_section_and_a_claim_its_address() {
        loom::model(|| {
            let hs = HeapSection::new(G);
            let sec = hs.sec;
            let sender = loom::thread::spawn(move || {
                if !sec.open_at(1) {
                    return None;
                }
                // Cell 1's initial sequence (1) comes from the open: seen
                // as 0, the queue would look full.
                let q = sec.ovf();
                for tag in 0..2 {
                    assert!(q.push(&MsgHdr { tag, ..Default::default() }, &ME, &[]), "an initialised queue");
                }
                let Claim::Ring(s) = sec.claim_ring(1, Section::claim_token(ME, 1), ME) else {
                    panic!("two free slots, one sender");
                };
                // SAFETY: the ring lies in the section; we claimed it.
                let mut tx = unsafe { RingTx::new(sec.ringctl_at(s), sec.ring_cells(s), G.ring_cells as usize) };
                assert!(tx.try_push(&MsgHdr { tag: 9, ..Default::default() }, &[]));
                Some(s)
            });
            // SAFETY: the section is closed and zeroed; the sender only
            // looks at its state until it is open.
            unsafe { sec.open(1) };
            // The owner's progress pass (progress_ep, accept_claims).
            let mut ring: Option<(u32, RingRx)> = None;
            let mut got = false;
            for _ in 0..2 {
                // SYNC: as progress_ep: pairs with claim_ring's fetch_or.
                let claimed = sec.header().claimed.load(Ordering::Acquire);
                if ring.is_none() && claimed != 0 {
                    let s = claimed.trailing_zeros();
                    assert_eq!(sec.take_claim(s, 1), Some(ME), "the address before its bit");
                    // SAFETY: the ring lies in the section; we are its consumer.
                    ring =
                        Some((s, unsafe { RingRx::new(sec.ringctl_at(s), sec.ring_cells(s), G.ring_cells as usize) }));
                }
                if let Some((_, rx)) = ring.as_mut() {
                    if !got {
                        if let Some((h, n)) = rx.peek() {
                            assert_eq!((h.tag, n), (9, 1));
                            rx.consume(n, false);
                            got = true;
                        }
                    }
                }
                loom::thread::yield_now();
            }
            let claimed_slot = sender.join().unwrap();
            // Every claim is announced, and only claims are.
            let claimed = sec.header().claimed.load(Ordering::Acquire);
            assert_eq!(claimed, claimed_slot.map_or(0, |s| 1 << s));
            if let Some(s) = claimed_slot {
                assert_eq!(sec.claimant(s), ME);
            }
            drop(hs);
        });
    }

    /// A sender claims a slot while the owner closes the section, punches
    /// its pages and reopens it at generation 2. Once the reopen is over
    /// (and the sender knows it: a model flag stands for time passing), the
    /// sender's claim is dead: its check before a push (the owner word, as
    /// `Peer::chan_valid` reads it) fails, wherever its claim landed, and
    /// still fails after the same sender claims a slot of generation 2.
    #[test]
    fn loom_a_claim_against_close_and_reopen_dies() {
        loom::model(|| {
            let hs = HeapSection::new(G);
            let sec = hs.sec;
            // SAFETY: fresh section, no peer yet.
            unsafe { sec.open(1) };
            let reopened = loom::sync::Arc::new(loom::sync::atomic::AtomicBool::new(false));
            let r2 = reopened.clone();
            let sender = loom::thread::spawn(move || {
                let token = Section::claim_token(ME, 1);
                let claim = if sec.open_at(1) { Some(sec.claim_ring(1, token, ME)) } else { None };
                // SYNC: pairs with the owner's release store of the flag.
                while !r2.load(Ordering::Acquire) {
                    loom::thread::yield_now();
                }
                if let Some(Claim::Ring(s)) = claim {
                    let owner = &sec.slot(s).owner;
                    assert_ne!(owner.load(Ordering::Relaxed), token, "a generation-1 claim outlived the reopen");
                    // The same sender connects to the new endpoint.
                    let Claim::Ring(_) = sec.claim_ring(2, Section::claim_token(ME, 2), ME) else {
                        panic!("a free slot at generation 2");
                    };
                    assert_ne!(owner.load(Ordering::Relaxed), token, "the generation-1 claim came back to life");
                }
            });
            sec.close();
            punch(&sec);
            // SAFETY: closed and punched.
            unsafe { sec.open(2) };
            // SYNC: publishes the reopen to the sender's acquire (time passing).
            reopened.store(true, Ordering::Release);
            sender.join().unwrap();
            drop(hs);
        });
    }

    /// A section of one slot: a second claim can only be of the same slot.
    const G1: EpGeometry = EpGeometry { n_slots: 1, ..HeapSection::SMALL };

    /// The owner's pass over the claims, as Inbound::new_claims and
    /// accept_claims make it: each slot whose bit is set and not taken yet
    /// is looked at (`taken` holds the slots taken, `out` their claimants).
    fn take_claims(sec: &Section, generation: u32, taken: &mut u64, out: &mut Vec<Address>) {
        // SYNC: as Inbound::new_claims: pairs with claim_ring's fetch_or.
        let mut new = sec.header().claimed.load(Ordering::Acquire) & !*taken;
        while new != 0 {
            let s = new.trailing_zeros();
            new &= new - 1;
            if let Some(a) = sec.take_claim(s, generation) {
                *taken |= 1 << s;
                out.push(a);
            }
        }
    }

    /// A sender that found the section open at generation 1 claims a slot
    /// while the owner closes the section, punches its pages, reopens it at
    /// generation 2 and runs its progress pass, before and after the
    /// sender is done: wherever the claim's steps (owner word, address,
    /// announcement, `claimed` bit) fall around the reopen, the endpoint at
    /// generation 2 takes no claim, its pass leaves no bit set, and the
    /// sender finds out (its claim is Closed, or its check before a push,
    /// the owner word as `Peer::chan_valid` reads it, fails). The slot is
    /// then free for a sender of generation 2, whose claim is taken.
    #[test]
    fn loom_the_reopened_endpoint_takes_no_stale_claim() {
        loom::model(|| {
            let hs = HeapSection::new(G1);
            let sec = hs.sec;
            // SAFETY: fresh section, no peer yet.
            unsafe { sec.open(1) };
            let sender = loom::thread::spawn(move || {
                let token = Section::claim_token(ME, 1);
                if !sec.open_at(1) {
                    return None;
                }
                match sec.claim_ring(1, token, ME) {
                    Claim::Ring(s) => Some((s, token)),
                    _ => None,
                }
            });
            sec.close();
            punch(&sec);
            // SAFETY: closed and punched.
            unsafe { sec.open(2) };
            let (mut taken, mut who) = (0, Vec::new());
            take_claims(&sec, 2, &mut taken, &mut who);
            assert!(who.is_empty(), "the endpoint at generation 2 took a claim made for generation 1");
            let ring = sender.join().unwrap();
            take_claims(&sec, 2, &mut taken, &mut who);
            assert!(who.is_empty(), "the endpoint at generation 2 took a claim made for generation 1");
            let claimed = sec.header().claimed.load(Ordering::Acquire);
            assert_eq!(claimed, 0, "the endpoint at generation 2 kept a bit of a claim made for generation 1");
            if let Some((s, token)) = ring {
                assert_ne!(
                    sec.slot(s).owner.load(Ordering::Relaxed),
                    token,
                    "a generation-1 claim outlived the reopen"
                );
            }
            // Another sender connects to the new endpoint: the slot is free.
            let other = Address { token: 0x99, ..ME };
            assert_eq!(sec.claim_ring(2, Section::claim_token(other, 2), other), Claim::Ring(0));
            take_claims(&sec, 2, &mut taken, &mut who);
            assert_eq!(who, [other]);
            drop(hs);
        });
    }

    /// A bit that a stale claim left set (its slot freed by the punch) is
    /// dropped by the owner's pass while a sender of the current generation
    /// claims that slot: the new claim is never lost (taken by the pass
    /// running alongside, or by the next one once the sender is done).
    #[test]
    fn loom_a_dropped_stale_bit_hides_no_claim() {
        loom::model(|| {
            let hs = HeapSection::new(G1);
            let sec = hs.sec;
            // SAFETY: fresh section, no peer yet.
            unsafe { sec.open(2) };
            // A stale sender's late bit, its owner word freed by the punch.
            sec.header().claimed.fetch_or(1, Ordering::Relaxed);
            let sender = loom::thread::spawn(move || sec.claim_ring(2, Section::claim_token(ME, 2), ME));
            let (mut taken, mut who) = (0, Vec::new());
            take_claims(&sec, 2, &mut taken, &mut who);
            assert_eq!(sender.join().unwrap(), Claim::Ring(0));
            take_claims(&sec, 2, &mut taken, &mut who);
            assert_eq!(who, [ME], "the claim is taken, once");
            drop(hs);
        });
    }
}
