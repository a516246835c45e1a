//! Collectives (fi_collective(3), fi_av_set(3)) over the library's
//! [`shmfab::CollGroup`]: AV sets, `fi_join_collective`, the collective
//! calls on the endpoint's `fi_ops_collective`, and
//! `fi_query_collective` on the domain.
//!
//! **Capability.** FI_COLLECTIVE is granted when the hints ask for it
//! (and then in `tx_attr->caps` too); it is not in the default
//! capabilities (`info::CAPS_ON_REQUEST`): the join uses tagged messages
//! in the reserved tag space `shmfab::coll::JOIN_TAG` (an application's
//! wildcard tagged receive posted during a join could take them).
//!
//! **AV sets** are local lists of fi_addrs of one AV: from an attribute
//! (empty with `start_addr` = `end_addr` = FI_ADDR_NOTAVAIL, or
//! `start_addr + i * stride` up to `end_addr`, inclusive, the valid
//! addresses of that range, at most `count` of them when `count` is not
//! 0; FI_UNIVERSE: every valid address of the AV), insert (appends; an
//! address already there or not in the AV is `-FI_EINVAL`), remove (not
//! a member: `-FI_EINVAL`), union (appends what `src` has that `dst`
//! lacks), intersect, diff (order kept), addr (a collective address naming
//! the set, valid for `fi_join_collective` with that set). Communication
//! keys and FI_SCATTER_SET / FI_GATHER_SET are `-FI_EOPNOTSUPP`. An AV
//! cannot be closed while sets of it are open (`-FI_EBUSY`).
//!
//! **Join.** `fi_join_collective(ep, coll_addr, set, ...)` needs the set
//! (of the AV bound to `ep`, `ep` among its members, every member listing
//! the members in the same order), `coll_addr` the set's address or
//! FI_ADDR_NOTAVAIL, an EQ bound to `ep` (else `-FI_ENOEQ`) and a CQ bound
//! for receives (the key exchange is read from it). It is provider
//! managed and **blocks until every member joined** (at most 60 s): when
//! it returns 0 the group is formed, and FI_JOIN_COMPLETE (an
//! `fi_eq_entry` with the `fid_mc` and the context) is already on the EQ.
//! A failed join returns its error and makes nothing. Completions of other
//! operations that the join read from the receive CQ meanwhile are given
//! back on that CQ (without source address). `fi_mc_addr` is the group's
//! address for the collective calls. The key exchange sends one message
//! to each other member, which the counter bound with FI_SEND counts (as
//! it counts every send). `fi_close` on the mc leaves the group
//! (its operations not completed are dropped without completions);
//! closing the endpoint is `-FI_EBUSY` while its groups are open.
//!
//! **Calls.** fi_barrier, fi_barrier2, fi_broadcast, fi_allreduce,
//! fi_reduce, fi_allgather, fi_reduce_scatter, fi_alltoall. `count`
//! always counts the elements of `buf`: allgather's `result` holds
//! members × `count`; reduce_scatter's `buf` holds members × block and
//! `result` one block (`count` / members); alltoall's `buf` and `result`
//! hold members blocks of `count` / members. Reductions: FI_SUM, FI_PROD,
//! FI_MIN, FI_MAX on the 8 integer types, FI_FLOAT and FI_DOUBLE; FI_BOR,
//! FI_BAND, FI_BXOR on the integers; anything else (logical ops, complex
//! and long double types, FI_ATOMIC_*) is `-FI_EOPNOTSUPP`. Broadcast,
//! allgather and alltoall move any non-void datatype. fi_scatter,
//! fi_gather and fi_collective_msg are `-FI_ENOSYS`. `desc` is ignored
//! (no registration is needed). The send buffer is copied at the call;
//! the result buffer is written when the operation completes. One
//! collective per group is in flight: a call while the previous one has
//! not completed is `-FI_EAGAIN` (progress the CQ and retry). A buffer
//! larger than the group's slots (`SHMFAB_COLL_SLOT_BYTES`, 256 KiB by
//! default: the vector of a reduction or broadcast, an allgather's result
//! or an alltoall's buffer may be half of that) is `-FI_EMSGSIZE`.
//!
//! **Completion.** An entry on the endpoint's transmit CQ with flags
//! FI_COLLECTIVE and the call's context (with FI_SELECTIVE_COMPLETION only
//! when the flags, or for fi_barrier the endpoint's default flags, have
//! FI_COMPLETION); the counter bound with FI_SEND is counted by one, by
//! the schedule itself. The CQs and counter are those bound when the
//! group was joined (bind them first); without a transmit CQ only the
//! counter tells. A group that broke (a member died, a write
//! failed) gives an error entry (FI_EIO) for each of its operations not
//! completed, and counts the counter's error value. Progress: the library
//! fires the schedule's deferred work in any progress pass (or its
//! auto-progress thread); a read of the CQ drives progress and then finds
//! the completed operations (`CollGroup::test`), so the normal read path
//! (read, readfrom, sread, readerr) reports them.
//!
//! **Query.** `fi_query_collective` answers 0 for what the calls above do
//! (barrier: any op and datatype given are ignored; broadcast, allgather,
//! alltoall: FI_NOOP or FI_ATOMIC_WRITE on any non-void datatype; the
//! reductions: the pairs above), with `datatype_attr.size` the element
//! size, `datatype_attr.count` the most elements of half a slot, and
//! `max_members` 65536; `-FI_EOPNOTSUPP` for the rest (scatter, gather,
//! other pairs); `-FI_EINVAL` for an unknown collective.

