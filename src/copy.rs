//! The byte copy every payload takes: `copy_nonoverlapping`, except for
//! the one relative placement where the C library's copy collapses.
//!
//! glibc's x86-64 `memcpy` (2.36 here) uses `rep movsb` from about 2 KiB
//! (its `rep_movsb_threshold`: 2048 at the lowest, 2112 measured on this
//! VM's AMD EPYC with FSRM). When the destination lies 1 to 31 bytes past
//! the source modulo 4096 (every load then 4K-aliases a store just made),
//! `rep movsb` runs at about 3 GB/s instead of 60-100: measured on the
//! development VM, 16 KiB in cache, 2.9-3.1 GB/s against 95 (C, 2026-11-26,
//! best of 200 batches; 32 to 63 bytes past: 66 GB/s, no collapse). There
//! we copy with a loop of our own, back to front, that loads eight 32-byte
//! vectors before it stores them ([`BLOCK`] bytes a step; AVX, found at
//! run time). Against the 2 KiB `memcpy` pieces used before: from a
//! source the other core just wrote (the receiver's copy out of the
//! pool), 10-20% faster (16 KiB, medians 0.66-0.68 us against 0.81-0.82
//! at +1 and +16; the helper's first probe gave 0.25 against 0.87, which
//! the review did not reproduce); in cache on one core, 0.22 against
//! 0.24 us at +16 but 0.29 against 0.25 at offsets that are no multiple
//! of 8; end to end, 16 KiB ping-pong through the pool 0.07 us faster
//! (paired, median). Front to back the same loop made 44-57
//! GB/s, but lost 1.4-1.5 us at 256 KiB through the pool between two
//! processes, where back to front won 0.9 (`SHMFAB_CMA=off`, paired
//! rounds). Without AVX, the pieces: glibc's vector loop, taken below the
//! threshold, checks for the aliasing and copies backward.
//!
//! The placement is common, not contrived: glibc gives every allocation
//! of 128 KiB or more its own mapping, 16 bytes past a page boundary, and
//! shmfab's pool chunks and heap blocks start on page (or cache-line)
//! boundaries, so a receive into a large `malloc`ed buffer copies from
//! offset 0 of a page to offset 16: inside the band (every fragment of a
//! pool message into the bench's buffers). Single copy (process_vm_readv)
//! meets the same collapse in the kernel's copy when the two user buffers
//! sit so; that one we cannot change (see [`crate::proto`]), so its test
//! ([`ranges_in_band`]) keeps a margin: 1 to 63 bytes.
//!
//! ```
//! let src = vec![7u8; 20_000];
//! let mut dst = vec![0u8; 20_000];
//! // SAFETY: both ranges are valid for 20 000 bytes and do not overlap.
//! unsafe { shmfab::copy::copy(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
//! assert_eq!(src, dst);
//! ```

/// Largest piece handed to `memcpy` when the placement is in the band: at
/// or below glibc's lowest `rep_movsb_threshold`, so every piece takes the
/// vector loop.
pub const PIECE: usize = 2048;

/// Bytes a step of the band's own copy ([`copy`] in the band): eight 32-byte
/// loads, then eight stores, back to front.
pub const BLOCK: usize = 256;

/// Whether a copy of `n` bytes from `src` to `dst` by `memcpy` would hit
/// the slow placement: more than [`PIECE`] bytes, destination 1 to 31
/// bytes past the source modulo 4096 (measured: see the module's note;
/// from 32 on `memcpy` no longer collapses, 66 GB/s, and the pieces were
/// slower there, 52-60; our loop is about as fast, 57-75, so the band
/// stops at 31). Always false off x86-64.
#[inline(always)]
pub fn in_band(src: *const u8, dst: *const u8, n: usize) -> bool {
    cfg!(target_arch = "x86_64") && n > PIECE && (dst as usize).wrapping_sub(src as usize).wrapping_sub(1) & 4095 < 31
}

