//! Reliable-datagram endpoints (`fi_endpoint`): binding (AV, CQs,
//! counters, EQ), enable, `fi_getname`, the untagged (`fi_msg`) and tagged
//! (`fi_tagged`) calls, `fi_cancel`, shared receive contexts (`srx.rs`), FI_OPT_MIN_MULTI_RECV and
//! FI_GETOPSFLAG / FI_SETOPSFLAG, the RMA calls (`fi_rma`: remote
//! addresses are offsets in registrations with provider keys), over the
//! library's endpoint.
//!
//! What libfabric says about flags, kept here: a receive's source address
//! is used only with FI_DIRECTED_RECV (otherwise any source, whatever the
//! application passed); the calls without a flags argument use the
//! endpoint's default operation flags (`tx_attr->op_flags`,
//! `rx_attr->op_flags`, FI_SETOPSFLAG); the `*msg` calls use their own.
//! FI_TRANSMIT_COMPLETE and FI_INJECT_COMPLETE are what every shmfab send
//! gives (see `info::TX_OP_FLAGS`) and are dropped before the library
//! sees them. FI_PEEK, FI_CLAIM and FI_DISCARD on `fi_trecvmsg` are the
//! library's (`shmfab::Endpoint::trecvmsg`), a claim identified by its
//! context pointer. FI_DELIVERY_COMPLETE on a send goes to the library
//! (the send completes once the receiver has the data in its buffer). Atomics: `atomic.rs`.
//! `fi_join_collective` and the collective calls: `coll.rs` (the
//! endpoint records what is bound to it for them; an EQ bound to it
//! cannot close before it, and it cannot close while a group is open).

use crate::sys;
use crate::util::{self, nb1, nb2, nb3, nb4, nb5};
use crate::util::{no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EINVAL, ENOSYS, ETOOSMALL, FI_ADDR_UNSPEC};
use shmfab::{RecvMsg, SendMsg};
use std::ffi::{c_int, c_void};
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// An endpoint.
#[repr(C)]
pub struct Ep {
    /// What the application holds.
    pub fid: sys::fid_ep,
    dom: *const crate::domain::Domain,
    /// The library's endpoint.
    pub ep: shmfab::Endpoint,
    /// Whether receives are directed (FI_DIRECTED_RECV asked for).
    directed: bool,
    /// Default transmit operation flags.
    pub(crate) tx_flags: AtomicU64,
    /// Default receive operation flags.
    rx_flags: AtomicU64,
    /// FI_OPT_MIN_MULTI_RECV in force.
    min_multi_recv: AtomicUsize,
    /// What is bound to it, for the collectives (`coll.rs`).
    pub(crate) bound: std::sync::Mutex<crate::coll::Bound>,
    /// Collective groups joined (close is `-FI_EBUSY` while any is open).
    pub(crate) mcs: AtomicUsize,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(bind),
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
    getname: Some(getname),
    getpeer: Some(nb3),
    connect: Some(nb4),
    listen: Some(nb1),
    accept: Some(nb3),
    reject: Some(nb4),
    shutdown: Some(nb2),
    join: Some(crate::coll::join),
};

static MSG_OPS: sys::fi_ops_msg = sys::fi_ops_msg {
    size: std::mem::size_of::<sys::fi_ops_msg>(),
    recv: Some(recv),
    recvv: Some(recvv),
    recvmsg: Some(recvmsg),
    send: Some(send),
    sendv: Some(sendv),
    sendmsg: Some(sendmsg),
    inject: Some(inject),
    senddata: Some(senddata),
    injectdata: Some(injectdata),
};

static TAGGED_OPS: sys::fi_ops_tagged = sys::fi_ops_tagged {
    size: std::mem::size_of::<sys::fi_ops_tagged>(),
    recv: Some(trecv),
    recvv: Some(trecvv),
    recvmsg: Some(trecvmsg),
    send: Some(tsend),
    sendv: Some(tsendv),
    sendmsg: Some(tsendmsg),
    inject: Some(tinject),
    senddata: Some(tsenddata),
    injectdata: Some(tinjectdata),
};

/// The endpoint behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Ep> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_EP, &FI_OPS) }
}