use crate::cq::Cq;
use crate::sys;
use crate::util::{self, EBADFLAGS, EINVAL, ENOSYS};
use shmfab::{AtomicOp, AtomicType, CollAttr, CollGroup, CollOp, CqTaggedEntry};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

const EOPNOTSUPP: c_int = -(sys::FI_EOPNOTSUPP as c_int);
const EAGAIN: isize = -(sys::FI_EAGAIN as isize);
const ENOEQ: c_int = -(sys::FI_ENOEQ as c_int);
const DATA: sys::fi_log_subsys = sys::FI_LOG_EP_DATA;

/// Most members of a group (the library's limit).
const MAX_MEMBERS: usize = 1 << 16;

/// Collective addresses (of AV sets and of groups): this prefix and a
/// serial number, far from any AV handle.
const ADDR_PREFIX: u64 = 0xC0_11EC << 40;
static NEXT_ADDR: AtomicU64 = AtomicU64::new(1);

fn new_addr() -> u64 {
    ADDR_PREFIX | NEXT_ADDR.fetch_add(1, Relaxed)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------- binding

/// What is bound to an endpoint, as the collectives need it.
pub struct Bound {
    /// The AV (null until bound).
    pub av: *const crate::av::Av,
    /// The transmit CQ: collective completions.
    pub tx_cq: *const Cq,
    /// Whether it was bound with FI_SELECTIVE_COMPLETION.
    pub selective: bool,
    /// The receive CQ: the join's key exchange.
    pub rx_cq: *const Cq,
    /// The counter bound with FI_SEND.
    pub tx_cntr: *const crate::cntr::Cntr,
    /// The EQ (its `refs` counts this endpoint).
    pub eq: *const crate::eq::Eq,
}

impl Default for Bound {
    fn default() -> Self {
        Bound {
            av: std::ptr::null(),
            tx_cq: std::ptr::null(),
            selective: false,
            rx_cq: std::ptr::null(),
            tx_cntr: std::ptr::null(),
            eq: std::ptr::null(),
        }
    }
}

// SAFETY: the pointers name objects the library keeps alive while the
// endpoint is bound to them (their close is Busy) or whose `refs` count
// the endpoint (the EQ); they are read under the endpoint's mutex.
unsafe impl Send for Bound {}

/// The endpoint's bindings, locked.
pub(crate) fn bound(e: &crate::ep::Ep) -> MutexGuard<'_, Bound> {
    lock(&e.bound)
}

/// Records a CQ binding.
pub(crate) fn bind_cq(e: &crate::ep::Ep, c: &Cq, flags: u64) {
    let mut b = bound(e);
    if flags & sys::FI_TRANSMIT != 0 {
        b.tx_cq = c;
        b.selective = flags & sys::FI_SELECTIVE_COMPLETION != 0;
    }
    if flags & sys::FI_RECV != 0 {
        b.rx_cq = c;
    }
}

/// `fi_ep_bind` of an EQ: kept for the joins' FI_JOIN_COMPLETE (the EQ's
/// close is `-FI_EBUSY` until the endpoint closes). One EQ per endpoint.
pub(crate) fn bind_eq(e: &crate::ep::Ep, q: &crate::eq::Eq) -> c_int {
    let mut b = bound(e);
    if !b.eq.is_null() {
        return if std::ptr::eq(b.eq, q) { 0 } else { EINVAL };
    }
    q.refs.fetch_add(1, Relaxed);
    b.eq = q;
    0
}

/// At the endpoint's close: releases its EQ.
pub(crate) fn unbind_eq(e: &crate::ep::Ep) {
    let b = bound(e);
    // SAFETY: `refs` kept the EQ open while it was bound.
    if let Some(q) = unsafe { b.eq.as_ref() } {
        q.refs.fetch_sub(1, Relaxed);
    }
}

// ---------------------------------------------------------------- datatypes

/// Bytes of an element of `dt` (None for FI_VOID and unknown values).
fn dt_size(dt: sys::fi_datatype) -> Option<usize> {
    Some(match dt {
        sys::FI_INT8 | sys::FI_UINT8 => 1,
        sys::FI_INT16 | sys::FI_UINT16 => 2,
        sys::FI_INT32 | sys::FI_UINT32 | sys::FI_FLOAT => 4,
        sys::FI_INT64 | sys::FI_UINT64 | sys::FI_DOUBLE | sys::FI_FLOAT_COMPLEX => 8,
        sys::FI_DOUBLE_COMPLEX | sys::FI_LONG_DOUBLE | sys::FI_INT128 | sys::FI_UINT128 => 16,
        sys::FI_LONG_DOUBLE_COMPLEX => 32,
        _ => return None,
    })
}

/// A reduction the library computes, as its types.
fn reduction(dt: sys::fi_datatype, op: sys::fi_op) -> Option<(AtomicType, AtomicOp)> {
    let (t, o) = crate::atomic::map(dt, op)?;
    (o != AtomicOp::Write && shmfab::coll::reduce::supported(t, o)).then_some((t, o))
}

/// Bytes of each group's slot region (`SHMFAB_COLL_SLOT_BYTES`, 4 KiB to
/// 1 GiB, k/m/g suffixes as every `SHMFAB_*` size); a value set but not
/// valid is an error naming it, as for the library's variables.
fn slot_bytes() -> shmfab::Result<usize> {
    let get = |n: &str| std::env::var(n).ok();
    let v = shmfab::proto::parse_env(&get, "SHMFAB_COLL_SLOT_BYTES", 4096, 1 << 30, shmfab::proto::Rule::Any)?;
    Ok(v.unwrap_or(CollAttr::default().slot_bytes))
}

