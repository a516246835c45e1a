//! The local arithmetic of reductions: `dst[i] = op(dst[i], src[i])` over
//! whole elements, run by [`crate::DeferredOp::Reduce`] when it fires and
//! by the collectives' serial steps. Plain (unaligned) loads and stores.

use crate::atomic::{AtomicOp, AtomicType};
use crate::error::{Error, ErrorKind, Result};

/// Whether `op` on `dt` is a reduction this module computes.
pub fn supported(dt: AtomicType, op: AtomicOp) -> bool {
    use AtomicOp::*;
    use AtomicType::*;
    let int = matches!(dt, Int8 | Uint8 | Int16 | Uint16 | Int32 | Uint32 | Int64 | Uint64);
    let float = matches!(dt, Float | Double);
    match op {
        Sum | Prod | Min | Max | Write => int || float,
        Bor | Band | Bxor => int,
        _ => false,
    }
}

/// Checks a reduction of `src_len` bytes into `dst_len` bytes.
pub fn check(dt: AtomicType, op: AtomicOp, src_len: usize, dst_len: usize) -> Result<()> {
    if !supported(dt, op) {
        return Err(Error::with(ErrorKind::NoSys, format!("no local reduction {op:?} on {dt:?}")));
    }
    if src_len != dst_len || !dst_len.is_multiple_of(dt.size()) {
        return Err(Error::with(
            ErrorKind::Inval,
            format!("a reduction takes two buffers of one length, a multiple of {} bytes", dt.size()),
        ));
    }
    Ok(())
}

macro_rules! fold {
    ($t:ty, $src:expr, $dst:expr, $f:expr) => {{
        const W: usize = std::mem::size_of::<$t>();
        let f = $f;
        for (d, s) in $dst.chunks_exact_mut(W).zip($src.chunks_exact(W)) {
            let a = <$t>::from_ne_bytes(d.try_into().unwrap());
            let b = <$t>::from_ne_bytes(s.try_into().unwrap());
            let r: $t = f(a, b);
            d.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

macro_rules! int_op {
    ($t:ty, $op:expr, $src:expr, $dst:expr) => {
        match $op {
            AtomicOp::Sum => fold!($t, $src, $dst, |a: $t, b: $t| a.wrapping_add(b)),
            AtomicOp::Prod => fold!($t, $src, $dst, |a: $t, b: $t| a.wrapping_mul(b)),
            AtomicOp::Min => fold!($t, $src, $dst, |a: $t, b: $t| a.min(b)),
            AtomicOp::Max => fold!($t, $src, $dst, |a: $t, b: $t| a.max(b)),
            AtomicOp::Bor => fold!($t, $src, $dst, |a: $t, b: $t| a | b),
            AtomicOp::Band => fold!($t, $src, $dst, |a: $t, b: $t| a & b),
            AtomicOp::Bxor => fold!($t, $src, $dst, |a: $t, b: $t| a ^ b),
            _ => unreachable!("checked by `check`"),
        }
    };
}

macro_rules! float_op {
    ($t:ty, $op:expr, $src:expr, $dst:expr) => {
        match $op {
            AtomicOp::Sum => fold!($t, $src, $dst, |a: $t, b: $t| a + b),
            AtomicOp::Prod => fold!($t, $src, $dst, |a: $t, b: $t| a * b),
            // As FI_MIN / FI_MAX on the heap path: a NaN operand loses.
            AtomicOp::Min => fold!($t, $src, $dst, |a: $t, b: $t| a.min(b)),
            AtomicOp::Max => fold!($t, $src, $dst, |a: $t, b: $t| a.max(b)),
            _ => unreachable!("checked by `check`"),
        }
    };
}

/// `dst[i] = op(dst[i], src[i])`; the arguments passed [`check`].
pub fn apply(dt: AtomicType, op: AtomicOp, src: &[u8], dst: &mut [u8]) {
    if op == AtomicOp::Write {
        crate::copy::copy_slice(dst, src);
        return;
    }
    match dt {
        AtomicType::Int8 => int_op!(i8, op, src, dst),
        AtomicType::Uint8 => int_op!(u8, op, src, dst),
        AtomicType::Int16 => int_op!(i16, op, src, dst),
        AtomicType::Uint16 => int_op!(u16, op, src, dst),
        AtomicType::Int32 => int_op!(i32, op, src, dst),
        AtomicType::Uint32 => int_op!(u32, op, src, dst),
        AtomicType::Int64 => int_op!(i64, op, src, dst),
        AtomicType::Uint64 => int_op!(u64, op, src, dst),
        AtomicType::Float => float_op!(f32, op, src, dst),
        AtomicType::Double => float_op!(f64, op, src, dst),
        _ => unreachable!("checked by `check`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
        // SAFETY: plain numbers, read as bytes.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }.to_vec()
    }

    #[test]
    fn ops_by_type() {
        let mut d = bytes(&[1i32, -5, 7]);
        apply(AtomicType::Int32, AtomicOp::Sum, &bytes(&[2i32, 5, -9]), &mut d);
        assert_eq!(d, bytes(&[3i32, 0, -2]));
        apply(AtomicType::Int32, AtomicOp::Min, &bytes(&[2i32, -1, -9]), &mut d);
        assert_eq!(d, bytes(&[2i32, -1, -9]));
        let mut d = bytes(&[1.5f64, 2.0]);
        apply(AtomicType::Double, AtomicOp::Prod, &bytes(&[2.0f64, -0.5]), &mut d);
        assert_eq!(d, bytes(&[3.0f64, -1.0]));
        let mut d = bytes(&[u64::MAX, 3]);
        apply(AtomicType::Uint64, AtomicOp::Max, &bytes(&[1u64, 9]), &mut d);
        assert_eq!(d, bytes(&[u64::MAX, 9]));
        apply(AtomicType::Uint64, AtomicOp::Bor, &bytes(&[0u64, 6]), &mut d);
        assert_eq!(d, bytes(&[u64::MAX, 15]));
        apply(AtomicType::Uint64, AtomicOp::Write, &bytes(&[4u64, 5]), &mut d);
        assert_eq!(d, bytes(&[4u64, 5]));
    }

    #[test]
    fn checks() {
        assert!(check(AtomicType::Float, AtomicOp::Bor, 4, 4).is_err());
        assert!(check(AtomicType::Int32, AtomicOp::Cswap, 4, 4).is_err());
        assert!(check(AtomicType::Int32, AtomicOp::Sum, 4, 8).is_err());
        assert!(check(AtomicType::Int64, AtomicOp::Sum, 12, 12).is_err());
        assert!(check(AtomicType::Int64, AtomicOp::Sum, 16, 16).is_ok());
    }
}
