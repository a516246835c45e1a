//! What every object module uses: errors as the C API returns them,
//! logging through libfabric's `fi_log`, the ops entries of calls not built
//! yet (`-FI_ENOSYS`), and the checks that a `fid` is one of ours.

use crate::sys;
use std::ffi::{c_char, c_int, c_void, CString};

/// `-FI_ENOSYS` (the return of every call not built yet).
pub const ENOSYS: c_int = -sys::FI_ENOSYS;
/// `-FI_EINVAL`.
pub const EINVAL: c_int = -sys::FI_EINVAL;
/// `-FI_EBUSY`.
pub const EBUSY: c_int = -sys::FI_EBUSY;
/// `-FI_ENODATA`.
pub const ENODATA: c_int = -sys::FI_ENODATA;
/// `-FI_ENOMEM`.
pub const ENOMEM: c_int = -sys::FI_ENOMEM;
/// `-FI_EBADFLAGS`.
pub const EBADFLAGS: c_int = -(sys::FI_EBADFLAGS as c_int);
/// `-FI_ETOOSMALL`.
pub const ETOOSMALL: c_int = -(sys::FI_ETOOSMALL as c_int);
/// `FI_ADDR_UNSPEC` (a cast in the header, which bindgen leaves out).
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
/// `FI_ADDR_NOTAVAIL` (likewise).
pub const FI_ADDR_NOTAVAIL: u64 = u64::MAX;

/// The negative fabric errno of a library error, logged (at `FI_LOG_INFO`,
/// with the library's detail) when that level is enabled, unless it is
/// `-FI_EAGAIN` or `-FI_EAVAIL`, which polling loops see all the time.
/// The message is formatted only when it is logged: an error return
/// allocates nothing otherwise.
#[inline(always)]
pub fn err(e: shmfab::Error, subsys: sys::fi_log_subsys, what: &str) -> c_int {
    // An empty CQ read or a full queue: the poll loop's answer, never
    // logged, kept to one compare (no call, nothing to drop).
    if e.is_plain_again() {
        // Nothing to free: a plain error holds no allocation.
        std::mem::forget(e);
        return -libc::EAGAIN;
    }
    err_other(e, subsys, what)
}

/// [`err`] of anything but a plain `-FI_EAGAIN`: logged at
/// `FI_LOG_LEVEL=info` unless it is `-FI_EAGAIN` or `-FI_EAVAIL`.
#[cold]
#[inline(never)]
fn err_other(e: shmfab::Error, subsys: sys::fi_log_subsys, what: &str) -> c_int {
    use shmfab::ErrorKind::{Again, Avail};
    let k = e.kind();
    if !matches!(k, Again | Avail) && log_enabled(sys::FI_LOG_INFO, subsys) {
        log(sys::FI_LOG_INFO, subsys, &format!("{what}: {e}"));
    }
    -k.errno()
}

/// Whether libfabric logs `level` of `subsys` for this provider.
fn log_enabled(level: sys::fi_log_level, subsys: sys::fi_log_subsys) -> bool {
    // SAFETY: the provider struct is the registered one, alive for the
    // library's life; fi_log_enabled only reads it.
    unsafe { sys::fi_log_enabled(crate::provider(), level, subsys) != 0 }
}

/// `Result<usize>` as the `ssize_t` of the C calls.
#[inline]
pub fn ssize(r: shmfab::Result<usize>, subsys: sys::fi_log_subsys, what: &str) -> isize {
    match r {
        Ok(n) => n as isize,
        Err(e) => err(e, subsys, what) as isize,
    }
}

/// `Result<()>` as the `0` or negative errno of the C calls.
#[inline]
pub fn status(r: shmfab::Result<()>, subsys: sys::fi_log_subsys, what: &str) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => err(e, subsys, what),
    }
}