/// `fi_query_collective` (see the module's docs).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
pub unsafe extern "C" fn query_collective(
    domain: *mut sys::fid_domain,
    coll: sys::fi_collective_op,
    attr: *mut sys::fi_collective_attr,
    flags: u64,
) -> c_int {
    // SAFETY: libfabric passes our fid; attr is null or the caller's.
    let (Some(_), Some(a)) = (unsafe { crate::domain::of(domain.cast()) }, unsafe { attr.as_mut() }) else {
        return EINVAL;
    };
    if flags != 0 {
        return EBADFLAGS;
    }
    let size = match coll {
        sys::FI_BARRIER => 0,
        sys::FI_BROADCAST | sys::FI_ALLTOALL | sys::FI_ALLGATHER => {
            if a.op != sys::FI_NOOP && a.op != sys::FI_ATOMIC_WRITE {
                return EOPNOTSUPP;
            }
            match dt_size(a.datatype) {
                Some(s) => s,
                None => return EOPNOTSUPP,
            }
        }
        sys::FI_ALLREDUCE | sys::FI_REDUCE_SCATTER | sys::FI_REDUCE => match reduction(a.datatype, a.op) {
            Some((t, _)) => t.size(),
            None => return EOPNOTSUPP,
        },
        sys::FI_SCATTER | sys::FI_GATHER => return EOPNOTSUPP,
        _ => return EINVAL,
    };
    let slot = match slot_bytes() {
        Ok(s) => s,
        Err(err) => return util::err(err, sys::FI_LOG_DOMAIN, "fi_query_collective"),
    };
    a.datatype_attr.size = size;
    a.datatype_attr.count = (slot / 2).checked_div(size).unwrap_or(0);
    a.max_members = MAX_MEMBERS;
    a.mode = 0;
    0
}

// ---------------------------------------------------------------- AV sets

/// An AV set.
#[repr(C)]
pub struct AvSet {
    /// What the application holds.
    pub fid: sys::fid_av_set,
    av: *const crate::av::Av,
    members: Mutex<Vec<u64>>,
    addr: u64,
}

static SET_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(set_close),
    bind: Some(util::nb3),
    control: Some(util::nb3),
    ops_open: Some(util::no_ops_open),
    tostr: Some(util::no_tostr),
    ops_set: Some(util::no_ops_set),
};

static SET_OPS: sys::fi_ops_av_set = sys::fi_ops_av_set {
    size: std::mem::size_of::<sys::fi_ops_av_set>(),
    set_union: Some(set_union),
    intersect: Some(set_intersect),
    diff: Some(set_diff),
    insert: Some(set_insert),
    remove: Some(set_remove),
    addr: Some(set_addr),
};

/// The AV set behind a fid.
///
/// # Safety
/// `f` null or a live fid.
unsafe fn set_of<'a>(f: *const sys::fid_av_set) -> Option<&'a AvSet> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f.cast(), sys::FI_CLASS_AV_SET, &SET_FI_OPS) }
}

impl AvSet {
    fn av(&self) -> &crate::av::Av {
        // SAFETY: the AV's close is refused while its sets are open.
        unsafe { &*self.av }
    }

    fn valid(&self, a: u64) -> bool {
        self.av().av.lookup(a).is_ok()
    }
}

const SET_FLAGS: u64 = sys::FI_UNIVERSE
    | sys::FI_BARRIER_SET
    | sys::FI_BROADCAST_SET
    | sys::FI_ALLTOALL_SET
    | sys::FI_ALLREDUCE_SET
    | sys::FI_ALLGATHER_SET
    | sys::FI_REDUCE_SCATTER_SET
    | sys::FI_REDUCE_SET
    | sys::FI_SCATTER_SET
    | sys::FI_GATHER_SET;