/// `fi_endpoint`.
///
/// # Safety
/// libfabric's contract.
pub unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    out: *mut *mut sys::fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract.
    let (Some(d), Some(i)) = (unsafe { crate::domain::of(domain.cast()) }, unsafe { info.as_ref() }) else {
        return EINVAL;
    };
    if out.is_null() {
        return EINVAL;
    }
    // SAFETY: info is valid with valid or null attributes.
    if let Err(e) = unsafe { crate::info::recheck(d.api_version, i) } {
        return e;
    }
    let caps = if i.caps == 0 { d.caps } else { i.caps };
    // SAFETY: as above.
    let (tx, rx) = unsafe { (i.tx_attr.as_ref(), i.rx_attr.as_ref()) };
    let ep = match d.dom.endpoint() {
        Ok(e) => e,
        Err(e) => return util::err(e, sys::FI_LOG_EP_CTRL, "fi_endpoint"),
    };
    // FI_SOURCE_ERR (fi_cq(3)): receives from addresses not in the AV are
    // error entries carrying the address (only on request: `info`).
    if caps & sys::FI_SOURCE_ERR != 0 {
        if let Err(e) = ep.set_source_err(true) {
            return util::err(e, sys::FI_LOG_EP_CTRL, "fi_endpoint");
        }
    }
    d.refs.fetch_add(1, Relaxed);
    let b = Box::new(Ep {
        fid: sys::fid_ep {
            fid: util::fid(sys::FI_CLASS_EP, context, &FI_OPS),
            ops: util::ops(&EP_OPS),
            cm: util::ops(&CM_OPS),
            msg: util::ops(&MSG_OPS),
            rma: util::ops(&RMA_OPS),
            tagged: util::ops(&TAGGED_OPS),
            atomic: util::ops(&crate::atomic::ATOMIC_OPS),
            collective: util::ops(&crate::coll::COLL_OPS),
        },
        dom: d,
        ep,
        directed: caps & sys::FI_DIRECTED_RECV != 0,
        tx_flags: AtomicU64::new(tx.map_or(0, |t| t.op_flags)),
        rx_flags: AtomicU64::new(rx.map_or(0, |r| r.op_flags)),
        min_multi_recv: AtomicUsize::new(64),
        bound: Default::default(),
        mcs: AtomicUsize::new(0),
    });
    // SAFETY: out is valid for a write (checked).
    unsafe { *out = &mut Box::leak(b).fid };
    0
}

/// `fi_close`: outstanding operations are discarded with no completions
/// (fi_endpoint(3)): the endpoint's receives not completed are dropped,
/// and buffers of a shared receive context it had taken but not filled
/// stay posted to the context (`Endpoint::close_discard`).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL };
    if e.mcs.load(Relaxed) > 0 {
        return crate::util::EBUSY;
    }
    if let Err(err) = e.ep.close_discard() {
        return util::err(err, sys::FI_LOG_EP_CTRL, "fi_close(ep)");
    }
    // SAFETY: the domain outlives its endpoints (refs).
    unsafe { &*e.dom }.refs.fetch_sub(1, Relaxed);
    crate::coll::unbind_eq(e);
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((e as *const Ep).cast_mut()) });
    0
}

/// `fi_ep_bind`: an AV, CQs (FI_TRANSMIT, FI_RECV, FI_SELECTIVE_COMPLETION),
/// counters (by event), a shared receive context, or an EQ (accepted: shmfab's endpoints report no
/// asynchronous events).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn bind(fid: *mut sys::fid, bfid: *mut sys::fid, flags: u64) -> c_int {
    // SAFETY: libfabric passes our fid; bfid is a live fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL };
    if bfid.is_null() {
        return EINVAL;
    }
    let s = sys::FI_LOG_EP_CTRL;
    // SAFETY (each lookup): bfid is a live fid; `of` checks its class and
    // ops before taking it for one of ours.
    unsafe {
        if let Some(a) = crate::av::of(bfid) {
            let r = util::status(e.ep.bind_av(&a.av), s, "fi_ep_bind(av)");
            if r == 0 {
                crate::coll::bound(e).av = a;
            }
            return r;
        }
        if let Some(c) = crate::cq::of(bfid) {
            let r = util::status(e.ep.bind_cq(&c.cq, flags), s, "fi_ep_bind(cq)");
            if r == 0 {
                crate::coll::bind_cq(e, c, flags);
            }
            return r;
        }
        if let Some(c) = crate::cntr::of(bfid) {
            let r = util::status(e.ep.bind_cntr(&c.cntr, flags), s, "fi_ep_bind(cntr)");
            if r == 0 && flags & (sys::FI_SEND | sys::FI_TRANSMIT) != 0 {
                crate::coll::bound(e).tx_cntr = c;
            }
            return r;
        }
        if let Some(x) = crate::srx::of(bfid) {
            // Every receive of the endpoint, untagged and tagged, goes
            // through the shared context (srx.rs).
            let both = shmfab::FI_MSG | shmfab::FI_TAGGED;
            return util::status(e.ep.bind_srq_for(&x.srq, both), s, "fi_ep_bind(srx)");
        }
        if let Some(q) = crate::eq::of(bfid) {
            return crate::coll::bind_eq(e, q);
        }
    }
    // Shared transmit contexts: not built yet; anything else is not ours.
    // SAFETY: bfid is a live fid.
    match unsafe { (*bfid).fclass } as u32 {
        sys::FI_CLASS_STX_CTX => ENOSYS,
        _ => EINVAL,
    }
}