/// Writes `msg` to libfabric's log (`FI_LOG_LEVEL`, `FI_LOG_PROV`) when
/// that level and subsystem are enabled for this provider.
pub fn log(level: sys::fi_log_level, subsys: sys::fi_log_subsys, msg: &str) {
    let prov = crate::provider();
    if !log_enabled(level, subsys) {
        return;
    }
    let Ok(text) = CString::new(msg.replace('\0', " ")) else { return };
    // SAFETY: every pointer is a valid NUL-terminated string for the call;
    // the format "%s" takes exactly the one string argument given.
    unsafe {
        sys::fi_log(prov, level, subsys, c"shmfab".as_ptr(), 0, c"%s\n".as_ptr(), text.as_ptr());
    }
}

/// Copies `s` into a caller's buffer as a NUL-terminated string (cut to
/// fit), as `fi_cq_strerror` and `fi_eq_strerror` do with theirs.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
pub unsafe fn copy_cstr(s: &str, buf: *mut c_char, len: usize) -> bool {
    if buf.is_null() || len == 0 {
        return false;
    }
    let n = s.len().min(len - 1);
    // SAFETY: buf holds len >= n + 1 bytes (caller's contract); the source
    // is n bytes of s; they cannot overlap (s is ours).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    true
}

/// A `'static` NUL-terminated copy of `s`, one per distinct text (the
/// texts are the library's fixed strerror strings, so the set is small).
pub fn static_cstr(s: &'static str) -> *const c_char {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static TEXTS: OnceLock<Mutex<HashMap<&'static str, &'static std::ffi::CStr>>> = OnceLock::new();
    let mut m = TEXTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    m.entry(s)
        .or_insert_with(|| Box::leak(CString::new(s.replace('\0', " ")).unwrap_or_default().into_boxed_c_str()))
        .as_ptr()
}

/// The value an ops entry not built yet returns.
pub trait NotBuilt {
    /// `-FI_ENOSYS` in this return type.
    const ENOSYS: Self;
}
impl NotBuilt for isize {
    const ENOSYS: Self = -(sys::FI_ENOSYS as isize);
}
impl NotBuilt for c_int {
    const ENOSYS: Self = -sys::FI_ENOSYS;
}

/// `nb0` .. `nb16`: an ops-table entry of any signature with that many
/// arguments that returns `-FI_ENOSYS` (an operation this provider has
/// not built yet; libfabric calls ops entries without checking them for
/// NULL). Written `Some(nbN)`, the argument types come from the table's
/// field.
macro_rules! not_built {
    ($($name:ident($($a:ident),*);)*) => {$(
        /// An ops entry not built yet: `-FI_ENOSYS`.
        ///
        /// # Safety
        /// None needed (it touches none of its arguments); `unsafe` to fit
        /// the ops tables.
        #[allow(clippy::too_many_arguments, improper_ctypes_definitions)]
        pub unsafe extern "C" fn $name<$($a,)* R: NotBuilt>($(_: $a),*) -> R {
            R::ENOSYS
        }
    )*};
}
not_built! {
    nb1(A);
    nb2(A, B);
    nb3(A, B, C);
    nb4(A, B, C, D);
    nb5(A, B, C, D, E);
    nb6(A, B, C, D, E, F);
    nb7(A, B, C, D, E, F, G);
    nb8(A, B, C, D, E, F, G, H);
    nb9(A, B, C, D, E, F, G, H, I);
    nb10(A, B, C, D, E, F, G, H, I, J);
    nb11(A, B, C, D, E, F, G, H, I, J, K);
    nb12(A, B, C, D, E, F, G, H, I, J, K, L);
    nb13(A, B, C, D, E, F, G, H, I, J, K, L, M);
    nb14(A, B, C, D, E, F, G, H, I, J, K, L, M, N);
    nb16(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P);
}

/// `fi_tostr` hook entry of `struct fi_ops`: none (libfabric prints the
/// fid generically).
///
/// # Safety
/// None needed (it touches none of its arguments); `unsafe` to fit
/// `struct fi_ops`.
pub unsafe extern "C" fn no_tostr(_: *const sys::fid, _: *mut c_char, _: usize) -> c_int {
    ENOSYS
}