/// `fi_av_set` (see the module's docs).
///
/// # Safety
/// libfabric's contract.
pub unsafe extern "C" fn av_set(
    av: *mut sys::fid_av,
    attr: *mut sys::fi_av_set_attr,
    set: *mut *mut sys::fid_av_set,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes our fid; attr is null or the caller's.
    let (Some(a), Some(at)) = (unsafe { crate::av::of(av.cast()) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    if set.is_null() {
        return EINVAL;
    }
    if at.flags & !SET_FLAGS != 0 {
        return EBADFLAGS;
    }
    if at.flags & (sys::FI_SCATTER_SET | sys::FI_GATHER_SET) != 0 || at.comm_key_size != 0 {
        util::log(sys::FI_LOG_WARN, sys::FI_LOG_AV, "fi_av_set: no scatter, gather or communication keys");
        return EOPNOTSUPP;
    }
    let na = util::FI_ADDR_NOTAVAIL;
    let mut members = Vec::new();
    if at.flags & sys::FI_UNIVERSE != 0 {
        if at.start_addr != na || at.end_addr != na {
            return EINVAL;
        }
        members.extend((0..a.hi.load(Relaxed)).filter(|&f| a.av.lookup(f).is_ok()));
    } else if at.start_addr == na || at.end_addr == na {
        if at.start_addr != at.end_addr || at.stride != 0 {
            return EINVAL;
        }
    } else {
        if at.end_addr < at.start_addr || at.stride == 0 {
            return EINVAL;
        }
        let n = (at.end_addr - at.start_addr) / at.stride + 1;
        if at.count != 0 && n > at.count as u64 {
            return EINVAL;
        }
        let mut f = at.start_addr;
        while f <= at.end_addr {
            if a.av.lookup(f).is_ok() {
                members.push(f);
            }
            match f.checked_add(at.stride) {
                Some(g) => f = g,
                None => break,
            }
        }
    }
    if members.len() > MAX_MEMBERS {
        return EINVAL;
    }
    a.sets.fetch_add(1, Relaxed);
    let b = Box::new(AvSet {
        fid: sys::fid_av_set { fid: util::fid(sys::FI_CLASS_AV_SET, context, &SET_FI_OPS), ops: util::ops(&SET_OPS) },
        av: a,
        members: Mutex::new(members),
        addr: new_addr(),
    });
    // SAFETY: set is valid for a write (checked).
    unsafe { *set = &mut Box::leak(b).fid };
    0
}

/// `fi_close` of an AV set.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn set_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(s) = (unsafe { set_of(fid.cast()) }) else { return EINVAL };
    s.av().sets.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `av_set`; the application gives it up.
    drop(unsafe { Box::from_raw((s as *const AvSet).cast_mut()) });
    0
}

/// Two sets of one AV: `dst`, and a copy of `src`'s members.
///
/// # Safety
/// Live fids or null.
unsafe fn pair<'a>(dst: *mut sys::fid_av_set, src: *const sys::fid_av_set) -> Result<(&'a AvSet, Vec<u64>), c_int> {
    // SAFETY: caller's contract.
    let (Some(d), Some(s)) = (unsafe { set_of(dst) }, unsafe { set_of(src) }) else { return Err(EINVAL) };
    if !std::ptr::eq(d.av, s.av) {
        return Err(EINVAL);
    }
    let v = lock(&s.members).clone();
    Ok((d, v))
}

/// `fi_av_set_union`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn set_union(dst: *mut sys::fid_av_set, src: *const sys::fid_av_set) -> c_int {
    // SAFETY: caller's contract.
    let (d, v) = match unsafe { pair(dst, src) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    let mut m = lock(&d.members);
    let add: Vec<u64> = v.into_iter().filter(|a| !m.contains(a)).collect();
    if m.len() + add.len() > MAX_MEMBERS {
        return EINVAL;
    }
    m.extend(add);
    0
}

/// `fi_av_set_intersect`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn set_intersect(dst: *mut sys::fid_av_set, src: *const sys::fid_av_set) -> c_int {
    // SAFETY: caller's contract.
    let (d, v) = match unsafe { pair(dst, src) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    lock(&d.members).retain(|a| v.contains(a));
    0
}

/// `fi_av_set_diff`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn set_diff(dst: *mut sys::fid_av_set, src: *const sys::fid_av_set) -> c_int {
    // SAFETY: caller's contract.
    let (d, v) = match unsafe { pair(dst, src) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    lock(&d.members).retain(|a| !v.contains(a));
    0
}

/// `fi_av_set_insert`: appends a valid address of the AV not yet in the
/// set.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn set_insert(set: *mut sys::fid_av_set, addr: u64) -> c_int {
    // SAFETY: caller's contract.
    let Some(s) = (unsafe { set_of(set) }) else { return EINVAL };
    if !s.valid(addr) {
        return EINVAL;
    }
    let mut m = lock(&s.members);
    if m.contains(&addr) || m.len() >= MAX_MEMBERS {
        return EINVAL;
    }
    m.push(addr);
    0
}

/// `fi_av_set_remove`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn set_remove(set: *mut sys::fid_av_set, addr: u64) -> c_int {
    // SAFETY: caller's contract.
    let Some(s) = (unsafe { set_of(set) }) else { return EINVAL };
    let mut m = lock(&s.members);
    match m.iter().position(|&a| a == addr) {
        Some(i) => {
            m.remove(i);
            0
        }
        None => EINVAL,
    }
}

/// `fi_av_set_addr`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn set_addr(set: *mut sys::fid_av_set, coll_addr: *mut u64) -> c_int {
    // SAFETY: caller's contract.
    let Some(s) = (unsafe { set_of(set) }) else { return EINVAL };
    if coll_addr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's fi_addr_t.
    unsafe { *coll_addr = s.addr };
    0
}

// ---------------------------------------------------------------- groups

/// An operation posted and not yet reported.
struct Pending {
    op: CollOp,
    ctx: usize,
    report: bool,
}

/// A joined group's state.
struct GroupState {
    /// The library's group (None once closed).
    g: Option<CollGroup<'static>>,
    pending: VecDeque<Pending>,
    last: Option<CollOp>,
}

/// A joined group, shared by its `fid_mc`, the registry and its CQ.
pub struct Group {
    addr: u64,
    members: Vec<u64>,
    ep: *const crate::ep::Ep,
    cntr: *const crate::cntr::Cntr,
    selective: bool,
    /// Whether a transmit CQ was bound at the join (else nothing polls
    /// the operations: they are not kept).
    has_cq: bool,
    st: Mutex<GroupState>,
}

// SAFETY: the library group is used under `st` only; the raw pointers
// name objects kept alive while the group is open (the endpoint's close
// is refused while its groups are; the counter is bound to it).
unsafe impl Send for Group {}
// SAFETY: as above.
unsafe impl Sync for Group {}

