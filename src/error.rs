//! One error type whose kinds map 1:1 onto libfabric's fabric errno values,
//! so a C ABI layer can return `-err.errno()` unchanged.
//!
//! ```
//! use shmfab::{Error, ErrorKind};
//! let e = Error::new(ErrorKind::Again);
//! assert_eq!(e.errno(), 11); // FI_EAGAIN == EAGAIN
//! assert_eq!(Error::from_errno(265).kind(), ErrorKind::Trunc);
//! ```

use std::fmt;

/// Fabric errno kinds (values as in `rdma/fi_errno.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// FI_EPERM: operation not permitted.
    Perm,
    /// FI_ENOENT: no such entry.
    NoEnt,
    /// FI_EINTR: interrupted.
    Intr,
    /// FI_EIO: I/O error (peer gone, fault while copying).
    Io,
    /// FI_EAGAIN: try again (nothing there, or no room now).
    Again,
    /// FI_ENOMEM: out of memory.
    NoMem,
    /// FI_EBUSY: resource busy (object still bound).
    Busy,
    /// FI_EINVAL: invalid argument.
    Inval,
    /// FI_ENOSPC: no space left (e.g. /dev/shm full).
    NoSpc,
    /// FI_ENOSYS: not implemented.
    NoSys,
    /// FI_ENODATA: no data available.
    NoData,
    /// FI_EMSGSIZE: message too long.
    MsgSize,
    /// FI_EOPNOTSUPP: operation not supported.
    OpNotSupp,
    /// FI_EADDRNOTAVAIL: address not available.
    AddrNotAvail,
    /// FI_ECONNRESET: connection reset by peer.
    ConnReset,
    /// FI_ETIMEDOUT: timed out.
    TimedOut,
    /// FI_EHOSTUNREACH: peer unreachable.
    HostUnreach,
    /// FI_EALREADY: already in progress.
    Already,
    /// FI_ECANCELED: operation cancelled.
    Canceled,
    /// FI_EOTHER: unspecified error.
    Other,
    /// FI_ETOOSMALL: provided buffer too small.
    TooSmall,
    /// FI_EAVAIL: an error entry is available.
    Avail,
    /// FI_EBADFLAGS: flags not supported.
    BadFlags,
    /// FI_ENOCQ: missing completion queue.
    NoCq,
    /// FI_ETRUNC: truncated.
    Trunc,
    /// FI_ENOKEY: key not available.
    NoKey,
    /// FI_EOVERRUN: queue overrun.
    Overrun,
    /// FI_ENOMSG: no message of the kind wanted (a peek found none).
    NoMsg,
}

/// One row per kind, in declaration order (`TABLE[k as usize].0 == k`: a
/// kind-only [`Error`] holds its kind's index).
const TABLE: &[(ErrorKind, i32, &str)] = &[
    (ErrorKind::Perm, libc::EPERM, "Operation not permitted"),
    (ErrorKind::NoEnt, libc::ENOENT, "No such file or directory"),
    (ErrorKind::Intr, libc::EINTR, "Interrupted system call"),
    (ErrorKind::Io, libc::EIO, "Input/output error"),
    (ErrorKind::Again, libc::EAGAIN, "Resource temporarily unavailable"),
    (ErrorKind::NoMem, libc::ENOMEM, "Cannot allocate memory"),
    (ErrorKind::Busy, libc::EBUSY, "Device or resource busy"),
    (ErrorKind::Inval, libc::EINVAL, "Invalid argument"),
    (ErrorKind::NoSpc, libc::ENOSPC, "No space left on device"),
    (ErrorKind::NoSys, libc::ENOSYS, "Function not implemented"),
    (ErrorKind::NoData, libc::ENODATA, "No data available"),
    (ErrorKind::MsgSize, libc::EMSGSIZE, "Message too long"),
    (ErrorKind::OpNotSupp, libc::EOPNOTSUPP, "Operation not supported"),
    (ErrorKind::AddrNotAvail, libc::EADDRNOTAVAIL, "Cannot assign requested address"),
    (ErrorKind::ConnReset, libc::ECONNRESET, "Connection reset by peer"),
    (ErrorKind::TimedOut, libc::ETIMEDOUT, "Connection timed out"),
    (ErrorKind::HostUnreach, libc::EHOSTUNREACH, "No route to host"),
    (ErrorKind::Already, libc::EALREADY, "Operation already in progress"),
    (ErrorKind::Canceled, libc::ECANCELED, "Operation canceled"),
    (ErrorKind::Other, 256, "Unspecified error"),
    (ErrorKind::TooSmall, 257, "Provided buffer is too small"),
    (ErrorKind::Avail, 259, "Error available"),
    (ErrorKind::BadFlags, 260, "Flags not supported"),
    (ErrorKind::NoCq, 263, "Missing or unavailable completion queue"),
    (ErrorKind::Trunc, 265, "Truncation error"),
    (ErrorKind::NoKey, 266, "Required key not available"),
    (ErrorKind::Overrun, 268, "Queue has been overrun"),
    (ErrorKind::NoMsg, libc::ENOMSG, "No message of desired type"),
];

