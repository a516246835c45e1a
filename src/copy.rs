//! The byte copy every payload takes: `copy_nonoverlapping`, except for
//! the one relative placement where the C library's copy collapses, and
//! mid-sized copies between addresses at different offsets in their
//! cache lines, where a loop of ours is faster.
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
//! Out of the band, where the two addresses differ modulo 64 (a buffer
//! `malloc` placed 16 bytes into a line against a page-aligned pool chunk,
//! or against a ring cell's payload, 32 bytes into its line), copies of
//! more than [`PIECE`] bytes up to [`FWD_MAX`] take a forward loop of
//! ours: [`BLOCK`] bytes a step, eight 32-byte loads then eight stores
//! (AVX). `rep movsb` pays for a source and destination at different
//! offsets in their lines; the loop does not. Measured (2026-11-27, AMD
//! EPYC VM): in cache on one core, 16 KiB from 16 bytes into a line to a
//! line's start 441-539 cycles against 661-735 by `memcpy` (4 KiB 98
//! against 172); a C probe of two processes with the copies interleaved
//! message by message, the sender's source 16 bytes into a line: 16 KiB
//! in 4 KiB fragments 14-20% less per round trip, 16 KiB in one piece
//! 4-5%, 64 KiB in 16 KiB fragments 1-2%; shmfab's ping-pong, paired
//! `scripts/ab.sh` rounds against `memcpy` (near, raw 8 B 0.043-0.17
//! us): 4 KiB -0.019 us (better in 35 of 40), 8 KiB -0.037 (28 of 40),
//! 16 KiB -0.061 (29 of 40; -0.086, 19 of 24, in another run), 32 KiB
//! -0.091 (24 of 40), 64 KiB -0.086 (23 of 40; +0.10, 11 of 24, in
//! another). The same loop for copies at one offset too tied at 16 KiB
//! (20 of 40) where the misaligned-only rule won, so `memcpy` keeps
//! those. Above [`FWD_MAX`] the two measured alike (memory-bound: 1 MiB
//! and 4 MiB into 16 rotating buffers, 9.8-10.0 and 5.0-5.6 bytes a
//! cycle), and `memcpy` keeps them.
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

/// Largest copy that takes the forward loop when its two addresses differ
/// modulo 64 (see the module's note): 256 KiB, half of this VM's L2 per
/// core; larger copies are bound by memory either way.
pub const FWD_MAX: usize = 256 * 1024;

/// Which copy a length and placement take (see the module's note).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `memcpy` (`copy_nonoverlapping`).
    Libc,
    /// The band's loop, back to front ([`in_band`]).
    Band,
    /// The forward loop: out of the band, the addresses differing modulo
    /// 64, more than [`PIECE`] and at most [`FWD_MAX`] bytes.
    Forward,
}

/// The path [`copy`] takes for `n` bytes from `src` to `dst` on this CPU
/// (what `copy_large` follows: one place decides).
#[inline]
pub fn path(src: *const u8, dst: *const u8, n: usize) -> Path {
    if in_band(src, dst, n) {
        Path::Band
    } else if misaligned_mid(src, dst, n) && has_avx() {
        Path::Forward
    } else {
        Path::Libc
    }
}

/// More than [`PIECE`] and at most [`FWD_MAX`] bytes, addresses differing
/// modulo 64 (x86-64 only): the forward loop's placements, before the
/// band is ruled out and AVX found.
#[inline(always)]
fn misaligned_mid(src: *const u8, dst: *const u8, n: usize) -> bool {
    cfg!(target_arch = "x86_64") && n > PIECE && n <= FWD_MAX && (src as usize ^ dst as usize) & 63 != 0
}

/// Whether the CPU has AVX (found once by the standard library, then a
/// load and a test).
#[inline(always)]
fn has_avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

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
    if n > PIECE {
        // SAFETY: the caller's contract, passed on.
        unsafe { copy_large(src, dst, n) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
    }
}

/// [`copy`] of more than [`PIECE`] bytes, by the path [`path`] names.
///
/// # Safety
/// As [`copy`].
#[inline(never)]
unsafe fn copy_large(src: *const u8, dst: *mut u8, n: usize) {
    match path(src, dst, n) {
        // SAFETY: the caller's contract, passed on.
        Path::Band => unsafe { copy_band(src, dst, n) },
        // SAFETY: path found AVX there (Forward only then); the caller's
        // contract.
        #[cfg(target_arch = "x86_64")]
        Path::Forward => unsafe { copy_forward_avx(src, dst, n) },
        // SAFETY: the caller's contract.
        _ => unsafe { std::ptr::copy_nonoverlapping(src, dst, n) },
    }
}

/// Copies `n` bytes from `src` to `dst`, as `std::ptr::copy` (the ranges
/// may overlap); by [`copy`]'s paths when they do not.
///
/// # Safety
/// As `std::ptr::copy(src, dst, n)`.
#[inline(always)]
pub unsafe fn move_bytes(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src as usize, dst as usize);
    if n > PIECE && (d.wrapping_add(n) <= s || s.wrapping_add(n) <= d) {
        // SAFETY: disjoint (checked), valid per the caller.
        unsafe { copy_large(src, dst, n) }
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
    // Back to front: every load then lies below the stores made before it
    // (the destination is ahead of the source), so none waits on one.
    let head = n % BLOCK;
    let mut off = n;
    while off > head {
        off -= BLOCK;
        // SAFETY: head <= off and off + BLOCK <= n: the block lies inside
        // both ranges, which are disjoint (the caller's contract); AVX is
        // there (ours).
        unsafe { copy_block_avx(src.add(off), dst.add(off)) };
    }
    // SAFETY: the head, under a block, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
}

