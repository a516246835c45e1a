//! Domains (`fi_domain`) and memory registration (`fi_mr_reg` and
//! friends).
//!
//! FI_THREAD_DOMAIN (fi_domain(3): the application serialises its calls,
//! which may come from different threads one at a time) is served by a
//! library domain in `Threading::Serialized` (no lock, no owner thread);
//! every other level, and any domain with auto progress (whose thread
//! enters the domain beside the application), by `Threading::Safe`.
//!
//! Registration: shmfab needs none to send from or receive into any
//! buffer (single copy reads any address of the peer). With provider keys
//! (FI_MR_PROV_KEY; or FI_MR_BASIC before API 1.5, which offers no RMA:
//! its remote addresses would be virtual addresses) a registration is the
//! library's (`shmfab::Domain::mr_regv`): its key is the library's, peers
//! reach the memory with it at offsets from the start, and `fi_mr_bind`
//! binds remote-event counters to it. With the application's keys, which
//! the library cannot take, a registration records the range, the access
//! and the key (kept unique in the domain) and serves local descriptors
//! only. Raw keys (`fi_mr_raw_attr`, `fi_mr_map_raw`) are a key's 8
//! bytes with base address 0, for either kind.
//!
//! `fi_close` of a library registration is `-FI_EBUSY` when a peer's
//! access begun before it (an initiator stopped or dead in the middle of
//! it) outlasts the library's drain limit: the key is refused to new
//! accesses already, but that access may still write the memory; the
//! registration stays open for another `fi_close`, which waits again (see
//! `shmfab::MemoryRegion::close`). Only a close that returns 0 means that
//! no peer touches the memory any more.