/// Groups open in this process.
static GROUPS: Mutex<Vec<Arc<Group>>> = Mutex::new(Vec::new());

/// An error entry of a collective.
pub struct ErrEntry {
    ctx: usize,
    err: c_int,
}

/// A CQ's side queue of collective completions.
#[derive(Default)]
pub struct CqColl {
    /// Whether anything below is there (read relaxed on every CQ read).
    active: AtomicBool,
    inner: Mutex<CqCollInner>,
}

#[derive(Default)]
struct CqCollInner {
    groups: Vec<Arc<Group>>,
    ready: VecDeque<CqTaggedEntry>,
    errs: VecDeque<ErrEntry>,
}

impl CqCollInner {
    fn busy(&self) -> bool {
        !self.groups.is_empty() || !self.ready.is_empty() || !self.errs.is_empty()
    }
}

impl CqColl {
    /// Whether collectives report on this CQ (or entries wait).
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.active.load(Relaxed)
    }

    fn with<R>(&self, f: impl FnOnce(&mut CqCollInner) -> R) -> R {
        let mut i = lock(&self.inner);
        let r = f(&mut i);
        self.active.store(i.busy(), Relaxed);
        r
    }
}

impl Group {
    /// Moves the completed operations to `ready` in order; a broken group
    /// fails every one not completed (into `errs`).
    fn poll(&self, ready: &mut VecDeque<CqTaggedEntry>, errs: &mut VecDeque<ErrEntry>) {
        let mut st = lock(&self.st);
        let GroupState { g, pending, .. } = &mut *st;
        let Some(g) = g.as_ref() else { return };
        while let Some(p) = pending.front() {
            match g.test(p.op) {
                Ok(true) => {
                    if p.report {
                        ready.push_back(CqTaggedEntry {
                            op_context: p.ctx,
                            flags: sys::FI_COLLECTIVE,
                            ..Default::default()
                        });
                    }
                    pending.pop_front();
                }
                Ok(false) => break,
                Err(e) => {
                    util::log(sys::FI_LOG_WARN, DATA, &format!("collective group failed: {e}"));
                    let err = e.errno();
                    for p in pending.drain(..) {
                        errs.push_back(ErrEntry { ctx: p.ctx, err });
                        // SAFETY: the counter stays open while bound to the
                        // endpoint, which outlives the group.
                        if let Some(c) = unsafe { self.cntr.as_ref() } {
                            let _ = c.cntr.adderr(1);
                        }
                    }
                }
            }
        }
    }
}

/// The group named `addr` joined by endpoint `e`.
fn find(e: &crate::ep::Ep, addr: u64) -> Option<Arc<Group>> {
    lock(&GROUPS).iter().find(|g| g.addr == addr && std::ptr::eq(g.ep, e)).cloned()
}

/// A multicast group's fid.
#[repr(C)]
pub struct Mc {
    /// What the application holds.
    pub fid: sys::fid_mc,
    group: Arc<Group>,
    tx_cq: *const Cq,
}

static MC_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(mc_close),
    bind: Some(util::nb3),
    control: Some(util::nb3),
    ops_open: Some(util::no_ops_open),
    tostr: Some(util::no_tostr),
    ops_set: Some(util::no_ops_set),
};

