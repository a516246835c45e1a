//! Shared receive contexts (`fi_srx_context`) on the library's shared
//! receive queue: every receive of the endpoints bound to one, untagged
//! and tagged, comes from the buffers posted to it (`fi_recv`, `fi_recvv`,
//! `fi_recvmsg`, `fi_trecv`, `fi_trecvv`, `fi_trecvmsg` on the context),
//! and each completion goes to the CQ of the endpoint that received the
//! message. Directed receives (with FI_DIRECTED_RECV) name their source
//! by an fi_addr that each endpoint reads in its own AV (the source its
//! completions report); FI_MULTI_RECV buffers on `fi_recvmsg` (or as the
//! context's `op_flags`) are carved by the messages of every endpoint,
//! with FI_OPT_MIN_MULTI_RECV set on the context; FI_PEEK, FI_CLAIM and
//! FI_DISCARD on `fi_trecvmsg` look at the unexpected messages of every
//! bound endpoint. `fi_cancel` on the context cancels a buffer still
//! posted (its entry goes to the CQ of the endpoint bound first).

use crate::ep::Segs;
use crate::sys;
use crate::util::{self, nb1, nb2, nb3, nb4, nb5, nb6, nb7, nb8};
use crate::util::{no_ops_open, no_ops_set, no_tostr, EINVAL, ENOSYS, FI_ADDR_UNSPEC};
use std::ffi::{c_int, c_void};
use std::io::IoSliceMut;
use std::sync::atomic::Ordering::Relaxed;

