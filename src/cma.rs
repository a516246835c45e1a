//! Single copy between processes with process_vm_readv (cross-memory
//! attach). Hosts may refuse it (containers, Yama ptrace rules): callers
//! fall back to the pipelined copy on [`CmaError::Refused`].

use crate::proto::CmaMode;

/// Why a single copy failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmaError {
    /// The kernel will not let us (EPERM, ENOSYS, ESRCH): use the pool.
    Refused(i32),
    /// The peer's addresses are bad (EFAULT, EINVAL) or it vanished.
    Fault(i32),
}

/// Reads `remote` (addr, len) ranges of process `pid` into `local` ranges,
/// looping over partial transfers. Returns bytes read (the smaller of both
/// totals).
pub fn read(pid: i32, local: &[(*mut u8, usize)], remote: &[(u64, u64)], mode: CmaMode) -> Result<usize, CmaError> {
    if mode == CmaMode::Fail {
        return Err(CmaError::Refused(libc::EPERM));
    }
    transfer(pid, local, remote, false)
}

/// Writes `local` ranges of ours into `remote` ranges of process `pid`
/// (process_vm_writev), looping over partial transfers; returns bytes written.
pub fn write(pid: i32, local: &[(*mut u8, usize)], remote: &[(u64, u64)], mode: CmaMode) -> Result<usize, CmaError> {
    if mode == CmaMode::Fail || mode == CmaMode::NoWrite {
        return Err(CmaError::Refused(libc::EPERM));
    }
    transfer(pid, local, remote, true)
}

fn transfer(pid: i32, local: &[(*mut u8, usize)], remote: &[(u64, u64)], write: bool) -> Result<usize, CmaError> {
    let want = local.iter().map(|l| l.1).sum::<usize>().min(remote.iter().map(|r| r.1 as usize).sum());
    let mut done = 0usize;
    while done < want {
        let (liov, riov) = (slice_iov(local, done, want - done), slice_iov_remote(remote, done, want - done));
        let (lp, ln, rp, rn) = (liov.as_ptr(), liov.len() as libc::c_ulong, riov.as_ptr(), riov.len() as libc::c_ulong);
        // SAFETY: liov points into caller-owned buffers of the given lengths
        // (writable for a read); riov names another process's memory, which
        // the kernel checks (EFAULT) - nothing of ours is touched by it.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, lp, ln, rp, rn, 0)
            } else {
                libc::process_vm_readv(pid, lp, ln, rp, rn, 0)
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            return Err(match e {
                // ESRCH: the pid names no process we can see (another
                // PID namespace): the pool, as for a refusal.
                libc::EPERM | libc::ENOSYS | libc::EACCES | libc::ESRCH => CmaError::Refused(e),
                libc::EINTR | libc::EAGAIN => continue,
                _ => CmaError::Fault(e),
            });
        }
        if n == 0 {
            return Err(CmaError::Fault(libc::EFAULT));
        }
        done += n as usize;
    }
    Ok(done)
}

/// The sub-range `[off, off + len)` of (addr, len) ranges.
pub fn sub_ranges(v: &[(u64, u64)], off: usize, len: usize) -> Vec<(u64, u64)> {
    slice_iov_remote(v, off, len).iter().map(|i| (i.iov_base as u64, i.iov_len as u64)).collect()
}

fn slice_iov(v: &[(*mut u8, usize)], mut skip: usize, mut len: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(v.len());
    for &(p, l) in v {
        if skip >= l {
            skip -= l;
            continue;
        }
        let take = (l - skip).min(len);
        // SAFETY: skip < l, so p + skip stays within the caller's buffer.
        out.push(libc::iovec { iov_base: unsafe { p.add(skip) } as *mut libc::c_void, iov_len: take });
        skip = 0;
        len -= take;
        if len == 0 {
            break;
        }
    }
    out
}

fn slice_iov_remote(v: &[(u64, u64)], skip: usize, len: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(v.len());
    let (mut skip, mut len) = (skip as u64, len as u64);
    for &(a, l) in v {
        if skip >= l {
            skip -= l;
            continue;
        }
        let take = (l - skip).min(len);
        out.push(libc::iovec { iov_base: a.wrapping_add(skip) as usize as *mut libc::c_void, iov_len: take as usize });
        skip = 0;
        len -= take;
        if len == 0 {
            break;
        }
    }
    out
}

/// Whether this kernel offers process_vm_readv at all (reads our own memory).
pub fn available() -> bool {
    let src = [7u8; 8];
    let mut dst = [0u8; 8];
    let r = read(std::process::id() as i32, &[(dst.as_mut_ptr(), 8)], &[(src.as_ptr() as u64, 8)], CmaMode::Auto);
    r == Ok(8) && dst == src
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_across_iov_boundaries() {
        let src: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
        let mut a = vec![0u8; 3000];
        let mut b = vec![0u8; 7000];
        let n = read(
            std::process::id() as i32,
            &[(a.as_mut_ptr(), a.len()), (b.as_mut_ptr(), b.len())],
            &[(src.as_ptr() as u64, 5000), (src[5000..].as_ptr() as u64, 5000)],
            CmaMode::Auto,
        );
        if !available() {
            assert!(matches!(n, Err(CmaError::Refused(_))));
            return;
        }
        assert_eq!(n, Ok(10000));
        assert_eq!(&a[..], &src[..3000]);
        assert_eq!(&b[..], &src[3000..]);
    }

    #[test]
    fn bad_remote_address_is_a_fault_and_fail_mode_is_refused() {
        let mut d = [0u8; 16];
        let r = read(std::process::id() as i32, &[(d.as_mut_ptr(), 16)], &[(8, 16)], CmaMode::Auto);
        assert!(matches!(r, Err(CmaError::Fault(_)) | Err(CmaError::Refused(_))));
        let r = read(std::process::id() as i32, &[(d.as_mut_ptr(), 16)], &[(8, 16)], CmaMode::Fail);
        assert_eq!(r, Err(CmaError::Refused(libc::EPERM)));
    }
}