use crate::sys;
use crate::util::{self, nb4, nb5, no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EBUSY, EINVAL};
use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// A domain.
#[repr(C)]
pub struct Domain {
    /// What the application holds.
    pub fid: sys::fid_domain,
    fabric: *const crate::fabric::Fabric,
    /// The library's domain.
    pub dom: shmfab::Domain,
    /// Objects open from it (close is `-FI_EBUSY` while any is).
    pub refs: AtomicUsize,
    /// The API version the fabric was opened with (error data rules
    /// changed at 1.5).
    pub api_version: u32,
    /// The info's capabilities (what endpoints may ask for).
    pub caps: u64,
    /// Registration keys are chosen by the provider (FI_MR_BASIC before
    /// API 1.5, FI_MR_PROV_KEY after), else by the application.
    prov_keys: bool,
    /// The next provider-chosen key.
    next_key: AtomicU64,
    /// Keys of the live registrations.
    keys: Mutex<HashSet<u64>>,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(bind),
    control: Some(control),
    ops_open: Some(crate::ext::domain_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static OPS: sys::fi_ops_domain = sys::fi_ops_domain {
    size: std::mem::size_of::<sys::fi_ops_domain>(),
    av_open: Some(crate::av::open),
    cq_open: Some(crate::cq::open),
    endpoint: Some(crate::ep::open),
    scalable_ep: Some(nb4),
    cntr_open: Some(crate::cntr::open),
    poll_open: Some(crate::poll::open),
    stx_ctx: Some(nb4),
    srx_ctx: Some(crate::srx::open),
    query_atomic: Some(crate::atomic::query_atomic),
    query_collective: Some(crate::coll::query_collective),
    endpoint2: Some(nb5),
};

static MR_OPS: sys::fi_ops_mr = sys::fi_ops_mr {
    size: std::mem::size_of::<sys::fi_ops_mr>(),
    reg: Some(mr_reg),
    regv: Some(mr_regv),
    regattr: Some(mr_regattr),
};

/// The domain behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Domain> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_DOMAIN, &FI_OPS) }
}

/// `fi_domain`.
///
/// # Safety
/// libfabric's contract: `fabric` a live fid, `info` valid, `out` valid
/// for a write.
pub unsafe extern "C" fn open(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    out: *mut *mut sys::fid_domain,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract.
    let (Some(f), Some(i)) = (unsafe { crate::fabric::of(fabric) }, unsafe { info.as_ref() }) else {
        return EINVAL;
    };
    if out.is_null() {
        return EINVAL;
    }
    let version = f.fid.api_version;
    // SAFETY: info is valid with valid or null attributes.
    if let Err(e) = unsafe { crate::info::recheck(version, i) } {
        return e;
    }
    // SAFETY: as above.
    let d = unsafe { i.domain_attr.as_ref() };
    let mr_mode = d.map_or(0, |d| d.mr_mode);
    let prov_keys = if version < crate::info::fi_version(1, 5) {
        mr_mode == sys::FI_MR_BASIC as c_int
    } else {
        mr_mode as u64 & sys::FI_MR_PROV_KEY != 0
    };
    // FI_THREAD_DOMAIN (fi_domain(3)): the application serialises every
    // access to the domain and its objects, from whichever thread: the
    // library's Serialized mode, no lock per call. Every other level lets
    // threads in at once (per fid, per endpoint, per completion context,
    // or anywhere), and so does the auto-progress thread: a locked domain.
    let auto = d.is_some_and(|d| d.data_progress == sys::FI_PROGRESS_AUTO);
    let serialized = !auto && d.is_some_and(|d| d.threading == sys::FI_THREAD_DOMAIN);
    let opened = if serialized {
        // SAFETY: the application asked for FI_THREAD_DOMAIN, which obliges
        // it to serialise all calls on the domain and its objects; the
        // provider starts no thread that calls into such a domain (no auto
        // progress here; the library's fd bridge does not enter it).
        unsafe { f.fabric.domain_serialized() }
    } else {
        f.fabric.domain_with(shmfab::Threading::Safe)
    };
    let dom = match opened {
        Ok(d) => d,
        Err(e) => return util::err(e, sys::FI_LOG_DOMAIN, "fi_domain"),
    };
    // FI_RM_ENABLED: the library's resource management, set before any
    // CQ opens (fi_domain(3)): a send whose completion would not fit its
    // CQ fails with -FI_EAGAIN, and no CQ overruns.
    if d.is_some_and(|d| d.resource_mgmt == sys::FI_RM_ENABLED) {
        if let Err(e) = dom.set_resource_mgmt(true) {
            return util::err(e, sys::FI_LOG_DOMAIN, "fi_domain: FI_RM_ENABLED");
        }
    }
    if auto {
        if let Err(e) = dom.start_progress_thread() {
            return util::err(e, sys::FI_LOG_DOMAIN, "fi_domain: FI_PROGRESS_AUTO");
        }
    }
    f.refs.fetch_add(1, Relaxed);
    let b = Box::new(Domain {
        fid: sys::fid_domain {
            fid: util::fid(sys::FI_CLASS_DOMAIN, context, &FI_OPS),
            ops: util::ops(&OPS),
            mr: util::ops(&MR_OPS),
        },
        fabric: f,
        dom,
        refs: AtomicUsize::new(0),
        api_version: version,
        caps: if i.caps == 0 { crate::info::CAPS } else { i.caps },
        prov_keys,
        next_key: AtomicU64::new(1),
        keys: Mutex::new(HashSet::new()),
    });
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// `close`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(d) = (unsafe { of(fid) }) else { return EINVAL };
    if d.refs.load(Relaxed) != 0 {
        return EBUSY;
    }
    // SAFETY: the fabric outlives its domains (its close is refused while
    // refs > 0).
    unsafe { &*d.fabric }.refs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `open`, no children; the application
    // gives it up.
    drop(unsafe { Box::from_raw((d as *const Domain).cast_mut()) });
    0
}

/// `fi_domain_bind`: an EQ of the same fabric, for the domain's
/// asynchronous events (fi_domain(3)). This domain raises none (nothing in
/// it fails asynchronously; registration is synchronous), so the EQ is
/// accepted and stays silent. FI_REG_MR (registrations completed through
/// the EQ): `-FI_ENOSYS`, as they complete at once.
///
/// # Safety
/// libfabric's contract: the fids are live.
unsafe extern "C" fn bind(fid: *mut sys::fid, bfid: *mut sys::fid, flags: u64) -> c_int {
    // SAFETY: libfabric passes our fid; bfid is a live fid (fi_domain(3)).
    let (Some(d), Some(eq)) = (unsafe { of(fid) }, unsafe { crate::eq::of(bfid) }) else { return EINVAL };
    if !std::ptr::eq(d.fabric, eq.fabric) {
        return EINVAL;
    }
    if flags & sys::FI_REG_MR != 0 {
        return util::ENOSYS;
    }
    if flags != 0 {
        return EBADFLAGS;
    }
    0
}

/// Bytes of a raw key (`fi_mr_raw_attr`): the key, little-endian; the
/// same as `domain_attr.mr_key_size`.
const RAW_KEY_SIZE: usize = 8;

/// `fi_control` on a domain: `fi_mr_map_raw` (a raw key of
/// `fi_mr_raw_attr` back to the key: its 8 bytes; base address 0, as
/// remote addresses are offsets) and `fi_mr_unmap_key` (nothing to
/// release: a mapped key is the key). fi_mr(3): both may be used with any
/// valid key, whether or not FI_MR_RAW is set (it is not).
///
/// # Safety
/// libfabric's contract: the fid is live, `arg` as the command says.
unsafe extern "C" fn control(fid: *mut sys::fid, command: c_int, arg: *mut c_void) -> c_int {
    // The deferred work queue (fi_trigger(3)); FI_FLUSH_WORK takes a
    // null argument.
    if matches!(command as u32, sys::FI_QUEUE_WORK | sys::FI_CANCEL_WORK | sys::FI_FLUSH_WORK) {
        // SAFETY: as given to us.
        return unsafe { crate::trigger::domain_control(fid, command, arg) };
    }
    // SAFETY: libfabric passes our fid.
    if unsafe { of(fid) }.is_none() || arg.is_null() {
        return EINVAL;
    }
    match command as u32 {
        sys::FI_MAP_RAW_MR => {
            // SAFETY: arg is a struct fi_mr_map_raw (fi_domain.h).
            let m = unsafe { &*arg.cast::<sys::fi_mr_map_raw>() };
            if m.flags != 0 {
                return EBADFLAGS;
            }
            if m.key_size != RAW_KEY_SIZE || m.raw_key.is_null() || m.key.is_null() || m.base_addr != 0 {
                return EINVAL;
            }
            let mut b = [0u8; RAW_KEY_SIZE];
            // SAFETY: raw_key holds key_size (checked: 8) bytes; key is
            // valid for a write (fi_mr(3)).
            unsafe {
                std::ptr::copy_nonoverlapping(m.raw_key, b.as_mut_ptr(), RAW_KEY_SIZE);
                *m.key = u64::from_le_bytes(b);
            }
            0
        }
        // The key to unmap (arg) was read above as non-null: nothing held.
        sys::FI_UNMAP_KEY => 0,
        _ => util::ENOSYS,
    }
}

/// `fi_control` on a registration: `fi_mr_raw_attr` (its key as 8 raw
/// bytes, base address 0; fi_mr(3): "safe to use with any memory region")
/// and `fi_mr_enable` (registrations are enabled when made, no
/// FI_MR_RMA_EVENT mode bit: nothing to do).
///
/// # Safety
/// libfabric's contract: the fid is live, `arg` as the command says.
unsafe extern "C" fn mr_control(fid: *mut sys::fid, command: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(m) = (unsafe { util::ours::<Mr>(fid, sys::FI_CLASS_MR, &MR_FI_OPS) }) else { return EINVAL };
    match command as u32 {
        sys::FI_ENABLE => 0,
        sys::FI_GET_RAW_MR => {
            // SAFETY: arg is null or a struct fi_mr_raw_attr (fi_domain.h).
            let Some(a) = (unsafe { arg.cast::<sys::fi_mr_raw_attr>().as_ref() }) else { return EINVAL };
            if a.flags != 0 {
                return EBADFLAGS;
            }
            if a.key_size.is_null() || a.base_addr.is_null() {
                return EINVAL;
            }
            // SAFETY: key_size and base_addr are valid for reads and
            // writes (fi_mr(3)); raw_key holds the *key_size bytes given.
            unsafe {
                let room = *a.key_size;
                *a.key_size = RAW_KEY_SIZE;
                if room < RAW_KEY_SIZE || a.raw_key.is_null() {
                    return util::ETOOSMALL;
                }
                std::ptr::copy_nonoverlapping(m.fid.key.to_le_bytes().as_ptr(), a.raw_key, RAW_KEY_SIZE);
                *a.base_addr = 0;
            }
            0
        }
        _ => util::ENOSYS,
    }
}

/// A memory registration.
#[repr(C)]
pub struct Mr {
    /// What the application holds (`fi_mr_key`, `fi_mr_desc`).
    pub fid: sys::fid_mr,
    dom: *const Domain,
    /// Start and length of the registered range.
    pub range: (usize, usize),
    /// FI_SEND, FI_RECV, FI_READ, FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE.
    pub access: u64,
    /// The library's registration (provider keys), else None.
    pub lib: Option<shmfab::MemoryRegion>,
}

static MR_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(mr_close),
    bind: Some(mr_bind),
    control: Some(mr_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

/// The access bits a registration takes.
pub(crate) const ACCESS: u64 =
    sys::FI_SEND | sys::FI_RECV | sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE;

/// Registers one range.
///
/// # Safety
/// `fid` a live fid; `out` valid for a write.
#[allow(clippy::too_many_arguments)]
unsafe fn reg(
    fid: *mut sys::fid,
    segs: &[(usize, usize)],
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    out: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: caller's contract.
    let Some(d) = (unsafe { of(fid) }) else { return EINVAL };
    if out.is_null() || access & !ACCESS != 0 {
        return EINVAL;
    }
    if flags & !sys::FI_RMA_EVENT != 0 {
        return EBADFLAGS;
    }
    // fi_mr(3): "len: Must be > 0"; "offset: reserved for future use and
    // must be 0" (remote addresses are offsets from the registration's
    // start either way: no FI_MR_VIRT_ADDR).
    if offset != 0 || segs.iter().map(|s| s.1).sum::<usize>() == 0 {
        return EINVAL;
    }
    let range = (segs[0].0, segs.iter().map(|s| s.1).sum::<usize>());
    if d.prov_keys {
        let v: Vec<(*mut u8, usize)> = segs.iter().map(|&(p, l)| (p as *mut u8, l)).collect();
        // SAFETY: fi_mr(3): the application keeps the memory valid until it
        // closes the registration, and lets peers with the key access it as
        // `access` allows.
        let lib = match unsafe { d.dom.mr_regv(&v, access) } {
            Ok(m) => m,
            Err(e) => return util::err(e, sys::FI_LOG_MR, "fi_mr_reg"),
        };
        // SAFETY: out is valid for a write (checked).
        unsafe { *out = lib_mr(d, lib, range, access, context) };
        return 0;
    }
    if segs.len() != 1 {
        // The application's keys: one segment (mr_iov_limit).
        return EINVAL;
    }
    let mut keys = d.keys.lock().unwrap_or_else(|p| p.into_inner());
    let key = if d.prov_keys {
        loop {
            let k = d.next_key.fetch_add(1, Relaxed);
            if !keys.contains(&k) {
                break k;
            }
        }
    } else {
        requested_key
    };
    if !keys.insert(key) {
        return -(sys::FI_ENOKEY as c_int);
    }
    drop(keys);
    d.refs.fetch_add(1, Relaxed);
    let mut b = Box::new(Mr {
        fid: sys::fid_mr { fid: util::fid(sys::FI_CLASS_MR, context, &MR_FI_OPS), mem_desc: std::ptr::null_mut(), key },
        dom: d,
        range,
        access,
        lib: None,
    });
    // The descriptor applications pass back with their buffers: the
    // registration itself (shmfab's calls ignore descriptors).
    b.fid.mem_desc = (&*b as *const Mr).cast_mut().cast();
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// A registration of the library's (`lib`, covering `range`) as the
/// `fid_mr` the application holds; the domain counts it among its open
/// objects until `fi_close`.
pub(crate) fn lib_mr(
    d: &Domain,
    lib: shmfab::MemoryRegion,
    range: (usize, usize),
    access: u64,
    context: *mut c_void,
) -> *mut sys::fid_mr {
    d.refs.fetch_add(1, Relaxed);
    let key = lib.key();
    let mut b = Box::new(Mr {
        fid: sys::fid_mr { fid: util::fid(sys::FI_CLASS_MR, context, &MR_FI_OPS), mem_desc: std::ptr::null_mut(), key },
        dom: d,
        range,
        access,
        lib: Some(lib),
    });
    // The descriptor applications pass back with their buffers: the
    // registration itself (shmfab's calls ignore descriptors).
    b.fid.mem_desc = (&*b as *const Mr).cast_mut().cast();
    &mut Box::leak(b).fid
}

/// Whether registrations of this domain are the library's (provider
/// keys): only those can be shared-heap memory (`crate::ext`).
pub(crate) fn has_prov_keys(d: &Domain) -> bool {
    d.prov_keys
}

#[allow(clippy::too_many_arguments)]
/// `mr_reg`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn mr_reg(
    fid: *mut sys::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    out: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract, passed on.
    unsafe { reg(fid, &[(buf as usize, len)], access, offset, requested_key, flags, out, context) }
}

#[allow(clippy::too_many_arguments)]
/// `mr_regv`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn mr_regv(
    fid: *mut sys::fid,
    iov: *const sys::iovec,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    out: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: iov holds count entries (fi_mr(3)).
    let Some(segs) = (unsafe { segments(iov, count) }) else { return EINVAL };
    // SAFETY: libfabric's contract, passed on.
    unsafe { reg(fid, &segs, access, offset, requested_key, flags, out, context) }
}

/// The segments of an iov array of `count` (1 to the library's limit,
/// `crate::info::MR_IOV_LIMIT`) entries.
///
/// # Safety
/// `iov` null or valid for `count` entries.
unsafe fn segments(iov: *const sys::iovec, count: usize) -> Option<Vec<(usize, usize)>> {
    if count == 0 || count > crate::info::MR_IOV_LIMIT || iov.is_null() {
        return None;
    }
    // SAFETY: caller's contract.
    let v = unsafe { std::slice::from_raw_parts(iov, count) };
    Some(v.iter().map(|s| (s.iov_base as usize, s.iov_len)).collect())
}

/// `mr_regattr`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn mr_regattr(
    fid: *mut sys::fid,
    attr: *const sys::fi_mr_attr,
    flags: u64,
    out: *mut *mut sys::fid_mr,
) -> c_int {
    // SAFETY: attr is null or valid (fi_mr(3)).
    let Some(a) = (unsafe { attr.as_ref() }) else { return EINVAL };
    if a.iface != sys::FI_HMEM_SYSTEM || a.auth_key_size != 0 {
        // Device memory and authorization keys: not offered (no FI_HMEM).
        return util::ENOSYS;
    }
    // SAFETY: mr_iov holds iov_count entries (fi_mr(3)).
    let Some(segs) = (unsafe { segments(a.mr_iov, a.iov_count) }) else { return EINVAL };
    // SAFETY: libfabric's contract, passed on.
    unsafe { reg(fid, &segs, a.access, a.offset, a.requested_key, flags, out, a.context) }
}