/// `fi_control` on an endpoint: FI_ENABLE, FI_GETOPSFLAG, FI_SETOPSFLAG.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn control(fid: *mut sys::fid, command: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL };
    match command as u32 {
        sys::FI_ENABLE => util::status(e.ep.enable(), sys::FI_LOG_EP_CTRL, "fi_enable"),
        c @ (sys::FI_GETOPSFLAG | sys::FI_SETOPSFLAG) => {
            if arg.is_null() {
                return EINVAL;
            }
            // SAFETY: arg is a uint64_t for these commands (fi_endpoint(3)).
            let f = unsafe { &mut *arg.cast::<u64>() };
            let (slot, allowed) = match (*f & sys::FI_TRANSMIT != 0, *f & sys::FI_RECV != 0) {
                (true, false) => (&e.tx_flags, crate::info::TX_OP_FLAGS),
                (false, true) => (&e.rx_flags, crate::info::RX_OP_FLAGS),
                _ => return EINVAL,
            };
            if c == sys::FI_GETOPSFLAG {
                *f = slot.load(Relaxed);
            } else {
                let v = *f & !(sys::FI_TRANSMIT | sys::FI_RECV);
                if v & !allowed != 0 {
                    return EBADFLAGS;
                }
                slot.store(v, Relaxed);
            }
            0
        }
        _ => ENOSYS,
    }
}

/// `getname`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn getname(fid: *mut sys::fid, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL };
    if addrlen.is_null() {
        return EINVAL;
    }
    let raw = e.ep.getname().to_bytes();
    // SAFETY: addrlen is valid; addr is null or holds *addrlen bytes
    // (fi_cm(3)).
    unsafe {
        let room = if addr.is_null() { 0 } else { *addrlen };
        *addrlen = raw.len();
        // fi_cm(3): a buffer too small gets the address truncated (and
        // -FI_ETOOSMALL, *addrlen the size needed).
        let n = room.min(raw.len());
        if n > 0 {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), addr.cast::<u8>(), n);
        }
        if n < raw.len() {
            return ETOOSMALL;
        }
    }
    0
}

/// `fi_cancel` of a receive, or of a triggered operation of any kind not
/// fired yet (its context the `fi_triggered_context`): its completion is
/// an FI_ECANCELED error entry. An operation already matched or
/// completed, or a send issued, is not cancelled (the call still
/// succeeds, as fi_endpoint(3) allows).
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn cancel(fid: *mut sys::fid, context: *mut c_void) -> isize {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL as isize };
    match e.ep.cancel(context as usize) {
        Ok(_) => 0,
        Err(err) => util::err(err, sys::FI_LOG_EP_CTRL, "fi_cancel") as isize,
    }
}

/// `getopt`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn getopt(fid: *mut sys::fid, level: c_int, name: c_int, val: *mut c_void, len: *mut usize) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL };
    // SAFETY: val and len as fi_endpoint(3) says (libfabric's contract).
    unsafe { util::getopt_min_multi_recv(level, name, val, len, e.min_multi_recv.load(Relaxed)) }
}