/// `fi_join` (`fi_join_collective`) on an endpoint (see the module's
/// docs).
///
/// # Safety
/// libfabric's contract.
pub unsafe extern "C" fn join(
    ep: *mut sys::fid_ep,
    addr: *const c_void,
    flags: u64,
    mc: *mut *mut sys::fid_mc,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes our fid; addr is a fi_collective_addr for
    // a collective join (fi_collective(3)).
    let Some(e) = (unsafe { crate::ep::of(ep.cast()) }) else { return EINVAL };
    if flags & sys::FI_COLLECTIVE == 0 {
        // A multicast join: shmfab has no multicast.
        return ENOSYS;
    }
    if flags & !(sys::FI_COLLECTIVE | sys::FI_SEND | sys::FI_RECV) != 0 {
        return EBADFLAGS;
    }
    // SAFETY: as above.
    let (Some(ca), false) = (unsafe { addr.cast::<sys::fi_collective_addr>().as_ref() }, mc.is_null()) else {
        return EINVAL;
    };
    // SAFETY: the set is null or a live fid (fi_collective(3)).
    let Some(set) = (unsafe { set_of(ca.set) }) else { return EINVAL };
    if ca.coll_addr != set.addr && ca.coll_addr != util::FI_ADDR_NOTAVAIL {
        return EINVAL;
    }
    let (av, rx, tx, selective, cntr, eq) = {
        let b = bound(e);
        (b.av, b.rx_cq, b.tx_cq, b.selective, b.tx_cntr, b.eq)
    };
    // SAFETY: bound objects stay open while bound (see `Bound`).
    let (Some(av), Some(rx), Some(eq)) = (unsafe { av.as_ref() }, unsafe { rx.as_ref() }, unsafe { eq.as_ref() })
    else {
        // SAFETY: as above.
        return if unsafe { eq.as_ref() }.is_none() { ENOEQ } else { EINVAL };
    };
    if !std::ptr::eq(set.av, av) {
        return EINVAL;
    }
    let members = lock(&set.members).clone();
    if members.is_empty() {
        return EINVAL;
    }
    // SAFETY: as above.
    let lib_cntr = unsafe { cntr.as_ref() }.map(|c| &c.cntr);
    // SAFETY: the library group borrows the endpoint's domain and
    // endpoint and the counter bound to it: the endpoint's close is
    // refused while this group is open (`mcs`), the domain's while the
    // endpoint is, and the counter's while it is bound to the endpoint.
    // The group is dropped in `mc_close`, before `mcs` lets them go.
    let (dom, lep, lc): (&'static shmfab::Domain, &'static shmfab::Endpoint, Option<&'static shmfab::Counter>) =
        unsafe { (&*(e.domain() as *const _), &*(&e.ep as *const _), lib_cntr.map(|c| &*(c as *const _))) };
    let attr = match slot_bytes() {
        Ok(s) => CollAttr { slot_bytes: s, ..Default::default() },
        Err(err) => return util::err(err, sys::FI_LOG_EP_CTRL, "fi_join_collective"),
    };
    let g = match CollGroup::join(dom, lep, &av.av, &rx.cq, &members, lc, attr) {
        Ok(g) => g,
        Err(err) => return util::err(err, sys::FI_LOG_EP_CTRL, "fi_join_collective"),
    };
    let other = g.take_other_completions();
    if !other.is_empty() {
        rx.coll.with(|i| i.ready.extend(other));
    }
    let group = Arc::new(Group {
        addr: new_addr(),
        members,
        ep: e,
        cntr,
        selective,
        has_cq: !tx.is_null(),
        st: Mutex::new(GroupState { g: Some(g), pending: VecDeque::new(), last: None }),
    });
    lock(&GROUPS).push(group.clone());
    // SAFETY: the transmit CQ stays open while bound (see `Bound`).
    if let Some(t) = unsafe { tx.as_ref() } {
        t.coll.with(|i| i.groups.push(group.clone()));
    }
    e.mcs.fetch_add(1, Relaxed);
    let addr = group.addr;
    let b = Box::leak(Box::new(Mc {
        fid: sys::fid_mc { fid: util::fid(sys::FI_CLASS_MC, context, &MC_FI_OPS), fi_addr: addr },
        group,
        tx_cq: tx,
    }));
    let ev = sys::fi_eq_entry { fid: &mut b.fid.fid, context, data: 0 };
    // SAFETY: plain old data, read as its bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts((&ev as *const sys::fi_eq_entry).cast::<u8>(), std::mem::size_of_val(&ev))
    };
    eq.post(sys::FI_JOIN_COMPLETE, bytes);
    // SAFETY: mc is valid for a write (checked).
    unsafe { *mc = &mut b.fid };
    0
}

/// `fi_close` of a group: leaves it; operations not completed are dropped
/// without completions.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn mc_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(m) = (unsafe { util::ours::<Mc>(fid, sys::FI_CLASS_MC, &MC_FI_OPS) }) else { return EINVAL };
    let g = &m.group;
    lock(&GROUPS).retain(|x| !Arc::ptr_eq(x, g));
    // SAFETY: the transmit CQ stays open while bound to the endpoint.
    if let Some(t) = unsafe { m.tx_cq.as_ref() } {
        t.coll.with(|i| i.groups.retain(|x| !Arc::ptr_eq(x, g)));
    }
    {
        let mut st = lock(&g.st);
        st.pending.clear();
        // Dropping the library group flushes its queued work.
        st.g = None;
    }
    // SAFETY: the endpoint outlives its groups (`mcs`).
    unsafe { &*g.ep }.mcs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `join`; the application gives it up.
    drop(unsafe { Box::from_raw((m as *const Mc).cast_mut()) });
    0
}

// ---------------------------------------------------------------- CQ side

/// Bytes of an entry of `c`'s format (every format is a prefix of the
/// tagged one).
fn entry_size(c: &Cq) -> usize {
    match c.format() {
        shmfab::CqFormat::Context => std::mem::size_of::<sys::fi_cq_entry>(),
        shmfab::CqFormat::Msg => std::mem::size_of::<sys::fi_cq_msg_entry>(),
        shmfab::CqFormat::Data => std::mem::size_of::<sys::fi_cq_data_entry>(),
        _ => std::mem::size_of::<sys::fi_cq_tagged_entry>(),
    }
}

/// A read of `c` when collectives report on it: the library's read
/// (`lib`; it drives progress), then the collectives completed since,
/// after its entries. `src` (readfrom) gets FI_ADDR_NOTAVAIL for
/// collective entries.
///
/// # Safety
/// `buf` holds `count` entries of the CQ's format, `src` null or `count`
/// addresses; `lib(buf, count, src)` reads into such arrays.
pub(crate) unsafe fn read(
    c: &Cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    lib: &mut dyn FnMut(*mut c_void, usize, *mut u64) -> isize,
) -> isize {
    if buf.is_null() {
        return EINVAL as isize;
    }
    let r = lib(buf, count, src);
    let n = r.max(0) as usize;
    if n >= count {
        return r;
    }
    let es = entry_size(c);
    let (m, errs) = c.coll.with(|i| {
        poll_all(i);
        // SAFETY: the rest of the caller's arrays (caller's contract).
        let m = unsafe {
            deliver(i, buf.cast::<u8>().add(n * es).cast(), count - n, if src.is_null() { src } else { src.add(n) }, es)
        };
        (m, !i.errs.is_empty())
    });
    match (n + m, r) {
        (0, EAGAIN) if errs => -(sys::FI_EAVAIL as isize),
        (0, r) => r,
        (t, _) => t as isize,
    }
}

