//! `fi_getinfo`: what shmfab offers, checked against the application's
//! hints. Anything asked for that shmfab cannot do (or that this provider
//! has not built yet) gives `-FI_ENODATA`; the info returned never
//! advertises a capability the provider lacks.

use crate::sys;
use crate::util::{ENODATA, ENOMEM};
use std::ffi::{c_char, c_int, CStr};

/// The provider's name (`-p shmfab`).
pub const NAME: &CStr = c"shmfab";

/// Primary capabilities: untagged and tagged messages, RMA and atomics.
pub const CAPS_PRIMARY: u64 = sys::FI_MSG | sys::FI_TAGGED | sys::FI_RMA | sys::FI_ATOMIC;
/// Secondary capabilities offered.
pub const CAPS_SECONDARY: u64 = sys::FI_SEND
    | sys::FI_RECV
    | sys::FI_DIRECTED_RECV
    | sys::FI_MULTI_RECV
    | sys::FI_SOURCE
    | sys::FI_LOCAL_COMM
    | sys::FI_READ
    | sys::FI_WRITE
    | sys::FI_REMOTE_READ
    | sys::FI_REMOTE_WRITE
    | sys::FI_RMA_EVENT
    | sys::FI_TRIGGER;
/// Capabilities of one-sided operations: they need the library's
/// registrations, whose keys the provider chooses (FI_MR_PROV_KEY), and
/// remote addresses that are offsets (not offered before API 1.5, where
/// provider keys come only with FI_MR_BASIC, whose remote addresses are
/// virtual addresses).
pub const RMA_CAPS: u64 = sys::FI_RMA
    | sys::FI_ATOMIC
    | sys::FI_READ
    | sys::FI_WRITE
    | sys::FI_REMOTE_READ
    | sys::FI_REMOTE_WRITE
    | sys::FI_RMA_EVENT;

/// Whether one-sided operations can be offered under API `version` and a
/// hint's `mr_mode`: from API 1.5, when it has FI_MR_PROV_KEY (the
/// provider chooses the keys; no FI_MR_VIRT_ADDR, remote addresses are
/// offsets). Never before 1.5: FI_MR_BASIC, the only mode with provider
/// keys then, means virtual addresses as remote addresses (FI_MR_BASIC =
/// FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY), which shmfab
/// would take for offsets.
pub fn rma_allowed(version: u32, mr_mode: c_int) -> bool {
    version >= fi_version(1, 5) && mr_mode as u64 & sys::FI_MR_PROV_KEY != 0
}
/// The capabilities offered by default (hints naming none).
pub const CAPS: u64 = CAPS_PRIMARY | CAPS_SECONDARY;
/// Capabilities offered only when the hints ask for them: FI_SOURCE_ERR
/// turns completions from unknown sources into error entries, which an
/// application that did not ask would not expect.
pub const CAPS_ON_REQUEST: u64 = sys::FI_SOURCE_ERR | sys::FI_COLLECTIVE;
/// Capabilities that concern the transmit side.
const TX_CAPS: u64 = CAPS_PRIMARY
    | sys::FI_SEND
    | sys::FI_LOCAL_COMM
    | sys::FI_READ
    | sys::FI_WRITE
    | sys::FI_TRIGGER
    | sys::FI_COLLECTIVE;
/// Capabilities that concern the receive side.
pub const RX_CAPS: u64 = CAPS_PRIMARY
    | sys::FI_RECV
    | sys::FI_DIRECTED_RECV
    | sys::FI_MULTI_RECV
    | sys::FI_SOURCE
    | sys::FI_LOCAL_COMM
    | sys::FI_REMOTE_READ
    | sys::FI_REMOTE_WRITE
    | sys::FI_RMA_EVENT;