/// `setopt`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn setopt(fid: *mut sys::fid, level: c_int, name: c_int, val: *const c_void, len: usize) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(e) = (unsafe { of(fid) }) else { return EINVAL };
    // SAFETY: val holds len bytes (libfabric's contract).
    unsafe {
        util::setopt_min_multi_recv(
            level,
            name,
            val,
            len,
            &e.min_multi_recv,
            |n| e.ep.set_min_multi_recv(n),
            "fi_setopt",
        )
    }
}

// ---- data transfer ------------------------------------------------------

impl Ep {
    /// The library's domain the endpoint belongs to.
    pub(crate) fn domain(&self) -> &shmfab::Domain {
        // SAFETY: the domain outlives its endpoints (its close is refused
        // while refs > 0).
        unsafe { &(*self.dom).dom }
    }
}

/// The endpoint of a data call.
///
/// # Safety
/// `ep` a live fid.
#[inline(always)]
pub(crate) unsafe fn me<'a>(ep: *mut sys::fid_ep) -> Option<&'a Ep> {
    // SAFETY: caller's contract.
    unsafe { of(ep.cast()) }
}

/// The caller's buffer.
///
/// # Safety
/// `buf` valid for `len` bytes (or `len` 0).
#[inline(always)]
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: caller's contract (non-null checked).
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// The caller's buffer, to receive into.
///
/// # Safety
/// As [`bytes`], for writes.
#[inline(always)]
pub(crate) unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    // SAFETY: caller's contract (non-null checked).
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// Most segments one call takes: an SRQ buffer's (the library refuses
/// more than an endpoint's 4 itself, with its reason).
const MAX_SEGS: usize = shmfab::SRQ_MAX_IOV;

/// The segments of a C iovec array, read once at the call: a segment of
/// length 0 may have any base (NULL, often: it is never read), a segment
/// with bytes must have one. The array itself is the caller's and only
/// read. Slices are made here, field by field, rather than by reading the
/// array as `IoSlice`s in place: a `{NULL, 0}` segment would be a slice
/// with a null pointer there, which Rust does not allow.
pub(crate) struct Segs<T> {
    v: [T; MAX_SEGS],
    n: usize,
}

impl<T> std::ops::Deref for Segs<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[..self.n]
    }
}

impl<T> std::ops::DerefMut for Segs<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v[..self.n]
    }
}

/// Reads `count` iovecs into `out` by `make` (pointer and length of a
/// segment with bytes); None for a null array, more than [`MAX_SEGS`],
/// or a segment with bytes and no base.
///
/// # Safety
/// `iov` holds `count` valid iovecs (or `count` is 0).
unsafe fn read_iovs<T>(
    iov: *const sys::iovec,
    count: usize,
    mut out: Segs<T>,
    make: impl Fn(*mut u8, usize) -> T,
) -> Option<Segs<T>> {
    if count > MAX_SEGS || (count > 0 && iov.is_null()) {
        return None;
    }
    for i in 0..count {
        // SAFETY: caller's contract: `count` entries.
        let e = unsafe { &*iov.add(i) };
        if e.iov_len > 0 {
            if e.iov_base.is_null() {
                return None;
            }
            out.v[i] = make(e.iov_base.cast::<u8>(), e.iov_len);
        }
    }
    out.n = count;
    Some(out)
}

/// An iovec array's segments, to send from (see [`Segs`]).
///
/// # Safety
/// `iov` holds `count` valid iovecs, each segment valid for its length.
pub(crate) unsafe fn slices<'a>(iov: *const sys::iovec, count: usize) -> Option<Segs<IoSlice<'a>>> {
    let out = Segs { v: [IoSlice::new(&[]); MAX_SEGS], n: 0 };
    // SAFETY: caller's contract, for the array and each segment (non-null
    // and with bytes when made into a slice: checked by read_iovs).
    unsafe { read_iovs(iov, count, out, |p, l| IoSlice::new(std::slice::from_raw_parts(p, l))) }
}

/// As [`slices`], to receive into.
///
/// # Safety
/// As [`slices`]; the segments are writable and nothing else uses them
/// until the receive completes.
pub(crate) unsafe fn slices_mut<'a>(iov: *const sys::iovec, count: usize) -> Option<Segs<IoSliceMut<'a>>> {
    let out = Segs { v: std::array::from_fn(|_| IoSliceMut::new(&mut [])), n: 0 };
    // SAFETY: as in `slices`; the segments are the caller's to write.
    unsafe { read_iovs(iov, count, out, |p, l| IoSliceMut::new(std::slice::from_raw_parts_mut(p, l))) }
}