fn poll_all(i: &mut CqCollInner) {
    let CqCollInner { groups, ready, errs } = i;
    for g in groups.iter() {
        g.poll(ready, errs);
    }
}

/// Writes ready entries into the caller's array.
///
/// # Safety
/// As [`read`]; `es` the CQ's entry size.
unsafe fn deliver(i: &mut CqCollInner, buf: *mut c_void, count: usize, src: *mut u64, es: usize) -> usize {
    let mut n = 0;
    while n < count {
        let Some(e) = i.ready.pop_front() else { break };
        let t = sys::fi_cq_tagged_entry {
            op_context: e.op_context as *mut c_void,
            flags: e.flags,
            len: e.len,
            buf: e.buf as *mut c_void,
            data: e.data,
            tag: e.tag,
        };
        // SAFETY: entry n of the caller's array, `es` bytes, a prefix of
        // the tagged entry (every format is).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&t as *const sys::fi_cq_tagged_entry).cast::<u8>(),
                buf.cast::<u8>().add(n * es),
                es,
            );
            if !src.is_null() {
                *src.add(n) = util::FI_ADDR_NOTAVAIL;
            }
        }
        n += 1;
    }
    n
}

/// `fi_cq_readerr` of a collective's error entry, if one waits: 1.
///
/// # Safety
/// `buf` the caller's valid error entry (its size by `api_version`).
pub(crate) unsafe fn readerr(c: &Cq, buf: *mut sys::fi_cq_err_entry, new_api: bool) -> Option<isize> {
    let e = c.coll.with(|i| i.errs.pop_front())?;
    // SAFETY: caller's contract; before API 1.5 err_data_size is not there.
    unsafe {
        let b = &mut *buf;
        b.op_context = e.ctx as *mut c_void;
        b.flags = sys::FI_COLLECTIVE;
        b.len = 0;
        b.buf = std::ptr::null_mut();
        b.data = 0;
        b.tag = 0;
        b.olen = 0;
        b.err = e.err;
        b.prov_errno = e.err;
        if new_api {
            b.err_data_size = 0;
        } else {
            b.err_data = std::ptr::null_mut();
        }
    }
    Some(1)
}

// ---------------------------------------------------------------- calls

/// Flags the collective calls take (every one holds when the operation
/// completes: the result is in place).
const CALL_FLAGS: u64 =
    sys::FI_COMPLETION | sys::FI_MORE | sys::FI_INJECT_COMPLETE | sys::FI_TRANSMIT_COMPLETE | sys::FI_DELIVERY_COMPLETE;

/// Posts a collective on the group `coll_addr` of `ep`: `f` gets the
/// library group and the member list.
///
/// # Safety
/// `ep` a live fid; `f` must uphold the library call's buffer contract
/// (the application's, by fi_collective(3)).
unsafe fn post(
    ep: *mut sys::fid_ep,
    coll_addr: u64,
    flags: u64,
    ctx: *mut c_void,
    what: &str,
    f: impl FnOnce(&CollGroup<'static>, &[u64]) -> Result<shmfab::Result<CollOp>, isize>,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { crate::ep::of(ep.cast()) }) else { return EINVAL as isize };
    if flags & !CALL_FLAGS != 0 {
        return EBADFLAGS as isize;
    }
    let Some(grp) = find(e, coll_addr) else { return EINVAL as isize };
    let mut st = lock(&grp.st);
    let GroupState { g, pending, last } = &mut *st;
    let Some(g) = g.as_ref() else { return EINVAL as isize };
    if let Some(l) = *last {
        match g.test(l) {
            Ok(true) => {}
            Ok(false) => return EAGAIN,
            Err(err) => return util::err(err, DATA, what) as isize,
        }
    }
    let op = match f(g, &grp.members) {
        Ok(Ok(op)) => op,
        Ok(Err(err)) => return util::err(err, DATA, what) as isize,
        Err(e) => return e,
    };
    *last = Some(op);
    if !grp.has_cq {
        return 0;
    }
    pending.push_back(Pending { op, ctx: ctx as usize, report: !grp.selective || flags & sys::FI_COMPLETION != 0 });
    0
}

/// `count` elements of `dt` as bytes.
fn bytes_of(count: usize, dt: sys::fi_datatype) -> Result<usize, isize> {
    let s = dt_size(dt).ok_or(EINVAL as isize)?;
    count.checked_mul(s).filter(|&b| b > 0).ok_or(EINVAL as isize)
}

/// The application's buffer of `n` bytes for reading.
///
/// # Safety
/// `p` null or valid for `n` bytes.
unsafe fn src<'a>(p: *const c_void, n: usize) -> Result<&'a [u8], isize> {
    if p.is_null() {
        return Err(EINVAL as isize);
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// The application's buffer of `n` bytes for writing (until completion).
///
/// # Safety
/// `p` null or valid for `n` bytes.
unsafe fn dst<'a>(p: *mut c_void, n: usize) -> Result<&'a mut [u8], isize> {
    if p.is_null() {
        return Err(EINVAL as isize);
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) })
}

fn root_of(members: &[u64], root: u64) -> Result<usize, isize> {
    members.iter().position(|&m| m == root).ok_or(EINVAL as isize)
}

fn red(dt: sys::fi_datatype, op: sys::fi_op) -> Result<(AtomicType, AtomicOp), isize> {
    if dt_size(dt).is_none() {
        return Err(EINVAL as isize);
    }
    reduction(dt, op).ok_or(EOPNOTSUPP as isize)
}

/// The collective ops of an endpoint.
pub static COLL_OPS: sys::fi_ops_collective = sys::fi_ops_collective {
    size: std::mem::size_of::<sys::fi_ops_collective>(),
    barrier: Some(barrier),
    broadcast: Some(broadcast),
    alltoall: Some(alltoall),
    allreduce: Some(allreduce),
    allgather: Some(allgather),
    reduce_scatter: Some(reduce_scatter),
    reduce: Some(reduce),
    scatter: Some(util::nb11),
    gather: Some(util::nb11),
    msg: Some(util::nb6),
    barrier2: Some(barrier2),
};

/// `fi_barrier` (the endpoint's default transmit flags).
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn barrier(ep: *mut sys::fid_ep, coll_addr: u64, context: *mut c_void) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { crate::ep::of(ep.cast()) }) else { return EINVAL as isize };
    let flags = e.tx_flags.load(Relaxed) & CALL_FLAGS;
    // SAFETY: as above.
    unsafe { barrier2(ep, coll_addr, flags, context) }
}