impl ErrorKind {
    /// Positive fabric errno value.
    #[inline]
    pub fn errno(self) -> i32 {
        // The table has a row per kind in declaration order (tested).
        TABLE[self as usize].1
    }

    /// fi_strerror text.
    pub fn message(self) -> &'static str {
        TABLE[self as usize].2
    }

    /// The kind of a positive fabric errno (FI_EOTHER when unknown).
    pub fn from_errno(errno: i32) -> ErrorKind {
        // A peer's status word may be any value: i32::MIN has no absolute
        // value, and is no errno.
        let errno = errno.checked_abs().unwrap_or(0);
        TABLE.iter().find(|t| t.1 == errno).map(|t| t.0).unwrap_or(ErrorKind::Other)
    }
}

/// An error with its detail (behind [`Error`]'s pointer).
struct Detailed {
    kind: ErrorKind,
    detail: Box<str>,
}

/// An error: a fabric errno kind and, when useful, what happened.
///
/// One machine word, so that `Result<()>` and `Result<usize>` come back
/// from calls in registers (a three-word error made every result go
/// through memory, on the path of every message). The word is odd for a
/// kind alone (`kind << 1 | 1`, no allocation), or else a pointer from
/// `Box::into_raw` to the kind and its detail.
pub struct Error {
    repr: std::ptr::NonNull<Detailed>,
}