const DATA: sys::fi_log_subsys = sys::FI_LOG_EP_DATA;

/// The result of a data call.
#[inline(always)]
pub(crate) fn done(r: shmfab::Result<()>, what: &str) -> isize {
    match r {
        Ok(()) => 0,
        Err(e) => util::err(e, DATA, what) as isize,
    }
}

/// Transmit flags for the library: the completion levels every send
/// gives are dropped, and FI_MORE (a hint that more calls follow, which
/// the library has no use for); FI_DELIVERY_COMPLETE goes through (the
/// library's send then completes once the receiver has the data).
#[inline(always)]
fn tx_flags(f: u64) -> Result<u64, isize> {
    Ok(f & !(sys::FI_TRANSMIT_COMPLETE | sys::FI_INJECT_COMPLETE | sys::FI_MORE))
}

/// Receive flags for the library: FI_MORE (a hint) is dropped; the rest,
/// FI_PEEK, FI_CLAIM and FI_DISCARD among them (same values), go through.
/// A claim is identified by its context: the library keys the claimed
/// message by the context pointer, which fi_tagged(3) says is the same
/// `struct fi_context` for the FI_PEEK | FI_CLAIM and for its FI_CLAIM
/// (nothing is written into it).
#[inline(always)]
fn rx_flags(f: u64) -> u64 {
    f & !sys::FI_MORE
}

impl Ep {
    /// The source filter of a receive: ignored (FI_ADDR_UNSPEC) unless
    /// the endpoint has FI_DIRECTED_RECV (fi_msg(3)).
    #[inline(always)]
    pub(crate) fn src(&self, a: u64) -> u64 {
        if self.directed {
            a
        } else {
            FI_ADDR_UNSPEC
        }
    }

    /// A receive through the library's `recvmsg`/`trecvmsg`.
    ///
    /// # Safety
    /// The segments stay valid and untouched until the receive completes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn rx(
        &self,
        iov: &mut [IoSliceMut<'_>],
        src: u64,
        ctx: usize,
        tag: u64,
        ignore: u64,
        flags: u64,
        tagged: bool,
    ) -> isize {
        let flags = rx_flags(flags);
        let mut m = RecvMsg { iov, src: self.src(src), context: ctx, tag, ignore };
        // SAFETY: caller's contract.
        let r = unsafe {
            if tagged {
                self.ep.trecvmsg(&mut m, flags)
            } else {
                self.ep.recvmsg(&mut m, flags)
            }
        };
        done(r, "receive")
    }

    /// A send through the library's `sendmsg`/`tsendmsg`.
    ///
    /// # Safety
    /// The segments stay valid and unchanged until the send completes
    /// (with FI_INJECT, until the call returns).
    #[allow(clippy::too_many_arguments)]
    unsafe fn tx(
        &self,
        iov: &[IoSlice<'_>],
        dest: u64,
        ctx: usize,
        data: u64,
        tag: u64,
        flags: u64,
        tagged: bool,
    ) -> isize {
        let flags = match tx_flags(flags) {
            Ok(f) => f,
            Err(e) => return e,
        };
        let m = SendMsg { iov, dest, context: ctx, data, tag };
        // SAFETY: caller's contract.
        let r = unsafe {
            if tagged {
                self.ep.tsendmsg(&m, flags)
            } else {
                self.ep.sendmsg(&m, flags)
            }
        };
        done(r, "send")
    }
}

/// `recv`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes (fi_msg(3)).
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes_mut(buf, len) }) else { return EINVAL as isize };
    let f = e.rx_flags.load(Relaxed);
    if f == 0 {
        // SAFETY: the buffer stays valid until the completion (fi_msg(3)).
        return done(unsafe { e.ep.recv(b, e.src(src), ctx as usize) }, "fi_recv");
    }
    // SAFETY: as above.
    unsafe { e.rx(&mut [IoSliceMut::new(b)], src, ctx as usize, 0, 0, f, false) }
}