/// Whether a single copy (the kernel's `rep movsb`) of `n` bytes from
/// `src` to `dst`, addresses as numbers (one of them may be another
/// process's), may hit the slow placement: as [`in_band`], with a margin,
/// 1 to 63 bytes (a single copy found there goes through the pool, whose
/// copies we make ourselves).
#[inline(always)]
pub fn in_band_at(src: u64, dst: u64, n: u64) -> bool {
    cfg!(target_arch = "x86_64") && n > PIECE as u64 && dst.wrapping_sub(src).wrapping_sub(1) & 4095 < 63
}

/// Whether copying the bytes of the `src` ranges, in order, into the `dst`
/// ranges would put any piece longer than [`PIECE`] in the band: the test
/// a single copy (the kernel's `rep movsb`, which we cannot cut up) must
/// pass to be worth making.
pub fn ranges_in_band(src: &[(u64, u64)], dst: &[(u64, u64)]) -> bool {
    let (mut i, mut j, mut si, mut dj) = (0usize, 0usize, 0u64, 0u64);
    while i < src.len() && j < dst.len() {
        let (sa, sl) = src[i];
        let (da, dl) = dst[j];
        let n = (sl - si).min(dl - dj);
        if in_band_at(sa.wrapping_add(si), da.wrapping_add(dj), n) {
            return true;
        }
        si += n;
        dj += n;
        if si == sl {
            (i, si) = (i + 1, 0);
        }
        if dj == dl {
            (j, dj) = (j + 1, 0);
        }
    }
    false
}

/// Copies `n` bytes from `src` to `dst`, as `std::ptr::copy_nonoverlapping`
/// (which it is, but for the placement of the module's note).
///
/// # Safety
/// As `copy_nonoverlapping(src, dst, n)`: `src` valid for reads and `dst`
/// for writes of `n` bytes, the two ranges disjoint.
#[inline(always)]
pub unsafe fn copy(src: *const u8, dst: *mut u8, n: usize) {
    if in_band(src, dst, n) {
        // SAFETY: the caller's contract, passed on.
        unsafe { copy_band(src, dst, n) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
    }
}

/// Copies `n` bytes from `src` to `dst`, as `std::ptr::copy` (the ranges
/// may overlap); cut into pieces only when they do not and the placement
/// is in the band.
///
/// # Safety
/// As `std::ptr::copy(src, dst, n)`.
#[inline(always)]
pub unsafe fn move_bytes(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src as usize, dst as usize);
    if in_band(src, dst, n) && (d.wrapping_add(n) <= s || s.wrapping_add(n) <= d) {
        // SAFETY: disjoint (checked), valid per the caller.
        unsafe { copy_band(src, dst, n) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy(src, dst, n) }
    }
}

