//! Address vectors (`fi_av_open`): insert, remove, lookup and straddr
//! over the library's AV. Addresses are shmfab's 24-byte endpoint
//! addresses (`fi_getname`); the handles are the library's table indices,
//! valid for both FI_AV_TABLE and FI_AV_MAP.
//!
//! An AV opened with FI_EVENT reports its inserts through the EQ bound to
//! it (`fi_av_bind`): the insert is made at once, then an error entry per
//! address that failed (its index in `data`) and one `FI_AV_COMPLETE`
//! event with the number inserted are queued, and the call returns 0.

use crate::sys;
use crate::util::{self, nb3, nb6, no_ops_open, no_ops_set, no_tostr, EBADFLAGS, EINVAL, ENOSYS};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

/// An address vector.
#[repr(C)]
pub struct Av {
    /// What the application holds.
    pub fid: sys::fid_av,
    dom: *const crate::domain::Domain,
    /// The library's AV.
    pub av: shmfab::AddressVector,
    /// Opened with FI_EVENT: inserts report through `eq`.
    event: bool,
    /// The EQ bound (null until `fi_av_bind`).
    eq: std::sync::atomic::AtomicPtr<crate::eq::Eq>,
    /// One past the highest handle ever given out (FI_UNIVERSE AV sets
    /// look at handles below it).
    pub(crate) hi: std::sync::atomic::AtomicU64,
    /// AV sets open on it (close is `-FI_EBUSY` while any is: `coll.rs`).
    pub(crate) sets: std::sync::atomic::AtomicUsize,
}

static FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(close),
    bind: Some(bind),
    control: Some(nb3),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static OPS: sys::fi_ops_av = sys::fi_ops_av {
    size: std::mem::size_of::<sys::fi_ops_av>(),
    insert: Some(insert),
    insertsvc: Some(nb6),
    insertsym: Some(nb8_sym),
    remove: Some(remove),
    lookup: Some(lookup),
    straddr: Some(straddr),
    av_set: Some(crate::coll::av_set),
};

/// `fi_av_insertsym`: shmfab addresses have no symbolic form.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn nb8_sym(
    _: *mut sys::fid_av,
    _: *const c_char,
    _: usize,
    _: *const c_char,
    _: usize,
    _: *mut u64,
    _: u64,
    _: *mut c_void,
) -> c_int {
    ENOSYS
}

/// The AV behind a fid.
///
/// # Safety
/// `f` null or a live fid.
pub unsafe fn of<'a>(f: *const sys::fid) -> Option<&'a Av> {
    // SAFETY: caller's contract.
    unsafe { util::ours(f, sys::FI_CLASS_AV, &FI_OPS) }
}