/// `recvv`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn recvv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; iov holds count entries.
    let (Some(e), Some(mut v)) = (unsafe { me(ep) }, unsafe { slices_mut(iov, count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion (fi_msg(3)).
    unsafe { e.rx(&mut v, src, ctx as usize, 0, 0, e.rx_flags.load(Relaxed), false) }
}

/// `recvmsg`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn recvmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg, flags: u64) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::recvmsg(ep, msg, flags) };
    }
    // SAFETY: libfabric passes our fid; msg is null or valid.
    let (Some(e), Some(m)) = (unsafe { me(ep) }, unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: msg_iov holds iov_count entries.
    let Some(mut v) = (unsafe { slices_mut(m.msg_iov, m.iov_count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion (fi_msg(3)).
    unsafe { e.rx(&mut v, m.addr, m.context as usize, 0, 0, flags, false) }
}

/// `send`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn send(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    let f = e.tx_flags.load(Relaxed);
    if f == 0 {
        // SAFETY: the buffer stays valid until the completion (fi_msg(3)).
        return done(unsafe { e.ep.send(b, dest, ctx as usize) }, "fi_send");
    }
    // SAFETY: as above.
    unsafe { e.tx(&[IoSlice::new(b)], dest, ctx as usize, 0, 0, f, false) }
}

/// `sendv`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn sendv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; iov holds count entries.
    let (Some(e), Some(v)) = (unsafe { me(ep) }, unsafe { slices(iov, count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion (fi_msg(3)).
    unsafe { e.tx(&v, dest, ctx as usize, 0, 0, e.tx_flags.load(Relaxed), false) }
}

/// `sendmsg`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn sendmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg, flags: u64) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::sendmsg(ep, msg, flags) };
    }
    // SAFETY: libfabric passes our fid; msg is null or valid.
    let (Some(e), Some(m)) = (unsafe { me(ep) }, unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: msg_iov holds iov_count entries.
    let Some(v) = (unsafe { slices(m.msg_iov, m.iov_count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion (fi_msg(3)).
    unsafe { e.tx(&v, m.addr, m.context as usize, m.data, 0, flags, false) }
}

/// `inject`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn inject(ep: *mut sys::fid_ep, buf: *const c_void, len: usize, dest: u64) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    done(e.ep.inject(b, dest), "fi_inject")
}

/// `senddata`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn senddata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    let f = e.tx_flags.load(Relaxed) | sys::FI_REMOTE_CQ_DATA;
    // SAFETY: the buffer stays valid until the completion (fi_msg(3)).
    unsafe { e.tx(&[IoSlice::new(b)], dest, ctx as usize, data, 0, f, false) }
}

/// `injectdata`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn injectdata(ep: *mut sys::fid_ep, buf: *const c_void, len: usize, data: u64, dest: u64) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    done(e.ep.injectdata(b, data, dest), "fi_injectdata")
}

#[allow(clippy::too_many_arguments)]
/// `trecv`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
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
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes_mut(buf, len) }) else { return EINVAL as isize };
    let f = e.rx_flags.load(Relaxed);
    if f == 0 {
        // SAFETY: the buffer stays valid until the completion (fi_tagged(3)).
        return done(unsafe { e.ep.trecv(b, e.src(src), tag, ignore, ctx as usize) }, "fi_trecv");
    }
    // SAFETY: as above.
    unsafe { e.rx(&mut [IoSliceMut::new(b)], src, ctx as usize, tag, ignore, f, true) }
}

#[allow(clippy::too_many_arguments)]
/// `trecvv`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
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
    // SAFETY: libfabric passes our fid; iov holds count entries.
    let (Some(e), Some(mut v)) = (unsafe { me(ep) }, unsafe { slices_mut(iov, count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion.
    unsafe { e.rx(&mut v, src, ctx as usize, tag, ignore, e.rx_flags.load(Relaxed), true) }
}

/// `trecvmsg`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn trecvmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_tagged, flags: u64) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::trecvmsg(ep, msg, flags) };
    }
    // SAFETY: libfabric passes our fid; msg is null or valid.
    let (Some(e), Some(m)) = (unsafe { me(ep) }, unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: msg_iov holds iov_count entries.
    let Some(mut v) = (unsafe { slices_mut(m.msg_iov, m.iov_count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion.
    unsafe { e.rx(&mut v, m.addr, m.context as usize, m.tag, m.ignore, flags, true) }
}

/// `tsend`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn tsend(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    let f = e.tx_flags.load(Relaxed);
    if f == 0 {
        // SAFETY: the buffer stays valid until the completion.
        return done(unsafe { e.ep.tsend(b, dest, tag, ctx as usize) }, "fi_tsend");
    }
    // SAFETY: as above.
    unsafe { e.tx(&[IoSlice::new(b)], dest, ctx as usize, 0, tag, f, true) }
}

/// `tsendv`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn tsendv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; iov holds count entries.
    let (Some(e), Some(v)) = (unsafe { me(ep) }, unsafe { slices(iov, count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion.
    unsafe { e.tx(&v, dest, ctx as usize, 0, tag, e.tx_flags.load(Relaxed), true) }
}

/// `tsendmsg`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn tsendmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_tagged, flags: u64) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::tsendmsg(ep, msg, flags) };
    }
    // SAFETY: libfabric passes our fid; msg is null or valid.
    let (Some(e), Some(m)) = (unsafe { me(ep) }, unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: msg_iov holds iov_count entries.
    let Some(v) = (unsafe { slices(m.msg_iov, m.iov_count) }) else { return EINVAL as isize };
    // SAFETY: the segments stay valid until the completion.
    unsafe { e.tx(&v, m.addr, m.context as usize, m.data, m.tag, flags, true) }
}

/// `tinject`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn tinject(ep: *mut sys::fid_ep, buf: *const c_void, len: usize, dest: u64, tag: u64) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    done(e.ep.tinject(b, dest, tag), "fi_tinject")
}

#[allow(clippy::too_many_arguments)]
/// `tsenddata`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn tsenddata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    let f = e.tx_flags.load(Relaxed) | sys::FI_REMOTE_CQ_DATA;
    // SAFETY: the buffer stays valid until the completion.
    unsafe { e.tx(&[IoSlice::new(b)], dest, ctx as usize, data, tag, f, true) }
}

/// `tinjectdata`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn tinjectdata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    tag: u64,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    done(e.ep.tinjectdata(b, data, dest, tag), "fi_tinjectdata")
}

/// The endpoint's RMA calls (fi_rma(3)) over the library's: remote
/// addresses are offsets in the registration (no FI_MR_VIRT_ADDR);
/// descriptors are ignored (the library needs none). Every call is done
/// when it returns; its completion (or error entry: a wrong key, range or
/// right) is in the transmit CQ.
static RMA_OPS: sys::fi_ops_rma = sys::fi_ops_rma {
    size: std::mem::size_of::<sys::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};

/// The endpoint's default transmit flags (`tx_attr->op_flags`,
/// FI_SETOPSFLAG) for its RMA and atomic calls without a flags argument,
/// as `fi_send` takes them (fi_rma(3), fi_atomic(3)): FI_COMPLETION
/// decides the completion under FI_SELECTIVE_COMPLETION; FI_INJECT,
/// FI_INJECT_COMPLETE and FI_TRANSMIT_COMPLETE hold for every one-sided
/// call anyway (each is done when it returns).
#[inline(always)]
pub(crate) fn rma_defaults(e: &Ep) -> u64 {
    e.tx_flags.load(Relaxed) & !sys::FI_MORE
}

/// The remote segments of an `*msg` call.
///
/// # Safety
/// `v` null or valid for `n` entries.
unsafe fn rma_iovs(v: *const sys::fi_rma_iov, n: usize) -> Option<Vec<shmfab::RmaIov>> {
    if n == 0 {
        return Some(Vec::new());
    }
    if v.is_null() {
        return None;
    }
    // SAFETY: caller's contract.
    let s = unsafe { std::slice::from_raw_parts(v, n) };
    Some(s.iter().map(|r| shmfab::RmaIov { addr: r.addr, len: r.len, key: r.key }).collect())
}

/// `fi_read`.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn rma_read(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len writable bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes_mut(buf, len) }) else { return EINVAL as isize };
    let f = rma_defaults(e);
    if f == 0 {
        return done(e.ep.read(b, src, addr, key, ctx as usize), "fi_read");
    }
    let r = [shmfab::RmaIov { addr, len, key }];
    // FI_INJECT means nothing to a read (the library's readmsg takes it).
    done(e.ep.readmsg(&mut [IoSliceMut::new(b)], &r, src, ctx as usize, f & !sys::FI_INJECT), "fi_read")
}

/// `fi_readv`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_readv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; iov holds count writable segments.
    let (Some(e), Some(mut v)) = (unsafe { me(ep) }, unsafe { slices_mut(iov, count) }) else { return EINVAL as isize };
    let f = rma_defaults(e);
    if f == 0 {
        return done(e.ep.readv(&mut v, src, addr, key, ctx as usize), "fi_readv");
    }
    let r = [shmfab::RmaIov { addr, len: v.iter().map(|s| s.len()).sum(), key }];
    done(e.ep.readmsg(&mut v, &r, src, ctx as usize, f & !sys::FI_INJECT), "fi_readv")
}

