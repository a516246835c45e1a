//! The provider's own extensions, reached with `fi_open_ops` and
//! declared for C in `fi/include/shmfab_ext.h` (whose comment is their
//! manual).
//!
//! `shmfab_domain_ops_v1` on a domain: `alloc_shared`, the library's
//! shared heap (`shmfab::Domain::alloc_shared`) as a registration. RMA
//! to it is a copy by the initiator and atomics on it are CPU atomics,
//! with no work for the process that owns it; `fi_close` of the
//! registration frees it.

use crate::domain;
use crate::sys;
use crate::util::{self, EBADFLAGS, EINVAL};
use std::ffi::{c_char, c_int, c_void, CStr};

/// The name `fi_open_ops` takes for [`DomainOpsV1`]
/// (`SHMFAB_DOMAIN_OPS_V1`).
pub const DOMAIN_OPS_V1: &CStr = c"shmfab_domain_ops_v1";

/// `alloc_shared(domain, len, access, flags, &buf, &mr, context)`.
pub type AllocShared = unsafe extern "C" fn(
    *mut sys::fid_domain,
    usize,
    u64,
    u64,
    *mut *mut c_void,
    *mut *mut sys::fid_mr,
    *mut c_void,
) -> c_int;

/// `struct shmfab_domain_ops_v1` of `shmfab_ext.h`.
#[repr(C)]
pub struct DomainOpsV1 {
    /// Bytes of this table (later versions only append entries).
    pub size: usize,
    /// Shared-heap memory, registered.
    pub alloc_shared: Option<AllocShared>,
}

static DOMAIN_OPS: DomainOpsV1 =
    DomainOpsV1 { size: std::mem::size_of::<DomainOpsV1>(), alloc_shared: Some(alloc_shared) };

/// `ops_open` of a domain's `struct fi_ops`: [`DOMAIN_OPS_V1`] gives the
/// static [`DomainOpsV1`]; other names `-FI_ENOSYS`.
///
/// # Safety
/// libfabric's contract: `fid` live, `name` null or a C string, `ops`
/// null or valid for a write.
pub unsafe extern "C" fn domain_ops_open(
    fid: *mut sys::fid,
    name: *const c_char,
    flags: u64,
    ops: *mut *mut c_void,
    _context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes our fid.
    if unsafe { domain::of(fid) }.is_none() || name.is_null() || ops.is_null() {
        return EINVAL;
    }
    // SAFETY: name is a C string (caller's contract).
    if unsafe { CStr::from_ptr(name) } != DOMAIN_OPS_V1 {
        return util::ENOSYS;
    }
    if flags != 0 {
        return EBADFLAGS;
    }
    // SAFETY: ops is valid for a write (checked non-null; caller's
    // contract). The table is static and nothing writes through it.
    unsafe { *ops = (&DOMAIN_OPS as *const DomainOpsV1).cast_mut().cast() };
    0
}

/// `alloc_shared` of [`DomainOpsV1`].
///
/// # Safety
/// `domain` a live fid; `buf` and `mr` null or valid for a write.
unsafe extern "C" fn alloc_shared(
    domain: *mut sys::fid_domain,
    len: usize,
    access: u64,
    flags: u64,
    buf: *mut *mut c_void,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: caller's contract.
    let Some(d) = (unsafe { domain::of(domain.cast()) }) else { return EINVAL };
    if buf.is_null() || mr.is_null() || len == 0 || access & !domain::ACCESS != 0 {
        return EINVAL;
    }
    if flags & !sys::FI_RMA_EVENT != 0 {
        return EBADFLAGS;
    }
    if !domain::has_prov_keys(d) {
        util::log(
            sys::FI_LOG_WARN,
            sys::FI_LOG_MR,
            "alloc_shared: the domain was opened without FI_MR_PROV_KEY; the heap's keys are the provider's",
        );
        return -(sys::FI_EOPNOTSUPP as c_int);
    }
    let lib = match d.dom.alloc_shared(len, access) {
        Ok(m) => m,
        Err(e) => return util::err(e, sys::FI_LOG_MR, "alloc_shared"),
    };
    let p = lib.as_ptr();
    let m = domain::lib_mr(d, lib, (p as usize, len), access, context);
    // SAFETY: buf and mr are valid for writes (checked non-null).
    unsafe {
        *buf = p.cast();
        *mr = m;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C header's layout: a size_t then one function pointer.
    #[test]
    fn the_table_is_laid_out_as_the_header_says() {
        assert_eq!(std::mem::size_of::<DomainOpsV1>(), 2 * std::mem::size_of::<usize>());
        assert_eq!(std::mem::offset_of!(DomainOpsV1, alloc_shared), std::mem::size_of::<usize>());
        assert_eq!(DOMAIN_OPS.size, std::mem::size_of::<DomainOpsV1>());
    }
}