/// Default transmit operation flags the endpoint honours
/// (`FI_TRANSMIT_COMPLETE` and `FI_INJECT_COMPLETE` hold for every send:
/// a send completes once its data is in the receiver's memory, its ring,
/// its pool, or read by it; `FI_DELIVERY_COMPLETE` is the library's: such
/// a send goes by rendezvous and completes at the receiver's FIN, once
/// the data is in the receive buffer; one-sided calls are delivery
/// complete anyway, done before they return). `FI_INJECT`: the
/// library's send takes it (the buffer is free when the call returns; a
/// send above `inject_size` is `-FI_EMSGSIZE`), from the default flags as
/// from `fi_sendmsg`'s.
pub const TX_OP_FLAGS: u64 = sys::FI_COMPLETION
    | sys::FI_INJECT
    | sys::FI_INJECT_COMPLETE
    | sys::FI_TRANSMIT_COMPLETE
    | sys::FI_DELIVERY_COMPLETE;
/// Default receive operation flags the endpoint honours.
pub const RX_OP_FLAGS: u64 = sys::FI_COMPLETION | sys::FI_MULTI_RECV;
/// Message ordering kept, transmit and receive side (fi_endpoint(3)):
/// - send after send: a peer's sends are matched in the order they were
///   posted (one ring per sender, in order);
/// - among RMA and atomic operations (RAR, RAW, WAR, WAW, and their
///   RMA_* and ATOMIC_* forms), at any size (`max_order_*_size` -1): every
///   RMA or atomic call is done when it returns (the data is in the
///   target's memory, or read from it; through the target's progress
///   engine the call waits for it), so the next one starts after it;
/// - send after read and send after write: likewise, a send posted after
///   an RMA or atomic call starts after that call's data landed.
///
/// Not kept: read or write after send (RAS, WAS): a send goes through the
/// target's ring and is matched and copied later, while a later RMA call
/// lands at once. Completions are not ordered (comp_order NONE): remote
/// CQ data of a write may reach the target's CQ after a later send's
/// completion. These orders rest on the library's RMA and atomic calls
/// being complete on return (`shmfab::rma`); should they ever complete
/// later, this must shrink to FI_ORDER_SAS.
pub const MSG_ORDER: u64 = sys::FI_ORDER_SAS
    | sys::FI_ORDER_RAR
    | sys::FI_ORDER_RAW
    | sys::FI_ORDER_WAR
    | sys::FI_ORDER_WAW
    | sys::FI_ORDER_SAR
    | sys::FI_ORDER_SAW
    | sys::FI_ORDER_RMA_RAR
    | sys::FI_ORDER_RMA_RAW
    | sys::FI_ORDER_RMA_WAR
    | sys::FI_ORDER_RMA_WAW
    | sys::FI_ORDER_ATOMIC_RAR
    | sys::FI_ORDER_ATOMIC_RAW
    | sys::FI_ORDER_ATOMIC_WAR
    | sys::FI_ORDER_ATOMIC_WAW;
/// `ep_attr.mem_tag_format` offered when the hints give none: 64 tag
/// bits (libfabric's `FI_TAG_GENERIC`, not in the 1.17 headers).
pub const TAG_GENERIC: u64 = 0xAAAA_AAAA_AAAA_AAAA;
/// `FI_SHARED_CONTEXT` (`SIZE_MAX` in the header): an endpoint's receive
/// context is a shared one (`fi_srx_context`).
pub const SHARED_CONTEXT: usize = usize::MAX;
/// Bytes of an endpoint address (`shmfab::Address::SIZE`).
pub const ADDRLEN: usize = shmfab::Address::SIZE;
/// Completion queues a domain may open (the library's table grows; this
/// is the number advertised).
pub const CQ_CNT: usize = 1 << 16;
/// Memory registrations with the application's keys a domain may hold
/// (advertised; provider-key registrations are the library's, at most
/// `shm_layout::rma::N_MR`).
pub const MR_CNT: usize = 1 << 20;