/// A shared receive context.
#[repr(C)]
pub struct Srx {
    /// What the application holds (an endpoint of class FI_CLASS_SRX_CTX).
    pub fid: sys::fid_ep,
    dom: *const crate::domain::Domain,
    /// The library's shared receive queue.
    pub srq: shmfab::SharedRecvQueue,
    /// Whether receives are directed (FI_DIRECTED_RECV in the domain's
    /// capabilities; without it the source of a receive is ignored, as
    /// fi_msg(3) says).
    directed: bool,
    /// Default flags of `fi_recv`/`fi_recvv`/`fi_trecv`/`fi_trecvv`: the
    /// context's `op_flags` (FI_MULTI_RECV, FI_COMPLETION).
    op_flags: u64,
    /// FI_OPT_MIN_MULTI_RECV in force.
    min_multi_recv: std::sync::atomic::AtomicUsize,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(nb3),
    control: Some(control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static EP_OPS: sys::fi_ops_ep = sys::fi_ops_ep {
    size: std::mem::size_of::<sys::fi_ops_ep>(),
    cancel: Some(cancel),
    getopt: Some(getopt),
    setopt: Some(setopt),
    tx_ctx: Some(nb5),
    rx_ctx: Some(nb5),
    rx_size_left: Some(nb1),
    tx_size_left: Some(nb1),
};

static CM_OPS: sys::fi_ops_cm = sys::fi_ops_cm {
    size: std::mem::size_of::<sys::fi_ops_cm>(),
    setname: Some(nb3),
    getname: Some(nb3),
    getpeer: Some(nb3),
    connect: Some(nb4),
    listen: Some(nb1),
    accept: Some(nb3),
    reject: Some(nb4),
    shutdown: Some(nb2),
    join: Some(nb5),
};

static MSG_OPS: sys::fi_ops_msg = sys::fi_ops_msg {
    size: std::mem::size_of::<sys::fi_ops_msg>(),
    recv: Some(recv),
    recvv: Some(recvv),
    recvmsg: Some(recvmsg),
    send: Some(nb6),
    sendv: Some(nb6),
    sendmsg: Some(nb3),
    inject: Some(nb4),
    senddata: Some(nb7),
    injectdata: Some(nb5),
};

/// Tagged receives on a shared context; sends: not on a receive context.
static TAGGED_OPS: sys::fi_ops_tagged = sys::fi_ops_tagged {
    size: std::mem::size_of::<sys::fi_ops_tagged>(),
    recv: Some(trecv),
    recvv: Some(trecvv),
    recvmsg: Some(trecvmsg),
    send: Some(nb7),
    sendv: Some(nb7),
    sendmsg: Some(nb3),
    inject: Some(nb5),
    senddata: Some(nb8),
    injectdata: Some(nb6),
};

/// The shared receive context behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Srx> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_SRX_CTX, &FI_OPS) }
}

/// `fi_srx_context`: `attr->size` buffers may be posted at once (0: the
/// receive queue size of the configuration).
///
/// # Safety
/// libfabric's contract.
pub unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_rx_attr,
    out: *mut *mut sys::fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract.
    let Some(d) = (unsafe { crate::domain::of(domain.cast()) }) else { return EINVAL };
    if out.is_null() {
        return EINVAL;
    }
    // SAFETY: attr is null (defaults) or valid.
    let a = unsafe { attr.as_ref() }.copied().unwrap_or_default();
    // The rx_attr fi_getinfo returned is accepted as it is (applications
    // pass info->rx_attr): its caps describe the endpoints.
    if a.caps & !(crate::info::RX_CAPS | crate::info::CAPS_ON_REQUEST) != 0
        || a.op_flags & !(sys::FI_COMPLETION | sys::FI_MULTI_RECV) != 0
    {
        return ENOSYS;
    }
    if a.iov_limit > shmfab::srq::SRQ_MAX_IOV {
        return EINVAL;
    }
    let max_recv = match a.size {
        0 => match crate::info::Limits::from_env() {
            Ok(l) => l.rx_size,
            Err(e) => return util::err(e, sys::FI_LOG_EP_CTRL, "fi_srx_context"),
        },
        n => n,
    };
    let srq = match d.dom.srq_open(&shmfab::SrqAttr { max_recv, ..Default::default() }) {
        Ok(s) => s,
        Err(e) => return util::err(e, sys::FI_LOG_EP_CTRL, "fi_srx_context"),
    };
    d.refs.fetch_add(1, Relaxed);
    let b = Box::new(Srx {
        fid: sys::fid_ep {
            fid: util::fid(sys::FI_CLASS_SRX_CTX, context, &FI_OPS),
            ops: util::ops(&EP_OPS),
            cm: util::ops(&CM_OPS),
            msg: util::ops(&MSG_OPS),
            rma: util::ops(&util::NB_RMA_OPS),
            tagged: util::ops(&TAGGED_OPS),
            atomic: util::ops(&util::NB_ATOMIC_OPS),
            collective: util::ops(&util::NB_COLL_OPS),
        },
        dom: d,
        srq,
        directed: d.caps & sys::FI_DIRECTED_RECV != 0,
        op_flags: a.op_flags,
        min_multi_recv: 64.into(),
    });
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// `fi_close`: `-FI_EBUSY` while endpoints are bound to it.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(s) = (unsafe { of(fid) }) else { return EINVAL };
    if let Err(e) = s.srq.close() {
        return util::err(e, sys::FI_LOG_EP_CTRL, "fi_close(srx)");
    }
    // SAFETY: the domain outlives what is opened from it (refs).
    unsafe { &*s.dom }.refs.fetch_sub(1, Relaxed);
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((s as *const Srx).cast_mut()) });
    0
}

/// `fi_cancel` on the context: a buffer still posted under `context`
/// (untagged, tagged, directed or multi-receive: what is left of it)
/// completes as an `FI_ECANCELED` error entry in the receive CQ of the
/// endpoint bound to the context first (the context has no CQ of its own;
/// libfabric's shared contexts report there too). A buffer a message took
/// already completes as usual, and with no endpoint bound nothing is
/// cancelled; the call succeeds either way (fi_endpoint(3)).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made.
unsafe extern "C" fn cancel(fid: *mut sys::fid, context: *mut c_void) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(s) = (unsafe { of(fid) }) else { return EINVAL as isize };
    match s.srq.cancel(context as usize) {
        Ok(_) => 0,
        Err(e) => util::err(e, sys::FI_LOG_EP_CTRL, "fi_cancel(srx)") as isize,
    }
}