/// [`copy`] of two slices of one length (panics otherwise, as
/// `copy_from_slice`).
#[inline(always)]
pub fn copy_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_slice: lengths differ");
    // SAFETY: two live slices of one length; a `&mut` never overlaps a `&`.
    unsafe { copy(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// The band's copy: [`BLOCK`] bytes a step by AVX where the CPU has it
/// (back to front), else pieces of [`PIECE`] bytes by `memcpy`.
///
/// # Safety
/// As [`copy`].
#[inline(never)]
unsafe fn copy_band(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is there (checked); the caller's contract.
        unsafe { copy_blocks_avx(src, dst, n) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { copy_pieces(src, dst, n) }
}

/// [`BLOCK`] bytes a step, back to front, all eight loads before the
/// stores: the band's collapse is every load waiting on a store it
/// 4K-aliases (same address modulo 4096), and here no load follows a
/// recent store it aliases (stores 4 KiB back, about 120 stores earlier,
/// have left the store buffer). The head, under a block, by `memcpy` (its vector
/// loop: under [`PIECE`]).
///
/// # Safety
/// As [`copy`]; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_blocks_avx(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256 as load, _mm256_storeu_si256 as store};
    // Back to front: every load then lies below the stores made before it
    // (the destination is ahead of the source), so none waits on one.
    let head = n % BLOCK;
    let mut off = n;
    while off > head {
        off -= BLOCK;
        // SAFETY: head <= off and off + BLOCK <= n: every load inside the
        // source, every store inside the destination (unaligned loads and
        // stores); the ranges are disjoint (the caller's contract).
        unsafe {
            let s = src.add(off) as *const __m256i;
            let d = dst.add(off) as *mut __m256i;
            let (r0, r1, r2, r3) = (load(s), load(s.add(1)), load(s.add(2)), load(s.add(3)));
            let (r4, r5, r6, r7) = (load(s.add(4)), load(s.add(5)), load(s.add(6)), load(s.add(7)));
            store(d, r0);
            store(d.add(1), r1);
            store(d.add(2), r2);
            store(d.add(3), r3);
            store(d.add(4), r4);
            store(d.add(5), r5);
            store(d.add(6), r6);
            store(d.add(7), r7);
        }
    }
    // SAFETY: the head, under a block, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
}

/// Pieces of [`PIECE`] bytes by `memcpy`, front to back.
///
/// # Safety
/// As [`copy`].
#[inline(never)]
unsafe fn copy_pieces(src: *const u8, dst: *mut u8, n: usize) {
    let mut off = 0;
    while off < n {
        let k = (n - off).min(PIECE);
        // SAFETY: off + k <= n: inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), k) };
        off += k;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn band_is_one_to_thirty_one_bytes_ahead_mod_4096_for_ours_to_sixty_three_for_the_kernels() {
        let base = 0x10_0000usize;
        let at = |d: usize| (base as *const u8, (base + 0x3000 + d) as *const u8);
        let x86 = cfg!(target_arch = "x86_64");
        for (d, ours, kernel) in [
            (0, false, false),
            (1, true, true),
            (16, true, true),
            (31, true, true),
            (32, false, true),
            (63, false, true),
        ]
        .into_iter()
        .chain([(64, false, false), (4095, false, false)])
        {
            let (s, t) = at(d);
            assert_eq!(in_band(s, t, PIECE + 1), ours && x86, "d = {d}");
            assert_eq!(in_band_at(s as u64, t as u64, PIECE as u64 + 1), kernel && x86, "d = {d}");
            assert!(!in_band(s, t, PIECE), "pieces themselves are never cut (d = {d})");
            assert!(!in_band_at(s as u64, t as u64, PIECE as u64), "d = {d}");
        }
        // Behind the source (wraps): not in the band.
        assert!(!in_band((base + 16) as *const u8, base as *const u8, 1 << 20));
    }

    #[test]
    fn ranges_in_band_walks_both_lists() {
        let k = PIECE as u64 + 1;
        // One range each: the offset decides.
        assert_eq!(ranges_in_band(&[(0x1000, 3 * k)], &[(0x9010, 3 * k)]), cfg!(target_arch = "x86_64"));
        assert!(!ranges_in_band(&[(0x1000, 3 * k)], &[(0x9040, 3 * k)]));
        // The second destination range moves the offset into the band.
        let src = [(0x1000, 2 * k)];
        // (its second piece starts at source 0x1000 + k; the destination
        // 16 bytes further into its page)
        let dst = [(0x9000, k), (0x20000 + ((0x1000 + k) & 4095) + 16, k)];
        assert!(!ranges_in_band(&src, &dst[..1]));
        assert_eq!(ranges_in_band(&src, &dst), cfg!(target_arch = "x86_64"));
        // Short pieces never count, empty lists never do.
        assert!(!ranges_in_band(&[(0x1000, 100), (0x5000, 100)], &[(0x9010, 200)]));
        assert!(!ranges_in_band(&[], &[(0x9010, 200)]));
        // Zero-length ranges are stepped over.
        assert!(!ranges_in_band(&[(0x1000, 0), (0x2000, k)], &[(0x9000, 0), (0x9040, k)]));
    }

    #[test]
    fn copies_every_length_and_placement_exactly() {
        // Source and destination in one page-aligned allocation each, at
        // every offset pair that matters (in and out of the band), lengths
        // around the piece size and the band's edges.
        let mut src = vec![0u8; 3 * 4096 + 8192];
        for (i, b) in src.iter_mut().enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        let mut dst = vec![0u8; 3 * 4096 + 8192];
        let s0 = src.as_ptr().align_offset(4096);
        let d0 = dst.as_ptr().align_offset(4096);
        for so in [0usize, 1, 16, 33] {
            for dd in [0usize, 1, 16, 31, 32, 63, 64, 100] {
                for n in [0usize, 1, 31, PIECE - 1, PIECE, PIECE + 1, 2 * PIECE + 17, 9 * BLOCK - 1, 3 * 4096] {
                    dst.fill(0xee);
                    let (s, d) = (s0 + so, d0 + so + dd);
                    copy_slice(&mut dst[d..d + n], &src[s..s + n]);
                    assert_eq!(&dst[d..d + n], &src[s..s + n], "so {so} dd {dd} n {n}");
                    assert!(dst[..d].iter().all(|&b| b == 0xee), "wrote before the range");
                    assert!(dst[d + n..].iter().all(|&b| b == 0xee), "wrote after the range");
                }
            }
        }
    }

    #[test]
    fn both_band_copies_copy_exactly() {
        // The pieces (the copy without AVX) and the blocks, whichever this
        // CPU takes, at lengths around their steps, in the band.
        let src: Vec<u8> = (0..5 * 4096).map(|i| (i * 37 % 253) as u8).collect();
        let mut dst = vec![0u8; 6 * 4096];
        let s = src.as_ptr().align_offset(4096);
        let d = dst.as_ptr().align_offset(4096) + 16;
        for n in [PIECE + 1, BLOCK * 8, BLOCK * 8 + 255, 3 * PIECE + 5, 4096 * 3 + 100] {
            for f in [copy_pieces as unsafe fn(*const u8, *mut u8, usize), copy_band] {
                dst.fill(0xee);
                // SAFETY: distinct vectors, ranges in bounds.
                unsafe { f(src.as_ptr().add(s), dst.as_mut_ptr().add(d), n) };
                assert_eq!(&dst[d..d + n], &src[s..s + n], "n {n}");
                assert!(dst[..d].iter().chain(&dst[d + n..]).all(|&b| b == 0xee), "n {n}: wrote outside");
            }
        }
    }

    #[test]
    fn move_bytes_handles_overlap_both_ways_and_disjoint_band() {
        let fill = |v: &mut Vec<u8>| v.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 253) as u8);
        let n = 3 * PIECE;
        for shift in [1usize, 16, 63, 4096 + 16] {
            let mut v = vec![0u8; n + 2 * shift + 8192];
            fill(&mut v);
            let want: Vec<u8> = v[..n].to_vec();
            // Forward overlap: dst ahead of src by `shift` (in the band for
            // small shifts, yet overlapping: must not be cut).
            // SAFETY: both ranges inside v.
            unsafe { move_bytes(v.as_ptr(), v.as_mut_ptr().add(shift), n) };
            assert_eq!(&v[shift..shift + n], &want[..], "forward, shift {shift}");
            fill(&mut v);
            let want: Vec<u8> = v[shift..shift + n].to_vec();
            // SAFETY: as above.
            unsafe { move_bytes(v.as_ptr().add(shift), v.as_mut_ptr(), n) };
            assert_eq!(&v[..n], &want[..], "backward, shift {shift}");
        }
        // Disjoint, in the band: cut up, same bytes.
        let src: Vec<u8> = (0..n + 4096).map(|i| (i % 249) as u8).collect();
        let mut dst = vec![0u8; n + 8192];
        let s = src.as_ptr().align_offset(4096);
        let d = dst.as_ptr().align_offset(4096) + 16;
        // SAFETY: distinct vectors, ranges in bounds.
        unsafe { move_bytes(src.as_ptr().add(s), dst.as_mut_ptr().add(d), n) };
        assert_eq!(&dst[d..d + n], &src[s..s + n]);
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn copy_slice_refuses_unequal_lengths() {
        copy_slice(&mut [0u8; 3], &[1u8; 4]);
    }
}