/// `fi_av_open`.
///
/// # Safety
/// libfabric's contract.
pub unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_av_attr,
    out: *mut *mut sys::fid_av,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's contract.
    let (Some(d), Some(a)) = (unsafe { crate::domain::of(domain.cast()) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    if out.is_null() || ![sys::FI_AV_UNSPEC, sys::FI_AV_MAP, sys::FI_AV_TABLE].contains(&a.type_) {
        return EINVAL;
    }
    // Named shared AVs and receive-context bits: not built yet.
    if !a.name.is_null() || a.rx_ctx_bits != 0 {
        return ENOSYS;
    }
    if a.flags & !(sys::FI_READ | sys::FI_SYMMETRIC | sys::FI_EVENT) != 0 {
        return EBADFLAGS;
    }
    let unspec = a.type_ == sys::FI_AV_UNSPEC;
    let av = match d.dom.av_open() {
        Ok(a) => a,
        Err(e) => return util::err(e, sys::FI_LOG_AV, "fi_av_open"),
    };
    d.refs.fetch_add(1, Relaxed);
    let b = Box::new(Av {
        fid: sys::fid_av { fid: util::fid(sys::FI_CLASS_AV, context, &FI_OPS), ops: util::ops(&OPS) },
        dom: d,
        av,
        event: a.flags & sys::FI_EVENT != 0,
        eq: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
        hi: std::sync::atomic::AtomicU64::new(0),
        sets: std::sync::atomic::AtomicUsize::new(0),
    });
    if unspec {
        // fi_av(3): "The AV type used will be returned through the type
        // field": the library's handles are table indices.
        // SAFETY: attr is the caller's attributes, valid for writes; `a`
        // is not used after this.
        unsafe { (*attr).type_ = sys::FI_AV_TABLE };
    }
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
    let Some(a) = (unsafe { of(fid) }) else { return EINVAL };
    if a.sets.load(Relaxed) > 0 {
        return crate::util::EBUSY;
    }
    if let Err(e) = a.av.close() {
        return util::err(e, sys::FI_LOG_AV, "fi_close(av)");
    }
    // SAFETY: the domain outlives its AVs, and a bound EQ its AVs (refs).
    unsafe {
        (*a.dom).refs.fetch_sub(1, Relaxed);
        if let Some(eq) = a.eq.load(Relaxed).as_ref() {
            eq.refs.fetch_sub(1, Relaxed);
        }
    }
    // SAFETY: made by Box::leak in `open`; the application gives it up.
    drop(unsafe { Box::from_raw((a as *const Av).cast_mut()) });
    0
}

/// `fi_av_bind`: the EQ that reports the inserts of an FI_EVENT AV (once;
/// flags must be 0).
///
/// # Safety
/// libfabric's contract: live fids.
unsafe extern "C" fn bind(fid: *mut sys::fid, bfid: *mut sys::fid, flags: u64) -> c_int {
    // SAFETY: libfabric passes our fid and a live one to bind.
    let (Some(a), Some(eq)) = (unsafe { of(fid) }, unsafe { crate::eq::of(bfid) }) else { return EINVAL };
    if flags != 0 {
        return EBADFLAGS;
    }
    let p = (eq as *const crate::eq::Eq).cast_mut();
    if a.eq.compare_exchange(std::ptr::null_mut(), p, Relaxed, Relaxed).is_err() {
        return EINVAL; // an EQ is bound already
    }
    eq.refs.fetch_add(1, Relaxed);
    0
}

/// `insert`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn insert(
    av: *mut sys::fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut u64,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(a) = (unsafe { of(av.cast()) }) else { return EINVAL };
    if flags & !(sys::FI_MORE | sys::FI_SYNC_ERR) != 0 {
        return EBADFLAGS;
    }
    if count > 0 && addr.is_null() {
        return EINVAL;
    }
    // SAFETY: a bound EQ outlives the AV (its close is refused while bound).
    let eq = unsafe { a.eq.load(Relaxed).as_ref() };
    if a.event && eq.is_none() {
        return -(sys::FI_ENOEQ as c_int);
    }
    let n = crate::info::ADDRLEN;
    let mut ok = 0;
    for i in 0..count {
        // SAFETY: addr holds count addresses of ADDRLEN bytes (fi_av(3)).
        let raw = unsafe { std::slice::from_raw_parts(addr.cast::<u8>().add(i * n), n) };
        let r = a.av.insert_bytes(raw);
        if let Ok(f) = r {
            a.hi.fetch_max(f + 1, Relaxed);
        }
        let errno = match &r {
            Ok(_) => 0,
            Err(e) => e.errno(),
        };
        if !fi_addr.is_null() {
            // SAFETY: fi_addr holds count entries when given.
            unsafe { *fi_addr.add(i) = r.as_ref().map_or(util::FI_ADDR_NOTAVAIL, |f| *f) };
        }
        if flags & sys::FI_SYNC_ERR != 0 && !context.is_null() {
            // SAFETY: with FI_SYNC_ERR, context is an int array of count
            // entries (fi_av(3)).
            unsafe { *context.cast::<c_int>().add(i) = errno };
        }
        match r {
            Ok(_) => ok += 1,
            Err(e) => {
                let errno = util::err(e, sys::FI_LOG_AV, "fi_av_insert");
                if let (true, Some(q)) = (a.event, eq) {
                    q.post_err(fid_of(a), context, i as u64, -errno);
                }
            }
        }
    }
    match (a.event, eq) {
        (true, Some(q)) => {
            let done = sys::fi_eq_entry { fid: fid_of(a), context, data: ok as u64 };
            // SAFETY: an fi_eq_entry is plain data: its bytes are the event.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&done as *const sys::fi_eq_entry).cast::<u8>(),
                    std::mem::size_of_val(&done),
                )
            };
            q.post(sys::FI_AV_COMPLETE, bytes);
            0
        }
        _ => ok,
    }
}

/// The AV's own fid, as events name it.
fn fid_of(a: &Av) -> *mut sys::fid {
    (&a.fid.fid as *const sys::fid).cast_mut()
}

/// `remove`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn remove(av: *mut sys::fid_av, fi_addr: *mut u64, count: usize, flags: u64) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(a) = (unsafe { of(av.cast()) }) else { return EINVAL };
    if flags != 0 {
        return EBADFLAGS;
    }
    if count == 0 {
        return 0;
    }
    if fi_addr.is_null() {
        return EINVAL;
    }
    // SAFETY: fi_addr holds count handles.
    let v = unsafe { std::slice::from_raw_parts(fi_addr, count) };
    util::status(a.av.remove(v), sys::FI_LOG_AV, "fi_av_remove")
}

/// `lookup`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn lookup(av: *mut sys::fid_av, fi_addr: u64, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    // SAFETY: libfabric passes our fid.
    let Some(a) = (unsafe { of(av.cast()) }) else { return EINVAL };
    if addrlen.is_null() {
        return EINVAL;
    }
    let raw = match a.av.lookup(fi_addr) {
        Ok(x) => x.to_bytes(),
        Err(e) => return util::err(e, sys::FI_LOG_AV, "fi_av_lookup"),
    };
    // SAFETY: addrlen is valid; addr holds *addrlen bytes (fi_av(3)).
    unsafe {
        let n = (*addrlen).min(raw.len());
        if n > 0 && !addr.is_null() {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), addr.cast::<u8>(), n);
        }
        *addrlen = raw.len();
    }
    0
}

/// `straddr`: an entry of this module's ops tables.
///
/// # Safety
/// libfabric's contract: the fid is one this provider made, and every
/// pointer is valid as the call's man page says.
unsafe extern "C" fn straddr(
    _: *mut sys::fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    if addr.is_null() || len.is_null() {
        return std::ptr::null();
    }
    // SAFETY: addr is an address of ADDRLEN bytes (fi_av(3)).
    let raw = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), crate::info::ADDRLEN) };
    let s = match shmfab::Address::from_bytes(raw) {
        Some(a) => shmfab::AddressVector::straddr(&a),
        None => "shmfab://?".to_string(),
    };
    // SAFETY: len is valid; buf holds *len bytes.
    unsafe {
        let room = *len;
        *len = s.len() + 1;
        util::copy_cstr(&s, buf, room);
    }
    buf
}