/// `fi_control`: FI_ENABLE (nothing to do: the context takes buffers
/// from its opening on).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made.
unsafe extern "C" fn control(fid: *mut sys::fid, command: c_int, _: *mut c_void) -> c_int {
    // SAFETY: libfabric passes our fid.
    if unsafe { of(fid) }.is_none() {
        return EINVAL;
    }
    match command as u32 {
        sys::FI_ENABLE => 0,
        _ => ENOSYS,
    }
}

impl Srx {
    /// Posts a buffer (tagged or not) with the flags of the call (FI_MORE,
    /// a hint, dropped).
    ///
    /// # Safety
    /// The segments stay valid and untouched until the buffer completes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn post(
        &self,
        iov: &mut [IoSliceMut<'_>],
        src: u64,
        ctx: *mut c_void,
        tag: u64,
        ignore: u64,
        flags: u64,
        tagged: bool,
    ) -> isize {
        let src = if self.directed { src } else { FI_ADDR_UNSPEC };
        let flags = flags & !sys::FI_MORE;
        let mut m = shmfab::RecvMsg { iov, src, context: ctx as usize, tag, ignore };
        // SAFETY: caller's contract.
        let r = unsafe {
            if tagged {
                self.srq.trecvmsg(&mut m, flags)
            } else {
                self.srq.recvmsg(&mut m, flags)
            }
        };
        match r {
            Ok(()) => 0,
            Err(e) => util::err(e, sys::FI_LOG_EP_DATA, if tagged { "fi_trecv(srx)" } else { "fi_recv(srx)" }) as isize,
        }
    }
}

/// `getopt` on the context: FI_OPT_MIN_MULTI_RECV.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as fi_endpoint(3) says.
unsafe extern "C" fn getopt(fid: *mut sys::fid, level: c_int, name: c_int, val: *mut c_void, len: *mut usize) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(s) = (unsafe { of(fid) }) else { return EINVAL };
    // SAFETY: val and len as fi_endpoint(3) says (libfabric's contract).
    unsafe { util::getopt_min_multi_recv(level, name, val, len, s.min_multi_recv.load(Relaxed)) }
}

/// `setopt` on the context: FI_OPT_MIN_MULTI_RECV of its multi-receive
/// buffers.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as fi_endpoint(3) says.
unsafe extern "C" fn setopt(fid: *mut sys::fid, level: c_int, name: c_int, val: *const c_void, len: usize) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(s) = (unsafe { of(fid) }) else { return EINVAL };
    // SAFETY: val holds len bytes (libfabric's contract).
    unsafe {
        util::setopt_min_multi_recv(
            level,
            name,
            val,
            len,
            &s.min_multi_recv,
            |n| s.srq.set_min_multi_recv(n),
            "fi_setopt(srx)",
        )
    }
}

/// `fi_recv` on the context.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `buf` holds
/// `len` bytes until the completion.
unsafe extern "C" fn recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(s) = (unsafe { of(ep.cast()) }) else { return EINVAL as isize };
    // SAFETY: buf holds len bytes (fi_msg(3)); null only with len 0.
    let Some(b) = (unsafe { crate::ep::bytes_mut(buf, len) }) else { return EINVAL as isize };
    // SAFETY: the buffer stays valid until the completion (fi_msg(3)).
    unsafe { s.post(&mut [IoSliceMut::new(b)], src, ctx, 0, 0, s.op_flags, false) }
}

/// The caller's iovecs, to receive into ([`crate::ep::Segs`]): None for
/// none (a buffer has at least one segment) or a bad array.
///
/// # Safety
/// `iov` holds `count` valid, writable segments, untouched until the
/// buffer completes; the array itself is only read.
unsafe fn slices_mut<'a>(iov: *const sys::iovec, count: usize) -> Option<Segs<IoSliceMut<'a>>> {
    if count == 0 {
        return None;
    }
    // SAFETY: caller's contract.
    unsafe { crate::ep::slices_mut(iov, count) }
}