/// Segments a registration takes with provider keys (the library's limit;
/// registrations with the application's keys take one).
pub const MR_IOV_LIMIT: usize = shm_layout::rma::MR_SEGS;
/// Bytes of provider error data a CQ error entry can carry
/// (`domain_attr.max_err_data`): `fi_cq_readerr` never returns more (a
/// longer text is cut, `cq.rs`), and hints asking for more get
/// `-FI_ENODATA`.
pub const MAX_ERR_DATA: usize = 256;
/// This provider's version (`fabric_attr->prov_version`).
pub const PROV_VERSION: u32 = fi_version(0, 1);
/// The libfabric API version of the headers built against.
pub const API_VERSION: u32 = fi_version(sys::FI_MAJOR_VERSION as u32, sys::FI_MINOR_VERSION as u32);

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// What the environment configures (`SHMFAB_*`): queue sizes and limits.
pub struct Limits {
    /// Transmit queue depth.
    pub tx_size: usize,
    /// Receive queue depth.
    pub rx_size: usize,
    /// Endpoints per domain.
    pub max_eps: usize,
    /// Counters per domain.
    pub max_counters: usize,
}

impl Limits {
    /// From the environment, as `shmfab::Fabric::open` reads it.
    pub fn from_env() -> shmfab::Result<Limits> {
        let c = shmfab::Config::from_env()?;
        Ok(Limits {
            tx_size: c.tx_size,
            rx_size: c.rx_size,
            max_eps: c.max_eps as usize,
            max_counters: c.max_counters as usize,
        })
    }
}

/// Why hints were refused (logged at `FI_LOG_INFO`, so that
/// `FI_LOG_LEVEL=info` says which hint).
struct No(String);

fn no(s: impl Into<String>) -> No {
    No(s.into())
}

/// A `u64` field of the hints must ask only for bits of `have`.
fn within(what: &str, asked: u64, have: u64) -> Result<(), No> {
    if asked & !have != 0 {
        return Err(no(format!("{what}: {:#x} not supported", asked & !have)));
    }
    Ok(())
}

/// A size in the hints must not exceed `max`.
fn at_most(what: &str, asked: usize, max: usize) -> Result<(), No> {
    if asked > max {
        return Err(no(format!("{what}: {asked} above the {max} offered")));
    }
    Ok(())
}

/// The bytes of `s`, or None for a null pointer.
///
/// # Safety
/// `s` must be null or a valid NUL-terminated string.
unsafe fn cstr<'a>(s: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: caller's contract.
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_bytes())
}