/// `fi_mr_bind`: a counter of the same domain counts the remote
/// operations that land in the registration (FI_REMOTE_WRITE: writes and
/// atomics; FI_REMOTE_READ: reads and fetching atomics), through the
/// library's `MemoryRegion::bind_counter`. Registrations with the
/// application's keys are no library registration: `-FI_ENOSYS`.
///
/// # Safety
/// libfabric's contract: the fids are live.
unsafe extern "C" fn mr_bind(fid: *mut sys::fid, bfid: *mut sys::fid, flags: u64) -> c_int {
    // SAFETY: libfabric passes our fid; bfid a live fid.
    let Some(m) = (unsafe { util::ours::<Mr>(fid, sys::FI_CLASS_MR, &MR_FI_OPS) }) else { return EINVAL };
    // SAFETY: as above.
    let Some(c) = (unsafe { crate::cntr::of(bfid) }) else { return EINVAL };
    let Some(lib) = m.lib.as_ref() else {
        util::log(
            sys::FI_LOG_WARN,
            sys::FI_LOG_MR,
            "fi_mr_bind: only registrations with provider keys (FI_MR_PROV_KEY) count remote events",
        );
        return util::ENOSYS;
    };
    match lib.bind_counter(&c.cntr, flags) {
        Ok(()) => 0,
        Err(e) => util::err(e, sys::FI_LOG_MR, "fi_mr_bind"),
    }
}

/// `mr_close`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn mr_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(m) = (unsafe { util::ours::<Mr>(fid, sys::FI_CLASS_MR, &MR_FI_OPS) }) else {
        return EINVAL;
    };
    // SAFETY: the domain outlives its registrations (refs).
    let d = unsafe { &*m.dom };
    let mp = (m as *const Mr).cast_mut();
    // SAFETY: made by Box::leak in `reg`; fi_close excludes other calls on
    // the registration (libfabric's contract).
    if let Some(lib) = unsafe { (*mp).lib.as_mut() } {
        if let Err(e) = lib.close() {
            if e.kind() == shmfab::ErrorKind::Busy {
                // A peer's access begun before the close outlasted the
                // library's drain limit: the key is refused already, the
                // memory may still be written; the registration stays
                // the application's to close again (fi_mr(3): -FI_EBUSY
                // while resources are still associated with it).
                return util::err(e, sys::FI_LOG_MR, "fi_close(mr)");
            }
        }
    }
    if m.lib.is_none() {
        d.keys.lock().unwrap_or_else(|p| p.into_inner()).remove(&m.fid.key);
    }
    d.refs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `reg`; the application gives it up.
    drop(unsafe { Box::from_raw((m as *const Mr).cast_mut()) });
    0
}
