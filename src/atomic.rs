//! Atomic operations as fi_atomic(3) defines them: the datatypes and
//! operations, which combinations are valid for which call (the one
//! table [`valid`] answers every query from), the arithmetic on one
//! element ([`compute`]) and its application to memory as one CPU atomic
//! ([`apply`]).
//!
//! Every atomic shmfab performs is a CPU atomic instruction on the target
//! word itself, whoever executes it: the initiator on shared-heap memory
//! (mapped in both processes), the target's progress engine on its other
//! registered memory (reached through the mailbox). Both run the same
//! [`apply`], so operations on one word from any number of ranks, by
//! either path, are atomic with respect to each other: elements of 1 to 8
//! bytes by the hardware (a native read-modify-write where there is one,
//! else a compare-and-swap loop), 16-byte complex doubles under a striped
//! lock in the target's RMA file that both paths take.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Datatypes (fi_datatype values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicType {
    /// FI_INT8.
    Int8 = 0,
    /// FI_UINT8.
    Uint8,
    /// FI_INT16.
    Int16,
    /// FI_UINT16.
    Uint16,
    /// FI_INT32.
    Int32,
    /// FI_UINT32.
    Uint32,
    /// FI_INT64.
    Int64,
    /// FI_UINT64.
    Uint64,
    /// FI_FLOAT.
    Float,
    /// FI_DOUBLE.
    Double,
    /// FI_FLOAT_COMPLEX (real, imaginary f32).
    FloatComplex,
    /// FI_DOUBLE_COMPLEX (real, imaginary f64).
    DoubleComplex,
}

/// Operations (fi_op values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    /// FI_MIN: `*addr = min(*addr, operand)`.
    Min = 0,
    /// FI_MAX.
    Max,
    /// FI_SUM.
    Sum,
    /// FI_PROD.
    Prod,
    /// FI_LOR.
    Lor,
    /// FI_LAND.
    Land,
    /// FI_BOR.
    Bor,
    /// FI_BAND.
    Band,
    /// FI_LXOR.
    Lxor,
    /// FI_BXOR.
    Bxor,
    /// FI_ATOMIC_READ (fetch calls only).
    Read,
    /// FI_ATOMIC_WRITE.
    Write,
    /// FI_CSWAP: write if `compare == *addr`.
    Cswap,
    /// FI_CSWAP_NE: write if `compare != *addr`.
    CswapNe,
    /// FI_CSWAP_LE: write if `compare <= *addr`.
    CswapLe,
    /// FI_CSWAP_LT: write if `compare < *addr`.
    CswapLt,
    /// FI_CSWAP_GE: write if `compare >= *addr`.
    CswapGe,
    /// FI_CSWAP_GT: write if `compare > *addr`.
    CswapGt,
    /// FI_MSWAP: `*addr = (operand & compare) | (*addr & !compare)`.
    Mswap,
}

/// The three kinds of atomic call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicCall {
    /// fi_atomic: no result.
    Write,
    /// fi_fetch_atomic: the old value comes back.
    Fetch,
    /// fi_compare_atomic: a compare operand, the old value comes back.
    Compare,
}

/// Every datatype, in fi_datatype order.
pub const ALL_TYPES: [AtomicType; 12] = {
    use AtomicType::*;
    [Int8, Uint8, Int16, Uint16, Int32, Uint32, Int64, Uint64, Float, Double, FloatComplex, DoubleComplex]
};

/// Every operation, in fi_op order.
pub const ALL_OPS: [AtomicOp; 19] = {
    use AtomicOp::*;
    [
        Min, Max, Sum, Prod, Lor, Land, Bor, Band, Lxor, Bxor, Read, Write, Cswap, CswapNe, CswapLe, CswapLt, CswapGe,
        CswapGt, Mswap,
    ]
};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Int,
    Real,
    Complex,
}

impl AtomicType {
    /// Bytes of one element.
    pub const fn size(self) -> usize {
        use AtomicType::*;
        match self {
            Int8 | Uint8 => 1,
            Int16 | Uint16 => 2,
            Int32 | Uint32 | Float => 4,
            Int64 | Uint64 | Double | FloatComplex => 8,
            DoubleComplex => 16,
        }
    }