/// `fi_recvv` on the context.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `iov` holds
/// `count` segments valid until the completion.
unsafe extern "C" fn recvv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; iov holds count segments.
    let (Some(s), Some(mut v)) = (unsafe { of(ep.cast()) }, unsafe { slices_mut(iov, count) }) else {
        return EINVAL as isize;
    };
    // SAFETY: the segments stay valid until the completion.
    unsafe { s.post(&mut v, src, ctx, 0, 0, s.op_flags, false) }
}

/// `fi_recvmsg` on the context (FI_COMPLETION, FI_MULTI_RECV).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `msg` valid,
/// its segments valid until the completion.
unsafe extern "C" fn recvmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg, flags: u64) -> isize {
    // SAFETY: libfabric passes our fid; msg is null or valid.
    let (Some(s), Some(m)) = (unsafe { of(ep.cast()) }, unsafe { msg.as_ref() }) else {
        return EINVAL as isize;
    };
    // SAFETY: msg_iov holds iov_count segments.
    let Some(mut v) = (unsafe { slices_mut(m.msg_iov, m.iov_count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion.
    unsafe { s.post(&mut v, m.addr, m.context, 0, 0, flags, false) }
}

/// `fi_trecv` on the context.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `buf` holds
/// `len` bytes until the completion.
unsafe extern "C" fn trecv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(s) = (unsafe { of(ep.cast()) }) else { return EINVAL as isize };
    // SAFETY: buf holds len bytes (fi_msg(3)); null only with len 0.
    let Some(b) = (unsafe { crate::ep::bytes_mut(buf, len) }) else { return EINVAL as isize };
    // Multi-receive buffers are untagged: the default flags keep only
    // FI_COMPLETION here.
    let flags = s.op_flags & sys::FI_COMPLETION;
    // SAFETY: the buffer stays valid until the completion (fi_tagged(3)).
    unsafe { s.post(&mut [IoSliceMut::new(b)], src, ctx, tag, ignore, flags, true) }
}

/// `fi_trecvv` on the context.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `iov` holds
/// `count` segments valid until the completion.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn trecvv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; iov holds count segments.
    let (Some(s), Some(mut v)) = (unsafe { of(ep.cast()) }, unsafe { slices_mut(iov, count) }) else {
        return EINVAL as isize;
    };
    // SAFETY: the segments stay valid until the completion.
    unsafe { s.post(&mut v, src, ctx, tag, ignore, s.op_flags & sys::FI_COMPLETION, true) }
}

/// `fi_trecvmsg` on the context: FI_COMPLETION, and FI_PEEK, FI_CLAIM,
/// FI_DISCARD as on an endpoint, over the unexpected messages of every
/// endpoint bound (a peek's buffers may be absent).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made; `msg` valid,
/// its segments valid until the completion.
unsafe extern "C" fn trecvmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_tagged, flags: u64) -> isize {
    // SAFETY: libfabric passes our fid; msg is null or valid.
    let (Some(s), Some(m)) = (unsafe { of(ep.cast()) }, unsafe { msg.as_ref() }) else {
        return EINVAL as isize;
    };
    let probe = flags & (sys::FI_PEEK | sys::FI_DISCARD) != 0;
    let mut none: [IoSliceMut<'_>; 0] = [];
    // SAFETY: msg_iov holds iov_count segments (none needed by a peek or
    // a discard).
    let mut segs = unsafe { slices_mut(m.msg_iov, m.iov_count) };
    let v: &mut [IoSliceMut<'_>] = match &mut segs {
        Some(v) => v,
        None if probe => &mut none[..],
        None => return EINVAL as isize,
    };
    // SAFETY: the segments stay valid until the completion.
    unsafe { s.post(v, m.addr, m.context, m.tag, m.ignore, flags, true) }
}