/// `ops_set` entry of `struct fi_ops`: not offered.
///
/// # Safety
/// None needed (it touches none of its arguments); `unsafe` to fit
/// `struct fi_ops`.
pub unsafe extern "C" fn no_ops_set(
    _: *mut sys::fid,
    _: *const c_char,
    _: u64,
    _: *mut std::ffi::c_void,
    _: *mut std::ffi::c_void,
) -> c_int {
    ENOSYS
}

/// `ops_open` entry of `struct fi_ops`: no provider extensions.
///
/// # Safety
/// None needed (it touches none of its arguments); `unsafe` to fit
/// `struct fi_ops`.
pub unsafe extern "C" fn no_ops_open(
    _: *mut sys::fid,
    _: *const c_char,
    _: u64,
    _: *mut *mut std::ffi::c_void,
    _: *mut std::ffi::c_void,
) -> c_int {
    ENOSYS
}

/// A pointer to a static ops table, as the C structs hold it (`*mut`;
/// nothing writes through it).
pub fn ops<T>(t: &'static T) -> *mut T {
    (t as *const T).cast_mut()
}

/// Our object behind `fid` of class `class` whose `struct fi_ops` is
/// `ops`, or None when the fid is null, of another class, or not made by
/// this provider's code for that class.
///
/// # Safety
/// `fid` must be null or point to a live `struct fid`; `T` must be the
/// `#[repr(C)]` object type that starts with the fid and uses `ops`.
pub unsafe fn ours<'a, T>(fid: *const sys::fid, class: u32, ops: &'static sys::fi_ops) -> Option<&'a T> {
    if fid.is_null() {
        return None;
    }
    // SAFETY: fid is live (caller's contract).
    let f = unsafe { &*fid };
    if f.fclass as u32 != class || !std::ptr::eq(f.ops, ops) {
        return None;
    }
    // SAFETY: a fid of that class with our ops table is the first field of
    // a T made by this crate (repr(C)), alive while its fid is.
    Some(unsafe { &*fid.cast::<T>() })
}

/// A `struct fid` of `class` with `ops`, and the application's context.
pub fn fid(class: u32, context: *mut std::ffi::c_void, ops_table: &'static sys::fi_ops) -> sys::fid {
    sys::fid { fclass: class as usize, context, ops: ops(ops_table) }
}

/// RMA ops of a shared receive context (which transmits nothing; an
/// endpoint's are `ep.rs`'s): `-FI_ENOSYS`.
pub static NB_RMA_OPS: sys::fi_ops_rma = sys::fi_ops_rma {
    size: std::mem::size_of::<sys::fi_ops_rma>(),
    read: Some(nb8),
    readv: Some(nb8),
    readmsg: Some(nb3),
    write: Some(nb8),
    writev: Some(nb8),
    writemsg: Some(nb3),
    inject: Some(nb6),
    writedata: Some(nb9),
    injectdata: Some(nb7),
};

/// Atomic ops of a shared receive context (an endpoint's are in
/// `atomic.rs`): `-FI_ENOSYS`.
pub static NB_ATOMIC_OPS: sys::fi_ops_atomic = sys::fi_ops_atomic {
    size: std::mem::size_of::<sys::fi_ops_atomic>(),
    write: Some(nb10),
    writev: Some(nb10),
    writemsg: Some(nb3),
    inject: Some(nb8),
    readwrite: Some(nb12),
    readwritev: Some(nb13),
    readwritemsg: Some(nb6),
    compwrite: Some(nb14),
    compwritev: Some(nb16),
    compwritemsg: Some(nb9),
    writevalid: Some(nb4),
    readwritevalid: Some(nb4),
    compwritevalid: Some(nb4),
};