    /// The datatype of an fi_datatype value (None: not supported, as
    /// long double and 128-bit integers).
    pub fn from_raw(v: u8) -> Option<AtomicType> {
        ALL_TYPES.get(v as usize).copied()
    }

    #[inline]
    fn class(self) -> Class {
        use AtomicType::*;
        match self {
            Float | Double => Class::Real,
            FloatComplex | DoubleComplex => Class::Complex,
            _ => Class::Int,
        }
    }
}

impl AtomicOp {
    /// The operation of an fi_op value.
    pub fn from_raw(v: u8) -> Option<AtomicOp> {
        ALL_OPS.get(v as usize).copied()
    }

    /// Whether the operation belongs to the compare family.
    pub fn is_compare(self) -> bool {
        self as u8 >= AtomicOp::Cswap as u8
    }
}

/// Whether `call` takes `op` on `dt` (the truth every valid-op query
/// tells): arithmetic on every type, ordering and logic on integers and
/// reals, bit operations on integers, equality compares on every type,
/// ordered compares on integers and reals, MSWAP on integers;
/// ATOMIC_READ only in fetch calls.
#[inline]
pub fn valid(call: AtomicCall, dt: AtomicType, op: AtomicOp) -> bool {
    use AtomicOp::*;
    let c = dt.class();
    let by_type = match op {
        Sum | Prod | Write | Read | Cswap | CswapNe => true,
        Min | Max | Lor | Land | Lxor | CswapLe | CswapLt | CswapGe | CswapGt => c != Class::Complex,
        Bor | Band | Bxor | Mswap => c == Class::Int,
    };
    let by_call = match call {
        AtomicCall::Write => !op.is_compare() && op != Read,
        AtomicCall::Fetch => !op.is_compare(),
        AtomicCall::Compare => op.is_compare(),
    };
    by_type && by_call
}

macro_rules! int_compute {
    ($name:ident, $t:ty, $u:ty) => {
        fn $name(op: AtomicOp, old: u128, a: u128, c: u128) -> u128 {
            use AtomicOp::*;
            let (o, x, k) = (old as $u as $t, a as $u as $t, c as $u as $t);
            let n: $t = match op {
                Min => o.min(x),
                Max => o.max(x),
                Sum => o.wrapping_add(x),
                Prod => o.wrapping_mul(x),
                Lor => ((o != 0) || (x != 0)) as $t,
                Land => ((o != 0) && (x != 0)) as $t,
                Lxor => ((o != 0) != (x != 0)) as $t,
                Bor => o | x,
                Band => o & x,
                Bxor => o ^ x,
                Read => o,
                Write => x,
                Cswap => sel(k == o, x, o),
                CswapNe => sel(k != o, x, o),
                CswapLe => sel(k <= o, x, o),
                CswapLt => sel(k < o, x, o),
                CswapGe => sel(k >= o, x, o),
                CswapGt => sel(k > o, x, o),
                Mswap => (x & k) | (o & !k),
            };
            n as $u as u128
        }
    };
}

#[inline(always)]
fn sel<T>(c: bool, a: T, b: T) -> T {
    if c {
        a
    } else {
        b
    }
}

int_compute!(c_i8, i8, u8);
int_compute!(c_u8, u8, u8);
int_compute!(c_i16, i16, u16);
int_compute!(c_u16, u16, u16);
int_compute!(c_i32, i32, u32);
int_compute!(c_u32, u32, u32);
int_compute!(c_i64, i64, u64);
int_compute!(c_u64, u64, u64);

macro_rules! real_compute {
    ($name:ident, $t:ty, $u:ty) => {
        fn $name(op: AtomicOp, old: u128, a: u128, c: u128) -> u128 {
            use AtomicOp::*;
            let (o, x, k) = (<$t>::from_bits(old as $u), <$t>::from_bits(a as $u), <$t>::from_bits(c as $u));
            let b = |v: bool| -> $t { sel(v, 1.0, 0.0) };
            let n: $t = match op {
                Min => sel(x < o, x, o),
                Max => sel(x > o, x, o),
                Sum => o + x,
                Prod => o * x,
                Lor => b(o != 0.0 || x != 0.0),
                Land => b(o != 0.0 && x != 0.0),
                Lxor => b((o != 0.0) != (x != 0.0)),
                Write => x,
                Cswap => sel(k == o, x, o),
                CswapNe => sel(k != o, x, o),
                CswapLe => sel(k <= o, x, o),
                CswapLt => sel(k < o, x, o),
                CswapGe => sel(k >= o, x, o),
                CswapGt => sel(k > o, x, o),
                Read | Bor | Band | Bxor | Mswap => return old,
            };
            n.to_bits() as u128
        }
    };
}