/// Checks hints (or an info passed back to `fi_domain`/`fi_endpoint`)
/// against what the provider offers.
///
/// # Safety
/// `h` must be a valid `fi_info` whose attribute pointers are null or valid.
unsafe fn check(version: u32, h: &sys::fi_info, lim: &Limits) -> Result<(), No> {
    let caps = h.caps;
    within("caps", caps, CAPS | CAPS_ON_REQUEST)?;
    if h.addr_format != sys::FI_FORMAT_UNSPEC {
        return Err(no("addr_format: shmfab's addresses are its own (FI_FORMAT_UNSPEC)"));
    }
    if !h.handle.is_null() {
        return Err(no("handle: no connection requests on RDM endpoints"));
    }
    for (what, len, p) in [("src_addr", h.src_addrlen, h.src_addr), ("dest_addr", h.dest_addrlen, h.dest_addr)] {
        if !p.is_null() && len != ADDRLEN {
            return Err(no(format!("{what}: {len} bytes, a shmfab address has {ADDRLEN}")));
        }
    }
    // SAFETY (all the attribute reads below): each pointer is null or valid
    // (caller's contract).
    if let Some(t) = unsafe { h.tx_attr.as_ref() } {
        within("tx_attr.caps", t.caps, TX_CAPS)?;
        within("tx_attr.op_flags", t.op_flags, TX_OP_FLAGS)?;
        within("tx_attr.msg_order", t.msg_order, MSG_ORDER)?;
        within("tx_attr.comp_order", t.comp_order, 0)?;
        at_most("tx_attr.inject_size", t.inject_size, shmfab::proto::INJECT_SIZE)?;
        at_most("tx_attr.size", t.size, lim.tx_size)?;
        at_most("tx_attr.iov_limit", t.iov_limit, shm_iov())?;
        at_most("tx_attr.rma_iov_limit", t.rma_iov_limit, shm_iov())?;
    }
    // SAFETY: null or valid (caller's contract).
    if let Some(r) = unsafe { h.rx_attr.as_ref() } {
        within("rx_attr.caps", r.caps, RX_CAPS | CAPS_ON_REQUEST)?;
        within("rx_attr.op_flags", r.op_flags, RX_OP_FLAGS)?;
        within("rx_attr.msg_order", r.msg_order, MSG_ORDER)?;
        within("rx_attr.comp_order", r.comp_order, 0)?;
        at_most("rx_attr.size", r.size, lim.rx_size)?;
        at_most("rx_attr.iov_limit", r.iov_limit, shm_iov())?;
    }
    // SAFETY: null or valid (caller's contract).
    // SAFETY: null or valid (caller's contract).
    let all = caps
        | unsafe { h.tx_attr.as_ref() }.map_or(0, |t| t.caps)
        | unsafe { h.rx_attr.as_ref() }.map_or(0, |r| r.caps);
    if all & sys::FI_SOURCE_ERR != 0 && all & sys::FI_SOURCE == 0 {
        return Err(no("FI_SOURCE_ERR must be paired with FI_SOURCE"));
    }
    if all & RMA_CAPS != 0 && version < fi_version(1, 5) {
        return Err(no("RMA and atomics: offered from API 1.5 (FI_MR_BASIC's remote addresses are virtual addresses)"));
    }
    // SAFETY: null or valid (caller's contract).
    if let Some(d) = unsafe { h.domain_attr.as_ref() } {
        if all & RMA_CAPS != 0 && !rma_allowed(version, d.mr_mode) {
            return Err(no("RMA and atomics need provider keys: domain_attr.mr_mode FI_MR_PROV_KEY"));
        }
    }
    // SAFETY: null or valid (caller's contract).
    if let Some(e) = unsafe { h.ep_attr.as_ref() } {
        if e.type_ != sys::FI_EP_UNSPEC && e.type_ != sys::FI_EP_RDM {
            return Err(no("ep_attr.type: only FI_EP_RDM"));
        }
        if e.protocol != sys::FI_PROTO_UNSPEC {
            return Err(no("ep_attr.protocol: only FI_PROTO_UNSPEC"));
        }
        at_most("ep_attr.max_msg_size", e.max_msg_size, shmfab::proto::MAX_MSG_SIZE)?;
        at_most("ep_attr.msg_prefix_size", e.msg_prefix_size, 0)?;
        // max_order_{raw,war,waw}_size: any size is ordered (MSG_ORDER).
        at_most("ep_attr.tx_ctx_cnt", e.tx_ctx_cnt, 1)?;
        // FI_SHARED_CONTEXT: the endpoints' receives all go through a
        // shared context (`srx.rs`), which serves every receive capability.
        if e.rx_ctx_cnt != SHARED_CONTEXT {
            at_most("ep_attr.rx_ctx_cnt", e.rx_ctx_cnt, 1)?;
        }
        at_most("ep_attr.auth_key_size", e.auth_key_size, 0)?;
    }
    // SAFETY: null or valid (caller's contract).
    if let Some(d) = unsafe { h.domain_attr.as_ref() } {
        // fi_domain(3): hints may name an open domain, to which the
        // returned info is then limited: one of ours is served.
        // SAFETY: null or a live fid (fi_getinfo(3)).
        if !d.domain.is_null() && unsafe { crate::domain::of(d.domain.cast()) }.is_none() {
            return Err(no("domain_attr.domain: not a domain of this provider"));
        }
        // SAFETY: null or valid (caller's contract).
        if let Some(n) = unsafe { cstr(d.name) } {
            if n != NAME.to_bytes() {
                return Err(no("domain_attr.name: the domain is \"shmfab\""));
            }
        }
        for (what, p) in [("control_progress", d.control_progress), ("data_progress", d.data_progress)] {
            if ![sys::FI_PROGRESS_UNSPEC, sys::FI_PROGRESS_MANUAL, sys::FI_PROGRESS_AUTO].contains(&p) {
                return Err(no(format!("domain_attr.{what}: {p} unknown")));
            }
        }
        if ![sys::FI_AV_UNSPEC, sys::FI_AV_MAP, sys::FI_AV_TABLE].contains(&d.av_type) {
            return Err(no("domain_attr.av_type: FI_AV_MAP or FI_AV_TABLE"));
        }
        if version < fi_version(1, 5) && d.mr_mode > sys::FI_MR_SCALABLE as c_int {
            return Err(no("domain_attr.mr_mode: unknown before API 1.5"));
        }
        // Both: FI_RM_ENABLED is the library's resource management
        // (Domain::set_resource_mgmt, set by fi_domain).
        if ![sys::FI_RM_UNSPEC, sys::FI_RM_DISABLED, sys::FI_RM_ENABLED].contains(&d.resource_mgmt) {
            return Err(no(format!("domain_attr.resource_mgmt: {} unknown", d.resource_mgmt)));
        }
        at_most("domain_attr.mr_key_size", d.mr_key_size, 8)?;
        at_most("domain_attr.cq_data_size", d.cq_data_size, 8)?;
        at_most("domain_attr.cq_cnt", d.cq_cnt, CQ_CNT)?;
        at_most("domain_attr.ep_cnt", d.ep_cnt, lim.max_eps)?;
        at_most("domain_attr.tx_ctx_cnt", d.tx_ctx_cnt, lim.max_eps)?;
        at_most("domain_attr.rx_ctx_cnt", d.rx_ctx_cnt, lim.max_eps)?;
        at_most("domain_attr.max_ep_tx_ctx", d.max_ep_tx_ctx, 1)?;
        at_most("domain_attr.max_ep_rx_ctx", d.max_ep_rx_ctx, 1)?;
        at_most("domain_attr.max_ep_stx_ctx", d.max_ep_stx_ctx, 0)?;
        at_most("domain_attr.max_ep_srx_ctx", d.max_ep_srx_ctx, 1)?;
        at_most("domain_attr.cntr_cnt", d.cntr_cnt, lim.max_counters)?;
        at_most("domain_attr.mr_iov_limit", d.mr_iov_limit, MR_IOV_LIMIT)?;
        // Provider keys (the only mode of registrations with them: 1.5's
        // FI_MR_PROV_KEY or 1.4's FI_MR_BASIC) are the library's
        // registrations, of which a domain has N_MR.
        let prov = if version >= fi_version(1, 5) {
            d.mr_mode as u64 & sys::FI_MR_PROV_KEY != 0
        } else {
            d.mr_mode == sys::FI_MR_BASIC as c_int
        };
        at_most("domain_attr.mr_cnt", d.mr_cnt, if prov { shm_layout::rma::N_MR as usize } else { MR_CNT })?;
        at_most("domain_attr.auth_key_size", d.auth_key_size, 0)?;
        at_most("domain_attr.max_err_data", d.max_err_data, MAX_ERR_DATA)?;
        within("domain_attr.caps", d.caps, sys::FI_LOCAL_COMM)?;
    }
    // SAFETY: null or valid (caller's contract).
    if let Some(f) = unsafe { h.fabric_attr.as_ref() } {
        // SAFETY: null or a live fid (fi_getinfo(3)).
        if !f.fabric.is_null() && unsafe { crate::fabric::of(f.fabric) }.is_none() {
            return Err(no("fabric_attr.fabric: not a fabric of this provider"));
        }
        // SAFETY: null or valid (caller's contract).
        if let Some(n) = unsafe { cstr(f.name) } {
            if n != NAME.to_bytes() {
                return Err(no("fabric_attr.name: the fabric is \"shmfab\""));
            }
        }
    }
    Ok(())
}