/// Collective ops of a shared receive context: not offered (endpoints
/// have `coll::COLL_OPS`).
pub static NB_COLL_OPS: sys::fi_ops_collective = sys::fi_ops_collective {
    size: std::mem::size_of::<sys::fi_ops_collective>(),
    barrier: Some(nb3),
    broadcast: Some(nb9),
    alltoall: Some(nb10),
    allreduce: Some(nb11),
    allgather: Some(nb10),
    reduce_scatter: Some(nb11),
    reduce: Some(nb12),
    scatter: Some(nb11),
    gather: Some(nb11),
    msg: Some(nb6),
    barrier2: Some(nb4),
};

/// `fi_getopt` of an endpoint or a shared receive context: the one option
/// either has, FI_OPT_MIN_MULTI_RECV (`cur`); anything else
/// `-FI_ENOPROTOOPT`.
///
/// # Safety
/// `val` null or valid for `*len` bytes, `len` null or valid
/// (fi_endpoint(3)).
pub unsafe fn getopt_min_multi_recv(level: c_int, name: c_int, val: *mut c_void, len: *mut usize, cur: usize) -> c_int {
    if level as u32 != sys::FI_OPT_ENDPOINT || name as u32 != sys::FI_OPT_MIN_MULTI_RECV {
        return -sys::FI_ENOPROTOOPT;
    }
    if val.is_null() || len.is_null() {
        return EINVAL;
    }
    // SAFETY: len is valid; val holds *len bytes (caller's contract).
    unsafe {
        if *len < std::mem::size_of::<usize>() {
            *len = std::mem::size_of::<usize>();
            return ETOOSMALL;
        }
        *val.cast::<usize>() = cur;
        *len = std::mem::size_of::<usize>();
    }
    0
}

/// `fi_setopt` of an endpoint or a shared receive context:
/// FI_OPT_MIN_MULTI_RECV, given to `set` (the library's setter), then
/// kept in `keep` for `getopt`; anything else `-FI_ENOPROTOOPT`.
///
/// # Safety
/// `val` null or valid for `len` bytes (fi_endpoint(3)).
pub unsafe fn setopt_min_multi_recv(
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: usize,
    keep: &std::sync::atomic::AtomicUsize,
    set: impl FnOnce(usize) -> shmfab::Result<()>,
    what: &str,
) -> c_int {
    if level as u32 != sys::FI_OPT_ENDPOINT || name as u32 != sys::FI_OPT_MIN_MULTI_RECV {
        return -sys::FI_ENOPROTOOPT;
    }
    if val.is_null() || len != std::mem::size_of::<usize>() {
        return EINVAL;
    }
    // SAFETY: val holds a size_t (checked length; caller's contract).
    let n = unsafe { *val.cast::<usize>() };
    match set(n) {
        Ok(()) => {
            keep.store(n, std::sync::atomic::Ordering::Relaxed);
            0
        }
        Err(e) => err(e, sys::FI_LOG_EP_CTRL, what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        /// Allocations made by this thread.
        static ALLOCS: Cell<usize> = const { Cell::new(0) };
    }

    /// The system allocator, counting each thread's allocations.
    struct Counting;

    // SAFETY: every call is the system allocator's, with the caller's
    // arguments; the count is a thread-local without destructor.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
            // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: p came from `alloc` above with this layout.
            unsafe { System.dealloc(p, l) }
        }
    }

    #[global_allocator]
    static A: Counting = Counting;

    /// With logging off (no FI_LOG_LEVEL: libfabric's log mask is empty
    /// before it is initialised), an error return allocates nothing.
    #[test]
    fn an_error_return_allocates_nothing_when_not_logged() {
        use shmfab::{Error, ErrorKind};
        for kind in [ErrorKind::Again, ErrorKind::Avail, ErrorKind::Inval, ErrorKind::Busy] {
            let e = Error::new(kind);
            let before = ALLOCS.with(Cell::get);
            let r = err(e, sys::FI_LOG_CQ, "test");
            assert_eq!(ALLOCS.with(Cell::get), before, "{kind:?} allocated");
            assert_eq!(r, -kind.errno());
        }
    }
}