real_compute!(c_f32, f32, u32);
real_compute!(c_f64, f64, u64);

macro_rules! complex_compute {
    ($name:ident, $t:ty, $u:ty, $bits:expr) => {
        fn $name(op: AtomicOp, old: u128, a: u128, c: u128) -> u128 {
            use AtomicOp::*;
            let m = (1u128 << $bits) - 1;
            let split = |v: u128| (<$t>::from_bits((v & m) as $u), <$t>::from_bits((v >> $bits) as $u));
            let ((or, oi), (xr, xi), (kr, ki)) = (split(old), split(a), split(c));
            let (nr, ni): ($t, $t) = match op {
                Sum => (or + xr, oi + xi),
                Prod => (or * xr - oi * xi, or * xi + oi * xr),
                Write => (xr, xi),
                Cswap if kr == or && ki == oi => (xr, xi),
                CswapNe if kr != or || ki != oi => (xr, xi),
                _ => return old,
            };
            nr.to_bits() as u128 | (ni.to_bits() as u128) << $bits
        }
    };
}

complex_compute!(c_c32, f32, u32, 32);
complex_compute!(c_c64, f64, u64, 64);

/// The new value of an element holding `old` after `op` with operand `a`
/// and compare `c` (bit patterns, little-endian, zero-extended). The
/// combination must be [`valid`]; an operation that does not apply leaves
/// `old`.
pub fn compute(dt: AtomicType, op: AtomicOp, old: u128, a: u128, c: u128) -> u128 {
    use AtomicType::*;
    let f = match dt {
        Int8 => c_i8,
        Uint8 => c_u8,
        Int16 => c_i16,
        Uint16 => c_u16,
        Int32 => c_i32,
        Uint32 => c_u32,
        Int64 => c_i64,
        Uint64 => c_u64,
        Float => c_f32,
        Double => c_f64,
        FloatComplex => c_c32,
        DoubleComplex => c_c64,
    };
    f(op, old, a, c)
}

/// Reads one element's bit pattern from `b` (little-endian). The
/// element sizes are fixed-size loads (a variable-length copy into a
/// 16-byte buffer was a memcpy call per element).
#[inline]
pub fn load_elem(b: &[u8]) -> u128 {
    if let Ok(x) = <[u8; 8]>::try_from(b) {
        return u64::from_le_bytes(x) as u128;
    }
    if let Ok(x) = <[u8; 4]>::try_from(b) {
        return u32::from_le_bytes(x) as u128;
    }
    let mut v = [0u8; 16];
    v[..b.len()].copy_from_slice(b);
    u128::from_le_bytes(v)
}

/// Writes one element's bit pattern into `b` (its length is the size).
#[inline]
pub fn store_elem(b: &mut [u8], v: u128) {
    if let Ok(x) = <&mut [u8; 8]>::try_from(&mut *b) {
        *x = (v as u64).to_le_bytes();
        return;
    }
    if let Ok(x) = <&mut [u8; 4]>::try_from(&mut *b) {
        *x = (v as u32).to_le_bytes();
        return;
    }
    let n = b.len();
    b.copy_from_slice(&v.to_le_bytes()[..n]);
}

macro_rules! cas_loop {
    ($at:ty, $p:expr, $dt:expr, $op:expr, $a:expr, $c:expr) => {{
        // SAFETY: per `apply`'s contract: aligned, live, shared only
        // through atomics.
        let w = unsafe { <$at>::from_ptr($p.cast()) };
        let mut old = w.load(Ordering::Acquire);
        loop {
            let new = compute($dt, $op, old as u128, $a, $c) as _;
            if new == old {
                break old as u128;
            }
            match w.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break old as u128,
                Err(x) => old = x,
            }
        }
    }};
}