/// `fi_barrier2`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn barrier2(ep: *mut sys::fid_ep, coll_addr: u64, flags: u64, context: *mut c_void) -> isize {
    // SAFETY: no buffers.
    unsafe { post(ep, coll_addr, flags, context, "fi_barrier", |g, _| Ok(g.barrier())) }
}

/// `fi_broadcast`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn broadcast(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    count: usize,
    _desc: *mut c_void,
    coll_addr: u64,
    root_addr: u64,
    datatype: sys::fi_datatype,
    flags: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's buffer, valid until completion.
    unsafe {
        post(ep, coll_addr, flags, context, "fi_broadcast", |g, m| {
            let root = root_of(m, root_addr)?;
            let b = dst(buf, bytes_of(count, datatype)?)?;
            Ok(g.broadcast(b, root))
        })
    }
}

/// `fi_alltoall`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn alltoall(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    coll_addr: u64,
    datatype: sys::fi_datatype,
    flags: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's buffers, valid until completion.
    unsafe {
        post(ep, coll_addr, flags, context, "fi_alltoall", |g, m| {
            if count % m.len() != 0 {
                return Err(EINVAL as isize);
            }
            let n = bytes_of(count, datatype)?;
            Ok(g.alltoall(src(buf, n)?, dst(result, n)?))
        })
    }
}

/// `fi_allreduce`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn allreduce(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    coll_addr: u64,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    flags: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's buffers, valid until completion.
    unsafe {
        post(ep, coll_addr, flags, context, "fi_allreduce", |g, _| {
            let (t, o) = red(datatype, op)?;
            let n = bytes_of(count, datatype)?;
            Ok(g.allreduce(src(buf, n)?, dst(result, n)?, t, o))
        })
    }
}

/// `fi_allgather`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn allgather(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    coll_addr: u64,
    datatype: sys::fi_datatype,
    flags: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's buffers, valid until completion.
    unsafe {
        post(ep, coll_addr, flags, context, "fi_allgather", |g, m| {
            let n = bytes_of(count, datatype)?;
            let r = n.checked_mul(m.len()).ok_or(EINVAL as isize)?;
            Ok(g.allgather(src(buf, n)?, dst(result, r)?))
        })
    }
}

/// `fi_reduce_scatter`.
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn reduce_scatter(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    coll_addr: u64,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    flags: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's buffers, valid until completion.
    unsafe {
        post(ep, coll_addr, flags, context, "fi_reduce_scatter", |g, m| {
            let (t, o) = red(datatype, op)?;
            if count % m.len() != 0 {
                return Err(EINVAL as isize);
            }
            let n = bytes_of(count, datatype)?;
            Ok(g.reduce_scatter(src(buf, n)?, dst(result, n / m.len())?, t, o))
        })
    }
}

/// `fi_reduce`: `result` is read only at the root (may be null elsewhere).
///
/// # Safety
/// libfabric's contract.
unsafe extern "C" fn reduce(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    coll_addr: u64,
    root_addr: u64,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    flags: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's buffers, valid until completion.
    unsafe {
        post(ep, coll_addr, flags, context, "fi_reduce", |g, m| {
            let (t, o) = red(datatype, op)?;
            let root = root_of(m, root_addr)?;
            let n = bytes_of(count, datatype)?;
            let out: &mut [u8] = if g.rank() == root { dst(result, n)? } else { &mut [] };
            Ok(g.reduce(src(buf, n)?, out, root, t, o))
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn slot_bytes_takes_sizes_and_refuses_garbage() {
        // The only test in this binary that touches this variable.
        std::env::remove_var("SHMFAB_COLL_SLOT_BYTES");
        assert_eq!(super::slot_bytes().unwrap(), shmfab::CollAttr::default().slot_bytes);
        std::env::set_var("SHMFAB_COLL_SLOT_BYTES", "64k");
        assert_eq!(super::slot_bytes().unwrap(), 64 << 10);
        for bad in ["12x", "1024", "2g", ""] {
            std::env::set_var("SHMFAB_COLL_SLOT_BYTES", bad);
            let e = super::slot_bytes().unwrap_err();
            assert_eq!(e.kind(), shmfab::ErrorKind::Inval, "{bad:?}");
            assert!(e.to_string().contains("SHMFAB_COLL_SLOT_BYTES"), "{e}");
        }
        std::env::remove_var("SHMFAB_COLL_SLOT_BYTES");
    }
}