/// `fi_readmsg`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_readmsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::readmsg(ep, msg, flags) };
    }
    // SAFETY: libfabric passes our fid and a valid msg.
    let (Some(e), Some(m)) = (unsafe { me(ep) }, unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: the msg's arrays hold their counts.
    let (Some(mut v), Some(r)) =
        (unsafe { slices_mut(m.msg_iov, m.iov_count) }, unsafe { rma_iovs(m.rma_iov, m.rma_iov_count) })
    else {
        return EINVAL as isize;
    };
    done(e.ep.readmsg(&mut v, &r, m.addr, m.context as usize, flags & !sys::FI_MORE), "fi_readmsg")
}

/// `fi_write`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_write(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    let f = rma_defaults(e);
    if f == 0 {
        return done(e.ep.write(b, dest, addr, key, ctx as usize), "fi_write");
    }
    let r = [shmfab::RmaIov { addr, len, key }];
    done(e.ep.writemsg(&[IoSlice::new(b)], &r, dest, ctx as usize, 0, f), "fi_write")
}

/// `fi_writev`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_writev(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; iov holds count segments.
    let (Some(e), Some(v)) = (unsafe { me(ep) }, unsafe { slices(iov, count) }) else { return EINVAL as isize };
    let f = rma_defaults(e);
    if f == 0 {
        return done(e.ep.writev(&v, dest, addr, key, ctx as usize), "fi_writev");
    }
    let r = [shmfab::RmaIov { addr, len: v.iter().map(|s| s.len()).sum(), key }];
    done(e.ep.writemsg(&v, &r, dest, ctx as usize, 0, f), "fi_writev")
}