/// Segments per operation (`shm_layout::MAX_IOV`, through the API).
fn shm_iov() -> usize {
    shm_layout::MAX_IOV
}

/// Allocates `n` bytes copied from `p` with `malloc` (libfabric frees
/// `fi_info` addresses with `free`).
///
/// # Safety
/// `p` must be valid for `n` bytes.
unsafe fn dup_bytes(p: *const std::ffi::c_void, n: usize) -> *mut std::ffi::c_void {
    // SAFETY: malloc of n > 0 bytes; the copy writes n bytes into it from
    // p, valid for n (caller's contract).
    unsafe {
        let q = libc::malloc(n);
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), n);
        }
        q
    }
}

/// Fills a fresh `fi_info` (from `fi_dupinfo(NULL)`) with shmfab's
/// attributes, narrowed by the hints where they choose among what is
/// offered.
///
/// # Safety
/// `i` must come from `fi_dupinfo(NULL)` (every attribute allocated and
/// zeroed); `h` must be as for [`check`].
unsafe fn fill(version: u32, i: &mut sys::fi_info, h: Option<&sys::fi_info>, lim: &Limits) -> Result<(), c_int> {
    // SAFETY (attribute reads of the hints): null or valid, as for check.
    let hd = h.and_then(|h| unsafe { h.domain_attr.as_ref() });
    let he = h.and_then(|h| unsafe { h.ep_attr.as_ref() });
    let ht = h.and_then(|h| unsafe { h.tx_attr.as_ref() });
    let hr = h.and_then(|h| unsafe { h.rx_attr.as_ref() });
    // One-sided operations only with keys the provider chooses: left out
    // of the default capabilities when the hints' mr_mode does not allow
    // them (asking for them then fails in `check`).
    let rma_ok = version >= fi_version(1, 5) && hd.map_or(true, |x| rma_allowed(version, x.mr_mode));
    let offered = if rma_ok { CAPS } else { CAPS & !RMA_CAPS };
    let caps = match h.map_or(0, |h| h.caps) {
        0 => offered,
        c => c,
    };
    i.caps = caps;
    i.mode = 0;
    i.addr_format = sys::FI_FORMAT_UNSPEC;
    if let Some(h) = h {
        for (len, src, dst_len, dst) in [
            (h.src_addrlen, h.src_addr, &mut i.src_addrlen, &mut i.src_addr),
            (h.dest_addrlen, h.dest_addr, &mut i.dest_addrlen, &mut i.dest_addr),
        ] {
            if !src.is_null() {
                // SAFETY: the hints' address is valid for its length.
                *dst = unsafe { dup_bytes(src, len) };
                if dst.is_null() {
                    return Err(ENOMEM);
                }
                *dst_len = len;
            }
        }
    }
    // SAFETY: fi_dupinfo(NULL) allocated every attribute struct.
    let (t, r, e, d, f) =
        unsafe { (&mut *i.tx_attr, &mut *i.rx_attr, &mut *i.ep_attr, &mut *i.domain_attr, &mut *i.fabric_attr) };
    t.caps = caps & TX_CAPS;
    t.op_flags = ht.map_or(0, |x| x.op_flags);
    t.msg_order = MSG_ORDER;
    t.comp_order = sys::FI_ORDER_NONE;
    t.inject_size = shmfab::proto::INJECT_SIZE;
    t.size = lim.tx_size;
    t.iov_limit = shm_iov();
    t.rma_iov_limit = if caps & RMA_CAPS != 0 { shm_iov() } else { 0 };
    r.caps = caps & (RX_CAPS | CAPS_ON_REQUEST);
    r.op_flags = hr.map_or(0, |x| x.op_flags);
    r.msg_order = MSG_ORDER;
    r.comp_order = sys::FI_ORDER_NONE;
    r.size = lim.rx_size;
    r.iov_limit = shm_iov();
    e.type_ = sys::FI_EP_RDM;
    e.protocol = sys::FI_PROTO_UNSPEC;
    e.protocol_version = 1;
    e.max_msg_size = shmfab::proto::MAX_MSG_SIZE;
    // Tags are 64 bits, all usable: the application's format when it
    // gives one, else libfabric's generic 64-bit format (FI_TAG_GENERIC of
    // later headers; clients count the bits below its highest set bit).
    e.mem_tag_format = match he.map_or(0, |x| x.mem_tag_format) {
        0 => TAG_GENERIC,
        f => f,
    };
    // Every RMA or atomic call is ordered after the ones before it, at
    // any size (-1), see MSG_ORDER.
    e.max_order_raw_size = usize::MAX;
    e.max_order_war_size = usize::MAX;
    e.max_order_waw_size = usize::MAX;
    e.tx_ctx_cnt = 1;
    e.rx_ctx_cnt = match he.map_or(0, |x| x.rx_ctx_cnt) {
        SHARED_CONTEXT => SHARED_CONTEXT,
        _ => 1,
    };
    d.name = libc_strdup(NAME)?;
    d.threading = match hd.map_or(sys::FI_THREAD_UNSPEC, |x| x.threading) {
        sys::FI_THREAD_UNSPEC => sys::FI_THREAD_SAFE,
        t => t,
    };
    d.control_progress = match hd.map_or(sys::FI_PROGRESS_UNSPEC, |x| x.control_progress) {
        sys::FI_PROGRESS_UNSPEC => sys::FI_PROGRESS_AUTO,
        p => p,
    };
    // FI_PROGRESS_MANUAL, and it means it for one-sided calls: atomics on
    // memory registered with fi_mr_reg (not the shared heap), and RMA to it
    // where single copy is refused, are done by the target's progress
    // engine, and the initiator's call blocks until the target progresses
    // (any call that progresses, or its auto-progress thread) or dies.
    d.data_progress = match hd.map_or(sys::FI_PROGRESS_UNSPEC, |x| x.data_progress) {
        sys::FI_PROGRESS_UNSPEC => sys::FI_PROGRESS_MANUAL,
        p => p,
    };
    // FI_RM_DISABLED unless asked: resource management costs a look at
    // the transmit CQ's room on every send that reports to a CQ (and it
    // refuses sends a client that sizes its CQs would never see refused);
    // FI_RM_ENABLED when the hints ask for it (Open MPI's mtl/ofi does).
    d.resource_mgmt = match hd.map_or(sys::FI_RM_UNSPEC, |x| x.resource_mgmt) {
        sys::FI_RM_ENABLED => sys::FI_RM_ENABLED,
        _ => sys::FI_RM_DISABLED,
    };
    d.av_type = match hd.map_or(sys::FI_AV_UNSPEC, |x| x.av_type) {
        sys::FI_AV_UNSPEC => sys::FI_AV_TABLE,
        a => a,
    };
    // No registration is ever required: from API 1.5 on, no mode bit but
    // FI_MR_PROV_KEY when the hints allow it (registrations are then the
    // library's, reachable by peers); before, the application's choice of
    // keys (FI_MR_SCALABLE) unless it asked for provider keys (FI_MR_BASIC:
    // the library's registrations, with no one-sided operation offered).
    d.mr_mode = if version >= fi_version(1, 5) {
        if rma_ok {
            sys::FI_MR_PROV_KEY as c_int
        } else {
            0
        }
    } else {
        match hd.map_or(0, |x| x.mr_mode) {
            m if m == sys::FI_MR_BASIC as c_int => m,
            _ => sys::FI_MR_SCALABLE as c_int,
        }
    };
    d.mr_key_size = 8;
    d.cq_data_size = 8;
    d.cq_cnt = CQ_CNT;
    d.ep_cnt = lim.max_eps;
    d.tx_ctx_cnt = lim.max_eps;
    d.rx_ctx_cnt = lim.max_eps;
    d.max_ep_tx_ctx = 1;
    d.max_ep_rx_ctx = 1;
    d.max_ep_stx_ctx = 0;
    d.max_ep_srx_ctx = 1;
    d.cntr_cnt = lim.max_counters;
    let prov_keys = if version >= fi_version(1, 5) {
        d.mr_mode as u64 & sys::FI_MR_PROV_KEY != 0
    } else {
        d.mr_mode == sys::FI_MR_BASIC as c_int
    };
    d.mr_iov_limit = if prov_keys { MR_IOV_LIMIT } else { 1 };
    d.caps = sys::FI_LOCAL_COMM;
    d.mode = 0;
    d.max_err_data = MAX_ERR_DATA;
    d.mr_cnt = if prov_keys { shm_layout::rma::N_MR as usize } else { MR_CNT };
    // The open domain and fabric the hints named (checked ours), which
    // the info describes.
    d.domain = hd.map_or(std::ptr::null_mut(), |x| x.domain);
    // SAFETY: the hints' fabric attributes are null or valid (as above).
    f.fabric = h.and_then(|h| unsafe { h.fabric_attr.as_ref() }).map_or(std::ptr::null_mut(), |x| x.fabric);
    f.name = libc_strdup(NAME)?;
    // prov_name stays NULL: libfabric's core fills it in (a name set by
    // the provider is taken for a layered provider's, "shmfab;shmfab").
    f.prov_version = PROV_VERSION;
    f.api_version = version;
    Ok(())
}