// SAFETY: an Error owns at most one Box<Detailed>, never shared and never
// mutated after creation; Detailed is Send and Sync.
unsafe impl Send for Error {}
// SAFETY: as above: shared references only read the immutable Detailed.
unsafe impl Sync for Error {}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind` with no detail (cheap: no allocation).
    pub const fn new(kind: ErrorKind) -> Self {
        let bits = match std::num::NonZeroUsize::new((kind as usize) << 1 | 1) {
            Some(b) => b,
            None => unreachable!(),
        };
        // An odd address: never dereferenced (see `detailed`).
        Error { repr: std::ptr::NonNull::without_provenance(bits) }
    }

    /// An error of `kind` saying what happened.
    pub fn with(kind: ErrorKind, detail: impl Into<String>) -> Self {
        let b = Box::new(Detailed { kind, detail: detail.into().into_boxed_str() });
        Error { repr: std::ptr::NonNull::from(Box::leak(b)) }
    }

    /// The kind and detail, if this error has a detail.
    #[inline]
    fn detailed(&self) -> Option<&Detailed> {
        if self.repr.addr().get() & 1 == 1 {
            return None;
        }
        // SAFETY: an even repr is the pointer `with` took from a Box, which
        // this Error owns until drop.
        Some(unsafe { self.repr.as_ref() })
    }

    /// The kind.
    #[inline]
    pub fn kind(&self) -> ErrorKind {
        match self.detailed() {
            None => TABLE[self.repr.addr().get() >> 1].0,
            Some(d) => d.kind,
        }
    }

    /// Positive fabric errno.
    #[inline]
    pub fn errno(&self) -> i32 {
        self.kind().errno()
    }

    /// The error of a positive or negative fabric errno.
    pub fn from_errno(errno: i32) -> Self {
        Error::new(ErrorKind::from_errno(errno))
    }

    /// The detail, if any.
    pub fn detail(&self) -> Option<&str> {
        self.detailed().map(|d| &*d.detail)
    }

    /// `-FI_EAGAIN`.
    pub const AGAIN: Error = Error::new(ErrorKind::Again);

    /// Whether this is [`Error::AGAIN`] (no detail): one compare, for
    /// the poll loops' answer.
    #[inline]
    pub fn is_plain_again(&self) -> bool {
        self.repr == Error::AGAIN.repr
    }
}

impl Drop for Error {
    /// Inline: an error without detail (`-FI_EAGAIN` of every empty CQ
    /// read a poll loop makes) is dropped with one test, not a call (a
    /// profile of the ping-pong bench found the call at 4-5% of its
    /// samples, all in the wait for the answer).
    #[inline(always)]
    fn drop(&mut self) {
        if self.repr.addr().get() & 1 == 0 {
            drop_detailed(self.repr);
        }
    }
}

/// The detail of a dropped [`Error`] (its even repr).
#[cold]
#[inline(never)]
fn drop_detailed(repr: std::ptr::NonNull<Detailed>) {
    // SAFETY: an even repr came from Box::leak in `Error::with` and is
    // owned by the Error being dropped alone; it is dropped once, here.
    drop(unsafe { Box::from_raw(repr.as_ptr()) });
}

impl Clone for Error {
    fn clone(&self) -> Self {
        match self.detailed() {
            None => Error { repr: self.repr },
            Some(d) => Error::with(d.kind, &*d.detail),
        }
    }
}

impl PartialEq for Error {
    fn eq(&self, o: &Self) -> bool {
        self.kind() == o.kind() && self.detail() == o.detail()
    }
}

impl Eq for Error {}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.detail() {
            Some(d) => write!(f, "{} (-{}): {}", self.kind().message(), self.errno(), d),
            None => write!(f, "{} (-{})", self.kind().message(), self.errno()),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        let kind = e.raw_os_error().map(ErrorKind::from_errno).unwrap_or(ErrorKind::Other);
        Error::with(kind, e.to_string())
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Error::with(ErrorKind::from_errno(e.raw_os_error()), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_status_word_maps_to_a_kind() {
        // A FIN's status comes from a peer: no value may panic.
        assert_eq!(ErrorKind::from_errno(i32::MIN), ErrorKind::Other);
        assert_eq!(ErrorKind::from_errno(i32::MAX), ErrorKind::Other);
        assert_eq!(ErrorKind::from_errno(-ErrorKind::Io.errno()), ErrorKind::Io);
    }

    #[test]
    fn every_kind_round_trips_through_its_errno() {
        for (k, n, _) in TABLE {
            assert_eq!(ErrorKind::from_errno(*n), *k);
            assert_eq!(ErrorKind::from_errno(-*n), *k);
            assert_eq!(k.errno(), *n);
        }
        // The numbers libfabric's headers give.
        assert_eq!(ErrorKind::Avail.errno(), 259);
        assert_eq!(ErrorKind::Trunc.errno(), 265);
        assert_eq!(ErrorKind::Overrun.errno(), 268);
        assert_eq!(ErrorKind::Again.errno(), 11);
        assert_eq!(ErrorKind::Busy.errno(), 16);
    }

    #[test]
    fn one_word_errors_keep_kind_and_detail() {
        assert_eq!(std::mem::size_of::<Error>(), 8);
        assert_eq!(std::mem::size_of::<Result<usize>>(), 16);
        assert_eq!(TABLE.len(), ErrorKind::NoMsg as usize + 1, "a row per kind");
        for (i, (k, _, _)) in TABLE.iter().enumerate() {
            assert_eq!(*k as usize, i);
            let (a, b) = (Error::new(*k), Error::with(*k, format!("detail {i}")));
            assert_eq!((a.kind(), a.detail()), (*k, None));
            assert_eq!((b.kind(), b.detail()), (*k, Some(format!("detail {i}").as_str())));
            let (a2, b2) = (a.clone(), b.clone());
            assert!(a2 == a && b2 == b && a != b);
            drop(b);
            assert_eq!(b2.detail(), Some(format!("detail {i}").as_str()));
        }
        assert_eq!(Error::AGAIN.kind(), ErrorKind::Again);
        assert!(Error::AGAIN.is_plain_again());
        assert!(!Error::with(ErrorKind::Again, "full").is_plain_again());
        assert!(!Error::new(ErrorKind::Avail).is_plain_again());
    }

    #[test]
    fn display_names_kind_and_detail() {
        let e = Error::with(ErrorKind::Busy, "cq is bound to 1 endpoint");
        let s = e.to_string();
        assert!(s.contains("busy") && s.contains("-16") && s.contains("bound"), "{s}");
    }
}