/// `fi_writemsg`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_writemsg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    if flags & sys::FI_TRIGGER != 0 {
        // SAFETY: libfabric's contract, passed on.
        return unsafe { crate::trigger::writemsg(ep, msg, flags) };
    }
    // SAFETY: libfabric passes our fid and a valid msg.
    let (Some(e), Some(m)) = (unsafe { me(ep) }, unsafe { msg.as_ref() }) else { return EINVAL as isize };
    // SAFETY: the msg's arrays hold their counts.
    let (Some(v), Some(r)) =
        (unsafe { slices(m.msg_iov, m.iov_count) }, unsafe { rma_iovs(m.rma_iov, m.rma_iov_count) })
    else {
        return EINVAL as isize;
    };
    done(e.ep.writemsg(&v, &r, m.addr, m.context as usize, m.data, flags & !sys::FI_MORE), "fi_writemsg")
}

/// `fi_inject_write`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_inject(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    done(e.ep.inject_write(b, dest, addr, key), "fi_inject_write")
}

/// `fi_writedata`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_writedata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    let f = rma_defaults(e);
    if f == 0 {
        return done(e.ep.writedata(b, data, dest, addr, key, ctx as usize), "fi_writedata");
    }
    let r = [shmfab::RmaIov { addr, len, key }];
    let f = f | sys::FI_REMOTE_CQ_DATA;
    done(e.ep.writemsg(&[IoSlice::new(b)], &r, dest, ctx as usize, data, f), "fi_writedata")
}

/// `fi_inject_writedata`.
///
/// # Safety
/// As [`rma_read`].
unsafe extern "C" fn rma_injectdata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    // SAFETY: libfabric passes our fid; buf holds len bytes.
    let (Some(e), Some(b)) = (unsafe { me(ep) }, unsafe { bytes(buf, len) }) else { return EINVAL as isize };
    done(e.ep.inject_writedata(b, data, dest, addr, key), "fi_inject_writedata")
}