/// [`apply`] with the commonest single-word cases (sum, read and write
/// of a 64-bit integer: a fetch-add, a get of a counter) inline: the rest
/// go to [`apply`], which does the same for them. `lock` gives the
/// striped lock (only 16-byte elements take it: its address is not
/// computed for the others).
///
/// # Safety
/// As for [`apply`].
#[inline]
pub unsafe fn apply_inline<'l>(
    dt: AtomicType,
    op: AtomicOp,
    p: *mut u8,
    a: u128,
    c: u128,
    lock: impl FnOnce() -> &'l crate::sync::AtomicU32,
    me: u32,
) -> u128 {
    if matches!(dt, AtomicType::Uint64 | AtomicType::Int64) && matches!(op, AtomicOp::Sum | AtomicOp::Read) {
        // SAFETY: per the contract: aligned, live, shared only through
        // atomics of this size.
        let w = unsafe { AtomicU64::from_ptr(p.cast()) };
        return if op == AtomicOp::Sum {
            w.fetch_add(a as u64, Ordering::AcqRel) as u128
        } else {
            w.load(Ordering::Acquire) as u128
        };
    }
    // SAFETY: the caller's contract is apply's.
    unsafe { apply(dt, op, p, a, c, lock(), me) }
}

/// Applies `op` to the element at `p` as one atomic operation and
/// returns the old value. 16-byte elements take `lock` (the striped lock
/// of this address in the target's RMA file) for their read-modify-write,
/// writing `me` in it: the caller's pid in the file owner's PID namespace,
/// or [`shm_layout::rma::PID_UNKNOWN`] (a holder that dies holding the
/// lock is taken over only when both its pid and ours are known).
///
/// # Safety
/// `p` must be valid for reads and writes of `dt.size()` bytes, aligned
/// to that size (16-byte elements: to 8), and every other access to it
/// while this runs must be another `apply` or an atomic of the same size.
pub unsafe fn apply(
    dt: AtomicType,
    op: AtomicOp,
    p: *mut u8,
    a: u128,
    c: u128,
    lock: &crate::sync::AtomicU32,
    me: u32,
) -> u128 {
    use AtomicOp::*;
    let int = dt.class() == Class::Int;
    match dt.size() {
        1 => cas_loop!(AtomicU8, p, dt, op, a, c),
        2 => cas_loop!(AtomicU16, p, dt, op, a, c),
        4 => cas_loop!(AtomicU32, p, dt, op, a, c),
        8 => {
            // SAFETY: as for cas_loop.
            let w = unsafe { AtomicU64::from_ptr(p.cast()) };
            let x = a as u64;
            match op {
                Sum if int => w.fetch_add(x, Ordering::AcqRel) as u128,
                Bor => w.fetch_or(x, Ordering::AcqRel) as u128,
                Band => w.fetch_and(x, Ordering::AcqRel) as u128,
                Bxor => w.fetch_xor(x, Ordering::AcqRel) as u128,
                Write => w.swap(x, Ordering::AcqRel) as u128,
                Read => w.load(Ordering::Acquire) as u128,
                _ => cas_loop!(AtomicU64, p, dt, op, a, c),
            }
        }
        _ => {
            use shm_layout::rma::PID_UNKNOWN;
            let me = me.max(1);
            let mut spins = 0u64;
            loop {
                match lock.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(holder) => {
                        spins += 1;
                        // A holder that died in its read-modify-write
                        // never releases: take the lock over (its element
                        // may hold a torn value).
                        if spins.is_multiple_of(1 << 16)
                            && holder != 0
                            && holder != PID_UNKNOWN
                            && me != PID_UNKNOWN
                            && !pid_alive(holder)
                            && lock.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
                        {
                            break;
                        }
                        if spins > 64 {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                }
            }
            // SAFETY: per the contract; the lock serialises every 16-byte
            // access to this address.
            let old = unsafe { std::ptr::read_volatile(p as *const [u8; 16]) };
            let old = u128::from_le_bytes(old);
            let new = compute(dt, op, old, a, c);
            if new != old {
                // SAFETY: as above.
                unsafe { std::ptr::write_volatile(p as *mut [u8; 16], new.to_le_bytes()) };
            }
            // SYNC: pairs with the acquire CAS of the next holder.
            lock.store(0, Ordering::Release);
            old
        }
    }
}

/// This process's pid, read once (getpid is a system call).
pub(crate) fn my_pid() -> u32 {
    static PID: AtomicU32 = AtomicU32::new(0);
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = std::process::id().max(1);
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// Whether process `pid` exists (a zombie counts as gone).
pub(crate) fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn queries_follow_the_table() {
        use AtomicOp::*;
        use AtomicType::*;
        assert!(valid(AtomicCall::Write, Int32, Sum));
        assert!(!valid(AtomicCall::Write, Int32, Read));
        assert!(valid(AtomicCall::Fetch, Int32, Read));
        assert!(!valid(AtomicCall::Fetch, Int32, Cswap));
        assert!(valid(AtomicCall::Compare, DoubleComplex, Cswap));
        assert!(!valid(AtomicCall::Compare, DoubleComplex, CswapLt));
        assert!(!valid(AtomicCall::Write, Double, Bor));
        assert!(!valid(AtomicCall::Compare, Float, Mswap));
        assert!(valid(AtomicCall::Write, FloatComplex, Prod));
        assert!(!valid(AtomicCall::Write, FloatComplex, Min));
    }

    #[test]
    fn compute_matches_the_definitions() {
        use AtomicOp::*;
        use AtomicType::*;
        let i = |v: i8| v as u8 as u128;
        assert_eq!(compute(Int8, Min, i(-3), i(-5), 0), i(-5));
        assert_eq!(compute(Int8, Max, i(-3), i(-5), 0), i(-3));
        assert_eq!(compute(Uint8, Sum, 250, 10, 0), 4);
        assert_eq!(compute(Int8, CswapLt, i(5), i(9), i(4)), i(9));
        assert_eq!(compute(Int8, CswapLt, i(5), i(9), i(5)), i(5));
        assert_eq!(compute(Uint16, Mswap, 0xff00, 0x0ff0, 0x00ff), 0xfff0);
        assert_eq!(compute(Uint32, Lxor, 7, 0, 0), 1);
        let f = |v: f64| v.to_bits() as u128;
        assert_eq!(compute(Double, Prod, f(1.5), f(-2.0), 0), f(-3.0));
        let c = |r: f32, i: f32| r.to_bits() as u128 | (i.to_bits() as u128) << 32;
        assert_eq!(compute(FloatComplex, Prod, c(1.0, 2.0), c(3.0, 4.0), 0), c(-5.0, 10.0));
        assert_eq!(compute(FloatComplex, Cswap, c(1.0, 2.0), c(3.0, 4.0), c(1.0, 2.0)), c(3.0, 4.0));
    }

    /// A 16-byte atomic whose lock is held by a process that died takes
    /// the lock over instead of spinning for ever.
    #[test]
    fn lock_of_a_dead_holder_is_taken_over() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let lock = AtomicU32::new(dead);
        let mut word = [0u64; 2];
        let t0 = std::time::Instant::now();
        let one = 1f64.to_bits() as u128;
        // SAFETY: a live, aligned, private 16-byte element.
        let old = unsafe {
            apply(AtomicType::DoubleComplex, AtomicOp::Sum, word.as_mut_ptr().cast(), one, 0, &lock, my_pid())
        };
        assert_eq!(old, 0);
        assert_eq!(f64::from_bits(word[0]), 1.0);
        assert_eq!(lock.load(Ordering::Relaxed), 0);
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn apply_is_atomic_across_threads() {
        let word = std::sync::Arc::new(AtomicU64::new(0));
        let lock = std::sync::Arc::new(AtomicU32::new(0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (w, l) = (word.clone(), lock.clone());
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        // SAFETY: an aligned live word used only through atomics.
                        unsafe {
                            apply(
                                AtomicType::Double,
                                AtomicOp::Sum,
                                w.as_ptr().cast(),
                                1f64.to_bits() as u128,
                                0,
                                &l,
                                my_pid(),
                            )
                        };
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(f64::from_bits(word.load(Ordering::Relaxed)), 40_000.0);
    }
}