/// `strdup` (libfabric frees the info's strings with `free`).
fn libc_strdup(s: &CStr) -> Result<*mut c_char, c_int> {
    // SAFETY: s is a valid NUL-terminated string.
    let p = unsafe { libc::strdup(s.as_ptr()) };
    if p.is_null() {
        Err(ENOMEM)
    } else {
        Ok(p)
    }
}

/// The provider's `getinfo`.
///
/// # Safety
/// libfabric's contract: `hints` null or a valid `fi_info`, `info` valid
/// for a write; `node`, `service` null or valid strings.
pub unsafe extern "C" fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    _flags: u64,
    hints: *const sys::fi_info,
    info: *mut *mut sys::fi_info,
) -> c_int {
    let refuse = |why: String| {
        crate::util::log(sys::FI_LOG_INFO, sys::FI_LOG_CORE, &format!("fi_getinfo: {why}"));
        ENODATA
    };
    if info.is_null() {
        return crate::util::EINVAL;
    }
    if !node.is_null() || !service.is_null() {
        return refuse("node and service: shmfab has no named addresses (pass NULL, use fi_getname)".into());
    }
    let lim = match Limits::from_env() {
        Ok(l) => l,
        Err(e) => return crate::util::err(e, sys::FI_LOG_CORE, "fi_getinfo: SHMFAB_* configuration"),
    };
    // SAFETY: hints is null or valid (libfabric's contract).
    let h = unsafe { hints.as_ref() };
    if let Some(h) = h {
        // SAFETY: as above, for its attributes.
        if let Err(No(why)) = unsafe { check(version, h, &lim) } {
            return refuse(why);
        }
    }
    // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with every
    // attribute struct.
    let i = unsafe { sys::fi_dupinfo(std::ptr::null()) };
    if i.is_null() {
        return ENOMEM;
    }
    // SAFETY: i was just allocated by fi_dupinfo(NULL); h as checked above.
    match unsafe { fill(version, &mut *i, h, &lim) } {
        Ok(()) => {
            // SAFETY: info is valid for a write (checked non-null).
            unsafe { *info = i };
            0
        }
        Err(e) => {
            // SAFETY: i came from fi_dupinfo and is freed once.
            unsafe { sys::fi_freeinfo(i) };
            e
        }
    }
}

/// Checks an info passed to `fi_domain` or `fi_endpoint` as it would
/// check hints: `-FI_ENODATA` (logged) if it asks for what is not offered.
///
/// # Safety
/// `i` as for the hints of `getinfo`.
pub unsafe fn recheck(version: u32, i: &sys::fi_info) -> Result<(), c_int> {
    let lim = Limits::from_env().map_err(|e| crate::util::err(e, sys::FI_LOG_CORE, "SHMFAB_* configuration"))?;
    // SAFETY: caller's contract.
    unsafe { check(version, i, &lim) }.map_err(|No(why)| {
        crate::util::log(sys::FI_LOG_INFO, sys::FI_LOG_CORE, &format!("info refused: {why}"));
        ENODATA
    })
}