/// The forward loop: [`BLOCK`] bytes a step, front to back, eight loads
/// before eight stores; the tail, under a block, by `memcpy` (its vector
/// loop: under [`PIECE`]). Not for the band, where a load would wait on
/// the store just made 1-31 bytes behind it modulo 4096 (the band's loop
/// runs back to front for that).
///
/// # Safety
/// As [`copy`]; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_forward_avx(src: *const u8, dst: *mut u8, n: usize) {
    let body = n - n % BLOCK;
    let mut off = 0;
    while off < body {
        // SAFETY: off + BLOCK <= body <= n: the block lies inside both
        // ranges, which are disjoint (the caller's contract); AVX is there
        // (ours).
        unsafe { copy_block_avx(src.add(off), dst.add(off)) };
        off += BLOCK;
    }
    // SAFETY: the tail [body, n), under a block, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(body), dst.add(body), n - body) };
}

/// One [`BLOCK`] of both AVX loops: eight 32-byte loads, then eight
/// stores (unaligned).
///
/// # Safety
/// `src` valid for reads and `dst` for writes of [`BLOCK`] bytes, the two
/// disjoint; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn copy_block_avx(src: *const u8, dst: *mut u8) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256 as load, _mm256_storeu_si256 as store};
    let (s, d) = (src as *const __m256i, dst as *mut __m256i);
    // SAFETY: the block lies inside both ranges (the caller's contract):
    // eight 32-byte loads and stores at offsets 0 to 224.
    unsafe {
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
    fn paths_by_length_and_placement() {
        let base = 0x10_0000usize;
        let p = |s: usize, d: usize, n: usize| path(s as *const u8, d as *const u8, n);
        let fwd = if cfg!(target_arch = "x86_64") && has_avx() { Path::Forward } else { Path::Libc };
        let band = if cfg!(target_arch = "x86_64") { Path::Band } else { Path::Libc };
        // A buffer 16 bytes into a line against a chunk at a page's start,
        // both ways round: out of the band one way, in it the other.
        assert_eq!(p(base + 16, base + 0x8000, 16384), fwd);
        assert_eq!(p(base, base + 0x8000 + 16, 16384), band);
        // A ring cell's payload (32 bytes into its line) to a buffer at 8.
        assert_eq!(p(base + 32, base + 0x9008, PIECE + 1), fwd);
        assert_eq!(p(base + 32, base + 0x9008, FWD_MAX), fwd);
        // Same offset in the line, short, or past FWD_MAX: memcpy.
        assert_eq!(p(base + 16, base + 0x8010, 16384), Path::Libc);
        assert_eq!(p(base + 64, base + 0x8000, 16384), Path::Libc);
        assert_eq!(p(base + 16, base + 0x8000, PIECE), Path::Libc);
        assert_eq!(p(base + 16, base + 0x8000, FWD_MAX + 1), Path::Libc);
    }

    #[test]
    fn forward_copies_exactly_around_its_steps_and_bounds() {
        let n_max = FWD_MAX + BLOCK + 1;
        let src: Vec<u8> = (0..n_max + 4096).map(|i| (i * 29 % 251) as u8).collect();
        let mut dst = vec![0u8; n_max + 8192];
        let s0 = src.as_ptr().align_offset(4096);
        let d0 = dst.as_ptr().align_offset(4096);
        for (so, dd) in [(16usize, 0usize), (0, 48), (33, 100), (8, 4096 + 40)] {
            for n in
                [PIECE + 1, 9 * BLOCK, 9 * BLOCK + 1, 9 * BLOCK + BLOCK - 1, 16384, FWD_MAX - 1, FWD_MAX, FWD_MAX + 1]
            {
                let (s, d) = (s0 + so, d0 + dd);
                assert_eq!(
                    path(src[s..].as_ptr(), dst[d..].as_ptr(), n) == Path::Forward,
                    n <= FWD_MAX && cfg!(target_arch = "x86_64") && has_avx(),
                    "so {so} dd {dd} n {n}"
                );
                dst.fill(0xee);
                copy_slice(&mut dst[d..d + n], &src[s..s + n]);
                assert_eq!(&dst[d..d + n], &src[s..s + n], "so {so} dd {dd} n {n}");
                assert!(
                    dst[..d].iter().chain(&dst[d + n..]).all(|&b| b == 0xee),
                    "so {so} dd {dd} n {n}: wrote outside"
                );
                // Disjoint ranges through move_bytes take the same path.
                dst.fill(0xee);
                // SAFETY: distinct vectors, ranges in bounds.
                unsafe { move_bytes(src.as_ptr().add(s), dst.as_mut_ptr().add(d), n) };
                assert_eq!(&dst[d..d + n], &src[s..s + n], "move_bytes: so {so} dd {dd} n {n}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn copy_slice_refuses_unequal_lengths() {
        copy_slice(&mut [0u8; 3], &[1u8; 4]);
    }
}
